"""The judge's three verdicts and how a reply becomes one: leniently, as the benchmark reads them.

A reply is never refused; whatever it holds becomes a verdict, and ``source`` says how it was read
(``llm_json``: a JSON object; ``llm_float_text``: a number found in the text; ``llm_parse_failed``:
neither, the defaults below were used). The rules are the benchmark's evaluation code's:

* the JSON object is the first ``{...}`` in the text that decodes to an object (an empty
  object counts as none);
* early stage: the flag is the object's ``flag`` (the whole reply without an object); one that
  contains ``hallucination`` (case-insensitive) is an early hallucination (score 0), else one that
  contains ``neutral`` is neutral with the object's ``score`` (1 when missing or unreadable),
  anything else is neutral with score 0;
* core stage: the object's ``score`` (0 when missing); when it is not a number, or there is no
  object, the first number in the reply, else 0. ``trigger_phrase`` and ``spoiler`` come from
  the object;
* interrupted slot: the object's ``score`` (0 when missing or unreadable) and ``hallucination``.

Scores are clamped to [0, 1]. A boolean is true for ``true``, a non-zero number, or one of
``1 true yes y t`` (any case).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CoreVerdict",
    "EarlyVerdict",
    "PartialVerdict",
    "first_json_object",
    "first_number",
    "parse_core",
    "parse_early",
    "parse_partial",
]

_NUMBER = re.compile(r"[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?")
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class EarlyVerdict:
    """Early stage: an early hallucination (a false positive), or neutral with a quality ``score``."""

    hallucination: bool
    score: float = 0.0
    source: str = "llm_json"


@dataclass(frozen=True)
class CoreVerdict:
    score: float
    trigger_phrase: str = ""
    spoiler: bool = False
    source: str = "llm_json"


@dataclass(frozen=True)
class PartialVerdict:
    """An interrupted slot's spoken part: its quality and whether it invents facts."""

    quality: float
    hallucination: bool = False
    source: str = "llm_json"


def first_json_object(text: str) -> dict[str, Any] | None:
    """The first ``{...}`` in ``text`` that decodes to a non-empty object."""
    pos = text.find("{")
    while pos != -1:
        try:
            obj, _ = _DECODER.raw_decode(text[pos:])
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            return obj or None
        pos = text.find("{", pos + 1)
    return None


def first_number(text: str) -> float | None:
    match = _NUMBER.search(text)
    return None if match is None else float(match.group(0))


def _clamp(x: float) -> float:
    return max(0.0, min(1.0, x))


def _unit(value: Any) -> float | None:
    """``value`` as a clamped number (numbers and numeric strings), ``None`` when it is not one."""
    try:
        return _clamp(float(value))
    except (TypeError, ValueError, OverflowError):
        return None


def _truthy(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return bool(value)
    return str(value or "").strip().lower() in {"1", "true", "yes", "y", "t"}


def parse_early(text: str) -> EarlyVerdict:
    obj = first_json_object(text)
    source = "llm_json" if obj else "llm_parse_failed"
    flag = str(obj.get("flag", "") if obj else text).strip().lower().replace("-", "_").replace(" ", "")
    if "hallucination" in flag:
        return EarlyVerdict(True, 0.0, source)
    if "neutral" in flag:
        score = _unit((obj or {}).get("score", 1.0))
        return EarlyVerdict(False, 1.0 if score is None else score, source)
    return EarlyVerdict(False, 0.0, source)


def parse_core(text: str) -> CoreVerdict:
    obj = first_json_object(text)
    score = _unit(obj.get("score", 0.0)) if obj else None
    source = "llm_json"
    if score is None:
        number = first_number(text)
        score, source = (0.0, "llm_parse_failed") if number is None else (_clamp(number), "llm_float_text")
    if not obj:
        return CoreVerdict(score, source=source)
    phrase = str(obj.get("trigger_phrase", "") or "").strip()
    return CoreVerdict(score, phrase, _truthy(obj.get("spoiler", False)), source)


def parse_partial(text: str) -> PartialVerdict:
    obj = first_json_object(text)
    if not obj:
        return PartialVerdict(0.0, False, "llm_parse_failed")
    score = _unit(obj.get("score", 0.0))
    return PartialVerdict(0.0 if score is None else score, _truthy(obj.get("hallucination", False)))
