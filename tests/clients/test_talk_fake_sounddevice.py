"""A stand-in for the ``sounddevice`` module (the sound hardware is the one external thing faked), and
the tests that hold it to the part of the real API ``duplex talk`` uses.

``FakeSoundDevice`` goes where ``import sounddevice`` looks (``sys.modules``). Its ``InputStream`` and
``OutputStream`` take the real keywords (``samplerate``, ``blocksize``, ``device``, ``channels``,
``dtype``, ``callback``, ``finished_callback``), have ``start``/``stop``/``abort``/``close``, the
``active``/``stopped``/``closed`` flags, and work as context managers. Once started, a thread calls
the callback once per block on an absolute real-time schedule, as PortAudio does:

* the microphone's blocks carry what was queued with ``say`` (resampled to the device rate), then
  silence; ``say_when_played(ms, pcm)`` queues speech once the speaker has played ``ms`` of non-silent
  audio (the user talks over the reply);
* the speaker's callback gets a buffer filled with garbage (PortAudio's buffer is not cleared
  either), and whatever the callback left in it is recorded: ``played()`` is everything the
  device was asked to play, in order.

With ``realtime=False`` no thread runs: the test calls ``stream.pump(n)`` to run ``n`` blocks at
once. ``query_devices(device, kind)`` answers for one input and one output device; ``refused_rates`` makes a
stream constructor raise ``PortAudioError`` (as PortAudio refuses a rate), ``fail_start`` makes
``start()`` raise it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from duplex.protocol.audio import resample

GARBAGE = 7.0  # what an output buffer holds before the callback fills it


class PortAudioError(Exception):
    """``sounddevice.PortAudioError``: ``args`` are the message and PortAudio's error code."""

    def __str__(self) -> str:
        message = self.args[0] if self.args else ""
        return f"{message} [PaErrorCode {self.args[1]}]" if len(self.args) > 1 else message


class CallbackFlags:
    """``sounddevice.CallbackFlags``: falsy when nothing went wrong."""

    def __bool__(self) -> bool:
        return False


