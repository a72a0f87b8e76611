"""The input feed of one slot: samples received vs. consumed, and the frame clock.

Theory of operation (one rule, no modes)
-------------------------------------------------------
The runner feeds decoded audio (at the plugin's input rate, in the feed's ``dtype``: float32,
or int16 for a plugin that takes int16 samples) into the slot's feed; the frame scheduler asks
every feed at every tick whether it has a frame to step, with ``take(now)``:

* a **complete** frame (``received - consumed >= chunk``) is stepped when the feed's pace
  allows (``not_before``): a token bucket of ``BURST_FRAMES`` frames refilled at two frames
  per period. A client on time keeps the bucket full and is never held back; a backlog of
  up to ``BURST_FRAMES`` frames (what a server stall or a network hiccup leaves behind)
  steps as fast as the scheduler ticks, so the session is back on real time as soon as the
  CPU allows; a longer burst (a client streaming a file at once) is consumed at twice the
  model's pace after its first ``BURST_FRAMES`` frames;
* an **overdue** frame (its due time plus ``late_tolerance_s`` has passed) is padded
  with silence after whatever samples arrived, flagged ``padded``, so the model
  stays clocked while a client is late; after ``max_padding_frames`` padded frames
  in a row the feed goes idle (no steps) until input arrives again;
* otherwise the slot is left out of this tick (frozen).

The frame clock: after a step at ``t``, the next frame is due at ``t + period``
(a padded step advances from the previous due time instead, so padding keeps real
time). Lateness is ``step time - due time`` (0 when early).

Bounds: the feed holds at most ``max_buffered_samples``; ``feed`` refuses (returns
False) an append that would exceed it, so the session can tell the client. The
buffer starts at a few frames and doubles up to that bound only when a client runs
ahead, so a thousand sessions on time keep a small, cache-warm buffer each.
Video frames ride the chunk their append's audio falls in (an append's frames are placed at the
end of its audio; a frames-only append's at the chunk in progress), so frames that arrive in a
burst with the audio of several chunks (a late client catching up, a session's first appends
while its model opens) stay with their own chunks. At most ``MAX_VIDEO_FRAMES`` ride one chunk and
at most ``MAX_PENDING_VIDEO_FRAMES`` wait in all (older ones are dropped and counted in
``video_dropped``).

Typed text (``add_text``, a model that reads text while it hears the stream) rides the next frame
taken, whatever its audio. Text is input like audio: it restarts the padding of a silent feed, and
one that arrives while no audio flows makes a frame due at once, so the model reads it within a period
and the late tolerance (a padded frame, as for a late client) instead of waiting for the client's next
audio. At most ``MAX_PENDING_TEXT_CHARS`` characters wait; ``add_text``
refuses (returns False) a text past that, so the session can tell the client.

Sans-IO: ``now`` and ``submitted_at`` are passed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import msgspec
import numpy as np
import numpy.typing as npt

from duplex.plugins.base import ToolResult

__all__ = ["FeedFrame", "SlotFeed"]

MAX_VIDEO_FRAMES = 2
#: Video frames a feed holds for the chunks still buffered.
MAX_PENDING_VIDEO_FRAMES = 4 * MAX_VIDEO_FRAMES
#: Typed text a feed holds for its next frame, in characters.
MAX_PENDING_TEXT_CHARS = 32_768
#: Initial buffer size, in frames (it grows up to ``max_buffered_samples`` when needed).
INITIAL_FRAMES = 4
#: Time between two steps of one slot once its burst allowance is spent, in frame periods
#: (bursts run at most 2x real time).
MIN_STEP_GAP = 0.5
#: Frames a slot may step back to back, however recent its last step: the token bucket's size.
#: A pace of one step per half period also held back a client that was on time whenever the
#: server had fallen behind it: after a 300 ms stall each of 450 sessions held four frames and
#: took 160 ms longer than a bare server to be answered on time again.
BURST_FRAMES = 4


class FeedFrame(msgspec.Struct):
    """One chunk taken from a feed for a step (a msgspec struct: built in C, once per frame)."""

    pcm: np.ndarray  # the feed's dtype, fresh: the plugin owns it
    padded: bool
    submitted_at: float | None  # submit time of the append that completed the frame
    due_at: float | None
    video_frames: tuple[bytes, ...]
    tool_results: tuple[ToolResult, ...] = ()
    texts: tuple[str, ...] = ()


class SlotFeed:
    """Input buffer and frame clock of one slot (see the module docstring)."""

    def __init__(
        self,
        chunk: int,
        period_s: float,
        *,
        late_tolerance_s: float,
        max_padding_frames: int,
        max_buffered_samples: int,
        tick_s: float,
        on_ready: Callable[[], None] | None = None,
        dtype: npt.DTypeLike = np.float32,
    ) -> None:
        self.chunk = chunk
        self.dtype = np.dtype(dtype)
        self.period_s = period_s
        self.late_tolerance_s = late_tolerance_s
        self.max_padding_frames = max_padding_frames
        self.tick_s = tick_s
        self._on_ready = on_ready  # told when a complete frame is buffered
        self.max_buffered = max(max_buffered_samples, chunk)
        self._buf = np.zeros(min(self.max_buffered, INITIAL_FRAMES * chunk), dtype=self.dtype)
        self._start = 0  # first unread sample in _buf
        self._end = 0
        # A whole frame handed over by ``feed`` while the buffer was empty (see ``feed``); it is
        # the only buffered input while it is held.
        self._whole: np.ndarray | None = None
        self._held = 0  # chunk while _whole is held, else 0
        self.received = 0
        self.consumed = 0
        self._submits: deque[tuple[int, float]] = deque()  # (received after that append, submitted_at)
        self.due_at: float | None = None
        # When the last complete frame became complete: a client on time completes the next one a
        # period later (the unit scheduler's gather, ``FrameScheduler``).
        self.completed_at: float | None = None
        self.not_before = float("-inf")
        # The pace as a virtual clock (GCRA): the bucket is empty at ``_pace_at``; every step
        # moves it one gap on (from now, when it had fallen behind); a step may come once it is
        # at most ``BURST_FRAMES - 1`` gaps ahead of the time of that step.
        self._gap = period_s * MIN_STEP_GAP
        self._burst_s = self._gap * (BURST_FRAMES - 1)
        self._pace_at = float("-inf")
        self.pads = 0
        # (the input position the frame goes with: ``received`` after its append, the frame)
        self.video: deque[tuple[int, bytes]] = deque(maxlen=MAX_PENDING_VIDEO_FRAMES)
        self.video_dropped = 0
        self.tool_results: list[ToolResult] = []  # the client's answers, for the next frame
        self.texts: list[str] = []  # the user's typed text, for the next frame
        self._text_chars = 0

    @property
    def buffered(self) -> int:
        return self._end - self._start + self._held

    def feed(
        self, pcm: np.ndarray, now: float, submitted_at: float, video_frames: tuple[bytes, ...] = ()
    ) -> bool:
        """Queue decoded samples. Returns False (nothing queued) when the buffer would overflow.

        The feed takes ``pcm`` (in the feed's ``dtype``) over: the caller must not change it
        afterwards. When the buffer is empty and ``pcm`` is exactly one frame in a writable,
        contiguous 1-D array of the feed's dtype (a client on time at the model's rate), the
        array itself is kept and becomes the stepped frame: no copy in, no copy out.
        """
        n = len(pcm)
        if self._whole is not None:
            self._spill()
        start, end = self._start, self._end
        live = end - start
        if live + n > self.max_buffered:
            return False
        # A 1-D array of the feed's dtype a plugin may keep and change as if it were a fresh copy.
        flags = pcm.flags
        if (
            n == self.chunk
            and live == 0
            and pcm.dtype == self.dtype
            and pcm.ndim == 1
            and flags.c_contiguous
            and flags.writeable
        ):
            self._whole = pcm
            self._held = n
            self.received += n
            self.completed_at = now
            if self._on_ready is not None:
                self._on_ready()
            self._submits.append((self.received, submitted_at))
            self.pads = 0
            if self.due_at is None:
                self.due_at = now  # a whole frame: due at once (as below, with buffered == chunk)
            if video_frames:
                self._add_video(video_frames)
            return True
        if pcm.dtype.kind != self.dtype.kind:  # float samples in an int16 feed (or back) are garbage
            raise TypeError(f"feed holds {self.dtype} samples, got {pcm.dtype}")
        buf = self._buf
        if end + n > len(buf):  # compact, growing when needed
            if live + n > len(buf):
                size = len(buf)
                while size < live + n:
                    size *= 2
                buf = np.zeros(min(size, self.max_buffered), dtype=self.dtype)
            buf[:live] = self._buf[start:end]
            self._buf = buf
            self._start = start = 0
            end = live
        buf[end : end + n] = pcm
        self._end = end = end + n
        self.received += n
        if end - start >= self.chunk:
            if end - start - n < self.chunk:  # this append completed a frame
                self.completed_at = now
            if self._on_ready is not None:
                self._on_ready()
        if n:
            self._submits.append((self.received, submitted_at))
            self.pads = 0
            if self.due_at is None:
                self.due_at = now + self.period_s * max(0.0, 1.0 - (end - start) / self.chunk)
        if video_frames:
            self._add_video(video_frames)
        return True

    def _add_video(self, video_frames: tuple[bytes, ...]) -> None:
        video = self.video
        position = self.received
        for frame in video_frames:
            if len(video) == video.maxlen:
                self.video_dropped += 1
            video.append((position, frame))

    def _take_video(self, consumed: int) -> tuple[bytes, ...]:
        """The frames of the input up to ``consumed`` (the chunk being taken), the newest
        ``MAX_VIDEO_FRAMES`` of them."""
        video = self.video
        frames = []
        while video and video[0][0] <= consumed:
            frames.append(video.popleft()[1])
        if len(frames) > MAX_VIDEO_FRAMES:
            self.video_dropped += len(frames) - MAX_VIDEO_FRAMES
            del frames[:-MAX_VIDEO_FRAMES]
        return tuple(frames)

    def _spill(self) -> None:
        """Copy a held whole frame into the (empty) buffer, before more input joins it."""
        whole, self._whole = self._whole, None
        assert whole is not None and self._start == self._end
        n, self._held = self._held, 0
        self._buf[:n] = whole
        self._start, self._end = 0, n

    def add_tool_result(self, result: ToolResult) -> None:
        """The client answered a tool call: the answer goes to the model with the next frame. Bounded
        by the session's conversation (each answer is an item) and by one call's output size."""
        self.tool_results.append(result)

    def add_text(self, text: str, now: float) -> bool:
        """The user typed ``text``: it goes to the model with the next frame, which is due at once when
        no audio is on its way (see the module docstring). False (nothing kept) past
        ``MAX_PENDING_TEXT_CHARS``."""
        if self._text_chars + len(text) > MAX_PENDING_TEXT_CHARS:
            return False
        self.texts.append(text)
        self._text_chars += len(text)
        self.pads = 0  # a silent feed pads again: the text is input
        if self.due_at is None:
            self.due_at = now
        return True

    def clear(self) -> None:
        """Drop buffered input (``input_audio_buffer.clear`` on a frame session)."""
        self.consumed += self.buffered
        self._start = self._end = 0
        self._whole, self._held = None, 0
        self._submits.clear()

    def take(self, now: float) -> FeedFrame | None:
        """The frame to step at ``now``, or None (see the module docstring)."""
        if now < self.not_before:
            return None
        due = self.due_at
        chunk = self.chunk
        start = self._start
        if self._whole is not None:
            pcm, self._whole, self._held = self._whole, None, 0
            self.consumed += chunk
            padded = False
        elif self._end - start >= chunk:
            pcm = self._buf[start : start + chunk].copy()
            self._start = start = start + chunk
            self.consumed += chunk
            padded = False
        elif due is not None and now >= due + self.late_tolerance_s and self.pads < self.max_padding_frames:
            pcm = np.zeros(chunk, dtype=self.dtype)
            have = self._end - start
            pcm[:have] = self._buf[start : self._end]
            self._start = start = self._end
            self.consumed += have
            padded = True
        else:
            if due is not None and self.pads >= self.max_padding_frames:
                self.due_at = None  # idle until input arrives
            return None
        # The append that completed this frame: the first whose end reaches ``consumed``.
        consumed = self.consumed
        submits = self._submits
        while submits and submits[0][0] < consumed:
            submits.popleft()
        submitted_at = None
        if submits and not padded:
            submitted_at = submits[0][1]
            if submits[0][0] == consumed:
                submits.popleft()
        if padded:
            self.pads += 1
            self.due_at = (due if due is not None else now) + self.period_s
        else:
            self.pads = 0
            self.due_at = (now if due is None or now > due else due) + self.period_s
        # Pace a burst (the module docstring): a client on time is never held back (its frames
        # complete a whole period apart, so the bucket stays full) and no latency accumulates.
        pace_at = self._pace_at
        self._pace_at = pace_at = (pace_at if pace_at > now else now) + self._gap
        self.not_before = pace_at - self._burst_s
        video = self._take_video(consumed) if self.video else ()
        if start == self._end:
            self._start = self._end = 0
        if self.tool_results or self.texts:
            results, texts = tuple(self.tool_results), tuple(self.texts)
            self.tool_results.clear()
            self.texts.clear()
            self._text_chars = 0
            return FeedFrame(pcm, padded, submitted_at, due, video, results, texts)
        return FeedFrame(pcm, padded, submitted_at, due, video)
