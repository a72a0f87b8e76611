"""The default plugin end to end: a real server on loopback, server VAD, spoken turns over a WebSocket.

The user's voice is Piper with its randomness off (the same words always sound
the same), streamed as 24 kHz PCM16 in 40 ms appends at real-time pacing, like a
microphone. The server's VAD finds the turns, Whisper hears them, the reply is
spoken by Piper and comes back as audio deltas, which the same Whisper
transcribes once more to check what was said.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
import soxr
import websockets

from clients.collector import event_type
from clients.pacing import Pacer
from duplex.engine import EngineConfig
from duplex.plugins.default.asr import WhisperTranscriber
from duplex.plugins.default.plugin import DefaultPlugin, DefaultPluginConfig
from duplex.plugins.default.reply import echo_text
from duplex.plugins.default.tts import PiperSpeaker
from duplex.protocol import (
    ConversationItemCreate,
    ConversationItemTruncate,
    InputAudioBufferAppend,
    InputTextPart,
    MessageItem,
    ResponseCancel,
    ResponseCreate,
    SessionHeartbeat,
)
from duplex.protocol.audio import decode_audio, encode_audio
from duplex.protocol.formats import AudioFormat
from duplex.protocol.realtime.responses import ResponseCreateParams
from tests.plugins.default_speech import spoken
from tests.plugins.test_default_reply import ChatStub
from tests.server.harness import running_server
from tests.server.wire import recv, send

PCM16 = AudioFormat("pcm16", 24000)
APPEND_SAMPLES = 960  # 40 ms at 24 kHz
TRAILING_SILENCE = 21600  # the 900 ms after the words of a ``voice`` (``spoken``)
QUESTION = "What time is it in Paris?"
INTERRUPTION = "Stop, tell me about London instead."
LONG_REPLY = (
    "Sure, let me check. Paris is one hour ahead of London. It is noon there now. "
    "The weather is mild and sunny. Many museums stay open late tonight. The metro runs until one. "
    "Cafes are busy at lunch time. The river boats leave every half hour. That is all I know."
)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


@pytest.fixture(scope="module")
def voice(models: tuple[WhisperTranscriber, PiperSpeaker]) -> Callable[[str], np.ndarray]:
    """Text -> the user saying it (``spoken``)."""
    _, tts = models
    return lambda text: spoken(tts, text)


class Transcript:
    """Every event one socket received, in order, with waits on what arrives, and the loop time each
    one was read at (``times``; the in-process server runs on the same loop and clock)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.events: list[Any] = []
        self.times: list[float] = []
        self._changed = asyncio.Condition()

    async def read_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            event = await recv(self.ws, timeout=60)
            async with self._changed:
                self.events.append(event)
                self.times.append(loop.time())
                self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[list[Any]], bool], timeout: float = 30) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: predicate(self.events))

    def types(self) -> list[str]:
        return [event_type(e) for e in self.events]

    def of(self, kind: str) -> list[Any]:
        return [e for e in self.events if event_type(e) == kind]

    def count(self, kind: str, n: int = 1) -> Callable[[list[Any]], bool]:
        """A predicate: at least ``n`` events of ``kind`` arrived."""
        return lambda events: sum(event_type(e) == kind for e in events) >= n

    def index(self, kind: str, start: int = 0) -> int:
        return next(i for i, t in enumerate(self.types()) if t == kind and i >= start)


@contextlib.asynccontextmanager
async def sessions(plugin: DefaultPlugin, n: int) -> AsyncIterator[list[Transcript]]:
    """A server around ``plugin`` and ``n`` connected sessions (server VAD, the default) reading events."""
    config = EngineConfig(max_sessions=2)
    async with (
        running_server(plugin=plugin, engine_config=config, model_name="default") as srv,
        contextlib.AsyncExitStack() as stack,
    ):
        logs: list[Transcript] = []
        readers: list[asyncio.Task[None]] = []
        try:
            for _ in range(n):
                connecting = websockets.connect(srv.url + "?model=default", proxy=None)
                ws = await stack.enter_async_context(connecting)
                log = Transcript(ws)
                logs.append(log)
                readers.append(asyncio.create_task(log.read_forever()))
                await log.wait_for(lambda events: bool(events))
                assert event_type(log.events[0]) == "session.created"
            yield logs
        finally:
            for reader in readers:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader


@contextlib.asynccontextmanager
async def session(plugin: DefaultPlugin) -> AsyncIterator[Transcript]:
    """A server around ``plugin`` and one connected session (server VAD, the default) reading events."""
    async with sessions(plugin, 1) as (log,):
        yield log


def typed(text: str) -> ConversationItemCreate:
    """A typed user message."""
    return ConversationItemCreate(item=MessageItem(role="user", content=[InputTextPart(text=text)]))


