"""The model's slot is the session's from its first input that needs the model, with every setting
given until then; it opens ahead once the settings are quiet (``prefill_delay_s``) and again if they
change before that input; after it a setting the model fixed there is refused by name, or restarts
the model when the session asked for it (``extra_body.restart_on_update``).

Sans-IO sessions on capabilities shaped like the real models' (a persona and voice prompt fixed at
open, tools, a reference voice), with an injected clock; then the real engine with the echo plugin
refusing or recording its slots.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import msgspec
import numpy as np
import pytest

from duplex.engine import Engine, EngineConfig
from duplex.engine.actions import CancelSlot, FeedAudio, OpenSlot, RestartSlot, WakeAt
from duplex.engine.session import Session, SlotPhase
from duplex.engine.settings import SessionSettings
from duplex.plugins.base import (
    Capabilities,
    PluginError,
    PluginKind,
    SlotOptions,
    SlotOutput,
    ToolSpec,
)
from duplex.plugins.builtin.echo import EchoPlugin
from duplex.protocol import decode
from duplex.protocol.audio import encode_wav, pcm16_encode
from duplex.protocol.ext.dialect import Dialect
from duplex.protocol.realtime.commands import (
    InputAudioBufferAppend,
    InputAudioBufferCommit,
    ResponseCreate,
    SessionUpdate,
)

from .conftest import append, decoded, open_model, types, until

pytestmark = pytest.mark.timeout(30)

#: A model that fixes its persona, voice and tools when its slot opens, and calls tools.
FIXED = Capabilities(
    kind=PluginKind.FRAME,
    chunk_period_ms=80,
    model_native_turns=True,
    supports_tools=True,
    voices=("NATF2", "VARM0"),
    default_voice="NATF2",
    updatable_options=(),
    persona_instructions=True,
    session_options=("ref_audio", "initial_user_text", "force_listen_count"),
)
#: A model without named voices that cannot call tools.
PLAIN = Capabilities(kind=PluginKind.FRAME, chunk_period_ms=80, model_native_turns=True, updatable_options=())
TOOL = {"type": "function", "name": "get_time", "description": "The time.", "parameters": {"type": "object"}}
TOOL_SPEC = ToolSpec(name="get_time", description="The time.", parameters='{"type":"object"}')


def session(
    caps: Capabilities = FIXED, dialect: Dialect = Dialect.GA, prefill_delay_s: float | None = None
) -> Session:
    settings = SessionSettings.defaults("m", caps, dialect)
    return Session(
        "sess_test",
        0,
        caps,
        settings,
        journal_max_age_s=60.0,
        journal_max_bytes=1 << 24,
        prefill_delay_s=prefill_delay_s,
    )


def update(**session: Any) -> SessionUpdate:
    return decode(msgspec.json.encode({"type": "session.update", "session": session}))


def speak(epoch: int = 0) -> SlotOutput:
    return SlotOutput(slot=0, epoch=epoch, pcm=np.full(1920, 0.2, np.float32), decision="speak")


def codes(events: list) -> list[tuple[str, str | None]]:
    return [(e.error.code, e.error.param) for e in events if types([e]) == ["error"]]


WAV = "data:audio/wav;base64," + base64.b64encode(encode_wav(np.zeros(800, np.float32), 16000)).decode()


# --------------------------------------------------------------------------- before the first input


def test_every_setting_may_change_until_the_first_input_and_the_slot_opens_with_the_last() -> None:
    s = session()
    first = update(instructions="You are Ada.", audio={"output": {"voice": "alloy"}}, tools=[TOOL, TOOL])
    assert types(s.handle(first, 0.0)) == ["session.updated", "session.warning"]  # alloy: its default
    second = update(instructions="You are Bob.", audio={"output": {"voice": "VARM0"}}, tools=[TOOL])
    assert types(s.handle(second, 0.1)) == ["session.updated"]
    assert s.take_actions() == [] and not s.slot_open  # nothing reaches the model before its input
    s.handle(append(), 0.2, decoded())
    opened, feed = s.take_actions()
    assert opened == OpenSlot(SlotOptions(instructions="You are Bob.", voice="VARM0", tools=(TOOL_SPEC,)))
    assert isinstance(feed, FeedAudio) and s.slot_open


def test_an_openai_voice_is_the_models_default_and_a_model_without_voices_keeps_none() -> None:
    fixed, plain = session(FIXED), session(PLAIN)
    for s in (fixed, plain):
        updated, warning = s.handle(update(audio={"output": {"voice": "marin"}}), 0.0)
        assert updated.session.audio.output.voice == s.caps.default_voice
        assert (types([warning]), warning.code, warning.param) == (
            ["session.warning"],
            "voice_substituted",
            "voice",
        )
    assert (fixed.settings.voice, plain.settings.voice) == ("NATF2", None)
    assert codes(fixed.handle(update(audio={"output": {"voice": "Nobody"}}), 0.1)) == [
        ("voice_not_found", "session.voice")
    ]


def test_a_substituted_voice_is_named_with_the_one_asked_for_and_a_voice_the_model_has_is_not() -> None:
    fixed, plain = session(FIXED), session(PLAIN)
    _, warning = fixed.handle(update(audio={"output": {"voice": "alloy"}}), 0.0)
    assert "'alloy'" in warning.message and "'NATF2'" in warning.message
    assert types(fixed.handle(update(audio={"output": {"voice": "VARM0"}}), 0.1)) == ["session.updated"]
    assert fixed.settings.voice == "VARM0"
    # Any name on a model without named voices: it speaks in its own voice, and the session says so.
    updated, warning = plain.handle(update(voice="narrator"), 0.0)
    assert updated.session.audio.output.voice is None and plain.settings.voice is None
    assert warning.code == "voice_substituted" and "'narrator'" in warning.message


def test_tools_for_a_model_that_cannot_call_them_are_accepted_and_listed_as_none() -> None:
    s = session(PLAIN)
    (updated,) = s.handle(update(instructions="Be brief.", tools=[TOOL]), 0.0)
    assert updated.session.tools == [] and updated.session.instructions == "Be brief."
    assert s.slot_options().tools == ()


def test_a_refused_input_does_not_open_the_slot() -> None:
    s = session()
    assert codes(s.handle(InputAudioBufferCommit(), 0.0)) == [("input_audio_buffer_empty", None)]
    frames_only = InputAudioBufferAppend(audio=b"")
    refused = s.handle(frames_only, 0.1, msgspec.structs.replace(decoded(0), video_frames=(b"jpeg",)))
    assert codes(refused) == [("invalid_input_modality", "video_frames")]
    assert s.take_actions() == [] and not s.slot_open


def test_a_response_create_is_an_input_that_opens_the_slot() -> None:
    s = session()
    assert types(s.handle(ResponseCreate(), 0.0)) == ["response.created"]
    opened, wake = s.take_actions()
    assert isinstance(opened, OpenSlot) and isinstance(wake, WakeAt)


# --------------------------------------------------------------------------- opened ahead


def test_the_slot_opens_ahead_once_the_settings_are_quiet_and_the_first_input_keeps_it() -> None:
    s = session(prefill_delay_s=0.1)
    s.begin(0.0)
    assert s.take_actions() == [WakeAt(0.1)]
    s.handle(update(instructions="You are Ada."), 0.05)
    assert s.take_actions() == [WakeAt(pytest.approx(0.15))]
    assert s.on_timer(0.1) == [] and s.take_actions() == [WakeAt(pytest.approx(0.15))]  # not yet
    s.on_timer(0.16)
    ahead = SlotOptions(instructions="You are Ada.", voice="NATF2")
    assert s.take_actions() == [OpenSlot(ahead)] and s.slot_phase is SlotPhase.AHEAD
    assert not s.slot_open  # every setting may still change
    s.handle(append(), 0.3, decoded())
    (feed,) = s.take_actions()  # the slot opened ahead is the session's: nothing more to open
    assert isinstance(feed, FeedAudio) and s.slot_open
    assert s.on_timer(0.4) == [] and s.take_actions() == []


def test_a_change_after_the_slot_opened_ahead_opens_it_again_before_the_first_input() -> None:
    s = session(prefill_delay_s=0.1)
    s.begin(0.0)
    s.on_timer(0.1)
    assert s.take_actions()[-1] == OpenSlot(SlotOptions(voice="NATF2"))
    assert types(s.handle(update(instructions="You are Bob."), 0.2)) == ["session.updated"]
    s.handle(update(output_modalities=["text"]), 0.25)  # not what the model reads at open
    s.on_timer(0.35)
    bob = SlotOptions(instructions="You are Bob.", voice="NATF2")
    assert [a for a in s.take_actions() if not isinstance(a, WakeAt)] == [RestartSlot(bob)]
    s.handle(update(output_modalities=["audio"]), 0.4)
    s.on_timer(0.5)
    assert [a for a in s.take_actions() if not isinstance(a, WakeAt)] == []  # the same options
    assert s.epoch == 0  # nothing was heard: nothing to fence


def test_a_change_just_before_the_first_input_opens_the_slot_again_at_that_input() -> None:
    s = session(prefill_delay_s=0.1)
    s.begin(0.0)
    s.on_timer(0.1)
    s.take_actions()
    s.handle(update(tools=[TOOL]), 0.2)
    s.handle(append(), 0.21, decoded())
    actions = [a for a in s.take_actions() if not isinstance(a, WakeAt)]
    assert actions[0] == RestartSlot(SlotOptions(voice="NATF2", tools=(TOOL_SPEC,)))
    assert isinstance(actions[1], FeedAudio) and s.slot_open
    s.on_timer(0.3)
    assert s.take_actions() == []  # the pending prefill went with the input


def test_a_slot_opened_ahead_has_nothing_to_cancel_and_a_refused_one_opens_at_the_first_input() -> None:
    s = session(dialect=Dialect.SEEDS, prefill_delay_s=0.1)
    s.begin(0.0)
    s.on_timer(0.1)
    s.take_actions()
    s.handle(decode('{"type": "input.cancel"}'), 0.2)
    assert not any(isinstance(a, CancelSlot) for a in s.take_actions())
    assert codes(s.slot_failed("invalid_session_config", "no", 0.3)) == [("invalid_session_config", None)]
    assert s.slot_phase is SlotPhase.CLOSED
    s.handle(append(), 0.4, decoded())
    assert isinstance(s.take_actions()[0], OpenSlot)


# --------------------------------------------------------------------------- after it


@pytest.mark.parametrize(
    ("patch", "code", "param"),
    [
        ({"instructions": "You are Bob."}, "persona_update_unsupported", "session.instructions"),
        ({"audio": {"output": {"voice": "VARM0"}}}, "voice_update_unsupported", "session.voice"),
        ({"tools": []}, "tools_update_unsupported", "session.tools"),
        ({"extra_body": {"ref_audio": WAV}}, "ref_audio_update_unsupported", "session.extra_body.ref_audio"),
        ({"initial_user_text": "Hi."}, "invalid_session_config", "session.initial_user_text"),
        (
            {"extra_body": {"force_listen_count": 2}},
            "invalid_session_config",
            "session.extra_body.force_listen_count",
        ),
    ],
)
def test_a_setting_fixed_at_open_is_refused_by_name_after_it(patch: dict, code: str, param: str) -> None:
    s = session()
    s.handle(update(tools=[TOOL]), 0.0)
    open_model(s)
    before = s.settings
    refused = s.handle(update(**patch), 0.1)
    assert codes(refused) == [(code, param)]
    assert "extra_body.restart_on_update" in refused[0].error.message
    assert s.settings == before and s.take_actions() == []
    # The values it opened with, sent again, change nothing and are accepted.
    same = update(instructions="", audio={"output": {"voice": "NATF2"}}, tools=[TOOL])
    assert types(s.handle(same, 0.2)) == ["session.updated"] and s.take_actions() == []


@pytest.mark.parametrize(
    ("dialect", "reason"), [(Dialect.GA, "client_cancelled"), (Dialect.SEEDS, "session_updated")]
)
def test_restart_on_update_restarts_the_model_with_the_new_settings(dialect: Dialect, reason: str) -> None:
    s = session(dialect=dialect)
    s.handle(update(instructions="You are Ada.", extra_body={"restart_on_update": True}), 0.0)
    open_model(s)
    s.on_output(speak(), 0.1)  # the model is answering
    (item_id,) = s.conversation.ids()
    events = s.handle(update(instructions="You are Bob.", tools=[TOOL]), 0.2)
    assert types(events)[-3:] == ["response.done", "rate_limits.updated", "session.updated"]
    done = events[-3].response
    assert (done.status, done.status_details.reason) == ("cancelled", reason)
    assert events[-1].session.instructions == "You are Bob."
    restarted = SlotOptions(instructions="You are Bob.", voice="NATF2", tools=(TOOL_SPEC,))
    assert s.take_actions() == [RestartSlot(restarted)]
    assert s.epoch == 1 and s.slot_open
    assert s.on_output(speak(epoch=0), 0.3) == []  # the old context's output is dropped
    assert s.conversation.ids() == [item_id]  # the conversation keeps its items
    assert types(s.on_output(speak(epoch=1), 0.4))[:1] == ["response.created"]


def test_restart_on_update_may_come_with_the_change_and_a_restart_needs_no_response() -> None:
    s = session()
    open_model(s)
    events = s.handle(update(instructions="You are Bob.", extra_body={"restart_on_update": True}), 0.1)
    assert types(events) == ["session.updated"]
    assert s.take_actions() == [RestartSlot(SlotOptions(instructions="You are Bob.", voice="NATF2"))]
    assert s.epoch == 1


def test_a_new_voice_after_the_model_spoke_is_refused_even_with_a_restart() -> None:
    s = session()
    s.handle(update(extra_body={"restart_on_update": True}), 0.0)
    open_model(s)
    s.on_output(speak(), 0.1)
    refused = s.handle(update(audio={"output": {"voice": "VARM0"}}), 0.2)
    assert codes(refused) == [("voice_update_after_audio_unsupported", "session.voice")]
    assert s.settings.voice == "NATF2" and [a for a in s.take_actions() if isinstance(a, RestartSlot)] == []


def test_a_refused_open_fails_the_waiting_response_and_the_next_input_opens_again() -> None:
    s = session()
    s.handle(ResponseCreate(), 0.0)
    s.take_actions()
    events = s.slot_failed("invalid_session_config", "the persona does not fit", 0.1, param="instructions")
    assert codes(events) == [("invalid_session_config", "instructions")]
    assert events[0].error.message == "the persona does not fit"
    done = next(e for e in events if types([e]) == ["response.done"]).response
    assert done.status == "failed" and done.status_details.error.code == "invalid_session_config"
    assert not s.slot_open and s.take_actions() == []  # nothing to cancel: no slot is open
    s.handle(update(instructions="Short."), 0.2)
    s.handle(append(), 0.3, decoded())
    opened, _ = s.take_actions()
    assert opened == OpenSlot(SlotOptions(instructions="Short.", voice="NATF2"))


def test_the_open_and_the_restart_carry_the_client_event_that_caused_them() -> None:
    """The ``OpenSlot`` of an input and the ``RestartSlot`` of an update name the client event, so a
    refusal answers it; one opened ahead of any input (a timer) names none."""
    s = session(prefill_delay_s=0.05)
    s.handle(update(instructions="Ahead.", extra_body={"restart_on_update": True}), 0.0)
    s.take_actions()
    s.on_timer(0.05)
    assert s.take_actions() == [OpenSlot(SlotOptions(instructions="Ahead.", voice="NATF2"))]
    s.handle(update(instructions="Changed."), 0.06)
    s.take_actions()
    s.handle(ResponseCreate(event_id="evt_create"), 0.07)
    restarted = SlotOptions(instructions="Changed.", voice="NATF2")
    assert s.take_actions()[0] == RestartSlot(restarted, "evt_create")
    s.handle(
        decode('{"type": "session.update", "event_id": "evt_update", "session": {"instructions": "Again."}}'),
        0.08,
    )
    assert RestartSlot(SlotOptions(instructions="Again.", voice="NATF2"), "evt_update") in s.take_actions()
    failed = s.slot_failed("invalid_session_config", "no", 0.09, event_id="evt_update")
    assert [(e.error.code, e.error.event_id) for e in failed[:1]] == [
        ("invalid_session_config", "evt_update")
    ]


def test_an_epoch_advanced_before_the_slot_opened_cancels_nothing_and_after_it_does() -> None:
    s = session(dialect=Dialect.SEEDS)
    s.handle(decode('{"type": "input.cancel"}'), 0.0)
    assert not any(isinstance(a, CancelSlot) for a in s.take_actions())
    open_model(s, 0.1)
    s.handle(decode('{"type": "input.cancel"}'), 0.2)
    assert CancelSlot(2) in s.take_actions()


# --------------------------------------------------------------------------- through the engine

VOICE = pcm16_encode(np.full(1920, 0.2, np.float32))
STREAMING = {"input": {"turn_detection": None}}


class PickyEcho(EchoPlugin):
    """The echo model fixing its instructions at open, refusing a slot whose instructions are
    ``refuse me``; it notes the slot calls."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.calls: list[tuple[str, str]] = []
        self.opened = asyncio.Event()  # its calls run on the event loop (``calls_on_loop``)

    def capabilities(self) -> Capabilities:
        return msgspec.structs.replace(super().capabilities(), updatable_options=())

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        if options.instructions == "refuse me":
            raise PluginError("invalid_session_config", "these instructions are refused")
        super().open_slot(slot, options)
        self.calls.append(("open", options.instructions))
        self.opened.set()

    def close_slot(self, slot: int) -> None:
        super().close_slot(slot)
        self.calls.append(("close", ""))


