"""The wire of OpenAI's ``POST /v1/images/generations``: the request body and the response.

``ImageGenerationRequest`` takes OpenAI's fields, bounded (``n`` at most ``MAX_IMAGES``, as OpenAI
bounds it), plus the diffusion parameters our image models take (``seed``, ``steps``,
``guidance_scale``, ``negative_prompt``). Images come back as PNG files in ``b64_json`` (what
``gpt-image-1`` always returns): ``response_format: "url"`` (there is no file store to point at),
another ``output_format`` than ``png``, a transparent ``background`` and ``stream: true`` are
refused by the route with ``invalid_request_error``. ``quality``, ``style``, ``moderation``,
``output_compression``, ``partial_images`` and ``user`` are accepted and have no effect.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from duplex.protocol.limits import MAX_GUIDANCE_SCALE, MAX_IMAGES, MAX_STEPS, Name, Seed, ShortText, Text

__all__ = ["ImageData", "ImageGenerationRequest", "ImagesResponse"]


class ImageGenerationRequest(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v1/images/generations`` (see the module docstring). ``size``: ``"WIDTHxHEIGHT"`` or
    ``"auto"`` (the model's native size); the model refuses a size it does not make."""

    prompt: Text
    model: Name | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_IMAGES)] | None = None
    size: Name | None = None
    response_format: Name | None = None
    output_format: Name | None = None
    background: Name | None = None
    stream: bool | None = None
    quality: Name | None = None
    style: Name | None = None
    moderation: Name | None = None
    output_compression: Annotated[int, Meta(ge=0, le=100)] | None = None
    partial_images: Annotated[int, Meta(ge=0, le=3)] | None = None
    user: Name | None = None
    seed: Seed | None = None
    steps: Annotated[int, Meta(ge=1, le=MAX_STEPS)] | None = None
    guidance_scale: Annotated[float, Meta(ge=0, le=MAX_GUIDANCE_SCALE)] | None = None
    negative_prompt: ShortText | None = None


class ImageData(msgspec.Struct, frozen=True, kw_only=True):
    """One image: the PNG file, base64 (``b64_json``); ``revised_prompt`` is always ``None``."""

    b64_json: str
    revised_prompt: str | None = None


class ImagesResponse(msgspec.Struct, frozen=True, kw_only=True):
    """The answer: ``created`` (Unix seconds), the images in request order, their ``size`` and
    ``output_format``."""

    created: int
    data: list[ImageData]
    size: str | None = None
    output_format: str = "png"