async def speak(ws: Any, pcm: np.ndarray, *, realtime: bool = True) -> None:
    """Stream ``pcm`` (24 kHz) as 40 ms appends, at real-time pacing unless told otherwise."""
    pacer = Pacer(APPEND_SAMPLES / 24000, realtime=realtime)
    for start in range(0, len(pcm), APPEND_SAMPLES):
        await pacer.wait_next()
        await send(ws, InputAudioBufferAppend(audio=encode_audio(pcm[start : start + APPEND_SAMPLES], PCM16)))


def response_audio(events: list[Any]) -> tuple[list[bytes], list[str]]:
    """The reply's audio and text per chunk of the model's reply. The server paces a chunk out in
    pieces (audio deltas); the chunk's transcript follows its first piece, and the chunk runs until
    the piece that the next transcript follows."""
    pieces: list[bytes] = []
    texts: dict[int, str] = {}  # piece index -> the transcript of the chunk it begins
    for event in events:
        kind = event_type(event)
        if kind == "response.output_audio.delta":
            pieces.append(event.delta)
        elif kind == "response.output_audio_transcript.delta" and pieces:
            texts[len(pieces) - 1] = texts.get(len(pieces) - 1, "") + event.delta
    starts = sorted(set(texts) | ({0} if pieces else set()))
    bounds = [*starts, len(pieces)]
    audio = [b"".join(pieces[a:b]) for a, b in itertools.pairwise(bounds)]
    return audio, [texts.get(a, "") for a in starts]


def plugin_with(models: tuple[WhisperTranscriber, PiperSpeaker], **options: Any) -> DefaultPlugin:
    """The default plugin on the shared models; the echo reply unless ``options`` name another
    (it answers at once and exactly, so what the tests see is the loop's own behaviour)."""
    asr, tts = models
    config = DefaultPluginConfig(**{"reply": "echo", "max_sessions": 2, "warm_up": False, **options})
    return DefaultPlugin(config, asr=asr, tts=tts)


async def test_a_spoken_question_is_transcribed_and_the_echo_reply_says_it_back(
    models: tuple[WhisperTranscriber, PiperSpeaker], voice: Callable[[str], np.ndarray]
) -> None:
    async with session(plugin_with(models)) as log:
        await speak(log.ws, voice(QUESTION))
        await log.wait_for(log.count("response.done"))

    kinds = [k for k in log.types() if not k.startswith(("overlap.", "rate_limits"))]
    assert kinds[:7] == [
        "session.created",
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "conversation.item.added",
        "input_audio_buffer.committed",
        "conversation.item.done",
        "response.created",
    ]
    (heard,) = log.of("conversation.item.input_audio_transcription.completed")
    assert heard.transcript == QUESTION
    assert kinds.index("conversation.item.input_audio_transcription.completed") < kinds.index(
        "response.output_audio.delta"
    )
    (done,) = log.of("response.done")
    assert done.response.status == "completed"
    audio, texts = response_audio(log.events)
    assert "".join(texts) == echo_text(QUESTION)
    pcm = decode_audio(b"".join(audio), PCM16)
    asr, _ = models
    said = asr.transcribe(soxr.resample(pcm, 24000, 16000).astype(np.float32))
    assert words(said) == words(echo_text(QUESTION))


async def test_speaking_while_it_answers_cancels_at_once_and_history_keeps_only_what_was_heard(
    models: tuple[WhisperTranscriber, PiperSpeaker], voice: Callable[[str], np.ndarray], chat: ChatStub
) -> None:
    chat.replies = [LONG_REPLY, "London is calm."]
    chat.slow_after = 5  # "Sure, let me check. Paris" at once, then a word every 100 ms ...
    chat.hold_after = len(LONG_REPLY.split()) - 1  # ... and the reply cannot end before the test says so
    plugin = plugin_with(models, reply="openai", reply_url=chat.url)
    async with session(plugin) as log:
        await speak(log.ws, voice(QUESTION))
        await log.wait_for(lambda events: len(response_audio(events)[0]) >= 2)

        # The user speaks again while the answer is still being generated and played.
        interrupting = asyncio.create_task(speak(log.ws, voice(INTERRUPTION)))
        await log.wait_for(log.count("input_audio_buffer.speech_started", 2))
        first_response_end = log.index("response.output_audio.delta")
        speech_started = log.index("input_audio_buffer.speech_started", first_response_end)
        # What the listener heard when it stopped playback: all of the first audio chunk, half of the second.
        audio, texts = response_audio(log.events)
        chunk_ms = [len(a) / 2 / 24 for a in audio[:2]]
        heard_ms = int(chunk_ms[0] + chunk_ms[1] / 2)
        (item,) = (e.item for e in log.of("response.output_item.added"))
        await send(log.ws, ConversationItemTruncate(item_id=item.id, audio_end_ms=heard_ms))
        await interrupting
        await log.wait_for(log.count("response.done", 2))

    first_done = log.index("response.done")
    assert log.events[first_done].response.status == "cancelled"
    between = log.types()[speech_started:first_done]
    assert "response.output_audio.delta" not in between  # no audio after the VAD decision
    first_id = log.events[first_done].response.id
    late = [e for e in log.events[first_done:] if getattr(e, "response_id", None) == first_id]
    assert [event_type(e) for e in late if "delta" in event_type(e)] == []
    chat.release.set()  # the stub may go on; the stream it writes to must be closed by now
    assert chat.aborted.wait(10)  # the reply stream was closed: generation stopped

    transcripts = [e.transcript for e in log.of("conversation.item.input_audio_transcription.completed")]
    assert transcripts[0] == QUESTION and words(transcripts[1]) == words(INTERRUPTION)
    second = chat.requests[1]["messages"]
    assert second[-3:] == [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": texts[0]},  # heard: the first chunk only
        {"role": "user", "content": transcripts[1]},
    ]
    assert log.events[log.index("response.done", first_done + 1)].response.status == "completed"


