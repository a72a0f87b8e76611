"""MiniCPM-o 4.5 reads typed text: a user turn of its chat template,
``<|im_start|>user\\n{text}<|im_end|>\\n``, prefilled between two units (the previous one closed
first), stepped directly and through a real server from each door: ``conversation.item.create`` with
``input_text`` on ``/v1/realtime``, the seeds' ``input.text.append``, and ``video.query`` with text on
``/v1/video/chat/stream``, where two queries sent back to back are answered one after the other, in
order."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence

import msgspec
import numpy as np
import websockets

from duplex.engine import EngineConfig
from duplex.plugins.base import SlotInput, SlotOptions, SlotOutput
from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin
from duplex.plugins.minicpmo.tokens import user_turn
from duplex.protocol.video_chat import ServerMessage, SessionConfig, VideoDone, VideoQuery
from tests.server.harness import running_server

GREEDY = SlotOptions(temperature=0.0, seed=3)
WINDOW = {"context_tokens": 1024, "window_high_tokens": 700, "window_low_tokens": 400}


def _pcm(seed: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(16000)).astype(np.float32)


class ReadingPlugin(MiniCPMOPlugin):
    """MiniCPM-o noting, for every unit it steps, the typed text ids it prefilled before it (after the
    step; written on the model thread, read by the test)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.units: list[list[int]] = []
        self._changed = threading.Condition()

    def load(self) -> None:
        super().load()
        self.tokens = (self.generator.tok, self.generator.sp)  # still there once the server closed it

    def step(self, batch: Sequence[SlotInput]) -> Sequence[SlotOutput]:
        outputs = super().step(batch)
        with self._changed:
            self.units += [list(self.last_results[item.slot].text_ids) for item in batch]
            self._changed.notify_all()
        return outputs

    async def read(self, n: int, timeout_s: float = 30.0) -> list[list[int]]:
        """The text ids of the units stepped so far, once ``n`` of them read text."""

        def wait() -> bool:
            with self._changed:
                return self._changed.wait_for(lambda: sum(map(bool, self.units)) >= n, timeout_s)

        if not await asyncio.to_thread(wait):
            raise TimeoutError(f"{n} units with text expected, got {self.units}")
        with self._changed:
            return list(self.units)


def _plugin(ckpt, cls: type[MiniCPMOPlugin] = MiniCPMOPlugin) -> MiniCPMOPlugin:
    return cls.from_options(str(ckpt), max_sessions=2, **WINDOW)


def _turn_ids(plugin: MiniCPMOPlugin, text: str) -> list[int]:
    tok = plugin.tokens[0] if isinstance(plugin, ReadingPlugin) else plugin.generator.tok
    return tok.encode(user_turn(text), add_special_tokens=False).ids


# --------------------------------------------------------------------------- stepped directly


def test_the_model_advertises_text_input(minicpmo_ckpt):
    assert _plugin(minicpmo_ckpt).capabilities().supports_text_input


def test_text_before_the_first_unit_follows_the_system_context_as_a_user_turn(minicpmo_ckpt):
    plugin = _plugin(minicpmo_ckpt)
    plugin.load()
    gen = plugin.generator
    plugin.open_slot(0, GREEDY)
    prompt = int(gen.lm_len[0])
    [out] = plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(0), text=("Hi there.", "What is it?"))])
    res = plugin.last_results[0]
    expected = _turn_ids(plugin, "Hi there.") + _turn_ids(plugin, "What is it?")
    assert res.text_ids == expected
    assert gen.tok.decode(expected, skip_special_tokens=False).startswith("<|im_start|>user\nHi there.")
    assert gen.hosts[0].unit_starts == [prompt + len(expected)]  # the unit opened after the text
    assert out.usage is not None and out.usage.input_text == len(expected) + 1  # and the unit's <unit>


