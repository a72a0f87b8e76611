"""Acoustic echo cancellation for ``duplex talk --mic --play``: the speaker's sound taken back out of
the microphone, so the server does not hear the model's own voice as the user's.

Theory of operation
-------------------
``EchoCanceller`` is sans-IO: it is fed what the speaker played (``playback``) and the microphone
(``process``), both mono float32 at one rate, and returns the microphone with the echo removed. It
reads no clock; where a played sample lands on the microphone's timeline is the caller's to say.

*Timeline.* Every sample is placed on the microphone's sample count: near sample ``k`` is the k-th
sample ever given to ``process``. ``playback(far)`` puts ``far`` right after the previous far
samples, the first call at ``delay`` (the bulk delay, output plus input latency, in samples);
``playback(far, at=k)`` puts it at ``k`` (a gap is silence, an overlap replaces). So the bulk delay
is handled by delaying the reference, and the adaptive filter only models what is left: the room
and whatever alignment error remains (keep the reference a little early, never late: a filter
cannot reach into the future). Far samples for a position that was already processed come too late
and are dropped (``late_samples``); far samples more than ``max_ahead_ms`` ahead of the microphone
are dropped oldest first (``dropped_samples``) -- a stalled microphone cannot grow the buffer.

*Filter.* A partitioned-block frequency-domain adaptive filter (PBFDAF, the MDF family used by
Speex and WebRTC's AEC): blocks of ``block`` samples, FFTs of twice that (overlap-save), ``P =
ceil(tail / block)`` partitions that together span ``tail_ms`` of echo path (24 partitions of 256
at 24 kHz). The update is NLMS per frequency bin, made proportionate (IPNLMS): partition ``p`` gets
the share ``g_p`` of the step (``(1 - a) / 2P + (1 + a) |W_p| / 2 sum |W|``, ``a = proportion``; an
empty filter gives every partition ``1/P``), normalized by ``sum_p g_p |X_p|^2`` plus a floor (the
power of -60 dBFS noise), so a room whose echo sits in the first partitions is learnt faster. The
gradient is constrained to ``block`` taps per partition (a linear, not circular, convolution).
Cost at 24 kHz: about 4 % of one core.

*Double talk.* Two filters (the "two-path" scheme): a background filter adapts on every block; a
foreground filter, which makes the output, never adapts on its own. The smoothed error energies of
both are compared each block: when the background clearly does better (``copy_ratio``), it is
copied into the foreground; when it does much worse (``reset_ratio``: near-end speech or noise
pushed it off), it is reset from the foreground. While the user talks the background error is
dominated by the user's voice, so nothing is copied: the foreground neither diverges nor learns to
cancel the user. After an echo-path change the background converges to the new path and wins.

*Buffering rule* (streaming invariance). Microphone samples are processed in whole blocks: each
``process`` call returns the samples of the blocks it completed (possibly none, possibly more than it
was given), so the concatenated output is always the first ``block * floor(total / block)`` samples
of the cancelled stream, whatever the call sizes -- the same as with fixed blocks, provided the far
samples a block needs were given before it completes (else they are late, and silence stands in).
Latency: less than one block (10.7 ms at 24 kHz). Without far-end signal within the tail the output
equals the input exactly.

Measured (tests/clients/test_echo_cancel.py, 24 kHz, speech-like far end, a 50-150 ms room at -6 dB
plus 20 ms bulk delay, noise 40 dB below the echo): ERLE 19 dB over 0.5-1 s, 25 dB over 1-1.5 s,
32 dB from 2.5 s on; through 3 s of double talk the local voice keeps correlation 0.9999 and its
level, and ERLE after it is 31 dB as before it; after an echo-path change, 14 dB over 0.5-1 s after
it, 22 dB over 1-1.5 s, 31 dB from 2 s on.

Limits. Linear echo only: a distorting laptop speaker leaves a residual, and there is no residual-echo
suppressor or comfort noise. The echo path must fit in ``tail_ms`` after the bulk delay. The two
devices' clocks must not drift apart by more than the tail over a conversation (one device, or a
shared clock, is the usual case). Adaptation needs far-end signal: the first second of a reply is
cancelled less well than the rest (about 12 dB over the first 1.2 s in the ``duplex talk`` test).
A user talking over the reply freezes what the output uses, but during a long double talk the
canceller cannot follow an echo path that changes at the same time.

``EchoLink`` connects the canceller to the sound devices: ``played`` is called from the speaker's
PortAudio callback (it appends the block and its DAC time to a bounded queue under a lock, nothing
else), ``cancel`` from the event loop with each microphone chunk and its ADC time; it takes the
queued blocks, resamples them to the canceller's rate and places them on the microphone's timeline:
the first (and the first after a drop) by its timestamp, ``(dac - adc of the first microphone
sample) * rate - margin``, the rest right after. The devices' timestamps must be on one clock
(PortAudio's stream time is, on the usual host APIs). The speaker's callback runs an output latency
ahead of its DAC time, so the reference is there before the microphone chunk that hears it.
"""

