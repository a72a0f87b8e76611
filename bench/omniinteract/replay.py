"""Replay one OmniInteract case into one duplex session, in real time, and record what came back.

Theory of operation
-------------------
1. **Open.** A ``DuplexClient`` (no resume, no heartbeat) opens the session with 16 kHz PCM16
   input, 24 kHz PCM16 output, ``listen_only`` overlap and ``ack_only`` playback commit. The
   turn lane follows the session's capabilities (``turn_detection="auto"``): model-native turns
   (``turn_detection: null``) when the model decides itself, else server VAD.
2. **Frame transport** (``select_frame_transport``), from the capabilities only: ``video_frames`` on
   the appends when the model lists ``video`` among its input modalities (or lists none: a legacy
   server); ``conversation.item.create`` image items when it takes images (at most
   ``MAX_IMAGE_ITEMS`` live, the oldest deleted first); else no frames are sent and the case
   records a warning (our choice: an audio-only model is still measured).
3. **Stream.** The soundtrack goes out in ``chunk_ms`` appends (200 ms) on an absolute schedule
   ``start + audio offset``; each frame rides the first append whose audio end reaches the frame
   time. Lag per append = ``max(0, send time - start - audio offset)``.
4. **End of input.** Native lane: one ``input_audio_buffer.commit``. Server VAD lane: 1.5 s of
   silence instead (longer than the VAD's silence window).
5. **Completion.** Native: ``input_audio_buffer.committed`` arrived, every ``response.created``
   has its ``response.done``, a post-commit decision exists (a non-cancelled ``response.done`` or
   a ``response.listen``; after ``decision_timeout_s`` without one the case completes with a
   warning), and no event for ``settle_s`` (playback acknowledgements do not count). Server VAD:
   no open speech, no open response, ``settle_s`` quiet.
6. **Playback.** Every audio delta is placed on a ``SerialPlayback`` clock; acks follow its rules.
   Tolerated server errors (``playback_ack_too_late``, ``playback_item_not_found``) become
   warnings; any other ``error``, a ``session.expired`` or an unexpected ``session.closed`` fails
   the case.

Nothing is written here: the runner publishes the artifacts after timing ends.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from bench.omniinteract.media import INPUT_RATE, Media
from bench.omniinteract.playback import SerialPlayback
from clients import ClientError, DuplexClient, event_type
from duplex.protocol import (
    AudioConfig,
    AudioFormat,
    AudioFormatSpec,
    AudioInputConfig,
    AudioOutputConfig,
    ConversationItemCreate,
    ConversationItemDelete,
    DuplexInputAudioBufferCommit,
    DuplexSessionConfig,
    InputImagePart,
    MessageItem,
    ServerVad,
    parse_format,
)
from duplex.protocol.audio import decode_audio, encode_audio, pcm16_decode, resample

__all__ = ["MAX_IMAGE_ITEMS", "CaseRun", "ReplayOptions", "replay_case", "select_frame_transport"]

MAX_IMAGE_ITEMS = 8
OUTPUT_RATE = 24000
SERVER_VAD_TAIL_S = 1.5
TOLERATED_ERRORS = frozenset({"playback_ack_too_late", "playback_item_not_found"})
_QUIET_TYPES = frozenset({"playback.acknowledged", "session.heartbeat_ack"})


@dataclass(frozen=True)
class ReplayOptions:
    url: str
    model: str | None = None
    api_key: str | None = None
    msgpack: bool = False
    chunk_ms: int = 200
    turn_detection: str = "auto"  # auto | none | server_vad
    frame_transport: str = "auto"  # auto | video_frames | image_items | none
    instructions: str | None = None
    ref_audio: str | None = None  # a data: URL
    timeout_s: float = 900.0
    settle_s: float = 2.0
    decision_timeout_s: float = 10.0
    ack_step_ms: float = 200.0
    poll_s: float = 0.05
    require_response: bool = False
    max_image_items: int = MAX_IMAGE_ITEMS


@dataclass
class ResponseTrace:
    response_id: str
    created_t: float
    item_id: str | None = None
    first_text_t: float | None = None
    first_audio_t: float | None = None
    last_audio_t: float | None = None
    audio_ms: float = 0.0
    text: str = ""
    status: str | None = None
    output_tokens: int | None = None


@dataclass
class CaseRun:
    """Everything one replay observed; times are seconds on the replay clock."""

    success: bool = False
    error: str | None = None
    session_id: str | None = None
    capabilities: dict[str, Any] | None = None
    turn_detection: str | None = None
    frame_transport: str | None = None
    stream_start: float | None = None
    input_end: float | None = None
    finished: float | None = None
    input_audio_chunks: int = 0
    input_video_frames: int = 0
    lags: list[float] = field(default_factory=list)
    events: list[tuple[float, Any]] = field(default_factory=list)
    responses: dict[str, ResponseTrace] = field(default_factory=dict)
    playback: SerialPlayback = field(default_factory=SerialPlayback)
    warnings: list[str] = field(default_factory=list)
    cleared: set[str] = field(default_factory=set)
    cancelled: set[str] = field(default_factory=set)


def select_frame_transport(caps: Any, requested: str = "auto") -> str:
    """``video_frames``, ``image_items`` or ``none`` for a session's capabilities (module docstring)."""
    if requested != "auto":
        return requested
    if caps is None:
        return "video_frames"
    modalities = set(getattr(caps, "required_input_modalities", []) or []) | set(
        getattr(caps, "optional_input_modalities", []) or [])
    if "video" in modalities or not modalities:
        return "video_frames"
    if getattr(caps, "supports_image_input", False):
        return "image_items"
    return "none"


