"""The sound card side of ``duplex talk``: a live microphone, a speaker with a jitter buffer, and the
playback truth that speaker reports.

Theory of operation
-------------------
PortAudio (through ``sounddevice``) calls a stream's callback on its own thread, once per block, at
the device's rate. Nothing there may wait on the event loop, so each direction has one hand-off:

* ``MicrophoneStream``: the ``InputStream`` callback copies its block and hands it to the loop with
  ``call_soon_threadsafe``; on the loop the block is resampled to the session rate and buffered, and
  ``read(n)`` waits for ``n`` samples. The buffer is bounded (``max_buffer_ms``): when the reader
  falls behind, the oldest audio is dropped and counted in ``dropped_ms`` (live audio that old is
  worth less than the audio now).
* ``SpeakerStream``: the loop pushes reply audio per response (``push``, resampled to the device
  rate); the ``OutputStream`` callback pulls from that jitter buffer under a lock, counts the frames
  it consumed per response and plays silence when the buffer ran dry. After running dry, playback
  starts again only once ``prebuffer_ms`` are queued (or the queued response has ended), so network
  jitter does not chop the audio into pieces. ``flush()`` drops everything queued at once
  (barge-in); what the callback had consumed by then is what the listener heard. The buffer is
  bounded (``max_buffer_ms``): audio beyond it is not queued and is counted in ``dropped_ms`` (never
  played, so never acknowledged).
* ``SpeakerPlayback``: the playback model that feeds a ``SpeakerStream`` from server events and
  turns its counters into commands, with the interface of ``clients.playback.SimulatedPlayback``
  (``on_event``, ``acks_due``, ``interrupt``). Acks report the frames the device callback consumed:
  at most one ``playback.ack`` per ``interval_ms`` per response, and a final one once a finished
  response is fully played. ``input_audio_buffer.speech_started`` (server VAD) or
  ``overlap.decision`` with ``action: barge_in`` (the server's overlap policy) while reply audio is
  queued or still arriving is a barge-in: the speaker is flushed at once, and ``conversation.item.truncate``
  at the played position is queued for every response cut short, as OpenAI recommends for clients
  that play the audio themselves (the server then keeps only the heard part in the history).

Echo cancellation. Both streams take an optional ``echo`` (``clients.echo_cancel.EchoLink``): the
speaker's callback hands it a copy of every block it filled, stamped with the block's DAC time (a
lock and an append, nothing more), and the microphone runs every resampled chunk through it on the
loop, stamped with its ADC time, before buffering it. Timestamps are the callback's ``time_info``
(``outputBufferDacTime`` / ``inputBufferAdcTime``); where a host API reports 0 there, the callback's
``currentTime`` plus the stream's output latency (minus its input latency) stands in.

Positions are frames the callback handed to PortAudio; the device's own output latency (a few tens of
milliseconds, ``stream.latency``) is not subtracted.

Both streams take the ``sounddevice`` module as a parameter, so a stand-in for the sound hardware can
be passed. They are context managers, entered inside the running event loop: entering opens and
starts the stream, leaving stops and closes it. A device that cannot be found, a rate it refuses, or
a stream that fails to start raises ``AudioDeviceError`` (one line, naming the device).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clients.collector import event_type
from clients.echo_cancel import EchoLink
from duplex.protocol import AudioFormat, ConversationItemTruncate, PlaybackAck, parse_format
from duplex.protocol.audio import StreamResampler, decode_audio

__all__ = ["AudioDeviceError", "MicrophoneStream", "SpeakerPlayback", "SpeakerStream"]

RESAMPLE_QUALITY = "LQ"  # speech: latency matters more than the top of the band (see StreamResampler)


class AudioDeviceError(Exception):
    """A sound device that cannot be opened or started; the message is one line for the user."""


def _device_errors(sd: Any) -> tuple[type[BaseException], ...]:
    # ``sounddevice`` raises PortAudioError for what PortAudio refuses (a rate, a busy device) and
    # ValueError for a device it cannot find or settings it rejects itself.
    return (getattr(sd, "PortAudioError", OSError), ValueError)


def callback_time(time_info: Any, name: str, latency: float) -> float:
    """A PortAudio callback's ``time_info`` stamp ``name`` (``outputBufferDacTime`` or
    ``inputBufferAdcTime``), in seconds on the stream clock. A host API that reports 0 for it gets
    ``currentTime + latency`` instead (pass the input latency negated)."""
    value = getattr(time_info, name, None)
    if value is None and isinstance(time_info, dict):
        value = time_info.get(name)
    if value:
        return float(value)
    now = getattr(time_info, "currentTime", None)
    if now is None and isinstance(time_info, dict):
        now = time_info.get("currentTime")
    return float(now or 0.0) + latency


def _stream_latency(stream: Any) -> float:
    latency = getattr(stream, "latency", 0.0)
    with contextlib.suppress(TypeError, ValueError):
        return float(latency or 0.0)
    return 0.0


class _DeviceStream:
    """What both streams share: find the device and its rate, open and start the stream (or raise
    ``AudioDeviceError``), and stop and close it."""

    kind = ""  # "input" or "output"
    role = ""  # how the user calls it

    def __init__(self, sd: Any, device: Any, device_rate: int | None, block_ms: int) -> None:
        self.sd = sd
        self.device = device
        self.asked_rate = device_rate
        self.block_ms = block_ms
        self.device_rate = 0  # once open
        self.name = ""  # once open
        self.latency = 0.0  # the stream's own latency (s), once open
        self._stream: Any = None

    def _open(self, **settings: Any) -> None:
        errors = _device_errors(self.sd)
        try:
            info = self.sd.query_devices(self.device, self.kind)
            self.name = str(info.get("name", ""))
            rate = self.asked_rate or round(float(info["default_samplerate"]))
            self.device_rate = rate
            self._prepare()
            factory = self.sd.InputStream if self.kind == "input" else self.sd.OutputStream
            self._stream = factory(
                samplerate=rate,
                blocksize=rate * self.block_ms // 1000,
                device=self.device,
                channels=1,
                dtype="float32",
                **settings,
            )
            self.latency = _stream_latency(self._stream)
            self._stream.start()
        except errors as exc:
            self._close_stream()
            raise AudioDeviceError(f"cannot open the {self.role} ({self.label}): {exc}") from exc

    def _prepare(self) -> None:
        """Called once the device rate is known, before the stream is made."""

    @property
    def label(self) -> str:
        """The device's name and rate, as far as known."""
        name = self.name or (f"default {self.kind}" if self.device is None else str(self.device))
        rate = self.device_rate or self.asked_rate
        return f"{name} at {rate} Hz" if rate else name

    def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(*_device_errors(self.sd)):
                stream.stop()
            with contextlib.suppress(*_device_errors(self.sd)):
                stream.close()


