"""A plugin through its worker answers exactly as the same plugin in-process.

Each test drives the in-process plugin and the worker's proxy with the same calls and compares
what comes back, field by field and byte for byte (audio dtype included).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from duplex.engine.worker import (
    FrameWorkerPlugin,
    TurnWorkerPlugin,
    WorkerCallError,
    WorkerState,
    start_worker,
)
from duplex.plugins.base import (
    FramePlugin,
    PluginError,
    SlotInput,
    SlotOptions,
    SlotOutput,
    ToolResult,
    TurnPlugin,
    TurnRequest,
)
from duplex.plugins.builtin.echo import EchoPlugin
from duplex.plugins.builtin.scripted import ScriptedTurnPlugin, ScriptedUnitPlugin

from .conftest import FAST

pytestmark = pytest.mark.timeout(120)


def _fields(out: SlotOutput) -> tuple:
    """Everything of an output, its arrays as (dtype, shape, bytes)."""

    def arr(a: np.ndarray | None) -> tuple | None:
        return None if a is None else (a.dtype.str, a.shape, a.tobytes())

    return (
        out.slot,
        out.epoch,
        arr(out.pcm),
        out.sample_rate,
        out.text,
        out.decision,
        out.end_of_turn,
        out.tool_call,
        out.user_transcript,
        arr(out.image),
        arr(out.video),
        out.progress,
        out.usage,
        out.chunk_index,
        out.interactions,
        out.chunk_steps,
    )


def _voice(rng: np.random.Generator, level: float) -> np.ndarray:
    return (level * rng.standard_normal(1920) * 32767).clip(-32768, 32767).astype(np.int16)


def _echo_script(plugin: FramePlugin) -> list:
    """Open three slots and step them in changing batches (a slot left out, a cancel, a float
    frame, silence ending a turn, a slot closed and reopened); every output's fields."""
    rng = np.random.default_rng(11)
    seen: list = []
    for slot in (0, 5, 9):
        plugin.open_slot(slot, SlotOptions())
    for tick in range(14):
        batch = []
        for slot in (0, 5, 9):
            if slot == 5 and tick % 3 == 1:
                continue  # frozen this tick
            level = 0.0 if (slot == 9 and 6 <= tick <= 8) else 0.2
            pcm = _voice(rng, level)
            if slot == 0 and tick == 4:
                pcm = pcm.astype(np.float32) / 32768  # another dtype: travels inline
            batch.append(SlotInput(slot=slot, epoch=1 if (slot == 5 and tick >= 7) else 0, pcm=pcm))
        if tick == 7:
            plugin.cancel_slot(5, 1)
        if tick == 10:
            plugin.close_slot(9)
            plugin.open_slot(9, SlotOptions())
        seen.append([_fields(o) for o in plugin.step(batch)])
    return seen


def test_echo_through_a_worker_gives_byte_identical_outputs() -> None:
    local = EchoPlugin(max_sessions=16, word_ms=160)
    local.load()
    want = _echo_script(local)
    with start_worker("echo", options={"max_sessions": 16, "word_ms": 160}, config=FAST) as remote:
        assert isinstance(remote, FrameWorkerPlugin) and isinstance(remote, FramePlugin)
        assert remote.name == "echo"
        caps = remote.capabilities()
        assert caps == EchoPlugin(max_sessions=16).capabilities().__class__(
            **{**_caps_dict(local), "calls_on_loop": False}
        )
        got = _echo_script(remote)
    assert got == want
    assert any(o[2] is not None and o[2][0] == "<f4" for tick in want for o in tick)  # the float frame
    assert any(o[6] for tick in want for o in tick)  # a turn ended
    assert sum(1 for tick in want for o in tick if o[4]) >= 3  # word tokens


def _caps_dict(plugin) -> dict:
    caps = plugin.capabilities()
    return {f: getattr(caps, f) for f in caps.__struct_fields__}


