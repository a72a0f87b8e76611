"""Nemotron VoiceChat end to end: a real server on loopback, a WebSocket client, the tiny model.

The client streams 80 ms frames of 16 kHz PCM16 and asks for PCM16 at the
model's own 22,050 Hz, so nothing is resampled: the audio deltas are compared,
byte for byte, with the same plugin stepped directly on the same frames.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import websockets

from clients.collector import event_type
from duplex.engine import EngineConfig
from duplex.plugins.base import SlotInput, SlotOptions
from duplex.plugins.nemotron.plugin import NemotronVoiceChatPlugin
from duplex.protocol import (
    AudioConfig,
    AudioInputConfig,
    BargeIn,
    DuplexInputAudioBufferAppend,
    DuplexSessionConfig,
    DuplexSessionUpdate,
    SessionClose,
    SessionUpdate,
)
from duplex.protocol.realtime.commands import ConversationItemCreate, ConversationItemTruncate
from duplex.protocol.realtime.items import FunctionCallOutputItem
from duplex.protocol.realtime.session import (
    AudioFormatSpec,
    AudioOutputConfig,
    FunctionTool,
    ServerVad,
    SessionConfig,
)
from tests.plugins.nemotron.scripted import CALL, SENTENCE
from tests.server.harness import running_server
from tests.server.wire import limited_responses, recv, send, until

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FRAMES = 10
PERSONA = "you are a helpful assistant"


def _frames(n: int = FRAMES, seed: int = 4) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [(0.1 * rng.standard_normal(1280) * 32767).astype("<i2").tobytes() for _ in range(n)]


def _session(**kw) -> DuplexSessionConfig:
    audio = AudioConfig(
        input=AudioInputConfig(format=AudioFormatSpec(type="audio/pcm", rate=16000), turn_detection=None),
        output=AudioOutputConfig(format=AudioFormatSpec(type="audio/pcm", rate=22050)),
    )
    return DuplexSessionConfig(audio=audio, **kw)


def _direct(ckpt, frames: list[bytes], extra: int) -> tuple[bytes, str]:
    """The plugin stepped directly on the same frames (and ``extra`` silent ones): audio and transcript."""
    audio, text = b"", ""
    with NemotronVoiceChatPlugin.from_options(str(ckpt), max_sessions=2) as plugin:
        plugin.open_slot(0, SlotOptions(instructions=PERSONA))
        pcms = [np.frombuffer(f, "<i2").astype(np.float32) / 32768 for f in frames]
        for pcm in pcms + [np.zeros(1280, np.float32)] * extra:
            (out,) = plugin.step([SlotInput(slot=0, epoch=0, pcm=pcm)])
            if out.pcm is not None:
                audio += out.pcm.astype("<i2").tobytes()
            text += out.text
    return audio, text


async def test_speech_streams_through_the_server_exactly_as_the_model_made_it(nemotron_ckpt):
    frames = _frames()
    plugin = NemotronVoiceChatPlugin.from_options(str(nemotron_ckpt), max_sessions=2)
    audio, transcript = b"", ""
    async with (
        running_server(
            plugin=plugin, engine_config=EngineConfig(max_sessions=2), model_name="nemotron"
        ) as srv,
        websockets.connect(srv.url + "?model=nemotron&autostart=0", proxy=None) as ws,
    ):
        await send(ws, DuplexSessionUpdate(session=_session(instructions=PERSONA)))
        created = await recv(ws)
        assert event_type(created) == "session.created"
        caps = created.session.capabilities
        assert (caps.kind, caps.chunk_period_ms) == ("frame", 80)
        assert (
            caps.supports_session_resume and not caps.supports_barge_in and not caps.supports_audio_truncate
        )
        for frame in frames:
            await send(ws, DuplexInputAudioBufferAppend(audio=frame))
        want, _ = _direct(nemotron_ckpt, frames, extra=0)
        async with asyncio.timeout(30):
            while len(audio) < len(want):
                ev = await recv(ws)
                kind = event_type(ev)
                if kind == "response.output_audio.delta":
                    audio += ev.delta
                elif kind == "response.output_audio_transcript.delta":
                    transcript += ev.delta
    want, want_text = _direct(nemotron_ckpt, frames, extra=4)
    assert len(audio) > 0
    assert want.startswith(audio)
    assert want_text.startswith(transcript)


async def test_what_the_model_cannot_do_is_refused_and_the_session_goes_on(nemotron_ckpt):
    plugin = NemotronVoiceChatPlugin.from_options(str(nemotron_ckpt), max_sessions=2)
    async with (
        running_server(
            plugin=plugin, engine_config=EngineConfig(max_sessions=2), model_name="nemotron"
        ) as srv,
        websockets.connect(srv.url + "?model=nemotron&autostart=0", proxy=None) as ws,
    ):
        await send(ws, DuplexSessionUpdate(session=_session()))
        await until(ws, "session.created")
        await send(ws, BargeIn())
        err, _ = await until(ws, "error")
        assert err.error.code == "barge_in_unsupported"
        await send(ws, ConversationItemTruncate(item_id="item_x", content_index=0, audio_end_ms=0))
        err, _ = await until(ws, "error")
        assert err.error.code == "bad_event" and "truncat" in err.error.message
        vad = SessionUpdate(
            session=SessionConfig(audio=AudioConfig(input=AudioInputConfig(turn_detection=ServerVad())))
        )
        await send(ws, vad)  # the model takes its own turns: the detector is not run, and it says so
        updated, seen = await until(ws, "session.updated", "error")
        assert event_type(updated) == "session.updated" and "error" not in seen
        assert updated.session.audio.input.turn_detection is None  # what is in effect
        warning = await recv(ws)
        assert (event_type(warning), warning.code) == ("session.warning", "turn_detection_model_native")
        for frame in _frames(6):
            await send(ws, DuplexInputAudioBufferAppend(audio=frame))
        await until(ws, "response.output_audio.delta", timeout=30)


async def _audio_deltas(ws, n: int) -> int:
    seq = 0
    while n:
        ev = await recv(ws, timeout=30)
        seq = max(seq, getattr(ev, "server_event_seq", None) or 0)
        n -= event_type(ev) == "response.output_audio.delta"
    return seq


async def test_a_resumed_session_continues_with_its_model_state(nemotron_ckpt):
    plugin = NemotronVoiceChatPlugin.from_options(str(nemotron_ckpt), max_sessions=2)
    frames = _frames(12)
    async with running_server(
        plugin=plugin, engine_config=EngineConfig(max_sessions=2), model_name="nemotron"
    ) as srv:
        async with websockets.connect(srv.url + "?model=nemotron&autostart=0", proxy=None) as ws:
            await send(ws, DuplexSessionUpdate(session=_session()))
            created, _ = await until(ws, "session.created")
            sid, token = created.session.id, created.resume_token
            for frame in frames[:4]:
                await send(ws, DuplexInputAudioBufferAppend(audio=frame))
            seq = await _audio_deltas(ws, 2)
        before = int(plugin.generator.perception.frames.max())
        query = f"?model=nemotron&session_id={sid}&resume_token={token}&last_event_seq={seq}"
        async with websockets.connect(srv.url + query, proxy=None) as ws:
            resumed = await recv(ws)
            assert event_type(resumed) == "session.resumed" and resumed.session.id == sid
            for frame in frames[4:]:
                await send(ws, DuplexInputAudioBufferAppend(audio=frame))
            # The first deltas may be the journal's replay of what was made while detached: read
            # until the model has stepped frames sent after the resume (each step makes a delta).
            # Not reopened (that would restart the slot's stream at frame 0): the count never falls
            # back below where it was, and the conversation goes on from there.
            async with asyncio.timeout(30):
                while (frames_now := int(plugin.generator.perception.frames.max())) < before + 2:
                    assert frames_now >= before
                    await _audio_deltas(ws, 1)


async def test_a_tool_call_round_trip_over_the_wire(scripted_ckpt):
    """The call's events, the client's result injected with the next frames, then the model's speech."""
    plugin = NemotronVoiceChatPlugin.from_options(str(scripted_ckpt), max_sessions=2)
    tool = FunctionTool(name="get_weather", description="the weather", parameters={"type": "object"})
    async with (
        running_server(
            plugin=plugin, engine_config=EngineConfig(max_sessions=2), model_name="nemotron"
        ) as srv,
        websockets.connect(srv.url + "?model=nemotron&autostart=0", proxy=None) as ws,
    ):
        await send(ws, DuplexSessionUpdate(session=_session(tools=[tool])))
        await until(ws, "session.created")
        frames = _frames(60)
        for frame in frames[:8]:
            await send(ws, DuplexInputAudioBufferAppend(audio=frame))
        done, seen = await until(ws, "response.function_call_arguments.done", timeout=30)
        assert (done.name, done.arguments) == CALL
        assert "response.created" in seen and "response.output_item.added" in seen
        await until(ws, "response.done", timeout=30)
        # The prompt told the model about the tool; the scripted weights call it regardless, so this
        # checks the wiring of the tools into the slot, which the engine passes on open.
        assert [t.name for t in plugin._slots[0].options.tools] == ["get_weather"]
        await send(
            ws, ConversationItemCreate(item=FunctionCallOutputItem(call_id=done.call_id, output='{"t": 21}'))
        )
        transcript = ""
        async with asyncio.timeout(30):
            sent = 8
            while SENTENCE not in transcript:
                if sent < len(frames):
                    await send(ws, DuplexInputAudioBufferAppend(audio=frames[sent]))
                    sent += 1
                try:
                    ev = await recv(ws, timeout=0.5)
                except TimeoutError:
                    continue
                if event_type(ev) == "response.output_audio_transcript.delta":
                    transcript += ev.delta
        assert transcript == SENTENCE


