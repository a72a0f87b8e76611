"""The beta rendering: OpenAI's pre-GA event names and object shapes (``OpenAI-Beta: realtime=v1``).

A beta client gets one naming family only: ``response.audio.delta`` instead of
``response.output_audio.delta``, ``conversation.item.created`` instead of ``conversation.item.added``,
a flat session object (``modalities``, ``input_audio_format``, ``turn_detection`` at the top level) and
assistant content parts typed ``audio`` / ``text``. Events that have no beta twin keep their GA name;
beta clients ignore types they do not know. The functions here work on builtins (dicts from
``msgspec.to_builtins``), so they never touch the structs.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from duplex.protocol.errors import ProtocolError
from duplex.protocol.formats import parse_format

__all__ = ["BETA_TO_GA_TYPES", "GA_TO_BETA_TYPES", "from_beta_event", "to_beta_event"]

GA_TO_BETA_TYPES: Final[dict[str, str]] = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "conversation.item.added": "conversation.item.created",
}
BETA_TO_GA_TYPES: Final[dict[str, str]] = {
    beta: ga for ga, beta in GA_TO_BETA_TYPES.items() if beta != "conversation.item.created"
}

_PART_TYPES: Final = {"output_text": "text", "output_audio": "audio"}
_PART_TYPES_BACK: Final = {"text": "output_text", "audio": "output_audio"}


def _beta_format(spec: Any) -> Any:
    try:
        return parse_format(spec).to_beta()
    except ProtocolError:  # an unknown name is passed through; the session validated it already
        return spec


def _item(item: dict[str, Any], parts: dict[str, str]) -> dict[str, Any]:
    if item.get("type") == "message" and item.get("role") == "assistant":
        content = [{**p, "type": parts.get(p.get("type"), p.get("type"))} for p in item.get("content", ())]
        return {**item, "content": content}
    return item


def _session(session: dict[str, Any]) -> dict[str, Any]:
    out = {
        k: v
        for k, v in session.items()
        if k not in ("audio", "output_modalities", "max_output_tokens", "type")
    }
    if "output_modalities" in session:
        out["modalities"] = session["output_modalities"]
    if "max_output_tokens" in session:
        out["max_response_output_tokens"] = session["max_output_tokens"]
    audio = session.get("audio") or {}
    inp, outp = audio.get("input") or {}, audio.get("output") or {}
    if "format" in inp:
        out["input_audio_format"] = _beta_format(inp["format"])
    if "turn_detection" in inp:
        out["turn_detection"] = inp["turn_detection"]
    if "transcription" in inp:
        out["input_audio_transcription"] = inp["transcription"]
    if "noise_reduction" in inp:
        out["input_audio_noise_reduction"] = inp["noise_reduction"]
    if "format" in outp:
        out["output_audio_format"] = _beta_format(outp["format"])
    if "voice" in outp:
        out["voice"] = outp["voice"]
    if "speed" in outp:
        out["speed"] = outp["speed"]
    return out


def _response(response: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in response.items() if k not in ("audio", "output_modalities", "output")}
    if "output_modalities" in response:
        out["modalities"] = response["output_modalities"]
    if "output" in response:
        out["output"] = [_item(i, _PART_TYPES) for i in response["output"]]
    output = (response.get("audio") or {}).get("output") or {}
    if "format" in output:
        out["output_audio_format"] = _beta_format(output["format"])
    if "voice" in output:
        out["voice"] = output["voice"]
    return out


def to_beta_event(event: dict[str, Any]) -> dict[str, Any]:
    """Render a GA server event (as builtins) in the beta shape."""
    out = dict(event)
    out["type"] = GA_TO_BETA_TYPES.get(event["type"], event["type"])
    if isinstance(event.get("session"), dict):
        out["session"] = _session(event["session"])
    if isinstance(event.get("response"), dict):
        out["response"] = _response(event["response"])
    if isinstance(event.get("item"), dict):
        out["item"] = _item(event["item"], _PART_TYPES)
    return out


def _ga_format(name: Any) -> Any:
    try:
        return msgspec.to_builtins(parse_format(name).to_ga())
    except ProtocolError:
        return name


def _session_back(session: dict[str, Any]) -> dict[str, Any]:
    moved = {
        "modalities",
        "max_response_output_tokens",
        "input_audio_format",
        "turn_detection",
        "input_audio_transcription",
        "input_audio_noise_reduction",
        "output_audio_format",
        "voice",
        "speed",
    }
    out = {k: v for k, v in session.items() if k not in moved}
    if "modalities" in session:
        out["output_modalities"] = session["modalities"]
    if "max_response_output_tokens" in session:
        out["max_output_tokens"] = session["max_response_output_tokens"]
    inp: dict[str, Any] = {}
    outp: dict[str, Any] = {}
    for beta, ga, target in (
        ("turn_detection", "turn_detection", inp),
        ("input_audio_transcription", "transcription", inp),
        ("input_audio_noise_reduction", "noise_reduction", inp),
        ("voice", "voice", outp),
        ("speed", "speed", outp),
    ):
        if beta in session:
            target[ga] = session[beta]
    if "input_audio_format" in session:
        inp["format"] = _ga_format(session["input_audio_format"])
    if "output_audio_format" in session:
        outp["format"] = _ga_format(session["output_audio_format"])
    audio = {k: v for k, v in (("input", inp), ("output", outp)) if v}
    if audio:
        out["audio"] = audio
    return out


def _response_back(response: dict[str, Any]) -> dict[str, Any]:
    moved = ("modalities", "output_audio_format", "voice", "output")
    out = {k: v for k, v in response.items() if k not in moved}
    if "modalities" in response:
        out["output_modalities"] = response["modalities"]
    if isinstance(response.get("output"), list):
        out["output"] = [_item(i, _PART_TYPES_BACK) for i in response["output"]]
    output: dict[str, Any] = {}
    if "output_audio_format" in response:
        output["format"] = _ga_format(response["output_audio_format"])
    if "voice" in response:
        output["voice"] = response["voice"]
    if output:
        out["audio"] = {"output": output}
    return out


def from_beta_event(event: dict[str, Any]) -> dict[str, Any]:
    """Read a beta server event (as builtins) back into the GA shape: the inverse of ``to_beta_event``.

    Beta formats carry no rate, so a format comes back at its default rate (24 kHz PCM).
    """
    out = dict(event)
    out["type"] = BETA_TO_GA_TYPES.get(event.get("type"), event.get("type"))
    if isinstance(event.get("session"), dict):
        out["session"] = _session_back(event["session"])
    if isinstance(event.get("response"), dict):
        out["response"] = _response_back(event["response"])
    if isinstance(event.get("item"), dict):
        out["item"] = _item(event["item"], _PART_TYPES_BACK)
    return out