class FakeStream:
    """One stream; see the module docstring."""

    def __init__(
        self,
        api: FakeSoundDevice,
        kind: str,
        *,
        samplerate: float | None = None,
        blocksize: int | None = None,
        device: Any = None,
        channels: int | None = None,
        dtype: str | None = None,
        callback: Any = None,
        finished_callback: Any = None,
        **_: Any,
    ) -> None:
        rate = samplerate or api.query_devices(device, kind)["default_samplerate"]
        if rate in api.refused_rates:
            name = "InputStream" if kind == "input" else "OutputStream"
            raise PortAudioError(f"Error opening {name}: Invalid sample rate", -9997)
        self.api = api
        self.kind = kind
        self.samplerate = float(rate)
        self.blocksize = blocksize or int(rate) // 50
        self.device = device
        self.channels = channels or 1
        self.dtype = dtype or "float32"
        self.callback = callback
        self.finished_callback = finished_callback
        self.active = False
        self.stopped = True
        self.closed = False
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        api.streams.append(self)

    def start(self) -> None:
        if self.closed:
            raise PortAudioError("Error starting stream: the stream is closed")
        if self.kind in self.api.fail_start:
            raise PortAudioError("Error starting stream: Device unavailable", -9985)
        self.active, self.stopped = True, False
        if not self.api.realtime:
            return
        self._halt.clear()
        self._thread = threading.Thread(target=self._run, name=f"fake-{self.kind}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._halt.set()
            thread.join()
        if self.stopped:
            return
        self.active, self.stopped = False, True
        if self.finished_callback is not None:
            self.finished_callback()

    abort = stop

    def close(self) -> None:
        self.stop()
        self.closed = True

    def __enter__(self) -> FakeStream:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pump(self, blocks: int = 1) -> None:
        """Run ``blocks`` callbacks now (``realtime=False``)."""
        assert self.active and not self.api.realtime, "pump() is for a started stream without a thread"
        for _ in range(blocks):
            self._block()

    def _run(self) -> None:
        period = self.blocksize / self.samplerate
        t0 = time.perf_counter()
        index = 0
        while not self._halt.is_set():
            due = t0 + index * period
            delay = due - time.perf_counter()
            if delay > 0 and self._halt.wait(delay):
                return
            index += 1
            self._on_time(due, period)

    def _on_time(self, due: float, period: float) -> None:
        """One callback of the real-time thread, due at ``due`` (``perf_counter``): a block."""
        self._block()

    def _block(self) -> None:
        times = {"currentTime": time.perf_counter()}
        if self.kind == "input":
            block = self.api._mic_block(self.blocksize, self.channels)
            self.callback(block, self.blocksize, times, CallbackFlags())
        else:
            out = np.full((self.blocksize, self.channels), GARBAGE, dtype=np.float32)
            self.callback(out, self.blocksize, times, CallbackFlags())
            self.api._record(out[:, 0].copy())


class FakeSoundDevice:
    """The ``sounddevice`` module as far as ``duplex talk`` uses it; see the module docstring."""

    PortAudioError = PortAudioError
    CallbackFlags = CallbackFlags

    def __init__(
        self,
        *,
        input_rate: int = 48000,
        output_rate: int = 24000,
        refused_rates: tuple[float, ...] = (),
        fail_start: tuple[str, ...] = (),
        realtime: bool = True,
    ) -> None:
        self.realtime = realtime
        self.input_rate = input_rate
        self.output_rate = output_rate
        self.refused_rates = refused_rates
        self.fail_start = fail_start
        self.streams: list[FakeStream] = []
        self._lock = threading.Lock()
        self._mic = np.zeros(0, dtype=np.float32)
        self._played: list[np.ndarray] = []
        self._voiced_played = 0
        self._cues: list[tuple[int, np.ndarray, int]] = []
        self.mic_drained = threading.Event()

    # -- the module's API ------------------------------------------------------------------

    def query_devices(self, device: Any = None, kind: str | None = None) -> dict[str, Any]:
        if device is not None and device not in (0, 1, "fake mic", "fake speaker"):
            raise ValueError(f"No {kind} device matching {device!r}")
        if kind == "input":
            return {"name": "fake mic", "default_samplerate": float(self.input_rate)}
        return {"name": "fake speaker", "default_samplerate": float(self.output_rate)}

    def InputStream(self, **kwargs: Any) -> FakeStream:
        return FakeStream(self, "input", **kwargs)

    def OutputStream(self, **kwargs: Any) -> FakeStream:
        return FakeStream(self, "output", **kwargs)

    # -- the test's side -------------------------------------------------------------------

    def say(self, pcm: np.ndarray, rate: int) -> None:
        """Queue ``pcm`` (mono float32 at ``rate``) into the microphone, after what is queued."""
        pcm = resample(np.asarray(pcm, np.float32), rate, self.input_rate) if rate != self.input_rate else pcm
        with self._lock:
            self._mic = np.concatenate([self._mic, np.asarray(pcm, np.float32)])
            self.mic_drained.clear()

    def say_when_played(self, ms: float, pcm: np.ndarray, rate: int) -> None:
        """Queue ``pcm`` into the microphone once the speaker played ``ms`` of non-silent audio."""
        with self._lock:
            self._cues.append((int(ms * self.output_rate / 1000), np.asarray(pcm, np.float32), rate))

    def played(self) -> np.ndarray:
        """Every sample the output callbacks left in their buffers, in order."""
        with self._lock:
            return np.concatenate(self._played) if self._played else np.zeros(0, np.float32)

    def _mic_block(self, frames: int, channels: int) -> np.ndarray:
        with self._lock:
            take = self._mic[:frames]
            self._mic = self._mic[frames:]
            if not len(self._mic):
                self.mic_drained.set()
        block = np.zeros((frames, channels), dtype=np.float32)
        block[: len(take), :] = take[:, None]
        return block

    def _record(self, block: np.ndarray) -> None:
        due = []
        with self._lock:
            self._played.append(block)
            self._voiced_played += int(np.count_nonzero(block))
            while self._cues and self._cues[0][0] <= self._voiced_played:
                _, pcm, rate = self._cues.pop(0)
                due.append((pcm, rate))
        for pcm, rate in due:
            self.say(pcm, rate)


# -- the stand-in's own contract ---------------------------------------------------------------


def test_the_microphone_delivers_what_was_said_in_blocks_at_the_device_rate() -> None:
    sd = FakeSoundDevice(input_rate=24000)
    said = np.linspace(-0.5, 0.5, 2400, dtype=np.float32)
    sd.say(said, 24000)
    got: list[np.ndarray] = []
    stream = sd.InputStream(
        samplerate=24000,
        blocksize=480,
        channels=1,
        dtype="float32",
        callback=lambda indata, frames, t, status: got.append(indata[:, 0].copy()),
    )
    with stream:
        assert stream.active and not stream.stopped
        assert sd.mic_drained.wait(5)
    assert stream.closed and not stream.active
    heard = np.concatenate(got)
    assert {len(b) for b in got} == {480}
    assert np.array_equal(heard[:2400], said) and not heard[2400:].any()


def test_the_speaker_records_exactly_what_the_callback_wrote() -> None:
    sd = FakeSoundDevice()
    blocks = iter(np.arange(1, 11, dtype=np.float32).reshape(5, 2) / 10)
    done = threading.Event()

    def callback(outdata: np.ndarray, frames: int, t: Any, status: Any) -> None:
        block = next(blocks, None)
        if block is None:
            outdata[:] = 0.0
            done.set()
        else:
            outdata[:2, 0] = block  # the rest of the buffer is left as it came

    with sd.OutputStream(samplerate=24000, blocksize=4, channels=1, callback=callback):
        assert done.wait(5)
    played = sd.played()
    first = played[:4]
    assert first.tolist() == [np.float32(0.1), np.float32(0.2), GARBAGE, GARBAGE]


def test_a_refused_rate_and_a_failing_start_raise_portaudio_errors() -> None:
    sd = FakeSoundDevice(refused_rates=(12345,), fail_start=("output",))
    with pytest.raises(PortAudioError, match="Invalid sample rate"):
        sd.InputStream(samplerate=12345, callback=lambda *a: None)
    stream = sd.OutputStream(samplerate=24000, callback=lambda *a: None)
    with pytest.raises(PortAudioError, match="Device unavailable"):
        stream.start()
    with pytest.raises(ValueError, match="No input device"):
        sd.query_devices("nope", "input")
