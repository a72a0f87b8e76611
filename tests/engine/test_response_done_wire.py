"""``response.done`` as strict clients read it: ``usage`` always set, ``status_details`` valid for the
``openai`` SDK's ``RealtimeServerEvent`` model whatever the engine's reason for ending was; a seeds
client (``Dialect.SEEDS``) reads the duplex reasons instead, and the id at the top level."""

from __future__ import annotations

import pydantic
import pytest
from openai.types.realtime import RealtimeServerEvent

from duplex.engine.response import (
    SEEDS_WIRE_REASONS,
    WIRE_REASONS,
    ActiveResponse,
    EndReason,
    wire_reason,
    zero_usage,
)
from duplex.protocol import Dialect, Mode, encode
from duplex.protocol.formats import AudioFormat
from duplex.protocol.realtime.responses import ResponseError

SDK = pydantic.TypeAdapter(RealtimeServerEvent)
ENDINGS = [
    ("completed", "stop"),
    ("completed", "model_listen"),
    ("completed", "model_silent"),
    ("cancelled", "client_cancelled"),
    ("cancelled", "output_audio_buffer_clear"),
    ("cancelled", "barge_in"),
    ("cancelled", "turn_detected"),
    ("cancelled", "session_closed"),
    ("incomplete", "max_output_tokens"),
    ("failed", "error"),
]


def finished(status: str, reason: str, *, audio: bool = True, dialect: Dialect = Dialect.GA) -> list:
    r = ActiveResponse(
        "resp_1", epoch=0, audio=audio, output_format=AudioFormat("pcm16", 24000), dialect=dialect
    )
    r.add_chunk(audio_bytes=b"\0\0" * 240, duration_ms=10, text="hi", speak=True, previous_item_id=None)
    failed = status == "failed"
    error = ResponseError(type="server_error", code="model_failed", message="x") if failed else None
    return r.finish(status, reason, error)


@pytest.mark.parametrize(("status", "reason"), ENDINGS)
def test_every_response_done_validates_with_the_sdk_and_carries_usage(status: str, reason: str) -> None:
    done = next(e for e in finished(status, reason) if e.__struct_config__.tag == "response.done")
    parsed = SDK.validate_json(encode(done, Mode.GA))
    assert parsed.type == "response.done"
    assert parsed.response.status == status
    assert parsed.response.status_details.reason == WIRE_REASONS[reason]
    usage = parsed.response.usage
    assert (usage.total_tokens, usage.input_tokens, usage.output_tokens) == (0, 0, 0)
    assert usage.input_token_details.audio_tokens == 0 and usage.output_token_details.audio_tokens == 0
    assert done.response.usage == zero_usage()
    assert done.response_id == "resp_1"  # an extra field: the SDK's model keeps it aside


@pytest.mark.parametrize(("status", "reason"), ENDINGS)
def test_a_seeds_client_reads_the_duplex_reason_of_every_ending(status: str, reason: str) -> None:
    events = finished(status, reason, dialect=Dialect.SEEDS)
    done = next(e for e in events if e.__struct_config__.tag == "response.done")
    assert done.response.status_details.reason == SEEDS_WIRE_REASONS[reason]
    assert done.response.status_details.reason == (None if reason == "error" else reason)
    assert done.response_id == done.response.id == "resp_1"
    assert done.response.output[0].id == "item_resp_1"  # the seeds name the item after the response


def test_response_created_carries_no_usage() -> None:
    r = ActiveResponse("resp_1", epoch=0, audio=False, output_format=AudioFormat("pcm16", 24000))
    (created,) = r.created()
    assert created.response.usage is None
    assert created.response_id == "resp_1"
    SDK.validate_json(encode(created, Mode.GA))


def test_every_end_reason_has_its_wire_reason_and_only_openai_reasons_are_sent() -> None:
    assert set(WIRE_REASONS) == set(EndReason) and wire_reason(None) is None
    assert set(WIRE_REASONS.values()) <= {None, "turn_detected", "client_cancelled", "max_output_tokens",
                                          "content_filter"}
