"""``docs/protocol.md`` names every wire type, every struct and every error code the codec knows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import duplex.protocol as p
from duplex.protocol import limits

DOC = (Path(__file__).resolve().parents[3] / "docs" / "protocol.md").read_text()
TYPES = [*p.CLIENT_COMMAND_TYPES, *p.SERVER_EVENT_TYPES]


@pytest.mark.parametrize("cls", TYPES, ids=lambda c: c.__struct_config__.tag)
def test_every_wire_type_is_documented(cls: type) -> None:
    assert f"`{cls.__struct_config__.tag}`" in DOC
    assert f"`{cls.__name__}`" in DOC


@pytest.mark.parametrize("code", sorted(p.ERROR_TYPES))
def test_every_error_code_is_documented(code: str) -> None:
    assert f"`{code}`" in DOC


@pytest.mark.parametrize("name", [n for n in limits.__all__ if n.startswith("MAX_")])
def test_every_limit_is_documented(name: str) -> None:
    assert f"`{name}`" in DOC[DOC.index("## 9. Limits") :]


@pytest.mark.parametrize("alias", sorted(p.TYPE_ALIASES))
def test_every_type_alias_is_documented(alias: str) -> None:
    assert f"`{alias}`" in DOC


def _example_blocks() -> list[str]:
    examples = DOC[DOC.index("## 8. Examples") :]
    return [block.split("```", 1)[0].strip() for block in examples.split("```json\n")[1:]]


@pytest.mark.parametrize("block", _example_blocks())
def test_every_example_decodes(block: str) -> None:
    mode = p.Mode.BETA if '"response.audio.' in block else p.Mode.GA
    try:
        decoded: object = p.decode(block, mode)
    except p.ProtocolError:
        decoded = p.decode_event(block, mode)
    assert json.loads(p.encode(decoded, mode)) == json.loads(block)
