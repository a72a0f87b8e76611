"""Invariants of the sans-IO session under random command and model-output sequences.

A hypothesis state machine drives one ``Session`` per run, for each plugin kind,
and checks after every step:

* every ``response.created`` gets exactly one ``response.done`` (checked at the end,
  after ``close``, which ends any open response);
* no event of a response follows its ``response.done``;
* ``server_event_seq`` is strictly increasing across the whole stream;
* replaying the journal from any acked seq reproduces the live stream after it;
* the history never holds assistant text beyond ``committed_ms``.

The fast tier runs a few hundred sequences; ``-m slow`` runs thousands.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from duplex.engine.vad import SpeechStarted, SpeechStopped
from duplex.engine.vad_config import VadConfig
from duplex.plugins.base import SlotOutput, ToolCall
from duplex.protocol.ext.commands import BargeIn, DuplexInputAudioBufferCommit, PlaybackAck, SessionEventAck
from duplex.protocol.realtime.commands import (
    ConversationItemTruncate,
    InputAudioBufferClear,
    OutputAudioBufferClear,
    ResponseCancel,
    ResponseCreate,
)
from duplex.protocol.realtime.items import MessageItem

from .conftest import append, decoded, make_session, types

PCM = np.full(1920, 0.2, np.float32)
TEXTS = st.sampled_from(["", "w ", "hello ", "a b c "])


class SessionMachine(RuleBasedStateMachine):
    kind = "echo"

    def __init__(self) -> None:
        super().__init__()
        self.session = make_session(
            self.kind,
            playback_commit_policy="ack_only",
            vad=VadConfig() if self.kind == "turn" else None,
            overlap_policy="barge_in_on_speech",
        )
        self.now = 0.0
        self.stream: list = []
        self.created: dict[str, int] = {}
        self.done: set[str] = set()
        self.acked = 0

    # ---------------------------------------------------------------- plumbing

    def _feed(self, events: list) -> None:
        for event in events:
            tag = types([event])[0]
            rid = getattr(event, "response_id", None)
            if tag == "response.created":
                rid = event.response.id
                assert rid not in self.created
                self.created[rid] = 0
            elif tag == "response.done":
                rid = event.response.id
                assert rid in self.created and rid not in self.done, "response.done twice or unknown"
                self.done.add(rid)
            elif rid is not None and tag.startswith("response."):
                assert rid not in self.done, f"{tag} after response.done of {rid}"
            if event.server_event_seq is not None:
                if self.stream:
                    assert event.server_event_seq == self.stream[-1].server_event_seq + 1
                self.stream.append(event)
        self.session.take_actions()

    def _handle(self, command, decoded_append=None) -> None:
        self.now += 0.01
        self._feed(self.session.handle(command, self.now, decoded_append))

    def _output(self, output: SlotOutput) -> None:
        self.now += 0.01
        self._feed(self.session.on_output(output, self.now))

    # ---------------------------------------------------------------- client commands

    @rule(
        level=st.sampled_from([0.0, 0.2]),
        vad=st.sampled_from(["none", "start", "stop"]),
        ms=st.sampled_from([80, 400]),
    )
    def append_audio(self, level: float, vad: str, ms: int) -> None:
        events = {
            "none": (),
            "start": (SpeechStarted(audio_start_ms=0),),
            "stop": (SpeechStopped(audio_end_ms=10),),
        }
        rate = self.session.caps.input_sample_rate
        self._handle(append(), decoded(ms, rate=rate, level=level, vad=events[vad], in_speech=vad == "start"))

    @rule(create=st.sampled_from([None, True, False]), speech=st.sampled_from([None, False]))
    def commit(self, create, speech) -> None:
        self._handle(DuplexInputAudioBufferCommit(create_response=create, is_speech=speech))

    @rule()
    def response_create(self) -> None:
        self._handle(ResponseCreate())

    @rule()
    def response_cancel(self) -> None:
        self._handle(ResponseCancel())

    @rule()
    def barge_in(self) -> None:
        self._handle(BargeIn())

    @rule()
    def clear_output(self) -> None:
        self._handle(OutputAudioBufferClear())

    @rule()
    def clear_input(self) -> None:
        self._handle(InputAudioBufferClear())

    @rule(played=st.integers(0, 3000), truncate=st.booleans())
    def playback_ack(self, played: int, truncate: bool) -> None:
        self._handle(PlaybackAck(played_ms=played, truncate=truncate))

    @precondition(lambda self: bool(self.session.output.recent))
    @rule(ms=st.integers(0, 2000), data=st.data())
    def truncate(self, ms: int, data) -> None:
        response = data.draw(st.sampled_from(list(self.session.output.recent)))
        self._handle(ConversationItemTruncate(item_id=response.item_id, audio_end_ms=ms))

    @precondition(lambda self: bool(self.stream))
    @rule(data=st.data())
    def event_ack(self, data) -> None:
        head = self.stream[-1].server_event_seq
        seq = data.draw(st.integers(self.acked, head))
        self._handle(SessionEventAck(server_event_seq=seq))
        self.acked = max(self.acked, seq)

    # ---------------------------------------------------------------- model outputs

    @rule(text=TEXTS, end=st.booleans(), audio=st.booleans(), stale=st.booleans())
    def model_chunk(self, text: str, end: bool, audio: bool, stale: bool) -> None:
        epoch = self.session.epoch - 1 if stale else self.session.epoch
        pcm = PCM if audio else None
        self._output(SlotOutput(slot=0, epoch=epoch, pcm=pcm, text=text, decision="speak", end_of_turn=end))

    @rule()
    def model_listen(self) -> None:
        self._output(SlotOutput(slot=0, epoch=self.session.epoch, decision="listen"))

    @rule()
    def model_tool_call(self) -> None:
        call = ToolCall(call_id=f"call_{len(self.stream)}", name="f", arguments="{}")
        self._output(SlotOutput(slot=0, epoch=self.session.epoch, tool_call=call, end_of_turn=True))

    # ---------------------------------------------------------------- invariants

    @invariant()
    def journal_replays_the_live_stream(self) -> None:
        live = [e for e in self.stream if e.server_event_seq > self.acked]
        assert self.session.journal.replay_after(self.acked) == live

    @invariant()
    def history_holds_no_text_beyond_committed_ms(self) -> None:
        output = self.session.output
        responses = [*output.recent, *([output.active] if output.active else [])]
        for response in responses:
            if response.item_id not in self.session.conversation:
                continue
            item = self.session.conversation.get(response.item_id)
            assert isinstance(item, MessageItem)
            text = "".join(
                getattr(p, "transcript", None) or getattr(p, "text", "") or "" for p in item.content
            )
            assert text == response.cursor.committed_text
            assert response.cursor.committed_ms <= response.cursor.sent_ms

    def teardown(self) -> None:
        self._feed(self.session.close("client_close", self.now + 1))
        assert set(self.created) == self.done, "a response.created without its response.done"
        assert types(self.stream[-1:]) == ["session.closed"]


class UnitMachine(SessionMachine):
    kind = "unit"


class TurnMachine(SessionMachine):
    kind = "turn"


FAST = settings(
    max_examples=80, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)
SLOW = settings(
    max_examples=2000, stateful_step_count=60, deadline=None, suppress_health_check=list(HealthCheck)
)


@pytest.mark.parametrize("machine", [SessionMachine, UnitMachine, TurnMachine], ids=["frame", "unit", "turn"])
def test_session_invariants(machine) -> None:
    case = machine.TestCase
    case.settings = FAST
    case("runTest").runTest()


@pytest.mark.slow
@pytest.mark.parametrize("machine", [SessionMachine, UnitMachine, TurnMachine], ids=["frame", "unit", "turn"])
def test_session_invariants_thousands(machine) -> None:
    case = machine.TestCase
    case.settings = SLOW
    case("runTest").runTest()
