"""The paced multi-session load driver (``duplex bench load``).

Theory of operation
-------------------
1. **Admission.** ``sessions`` clients open concurrently (``RecordingClient``, no resume). A
   refused one stays in the report as a failed row with its error code: it is never dropped from
   the denominator. With ``queue`` the clients ask to wait for a slot (``?queue=1``): past the
   server's ``max_sessions`` a client waits in the server's queue (``session.queued``) and its
   queue wait (first ``session.queued`` to ``session.created``) is reported.
2. **Shared start.** Every session admitted at once starts streaming at one instant
   (``start_delay_s`` after every client was admitted, refused or queued), so the server sees N
   real-time streams at once. A session admitted from the queue starts ``start_delay_s`` after its
   own admission (a slot freed: an earlier session ended).
3. **Paced input.** Each session sends its input frames (``frame_ms``: 80 ms frames or 1 s units)
   from the WAV, at most ``max_frames``, never looped, on a fixed grid ``t0 + i * period``. A
   sleep overshoot does not accumulate. When a send completes more than one frame past its next
   slot, the grid restarts one period after that completion: no catch-up burst is sent. The
   planned times keep the original grid, so the lateness stays visible in the report.
4. **Fixed drain.** After its last send each session listens for ``drain_s`` more; packets after
   that are not counted. Then it closes (``cleanup_timeout_s``).
5. **Validation and metrics.** Every raw frame is validated (``bench.recording``); the figures are
   ``bench.load_metrics``. A session fails on a server ``error``, an invalid packet or frame, no
   audio (unless ``require_audio`` is off), audio before input, a response id shared with another
   session, a frame deficit over ``max_frame_deficit`` (when set), a premature end, or a failed
   cleanup. ``ok`` is true only when every requested session passed.

The result (``LoadResult.to_json()``) holds no audio and no credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np

from bench.load_metrics import DEFINITIONS, Send, pooled_metrics, response_intervals_ms, session_metrics
from bench.progress import Progress
from bench.recording import FrameRecorder, RecordingClient
from clients import ClientError, create_duplex_session_config
from duplex.protocol import AudioFormat, DuplexInputAudioBufferAppend
from duplex.protocol.audio import encode_audio, read_wav, resample

__all__ = ["LoadConfig", "LoadResult", "PacingGrid", "redact_url", "run_load", "synthetic_input"]

SCHEMA_VERSION = 1
_SECRET_PARAMS = frozenset({"api_key", "key", "token", "resume_token", "authorization"})


@dataclass(frozen=True)
class LoadConfig:
    """Everything a load run needs; limits carry their unit in the name."""

    url: str
    sessions: int = 1
    input_wav: str | None = None
    frame_ms: int | None = None  # None: the session's chunk_period_ms, else 80
    max_frames: int = 1000
    drain_s: float = 2.0
    start_delay_s: float = 0.25
    open_timeout_s: float = 20.0
    cleanup_timeout_s: float = 5.0
    model: str | None = None
    api_key: str | None = None
    msgpack: bool = False
    underrun_threshold_s: float = 0.1
    max_frame_deficit: int | None = None
    require_audio: bool = True
    synthetic_s: float = 10.0  # input length when no WAV is given
    preset: str | None = None  # a clients.presets name: open sessions with that config
    queue: bool = False  # wait for a slot past the server's max_sessions (``?queue=1``)


@dataclass
class _Session:
    index: int
    client: RecordingClient | None = None
    admitted: bool = False
    admitted_at: float | None = None
    queue_wait_s: float | None = None  # first session.queued to session.created (queued sessions)
    queue_position: int | None = None  # the position of the first session.queued
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # admitted, refused or queued
    reject_code: str | None = None
    reject_message: str | None = None
    sends: list[Send] = field(default_factory=list)
    drain_end: float | None = None
    ended_early: bool = False
    cleanup_ok: bool = True


@dataclass
class LoadResult:
    """The run: ``ok``, per-session rows and pooled figures; ``to_json()`` is the report file."""

    config: LoadConfig
    input_info: dict[str, Any]
    frame_period_s: float
    sessions: list[dict[str, Any]]
    pooled: dict[str, Any]
    shared_response_ids: list[str]
    ok: bool

    def to_json(self) -> dict[str, Any]:
        c = self.config
        return {
            "schema_version": SCHEMA_VERSION,
            "mode": "paced_multi_session",
            "url": redact_url(c.url),
            "requested_sessions": c.sessions,
            "passed_sessions": self.pooled["passed_sessions"],
            "ok": self.ok,
            "input": self.input_info,
            "frame_period_s": self.frame_period_s,
            "drain_s": c.drain_s,
            "cleanup_timeout_s": c.cleanup_timeout_s,
            "acceptance": {
                "max_frame_deficit": c.max_frame_deficit,
                "require_audio": c.require_audio,
                "underrun_threshold_s": c.underrun_threshold_s,
                "pacing_warning_lateness_p99_ms": self.frame_period_s * 1000.0,
            },
            "pooled": self.pooled,
            "shared_response_ids": self.shared_response_ids,
            "sessions": self.sessions,
            **DEFINITIONS,
        }


def redact_url(url: str) -> str:
    """``url`` with the values of credential-like query parameters replaced by ``***``."""
    parts = urlsplit(url)
    query = [(k, "***" if k.lower() in _SECRET_PARAMS else v) for k, v in parse_qsl(parts.query)]
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), parts.fragment))


def synthetic_input(seconds: float, rate: int) -> np.ndarray:
    """A deterministic speech-like test signal: 1 s tone bursts (220-440 Hz) with 0.5 s pauses."""
    t = np.arange(int(seconds * rate)) / rate
    phase = t % 1.5
    freq = 220.0 + 220.0 * ((t // 1.5) % 4) / 4
    tone = 0.3 * np.sin(2 * np.pi * freq * t) * (phase < 1.0)
    return tone.astype(np.float32)


def _load_input(cfg: LoadConfig) -> tuple[np.ndarray, int, dict[str, Any]]:
    if cfg.input_wav is None:
        rate = 24000
        pcm = synthetic_input(cfg.synthetic_s, rate)
        info = {"path": None, "sha256": None, "synthetic": "tone bursts", "seconds": cfg.synthetic_s}
        return pcm, rate, info
    data = Path(cfg.input_wav).read_bytes()
    pcm, rate = read_wav(data)
    digest = hashlib.sha256(data).hexdigest()
    # The file name and digest identify the input without writing a local path into the report.
    info = {"path": Path(cfg.input_wav).name, "sha256": digest, "seconds": len(pcm) / rate}
    return pcm, rate, info


def _frames(pcm: np.ndarray, fmt: AudioFormat, frame_s: float, max_frames: int) -> list[bytes]:
    """The input cut into whole frames in the session's format (the last one zero-padded)."""
    n = round(fmt.rate * frame_s)
    count = min(max_frames, -(-len(pcm) // n))
    padded = np.zeros(count * n, dtype=np.float32)
    padded[: min(len(pcm), count * n)] = pcm[: count * n]
    return [encode_audio(padded[i * n : (i + 1) * n], fmt) for i in range(count)]


async def _admit(cfg: LoadConfig, s: _Session, clock: Callable[[], float]) -> None:
    session = create_duplex_session_config(cfg.preset).session if cfg.preset else None

    def queued(event: Any) -> None:
        if s.queue_position is None:
            s.queue_position = event.position
        s.settled.set()

    client = RecordingClient(
        cfg.url, model=cfg.model, api_key=cfg.api_key, msgpack=cfg.msgpack, resume=False,
        open_timeout_s=cfg.open_timeout_s, clock=clock, session=session, queue=cfg.queue, on_queued=queued,
    )
    try:
        await client.open()  # the client's open timeout starts over with each session.queued
    except (ClientError, TimeoutError, OSError) as exc:
        s.reject_code = getattr(exc, "code", type(exc).__name__)
        s.reject_message = getattr(exc, "message", None) or "admission timed out"
        return  # a refused client holds no socket (the handshake closes it)
    finally:
        s.settled.set()
    out = client.output_format or AudioFormat("pcm16", 24000)
    client.recorder.output_rate = out.rate
    client.recorder.bytes_per_sample = out.bytes_per_sample or 2
    s.client, s.admitted, s.admitted_at = client, True, clock()
    if client.queued_at is not None:
        s.queue_wait_s = s.admitted_at - client.queued_at


@dataclass
class PacingGrid:
    """The fixed send grid of one session (module docstring, step 3). Sans-IO: times are given.

    ``slot(i)`` is when frame ``i`` is due now; ``planned(i)`` its slot on the original grid (for
    lateness); ``sent(i, completed)`` restarts the grid one period after ``completed`` when that
    send ended more than one frame past the next slot, so a stall is never followed by a burst.
    """

    t0: float
    period: float
    epoch: float | None = None

    def slot(self, i: int) -> float:
        return (self.t0 if self.epoch is None else self.epoch) + i * self.period

    def planned(self, i: int) -> float:
        return self.t0 + i * self.period

    def sent(self, i: int, completed: float) -> None:
        if completed > self.slot(i + 2):  # more than one frame past the next slot
            self.epoch = completed + self.period - (i + 1) * self.period


async def _stream(s: _Session, frames: list[bytes], t0: float, period: float,
                  drain_s: float, clock: Callable[[], float]) -> None:
    client = s.client
    assert client is not None
    grid = PacingGrid(t0, period)
    for i, chunk in enumerate(frames):
        delay = grid.slot(i) - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        if client.ended:
            s.ended_early = True
            break
        started = clock()
        try:
            await client.send(DuplexInputAudioBufferAppend(audio=chunk))
        except (ConnectionError, ClientError):
            s.ended_early = True
            break
        completed = clock()
        s.sends.append(Send(grid.planned(i), started, completed))
        grid.sent(i, completed)
    last = s.sends[-1].completed if s.sends else clock()
    s.drain_end = last + drain_s
    await asyncio.sleep(max(0.0, s.drain_end - clock()))


async def _cleanup(s: _Session, timeout_s: float) -> None:
    client = s.client
    if client is None:
        return
    if client.ended and not s.ended_early and s.drain_end is not None:
        s.ended_early = True
    try:
        async with asyncio.timeout(timeout_s * 2):
            await client.close(timeout=timeout_s)
    except TimeoutError:
        s.cleanup_ok = False


def _row(s: _Session, cfg: LoadConfig, period: float) -> dict[str, Any]:
    wait_ms = None if s.queue_wait_s is None else round(s.queue_wait_s * 1000, 3)
    row: dict[str, Any] = {"index": s.index, "admitted": s.admitted, "ok": False, "session_id": None,
                           "failure": None, "metrics": None, "queue_position": s.queue_position,
                           "queue_wait_ms": wait_ms}
    if not s.admitted:
        row.update(failure="admission", reject_code=s.reject_code, reject_message=s.reject_message)
        return row
    client = s.client
    assert client is not None
    rec: FrameRecorder = client.recorder
    cut = s.drain_end if s.drain_end is not None else float("inf")
    packets = [p for p in rec.packets if p.t <= cut]
    texts = [t for t in rec.text_times if t <= cut]
    m = session_metrics(s.sends, packets, output_rate=rec.output_rate, frame_period_s=period,
                        text_times=texts, threshold_s=cfg.underrun_threshold_s)
    start = s.sends[0].started if s.sends else 0.0
    row.update(
        session_id=client.session_id,
        output_rate=rec.output_rate,
        metrics=m,
        protocol_errors=[{"code": e["code"], "message": e["message"]} for e in rec.errors],
        invalid_frames=[{"event_index": f["event_index"], "code": f["code"]} for f in rec.invalid_frames],
        late_packets=sum(1 for p in rec.packets if p.t > cut),
        input_timeline=[
            [round(x.planned - start, 5), round(x.started - start, 5), round(x.completed - start, 5)]
            for x in s.sends
        ],
        audio_packet_timeline=_timeline(packets, start),
        event_counts=dict(sorted(rec.types.items())),
    )
    row["failure"] = _failure(s, m, row, cfg)
    row["ok"] = row["failure"] is None
    return row


def _failure(s: _Session, m: dict[str, Any], row: dict[str, Any], cfg: LoadConfig) -> str | None:
    """The first failed acceptance check, by name (``None`` when the session passed)."""
    first = m["first_audio_after_stream_start_ms"]
    checks = [
        ("protocol_error", bool(row["protocol_errors"])),
        ("invalid_audio_packet", bool(m["invalid_audio_packets"])),
        ("invalid_event", bool(row["invalid_frames"])),
        ("session_ended", s.ended_early),
        ("audio_before_input", first is not None and first < 0),
        ("no_audio", cfg.require_audio and m["audio_packets"] == 0),
        ("frame_deficit", cfg.max_frame_deficit is not None and m["frame_deficit"] is not None
         and not 0 <= m["frame_deficit"] <= cfg.max_frame_deficit),
        ("cleanup", not s.cleanup_ok),
    ]
    return next((name for name, failed in checks if failed), None)


async def run_load(
    cfg: LoadConfig, *, progress: TextIO | None = sys.stderr, clock: Callable[[], float] = time.perf_counter
) -> LoadResult:
    """Run one load test (module docstring); never raises for a server-side failure (see ``ok``)."""
    if not 1 <= cfg.sessions <= 4096:
        raise ValueError("sessions must be in [1, 4096]")
    pcm, in_rate, info = _load_input(cfg)
    sessions = [_Session(i) for i in range(cfg.sessions)]
    info["frames"] = 0
    meter = Progress("load", total=1.0, stream=progress)
    shared: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    cut: dict[str, Any] = {}  # the input frames and their period, from the first admitted session

    def plan(client: RecordingClient) -> tuple[list[bytes], float]:
        if not cut:
            caps = client.capabilities
            period = (cfg.frame_ms or getattr(caps, "chunk_period_ms", 0) or 80) / 1000.0
            fmt = client.input_format
            frames = _frames(resample(pcm, in_rate, fmt.rate) if in_rate != fmt.rate else pcm,
                             fmt, period, cfg.max_frames)
            cut.update(frames=frames, period=period)
            info["frames"] = len(frames)
            meter.total = len(frames) * period + cfg.drain_s
        return cut["frames"], cut["period"]

    async def settle() -> None:
        for s in sessions:
            await s.settled.wait()
        shared.set_result(clock() + cfg.start_delay_s)

    async def one(s: _Session) -> None:
        await _admit(cfg, s, clock)
        if s.client is None:
            return
        frames, period = plan(s.client)
        assert s.admitted_at is not None
        t0 = max(await shared, s.admitted_at + cfg.start_delay_s)
        await _stream(s, frames, t0, period, cfg.drain_s, clock)
        await _cleanup(s, cfg.cleanup_timeout_s)

    def status() -> str:
        admitted = [s for s in sessions if s.client is not None]
        packets = sum(len(s.client.recorder.packets) for s in admitted)  # type: ignore[union-attr]
        errors = sum(len(s.client.recorder.errors) for s in admitted)  # type: ignore[union-attr]
        return f"{len(admitted)}/{cfg.sessions} sessions  {packets} packets  {errors} errors"

    def elapsed() -> float:
        return max(0.0, clock() - shared.result()) if shared.done() else 0.0

    try:
        async with meter.running(elapsed, status), asyncio.TaskGroup() as tg:
            tg.create_task(settle())
            for s in sessions:
                tg.create_task(one(s))
    finally:
        for s in sessions:
            if s.client is not None:
                with contextlib.suppress(Exception):
                    await s.client.close(timeout=0)
    period = cut.get("period", (cfg.frame_ms or 80) / 1000.0)
    rows = [_row(s, cfg, period) for s in sessions]
    owners = Counter(rid for r in rows if r["metrics"] for rid in r["metrics"]["response_ids"])
    shared = sorted(rid for rid, n in owners.items() if n > 1)
    for r in rows:
        if r["ok"] and set(r["metrics"]["response_ids"]) & set(shared):
            r["ok"], r["failure"] = False, "response_identity"
    intervals = [x for r in rows if r["metrics"] for x in _intervals(r)]
    lateness = [max(0.0, st - pl) * 1000.0 for r in rows if r["metrics"] for pl, st, _ in r["input_timeline"]]
    pooled = pooled_metrics(rows, intervals, lateness)
    ok = all(r["ok"] for r in rows)
    return LoadResult(cfg, info, period, rows, pooled, shared, ok)


def _timeline(packets: list[Any], start: float) -> list[list[Any]]:
    """``[t from stream start, samples, response ordinal]`` per valid packet (no payload, no ids)."""
    ordinal: dict[str | None, int] = {}
    return [[round(p.t - start, 5), p.samples, ordinal.setdefault(p.response_id, len(ordinal))]
            for p in packets if p.code is None]


def _intervals(row: dict[str, Any]) -> list[float]:
    return response_intervals_ms([(t, r) for t, _, r in row["audio_packet_timeline"]])