def test_text_after_a_unit_closes_that_unit_and_the_next_opens_with_unit_alone(minicpmo_ckpt):
    plugin = _plugin(minicpmo_ckpt)
    plugin.load()
    gen, sp = plugin.generator, plugin.generator.sp
    plugin.open_slot(0, GREEDY)
    plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(0))])
    term = gen.hosts[0].pending_terminator
    assert term in sp.terminators
    plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(1), text=("Look left.",))])
    assert plugin.last_results[0].text_ids == [term, sp.unit_end, *_turn_ids(plugin, "Look left.")]
    ids, _kind, _src, _valid, _frames = gen.layout({0: (_pcm(2), [])})
    closing = [t for t in (gen.hosts[0].pending_terminator, sp.unit_end) if t is not None]
    assert list(ids[0, : len(closing)]) == closing  # the unit that read the text is closed by the next
    # Text read twice in a row between the same two units closes nothing the second time.
    plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(2), text=("One.",))])
    plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(3), text=("Two.",))])
    assert plugin.last_results[0].text_ids[2:] == _turn_ids(plugin, "Two.")


def test_the_text_changes_what_the_model_reads_and_only_for_its_slot(minicpmo_ckpt):
    """Two slots hear the same unit; the one that read a text has a longer context of exactly the
    text's ids, and the other's is untouched by it."""
    plugin = _plugin(minicpmo_ckpt)
    plugin.load()
    gen = plugin.generator
    plugin.open_slot(0, GREEDY)
    plugin.open_slot(1, GREEDY)
    plugin.step(
        [
            SlotInput(slot=0, epoch=0, pcm=_pcm(0), text=("Count to three.",)),
            SlotInput(slot=1, epoch=0, pcm=_pcm(0)),
        ]
    )
    read = plugin.last_results[0].text_ids
    assert read == _turn_ids(plugin, "Count to three.") and plugin.last_results[1].text_ids == []
    generated = [len(plugin.last_results[s].tokens) for s in (0, 1)]
    assert int(gen.lm_len[0]) - generated[0] == int(gen.lm_len[1]) - generated[1] + len(read)


def test_a_text_longer_than_the_window_is_read_from_its_end_and_counted(minicpmo_ckpt):
    plugin = _plugin(minicpmo_ckpt)
    plugin.load()
    gen = plugin.generator
    plugin.open_slot(0, GREEDY)
    prefix = gen.hosts[0].prefix_len
    plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(0))])
    long = " ".join(f"word{i}" for i in range(400))
    plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(1), text=(long,))])
    full = _turn_ids(plugin, long)
    room = WINDOW["window_low_tokens"] - prefix
    assert len(full) > room and plugin.last_results[0].text_ids == full[-room:]
    assert plugin.text_tokens_dropped == len(full) + 2 - room  # and the closing terminator, </unit>
    assert int(gen.lm_len[0]) <= WINDOW["window_high_tokens"]


def test_a_text_past_the_window_makes_room_by_dropping_the_oldest_units(minicpmo_ckpt):
    plugin = _plugin(minicpmo_ckpt)
    plugin.load()
    gen = plugin.generator
    plugin.open_slot(0, GREEDY)
    prefix = gen.hosts[0].prefix_len
    i = 0
    while int(gen.lm_len[0]) < WINDOW["window_high_tokens"] - 60:
        plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(i))])
        i += 1
    units_before = len(gen.hosts[0].unit_starts)
    text = " ".join(f"w{i}" for i in range(40))
    plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(i), text=(text,))])
    read = plugin.last_results[0].text_ids
    starts = gen.hosts[0].unit_starts
    assert 60 < len(read) < WINDOW["window_low_tokens"] - prefix and plugin.text_tokens_dropped == 0
    assert len(starts) < units_before and starts[0] == prefix  # the kept units moved down
    assert starts[-1] - len(read) <= WINDOW["window_low_tokens"]  # the text fitted under the low mark
    assert int(gen.lm_len[0]) <= WINDOW["window_high_tokens"]


# --------------------------------------------------------------------------- through a real server