async def test_max_output_tokens_ends_a_response_at_the_models_own_count(nemotron_ckpt):
    """Nemotron counts its tokens, so a limit applies (no warning): the response that reaches it
    ends ``incomplete`` after the frame that reached it, with every count the plugin reported (per
    frame one audio embedding in; the text and function tokens and the talker's codebooks out), the
    model restarts its conversation, and its next speech opens a new response. ``session.closed``
    carries the session's total. (The tiny random model speaks from its first frame.)"""
    plugin = NemotronVoiceChatPlugin.from_options(str(nemotron_ckpt), max_sessions=2)
    async with (
        running_server(
            plugin=plugin, engine_config=EngineConfig(max_sessions=2), model_name="nemotron"
        ) as srv,
        websockets.connect(srv.url + "?model=nemotron", proxy=None) as ws,
    ):
        created = await recv(ws)
        assert event_type(created) == "session.created"
        q = plugin.config.codec.num_quantizers
        per_frame = 2 + q  # text and function tokens, the codebooks
        limit = 2 * per_frame + 1  # reached on the third frame
        prompt = len(plugin.prompt_for(SlotOptions(instructions=created.session.instructions or "")))
        dones = await limited_responses(ws, limit, _frames(12))
        for response in dones:
            assert (response.status, response.status_details.reason) == ("incomplete", "max_output_tokens")
            usage = response.usage
            text, audio = (usage.output_token_details[k] for k in ("text_tokens", "audio_tokens"))
            heard = usage.input_token_details["audio_tokens"]  # one embedding a frame
            assert usage.output_tokens == text + audio >= limit
            assert audio == q * heard and text == 2 * heard  # no tool result was fed
            assert usage.input_token_details["text_tokens"] == prompt  # each restart's prompt
        assert dones[0].usage.output_tokens == 3 * per_frame
        await send(ws, SessionClose())
        closed, _ = await until(ws, "session.closed", timeout=30)
        total = closed.usage
        assert total.output_tokens >= sum(r.usage.output_tokens for r in dones)
        assert total.input_token_details["text_tokens"] % prompt == 0
