"""``POST /v1/images/generations`` through a real server, called with the official ``openai`` SDK: a
tiny random-weight Stable Diffusion (32 x 32 images) on the session layer, and every refusal with
OpenAI's error body and status."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from tests.server.batch_servers import batch_server

pytestmark = pytest.mark.timeout(120)


def pixels(b64: str) -> np.ndarray:
    data = base64.b64decode(b64)
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == "PNG" and image.mode == "RGB"
        return np.asarray(image)


async def test_the_sdk_generates_n_pngs_and_a_seed_repeats_them(sd) -> None:
    async with batch_server([("sd", sd)]) as server:
        client = server.client()
        two = await client.images.generate(
            model="sd", prompt="a red fox in snow", n=2, size="32x32", extra_body={"seed": 3, "steps": 2}
        )
        again = await client.images.generate(
            model="sd", prompt="a red fox in snow", n=2, size="32x32", extra_body={"seed": 3, "steps": 2}
        )
        other = await client.images.generate(
            model="sd",
            prompt="a red fox in snow",
            size="auto",
            response_format="b64_json",
            extra_body={"seed": 4},
        )
    assert two.size == "32x32" and two.output_format == "png" and two.created > 0
    images = [pixels(d.b64_json) for d in two.data]  # type: ignore[arg-type, union-attr]
    assert [i.shape for i in images] == [(32, 32, 3), (32, 32, 3)]
    assert not np.array_equal(images[0], images[1])  # two images of one request differ
    assert [d.b64_json for d in again.data] == [d.b64_json for d in two.data]  # type: ignore[union-attr]
    assert len(other.data) == 1 and other.data[0].b64_json != two.data[0].b64_json  # type: ignore[index]


BAD_REQUESTS = [  # (the request's changes to a good one, status, OpenAI's code, param)
    ({"prompt": " "}, 400, "invalid_value", "prompt"),
    ({"n": 11}, 400, "invalid_value", "n"),
    ({"n": 5}, 400, "invalid_value", "n"),  # the model makes at most 4
    ({"size": "1024x1024"}, 400, "invalid_value", "size"),
    ({"prompt": "x" * 201}, 413, "string_above_max_length", "prompt"),
    ({"response_format": "url"}, 400, "invalid_value", "response_format"),
    ({"output_format": "jpeg"}, 400, "invalid_value", "output_format"),
    ({"model": "piper"}, 400, "invalid_model", "model"),
    ({"extra_body": {"steps": 51}}, 400, "invalid_value", "steps"),  # over the model's 50
]


async def test_bad_requests_get_openai_error_bodies_and_leave_the_route_healthy(sd, piper) -> None:
    async with batch_server([("sd", sd), ("piper", piper)]) as server:
        client = server.client()
        for change, status, code, param in BAD_REQUESTS:
            request = {"model": "sd", "prompt": "a fox", "size": "32x32", **change}
            with pytest.raises(openai.APIStatusError) as caught:
                await client.images.generate(**request)  # type: ignore[arg-type]
            body: dict = caught.value.body  # type: ignore[assignment]
            got = (caught.value.status_code, body["code"], body.get("param"))
            assert got == (status, code, param), change
        async with httpx.AsyncClient() as http:
            url = f"{server.http}/v1/images/generations"
            streamed = await http.post(url, json={"prompt": "a", "stream": True})
        ok = await client.images.generate(model="sd", prompt="a fox", size="32x32")
        assert server.engines["sd"].manager.open_count == 0
    assert (streamed.status_code, streamed.json()["error"]["param"]) == (400, "stream")
    assert len(ok.data) == 1  # type: ignore[arg-type]


async def test_without_a_model_or_with_openais_names_the_first_image_model_answers_and_is_named(
    piper, sd
) -> None:
    names = [None, "dall-e-2", "dall-e-3", "gpt-image-1", "flux-dev"]  # the last: the only image model
    async with batch_server([("piper", piper), ("sd", sd)]) as server, httpx.AsyncClient() as http:
        replies = []
        for name in names:
            body = {"prompt": "a fox", "steps": 1, **({"model": name} if name else {})}
            replies.append(await http.post(f"{server.http}/v1/images/generations", json=body))
    for name, reply in zip(names, replies, strict=True):
        assert reply.status_code == 200 and len(reply.json()["data"]) == 1, name
        assert reply.headers["x-duplex-model"] == "sd"


@pytest.fixture
def sd_one_bucket(one_torch_thread: None, sd_checkpoint: Path) -> Iterator[Any]:
    """The tiny Stable Diffusion with one batch bucket: every model call has the same shape, so a
    request's image is bit-identical alone or batched (with several buckets a row's rounding may
    differ between them)."""
    from batch_models.diffusion.plugin import StableDiffusionPlugin

    plugin = StableDiffusionPlugin.from_options(
        str(sd_checkpoint), max_sessions=4, batch_buckets="4", max_batch_rows=4
    )
    plugin.load()
    yield plugin
    plugin.close()


async def test_concurrent_requests_get_the_images_they_get_alone(sd_one_bucket) -> None:
    """Requests that finish in one step have their PNGs encoded together (on the driver's pool):
    each still gets its own image, the one its seed gives alone."""
    sd = sd_one_bucket

    async def generate(client, seed: int) -> str:
        reply = await client.images.generate(
            model="sd", prompt="a lighthouse", size="32x32", extra_body={"seed": seed, "steps": 2}
        )
        return reply.data[0].b64_json  # type: ignore[index, return-value]

    async with batch_server([("sd", sd)]) as server:
        client = server.client()
        together = await asyncio.gather(*(generate(client, seed) for seed in (5, 6, 7)))
        alone = [await generate(client, seed) for seed in (5, 6, 7)]
    assert together == alone and len(set(alone)) == 3
