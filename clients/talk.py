"""``duplex talk``: a conversation with a server, from a WAV file, a video clip or live from the
microphone and the camera.

Input. ``--wav``: the file is resampled to 24 kHz and streamed as PCM16 appends of the model's frame
length on an absolute real-time schedule. ``--mic``: the microphone streams live (``MicrophoneStream``:
the device's callback hands its blocks to the event loop, resampled to 24 kHz), one append per frame,
until Ctrl-C or ``--seconds``. ``--video``: a recorded clip (``clients.camera.VideoClip``) streams its
audio, resampled to 24 kHz, and one frame a second of its picture, each riding the append whose audio
holds the frame's time, all paced on the clip's clock. Any of them is followed by ``--tail-ms`` of
silence (so a server VAD hears the end of the turn) unless the user stopped it.

Camera. ``--camera [DEVICE]`` adds a live camera (``clients.camera.CameraStream``; FFmpeg's capture
device of the platform, or ``--camera-format``) to ``--mic`` or ``--wav``: the newest picture rides
the append that starts each second of audio. Frames (from the camera or a clip) are sent only to a
model that takes them (``capabilities.supports_image_input``), as JPEG scaled down to the size it
works at (``capabilities.video_frame_max_pixels``); to any other model the audio goes alone, and the
command says so.

Output. Every transcript is printed as it arrives and a progress line shows what was sent and heard.
``--play`` plays the reply while the conversation runs (``SpeakerStream``, a jitter buffer pulled by
the device's callback) and acknowledges playback (``playback.ack``) from the frames the device
consumed; when the server's VAD hears the user start speaking while reply audio plays
(``input_audio_buffer.speech_started``), the queued audio is dropped at once and
``conversation.item.truncate`` is sent at the played position, so the history holds what was heard.
Without ``--play`` a simulated speaker acknowledges playback as a real one would. ``--out`` saves all
reply audio; ``--events-out`` writes every server event, one JSON line each.

End. When the input is over and no response started on its own, a client-commit model is asked with
``input_audio_buffer.commit`` + ``response.create``. The command then waits until every response is
done, its audio played, and nothing new starts for a second (or ``--timeout``), and closes the
session. Ctrl-C (or ``StopSignal.set``) ends the conversation at any point: playback stops (a
truncation at the played position), the session is closed with ``session.close`` and the exit status
is 0.

Echo. ``--mic --play`` is a full-duplex conversation: without headphones the speaker talks into the
microphone, and a server VAD would take the model's own voice for the user barging in. So the echo
canceller (``clients.echo_cancel``) runs by default there: the speaker hands it every block it
played, and each microphone chunk (at 24 kHz, after resampling) has the echo taken out before it is
sent. ``--no-aec`` turns it off (headphones need none).

Errors: a missing ``sounddevice`` or ``av`` package or PortAudio library, a sound device or camera
that cannot be opened, and a clip that cannot be read, are one-line ``TalkError``s with status 2,
raised before the session opens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

import numpy as np

from clients.audio_device import AudioDeviceError, MicrophoneStream, SpeakerPlayback, SpeakerStream
from clients.base import ClientClosed, ClientError
from clients.camera import CameraError, CameraStream, VideoClip, load_av
from clients.collector import EventCollector, event_type
from clients.echo_cancel import EchoLink
from clients.pacing import Pacer
from clients.playback import SimulatedPlayback
from clients.websocket import DuplexClient
from duplex.protocol import (
    AudioConfig,
    AudioFormatSpec,
    AudioInputConfig,
    AudioOutputConfig,
    DuplexSessionConfig,
    Mode,
    encode,
)
from duplex.protocol.audio import decode_audio, encode_audio, read_wav, resample, write_wav
from duplex.protocol.ext import MAX_VIDEO_FRAMES

__all__ = ["StopSignal", "TalkError", "talk"]

RATE = 24000
IDLE_END_S = 1.0
POLL_S = 0.02  # how often waits look at the speaker and acks go out
FRAME_INTERVAL_S = 1.0  # one camera frame per second of audio


class TalkError(Exception):
    """A failure of ``duplex talk``; ``status`` is the exit status (2: usage, 1: run time)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