def echo_engine(plugin: EchoPlugin, prefill_delay_ms: float | None = None) -> Engine:
    """The engine around ``plugin``; the slot opens at the first input unless ``prefill_delay_ms``."""
    plugin.load()
    config = EngineConfig(reaper_interval_s=3600, slot_prefill_delay_ms=prefill_delay_ms)
    return Engine(plugin, config, model_name="echo")


async def test_a_refused_open_answers_the_first_input_and_the_session_goes_on() -> None:
    plugin = PickyEcho(max_sessions=2)
    async with echo_engine(plugin) as eng:
        att = await eng.open(update=update(instructions="refuse me", audio=STREAMING))
        assert types(await until(att, "session.updated"))[0] == "session.created"
        att.submit(InputAudioBufferAppend(audio=VOICE, event_id="evt_1"))
        error = (await until(att, "error"))[-1]
        assert (error.error.code, error.error.message, error.error.event_id) == (
            "invalid_session_config",
            "these instructions are refused",
            "evt_1",  # the append whose input opened the slot
        )
        assert plugin.calls == [] and eng.manager.records[att.session_id].slot_open is False
        att.submit(update(instructions="fine"))
        await until(att, "session.updated")
        for _ in range(3):
            att.submit(InputAudioBufferAppend(audio=VOICE))
        events = await until(att, "response.output_audio.delta")
        assert events[-1].delta == VOICE and plugin.calls == [("open", "fine")]


