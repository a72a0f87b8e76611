"""The latency suite (``duplex bench latency``): how long a listener waits, measured from the client.

Each figure is measured ``repeats`` times (a fresh session each time) and reported with p50 / p95 /
p99 (``bench.report.percentile``: linear), mean, max, the raw samples, the misses, and a
``measurement_origin`` that says exactly which two client-side moments it spans. All times are one
monotonic clock.

* ``eos_to_first_audio_ms`` (end of user speech -> first audio): an utterance (Piper speech, or
  a tone burst) is streamed in real time, then silence. Origin: the send completion of the append
  that carries the last voiced input sample; end: receipt of the first audio packet of the
  session. The turn lane follows the session: server VAD and model-native sessions need nothing
  more; a session without either gets ``input_audio_buffer.commit`` + ``response.create`` right
  after the speech, and the origin is the commit's send. A full-duplex model may start talking
  before the user stops: such a sample is negative, clipped to 0 in the percentiles (as
  Full-Duplex-Bench does) and counted in ``overlapped``.
* ``barge_in_to_cancelled_ms`` and ``barge_in_to_last_audio_ms``: while the answer plays
  (``barge_after_ms`` after its first audio packet), the client sends ``barge_in`` (or
  ``response.cancel`` when the model does not advertise ``supports_barge_in``). Origin: that send;
  ends: ``response.done{status: cancelled}`` of that response, and the last audio packet of that
  response (0 when none arrived after the origin).
* ``resume_round_trip_ms`` (only with ``supports_session_resume``): origin: the client drops its
  socket; end: ``session.resumed`` received. It includes the new TCP + WebSocket handshake and
  the journal replay; the client's reconnect backoff is set to 1 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from bench.report import format_cell, percentile
from bench.speech import last_voiced_sample, utterance
from clients import ClientError, DuplexClient, create_duplex_session_config, event_type
from duplex.protocol.audio import encode_audio, read_wav, resample

__all__ = ["ORIGINS", "LatencyConfig", "figure", "run_latency"]

ORIGINS = {
    "eos_to_first_audio_ms": (
        "client send completion of the append carrying the last voiced input sample (or of the commit, "
        "for a session with neither server VAD nor model-native turns) -> receipt of the session's first "
        "audio packet; negative samples (model spoke first) clipped to 0 in the percentiles"
    ),
    "barge_in_to_cancelled_ms": (
        "client send of barge_in (response.cancel without supports_barge_in) -> receipt of that "
        "response's response.done{status: cancelled}"
    ),
    "barge_in_to_last_audio_ms": (
        "client send of barge_in (response.cancel without supports_barge_in) -> receipt of that "
        "response's last audio packet (0 when none arrived after the send)"
    ),
    "resume_round_trip_ms": (
        "client drops its socket -> receipt of session.resumed (new TCP + WebSocket handshake, "
        "session.resume, journal replay; reconnect backoff 1 ms)"
    ),
}


@dataclass(frozen=True)
class LatencyConfig:
    url: str
    model: str | None = None
    api_key: str | None = None
    msgpack: bool = False
    repeats: int = 5
    input_wav: str | None = None
    text: str = "What time is it in Paris?"
    chunk_ms: int | None = None
    silence_s: float = 3.0
    answer_timeout_s: float = 15.0
    barge_after_ms: float = 300.0
    scenarios: tuple[str, ...] = ("eos", "barge_in", "resume")
    preset: str | None = None  # a clients.presets name: open sessions with that config


def figure(name: str, samples: list[float], missed: int = 0, *, clip: bool = False,
           notes: dict[str, Any] | None = None) -> dict[str, Any]:
    """A reported figure: percentiles of ``samples`` (clipped at 0 when ``clip``), with its origin."""
    xs = sorted(max(0.0, s) if clip else float(s) for s in samples)
    stats: dict[str, Any] = {"count": len(xs), "missed": missed}
    stats.update(p50=percentile(xs, 50), p95=percentile(xs, 95), p99=percentile(xs, 99),
                 mean=math.fsum(xs) / len(xs) if xs else None, max=xs[-1] if xs else None)
    return {**stats, "samples": [round(s, 3) for s in samples], "measurement_origin": ORIGINS[name],
            **(notes or {})}


class _Probe:
    """One session's events with receipt times (a listener; never blocks)."""

    def __init__(self, client: DuplexClient, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.events: list[tuple[float, str, Any]] = []
        self.changed = asyncio.Event()
        client.add_listener(self._on)

    def _on(self, ev: Any) -> None:
        self.events.append((self.clock(), event_type(ev), ev))
        self.changed.set()

    async def until(self, pred: Callable[[], Any], timeout_s: float, poll_s: float = 0.01) -> Any:
        """Wait (up to ``timeout_s``) until ``pred()`` is truthy; returns it, or None on timeout.

        Re-checks on every event and at least every ``poll_s`` (a predicate may depend on the
        sender's progress, not only on events).
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while not (value := pred()):
                    self.changed.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(poll_s):
                            await self.changed.wait()
                return value
        return None

    def first_audio(self, after: float = float("-inf")) -> tuple[float, str] | None:
        for t, kind, ev in self.events:
            if kind == "response.output_audio.delta" and t >= after:
                return t, ev.response_id
        return None


def _lane(client: DuplexClient) -> str:
    caps = client.capabilities
    audio = getattr(client.session, "audio", None)
    td = getattr(getattr(audio, "input", None), "turn_detection", None)
    kind = getattr(getattr(type(td), "__struct_config__", None), "tag", None) or getattr(td, "type", None)
    if kind in ("server_vad", "semantic_vad"):
        return "server_vad"
    if getattr(caps, "supports_model_native_turn_policy", False):
        return "native"
    return "client"


class _Streamer:
    """Sends ``data`` in ``step``-byte appends on an absolute real-time schedule; records send ends."""

    def __init__(self, client: DuplexClient, data: bytes, step: int, period_s: float,
                 clock: Callable[[], float]) -> None:
        self.client, self.data, self.step, self.period_s, self.clock = client, data, step, period_s, clock
        self.sent_at: list[float] = []
        self.started: float | None = None

    async def run(self) -> None:
        start = self.clock()
        self.started = start
        for i, off in enumerate(range(0, len(self.data), self.step)):
            delay = start + i * self.period_s - self.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.client.ended:
                return
            await self.client.append_audio(self.data[off : off + self.step])
            self.sent_at.append(self.clock())


async def _open(cfg: LatencyConfig, clock: Callable[[], float], **kw: Any) -> DuplexClient:
    session = create_duplex_session_config(cfg.preset).session if cfg.preset else None
    client = DuplexClient(cfg.url, model=cfg.model, api_key=cfg.api_key, msgpack=cfg.msgpack, clock=clock,
                          session=session, **kw)
    await client.open()
    return client


def _input(cfg: LatencyConfig) -> tuple[np.ndarray, int, str]:
    if cfg.input_wav:
        pcm, rate = read_wav(cfg.input_wav)
        return pcm, rate, "wav"
    return utterance(cfg.text)


async def _one_turn(cfg: LatencyConfig, speech: tuple[np.ndarray, int], clock: Callable[[], float],
                    barge: bool) -> dict[str, Any]:
    """Stream one utterance into a fresh session; measure eos -> first audio, and optionally barge in."""
    pcm, rate = speech
    client = await _open(cfg, clock, resume=False)
    probe = _Probe(client, clock)
    try:
        fmt = client.input_format
        voice = resample(pcm, rate, fmt.rate) if rate != fmt.rate else pcm
        silence = np.zeros(int(cfg.silence_s * fmt.rate), np.float32)
        data = encode_audio(np.concatenate([voice, silence]), fmt)
        period_ms = cfg.chunk_ms or getattr(client.capabilities, "chunk_period_ms", 0) or 100
        width = fmt.bytes_per_sample or 2
        step = fmt.rate * period_ms // 1000 * width
        last_chunk = max(0, (last_voiced_sample(voice) * width - 1) // step)
        lane = _lane(client)
        streamer = _Streamer(client, data, step, period_ms / 1000.0, clock)
        out: dict[str, Any] = {"lane": lane}
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(streamer.run())
            await probe.until(lambda: len(streamer.sent_at) > last_chunk, cfg.silence_s + 60.0)
            origin = streamer.sent_at[last_chunk]
            if lane == "client":
                await client.commit()
                await client.create_response()
                origin = clock()
            assert streamer.started is not None
            first = await probe.until(lambda: probe.first_audio(streamer.started), cfg.answer_timeout_s)
            out["eos_ms"] = None if first is None else (first[0] - origin) * 1000.0
            if barge and first is not None:
                out.update(await _barge(cfg, client, probe, first, clock))
            task.cancel()
        return out
    finally:
        with contextlib.suppress(Exception):
            await client.close(timeout=5.0)


async def _barge(cfg: LatencyConfig, client: DuplexClient, probe: _Probe, first: tuple[float, str],
                 clock: Callable[[], float]) -> dict[str, Any]:
    t_first, rid = first
    await asyncio.sleep(max(0.0, t_first + cfg.barge_after_ms / 1000.0 - clock()))

    def done() -> tuple[float, str] | None:
        for t, kind, ev in probe.events:
            if kind == "response.done" and ev.response.id == rid:
                return t, str(ev.response.status)
        return None

    if done() is not None:
        return {"barge_missed": "the response ended before the barge-in"}
    origin = clock()
    if getattr(client.capabilities, "supports_barge_in", False):
        await client.barge_in(rid)
    else:
        await client.cancel_response(rid)
    end = await probe.until(done, cfg.answer_timeout_s)
    if end is None or end[1] != "cancelled":
        return {"barge_missed": f"response.done status {end[1] if end else 'not received'}"}
    last = max((t for t, kind, ev in probe.events
                if kind == "response.output_audio.delta" and ev.response_id == rid), default=origin)
    return {"cancel_ms": (end[0] - origin) * 1000.0, "last_audio_ms": max(0.0, last - origin) * 1000.0}


async def _resume(cfg: LatencyConfig, clock: Callable[[], float]) -> tuple[list[float], int, str | None]:
    client = await _open(cfg, clock, resume=True, backoff_initial_s=0.001, backoff_max_s=0.002)
    probe = _Probe(client, clock)
    samples: list[float] = []
    missed = 0
    try:
        if not getattr(client.capabilities, "supports_session_resume", False):
            return [], 0, "the session does not advertise supports_session_resume"
        for _ in range(cfg.repeats):
            seen = len(probe.events)
            origin = clock()
            await client.kill_transport()
            hit = await probe.until(
                lambda s=seen: next((t for t, k, _ in probe.events[s:] if k == "session.resumed"), None),
                10.0)
            if hit is None:
                missed += 1
                if client.ended:
                    break
            else:
                samples.append((hit - origin) * 1000.0)
        return samples, missed, None
    finally:
        with contextlib.suppress(Exception):
            await client.close(timeout=5.0)


async def run_latency(cfg: LatencyConfig, *, progress: TextIO | None = sys.stderr,
                      clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Run the suite (module docstring); returns the report (``figures`` plus context)."""
    pcm, rate, source = _input(cfg)
    figures: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    lanes: set[str] = set()
    eos: list[float] = []
    cancel: list[float] = []
    last: list[float] = []
    eos_missed = barge_missed = 0
    barge_notes: list[str] = []
    if "eos" in cfg.scenarios or "barge_in" in cfg.scenarios:
        for i in range(cfg.repeats):
            try:
                r = await _one_turn(cfg, (pcm, rate), clock, barge="barge_in" in cfg.scenarios)
            except ClientError as exc:
                raise RuntimeError(f"cannot open a session: {exc.code}: {exc.message}") from exc
            lanes.add(r["lane"])
            if r["eos_ms"] is None:
                eos_missed += 1
            else:
                eos.append(r["eos_ms"])
            if "cancel_ms" in r:
                cancel.append(r["cancel_ms"])
                last.append(r["last_audio_ms"])
            elif "barge_in" in cfg.scenarios:
                barge_missed += 1
                barge_notes.append(r.get("barge_missed", "no answer to interrupt"))
            _say(progress, f"latency [{i + 1}/{cfg.repeats}] eos->audio "
                           f"{format_cell(r['eos_ms'], '.0f')} ms, barge-in->cancelled "
                           f"{format_cell(r.get('cancel_ms'), '.0f')} ms")
    if "eos" in cfg.scenarios:
        figures["eos_to_first_audio_ms"] = figure("eos_to_first_audio_ms", eos, eos_missed, clip=True,
                                                  notes={"overlapped": sum(1 for x in eos if x < 0)})
    if "barge_in" in cfg.scenarios:
        notes = {"missed_reasons": sorted(set(barge_notes))}
        figures["barge_in_to_cancelled_ms"] = figure("barge_in_to_cancelled_ms", cancel, barge_missed,
                                                     notes=notes)
        figures["barge_in_to_last_audio_ms"] = figure("barge_in_to_last_audio_ms", last, barge_missed)
    if "resume" in cfg.scenarios:
        samples, missed, why = await _resume(cfg, clock)
        if why is None:
            figures["resume_round_trip_ms"] = figure("resume_round_trip_ms", samples, missed)
        else:
            skipped["resume_round_trip_ms"] = why
    return {"input": {"source": source, "text": cfg.text if source == "piper" else None,
                      "seconds": len(pcm) / rate},
            "lanes": sorted(lanes), "repeats": cfg.repeats, "figures": figures, "skipped": skipped}


def _say(stream: TextIO | None, line: str) -> None:
    if stream is not None:
        print(line, file=stream, flush=True)
