"""The batch driver: requests of many sessions stepped together, joining and leaving between steps.

Real engine, real sessions, the scripted batch plugin (one word per step). Output pacing is off here
(``output_lead_ms=None``) so the tests wait for events, not for playback time; pacing has its own
tests (``test_output_stream.py``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from duplex.engine import Engine, EngineConfig
from duplex.plugins.base import (
    BatchPlugin,
    BatchRequest,
    Capabilities,
    PluginKind,
    SlotOptions,
    SlotOutput,
)
from duplex.plugins.builtin.scripted import ScriptedBatchPlugin
from duplex.protocol.ext.commands import SessionClose, SessionHeartbeat
from duplex.protocol.realtime.commands import (
    ConversationItemCreate,
    InputAudioBufferAppend,
    ResponseCancel,
    ResponseCreate,
)
from duplex.protocol.realtime.items import InputTextPart, MessageItem

from .conftest import types, until

pytestmark = pytest.mark.timeout(30)


def engine(plugin: ScriptedBatchPlugin | None = None, **config: object) -> tuple[Engine, ScriptedBatchPlugin]:
    plugin = plugin or ScriptedBatchPlugin()
    plugin.load()
    config.setdefault("output_lead_ms", None)
    config.setdefault("reaper_interval_s", 3600)
    return Engine(plugin, EngineConfig(**config), model_name="batch"), plugin  # type: ignore[arg-type]


def ask(att, text: str) -> None:
    item = MessageItem(role="user", content=[InputTextPart(text=text)])
    att.submit(ConversationItemCreate(item=item))
    att.submit(ResponseCreate())


def transcript(events) -> str:
    return "".join(e.delta for e in events if types([e]) == ["response.output_audio_transcript.delta"])


async def test_requests_of_two_sessions_share_steps_and_each_completes_with_its_own_text() -> None:
    eng, plugin = engine()
    async with eng:
        a, b = await eng.open(), await eng.open()
        ask(a, "one two three four five six")
        ask(b, "alpha beta gamma")
        got_a, got_b = await asyncio.gather(until(a, "response.done"), until(b, "response.done"))
    assert transcript(got_a) == "one two three four five six" and transcript(got_b) == "alpha beta gamma"
    assert got_a[-1].response.status == got_b[-1].response.status == "completed"
    assert max(plugin.batch_sizes) == 2  # the two requests advanced in the same calls
    assert sum(plugin.batch_sizes) == 9  # one slot-step per word, nothing stepped twice


async def test_a_cancelled_request_leaves_at_the_next_step_and_the_others_go_on() -> None:
    eng, plugin = engine(ScriptedBatchPlugin(ms_per_char=60))
    async with eng:
        a, b = await eng.open(), await eng.open()
        ask(a, " ".join(f"w{i}" for i in range(200)))
        ask(b, " ".join(f"v{i}" for i in range(40)))
        await until(a, "response.output_audio.delta")
        a.submit(ResponseCancel())
        cancelled = await until(a, "response.done")
        steps_at_cancel = plugin.steps
        done_b = await until(b, "response.done")
        a.submit(SessionHeartbeat())
        after = await until(a, "session.heartbeat_ack")
    assert cancelled[-1].response.status == "cancelled"
    assert done_b[-1].response.status == "completed" and transcript(done_b).split()[-1] == "v39"
    assert "response.output_audio.delta" not in types(after)  # nothing of the cancelled request follows
    # At most the step already in flight at the cancel carried the cancelled request; none after it.
    assert plugin.steps > steps_at_cancel + 1 and max(plugin.batch_sizes[steps_at_cancel + 1 :]) == 1


async def test_a_refused_request_fails_its_response_with_the_plugins_code_and_the_session_goes_on() -> None:
    eng, _ = engine()
    async with eng:
        att = await eng.open()
        att.submit(ResponseCreate())  # no text at all
        events = await until(att, "response.done")
        ask(att, "now with words")
        retry = await until(att, "response.done")
    errors = [e for e in events if types([e]) == ["error"]]
    assert [e.error.code for e in errors] == ["response_create_without_input"]
    assert events[-1].response.status == "failed"
    assert retry[-1].response.status == "completed" and transcript(retry) == "now with words"


async def test_a_batch_model_refuses_audio_appends_and_stays_usable() -> None:
    eng, _ = engine()
    async with eng:
        att = await eng.open()
        att.submit(InputAudioBufferAppend(audio=b"\x00\x00" * 2400))
        att.submit(SessionHeartbeat())
        events = await until(att, "session.heartbeat_ack")
    (error,) = [e for e in events if types([e]) == ["error"]]
    assert error.error.code == "invalid_input_modality"


def test_the_images_of_one_step_become_their_own_pngs_in_order() -> None:
    from duplex.engine.batch_driver import BatchDriver
    from duplex.plugins.base import SlotOutput
    from duplex.protocol.png import encode_png

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (8 + i, 12, 3), dtype=np.uint8) for i in range(5)]
    outputs = [SlotOutput(slot=i, epoch=1, image=image) for i, image in enumerate(images)]
    outputs.insert(2, SlotOutput(slot=9, epoch=1))  # an output without an image stays without one
    driver = BatchDriver(ScriptedBatchPlugin(), None, None)  # type: ignore[arg-type]
    driver._encode_images(outputs[:1])  # one image: encoded on the calling thread
    driver._encode_images(outputs[1:])  # several: on the pool
    assert [o.image for o in outputs if o.slot != 9] == [encode_png(image) for image in images]
    assert outputs[2].image is None


class EndlessStep(BatchPlugin):
    """A model whose step never ends by itself: ``advance`` returns once the request it steps is
    interrupted. ``stepping`` is set when a step has begun."""

    name = "endless-step"

    def __init__(self) -> None:
        self.stepping = threading.Event()
        self.interrupted: list[tuple[int, int]] = []
        self._epochs: dict[int, int] = {}
        self._released = threading.Event()

    def capabilities(self) -> Capabilities:
        return Capabilities(
            kind=PluginKind.BATCH, output_sample_rate=24000, max_sessions=2, supports_text_input=True
        )

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        self._epochs.pop(slot, None)

    def cancel_slot(self, slot: int, epoch: int) -> None:
        self._epochs.pop(slot, None)

    def close_slot(self, slot: int) -> None:
        self._epochs.pop(slot, None)

    def begin(self, request: BatchRequest) -> None:
        self._epochs[request.slot] = request.epoch

    def advance(self, slots: Sequence[int]) -> Sequence[SlotOutput]:
        self.stepping.set()
        self._released.wait(3600)
        return [SlotOutput(slot=s, epoch=self._epochs[s], end_of_turn=True) for s in slots]

    def interrupt(self, slot: int, epoch: int) -> None:
        self.interrupted.append((slot, epoch))
        self._released.set()


@pytest.mark.parametrize("stop", ["response.cancel", "session.close"])
async def test_a_request_stopped_inside_its_step_interrupts_the_step(stop: str) -> None:
    plugin = EndlessStep()
    eng = Engine(plugin, EngineConfig(output_lead_ms=None, reaper_interval_s=3600), model_name="endless")
    async with eng:
        att = await eng.open()
        record = eng.manager.records[att.session_id]
        ask(att, "a text the model is speaking")
        await asyncio.to_thread(plugin.stepping.wait, 30)
        if stop == "response.cancel":
            att.submit(ResponseCancel())
            assert (await until(att, "response.done"))[-1].response.status == "cancelled"
            att.submit(SessionHeartbeat())  # answered once the cancel is done: after the step
            await until(att, "session.heartbeat_ack")
        else:
            att.submit(SessionClose())
            await until(att, "session.closed")
            await record.finished.wait()  # its cleanup is done: the slot is free
        assert plugin.interrupted == [(0, 0)]
        assert eng.manager.open_count == (1 if stop == "response.cancel" else 0)
