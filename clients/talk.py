"""``duplex talk``: send a WAV file (or the microphone) to a server in real time and get the reply.

The input is resampled to 24 kHz and streamed as PCM16 appends of the model's frame length on an
absolute real-time schedule, followed by ``--tail-ms`` of silence (so a server VAD hears the end of
the turn). Meanwhile every transcript delta is printed as it arrives and a progress line shows what
was sent and heard. A simulated speaker acknowledges playback (``playback.ack``) as a real one would.
When the input is over and no response started on its own, a client-commit model is asked with
``input_audio_buffer.commit`` + ``response.create``. The command waits until every response is done
and nothing new starts for a second (or ``--timeout``), then saves (``--out``) or plays (``--play``)
the reply and closes the session.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from typing import Any

import numpy as np

from clients.base import ClientClosed, ClientError
from clients.collector import EventCollector, event_type
from clients.playback import PlaybackReporter, SimulatedPlayback
from clients.websocket import DuplexClient
from duplex.protocol import (
    AudioConfig,
    AudioFormatSpec,
    AudioInputConfig,
    AudioOutputConfig,
    DuplexSessionConfig,
)
from duplex.protocol.audio import decode_audio, read_wav, resample, write_wav

__all__ = ["TalkError", "talk"]

RATE = 24000
IDLE_END_S = 1.0


class TalkError(Exception):
    """A failure of ``duplex talk``; ``status`` is the exit status (2: usage, 1: run time)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def _load_input(args: argparse.Namespace) -> np.ndarray:
    if args.wav:
        try:
            pcm, rate = read_wav(args.wav)
        except Exception as exc:  # unreadable or not audio: a usage error with the reason
            raise TalkError(f"cannot read {args.wav}: {exc}", 2) from exc
        pcm = np.asarray(pcm, dtype=np.float32)
        if pcm.ndim > 1:
            pcm = pcm[:, 0]
        return resample(pcm, rate, RATE) if rate != RATE else pcm
    if args.mic:
        sd = _sounddevice("--mic")
        print(f"recording {args.seconds:.1f} s from the microphone ...", file=sys.stderr)
        rec = sd.rec(int(args.seconds * RATE), samplerate=RATE, channels=1, dtype="float32")
        sd.wait()
        return np.asarray(rec[:, 0], dtype=np.float32)
    raise TalkError("give --wav FILE or --mic", 2)


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


class _Progress:
    def __init__(self, total_s: float, quiet: bool) -> None:
        self.total_s = total_s
        self.quiet = quiet
        self.sent_s = 0.0
        self.heard_ms = 0.0
        self.responses = 0
        self.line_open = False

    def show(self) -> None:
        if self.quiet:
            return
        sys.stderr.write(
            f"\rsent {self.sent_s:5.1f}/{self.total_s:.1f} s | reply audio {self.heard_ms / 1000:5.1f} s"
            f" | responses {self.responses} "
        )
        sys.stderr.flush()
        self.line_open = True

    def say(self, text: str) -> None:
        if self.line_open:
            sys.stderr.write("\n")
            self.line_open = False
        print(text, flush=True)


async def _talk(args: argparse.Namespace, pcm: np.ndarray) -> tuple[list[Any], EventCollector]:
    session = DuplexSessionConfig(
        type="realtime",
        model=args.model,
        output_modalities=["audio"],
        audio=AudioConfig(
            input=AudioInputConfig(format=AudioFormatSpec(type="audio/pcm", rate=RATE)),
            output=AudioOutputConfig(format=AudioFormatSpec(type="audio/pcm", rate=RATE)),
        ),
    )
    collector = EventCollector()
    client = DuplexClient(
        args.url,
        max_responses=100_000,  # the whole reply is saved
        api_key=args.api_key,
        model=args.model,
        session=session,
        collector=collector,
        heartbeat_s=15.0,
    )
    tail = np.zeros(int(RATE * args.tail_ms / 1000), dtype=np.float32)
    progress = _Progress((len(pcm) + len(tail)) / RATE, args.quiet)

    def on_event(event: Any) -> None:
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
            progress.say(f"assistant: {text}" + ("" if status == "completed" else f"  [{status}]"))
        elif kind == "conversation.item.input_audio_transcription.completed":
            progress.say(f"you: {event.transcript}")
        elif kind == "error":
            progress.say(f"error {event.error.code}: {event.error.message}")
        progress.show()

    try:
        await client.open()
    except ClientError as exc:
        raise TalkError(f"cannot open a session at {args.url}: {exc}") from exc
    client.add_listener(on_event)
    model = getattr(client.session, "model", None)
    progress.say(f"session {client.session_id} on model {model!r}")
    caps = client.capabilities
    chunk_ms = args.chunk_ms or getattr(caps, "chunk_period_ms", 0) or 100
    chunk_ms = min(chunk_ms, 200)
    try:
        async with PlaybackReporter(client, SimulatedPlayback(output_format=client.output_format)):
            # While streaming, keep the event queue empty (handles and listeners keep what matters),
            # so a long input never fills it and pauses the receive side.
            drain = asyncio.create_task(_drain(client))
            try:
                await _stream(client, pcm, tail, chunk_ms, args.fast, progress)
            finally:
                drain.cancel()
                with contextlib.suppress(asyncio.CancelledError, ClientClosed):
                    await drain
            collector.mark_input_end()
            if not client.responses and getattr(caps, "supports_client_commit", False):
                await client.commit(create_response=False)
                await client.create_response()
            await _wait_for_replies(client, args.timeout)
    except ClientClosed:
        pass
    finally:
        await client.close()
    if progress.line_open:
        sys.stderr.write("\n")
    return list(client.responses.values()), collector


async def _drain(client: DuplexClient) -> None:
    while True:
        await client.recv()


async def _stream(
    client: DuplexClient, pcm: np.ndarray, tail: np.ndarray, chunk_ms: int, fast: bool, progress: _Progress
) -> None:
    for part in (pcm, tail):
        step = RATE  # report progress once per second of audio
        for start in range(0, len(part), step):
            piece = part[start : start + step]
            await client.stream_pcm(piece, chunk_ms=chunk_ms, realtime=not fast, mark_end=False)
            progress.sent_s += len(piece) / RATE
            progress.show()


async def _wait_for_replies(client: DuplexClient, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        busy = any(not h.finished for h in client.responses.values())
        wait = deadline - loop.time() if busy else min(IDLE_END_S, deadline - loop.time())
        try:
            await client.recv(timeout=max(wait, 0.0))
        except TimeoutError:
            if not busy:
                return


def talk(args: argparse.Namespace) -> int:
    """Run ``duplex talk`` with parsed arguments; returns the exit status."""
    if args.play:
        _sounddevice("--play")  # before the session, not after it: fail at once when it is missing
    pcm = _load_input(args)
    responses, collector = asyncio.run(_talk(args, pcm))
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
    if args.out:
        write_wav(args.out, reply, rate)
        print(f"saved {args.out}")
    if args.play and len(reply):
        sd = _sounddevice("--play")
        sd.play(reply, rate)
        sd.wait()
    return 0