class StopSignal:
    """Ends a running ``duplex talk`` as Ctrl-C does. ``set()`` is thread-safe and idempotent; a
    signal set before the conversation starts ends it as soon as it starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requested = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def set(self) -> None:
        with self._lock:
            self._requested = True
            loop, event = self._loop, self._event
        if loop is not None and event is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed: nothing runs
                loop.call_soon_threadsafe(event.set)

    def bind(self) -> asyncio.Event:
        """The event set on stop, for the running loop (call from inside it)."""
        event = asyncio.Event()
        with self._lock:
            self._loop, self._event = asyncio.get_running_loop(), event
            if self._requested:
                event.set()
        return event


def _load_wav(path: str) -> np.ndarray:
    try:
        pcm, rate = read_wav(path)
    except Exception as exc:  # unreadable or not audio: a usage error with the reason
        raise TalkError(f"cannot read {path}: {exc}", 2) from exc
    pcm = np.asarray(pcm, dtype=np.float32)
    if pcm.ndim > 1:
        pcm = pcm[:, 0]
    return resample(pcm, rate, RATE) if rate != RATE else pcm


def _sounddevice(flag: str) -> Any:
    """The ``sounddevice`` module, or a one-line ``TalkError`` (status 2) naming what to install:
    the package itself, or the PortAudio library it loads (its import raises ``OSError`` then)."""
    try:
        import sounddevice
    except ImportError as exc:
        raise TalkError(
            f"{flag} needs the 'sounddevice' package, which is not installed: pip install sounddevice", 2
        ) from exc
    except OSError as exc:
        raise TalkError(
            f"{flag} needs the PortAudio library for 'sounddevice' ({exc}): install it, "
            "e.g. apt install libportaudio2 or brew install portaudio",
            2,
        ) from exc
    return sounddevice


def _device(spec: str | None) -> int | str | None:
    """A ``--input-device`` / ``--output-device`` value: an index, or a name (part of one)."""
    if spec is None:
        return None
    return int(spec) if spec.strip().lstrip("-").isdigit() else spec


class _Progress:
    """The progress line on stderr: redrawn in place on a terminal; elsewhere (a log, a pipe) a
    new line only when it changed and at most once per ``LOG_EVERY_S``, so logs stay readable."""

    LOG_EVERY_S = 1.0

    def __init__(self, total_s: float | None, quiet: bool) -> None:
        self.total_s = total_s
        self.quiet = quiet
        self.sent_s = 0.0
        self.heard_ms = 0.0
        self.responses = 0
        self.frames: int | None = None  # camera frames sent (None: no camera)
        self.line_open = False
        self.tty = sys.stderr.isatty()
        self._logged = ""
        self._logged_at = float("-inf")

    def show(self) -> None:
        if self.quiet:
            return
        total = f"/{self.total_s:.1f}" if self.total_s is not None else ""
        line = (
            f"sent {self.sent_s:5.1f}{total} s | reply audio {self.heard_ms / 1000:5.1f} s"
            f" | responses {self.responses}" + (f" | frames {self.frames}" if self.frames is not None else "")
        )
        if self.tty:
            sys.stderr.write(f"\r{line} ")
            sys.stderr.flush()
            self.line_open = True
            return
        now = time.monotonic()
        if line != self._logged and now - self._logged_at >= self.LOG_EVERY_S:
            self._logged, self._logged_at = line, now
            print(line, file=sys.stderr, flush=True)

    def say(self, text: str) -> None:
        if self.line_open:
            sys.stderr.write("\n")
            self.line_open = False
        print(text, flush=True)


class _TurnLatency:
    """Each reply's latency: from the end of the user's speech to the reply's first audio, on the
    client's clock (what a listener waits through, the VAD's silence window included).

    The end of speech is where the server's VAD put it (``input_audio_buffer.speech_stopped``'s
    ``audio_end_ms``, a position in the input audio), as the time that audio was sent: the input
    streams in real time from ``start``. A model without a VAD (one that takes its own turns, or
    answers a commit) has the end of the input (``input_ended``) stand for it. Nothing is measured
    when the input is not sent in real time (``--fast``): ``start`` is then never called."""

    def __init__(self) -> None:
        self.started_at: float | None = None  # when the first input audio was sent
        self.heard_vad = False
        self._speech_end: float | None = None  # the latest end of speech not yet answered
        self.ms: dict[str, float] = {}  # response id -> latency

    def start(self, t: float) -> None:
        if self.started_at is None:
            self.started_at = t

    def input_ended(self, t: float) -> None:
        if self.started_at is not None and not self.heard_vad:
            self._speech_end = t

    def saw(self, event: Any, t: float) -> None:
        kind = event_type(event)
        if kind == "input_audio_buffer.speech_stopped" and self.started_at is not None:
            self.heard_vad = True
            self._speech_end = self.started_at + getattr(event, "audio_end_ms", 0) / 1000
        elif kind == "response.output_audio.delta" and self._speech_end is not None:
            response_id = getattr(event, "response_id", "")
            if response_id not in self.ms:
                self.ms[response_id] = max(0.0, t - self._speech_end) * 1000
                self._speech_end = None

    def of(self, response_id: str) -> str:
        """`` (first audio N ms after your speech)`` for a measured reply, else ``""``."""
        ms = self.ms.get(response_id)
        return "" if ms is None else f"  (first audio {ms:.0f} ms after your speech)"


class _Activity:
    """Counts server events, so a wait can tell that something arrived since it last looked. A model
    that hears the stream says ``response.listen`` for every unit it stays quiet (padded silence
    included, for up to the server's padding limit after the input ends): that is no activity."""

    QUIET = frozenset({"response.listen"})

    def __init__(self) -> None:
        self.events = 0

    def saw(self, event: Any) -> None:
        if event_type(event) not in self.QUIET:
            self.events += 1


def _av(flag: str) -> Any:
    """PyAV, or a one-line ``TalkError`` (status 2) naming what to install."""
    try:
        return load_av(flag)
    except CameraError as exc:
        raise TalkError(str(exc), 2) from exc


@contextlib.contextmanager
def _devices(
    args: argparse.Namespace, sd: Any, av: Any
) -> Iterator[tuple[MicrophoneStream | None, SpeakerStream | None, CameraStream | None]]:
    """The microphone, the speaker and the camera asked for, open and started, the first two sharing
    an echo canceller when both are (unless ``--no-aec``); a device error is status 2."""
    echo = EchoLink(RATE) if args.mic and args.play and not getattr(args, "no_aec", False) else None
    with contextlib.ExitStack() as stack:
        mic = speaker = camera = None
        try:
            if args.camera is not None:
                camera = stack.enter_context(
                    CameraStream(av, args.camera or None, input_format=args.camera_format)
                )
            if args.play:
                speaker = stack.enter_context(
                    SpeakerStream(
                        sd,
                        device=_device(args.output_device),
                        device_rate=args.device_rate,
                        prebuffer_ms=args.jitter_ms,
                        echo=echo,
                    )
                )
            if args.mic:
                mic = stack.enter_context(
                    MicrophoneStream(
                        sd,
                        rate=RATE,
                        device=_device(args.input_device),
                        device_rate=args.device_rate,
                        echo=echo,
                    )
                )
        except (AudioDeviceError, CameraError) as exc:
            raise TalkError(str(exc), 2) from exc
        yield mic, speaker, camera


def _session_config(args: argparse.Namespace) -> DuplexSessionConfig:
    return DuplexSessionConfig(
        type="realtime",
        model=args.model,
        output_modalities=["audio"],
        audio=AudioConfig(
            input=AudioInputConfig(format=AudioFormatSpec(type="audio/pcm", rate=RATE)),
            output=AudioOutputConfig(format=AudioFormatSpec(type="audio/pcm", rate=RATE)),
        ),
    )


class _Frames:
    """Where the camera frames come from, and how many were sent: a live camera, a clip, or none.
    ``on`` once the session says the model takes frames (``capabilities.supports_image_input``)."""

    def __init__(self, camera: CameraStream | None, clip: VideoClip | None) -> None:
        self.camera = camera
        self.clip = clip
        self.on = False
        self.sent = 0

    def configure(self, caps: Any, progress: _Progress) -> None:
        """Follow the model's capabilities: frames only to a model that takes them, at its size."""
        source = self.camera or self.clip
        if source is None:
            return
        if not getattr(caps, "supports_image_input", False):
            progress.say("the model takes no camera frames: sending the audio only")
            return
        self.on = True
        source.max_pixels = getattr(caps, "video_frame_max_pixels", 0) or 0
        progress.frames = 0

    def grab(self) -> bytes | None:
        """The camera's newest picture (None: no camera, frames off, or no new picture)."""
        if not self.on or self.camera is None:
            return None
        try:
            return self.camera.grab()
        except CameraError as exc:
            raise TalkError(str(exc)) from exc


async def _talk(
    args: argparse.Namespace,
    pcm: np.ndarray | None,
    sd: Any,
    stop: StopSignal,
    av: Any = None,
    clip: VideoClip | None = None,
) -> tuple[list[Any], EventCollector, SpeakerPlayback | None, int]:
    stopped = stop.bind()
    devices = _devices(args, sd, av)
    with devices as (mic, speaker, camera), _events_file(args.events_out) as events_out:
        collector = EventCollector()
        client = DuplexClient(
            args.url,
            max_responses=100_000,  # the whole reply is saved
            api_key=args.api_key,
            model=args.model,
            session=_session_config(args),
            collector=collector,
            heartbeat_s=15.0,
        )
        tail_s = args.tail_ms / 1000
        total_s = None if pcm is None else len(pcm) / RATE + tail_s
        if mic is not None and args.seconds is not None:
            total_s = args.seconds + tail_s
        if clip is not None and clip.duration_s is not None:
            total_s = clip.duration_s + tail_s
        progress = _Progress(total_s, args.quiet)
        playback: SpeakerPlayback | SimulatedPlayback
        playback = SpeakerPlayback(speaker) if speaker is not None else SimulatedPlayback()
        activity = _Activity()
        latency = _TurnLatency()
        barge_ins_shown = 0

        def on_event(event: Any) -> None:
            nonlocal barge_ins_shown
            playback.on_event(event, client.clock())
            activity.saw(event)
            latency.saw(event, client.clock())
            if events_out is not None:
                events_out.write(encode(event, Mode.GA) + "\n")
            if isinstance(playback, SpeakerPlayback) and playback.barge_ins != barge_ins_shown:
                barge_ins_shown = playback.barge_ins
                cut = playback.last_cut
                assert cut is not None
                progress.say(f"(barge-in: reply stopped after {cut.audio_end_ms / 1000:.2f} s)")
            _show(event, client, progress, latency)

        try:
            await client.open()
        except ClientError as exc:
            raise TalkError(f"cannot open a session at {args.url}: {exc}") from exc
        playback.output_format = client.output_format
        client.add_listener(on_event)
        model = getattr(client.session, "model", None)
        progress.say(f"session {client.session_id} on model {model!r}")
        for device in (mic, speaker):
            if device is not None:
                role = "microphone" if device is mic else "speaker"
                progress.say(f"{role}: {device.name} at {device.device_rate} Hz")
        if camera is not None:
            progress.say(f"camera: {camera.name} ({camera.input_format})")
        frames = _Frames(camera, clip)
        frames.configure(client.capabilities, progress)
        if mic is not None and mic.echo is not None:
            progress.say("echo cancellation: on (--no-aec to turn it off, e.g. with headphones)")
        acks_done = asyncio.Event()
        # Keep the event queue empty (handles and listeners keep what matters), so a long
        # conversation never fills it and pauses the receive side.
        drain = asyncio.create_task(_drain(client))
        reporter = asyncio.create_task(_report_playback(client, playback, acks_done))
        conversation = asyncio.create_task(
            _converse(client, args, pcm, mic, frames, playback, progress, activity, collector, latency)
        )
        interrupted = asyncio.create_task(stopped.wait())
        try:
            await asyncio.wait({conversation, interrupted}, return_when=asyncio.FIRST_COMPLETED)
            if conversation.done():
                conversation.result()
            else:
                progress.say("stopping: closing the session")
                await _cancel(conversation)
                for cmd in playback.interrupt(client.clock()):
                    await client.send(cmd)
        except (ClientClosed, ConnectionError):
            pass
        except (AudioDeviceError, CameraError) as exc:
            raise TalkError(str(exc)) from exc
        finally:
            await _cancel(conversation)
            await _cancel(interrupted)
            acks_done.set()
            with contextlib.suppress(ClientClosed, ConnectionError):
                await reporter
            await _cancel(drain)
            await client.close()
        ended = client.closed_event
        if ended is not None and getattr(ended, "reason", None) != "client_close":
            progress.say(f"the server ended the session: {event_type(ended)} ({ended.reason})")
        if progress.line_open:
            sys.stderr.write("\n")
    return list(client.responses.values()), collector, playback if speaker is not None else None, frames.sent


@contextlib.contextmanager
def _events_file(path: str | None) -> Iterator[IO[str] | None]:
    if path is None:
        yield None
        return
    try:
        out = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed below, after the session)
    except OSError as exc:
        raise TalkError(f"cannot write {path}: {exc}", 2) from exc
    with out:
        yield out