def session_config(opts: ReplayOptions) -> DuplexSessionConfig:
    """The session the replay asks for (module docstring, step 1)."""
    # "auto" leaves the lane to the server's default until the capabilities are known.
    td: Any = {"none": None, "server_vad": ServerVad(create_response=True, interrupt_response=False)}.get(
        opts.turn_detection, msgspec.UNSET)
    return DuplexSessionConfig(
        type="realtime",
        model=opts.model,
        instructions=opts.instructions,
        output_modalities=["audio"],
        audio=AudioConfig(
            input=AudioInputConfig(
                format=AudioFormatSpec(type="audio/pcm", rate=INPUT_RATE), turn_detection=td
            ),
            output=AudioOutputConfig(format=AudioFormatSpec(type="audio/pcm", rate=OUTPUT_RATE)),
        ),
        ref_audio=opts.ref_audio,
        overlap_policy="listen_only",
        playback_commit_policy="ack_only",
        idle_timeout_s=opts.timeout_s,
        extra_body={"force_listen_count": 0},
    )


def _lane(caps: Any, requested: str) -> str:
    if requested != "auto":
        return requested
    if caps is None or getattr(caps, "supports_model_native_turn_policy", False):
        return "none"
    return "server_vad" if getattr(caps, "supports_server_vad", False) else "none"


class _Watcher:
    """Turns the event stream into the case's record and its completion state (sans-IO)."""

    def __init__(self, run: CaseRun, out_fmt: AudioFormat) -> None:
        self.run = run
        self.out_fmt = out_fmt
        self.committed = False
        self.commit_t: float | None = None
        self.decision = False
        self.last_activity = 0.0
        self.open_speech = 0
        self.failure: str | None = None
        self.closing = False

    def on_event(self, ev: Any, t: float) -> None:
        run = self.run
        run.events.append((t, ev))
        kind = event_type(ev)
        if kind not in _QUIET_TYPES:
            self.last_activity = t
        if kind == "response.created":
            rid = ev.response.id
            run.responses[rid] = ResponseTrace(rid, t)
        elif kind == "response.output_audio.delta":
            self._audio(ev, t)
        elif kind in ("response.output_audio_transcript.delta", "response.output_text.delta"):
            tr = run.responses.get(ev.response_id)
            if tr is not None:
                tr.text += ev.delta
                if tr.first_text_t is None and ev.delta.strip():
                    tr.first_text_t = t
        elif kind == "response.done":
            self._done(ev, t)
        elif kind == "response.listen":
            if self.commit_t is not None:
                self.decision = True
        elif kind == "input_audio_buffer.committed":
            self.committed = True
        elif kind == "input_audio_buffer.speech_started":
            self.open_speech += 1
        elif kind == "input_audio_buffer.speech_stopped":
            self.open_speech = max(0, self.open_speech - 1)
        elif kind == "output_audio_buffer.cleared":
            run.cleared.add(ev.response_id)
            run.playback.clear(ev.response_id, t)
        elif kind == "error":
            code = ev.error.code or "error"
            if code in TOLERATED_ERRORS:
                run.warnings.append(f"server error tolerated: {code}")
            elif self.failure is None:
                self.failure = f"server error {code}: {ev.error.message}"
        elif kind == "session.expired" or (kind == "session.closed" and not self.closing):
            self.failure = self.failure or f"{kind} ({getattr(ev, 'reason', '')})"

    def _audio(self, ev: Any, t: float) -> None:
        fmt = self.out_fmt
        if getattr(ev, "format", None) is not None:
            with contextlib.suppress(Exception):
                fmt = parse_format(ev.format, getattr(ev, "sample_rate_hz", None))
        audio = bytes(ev.delta)
        if fmt.encoding != "pcm16":  # keep one sample format on the playback clock
            audio = encode_audio(decode_audio(audio, fmt), AudioFormat("pcm16", fmt.rate))
        tr = self.run.responses.get(ev.response_id)
        if tr is None:  # audio without response.created: keep it, under its own id
            tr = self.run.responses[ev.response_id] = ResponseTrace(ev.response_id, t)
            self.run.warnings.append(f"audio for unannounced response {ev.response_id}")
        tr.item_id = tr.item_id or ev.item_id
        tr.first_audio_t = tr.first_audio_t if tr.first_audio_t is not None else t
        tr.last_audio_t = t
        seg = self.run.playback.add(ev.response_id, ev.item_id, audio, fmt.rate, t)
        tr.audio_ms += (seg.end - seg.start) * 1000.0

    def _done(self, ev: Any, t: float) -> None:
        rid = ev.response.id
        tr = self.run.responses.setdefault(rid, ResponseTrace(rid, t))
        tr.status = str(ev.response.status)
        usage = ev.response.usage
        tr.output_tokens = getattr(usage, "output_tokens", None) if usage is not None else None
        self.run.playback.done(rid)
        if tr.status == "cancelled":
            self.run.cancelled.add(rid)
        elif self.commit_t is not None and t >= self.commit_t:
            self.decision = True

    def complete(self, now: float, lane: str, decision_timeout_s: float, settle_s: float) -> bool:
        open_responses = any(tr.status is None for tr in self.run.responses.values())
        quiet = now - self.last_activity >= settle_s
        if lane == "server_vad":
            return not open_responses and self.open_speech == 0 and quiet
        if not self.committed or open_responses or not quiet:
            return False
        if not self.decision:
            assert self.commit_t is not None
            if now - self.commit_t < decision_timeout_s:
                return False
            self.decision = True
            self.run.warnings.append("no post-commit decision (response or listen) arrived")
        return True