async def test_an_input_text_item_on_realtime_reaches_the_model_without_audio(speak_end_ckpt):
    """A typed user message is the session's first input: the slot opens, and the model reads the
    text with a unit of its own (no audio came: the text makes one due)."""
    plugin = _plugin(speak_end_ckpt, ReadingPlugin)
    text = "What is on the table?"
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    async with (
        running_server(plugin=plugin, engine_config=EngineConfig(max_sessions=2), model_name="m") as srv,
        websockets.connect(f"{srv.url}?model=m", proxy=None) as ws,
    ):
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "conversation.item.create", "event_id": "evt_t", "item": item}))
        units = await plugin.read(1)  # type: ignore[attr-defined]
    assert next(ids for ids in units if ids) == _turn_ids(plugin, text)


async def test_the_seeds_input_text_append_reaches_the_model(speak_end_ckpt):
    plugin = _plugin(speak_end_ckpt, ReadingPlugin)
    async with (
        running_server(plugin=plugin, engine_config=EngineConfig(max_sessions=2), model_name="m") as srv,
        websockets.connect(f"{srv.url}?duplex=1&model=m&autostart=0", proxy=None) as ws,
    ):
        await ws.send(json.dumps({"type": "session.update", "session": {"modalities": ["audio", "text"]}}))
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "input.text.append", "event_id": "evt_a", "text": "Hello?"}))
        units = await plugin.read(1)  # type: ignore[attr-defined]
        await ws.send(json.dumps({"type": "session.heartbeat"}))
        while (event := json.loads(await ws.recv()))["type"] != "session.heartbeat_ack":
            assert event["type"] != "error", event
    assert next(ids for ids in units if ids) == _turn_ids(plugin, "Hello?")


def _types(messages: list[object]) -> list[str]:
    return [type(m).__struct_config__.tag for m in messages]  # type: ignore[attr-defined]


async def test_two_video_queries_back_to_back_are_answered_in_order(speak_end_ckpt):
    """The second query comes while the first is being answered: it waits for that answer to end,
    and the model reads it after (no ``conversation_already_has_active_response``)."""
    plugin = _plugin(speak_end_ckpt, ReadingPlugin)
    config = EngineConfig(max_sessions=2, max_padding_frames=1)  # one unit per text: no spare replies
    async with running_server(plugin=plugin, engine_config=config, model_name="m") as srv:
        url = f"ws://127.0.0.1:{srv.port}/v1/video/chat/stream"
        async with websockets.connect(url, max_size=None, proxy=None) as ws:
            await ws.send(msgspec.json.encode(SessionConfig(enable_frame_filter=False)).decode())
            await ws.send(msgspec.json.encode(VideoQuery(text="What color is it?")).decode())
            await ws.send(msgspec.json.encode(VideoQuery(text="And its shape?")).decode())
            got: list[object] = []
            while _types(got).count("response.text.done") < 2:
                got.append(msgspec.json.decode(await ws.recv(), type=ServerMessage))
            await ws.send(msgspec.json.encode(VideoDone()).decode())
            got += [msgspec.json.decode(raw, type=ServerMessage) async for raw in ws]
    kinds = _types(got)
    assert "error" not in kinds and kinds[-1] == "session.done"
    starts = [m for m in got if _types([m]) == ["response.start"]]
    dones = [m for m in got if _types([m]) == ["response.text.done"]]
    assert [m.response_id for m in starts] == [m.response_id for m in dones]  # type: ignore[attr-defined]
    assert len({m.response_id for m in dones}) == 2  # type: ignore[attr-defined]
    assert kinds.index("response.text.done") < kinds.index(
        "response.start", kinds.index("response.start") + 1
    )
    assert [(m.text, m.status) for m in dones] == [("hello", "completed")] * 2  # type: ignore[attr-defined]
    read = [ids for ids in plugin.units if ids]  # type: ignore[attr-defined]
    sp = plugin.tokens[1]  # type: ignore[attr-defined]
    assert read[0] == _turn_ids(plugin, "What color is it?")
    assert read[1][0] in sp.terminators and read[1][1:] == [sp.unit_end, *_turn_ids(plugin, "And its shape?")]
    assert plugin.units.index(read[1]) == plugin.units.index(read[0]) + 1  # type: ignore[attr-defined]