def test_a_batch_larger_than_one_frame_per_row_and_empty_batches() -> None:
    with start_worker("echo", options={"max_sessions": 2}, config=FAST) as remote:
        assert remote.step([]) == []
        remote.open_slot(0, SlotOptions())
        remote.open_slot(1, SlotOptions())
        rng = np.random.default_rng(3)
        frames = [_voice(rng, 0.2) for _ in range(3)]
        # Three inputs for two rows (the same slot twice: a caller's bug, but the rows must not
        # overflow): the third frame travels inline and the plugin decides.
        batch = [SlotInput(slot=s, epoch=0, pcm=f) for s, f in zip((0, 1, 0), frames, strict=True)]
        first = remote.step(batch)
        assert [o.slot for o in first] == [0, 1, 0]
        second = remote.step([SlotInput(slot=0, epoch=0, pcm=frames[0])])
        assert second[0].pcm is not None and np.array_equal(second[0].pcm, frames[2])


def _turn_script(plugin: TurnPlugin) -> list:
    plugin.open_slot(2, SlotOptions())
    voice = np.linspace(-0.5, 0.5, 16000, dtype=np.float32)
    requests = [
        TurnRequest(slot=2, epoch=0, pcm=voice, text=None),
        TurnRequest(
            slot=2, epoch=0, text="tell me a story", history=(("user", "hi"), ("assistant", "hello"))
        ),
        TurnRequest(slot=2, epoch=1, text="call it"),
        TurnRequest(slot=2, epoch=1, text="one more time"),
    ]
    seen = []
    for i, request in enumerate(requests):
        reply = plugin.respond(request)
        chunks = []
        for out in reply:
            chunks.append(_fields(out))
            if i == 3 and len(chunks) == 2:
                break  # cancelled mid-reply: the engine closes the stream
        reply.close()  # type: ignore[attr-defined]
        seen.append(chunks)
    return seen


def test_scripted_turn_through_a_worker_streams_the_same_chunks() -> None:
    script = ["Sure, I can help with that.", "You said: {text}", 'tool:lookup:{"q": 1}', "a b c d e"]
    local = ScriptedTurnPlugin(script=script)
    local.load()
    want = _turn_script(local)
    with start_worker("scripted-turn", options={"script": script}, config=FAST) as remote:
        assert isinstance(remote, TurnWorkerPlugin) and isinstance(remote, TurnPlugin)
        got = _turn_script(remote)
    assert got == want
    assert [len(chunks) for chunks in want] == [6, 6, 1, 2]
    assert want[2][0][7] is not None  # the tool call


def _unit_script(plugin: FramePlugin) -> list:
    plugin.open_slot(0, SlotOptions())
    plugin.open_slot(1, SlotOptions())
    rng = np.random.default_rng(5)
    seen = []
    for tick in range(6):
        batch = [
            SlotInput(
                slot=s,
                epoch=0,
                pcm=rng.standard_normal(16000).astype(np.float32) * 0.1,
                video_frames=(b"\xff\xd8frame-%d" % tick,) if s == 1 else (),
                tool_results=(ToolResult(call_id="c1", output="42"),) if tick == 2 else (),
                padded=tick == 3,
            )
            for s in (0, 1)
        ]
        seen.append([_fields(o) for o in plugin.step(batch)])
        if tick == 3:
            plugin.cancel_slot(0, 1)
    return seen


def test_scripted_unit_through_a_worker_with_video_frames_gives_the_same_units() -> None:
    local = ScriptedUnitPlugin(max_sessions=4)
    local.load()
    want = _unit_script(local)
    with start_worker("scripted-unit", options={"max_sessions": 4}, config=FAST) as remote:
        got = _unit_script(remote)
    assert got == want
    assert any(o[2] is not None for tick in want for o in tick)


