"""Write the session lifecycle diagram into ``docs/sessions.md`` from the transition table.

The diagram lives between the markers ``<!-- state-diagram:start -->`` and
``<!-- state-diagram:end -->``; everything else in the page is left alone. Run it
whenever ``duplex/engine/transitions.py`` changes::

    python docs/make_state_diagram.py            # rewrite the page
    python docs/make_state_diagram.py --check    # exit 1 if the page is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from duplex.engine.transitions import TRANSITIONS, SessionState

PAGE = Path(__file__).with_name("sessions.md")
START = "<!-- state-diagram:start -->"
END = "<!-- state-diagram:end -->"


def mermaid() -> str:
    """The Mermaid state diagram of ``TRANSITIONS`` (one edge per state pair, inputs joined)."""
    edges: dict[tuple[SessionState, SessionState], list[str]] = {}
    for (state, event), target in TRANSITIONS.items():
        edges.setdefault((state, target), []).append(event.value)
    lines = ["```mermaid", "stateDiagram-v2", f"    [*] --> {SessionState.OPEN.value}"]
    for (state, target), events in edges.items():
        lines.append(f"    {state.value} --> {target.value}: {' / '.join(events)}")
    for terminal in (SessionState.CLOSED, SessionState.EXPIRED):
        lines.append(f"    {terminal.value} --> [*]")
    lines.append("```")
    return "\n".join(lines)


def render(page: str) -> str:
    head, sep, rest = page.partition(START)
    if not sep:
        raise SystemExit(f"{PAGE}: marker {START} not found")
    _, sep, tail = rest.partition(END)
    if not sep:
        raise SystemExit(f"{PAGE}: marker {END} not found")
    return f"{head}{START}\n{mermaid()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is out of date")
    args = parser.parse_args(argv)
    page = PAGE.read_text()
    new = render(page)
    if args.check:
        return 0 if new == page else 1
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
