"""The playback ledger of one response: what was generated, sent, played and committed.

Theory of operation
----------------------------------------------------------
``generated_ms`` grows with every audio chunk the model produced for the response,
``sent_ms`` with every chunk handed to the transport. The two move together for a
model that speaks in real time (its audio delta is journaled when it is produced);
for audio produced faster than real time and paced out at playback speed
(``generate`` at arrival, ``add_audio`` at release) ``sent_ms`` trails.
``played_ms`` and ``committed_ms``
move only on the client's word (``playback.ack`` or ``conversation.item.truncate``).
``committed_ms`` is the history boundary: the assistant transcript enters the
conversation only as far as ``text_at(committed_ms)``.

Text is cut at *text marks*: each audio chunk records how many transcript characters
existed when its audio ended, and ``text_at(ms)`` returns the transcript up to the
last mark at or before ``ms`` (never a word the listener did not hear). A response
whose text came without audio alignment (no marks) is cut proportionally.

Acks are monotone (``max``) unless ``truncate`` is set, which may move the committed
boundary back; a truncation also caps every later ack, so a late "played it all"
cannot undo what the listener interrupted. Everything is clamped to ``sent_ms``.
"""

from __future__ import annotations

import bisect

__all__ = ["PlaybackCursor"]


class PlaybackCursor:
    """Ledger and transcript of one assistant response (see the module docstring)."""

    __slots__ = (
        "_heard_chars",
        "_mark_chars",
        "_mark_ms",
        "committed_ms",
        "finished",
        "generated_ms",
        "played_ms",
        "sent_ms",
        "text",
        "truncated_at_ms",
    )

    def __init__(self) -> None:
        self.generated_ms = 0.0
        self.sent_ms = 0.0
        self.played_ms = 0.0
        self.committed_ms = 0.0
        self.text = ""
        self.truncated_at_ms: float | None = None
        self.finished = False
        self._mark_ms: list[float] = []
        self._mark_chars: list[int] = []
        self._heard_chars = 0  # the text a listener has heard once the audio so far is played

    def generate(self, duration_ms: float) -> None:
        """Audio of ``duration_ms`` was produced and waits to be paced out (``add_audio`` sends it)."""
        self.generated_ms += duration_ms

    def add_audio(self, duration_ms: float, text_delta: str = "", *, hold_text: bool = False) -> None:
        """One audio chunk of ``duration_ms`` went out with its transcript delta.

        ``hold_text``: the chunk is a piece of a longer one whose text is heard only at its end
        (paced audio: the transcript goes out with the first piece, the mark waits for the last),
        so its mark keeps the text heard before it."""
        self.text += text_delta
        self.sent_ms += duration_ms
        if self.generated_ms < self.sent_ms:  # not paced: produced as it is sent
            self.generated_ms = self.sent_ms
        if not hold_text:
            self._heard_chars = len(self.text)
        self._mark_ms.append(self.sent_ms)
        self._mark_chars.append(self._heard_chars)

    def add_text(self, text_delta: str) -> None:
        """Transcript text that belongs to no audio chunk (text modality)."""
        self.text += text_delta

    @property
    def last_mark(self) -> tuple[int, float]:
        """``(text_chars, audio_end_ms)`` of the latest audio chunk (``(0, 0.0)`` before any)."""
        if not self._mark_ms:
            return 0, 0.0
        return self._mark_chars[-1], self._mark_ms[-1]

    @property
    def marks(self) -> list[tuple[int, float]]:
        """``(text_chars, audio_end_ms)`` per audio chunk, as sent in delta metadata."""
        return list(zip(self._mark_chars, self._mark_ms, strict=True))

    def text_at(self, ms: float) -> str:
        """The transcript the listener heard after ``ms`` of this response's audio."""
        if ms <= 0:
            return ""
        if not self._mark_ms:
            if self.sent_ms <= 0:
                return ""
            return self.text[: int(len(self.text) * min(1.0, ms / self.sent_ms))]
        index = bisect.bisect_right(self._mark_ms, ms + 1e-6) - 1
        chars = self._mark_chars[index] if index >= 0 else 0
        if ms >= self.sent_ms and self.finished:  # a finished reply's trailing text ends with it
            chars = len(self.text)
        return self.text[:chars]

    @property
    def committed_text(self) -> str:
        """History text: up to ``committed_ms``; a finished text-only response counts whole."""
        if self.finished and self.sent_ms <= 0:
            return self.text
        return self.text_at(self.committed_ms)

    def ack(self, played_ms: float, committed_ms: float | None = None, *, truncate: bool = False) -> None:
        """Apply a client report. ``committed_ms`` defaults to ``played_ms``.

        Values are clamped to ``[0, sent_ms]`` and to an earlier truncation point.
        Without ``truncate`` both cursors only move forward.
        """
        committed = played_ms if committed_ms is None else committed_ms
        cap = self.sent_ms if self.truncated_at_ms is None else min(self.sent_ms, self.truncated_at_ms)
        played = min(max(played_ms, 0.0), cap)
        committed = min(max(committed, 0.0), cap)
        if truncate:
            self.played_ms = played
            self.committed_ms = committed
            self.truncated_at_ms = committed
        else:
            self.played_ms = max(self.played_ms, played)
            self.committed_ms = max(self.committed_ms, committed)

    def commit_all(self, heard_ms: float | None = None) -> None:
        """``commit_all_on_done``: everything sent counts as heard (unless truncated), or, with
        ``heard_ms``, as much as the listener can have heard of it by now (audio paced at
        playback speed and cancelled before its end: the rest was sent but not yet played)."""
        cap = self.sent_ms if self.truncated_at_ms is None else min(self.sent_ms, self.truncated_at_ms)
        if heard_ms is not None:
            cap = min(cap, max(heard_ms, 0.0))
        self.committed_ms = max(self.committed_ms, cap)

    def snapshot(self) -> dict[str, int]:
        """The four cursors in whole milliseconds, for event metadata."""
        return {
            "generated_ms": int(self.generated_ms),
            "sent_ms": int(self.sent_ms),
            "played_ms": int(self.played_ms),
            "committed_ms": int(self.committed_ms),
        }
