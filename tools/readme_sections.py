"""The README's generated sections: the configuration reference and the command-line help.

Each section sits between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` in ``README.md``:

* ``config-reference``: one table per section of the ``duplex serve`` configuration file, built
  from the config classes themselves: every field of ``ServeConfig``, ``ServerConfig`` (with
  ``RealtimeVideoConfig``) and ``EngineConfig``, its default, and the first sentence of what its
  class says about it (the comment above the field, or the field's entry in the class docstring);
* ``cli-help``: the real output of ``duplex --help`` and ``duplex serve --help``, 100 columns wide.

``python tools/readme_sections.py`` rewrites them; ``--check`` exits 1 when the README is not
current (``tests/test_readme.py`` runs the same check).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec

from duplex.cli import build_parser
from duplex.engine.config import EngineConfig
from duplex.server.config import RealtimeVideoConfig, ServeConfig, ServerConfig

README = Path(__file__).resolve().parents[1] / "README.md"
MIB = 1024 * 1024
HELP_COLUMNS = 100


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    for found in re.finditer(r"(?<=[a-z0-9)`'])[.;](\s|$)", text):
        head = text[: found.start() + 1]
        if head.count("(") == head.count(")"):  # not inside a parenthesis
            return head.rstrip(";")
    return text


def _comments(cls: type) -> dict[str, str]:
    """Each field's comment: the ``#`` lines right above it in the class body."""
    found: dict[str, str] = {}
    block: list[str] = []
    previous = ""  # the comment of the field on the line before, shared by a field right below it
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped.lstrip("#").strip())
            continue
        field = re.match(r"(\w+):", stripped)
        comment = " ".join(block) if block else previous if field else ""
        if field and comment:
            found[field[1]] = comment
        previous, block = comment if field else "", []
    return found


def _docstring_entries(cls: type) -> dict[str, str]:
    """Each field's entry in the class docstring: a line that opens with ````name````: (or
    ````a```` / ````b````:), with its continuation lines."""
    found: dict[str, str] = {}
    names: list[str] = []
    text: list[str] = []
    for line in inspect.getdoc(cls).splitlines():
        entry = re.match(r"^\s*((?:``\w+``(?: / )?)+):\s*(.*)$", line)
        if entry:
            for name in names:
                found[name] = " ".join(text)
            names, text = re.findall(r"``(\w+)``", entry[1]), [entry[2]]
        elif names and line.startswith("    "):
            text.append(line.strip())
        else:
            for name in names:
                found[name] = " ".join(text)
            names, text = [], []
    for name in names:
        found[name] = " ".join(text)
    return found


def _default(name: str, value: object) -> str:
    if isinstance(value, msgspec.Struct):
        return "(below)"
    if isinstance(value, int) and not isinstance(value, bool) and "_bytes" in name and value >= MIB:
        return f"{value // MIB} MiB" if value % MIB == 0 else str(value)
    if value in ((), {}):
        return "empty"
    if isinstance(value, tuple):
        return ", ".join(map(str, value))
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _table(cls: type, prefix: str = "") -> Iterator[str]:
    said = {**_docstring_entries(cls), **_comments(cls)}
    for field in msgspec.structs.fields(cls):
        default = field.default if field.default is not msgspec.NODEFAULT else field.default_factory()
        meaning = _first_sentence(said.get(field.name, "")).replace("|", "\\|")
        yield f"| `{prefix}{field.name}` | {_default(field.name, default)} | {meaning} |"


def config_reference() -> str:
    head = ["| key | default | meaning |", "| --- | --- | --- |"]
    parts = [
        "The whole file (`ServeConfig`; `duplex serve` options override it):",
        "",
        *head,
        *_table(ServeConfig),
        "",
        "`server:` (`ServerConfig`, `duplex/server/config.py`; sizes in bytes, durations in seconds):",
        "",
        *head,
        *_table(ServerConfig),
        *_table(RealtimeVideoConfig, "realtime_video."),
        "",
        "`engine:` (`EngineConfig`, `duplex/engine/config.py`; every per-session bound applies to each"
        " session):",
        "",
        *head,
        *_table(EngineConfig),
    ]
    return "\n".join(parts)


def _help(argv: list[str]) -> str:
    out = io.StringIO()
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_COLUMNS)
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            build_parser().parse_args(argv)
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    return out.getvalue().rstrip()


def cli_help() -> str:
    blocks = [f"$ duplex {' '.join(argv)}\n{_help(argv)}" for argv in (["--help"], ["serve", "--help"])]
    return "```text\n" + "\n\n".join(blocks) + "\n```"


SECTIONS = {"config-reference": config_reference, "cli-help": cli_help}


def with_sections(readme: str) -> str:
    """``readme`` with every generated section rewritten."""
    for name, render in SECTIONS.items():
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        start, stop = readme.index(begin) + len(begin), readme.index(end)
        readme = readme[:start] + "\n" + render() + "\n" + readme[stop:]
    return readme


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the README is not current")
    args = parser.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    current = with_sections(text)
    if args.check:
        if current != text:
            print("README.md is not current: run python tools/readme_sections.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(current, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
