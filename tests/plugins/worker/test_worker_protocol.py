"""The worker protocol's pieces without a worker: messages, the channel, the shared-memory areas."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from multiprocessing.shared_memory import SharedMemory

import msgspec
import numpy as np
import pytest

from duplex.engine.worker import WorkerConfig
from duplex.engine.worker.channel import Channel, ChannelClosed
from duplex.engine.worker.protocol import (
    Advance,
    ArrayRef,
    Begin,
    CancelSlotMsg,
    Chunk,
    CloseSlotMsg,
    CloseStream,
    Done,
    Failure,
    Init,
    InputExtra,
    Next,
    OpenSlotMsg,
    OutputMsg,
    Outputs,
    Reply,
    Request,
    Respond,
    Step,
    TurnRequestMsg,
)
from duplex.engine.worker.shm import AreaWriter, SharedAreas, area_sizes, view_array
from duplex.plugins.base import BatchRequest, SlotOptions, ToolCall, ToolResult, TurnRequest
from duplex.plugins.builtin.echo import EchoPlugin
from duplex.plugins.builtin.scripted import ScriptedTurnPlugin, ScriptedUnitPlugin

REQUESTS = [
    Init("echo", None, {"max_sessions": 4, "nested": {"a": [1, 2.5, "x"]}}),
    OpenSlotMsg(3, SlotOptions(instructions="be brief", voice="v", seed=7, extra={"k": True})),
    CancelSlotMsg(3, 9),
    CloseSlotMsg(3),
    Step(
        [0, 5],
        [1, 2],
        [False, True],
        [InputExtra(1, None, (b"\xff\xd8jpeg",), (ToolResult(call_id="c", output="{}"),))],
    ),
    Respond(
        4,
        TurnRequestMsg(
            1, 2, ArrayRef("<f4", (3,), 0), "hi", (("user", "a"), ("assistant", "b")), "sys", {}, 64
        ),
    ),
    Next(4),
    CloseStream(4),
    Begin(BatchRequest(slot=2, epoch=0, text="a cat", options={"steps": 4})),
    Advance([2, 3]),
]
REPLIES = [
    Done(),
    Outputs(
        [
            OutputMsg(
                1,
                0,
                ArrayRef("<i2", (1920,), 64),
                24000,
                "w1 ",
                "speak",
                True,
                ToolCall(call_id="c", name="f", arguments="{}"),
            )
        ]
    ),
    Chunk(None),
    Failure("voice_not_found", "no such voice", "PluginError"),
    Failure("invalid_session_config", "steps must be at most 50", "PluginError", param="steps"),
]


@pytest.mark.parametrize("message", REQUESTS, ids=lambda m: type(m).__name__)
def test_every_request_decodes_to_itself(message) -> None:
    assert msgspec.msgpack.Decoder(Request).decode(msgspec.msgpack.encode(message)) == message


@pytest.mark.parametrize("message", REPLIES, ids=lambda m: type(m).__name__)
def test_every_reply_decodes_to_itself(message) -> None:
    assert msgspec.msgpack.Decoder(Reply).decode(msgspec.msgpack.encode(message)) == message


def test_messages_are_msgpack_arrays_led_by_their_one_byte_tag() -> None:
    data = msgspec.msgpack.encode(Step([7], [0], [False]))
    assert data[0] == 0x95 and data[1] == 6  # fixarray of 5: the tag, then the fields in order
    assert msgspec.msgpack.decode(data) == [6, [7], [0], [False], []]


# ---------------------------------------------------------------------------- channel


def _pair() -> tuple[Channel, Channel]:
    a, b = socket.socketpair()
    return (
        Channel(a, Request, max_message_bytes=1 << 24),
        Channel(b, Request, max_message_bytes=1 << 24),
    )


def test_channel_carries_messages_back_to_back_and_larger_than_its_buffer() -> None:
    left, right = _pair()
    big = Init("x", None, {"blob": b"\x01" * 300_000})  # more than the socket buffers: a writer thread
    writer = threading.Thread(target=lambda: [left.send(m) for m in (Next(1), big, CloseSlotMsg(2))])
    writer.start()
    assert [right.recv(), right.recv(), right.recv()] == [Next(1), big, CloseSlotMsg(2)]
    writer.join(10)
    left.close()
    right.close()


def test_channel_reports_a_closed_peer_and_refuses_an_oversized_length() -> None:
    left, right = _pair()
    left.close()
    with pytest.raises(ChannelClosed):
        right.recv()
    a, b = socket.socketpair()
    small = Channel(b, Request, max_message_bytes=16)
    a.sendall(b"\x00\x01\x00\x00" + b"\x00" * 8)
    with pytest.raises(ChannelClosed, match="exceeds 16"):
        small.recv()
    a.close()
    small.close()


def test_close_from_another_thread_wakes_a_blocked_recv() -> None:
    left, right = _pair()
    raised: list[BaseException] = []
    waiting = threading.Event()

    def reader() -> None:
        waiting.set()
        try:
            right.recv()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    assert waiting.wait(10)
    right.close()
    thread.join(10)
    assert not thread.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], ChannelClosed)
    left.close()


def test_a_call_on_a_channel_closed_since_the_caller_looked_raises_channel_closed() -> None:
    # The supervisor closes a dead worker's channel from its own thread; a step or close_slot that
    # checked ``dead`` a moment before must get ChannelClosed (the worker is gone), not EBADF.
    left, right = _pair()
    right.close()
    for timeout in (5.0, None):  # a new timeout (settimeout on the closed socket), then the same
        with pytest.raises(ChannelClosed):
            right.call(Next(1), timeout)
    left.close()


# ---------------------------------------------------------------------------- shared memory


def test_area_writer_packs_arrays_and_goes_inline_when_the_area_is_full() -> None:
    areas = SharedAreas.create(0, 4096)
    try:
        writer = AreaWriter(areas.output)
        pcm = np.arange(1000, dtype=np.int16)
        video = np.arange(2 * 4 * 5 * 3, dtype=np.uint8).reshape(2, 4, 5, 3)
        big = np.linspace(-1, 1, 2000, dtype=np.float32)  # 8000 bytes: more than the area
        refs = [writer.put(pcm), writer.put(video), writer.put(big)]
        assert [r.offset for r in refs] == [0, 2048, -1]  # 64-byte aligned, then inline
        assert refs[2].data == big.tobytes() and writer.cursor == 2048 + 128
        block = areas.output[: writer.cursor].copy()  # what a reader does with the call's bytes
        out = [view_array(block, r) for r in refs]
        areas.output[:] = 0  # the next call may overwrite the area
        for got, want in zip(out, (pcm, video, big), strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
            assert got.flags.writeable
        writer.reset()
        assert writer.put(big[:10]).offset == 0
        with pytest.raises(TypeError, match="too small"):
            view_array(block, ArrayRef("<f4", (2000,), 0))
    finally:
        areas.close()


def test_put_many_writes_a_steps_audio_back_to_back_or_one_by_one() -> None:
    areas = SharedAreas.create(0, 8192)
    try:
        writer = AreaWriter(areas.output)
        a, b = np.arange(100, dtype=np.int16), np.arange(50, dtype=np.int16)
        refs = writer.put_many([a, None, b])
        assert refs[1] is None and [(r.offset, r.shape) for r in (refs[0], refs[2])] == [
            (0, (100,)),
            (200, (50,)),
        ]
        assert writer.cursor == 320  # 300 bytes, aligned
        mixed = writer.put_many([np.ones(4, np.float32), a])  # two dtypes: one by one
        assert [r.offset for r in mixed] == [320, 384]
        block = areas.output[: writer.cursor].copy()
        assert np.array_equal(view_array(block, refs[2]), b) and np.array_equal(
            view_array(block, mixed[1]), a
        )
        spill = writer.put_many([np.zeros(4000, np.int16)])  # more than is left: inline
        assert spill[0].offset == -1 and writer.put_many([None]) == [None]
    finally:
        areas.close()


def test_input_rows_are_the_input_area_as_frames() -> None:
    areas = SharedAreas.create(4 * 1920 * 2, 64)
    try:
        rows = areas.input_rows("int16", 1920)
        assert rows.shape == (4, 1920) and rows.dtype == np.int16
        rows[1] = 7
        assert areas.input[1920 * 2 : 1920 * 2 + 4].tobytes() == b"\x07\x00\x07\x00"
        del rows
    finally:
        areas.close()


_ATTACH = """
import sys, msgspec
from duplex.engine.worker.protocol import Attach
from duplex.engine.worker.shm import SharedAreas
areas = SharedAreas.attach(msgspec.json.decode(sys.argv[1], type=Attach))
print(areas.input[:3].tobytes().decode())
areas.output[5:7] = (122, 122)
areas.close()
"""


def test_another_process_attaches_by_name_and_the_creator_alone_unlinks() -> None:
    created = SharedAreas.create(128, 128)
    try:
        created.input[:3] = np.frombuffer(b"abc", np.uint8)
        message = msgspec.json.encode(created.attach_message).decode()
        done = subprocess.run(
            [sys.executable, "-c", _ATTACH, message], capture_output=True, text=True, timeout=60, check=True
        )
        assert done.stdout.strip() == "abc"
        assert done.stderr == ""  # no resource-tracker complaint: the attacher does not own it
        assert created.output[5:7].tobytes() == b"zz"
    finally:
        created.close()
    with pytest.raises(FileNotFoundError):
        SharedMemory(name=created.attach_message.name)


def test_area_sizes_follow_the_capabilities() -> None:
    echo = EchoPlugin(max_sessions=8).capabilities()  # int16 frames of 1920 samples, 24 kHz out
    assert area_sizes(echo, 1 << 20) == (8 * 1920 * 2, 8 * 2 * 1920 * 4)
    unit = ScriptedUnitPlugin(max_sessions=2).capabilities()  # float32 1 s units at 16 kHz
    assert area_sizes(unit, 1 << 20) == (2 * 16000 * 4, 2 * 2 * 24000 * 4)
    turn = ScriptedTurnPlugin().capabilities()
    assert area_sizes(turn, 12345) == (12345, 12345)


def test_the_restart_schedule_doubles_up_to_its_bound() -> None:
    config = WorkerConfig()
    assert [config.restart_delay_s(k) for k in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    assert WorkerConfig(restart_delay_initial_s=0, restart_delay_max_s=0).restart_delay_s(100) == 0
    with pytest.raises(ValueError):
        WorkerConfig(restart_delay_initial_s=5, restart_delay_max_s=1)


def test_a_turn_request_message_has_every_field_of_the_turn_request_in_its_order() -> None:
    """The proxy and the worker convert one to the other by field name: a field the message lacked
    would not reach a plugin in a worker."""
    assert TurnRequestMsg.__struct_fields__ == TurnRequest.__struct_fields__
