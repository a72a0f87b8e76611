"""Our GA renderings validate against the official ``openai`` package's realtime event models.

Strict clients (Pipecat, the SDK's typed events) parse server events with these pydantic models, so a
GA event we render must pass ``TypeAdapter(RealtimeServerEvent)`` and a GA command we render must pass
``TypeAdapter(RealtimeClientEvent)``. Our Tier 3 types are not in OpenAI's unions and are skipped; our
Tier 2 twins must still pass (their extra fields are ignored by those models). The beta rendering is
checked against the SDK's beta models the same way.
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


def _validates_against(adapter: pydantic.TypeAdapter[Any], sample: object) -> None:
    """``sample``, rendered as GA JSON, parses strictly as the same type in OpenAI's union."""
    if _tag(sample) in OURS_ONLY:
        pytest.skip("our extension; not in OpenAI's union")
    wire = json.loads(p.encode(sample))
    parsed = adapter.validate_python(wire)
    assert parsed.type == wire["type"]


def test_server_events_validate_against_openai(event_sample: object) -> None:
    _validates_against(SERVER, event_sample)


def test_client_commands_validate_against_openai(command_sample: object) -> None:
    _validates_against(CLIENT, command_sample)


def _beta_types() -> set[str]:
    """The ``type`` literals of every model in the SDK's beta server-event union."""
    union = typing.get_args(BetaServerEvent)[0]
    types: set[str] = set()
    for model in typing.get_args(union):
        types.update(typing.get_args(model.model_fields["type"].annotation))
    return types


BETA_TYPES = _beta_types()


def test_beta_rendering_validates_against_openai_beta_models(event_sample: object) -> None:
    wire = json.loads(p.encode(event_sample, p.Mode.BETA))
    if wire["type"] not in BETA_TYPES:
        pytest.skip("no beta twin; beta clients ignore this type")
    if "session" in wire:
        # The beta models pin `session.model` to OpenAI's model names; ours is served under its own.
        wire["session"]["model"] = "gpt-realtime"
    parsed = BETA_SERVER.validate_python(wire)
    assert parsed.type == wire["type"]


def test_beta_knows_the_renamed_audio_events() -> None:
    assert {"response.audio.delta", "response.audio_transcript.delta", "response.text.delta"} <= BETA_TYPES


def test_a_delta_without_its_ids_is_rejected_by_the_oracle() -> None:
    # The oracle is strict enough to catch a missing required id (anchors §5.1).
    with pytest.raises(pydantic.ValidationError):
        SERVER.validate_python({"type": "response.output_audio.delta", "event_id": "e", "delta": "AAAA"})