def _input_bytes(media: Media, fmt: AudioFormat, tail_s: float) -> bytes:
    pcm = pcm16_decode(media.pcm16)
    if tail_s > 0:
        pcm = np.concatenate([pcm, np.zeros(int(tail_s * INPUT_RATE), np.float32)])
    if fmt.rate != INPUT_RATE:
        pcm = resample(pcm, INPUT_RATE, fmt.rate)
    return encode_audio(pcm, fmt)


async def replay_case(media: Media, opts: ReplayOptions, *, clock: Callable[[], float] = time.perf_counter
                      ) -> CaseRun:
    """Replay ``media`` (module docstring). Never raises for a server-side failure: see ``run.error``."""
    run = CaseRun(playback=SerialPlayback(ack_step_ms=opts.ack_step_ms))
    client = DuplexClient(opts.url, session=session_config(opts), model=opts.model, api_key=opts.api_key,
                          msgpack=opts.msgpack, resume=False, open_timeout_s=min(opts.timeout_s, 20.0),
                          clock=clock)
    try:
        async with asyncio.timeout(opts.timeout_s):
            await _drive(client, media, opts, run, clock)
    except (TimeoutError, ClientError, ConnectionError, OSError) as exc:
        run.error = _describe(exc, opts.timeout_s)
    except ExceptionGroup as group:  # from the task group of _drive: report the first failure
        first = _leaf(group)
        if not isinstance(first, TimeoutError | ClientError | ConnectionError | OSError):
            raise
        run.error = _describe(first, opts.timeout_s)
    finally:
        if client.session_id is not None:  # a refused client holds no socket
            with contextlib.suppress(Exception):
                await client.close(timeout=5.0)
    run.finished = run.finished or clock()
    run.success = run.error is None
    if run.success and opts.require_response and not any(tr.audio_ms > 0 for tr in run.responses.values()):
        run.success, run.error = False, "no audio response (required)"
    return run


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"timed out after {timeout_s} s"
    if isinstance(exc, ClientError):
        return f"{exc.code}: {exc.message}"
    return f"connection failed: {exc}"