def test_a_plugin_error_in_the_worker_arrives_with_its_code_and_the_worker_goes_on(echo_worker) -> None:
    pid = echo_worker.supervisor.status().pid
    with pytest.raises(PluginError) as err:
        echo_worker.open_slot(99, SlotOptions())
    assert (err.value.code, str(err.value)) == ("invalid_slot", "echo: slot 99 is outside 0..15")
    assert type(err.value) is PluginError
    with pytest.raises(PluginError) as err:
        echo_worker.step([SlotInput(slot=3, epoch=0, pcm=np.zeros(1920, np.int16))])
    assert err.value.code == "invalid_slot"
    echo_worker.open_slot(3, SlotOptions())
    with pytest.raises(WorkerCallError) as failed:  # echo asserts the frame's shape
        echo_worker.step([SlotInput(slot=3, epoch=0, pcm=np.zeros(7, np.int16))])
    assert failed.value.error_type == "AssertionError" and "frame shape (7,)" in str(failed.value)
    assert "Traceback" in failed.value.remote_traceback
    assert echo_worker.step([SlotInput(slot=3, epoch=0, pcm=np.zeros(1920, np.int16))])[0].slot == 3
    status = echo_worker.supervisor.status()
    assert (status.pid, status.state, status.restarts) == (pid, WorkerState.READY, 0)


@pytest.mark.parametrize(
    ("name", "options", "code"),
    [
        ("no-such-plugin", {}, "unknown_plugin"),
        ("echo", {"colour": "blue"}, "invalid_plugin_config"),
        ("echo", {"max_sessions": 0}, "invalid_plugin_config"),
    ],
)
def test_a_plugin_that_cannot_be_built_fails_the_start_with_its_code(name, options, code) -> None:
    with pytest.raises(PluginError) as err:
        start_worker(name, options=options, config=FAST)
    assert err.value.code == code


def test_the_engine_takes_the_proxy_for_its_kind() -> None:
    from duplex.engine import Engine

    with start_worker("scripted-turn", config=FAST) as remote:
        engine = Engine(remote)
        assert engine.capabilities.kind == "turn" and not engine.capabilities.calls_on_loop
        assert engine.plugin_name == "scripted-turn"
    with pytest.raises(PluginError) as err:
        remote.load()
    assert err.value.code == "plugin_closed"


def _batch_script(plugin) -> list:
    from duplex.plugins.base import BatchRequest

    for slot in (0, 1, 3):
        plugin.open_slot(slot, SlotOptions())
    plugin.begin(BatchRequest(slot=0, epoch=0, text="a red fox"))
    plugin.begin(BatchRequest(slot=3, epoch=2, text="hi", options={"steps": 3}))
    seen = [[_fields(o) for o in plugin.advance([0, 3])]]
    plugin.begin(BatchRequest(slot=1, epoch=0, text="late joiner"))
    seen.append([_fields(o) for o in plugin.advance([3, 0, 1])])
    plugin.cancel_slot(0, 1)
    seen.append([_fields(o) for o in plugin.advance([1, 3])])
    seen.append([_fields(o) for o in plugin.advance([1])])
    with pytest.raises(PluginError) as err:
        plugin.begin(BatchRequest(slot=0, epoch=1, text=""))
    seen.append((err.value.code, err.value.param))
    return seen


def test_a_batch_plugin_through_a_worker_gives_the_same_chunks_and_images(tmp_path) -> None:
    """``toy-batch`` (a test plugin) is registered for the worker through a distribution's entry
    point on the worker's ``PYTHONPATH``, the way an installed plugin package is."""
    from duplex.engine.worker import BatchWorkerPlugin, WorkerConfig
    from duplex.plugins.base import BatchPlugin
    from tests.plugins.worker.toy_batch import ToyBatchPlugin

    dist = tmp_path / "toy_batch-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-batch\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        "[duplex.plugins]\ntoy-batch = tests.plugins.worker.toy_batch:ToyBatchPlugin\n"
    )
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    local = ToyBatchPlugin()
    local.load()
    want = _batch_script(local)
    config = WorkerConfig(env={"PYTHONPATH": path})
    with start_worker("toy-batch", config=config) as remote:
        assert isinstance(remote, BatchWorkerPlugin) and isinstance(remote, BatchPlugin)
        got = _batch_script(remote)
    assert got == want
    images = [o[9] for step in want[:4] for o in step if o[9] is not None]
    assert len(images) == 2 and images[0][1] == (4, 6, 3)  # slot 0 was cancelled before its image
    assert want[4] == ("invalid_request", "input")  # the refusal crosses the worker with its param
