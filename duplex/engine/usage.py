"""``UsageMeter``: the tokens a session's model reported, per response and in total.

A plugin with ``Capabilities.reports_usage`` puts the tokens each step consumed and produced on
its outputs (``SlotOutput.usage``). The session adds every one (stale outputs too: the model did
the work) and reports them twice: ``response.done.response.usage`` carries what was counted since
the previous response ended (a duplex model hears between responses, so the input it heard before
a response is part of that response's bill), and ``session.closed.usage`` the session's total.
Without the capability every count reads 0, the shape strict clients expect (``zero_usage``).
"""

from __future__ import annotations

from duplex.plugins.base import TokenUsage
from duplex.protocol.realtime.responses import Usage

__all__ = ["UsageMeter", "wire_usage"]


def wire_usage(counts: list[int]) -> Usage:
    """OpenAI's usage object for ``counts`` (input text, audio, image; output text, audio)."""
    in_text, in_audio, in_image, out_text, out_audio = counts
    inputs, outputs = in_text + in_audio + in_image, out_text + out_audio
    return Usage(
        total_tokens=inputs + outputs,
        input_tokens=inputs,
        output_tokens=outputs,
        input_token_details={
            "cached_tokens": 0,
            "text_tokens": in_text,
            "audio_tokens": in_audio,
            "image_tokens": in_image,
        },
        output_token_details={"text_tokens": out_text, "audio_tokens": out_audio},
    )


class UsageMeter:
    """Counts since the last response ended (``take``) and since the session opened (``total``)."""

    __slots__ = ("_since", "_total")

    def __init__(self) -> None:
        self._since = [0, 0, 0, 0, 0]
        self._total = [0, 0, 0, 0, 0]

    def add(self, usage: TokenUsage) -> None:
        for counts in (self._since, self._total):
            counts[0] += usage.input_text
            counts[1] += usage.input_audio
            counts[2] += usage.input_image
            counts[3] += usage.output_text
            counts[4] += usage.output_audio

    def take(self) -> Usage:
        """What was counted since the previous ``take`` (a response's usage); starts over."""
        since, self._since = self._since, [0, 0, 0, 0, 0]
        return wire_usage(since)

    def total(self) -> Usage:
        """Everything counted since the session opened."""
        return wire_usage(self._total)