async def _drive(client: DuplexClient, media: Media, opts: ReplayOptions, run: CaseRun,
                 clock: Callable[[], float]) -> None:
    await client.open()
    run.session_id = client.session_id
    caps = client.capabilities
    run.capabilities = _builtins(caps)
    lane = _lane(caps, opts.turn_detection)
    run.turn_detection = lane
    if opts.turn_detection == "auto" and lane == "server_vad":
        cfg = session_config(dataclasses.replace(opts, turn_detection="server_vad"))
        await client.update_session(cfg)
        await client.wait_for("session.updated", timeout=10.0)
    transport = select_frame_transport(caps, opts.frame_transport)
    run.frame_transport = transport
    if transport == "none":
        run.warnings.append("the model takes neither video frames nor images: frames not sent")
    watcher = _Watcher(run, client.output_format or AudioFormat("pcm16", OUTPUT_RATE))
    client.add_listener(lambda ev: watcher.on_event(ev, clock()))
    fmt = client.input_format
    data = _input_bytes(media, fmt, SERVER_VAD_TAIL_S if lane == "server_vad" else 0.0)
    width = fmt.bytes_per_sample or 2
    step = fmt.rate * opts.chunk_ms // 1000 * width
    bps = fmt.rate * width

    async def drain() -> None:
        async for _ in client:
            pass

    async def acks() -> None:
        # The session may end under this loop (the server closed it): the watcher reports that.
        with contextlib.suppress(ConnectionError, ClientError):
            while not client.ended:
                for rid, item, played in run.playback.acks_due(clock()):
                    await client.playback_ack(rid, played, item_id=item)
                await asyncio.sleep(opts.poll_s)

    async with asyncio.TaskGroup() as tg:
        drainer = tg.create_task(drain())
        acker = tg.create_task(acks())
        try:
            await _finish(client, media, data, step, bps, transport, run, watcher, clock, opts, lane)
        except (ConnectionError, ClientError):
            if not client.ended:
                raise
        finally:
            if watcher.failure is None and client.ended and not watcher.closing:
                watcher.failure = "the session ended before the case completed"
            acker.cancel()
            drainer.cancel()
    if watcher.failure is not None:
        run.error = watcher.failure


async def _finish(client: DuplexClient, media: Media, data: bytes, step: int, bps: int, transport: str,
                  run: CaseRun, watcher: _Watcher, clock: Callable[[], float], opts: ReplayOptions,
                  lane: str) -> None:
    """Stream, end the input, wait for completion, let playback finish, close (module docstring)."""
    await _stream(client, media, data, step, bps, transport, run, watcher, clock, opts.max_image_items)
    if client.ended or watcher.failure is not None:
        return
    if lane != "server_vad":
        watcher.commit_t = clock()
        await client.send(DuplexInputAudioBufferCommit())
    run.input_end = clock()
    while not watcher.complete(clock(), lane, opts.decision_timeout_s, opts.settle_s):
        if watcher.failure is not None or client.ended:
            return
        await asyncio.sleep(opts.poll_s)
    # Let the listener hear what was played before closing (final acks).
    end = max(run.playback.clock_end, clock())
    while clock() < end and watcher.failure is None and not client.ended:
        await asyncio.sleep(opts.poll_s)
    for rid, item, played in run.playback.acks_due(clock()):
        await client.playback_ack(rid, played, item_id=item)
    run.finished = clock()
    watcher.closing = True
    await client.close(timeout=5.0)


async def _stream(client: DuplexClient, media: Media, data: bytes, step: int, bps: int, transport: str,
                  run: CaseRun, watcher: _Watcher, clock: Callable[[], float], max_items: int) -> None:
    frames = list(media.frames)
    live: list[str] = []
    fi = 0
    start = clock()
    run.stream_start = start
    for offset in range(0, len(data), step):
        if watcher.failure is not None or client.ended:
            return
        chunk = data[offset : offset + step]
        end_s = (offset + len(chunk)) / bps
        attach: list[bytes] = []
        while fi < len(frames) and frames[fi][0] <= end_s + 1e-9:
            attach.append(frames[fi][1])
            fi += 1
        run.lags.append(max(0.0, clock() - start - offset / bps))
        if transport == "image_items":
            for jpeg in attach:
                if len(live) >= max_items:
                    await client.send(ConversationItemDelete(item_id=live.pop(0)))
                item_id = f"omniinteract_frame_{run.input_video_frames}"
                url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()
                await client.send(ConversationItemCreate(item=MessageItem(
                    id=item_id, role="user", content=[InputImagePart(image_url=url)])))
                live.append(item_id)
                run.input_video_frames += 1
            await client.append_audio(chunk)
        elif transport == "video_frames" and attach:
            await client.append_audio(chunk, video_frames=attach)
            run.input_video_frames += len(attach)
        else:
            await client.append_audio(chunk)
        run.input_audio_chunks += 1
        delay = start + end_s - clock()
        if delay > 0:
            await asyncio.sleep(delay)


def _builtins(caps: Any) -> dict[str, Any] | None:
    return None if caps is None else msgspec.to_builtins(caps)
