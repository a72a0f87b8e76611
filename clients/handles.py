"""ResponseHandle: everything the client saw of one response, and a way to wait for its end.

The client's receive pump feeds every event carrying a ``response_id`` to that response's handle.
A handle collects the audio (decoded to raw bytes in the delta's format), the transcript and the
text deltas, the ``response.done`` status, and resolves ``done()`` when the response ends. Audio is
kept because the caller asked for the response; it is as large as the response, no larger.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from clients.collector import event_type
from duplex.protocol import AudioFormat, parse_format

__all__ = ["ResponseHandle"]

_AUDIO_DELTA = "response.output_audio.delta"
_TRANSCRIPT_DELTA = "response.output_audio_transcript.delta"
_TEXT_DELTA = "response.output_text.delta"


class ResponseHandle:
    """One response: ``response_id``, ``item_id``, ``audio`` bytes, ``transcript``, ``text``, ``status``.

    ``audio_format`` is the format of the collected ``audio`` (from the deltas' ``format`` and
    ``sample_rate_hz``, else the session's output format). ``audio_ms`` is its duration.
    """

    def __init__(self, response_id: str, default_format: AudioFormat | None = None) -> None:
        self.response_id = response_id
        self.item_id: str | None = None
        self.audio = bytearray()
        self.audio_format: AudioFormat | None = default_format
        self.transcript = ""
        self.text = ""
        self.status: str = "in_progress"
        self.status_reason: str | None = None
        self.events: list[Any] = []
        self.metadata: dict[str, Any] | None = None
        self._done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    @property
    def audio_ms(self) -> float:
        """Duration of the collected audio in milliseconds (0 when the format is unknown)."""
        fmt = self.audio_format
        if fmt is None or fmt.bytes_per_sample == 0:
            return 0.0
        return len(self.audio) / fmt.bytes_per_sample / fmt.rate * 1000.0

    @property
    def finished(self) -> bool:
        return self._done.done()

    def feed(self, event: Any) -> None:
        """Take one event of this response (called by the client's receive pump)."""
        self.events.append(event)
        kind = event_type(event)
        if kind == _AUDIO_DELTA:
            self.item_id = self.item_id or event.item_id
            fmt = getattr(event, "format", None)
            rate = getattr(event, "sample_rate_hz", None)
            if fmt is not None:
                # An unknown spelling keeps the previous idea of the format.
                with contextlib.suppress(Exception):
                    self.audio_format = parse_format(fmt, rate)
            self.audio += event.delta
        elif kind == _TRANSCRIPT_DELTA:
            self.item_id = self.item_id or event.item_id
            self.transcript += event.delta
        elif kind == _TEXT_DELTA:
            self.item_id = self.item_id or event.item_id
            self.text += event.delta
        elif kind == "response.output_item.added":
            self.item_id = self.item_id or getattr(event.item, "id", None)
        elif kind == "response.done":
            self._finish(event)

    def _finish(self, event: Any) -> None:
        response = event.response
        self.status = str(response.status)
        details = response.status_details
        self.status_reason = getattr(details, "reason", None) if details is not None else None
        self.metadata = response.metadata
        if not self._done.done():
            self._done.set_result(event)

    def abort(self, exc: BaseException) -> None:
        """The session ended before ``response.done``: ``done()`` raises ``exc``."""
        if not self._done.done():
            self._done.set_exception(exc)
            self._done.exception()  # mark retrieved: nobody may be waiting

    async def done(self, timeout: float | None = None) -> Any:
        """Wait for ``response.done`` and return it. Cancel-safe (the handle keeps collecting)."""
        async with asyncio.timeout(timeout):
            return await asyncio.shield(self._done)

    def __repr__(self) -> str:
        return (
            f"ResponseHandle({self.response_id!r}, status={self.status!r}, audio_ms={self.audio_ms:.0f}, "
            f"transcript={self.transcript!r})"
        )
