"""``duplex talk --mic --play``: a full-duplex conversation with the embedded default model (server VAD,
Whisper, a reply, Piper) on a real server on loopback. The user is Piper too, spoken into a
``FakeSoundDevice`` microphone at 48 kHz in real time; the fake speaker records what it was asked to
play. Speaking over the reply stops it at once, truncates it where it was heard, and the history the
model sees next holds only that part.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from clients import event_type
from clients.talk import StopSignal, talk
from duplex.cli import build_parser, main
from duplex.engine import EngineConfig
from duplex.protocol import AudioFormat
from duplex.protocol.audio import decode_audio
from tests.clients.test_talk_fake_sounddevice import FakeSoundDevice
from tests.clients.test_talk_play import read_events, until
from tests.plugins.default_speech import load_models, spoken
from tests.server.harness import running_server

if TYPE_CHECKING:
    from duplex.plugins.default.asr import WhisperTranscriber
    from duplex.plugins.default.plugin import DefaultPlugin
    from duplex.plugins.default.tts import PiperSpeaker
    from tests.plugins.test_default_reply import ChatStub

pytestmark = pytest.mark.timeout(90)

PCM16 = AudioFormat("pcm16", 24000)
QUESTION = "What time is it in Paris?"
INTERRUPTION = "Tell me about London instead."
LONG_REPLY = (
    "Sure, let me check. Paris is one hour ahead of London. It is noon there now. "
    "The weather is mild and sunny. Many museums stay open late tonight. That is all I know."
)


@pytest.fixture(scope="module")
def models() -> tuple[WhisperTranscriber, PiperSpeaker]:
    """The default plugin's models, loaded once (``default_speech.load_models``)."""
    return load_models()


@pytest.fixture(scope="module")
def voice(models: tuple[WhisperTranscriber, PiperSpeaker]) -> Callable[[str], np.ndarray]:
    """Text -> the user saying it (``tests.plugins.test_default_e2e.spoken``)."""
    _, tts = models
    return lambda text: spoken(tts, text)


@pytest.fixture
def chat() -> Any:
    from tests.plugins.test_default_reply import ChatStub

    stub = ChatStub()
    yield stub
    stub.release.set()
    stub.close()


@pytest.fixture
def sd(monkeypatch: pytest.MonkeyPatch) -> FakeSoundDevice:
    fake = FakeSoundDevice(input_rate=48000, output_rate=24000)
    monkeypatch.setitem(sys.modules, "sounddevice", fake)
    return fake


def default_plugin(models: tuple[WhisperTranscriber, PiperSpeaker], **options: Any) -> DefaultPlugin:
    from duplex.plugins.default.plugin import DefaultPlugin, DefaultPluginConfig

    asr, tts = models
    config = DefaultPluginConfig(**{"reply": "echo", "max_sessions": 2, "warm_up": False, **options})
    return DefaultPlugin(config, asr=asr, tts=tts)


def nonzero(pcm: np.ndarray) -> np.ndarray:
    return pcm[pcm != 0.0]


def reply_audio(events: list[Any], response_id: str) -> tuple[np.ndarray, list[tuple[float, str]]]:
    """A response's audio, and its text marks: per chunk of the model's reply, where its audio ends
    (ms) and its transcript. The server paces a chunk out in pieces; the chunk's transcript follows
    its first piece, and the chunk runs until the piece that the next transcript follows."""
    pcm: list[np.ndarray] = []
    ends: list[float] = []  # per audio delta, where it ends
    starts: dict[int, str] = {}  # audio delta index -> the transcript of the chunk it begins
    end_ms = 0.0
    for event in events:
        if getattr(event, "response_id", None) != response_id:
            continue
        kind = event_type(event)
        if kind == "response.output_audio.delta":
            pcm.append(decode_audio(event.delta, PCM16))
            end_ms += len(pcm[-1]) / 24
            ends.append(end_ms)
        elif kind == "response.output_audio_transcript.delta" and ends:
            starts[len(ends) - 1] = starts.get(len(ends) - 1, "") + event.delta
    firsts = sorted(starts)
    marks = [
        (ends[(firsts[k + 1] if k + 1 < len(firsts) else len(ends)) - 1], starts[i])
        for k, i in enumerate(firsts)
    ]
    return (np.concatenate(pcm) if pcm else np.zeros(0, np.float32)), marks


