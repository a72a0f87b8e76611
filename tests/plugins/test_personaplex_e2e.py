"""PersonaPlex end to end: a real server on loopback, a WebSocket client, the tiny model.

The client streams 80 ms frames of PCM16; the engine's frame scheduler steps the
model once per frame period and the audio and transcript deltas come back. They
are compared, byte for byte, with the same plugin stepped directly on the same
frames: the server adds transport, never changes what the model says.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("moshi")
pytest.importorskip("sentencepiece")

import websockets

from clients.collector import event_type
from duplex.engine import EngineConfig
from duplex.plugins.base import SlotInput, SlotOptions
from duplex.plugins.personaplex.plugin import PersonaPlexPlugin
from duplex.protocol import (
    AudioConfig,
    AudioFormat,
    AudioInputConfig,
    BargeIn,
    DuplexInputAudioBufferAppend,
    DuplexSessionConfig,
    DuplexSessionUpdate,
    SessionClose,
    SessionUpdate,
)
from duplex.protocol.audio import decode_audio, encode_audio
from duplex.protocol.realtime.session import ServerVad, SessionConfig
from tests.server.harness import running_server
from tests.server.wire import limited_responses, recv, send, until

FRAMES = 8
FRAME_BYTES = 1920 * 2
PCM16 = AudioFormat("pcm16", 24000)
PERSONA = "you are a helpful assistant"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _frames() -> list[bytes]:
    rng = np.random.default_rng(4)
    return [(0.1 * rng.standard_normal(1920) * 32767).astype("<i2").tobytes() for _ in range(FRAMES)]


def _direct(ckpt, frames: list[bytes], extra_silent: int) -> tuple[bytes, list[str]]:
    """The same plugin stepped directly: audio bytes and the transcript delta of each frame."""
    audio, texts = b"", []
    with PersonaPlexPlugin.from_options(str(ckpt), max_sessions=2) as plugin:
        plugin.open_slot(0, SlotOptions(instructions=PERSONA, voice="VARM0"))
        pcms = [decode_audio(f, PCM16) for f in frames] + [np.zeros(1920, np.float32)] * extra_silent
        for pcm in pcms:
            (out,) = plugin.step([SlotInput(slot=0, epoch=0, pcm=pcm)])
            audio += encode_audio(out.pcm, PCM16)
            texts.append(out.text)
    return audio, texts


async def test_audio_and_transcript_stream_through_the_server_and_match_the_model(ckpt):
    frames = _frames()
    plugin = PersonaPlexPlugin.from_options(str(ckpt), max_sessions=2)
    audio = b""
    transcript = ""
    async with (
        running_server(
            plugin=plugin, engine_config=EngineConfig(max_sessions=2), model_name="personaplex"
        ) as srv,
        websockets.connect(srv.url + "?model=personaplex&autostart=0", proxy=None) as ws,
    ):
        session = DuplexSessionConfig(
            instructions=PERSONA,
            voice="VARM0",
            audio=AudioConfig(input=AudioInputConfig(turn_detection=None)),
        )
        await send(ws, DuplexSessionUpdate(session=session))
        created = await recv(ws)
        assert event_type(created) == "session.created"
        caps = created.session.capabilities
        assert (caps.kind, caps.implementation_level, caps.chunk_period_ms) == (
            "frame",
            "model_native_duplex",
            80,
        )
        assert caps.supports_session_resume and not caps.supports_barge_in and not caps.supports_server_vad
        assert created.resume_token
        for frame in frames:
            await send(ws, DuplexInputAudioBufferAppend(audio=frame))
        while len(audio) < FRAMES * FRAME_BYTES:
            ev = await recv(ws)
            kind = event_type(ev)
            if kind == "response.output_audio.delta":
                audio += ev.delta
            elif kind == "response.output_audio_transcript.delta":
                transcript += ev.delta

        # What the model cannot do is refused with the documented codes; the session goes on.
        await send(ws, BargeIn())
        err, _ = await until(ws, "error")
        assert err.error.code == "barge_in_unsupported"
        vad = SessionUpdate(
            session=SessionConfig(audio=AudioConfig(input=AudioInputConfig(turn_detection=ServerVad())))
        )
        await send(ws, vad)  # the model takes its own turns: the detector is not run, and it says so
        updated, seen = await until(ws, "session.updated", "error")
        assert event_type(updated) == "session.updated" and "error" not in seen
        assert updated.session.audio.input.turn_detection is None  # what is in effect
        warning = await recv(ws)
        assert (event_type(warning), warning.code) == ("session.warning", "turn_detection_model_native")
        await send(ws, DuplexInputAudioBufferAppend(audio=frames[0]))
        await until(ws, "response.output_audio.delta")

    want_audio, texts = _direct(ckpt, frames, extra_silent=4)
    assert audio[: FRAMES * FRAME_BYTES] == want_audio[: FRAMES * FRAME_BYTES]
    # Each frame's transcript delta travels with its audio; frames after ours are padding.
    assert transcript.startswith("".join(texts[: FRAMES - 1]))
    assert "".join(texts).startswith(transcript)


async def _audio_deltas(ws, n: int) -> int:
    """Read until ``n`` audio deltas arrived; return the last journal seq seen."""
    seq = 0
    while n:
        ev = await recv(ws)
        seq = max(seq, getattr(ev, "server_event_seq", None) or 0)
        n -= event_type(ev) == "response.output_audio.delta"
    return seq


async def test_a_resumed_session_continues_with_its_model_state(ckpt):
    plugin = PersonaPlexPlugin.from_options(str(ckpt), max_sessions=2)
    frames = _frames()
    async with running_server(
        plugin=plugin, engine_config=EngineConfig(max_sessions=2), model_name="personaplex"
    ) as srv:
        async with websockets.connect(srv.url + "?model=personaplex", proxy=None) as ws:
            created = await recv(ws)
            sid, token = created.session.id, created.resume_token
            for frame in frames[:3]:
                await send(ws, DuplexInputAudioBufferAppend(audio=frame))
            seq = await _audio_deltas(ws, 3)
        before = int(plugin.generator.offset[0])
        query = f"?model=personaplex&session_id={sid}&resume_token={token}&last_event_seq={seq}"
        async with websockets.connect(srv.url + query, proxy=None) as ws:
            resumed = await recv(ws)
            assert event_type(resumed) == "session.resumed" and resumed.session.id == sid
            for frame in frames[3:6]:
                await send(ws, DuplexInputAudioBufferAppend(audio=frame))
            await _audio_deltas(ws, 3)
        # Not reopened (that would restart the slot at the prompt's end): the conversation went on.
        assert int(plugin.generator.offset[0]) >= before + 3


async def test_max_output_tokens_ends_a_response_at_the_models_own_count(ckpt):
    """PersonaPlex counts its tokens, so a limit applies (no warning): the response that reaches it
    ends ``incomplete`` after the frame that reached it, with every count the plugin reported (per
    heard frame the user's codebooks in, a text token and the agent's codebooks out), the model
    restarts its conversation, and its next frames open a new response. ``session.closed`` carries
    the session's total."""
    plugin = PersonaPlexPlugin.from_options(str(ckpt), max_sessions=2)
    frames = _frames()
    async with (
        running_server(
            plugin=plugin, engine_config=EngineConfig(max_sessions=2), model_name="personaplex"
        ) as srv,
        websockets.connect(srv.url + "?model=personaplex", proxy=None) as ws,
    ):
        created = await recv(ws)
        assert event_type(created) == "session.created"
        cfg = plugin.config
        agent, user = cfg.num_audio_codebooks, int(cfg.lm["n_q"]) - cfg.num_audio_codebooks
        per_frame = 1 + agent
        limit = 2 * per_frame + 1  # reached on the third frame
        prompt = plugin.prompt_for(SlotOptions(instructions=created.session.instructions or ""))
        prompt_text = prompt.phases.count("text")
        dones = await limited_responses(ws, limit, frames)
        for response in dones:
            assert (response.status, response.status_details.reason) == ("incomplete", "max_output_tokens")
            usage = response.usage
            text, audio = (usage.output_token_details[k] for k in ("text_tokens", "audio_tokens"))
            assert usage.output_tokens == text + audio >= limit and audio == agent * text
            assert usage.input_token_details["audio_tokens"] == user * text
            assert usage.input_token_details["text_tokens"] == prompt_text > 0  # each restart's prompt
        assert dones[0].usage.output_tokens == 3 * per_frame  # every frame stepped before it was heard
        await send(ws, SessionClose())
        closed, _ = await until(ws, "session.closed")
        total = closed.usage
        assert total.output_tokens >= sum(r.usage.output_tokens for r in dones)
        assert total.input_token_details["text_tokens"] % prompt_text == 0
