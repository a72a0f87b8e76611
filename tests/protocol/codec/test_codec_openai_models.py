"""Our GA renderings validate against the official ``openai`` package's realtime event models.

Strict clients (Pipecat, the SDK's typed events) parse server events with these pydantic models, so a
GA event we render must pass ``TypeAdapter(RealtimeServerEvent)`` and a GA command we render must pass
``TypeAdapter(RealtimeClientEvent)``. Our Tier 3 types are not in OpenAI's unions and are not
collected here (``OURS_ONLY``); our Tier 2 twins must still pass (their extra fields are ignored by those
models). The beta rendering is checked against the SDK's beta models the same way, for every event that
has a beta twin. Each test is parametrised over exactly the samples it checks, so nothing here skips.
"""

from __future__ import annotations

import json
import typing
from typing import Any

import pydantic
import pytest
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent
from openai.types.realtime import RealtimeClientEvent, RealtimeServerEvent

import duplex.protocol as p
from tests.protocol.codec.conftest import command_samples, event_samples

SERVER = pydantic.TypeAdapter(RealtimeServerEvent)
CLIENT = pydantic.TypeAdapter(RealtimeClientEvent)
BETA_SERVER = pydantic.TypeAdapter(BetaServerEvent)

OURS_ONLY = {
    "session.resumed",
    "session.replaced",
    "session.expired",
    "session.resync_required",
    "session.closed",
    "session.heartbeat_ack",
    "session.warning",
    "session.queued",
    "playback.acknowledged",
    "response.listen",
    "response.speak",
    "overlap.decision",
    "response.output_image.done",
    "response.output_video.delta",
    "response.progress",
    "turn.event",
    "session.resume",
    "session.event_ack",
    "session.heartbeat",
    "session.close",
    "barge_in",
    "playback.ack",
    "turn.signal",
    "input.cancel",
    "input.text.append",
}


def _tag(obj: object) -> str:
    return type(obj).__struct_config__.tag


def _in_openai_union(samples: list[object]) -> list[object]:
    return [sample for sample in samples if _tag(sample) not in OURS_ONLY]


def _validates_against(adapter: pydantic.TypeAdapter[Any], sample: object) -> None:
    """``sample``, rendered as GA JSON, parses strictly as the same type in OpenAI's union."""
    wire = json.loads(p.encode(sample))
    parsed = adapter.validate_python(wire)
    assert parsed.type == wire["type"]


@pytest.mark.parametrize("event", _in_openai_union(event_samples()), ids=_tag)
def test_server_events_validate_against_openai(event: object) -> None:
    _validates_against(SERVER, event)


@pytest.mark.parametrize("command", _in_openai_union(command_samples()), ids=_tag)
def test_client_commands_validate_against_openai(command: object) -> None:
    _validates_against(CLIENT, command)


def test_every_type_left_out_of_the_openai_checks_is_one_we_render() -> None:
    """A stale ``OURS_ONLY`` entry would hide nothing today but could hide a renamed type tomorrow."""
    assert {_tag(sample) for sample in [*event_samples(), *command_samples()]} >= OURS_ONLY


def _beta_types() -> set[str]:
    """The ``type`` literals of every model in the SDK's beta server-event union."""
    union = typing.get_args(BetaServerEvent)[0]
    types: set[str] = set()
    for model in typing.get_args(union):
        types.update(typing.get_args(model.model_fields["type"].annotation))
    return types


BETA_TYPES = _beta_types()


def _beta_type(event: object) -> str:
    return json.loads(p.encode(event, p.Mode.BETA))["type"]


@pytest.mark.parametrize(
    "event", [e for e in event_samples() if _beta_type(e) in BETA_TYPES], ids=_tag
)
def test_beta_rendering_validates_against_openai_beta_models(event: object) -> None:
    wire = json.loads(p.encode(event, p.Mode.BETA))
    if "session" in wire:
        # The beta models pin `session.model` to OpenAI's model names; ours is served under its own.
        wire["session"]["model"] = "gpt-realtime"
    parsed = BETA_SERVER.validate_python(wire)
    assert parsed.type == wire["type"]


def test_beta_knows_the_renamed_audio_events() -> None:
    assert {"response.audio.delta", "response.audio_transcript.delta", "response.text.delta"} <= BETA_TYPES


def test_a_delta_without_its_ids_is_rejected_by_the_oracle() -> None:
    # The oracle is strict enough to catch a missing required id.
    with pytest.raises(pydantic.ValidationError):
        SERVER.validate_python({"type": "response.output_audio.delta", "event_id": "e", "delta": "AAAA"})
