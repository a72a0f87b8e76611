"""``docs/sessions.md`` shows the lifecycle diagram generated from the transition table."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "make_state_diagram.py"


def test_state_diagram_in_the_docs_matches_the_transition_table() -> None:
    spec = importlib.util.spec_from_file_location("make_state_diagram", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0, "run: python docs/make_state_diagram.py"