def _show(event: Any, client: DuplexClient, progress: _Progress, latency: _TurnLatency) -> None:
    kind = event_type(event)
    if kind == "response.created":
        progress.responses += 1
    elif kind == "response.output_audio.delta":
        fmt = client.output_format
        width = fmt.bytes_per_sample if fmt is not None and fmt.bytes_per_sample else 2
        progress.heard_ms += len(event.delta) / width / (fmt.rate if fmt else RATE) * 1000
    elif kind == "response.done":
        handle = client.responses.get(event.response.id)
        text = (handle.transcript or handle.text).strip() if handle is not None else ""
        status = event.response.status
        said = f"assistant: {text}" + ("" if status == "completed" else f"  [{status}]")
        progress.say(said + latency.of(event.response.id))
    elif kind == "conversation.item.input_audio_transcription.completed":
        progress.say(f"you: {event.transcript}")
    elif kind == "error":
        progress.say(f"error {event.error.code}: {event.error.message}")
    progress.show()


async def _cancel(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` (when it still runs) and wait for it; its own errors are not ours to raise here."""
    if not task.done():
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, ClientClosed, ConnectionError):
        await task


async def _drain(client: DuplexClient) -> None:
    with contextlib.suppress(ClientClosed):
        while True:
            await client.recv()


async def _report_playback(client: DuplexClient, playback: Any, done: asyncio.Event) -> None:
    """Send what the playback model asks for (acks, truncations) until ``done``, then once more:
    the last acks are sent whole, never cut by a cancellation."""
    while not done.is_set():
        for cmd in playback.acks_due(client.clock()):
            await client.send(cmd)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), POLL_S)
    for cmd in playback.acks_due(client.clock()):
        await client.send(cmd)


async def _converse(
    client: DuplexClient,
    args: argparse.Namespace,
    pcm: np.ndarray | None,
    mic: MicrophoneStream | None,
    frames: _Frames,
    playback: Any,
    progress: _Progress,
    activity: _Activity,
    collector: EventCollector,
    latency: _TurnLatency,
) -> None:
    caps = client.capabilities
    chunk_ms = args.chunk_ms or getattr(caps, "chunk_period_ms", 0) or 100
    chunk_ms = min(chunk_ms, 200)
    if not args.fast or mic is not None:
        latency.start(client.clock())
    if frames.clip is not None:
        await _stream_clip(client, frames, chunk_ms, args.fast, progress)
    elif mic is not None:
        await _stream_mic(client, mic, args.seconds, chunk_ms, progress, frames)
    else:
        assert pcm is not None
        await _stream(client, pcm, chunk_ms, args.fast, progress, frames)
    silence = np.zeros(RATE * args.tail_ms // 1000, dtype=np.float32)
    latency.input_ended(client.clock())
    await _stream(client, silence, chunk_ms, args.fast, progress, _Frames(None, None))
    collector.mark_input_end()
    if not client.responses and getattr(caps, "supports_client_commit", False):
        await client.commit(create_response=False)
        await client.create_response()
    await _wait_for_replies(client, args.timeout, playback, activity)


def _frame_track(frames: _Frames, progress: _Progress) -> list[tuple[float, bytes]] | None:
    """The camera's newest picture at the start of the next stretch of audio (``stream_pcm``'s
    ``video_frames``), counted as sent; None when there is none."""
    image = frames.grab()
    if image is None:
        return None
    frames.sent += 1
    progress.frames = frames.sent
    return [(0.0, image)]


async def _stream(
    client: DuplexClient, pcm: np.ndarray, chunk_ms: int, fast: bool, progress: _Progress, frames: _Frames
) -> None:
    step = int(RATE * FRAME_INTERVAL_S)  # report progress (and take a picture) once per second of audio
    for start in range(0, len(pcm), step):
        piece = pcm[start : start + step]
        track = _frame_track(frames, progress)
        await client.stream_pcm(
            piece, chunk_ms=chunk_ms, realtime=not fast, mark_end=False, video_frames=track
        )
        progress.sent_s += len(piece) / RATE
        progress.show()


async def _stream_mic(
    client: DuplexClient,
    mic: MicrophoneStream,
    seconds: float | None,
    chunk_ms: int,
    progress: _Progress,
    frames: _Frames,
) -> None:
    """Append the microphone, one chunk at a time, as it arrives: until ``seconds`` (None: until
    cancelled); the chunk that starts each second of audio carries the camera's newest picture. The
    microphone paces the stream, so there is no schedule to keep here."""
    chunk = RATE * chunk_ms // 1000
    limit = None if seconds is None else int(seconds * RATE)
    sent = 0
    shown = 0.0
    next_frame = 0  # samples sent when the next picture is due
    while limit is None or sent < limit:
        n = chunk if limit is None else min(chunk, limit - sent)
        pcm = await mic.read(n)
        track = None
        if sent >= next_frame:
            track = _frame_track(frames, progress)
            next_frame += int(RATE * FRAME_INTERVAL_S)
        await client.stream_pcm(pcm, chunk_ms=chunk_ms, realtime=False, mark_end=False, video_frames=track)
        sent += n
        progress.sent_s = sent / RATE
        if progress.sent_s - shown >= 0.5:
            shown = progress.sent_s
            progress.show()


async def _stream_clip(
    client: DuplexClient, frames: _Frames, chunk_ms: int, fast: bool, progress: _Progress
) -> None:
    """Stream the clip's audio as appends of ``chunk_ms`` on one absolute schedule (the clip's
    clock: chunk ``i`` is due ``i * chunk_ms`` after the first), each frame riding the append whose
    audio holds its time. The clip is read a second at a time off the event loop."""
    clip = frames.clip
    assert clip is not None
    fmt = client.input_format
    chunk = RATE * chunk_ms // 1000
    pacer = Pacer(chunk_ms / 1000, realtime=not fast, clock=client.clock)
    sent = 0  # samples
    while True:
        piece = await asyncio.to_thread(clip.read, FRAME_INTERVAL_S)
        pending = list(piece.frames) if frames.on else []
        for start in range(0, len(piece.pcm), chunk):
            pcm = piece.pcm[start : start + chunk]
            end_s = (sent + len(pcm)) / RATE
            attach = [image for t_s, image in pending if t_s < end_s]
            pending = pending[len(attach) :]
            await pacer.wait_next()
            await client.append_audio(encode_audio(pcm, fmt), video_frames=attach or None)
            sent += len(pcm)
            frames.sent += len(attach)
        for start in range(0, len(pending), MAX_VIDEO_FRAMES):  # after the clip's last sound: alone
            group = [image for _, image in pending[start : start + MAX_VIDEO_FRAMES]]
            await client.append_audio(b"", video_frames=group)
            frames.sent += len(group)
        if frames.on:
            progress.frames = frames.sent
        progress.sent_s = sent / RATE
        progress.show()
        if piece.done:
            return


async def _wait_for_replies(client: DuplexClient, timeout: float, playback: Any, activity: _Activity) -> None:
    """Until every response is done and played, and no event came for ``IDLE_END_S``; at most
    ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    quiet_since, seen = loop.time(), activity.events
    while loop.time() < deadline and not client.ended:
        busy = any(not h.finished for h in client.responses.values()) or getattr(playback, "busy", False)
        if busy or activity.events != seen:
            quiet_since, seen = loop.time(), activity.events
        elif loop.time() - quiet_since >= IDLE_END_S:
            return
        await asyncio.sleep(POLL_S)


def _open_clip(av: Any, path: str) -> VideoClip:
    try:
        return VideoClip(av, path, rate=RATE)
    except CameraError as exc:
        raise TalkError(str(exc), 2) from exc


def talk(args: argparse.Namespace, stop: StopSignal | None = None) -> int:
    """Run ``duplex talk`` with parsed arguments; returns the exit status.

    ``stop``: ends the conversation as Ctrl-C does (from any thread). When called from the main
    thread, Ctrl-C sets it too (instead of raising ``KeyboardInterrupt``) while the session runs.
    """
    if not args.wav and not args.mic and not args.video:
        raise TalkError("give --wav FILE, --mic or --video FILE", 2)
    if args.camera is not None and args.video:
        raise TalkError("--camera and --video both give the pictures: use one of them", 2)
    av = _av("--video" if args.video else "--camera") if args.video or args.camera is not None else None
    sd = None
    if args.mic or args.play:
        sd = _sounddevice("--mic" if args.mic else "--play")  # before the session: fail at once
    pcm = _load_wav(args.wav) if args.wav else None
    stop = stop or StopSignal()
    with contextlib.ExitStack() as stack:
        clip = stack.enter_context(_open_clip(av, args.video)) if args.video else None
        with _ctrl_c_sets(stop):
            responses, collector, played, frames_sent = asyncio.run(_talk(args, pcm, sd, stop, av, clip))
    audio = [decode_audio(bytes(h.audio), h.audio_format) for h in responses if h.audio and h.audio_format]
    rate = next((h.audio_format.rate for h in responses if h.audio_format), RATE)
    reply = np.concatenate(audio) if audio else np.zeros(0, dtype=np.float32)
    transcript = " ".join(h.transcript.strip() for h in responses if h.transcript.strip())
    ttfa = collector.ttfa().p50_ms
    print(
        f"reply: {len(responses)} response(s), {len(reply) / rate:.2f} s of audio"
        + (f", first audio {ttfa:.0f} ms after the end of input" if ttfa is not None else "")
    )
    if transcript:
        print(f"transcript: {transcript}")
    if args.camera is not None or args.video:
        print(f"sent {frames_sent} camera frame(s)")
    if played is not None:
        dropped = played.speaker.dropped_ms
        print(
            f"played on {played.speaker.name}; {played.barge_ins} barge-in(s)"
            + (f"; {dropped / 1000:.2f} s dropped (speaker buffer full)" if dropped else "")
        )
    if args.out:
        write_wav(args.out, reply, rate)
        print(f"saved {args.out}")
    return 0


@contextlib.contextmanager
def _ctrl_c_sets(stop: StopSignal) -> Iterator[None]:
    """While the session runs in the main thread, Ctrl-C (SIGINT) sets ``stop``: the session is
    closed properly. A second Ctrl-C interrupts at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed = 0

    def on_sigint(signum: int, frame: Any) -> None:
        nonlocal pressed
        pressed += 1
        if pressed > 1:
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
