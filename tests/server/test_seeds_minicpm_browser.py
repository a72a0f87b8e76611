"""The seeds' MiniCPM browser client's wire sequence against MiniCPM-o (tiny checkpoint) through a server.

The browser (vLLM-Omni's MiniCPM-o realtime web example) connects with
``?duplex=1&model=openbmb/MiniCPM-o-4_5&autostart=0``, opens its session with a ``session.update``
carrying its reference voice as a data URI, streams 200 ms of 16 kHz pcm16 per append with a camera
frame (``video_frames``) on the append that closes each second, acknowledges what it played with
``playback.ack`` on ``item_<response_id>`` and closes with ``session.close``. It reads
``response.listen`` as ``{response: {status: "listening", metadata: {model_listen}}}``, the
``metadata`` of ``response.speak`` and of every audio delta, and ``playback.acknowledged``'s
``event``. The tiny checkpoints are scripted to speak ("hello", then the end of the turn) or to
listen, unit by unit.
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")

from duplex.engine import EngineConfig
from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin
from duplex.protocol.audio import encode_wav
from tests.plugins.minicpmo.conftest import LISTEN, SPEAK_AND_END, jpeg
from tests.server.harness import running_server
from tests.server.seeds_wire import SeedsClient, pcm16, validate_ga

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODEL = "openbmb/MiniCPM-o-4_5"
APPEND_MS = 200  # the browser's SEND_INTERVAL_MS
RESPONSE = [
    "response.created",
    "conversation.item.added",
    "response.output_item.added",
    "response.content_part.added",
    "response.speak",
    "response.output_audio.delta",
    "response.output_audio_transcript.delta",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
    "rate_limits.updated",
]


def browser_session() -> dict[str, Any]:
    """The browser's ``session.update`` (its ``initialMessages``), with a reference voice."""
    voice = 0.1 * np.sin(np.arange(8000) * 2 * np.pi * 220 / 16000)
    ref_audio = "data:audio/wav;base64," + base64.b64encode(encode_wav(voice, 16000)).decode()
    return {
        "modalities": ["audio", "text"],
        "voice": "default",
        "playback_commit_policy": "ack_only",
        "extra_body": {"auto_response": True},
        "ref_audio": ref_audio,
        "instructions": "Streaming Omni Conversation.",
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny MiniCPM-o checkpoint (what ``duplex tiny-checkpoint minicpmo_4_5 DIR`` writes),
    scripted to speak "hello" and end its turn, or to listen, every unit."""
    from duplex.plugins.minicpmo.testing import script_checkpoint

    base = tmp_path_factory.mktemp("minicpmo") / "tiny"
    MiniCPMOPlugin.write_tiny_checkpoint(str(base), seed=0)
    scripted = {}
    for name, script in (("speak", SPEAK_AND_END), ("listen", LISTEN)):
        root = tmp_path_factory.mktemp("minicpmo-" + name) / "ckpt"
        shutil.copytree(base, root)
        scripted[name] = script_checkpoint(root, script)
    return scripted


def plugin(path: Any) -> MiniCPMOPlugin:
    return MiniCPMOPlugin.from_options(
        str(path), max_sessions=2, context_tokens=1024, window_high_tokens=700, window_low_tokens=400
    )


async def open_and_stream(client: SeedsClient, seconds: int) -> None:
    """The browser's start: ``session.update``, then 200 ms appends, a JPEG on each second's last."""
    await client.send({"type": "session.update", "session": browser_session()})
    assert [(await client.next())["type"] for _ in range(2)] == ["session.created", "session.updated"]
    audio = pcm16(1000 * seconds, level=0.05)
    step = 16000 * APPEND_MS // 1000 * 2
    for n, start in enumerate(range(0, len(audio), step), start=1):
        frame = base64.b64encode(jpeg((40 * n % 255, 120, 200))).decode()
        extra = {"video_frames": [frame]} if n % (1000 // APPEND_MS) == 0 else {}
        await client.append(audio[start : start + step], **extra)


#: A turn of one unit: a second of speech codes after the three silence codes a turn starts with
#: (120 ms at 25 codes a second), as upstream's duplex loop starts every turn.
ONE_UNIT_TURN_MS = 1120


async def test_the_minicpm_browser_sequence_against_minicpmo(checkpoints):
    model = plugin(checkpoints["speak"])
    engine_config = EngineConfig(max_sessions=2)
    async with (
        running_server(plugin=model, engine_config=engine_config, model_name=MODEL) as srv,
        SeedsClient(srv.url, MODEL) as client,
    ):
        await open_and_stream(client, seconds=1)
        done = await client.until("response.done")
        await client.until("rate_limits.updated")
        rid = done["response_id"]
        start = next(i for i, e in enumerate(client.events) if e["type"] == "response.created")
        first = client.events[start : start + len(RESPONSE)]
        assert [e["type"] for e in first] == RESPONSE
        created, speak, delta, transcript = first[0], first[4], first[5], first[6]
        assert created["response_id"] == created["response"]["id"] == rid
        assert speak["item_id"] == delta["item_id"] == f"item_{rid}"
        assert speak["metadata"] == {
            "session_id": speak["metadata"]["session_id"],
            "epoch": 0,
            "model_speak": True,
        }
        meta = delta["metadata"]
        assert (delta["format"], delta["sample_rate_hz"], len(base64.b64decode(delta["delta"]))) == (
            "pcm16",
            24000,
            ONE_UNIT_TURN_MS * 48,  # 24 kHz, 16-bit
        )
        assert (meta["model_speak"], meta["end_of_turn"], meta["audio_duration_ms"]) == (
            True,
            True,
            ONE_UNIT_TURN_MS,
        )
        assert meta["audio_text_marks"] == [{"text_chars": len("hello"), "audio_end_ms": ONE_UNIT_TURN_MS}]
        generated = {"generated_ms": ONE_UNIT_TURN_MS, "sent_ms": ONE_UNIT_TURN_MS}
        assert meta["playback"] == {**generated, "played_ms": 0, "committed_ms": 0}
        assert transcript["delta"] == "hello"
        assert done["response"]["status_details"] == {"type": "completed", "reason": "stop"}

        # The browser drained its playback: it acks the item named after the response.
        played = meta["audio_duration_ms"]
        ack = {"type": "playback.ack", "response_id": rid, "item_id": f"item_{rid}"}
        await client.send({**ack, "played_ms": played, "committed_ms": played})
        acknowledged = await client.until("playback.acknowledged")
        assert (acknowledged["event"] or acknowledged)["committed_ms"] == ONE_UNIT_TURN_MS
        assert acknowledged["event"]["history_committed"] is True
        assert acknowledged["event"]["item_id"] == f"item_{rid}"

        await client.send({"type": "session.close"})
        closed = await client.until("session.closed")
        assert closed["reason"] == "client_close" and client.events[-1] is closed
        for event in client.events:
            validate_ga(event, seeds=True)  # OpenAI's shapes hold too: every extension is an extra field


async def test_a_listening_minicpmo_answers_the_browser_with_the_seeds_listen(checkpoints):
    model = plugin(checkpoints["listen"])
    async with (
        running_server(plugin=model, engine_config=EngineConfig(max_sessions=2), model_name=MODEL) as srv,
        SeedsClient(srv.url, MODEL) as client,
    ):
        await open_and_stream(client, seconds=2)
        first = await client.until("response.listen")
        second = await client.until("response.listen")
        for listen in (first, second):
            assert listen["response"]["status"] == "listening"
            assert listen["response"]["metadata"]["model_listen"] is True
            assert listen["response"]["metadata"]["reason"] == "model_listen"
        assert not any(e["type"] == "response.created" for e in client.events)
        assert model.frames_dropped == 0  # both camera frames reached their units
