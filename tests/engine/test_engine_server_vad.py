"""Server VAD inside the engine: real speech (Piper) through the real Silero detector.

The runner decodes each append and runs the session's ``TurnDetector`` on the worker
pool; the session turns its events into ``speech_started`` / ``speech_stopped``, an
automatic commit and, with ``create_response``, a reply.
"""

from __future__ import annotations

import numpy as np
import pytest

from duplex.engine import Engine, EngineConfig
from duplex.plugins.builtin.scripted import ScriptedTurnPlugin
from duplex.protocol.audio import pcm16_encode
from duplex.protocol.ext.commands import DuplexSessionConfig, DuplexSessionUpdate
from duplex.protocol.realtime.commands import InputAudioBufferAppend
from duplex.protocol.realtime.session import ServerVad

from ._vad_speech import silence, speech_16k
from .conftest import types

pytestmark = pytest.mark.timeout(60)


async def _run(create_response: bool) -> list:
    plugin = ScriptedTurnPlugin()
    plugin.load()
    update = DuplexSessionUpdate(
        session=DuplexSessionConfig(
            input_audio_format="pcm16",
            sample_rate_hz=16000,
            turn_detection=ServerVad(silence_duration_ms=300, create_response=create_response),
        )
    )
    audio = np.concatenate([silence(0.3), speech_16k("What time is it in Paris?"), silence(0.8)])
    async with Engine(plugin, EngineConfig(reaper_interval_s=3600)) as engine:
        att = await engine.open(update=update)
        for start in range(0, len(audio), 1600):  # 100 ms appends
            att.submit(InputAudioBufferAppend(audio=pcm16_encode(audio[start : start + 1600])))
        events = []
        want = "response.done" if create_response else "input_audio_buffer.committed"
        while not events or types(events[-1:]) != [want]:
            events.append(await att.next_event())
        return events


async def test_speech_is_detected_committed_and_answered() -> None:
    events = await _run(create_response=True)
    tags = [t for t in types(events) if not t.startswith("response.output_audio")]
    start = tags.index("input_audio_buffer.speech_started")
    assert tags[start : start + 6] == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "conversation.item.added",
        "input_audio_buffer.committed",
        "conversation.item.done",
        "response.created",
    ]
    started = events[types(events).index("input_audio_buffer.speech_started")]
    stopped = events[types(events).index("input_audio_buffer.speech_stopped")]
    assert 0 < started.audio_start_ms < stopped.audio_end_ms and started.item_id == stopped.item_id
    assert events[-1].response.status == "completed"


async def test_create_response_false_commits_without_answering() -> None:
    events = await _run(create_response=False)
    assert "response.created" not in types(events)


class _Heard(ScriptedTurnPlugin):
    """The scripted turn plugin, keeping the audio of every request it answers."""

    def __init__(self, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.heard: list[np.ndarray] = []

    def respond(self, request):  # type: ignore[no-untyped-def]
        self.heard.append(request.pcm)
        return super().respond(request)


async def test_speech_that_barges_in_keeps_its_onset() -> None:
    """The appends before the one whose speech the VAD confirms were dropped as not speech while the
    reply played; their tail (prefix padding plus the VAD's minimum speech) leads the new turn, so
    the interrupting turn holds all of its speech, not a clipped first syllable."""
    plugin = _Heard(ms_per_char=400)  # a reply that lasts: the interruption comes while it plays
    plugin.load()
    update = DuplexSessionUpdate(
        session=DuplexSessionConfig(
            input_audio_format="pcm16",
            sample_rate_hz=16000,
            turn_detection=ServerVad(silence_duration_ms=300, prefix_padding_ms=300),
        )
    )
    question = np.concatenate([silence(0.3), speech_16k("What time is it in Paris?"), silence(0.8)])
    stop = speech_16k("Stop, tell me about London instead.")
    interruption = np.concatenate([silence(0.5), stop, silence(0.8)])
    async with Engine(plugin, EngineConfig(reaper_interval_s=3600)) as engine:
        att = await engine.open(update=update)

        async def send(audio: np.ndarray) -> None:
            for start in range(0, len(audio), 1600):  # 100 ms appends
                att.submit(InputAudioBufferAppend(audio=pcm16_encode(audio[start : start + 1600])))

        async def until(kind: str, count: int = 1) -> None:
            seen = 0
            while seen < count:
                seen += types([await att.next_event()]) == [kind]

        await send(question)
        await until("response.output_audio.delta")
        await send(interruption)
        await until("input_audio_buffer.committed")
        await until("response.created")
        # The plugin is asked for the reply on the model thread, after the session announced it:
        # its first audio says that respond() ran (on a loaded machine response.created came first).
        await until("response.output_audio.delta")
    assert len(plugin.heard) == 2
    heard = plugin.heard[1]
    sent = np.frombuffer(pcm16_encode(stop), dtype="<i2").astype(np.float32) / 32768.0
    onset = int(np.flatnonzero(np.abs(sent) > 0.01)[0])
    starts = np.flatnonzero(np.abs(heard) > 0.01)
    first = int(starts[0])
    assert np.allclose(heard[first : first + 800], sent[onset : onset + 800], atol=1e-4)  # its onset
    assert float(np.abs(heard[:first]).max(initial=0.0)) <= 0.01  # only the silence before it
    assert first >= 1600  # the held lead: at least 100 ms of the silence before the speech