async def test_a_client_that_never_truncates_cuts_a_paced_reply_by_speaking_and_the_history_is_what_it_heard(
    models: tuple[WhisperTranscriber, PiperSpeaker], voice: Callable[[str], np.ndarray], chat: ChatStub
) -> None:
    # The reply is made at once, several seconds of speech; the server paces it out at playback
    # speed. Once a second of it has arrived the user speaks over it; the client never truncates or acks.
    chat.replies = [LONG_REPLY, "London is calm."]
    plugin = plugin_with(models, reply="openai", reply_url=chat.url)
    async with session(plugin) as log:
        question = voice(QUESTION)
        assert not question[-TRAILING_SILENCE:].any()  # every word is sent before asked_at
        await speak(log.ws, question[:-TRAILING_SILENCE])
        asked_at = asyncio.get_running_loop().time()  # all speech sent: the reply starts later, on this clock
        await speak(log.ws, question[-TRAILING_SILENCE:])
        await log.wait_for(lambda events: len(b"".join(response_audio(events)[0])) / 2 / 24 >= 1000)
        await speak(log.ws, voice(INTERRUPTION))
        await log.wait_for(log.count("response.done", 2))

    first_done = log.index("response.done")
    done = log.events[first_done]
    assert done.response.status == "cancelled" and done.response.status_details.reason == "turn_detected"
    speech_started = log.index("input_audio_buffer.speech_started", log.index("response.output_audio.delta"))
    assert "response.output_audio.delta" not in log.types()[speech_started:first_done]
    audio, texts = response_audio(log.events[:first_done])
    assert len(b"".join(audio)) / 2 / 24 >= 1000  # what the user waited for before speaking
    # Paced: a piece of audio goes out once what was sent before it is less than the lead ahead of
    # the listener, whose clock starts with the first piece, after the question. So each delta is
    # read no sooner than that; a loaded machine only makes it later. (1e-6 s: the pacer's own
    # allowance for clock arithmetic.)
    lead_s = EngineConfig().output_lead_ms / 1000
    sent_s = 0.0
    for event, read_at in zip(log.events[:first_done], log.times[:first_done], strict=True):
        if event_type(event) == "response.output_audio.delta":
            assert read_at - asked_at >= sent_s - lead_s - 1e-6, (sent_s, read_at - asked_at)
            sent_s += len(event.delta) / 2 / 24000
    # Cut: not all of the reply's text went out. (How soon the cut comes after the user starts to
    # speak is bench.latency's barge-in figure.)
    assert LONG_REPLY.startswith("".join(texts)) and len("".join(texts)) < len(LONG_REPLY)
    # The history the model reads next holds the reply's sentences the listener heard to their end.
    heard = chat.requests[1]["messages"][-2]
    assert heard["role"] == "assistant"
    assert heard["content"] and LONG_REPLY.startswith(heard["content"])
    assert len(heard["content"]) < len("".join(texts)) <= len(LONG_REPLY)


async def test_silence_and_noise_never_start_a_turn(models: tuple[WhisperTranscriber, PiperSpeaker]) -> None:
    rng = np.random.default_rng(11)
    t = np.arange(48000) / 24000
    sounds = np.concatenate(
        [
            np.zeros(48000),  # 2 s of silence
            rng.normal(0.0, 0.05, 48000),  # white noise
            0.3 * np.sin(2 * np.pi * 100 * t),  # mains hum
            np.cumsum(rng.normal(0.0, 0.01, 48000)) * 0.05,  # rumble
        ]
    ).astype(np.float32)
    async with session(plugin_with(models)) as log:
        await speak(log.ws, sounds, realtime=False)  # VAD runs on audio time: no need to wait
        await send(log.ws, SessionHeartbeat())
        await log.wait_for(log.count("session.heartbeat_ack"))
    assert log.types() == ["session.created", "session.heartbeat_ack"]