class MicrophoneStream(_DeviceStream):
    """The microphone as mono float32 at ``rate`` (the session's input rate); see the module docstring.

    ``device``: a ``sounddevice`` device (index or name; None for the default input).
    ``device_rate``: the rate to open the device at (None: its default rate). ``block_ms``: the
    callback's block. ``max_buffer_ms``: audio kept for a slow reader (older audio is dropped).
    ``echo``: the echo canceller's link (its rate must be ``rate``), or None.
    """

    kind, role = "input", "microphone"

    def __init__(
        self,
        sd: Any,
        *,
        rate: int,
        device: Any = None,
        device_rate: int | None = None,
        block_ms: int = 20,
        max_buffer_ms: int = 2000,
        echo: EchoLink | None = None,
    ) -> None:
        super().__init__(sd, device, device_rate, block_ms)
        if echo is not None and echo.rate != rate:
            raise ValueError(f"the echo canceller runs at {echo.rate} Hz, the microphone at {rate} Hz")
        self.rate = rate
        self.echo = echo
        self.max_buffer = rate * max_buffer_ms // 1000
        self.dropped_samples = 0
        self.status_flags = 0  # callbacks that reported an input overflow
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resampler: StreamResampler | None = None
        self._chunks: deque[np.ndarray] = deque()
        self._buffered = 0
        self._ready = asyncio.Event()
        self._ended = False

    @property
    def dropped_ms(self) -> float:
        return self.dropped_samples / self.rate * 1000.0

    def __enter__(self) -> MicrophoneStream:
        self._loop = asyncio.get_running_loop()
        self._open(callback=self._callback, finished_callback=self._finished)
        return self

    def _prepare(self) -> None:
        self._resampler = StreamResampler(self.device_rate, self.rate, quality=RESAMPLE_QUALITY)

    def __exit__(self, *exc: object) -> None:
        self._close_stream()
        self._end()

    # -- PortAudio's thread ----------------------------------------------------------------

    def _callback(self, indata: np.ndarray, frames: int, time_info: Any, status: Any) -> None:
        block = np.array(indata[:frames, 0], dtype=np.float32)  # a copy: PortAudio reuses its buffer
        if status:
            self.status_flags += 1
        stamp = callback_time(time_info, "inputBufferAdcTime", -self.latency)
        self._hand_over(self._deliver, block, stamp)

    def _finished(self) -> None:
        self._hand_over(self._end)

    def _hand_over(self, fn: Any, *args: Any) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed: the stream is being torn down
            loop.call_soon_threadsafe(fn, *args)

    # -- the loop's side -------------------------------------------------------------------

    def _deliver(self, block: np.ndarray, stamp: float) -> None:
        if self._ended or self._resampler is None:
            return
        pcm = self._resampler.process(block)
        if self.echo is not None:
            pcm = self.echo.cancel(pcm, stamp)
        if len(pcm):
            self._chunks.append(pcm)
            self._buffered += len(pcm)
        while self._buffered > self.max_buffer:
            extra = self._buffered - self.max_buffer
            head = self._chunks[0]
            if len(head) <= extra:
                self._chunks.popleft()
                cut = len(head)
            else:
                self._chunks[0] = head[extra:]
                cut = extra
            self._buffered -= cut
            self.dropped_samples += cut
        self._ready.set()

    def _end(self) -> None:
        self._ended = True
        self._ready.set()

    async def read(self, n: int) -> np.ndarray:
        """The next ``n`` samples (float32 at ``rate``). Waits for them; cancel-safe (nothing is
        taken until they are all there). Raises ``AudioDeviceError`` once the stream has ended."""
        while self._buffered < n:
            if self._ended:
                raise AudioDeviceError(f"the microphone stopped ({self.label})")
            self._ready.clear()
            await self._ready.wait()
        parts: list[np.ndarray] = []
        need = n
        while need:
            head = self._chunks[0]
            if len(head) <= need:
                parts.append(self._chunks.popleft())
                need -= len(head)
            else:
                parts.append(head[:need])
                self._chunks[0] = head[need:]
                need = 0
        self._buffered -= n
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


