"""Two things a front door needs from the session: an append that takes the turn
(``force_barge_in``, the MAP dialect's ``force_listen``) and the model's token counts
(``SlotOutput.usage``) in ``response.done`` and ``session.closed``. Sans-IO, on the scripted unit
model's capabilities."""

from __future__ import annotations

import msgspec
import numpy as np

from duplex.engine.actions import CancelSlot
from duplex.plugins.base import SlotOutput, TokenUsage
from duplex.protocol.ext.commands import DuplexInputAudioBufferAppend
from duplex.protocol.realtime.responses import Usage
from tests.engine.conftest import decoded, make_session, types


def speak(epoch: int = 0, usage: TokenUsage | None = None) -> SlotOutput:
    pcm = np.full(24000, 0.1, np.float32)
    return SlotOutput(slot=0, epoch=epoch, pcm=pcm, text="hi", decision="speak", usage=usage)


def forced() -> DuplexInputAudioBufferAppend:
    return DuplexInputAudioBufferAppend(audio=b"", force_barge_in=True)


def done_of(events):
    return next(e for e in events if types([e]) == ["response.done"])


def test_a_forced_append_cancels_the_active_response_even_in_silence() -> None:
    s = make_session("unit")
    s.on_output(speak(), 1.0)
    s.take_actions()
    events = s.handle(forced(), 1.5, decoded(1000, rate=16000, level=0.0))
    assert types(events)[0] == "overlap.decision"
    assert types(events)[-2:] == ["response.done", "rate_limits.updated"]
    assert (events[0].action, events[0].reason) == ("barge_in", "client_force_barge_in")
    assert done_of(events).response.status == "cancelled"
    assert s.epoch == 1 and any(isinstance(a, CancelSlot) for a in s.take_actions())
    assert s.on_output(speak(epoch=0), 2.0) == []  # the old reply is fenced off


def test_a_forced_append_with_no_active_response_is_only_audio() -> None:
    s = make_session("unit")
    assert s.handle(forced(), 1.0, decoded(1000, rate=16000)) == []
    assert s.epoch == 0


def test_a_forced_append_on_a_model_without_barge_in_keeps_listening() -> None:
    s = make_session("echo")
    s.caps = msgspec.structs.replace(s.caps, supports_barge_in=False)
    s.on_output(SlotOutput(slot=0, epoch=0, pcm=np.full(1920, 0.1, np.float32), decision="speak"), 0.1)
    events = s.handle(forced(), 0.2, decoded())
    assert types(events) == ["overlap.decision"]
    assert (events[0].action, events[0].reason) == ("listen", "barge_in_unsupported")


def usage(total: int, inputs: int, outputs: int, audio_in: int, image: int, text_out: int, audio_out: int):
    return Usage(
        total_tokens=total,
        input_tokens=inputs,
        output_tokens=outputs,
        input_token_details={
            "cached_tokens": 0,
            "text_tokens": 0,
            "audio_tokens": audio_in,
            "image_tokens": image,
        },
        output_token_details={"text_tokens": text_out, "audio_tokens": audio_out},
    )


def test_response_done_bills_the_tokens_since_the_previous_response_and_closed_the_total() -> None:
    s = make_session("unit")
    heard = TokenUsage(input_audio=25, input_image=64)
    s.on_output(SlotOutput(slot=0, epoch=0, decision="listen", usage=heard), 1.0)
    s.on_output(speak(usage=TokenUsage(input_audio=25, output_text=1, output_audio=25)), 2.0)
    events = s.on_output(SlotOutput(slot=0, epoch=0, decision="listen", usage=heard), 3.0)
    assert done_of(events).response.usage == usage(229, 203, 26, 75, 128, 1, 25)
    s.on_output(SlotOutput(slot=0, epoch=0, decision="listen", usage=TokenUsage(input_audio=25)), 4.0)
    (closed,) = s.close("client_close", 5.0)
    assert closed.usage == usage(254, 228, 26, 100, 128, 1, 25)


def test_stale_output_still_counts_and_a_model_without_usage_closes_without_it() -> None:
    s = make_session("unit")
    s.epoch = 3
    s.on_output(speak(epoch=0, usage=TokenUsage(input_audio=25)), 1.0)
    (closed,) = s.close("client_close", 2.0)
    assert closed.usage.input_tokens == 25
    echo = make_session("echo")
    (closed,) = echo.close("client_close", 1.0)
    assert closed.usage is None
