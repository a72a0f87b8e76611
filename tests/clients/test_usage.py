"""Every ``response.done`` carries ``usage`` (zeros when the model reports no token counts).

The fixture ``make_client`` also checks every ``response.done`` of the shared scenario suite against
the ``openai`` SDK's model; these tests pin the exact value for a completed and a cancelled response.
"""

from __future__ import annotations

import numpy as np

from clients import event_type
from duplex.protocol.realtime import Usage

from .conftest import check_response_done

FRAME = 1920  # 80 ms at 24 kHz

ZERO = Usage(
    total_tokens=0,
    input_tokens=0,
    output_tokens=0,
    input_token_details={"cached_tokens": 0, "text_tokens": 0, "audio_tokens": 0, "image_tokens": 0},
    output_token_details={"text_tokens": 0, "audio_tokens": 0},
)


def voiced(frames: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(frames).standard_normal(FRAME * frames)).astype(np.float32)


async def test_a_completed_response_done_carries_zero_usage(make_client):
    c = await make_client()
    next_response = c.next_response()
    await c.stream_pcm(np.concatenate([voiced(3), np.zeros(FRAME * 3, np.float32)]), realtime=False)
    handle = await next_response
    done = await handle.done(timeout=10)
    assert done.response.status == "completed" and done.response.usage == ZERO
    check_response_done(done)


async def test_a_cancelled_response_done_carries_zero_usage(make_client):
    c = await make_client()
    created = []
    c.add_listener(lambda e: created.append(e) if event_type(e) == "response.created" else None)
    next_response = c.next_response()
    await c.stream_pcm(voiced(6), realtime=False)
    handle = await next_response
    await c.cancel_response()
    done = await handle.done(timeout=10)
    assert done.response.status == "cancelled" and done.response.usage == ZERO
    assert created[0].response.usage is None  # response.created carries none, as OpenAI's