async def test_a_refused_restart_answers_the_update_that_asked_for_it() -> None:
    plugin = PickyEcho(max_sessions=2)
    async with echo_engine(plugin) as eng:
        patch = update(instructions="one", extra_body={"restart_on_update": True}, audio=STREAMING)
        att = await eng.open(update=patch)
        att.submit(InputAudioBufferAppend(audio=VOICE))
        await plugin.opened.wait()
        refused = decode(
            '{"type": "session.update", "event_id": "evt_u", "session": {"instructions": "refuse me"}}'
        )
        att.submit(refused)
        error = (await until(att, "error"))[-1]
        assert (error.error.code, error.error.event_id) == ("invalid_session_config", "evt_u")


async def test_a_restart_closes_and_reopens_the_slot_and_the_model_hears_on() -> None:
    plugin = PickyEcho(max_sessions=2)
    async with echo_engine(plugin) as eng:
        patch = update(instructions="one", extra_body={"restart_on_update": True}, audio=STREAMING)
        att = await eng.open(update=patch)
        for _ in range(3):
            att.submit(InputAudioBufferAppend(audio=VOICE))
        await until(att, "response.output_audio.delta")
        att.submit(update(instructions="two"))
        events = await until(att, "session.updated")
        assert "response.done" in types(events)
        for _ in range(3):
            att.submit(InputAudioBufferAppend(audio=VOICE))
        created = await until(att, "response.output_audio.delta")
        assert "response.created" in types(created)
        record = eng.manager.records[att.session_id]
        assert plugin.calls == [("open", "one"), ("close", ""), ("open", "two")] and record.slot_open


async def test_the_engine_opens_the_slot_ahead_and_the_first_input_finds_it_open() -> None:
    plugin = PickyEcho(max_sessions=2)
    async with echo_engine(plugin, prefill_delay_ms=10.0) as eng:
        att = await eng.open(update=update(instructions="one", audio=STREAMING))
        await plugin.opened.wait()  # no input yet
        assert plugin.calls == [("open", "one")]
        for _ in range(3):
            att.submit(InputAudioBufferAppend(audio=VOICE))
        events = await until(att, "response.output_audio.delta")
        assert events[-1].delta == VOICE and plugin.calls == [("open", "one")]