# slow: 6.5 s of real-time speech; the default model hearing and answering a spoken question is
# tests/plugins/test_default_e2e.py's, duplex talk playing a reply and acking it test_talk_play's
@pytest.mark.slow
async def test_a_spoken_question_is_transcribed_and_the_reply_is_played(
    models: tuple[WhisperTranscriber, PiperSpeaker],
    voice: Callable[[str], np.ndarray],
    sd: FakeSoundDevice,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    question = voice(QUESTION)
    sd.say(question, 24000)
    events_out = tmp_path / "events.jsonl"
    config = EngineConfig(max_sessions=2)
    async with running_server(
        plugin=default_plugin(models), engine_config=config, model_name="default"
    ) as srv:
        argv = ["talk", "--url", srv.url, "--mic", "--play", "--seconds", f"{len(question) / 24000:.2f}"]
        status = await asyncio.to_thread(
            main, [*argv, "--tail-ms", "0", "--events-out", str(events_out), "--quiet"]
        )
    assert status == 0
    out = capsys.readouterr().out
    assert f"you: {QUESTION}\n" in out
    assert f"assistant: You said: {QUESTION}\n" in out
    events = read_events(events_out)
    (done,) = [e for e in events if event_type(e) == "response.done"]
    assert done.response.status == "completed"
    sent, _ = reply_audio(events, done.response.id)
    played = sd.played()
    assert len(sent) > 24000 and np.array_equal(nonzero(played), nonzero(sent))
    acks = [e for e in events if event_type(e) == "playback.acknowledged"]
    # All of the audio that came was played and acknowledged (the ledger's ``sent_ms`` counts the
    # reply at Piper's 22.05 kHz, before the server resampled it to 24 kHz: the two durations differ
    # by less than one output sample, the resampled length's rounding).
    assert acks[-1].played_ms == acks[-1].playback.played_ms == pytest.approx(len(sent) / 24, abs=1 / 24)
    assert [(s.kind, s.samplerate, s.closed) for s in sd.streams] == [
        ("output", 24000.0, True),
        ("input", 48000.0, True),
    ]


# slow: 8 s of real-time speech; the server cutting a reply at the user's speech and the history
# keeping what was heard is tests/plugins/test_default_e2e.py's, the client flushing its playback
# on a barge-in and truncating what was played tests/clients/test_talk_audio_device.py's
@pytest.mark.slow
async def test_speaking_over_the_reply_stops_it_and_the_history_keeps_what_was_heard(
    models: tuple[WhisperTranscriber, PiperSpeaker],
    voice: Callable[[str], np.ndarray],
    sd: FakeSoundDevice,
    chat: ChatStub,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    chat.replies = [LONG_REPLY, "London is calm."]
    chat.slow_after = 5  # "Sure, let me check. Paris" at once, then a word every 100 ms ...
    chat.hold_after = len(LONG_REPLY.split()) - 1  # ... and the reply cannot end on its own
    sd.say(voice(QUESTION), 24000)
    sd.say_when_played(1500, voice(INTERRUPTION), 24000)  # the user talks over the reply
    events_out = tmp_path / "events.jsonl"
    plugin = default_plugin(models, reply="openai", reply_url=chat.url)
    stop = StopSignal()
    config = EngineConfig(max_sessions=2)
    async with running_server(plugin=plugin, engine_config=config, model_name="default") as srv:
        args = build_parser().parse_args(
            ["talk", "--url", srv.url, "--mic", "--play", "--events-out", str(events_out), "--quiet"]
        )
        running = asyncio.create_task(asyncio.to_thread(talk, args, stop))
        await until(lambda: len(chat.requests) >= 2 or running.done())
        stop.set()  # what Ctrl-C does
        status = await running
    assert status == 0
    events = read_events(events_out)
    kinds = [event_type(e) for e in events]
    assert "error" not in kinds
    assert kinds.count("input_audio_buffer.speech_started") == 2
    first = next(e for e in events if event_type(e) == "response.done")
    assert first.response.status == "cancelled"

    # The reply was cut where the speaker was: the truncation is at the played position ...
    truncated = [e for e in events if event_type(e) == "conversation.item.truncated"]
    assert truncated and truncated[0].item_id == first.response.output[0].id
    cut_ms = truncated[0].audio_end_ms
    sent, marks = reply_audio(events, first.response.id)
    played = nonzero(sd.played())
    voiced = np.flatnonzero(sent)
    heard = 0  # how many of the reply's non-zero samples came out of the speaker, in order
    while heard < min(len(voiced), len(played)) and played[heard] == sent[voiced[heard]]:
        heard += 1
    assert 0 < heard < len(voiced)  # some of it was played, not all
    low = voiced[heard - 1] + 1  # the device consumed at least this many samples of the reply ...
    high = voiced[heard]  # ... and not the next non-zero one
    assert low // 24 <= cut_ms <= high // 24
    # ... and nothing of it was played after the cut: the buffer was flushed.
    second = [e for e in events if event_type(e) == "response.done"][1:]
    after = nonzero(reply_audio(events, second[0].response.id)[0]) if second else np.zeros(0, np.float32)
    assert np.array_equal(played[heard:], after[: len(played) - heard])

    # The model's next request holds what the listener heard, not what was generated (the server
    # paces the reply at playback speed, so little more than that was even sent).
    heard_text = "".join(text for end_ms, text in marks if end_ms <= cut_ms)
    assert heard_text and len(heard_text) < len(LONG_REPLY)
    messages = chat.requests[1]["messages"]
    assert messages[-3] == {"role": "user", "content": QUESTION}
    assert messages[-2] == {"role": "assistant", "content": heard_text}

    out = capsys.readouterr().out
    assert f"you: {QUESTION}\n" in out and f"(barge-in: reply stopped after {cut_ms / 1000:.2f} s)" in out
    assert "stopping: closing the session" in out
    assert event_type(events[-1]) == "session.closed" and events[-1].reason == "client_close"
    assert all(s.closed and not s.active for s in sd.streams)
