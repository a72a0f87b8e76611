"""First frames that stock clients send, as captured from them, for the codec and server tests.

The codec tests decode them (what each field becomes) and the server tests send
them over a real socket (the server accepts them); keeping the captures in one
place means both test the same bytes. Each function returns a fresh dict, so a
test may change its copy.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SEMANTIC_VAD", "ga_session", "livekit_session_update"]

# LiveKit's default turn detection.
SEMANTIC_VAD: dict[str, Any] = {
    "type": "semantic_vad",
    "eagerness": "medium",
    "create_response": True,
    "interrupt_response": True,
}


def ga_session(
    *, model: str = "local-duplex", turn_detection: dict[str, Any] | None = SEMANTIC_VAD
) -> dict[str, Any]:
    """The GA ``session`` object LiveKit's OpenAI plugin sends by default.

    ``max_output_tokens`` is ``"inf"``, ``tracing`` and ``noise_reduction`` are null (not
    absent), the transcription model is OpenAI's. ``model`` and ``turn_detection`` vary
    between clients and tests (the ``openai`` SDK test opens with no turn detection).
    """
    return {
        "type": "realtime",
        "model": model,
        "output_modalities": ["audio"],
        "max_output_tokens": "inf",
        "tool_choice": "auto",
        "tracing": None,
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "noise_reduction": None,
                "transcription": {"model": "gpt-4o-mini-transcribe"},
                "turn_detection": dict(turn_detection) if turn_detection is not None else None,
            },
            "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin", "speed": 1.0},
        },
    }


def livekit_session_update() -> dict[str, Any]:
    """LiveKit's first ``session.update`` frame: its default GA session, with semantic VAD."""
    return {"type": "session.update", "event_id": "session_update_1", "session": ga_session()}
