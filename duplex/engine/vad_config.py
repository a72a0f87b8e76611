"""``VadConfig``: the effective server-side turn detection settings of one session.

Built from the codec's ``turn_detection`` object (``server_vad`` or ``semantic_vad``) with
OpenAI's defaults wherever the client left a field out, and echoed back to the client as the
effective configuration (liberal in, strict out).

``semantic_vad`` is accepted and mapped onto the acoustic detector. OpenAI's semantic VAD
waits at most 8 / 4 / 2 s (eagerness low / medium / high; auto = medium) when its model
thinks the user has not finished; an acoustic VAD cannot tell "finished" from "pausing",
so each eagerness becomes a fixed end-of-turn silence instead:

==========  ==============  ==============================================================
eagerness   silence (ms)    why
==========  ==============  ==============================================================
low         1500            lets the user pause mid-thought; still far below OpenAI's 8 s
medium      800             a clear pause (longer than ``server_vad``'s 500 ms default) so
auto        800             a breath between clauses does not end the turn
high        400             answers quickly; close to the 500 ms ``server_vad`` default
==========  ==============  ==============================================================

The values keep OpenAI's ordering and roughly its halving from one level to the next, while
staying short enough that the reply starts within the 1 s end-of-speech budget
at ``medium``.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from duplex.protocol.errors import ProtocolError
from duplex.protocol.realtime.session import SemanticVad, ServerVad

__all__ = ["EAGERNESS_SILENCE_MS", "VadConfig"]

EAGERNESS_SILENCE_MS: Final[dict[str, int]] = {"low": 1500, "medium": 800, "auto": 800, "high": 400}
"""End-of-turn silence for each ``semantic_vad`` eagerness (see the module docstring)."""

VadType = Literal["server_vad", "semantic_vad"]


class VadConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Server VAD settings; every duration is in milliseconds of audio (never of wall time).

    ``threshold``: Silero speech probability at or above which a window is speech.
    ``hysteresis``: speech ends only below ``threshold - hysteresis`` (floored at 0.01), so a
    probability wobbling around the threshold neither splits nor ends a turn (Silero's own
    recommendation is 0.15).
    ``prefix_padding_ms``: audio kept before the detected onset; ``audio_start_ms`` includes it.
    ``silence_duration_ms``: silence that ends a turn; ``audio_end_ms`` includes it.
    ``min_speech_duration_ms``: speech shorter than this (a click, a cough) never starts a turn.
    ``create_response`` / ``interrupt_response`` / ``idle_timeout_ms``: carried for the engine,
    which honours them; the detector ignores them.
    ``eagerness``: kept for ``semantic_vad`` so the effective config can be echoed.
    """

    type: VadType = "server_vad"
    threshold: float = 0.5
    hysteresis: float = 0.15
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    min_speech_duration_ms: int = 96
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: Literal["low", "medium", "high", "auto"] | None = None
    idle_timeout_ms: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise _invalid("threshold", f"threshold must be within [0, 1], got {self.threshold}")
        if not 0.0 <= self.hysteresis < 1.0:
            raise _invalid("hysteresis", f"hysteresis must be within [0, 1), got {self.hysteresis}")
        for name in ("prefix_padding_ms", "silence_duration_ms", "min_speech_duration_ms"):
            if getattr(self, name) < 0:
                raise _invalid(name, f"{name} must not be negative, got {getattr(self, name)}")
        if self.idle_timeout_ms is not None and self.idle_timeout_ms < 0:
            raise _invalid(
                "idle_timeout_ms", f"idle_timeout_ms must not be negative, got {self.idle_timeout_ms}"
            )
        if self.eagerness is not None and self.eagerness not in EAGERNESS_SILENCE_MS:
            raise _invalid("eagerness", f"unknown eagerness {self.eagerness!r}")

    @property
    def release_threshold(self) -> float:
        """Probability below which a speech window counts as silence."""
        return max(self.threshold - self.hysteresis, 0.01)

    @classmethod
    def from_turn_detection(cls, td: Any, **overrides: Any) -> VadConfig | None:
        """The effective config for a codec ``turn_detection`` object, or ``None`` for ``None``.

        ``td`` is duck-typed: its kind is read from ``td.type`` (or the msgspec tag of its
        class); the fields ``threshold``, ``prefix_padding_ms``, ``silence_duration_ms``,
        ``create_response``, ``interrupt_response``, ``eagerness`` and ``idle_timeout_ms`` are
        read where present, and ``None`` or a missing field takes OpenAI's default.
        ``overrides`` (for example ``min_speech_duration_ms`` from server settings) win over both.

        Raises ``ProtocolError("unsupported_turn_detection")`` for another kind or a value out
        of range.
        """
        if td is None:
            return None
        kind = _kind_of(td)
        fields: dict[str, Any] = {"type": kind}
        if kind == "server_vad":
            names = ("threshold", "prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms")
        elif kind == "semantic_vad":
            eagerness = getattr(td, "eagerness", None) or "auto"
            fields["eagerness"] = eagerness
            if eagerness not in EAGERNESS_SILENCE_MS:
                raise _invalid("eagerness", f"unknown eagerness {eagerness!r}")
            fields["silence_duration_ms"] = EAGERNESS_SILENCE_MS[eagerness]
            names = ()
        else:
            raise ProtocolError(
                "unsupported_turn_detection",
                f"turn_detection type {kind!r} is not supported; use server_vad, semantic_vad or null",
                param="turn_detection.type",
            )
        for name in (*names, "create_response", "interrupt_response"):
            value = getattr(td, name, None)
            if value is not None:
                fields[name] = value
        fields.update(overrides)
        try:
            return cls(**fields)
        except (TypeError, msgspec.ValidationError) as exc:
            raise ProtocolError("unsupported_turn_detection", str(exc), param="turn_detection") from exc

    def to_turn_detection(self) -> ServerVad | SemanticVad:
        """The effective settings in the session object's shape, to echo to the client.

        ``server_vad`` states every OpenAI field; ``semantic_vad`` states its eagerness and the
        two response flags (its silence duration is ours, not part of OpenAI's object).
        """
        if self.type == "semantic_vad":
            return SemanticVad(
                eagerness=self.eagerness or "auto",
                create_response=self.create_response,
                interrupt_response=self.interrupt_response,
            )
        return ServerVad(
            threshold=self.threshold,
            prefix_padding_ms=self.prefix_padding_ms,
            silence_duration_ms=self.silence_duration_ms,
            create_response=self.create_response,
            interrupt_response=self.interrupt_response,
            idle_timeout_ms=self.idle_timeout_ms,
        )


def _kind_of(td: Any) -> str:
    kind = getattr(td, "type", None)
    if kind is None:
        config = getattr(type(td), "__struct_config__", None)
        kind = getattr(config, "tag", None)
    return str(kind)


def _invalid(field: str, message: str) -> ProtocolError:
    return ProtocolError("unsupported_turn_detection", message, param=f"turn_detection.{field}")