@dataclass
class _Segment:
    response_id: str
    pcm: np.ndarray  # float32 at the device rate
    offset: int = 0


@dataclass
class _Account:
    """One response on the speaker, in device frames (``received_ms``: session audio received)."""

    resampler: StreamResampler | None
    pushed: int = 0
    played: int = 0
    received_ms: float = 0.0
    ended: bool = False


class SpeakerStream(_DeviceStream):
    """A speaker fed per response, with a jitter buffer; see the module docstring.

    ``device``: a ``sounddevice`` device (None: the default output). ``device_rate``: the rate to open
    it at (None: its default rate). ``prebuffer_ms``: queued audio needed before playback starts or
    resumes after running dry. ``max_buffer_ms``: queued audio beyond this is dropped (counted).
    ``echo``: the echo canceller's link, handed every block played, or None.
    """

    kind, role = "output", "speaker"

    def __init__(
        self,
        sd: Any,
        *,
        device: Any = None,
        device_rate: int | None = None,
        block_ms: int = 20,
        prebuffer_ms: int = 60,
        max_buffer_ms: int = 300_000,
        echo: EchoLink | None = None,
    ) -> None:
        super().__init__(sd, device, device_rate, block_ms)
        self.echo = echo
        self.prebuffer_ms = prebuffer_ms
        self.max_buffer_ms = max_buffer_ms
        self.dropped_frames = 0
        self.underflows = 0  # callbacks that reported an output underflow
        self._lock = threading.Lock()
        self._segments: deque[_Segment] = deque()
        self._accounts: dict[str, _Account] = {}
        self._queued = 0
        self._primed = False
        self._prebuffer = 0
        self._max_queued = 0

    @property
    def dropped_ms(self) -> float:
        return self.dropped_frames / self.device_rate * 1000.0 if self.device_rate else 0.0

    def __enter__(self) -> SpeakerStream:
        self._open(callback=self._callback)
        return self

    def _prepare(self) -> None:
        self._prebuffer = self.device_rate * self.prebuffer_ms // 1000
        self._max_queued = self.device_rate * self.max_buffer_ms // 1000
        if self.echo is not None:
            self.echo.open_output(self.device_rate, self.device_rate * self.block_ms // 1000)

    def __exit__(self, *exc: object) -> None:
        self._close_stream()

    # -- PortAudio's thread ----------------------------------------------------------------

    def _callback(self, outdata: np.ndarray, frames: int, time_info: Any, status: Any) -> None:
        out = outdata[:frames, 0]
        filled = 0
        with self._lock:
            if status:
                self.underflows += 1
            if not self._primed and self._segments:
                last = self._accounts.get(self._segments[-1].response_id)
                self._primed = self._queued >= self._prebuffer or (last is not None and last.ended)
            while self._primed and filled < frames and self._segments:
                seg = self._segments[0]
                n = min(frames - filled, len(seg.pcm) - seg.offset)
                out[filled : filled + n] = seg.pcm[seg.offset : seg.offset + n]
                seg.offset += n
                filled += n
                self._queued -= n
                account = self._accounts.get(seg.response_id)
                if account is not None:
                    account.played += n
                if seg.offset == len(seg.pcm):
                    self._segments.popleft()
            if not self._segments:
                self._primed = False  # ran dry: wait for the prebuffer again
        out[filled:] = 0.0
        if self.echo is not None:
            self.echo.played(out.copy(), callback_time(time_info, "outputBufferDacTime", self.latency))
        if outdata.shape[1] > 1:
            outdata[:frames, 1:] = outdata[:frames, :1]

    # -- the loop's side -------------------------------------------------------------------

    def push(self, response_id: str, pcm: np.ndarray, rate: int) -> None:
        """Queue ``pcm`` (mono float32 at ``rate``) as the next audio of ``response_id``."""
        account = self._accounts.get(response_id)
        if account is None:
            resampler = None
            if rate != self.device_rate:
                resampler = StreamResampler(rate, self.device_rate, quality=RESAMPLE_QUALITY)
            account = _Account(resampler)
            with self._lock:
                self._accounts[response_id] = account
        account.received_ms += len(pcm) / rate * 1000.0
        out = account.resampler.process(pcm) if account.resampler is not None else pcm
        self._queue(response_id, account, np.asarray(out, dtype=np.float32))

    def end(self, response_id: str) -> None:
        """No more audio will come for ``response_id`` (its resampler's tail is queued now)."""
        account = self._accounts.get(response_id)
        if account is None or account.ended:
            return
        if account.resampler is not None:
            self._queue(response_id, account, account.resampler.flush())
        with self._lock:
            account.ended = True

    def _queue(self, response_id: str, account: _Account, pcm: np.ndarray) -> None:
        if not len(pcm):
            return
        with self._lock:
            room = max(self._max_queued - self._queued, 0)
            if len(pcm) > room:
                self.dropped_frames += len(pcm) - room
                pcm = pcm[:room]
            if len(pcm):
                self._segments.append(_Segment(response_id, pcm))
                self._queued += len(pcm)
                account.pushed += len(pcm)

    def played_ms(self, response_id: str) -> float:
        """How much of ``response_id`` the device consumed, in ms (never more than was received)."""
        account = self._accounts.get(response_id)
        if account is None:
            return 0.0
        with self._lock:
            played = account.played
        return min(played / self.device_rate * 1000.0, account.received_ms)

    def finished(self, response_id: str) -> bool:
        """True once ``response_id`` ended and every frame queued for it was played."""
        account = self._accounts.get(response_id)
        if account is None:
            return True
        with self._lock:
            return account.ended and account.played >= account.pushed

    @property
    def queued_ms(self) -> float:
        """Audio waiting in the jitter buffer."""
        with self._lock:
            return self._queued / self.device_rate * 1000.0 if self.device_rate else 0.0

    def flush(self) -> dict[str, float]:
        """Drop every queued frame now; returns the played ms of each response still known."""
        with self._lock:
            self._segments.clear()
            self._queued = 0
            self._primed = False
        return {rid: self.played_ms(rid) for rid in self._accounts}

    def forget(self, response_id: str) -> None:
        """Stop tracking ``response_id`` (its audio left the buffer or was flushed)."""
        with self._lock:
            self._accounts.pop(response_id, None)


@dataclass
class SpeakerPlayback:
    """Playback truth from a real speaker (see the module docstring); ``now`` is seconds, unused
    except for the ack interval."""

    speaker: SpeakerStream
    output_format: AudioFormat | None = None
    interval_ms: float = 200.0
    items: dict[str, str] = field(default_factory=dict)  # response id -> item id, while tracked
    barge_ins: int = 0  # responses cut short by the listener
    last_cut: ConversationItemTruncate | None = None
    _acked: dict[str, float] = field(default_factory=dict)
    _last_ack: dict[str, float] = field(default_factory=dict)
    _pending: list[Any] = field(default_factory=list)
    _cut: deque[str] = field(default_factory=lambda: deque(maxlen=64))

    def on_event(self, event: Any, now: float) -> None:
        kind = event_type(event)
        if kind == "response.output_audio.delta":
            rid = event.response_id
            if rid in self._cut:
                return  # audio of a response the listener already interrupted
            fmt = self._format(event)
            if fmt is None:
                return
            self.items.setdefault(rid, event.item_id)
            self.speaker.push(rid, decode_audio(event.delta, fmt), fmt.rate)
        elif kind == "response.done":
            self.speaker.end(event.response.id)
        elif self.busy and (
            kind == "input_audio_buffer.speech_started"
            or (kind == "overlap.decision" and event.action == "barge_in")
        ):
            self._pending.extend(self.interrupt(now))

    def _format(self, event: Any) -> AudioFormat | None:
        spec = getattr(event, "format", None)
        if spec is not None:
            with contextlib.suppress(Exception):
                return parse_format(spec, getattr(event, "sample_rate_hz", None))
        return self.output_format

    @property
    def busy(self) -> bool:
        """Reply audio is queued, or a response with audio has not ended yet."""
        return any(not self.speaker.finished(rid) for rid in self.items)

    def acks_due(self, now: float) -> list[Any]:
        """Commands to send now: queued truncations first, then the acks that are due."""
        out, self._pending = self._pending, []
        for rid, item_id in list(self.items.items()):
            played = self.speaker.played_ms(rid)
            finished = self.speaker.finished(rid)
            due = finished or (now - self._last_ack.get(rid, -math.inf)) * 1000.0 >= self.interval_ms
            if due and played > self._acked.get(rid, 0.0):
                out.append(PlaybackAck(response_id=rid, item_id=item_id, played_ms=played))
                self._acked[rid], self._last_ack[rid] = played, now
            if finished:
                self._drop(rid)
        return out

    def interrupt(self, now: float) -> list[ConversationItemTruncate]:
        """Stop playback now: flush the speaker; a truncation at the played position for every
        response cut short (fully played ones keep their final ack)."""
        played = self.speaker.flush()
        out = []
        for rid, item_id in list(self.items.items()):
            if self.speaker.finished(rid):
                continue
            cut = ConversationItemTruncate(
                item_id=item_id, content_index=0, audio_end_ms=math.floor(played.get(rid, 0.0))
            )
            out.append(cut)
            self.barge_ins += 1
            self.last_cut = cut
            self._cut.append(rid)
            self._drop(rid)
        return out

    def _drop(self, rid: str) -> None:
        self.items.pop(rid, None)
        self._acked.pop(rid, None)
        self._last_ack.pop(rid, None)
        self.speaker.forget(rid)