from __future__ import annotations

import math
import threading
from collections import deque

import numpy as np

from duplex.protocol.audio import StreamResampler

__all__ = ["EchoCanceller", "EchoLink"]


def default_block(rate: int) -> int:
    """The power of two closest to 10 ms at ``rate`` (256 at 24 kHz, 128 at 16 kHz)."""
    return 1 << max(round(math.log2(rate * 0.01)), 4)


class EchoCanceller:
    """A sans-IO acoustic echo canceller (see the module docstring).

    ``rate``: samples per second of both signals. ``block``: samples per processing block (default
    about 10 ms, a power of two). ``tail_ms``: echo path length the filter covers after ``delay``.
    ``delay``: where the first far sample lands on the near timeline, in samples. ``step``: NLMS step
    (0 < step < 2; smaller is slower and steadier). ``max_ahead_ms``: far audio kept ahead of the
    microphone. ``copy_ratio`` / ``reset_ratio``: the two-path decisions on the background-to-
    foreground error energy ratio. ``smoothing``: the error energies' per-block forgetting factor.
    """

    def __init__(
        self,
        rate: int,
        *,
        block: int | None = None,
        tail_ms: float = 250.0,
        delay: int = 0,
        step: float = 1.0,
        max_ahead_ms: float = 2000.0,
        copy_ratio: float = 0.7,
        reset_ratio: float = 4.0,
        smoothing: float = 0.8,
        floor_rms: float = 1e-3,
        proportion: float = 0.0,
    ) -> None:
        if rate <= 0 or not 0 < step < 2 or tail_ms <= 0:
            raise ValueError(f"echo canceller: bad settings (rate {rate}, step {step}, tail {tail_ms} ms)")
        self.rate = rate
        self.block = n = block or default_block(rate)
        self.partitions = p = max(math.ceil(tail_ms * rate / 1000 / n), 1)
        self.step = step
        self.proportion = proportion
        self.copy_ratio = copy_ratio
        self.reset_ratio = reset_ratio
        self.smoothing = smoothing
        self.max_ahead = round(max_ahead_ms * rate / 1000)
        bins = n + 1
        self._x = np.zeros((p, bins), np.complex128)  # far spectra, newest first
        self._x_power = np.zeros((p, bins))
        self._fore = np.zeros((p, bins), np.complex128)
        self._back = np.zeros((p, bins), np.complex128)
        self._floor = p * 2 * n * floor_rms**2  # regularizes the per-bin normalization
        self._e_fore = 0.0
        self._e_back = 0.0
        self._far_prev = np.zeros(n, np.float32)
        self._far = np.zeros(0, np.float32)  # far samples for near positions _far_base ...
        self._far_base = delay
        self._far_next = delay
        self._near = np.zeros(0, np.float32)  # near samples not yet in a whole block
        self.processed = 0  # near samples processed (the position of the next block)
        self.late_samples = 0
        self.dropped_samples = 0
        self.copies = 0  # background -> foreground
        self.resets = 0  # foreground -> background

    # -- the far end -------------------------------------------------------------------------

    @property
    def far_end(self) -> int:
        """The near position right after the last far sample given (late or dropped ones too):
        where ``playback(far)`` without ``at`` puts the next one."""
        return self._far_next

    def playback(self, far: np.ndarray, at: int | None = None) -> None:
        """What the speaker played (mono float32), heard from near position ``at`` on (None: right
        after the previous far samples)."""
        far = np.asarray(far, np.float32).ravel()
        start = self._far_next if at is None else at
        self._far_next = start + len(far)
        if start < self.processed:  # its first samples are due where the microphone already was
            late = min(self.processed - start, len(far))
            self.late_samples += late
            far, start = far[late:], start + late
        if not len(far):
            return
        held_end = self._far_base + len(self._far)
        if not len(self._far):
            self._far, self._far_base = far.copy(), start
        elif start >= held_end:
            gap = np.zeros(start - held_end, np.float32)
            self._far = np.concatenate([self._far, gap, far])
        else:
            keep = max(start - self._far_base, 0)
            self._far = np.concatenate([self._far[:keep], far])
            self._far_base = min(self._far_base, start)
        ahead = self._far_base + len(self._far) - max(self.processed, self._far_base) - self.max_ahead
        if ahead > 0:
            drop = min(ahead, len(self._far))
            self.dropped_samples += drop
            self._far, self._far_base = self._far[drop:], self._far_base + drop

    def _far_block(self, start: int) -> np.ndarray:
        """The far samples for near positions ``start .. start + block`` (silence where none), and
        everything before them forgotten."""
        n = self.block
        out = np.zeros(n, np.float32)
        lo, hi = max(start, self._far_base), min(start + n, self._far_base + len(self._far))
        if hi > lo:
            out[lo - start : hi - start] = self._far[lo - self._far_base : hi - self._far_base]
        cut = min(max(start + n - self._far_base, 0), len(self._far))
        self._far, self._far_base = self._far[cut:], self._far_base + cut
        if not len(self._far):
            self._far_base = max(self._far_base, start + n)
        return out

    # -- the near end ------------------------------------------------------------------------

    def process(self, near: np.ndarray) -> np.ndarray:
        """The microphone (mono float32) in; the echo-cancelled samples of every block completed
        now out (see the buffering rule in the module docstring)."""
        near = np.asarray(near, np.float32).ravel()
        pending = np.concatenate([self._near, near]) if len(self._near) else near
        n = self.block
        whole = len(pending) // n * n
        out = [self._run(pending[i : i + n]) for i in range(0, whole, n)]
        self._near = pending[whole:].copy()
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def _run(self, near: np.ndarray) -> np.ndarray:
        n = self.block
        far = self._far_block(self.processed)
        self.processed += n
        frame = np.concatenate([self._far_prev, far])
        self._far_prev = far
        self._x[1:] = self._x[:-1]
        self._x_power[1:] = self._x_power[:-1]
        x = self._x[0] = np.fft.rfft(frame)
        self._x_power[0] = x.real**2 + x.imag**2
        if not far.any() and not self._x_power.any():
            return near.copy()  # nothing played within the tail: nothing to cancel or learn
        e_fore = near - np.fft.irfft((self._fore * self._x).sum(axis=0), 2 * n)[n:]
        e_back = near - np.fft.irfft((self._back * self._x).sum(axis=0), 2 * n)[n:]
        self._adapt(e_back)
        a = self.smoothing
        self._e_fore = a * self._e_fore + (1 - a) * float(np.dot(e_fore, e_fore))
        self._e_back = a * self._e_back + (1 - a) * float(np.dot(e_back, e_back))
        if self._e_back < self.copy_ratio * self._e_fore:
            self._fore[:] = self._back
            self._e_fore = self._e_back
            self.copies += 1
            e_fore = e_back
        elif self._e_back > self.reset_ratio * self._e_fore:
            self._back[:] = self._fore
            self._e_back = self._e_fore
            self.resets += 1
        return e_fore.astype(np.float32)

    def _adapt(self, error: np.ndarray) -> None:
        """One NLMS step of the background filter, constrained to ``block`` taps per partition."""
        n = self.block
        spectrum = np.fft.rfft(np.concatenate([np.zeros(n, error.dtype), error]))
        # Proportionate (IPNLMS): partitions that already hold more of the echo path take larger
        # steps; with an empty filter every partition gets 1/P, which is plain NLMS.
        size = np.sqrt((self._back.real**2 + self._back.imag**2).sum(axis=1))
        p = self.partitions
        share = (1 - self.proportion) / (2 * p) + (1 + self.proportion) * size / (2 * size.sum() + 1e-12)
        norm = self.step / ((share[:, None] * self._x_power).sum(axis=0) + self._floor / p)
        gradient = np.fft.irfft(share[:, None] * np.conj(self._x) * (spectrum * norm), 2 * n, axis=1)
        gradient[:, n:] = 0.0
        self._back += np.fft.rfft(gradient, axis=1)