async def test_a_typed_message_is_answered_aloud_with_its_transcript(
    models: tuple[WhisperTranscriber, PiperSpeaker],
) -> None:
    message = MessageItem(role="user", content=[InputTextPart(text="Good morning")])
    async with session(plugin_with(models)) as log:
        await send(log.ws, ConversationItemCreate(item=message))
        await send(log.ws, ResponseCreate())
        await log.wait_for(log.count("response.done"))
    assert log.of("conversation.item.input_audio_transcription.completed") == []
    (done,) = log.of("response.done")
    assert done.response.status == "completed"
    audio, texts = response_audio(log.events)
    assert "".join(texts) == "You said: Good morning." and all(audio)


async def test_a_reply_ends_incomplete_at_the_responses_token_limit_with_every_word_up_to_it_spoken(
    models: tuple[WhisperTranscriber, PiperSpeaker],
) -> None:
    async with session(plugin_with(models)) as log:
        await send(log.ws, typed("Good morning"))
        await send(log.ws, ResponseCreate(response=ResponseCreateParams(max_output_tokens=3)))
        await log.wait_for(log.count("response.done"))
    (done,) = log.of("response.done")
    assert (done.response.status, done.response.status_details.reason) == ("incomplete", "max_output_tokens")
    assert done.response.usage.output_tokens == 3  # the echo strategy's words: "You said: Good"
    audio, texts = response_audio(log.events)
    assert "".join(texts) == "You said: Good" and all(audio)


async def test_another_session_is_answered_while_a_long_typed_reply_is_spoken_and_a_cancel_stops_it(
    models: tuple[WhisperTranscriber, PiperSpeaker],
) -> None:
    """3,000 typed characters without punctuation are spoken piece by piece; the model thread is
    shared, so another session's short answer is complete long before, and a cancel ends it."""
    paragraph = ("many blue cars drive home slowly after the long day " * 60)[:3000]
    async with sessions(plugin_with(models), 2) as (talker, other):
        await send(talker.ws, typed(paragraph))
        await send(talker.ws, ResponseCreate())
        await talker.wait_for(talker.count("response.output_audio.delta"))
        await send(other.ws, typed("Good morning"))
        await send(other.ws, ResponseCreate())
        await other.wait_for(other.count("response.done"))
        assert talker.of("response.done") == []  # still speaking the paragraph
        await send(talker.ws, ResponseCancel())
        await talker.wait_for(talker.count("response.done"))

    (done,) = other.of("response.done")
    assert done.response.status == "completed"
    assert "".join(response_audio(other.events)[1]) == "You said: Good morning."
    (cancelled,) = talker.of("response.done")
    assert cancelled.response.status == "cancelled"
    after = talker.events[talker.index("response.done") + 1 :]
    assert [e for e in after if getattr(e, "response_id", None) == cancelled.response.id] == []
    audio, texts = response_audio(talker.events)
    assert all(audio) and all(0 < len(text) <= 120 for text in texts)
    assert echo_text(paragraph).startswith("".join(texts))


async def test_a_typed_message_too_long_or_with_a_nul_fails_its_response_and_the_session_goes_on(
    models: tuple[WhisperTranscriber, PiperSpeaker],
) -> None:
    async with session(plugin_with(models, max_input_text_chars=100)) as log:
        await send(log.ws, typed("a" * 101))
        await send(log.ws, ResponseCreate())
        await log.wait_for(log.count("response.done"))
        # A NUL never reaches the plugin: the codec refuses the item itself (nothing is added).
        await send(log.ws, typed("Good\x00morning"))
        await log.wait_for(log.count("error", 2))
        await send(log.ws, typed("Good morning"))
        await send(log.ws, ResponseCreate())
        await log.wait_for(log.count("response.done", 2))

    refused = ["conversation.item.added", "conversation.item.done", "response.created"]
    refused += ["error", "response.done"]
    kinds = [k for k in log.types() if k != "rate_limits.updated"]
    assert kinds[1:7] == [*refused, "error"]
    assert [(e.error.code, e.error.param) for e in log.of("error")] == [
        ("invalid_item", None),
        ("bad_event", "item.content[0].text"),
    ]
    assert [d.response.status for d in log.of("response.done")] == ["failed", "completed"]
    assert "".join(response_audio(log.events)[1]) == "You said: Good morning."