class EchoLink:
    """The speaker's played audio carried to the microphone's canceller (see the module docstring).

    ``rate``: the canceller's rate (the microphone's output rate). ``margin_ms``: how much earlier
    than the timestamps say the reference is placed (resampler and timestamp error; the filter
    covers it). ``max_pending_ms``: played audio kept for a microphone that is not read; beyond it
    the oldest is dropped (``dropped_blocks``) and the reference is placed anew by its timestamp.
    """

    def __init__(
        self,
        rate: int,
        *,
        tail_ms: float = 250.0,
        margin_ms: float = 10.0,
        max_pending_ms: float = 1000.0,
        canceller: EchoCanceller | None = None,
    ) -> None:
        self.rate = rate
        self.canceller = canceller or EchoCanceller(rate, tail_ms=tail_ms)
        self.margin = round(margin_ms * rate / 1000)
        self.max_pending_ms = max_pending_ms
        self.dropped_blocks = 0
        self._lock = threading.Lock()
        self._pending: deque[tuple[np.ndarray, float]] = deque()
        self._pending_max = 1
        self._resync = True  # place the next reference block by its timestamp
        self._output_rate = 0
        self._resampler: StreamResampler | None = None
        self._near_start: float | None = None  # the first microphone sample's ADC time
        self._place_at: int | None = None  # where the next reference samples go (None: contiguous)

    def open_output(self, device_rate: int, block: int) -> None:
        """The speaker's rate and callback block, once known (before its stream starts)."""
        self._output_rate = device_rate
        self._pending_max = max(math.ceil(self.max_pending_ms * device_rate / 1000 / max(block, 1)), 1)
        if device_rate != self.rate:
            self._resampler = StreamResampler(device_rate, self.rate, quality="LQ")

    # -- PortAudio's thread ----------------------------------------------------------------

    def played(self, block: np.ndarray, dac_time: float) -> None:
        """The speaker's callback played ``block`` (a copy, mono float32) from ``dac_time`` on.
        Cheap and never waits on the loop: an append under a lock."""
        with self._lock:
            if len(self._pending) >= self._pending_max:
                self._pending.popleft()
                self.dropped_blocks += 1
                self._resync = True
            self._pending.append((block, dac_time))

    # -- the loop's side -------------------------------------------------------------------

    def cancel(self, near: np.ndarray, adc_time: float) -> np.ndarray:
        """``near`` (microphone samples at ``rate``, the chunk whose first input sample was captured
        at ``adc_time``) with the echo removed; see ``EchoCanceller.process`` for the lengths."""
        if self._near_start is None:
            self._near_start = adc_time
        with self._lock:
            pending, self._pending = self._pending, deque()
            resync, self._resync = self._resync, False
        for block, dac_time in pending:
            if resync:  # a fresh reference stream, placed by its first block's timestamp
                resync = False
                self._place_at = round((dac_time - self._near_start) * self.rate) - self.margin
                if self._resampler is not None:
                    self._resampler = StreamResampler(self._output_rate, self.rate, quality="LQ")
            far = self._resampler.process(block) if self._resampler is not None else block
            if len(far):  # (a resampler may hold the first samples back: they keep the place)
                self.canceller.playback(far, self._place_at)
                self._place_at = None
        return self.canceller.process(near)
