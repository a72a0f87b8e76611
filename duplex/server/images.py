"""``POST /v1/images/generations``: OpenAI's image route, served by a batch image model.

One request is one short session on the model's engine (``batch_sessions``): the prompt goes in as
``response.input``, ``n``, ``size`` and the diffusion parameters as ``response.extra_body``; the
session's ``response.output_image.done`` events (PNG files, encoded by the engine off the event
loop) come back as OpenAI's ``ImagesResponse`` with each image in ``b64_json``, in order. The
model steps this request together with every other (realtime sessions' included).

Refused before a session opens (``invalid_request_error``, 400): an empty prompt, ``stream: true``,
``response_format: "url"``, an ``output_format`` other than ``png``, a transparent background, a
model that is not an image model (``invalid_model``; 404 ``model_not_found`` for a name not served
when several image models could answer it: ``ServedModels.pick``). The answer names the model that
made it in ``X-Duplex-Model``.
Refused by the model (its codes, ``batch_models/README.md``): a size it does not make or ``n`` over
its bound (``invalid_session_config``, 400), a prompt over its bound (``event_too_large``, 413).
These are our codes; the answer carries OpenAI's for them (``http_errors``: ``invalid_value``,
``string_above_max_length``).

A client that goes away before its images cancels the request at once: its session closes and
frees its slot (``http_requests.until_departed``); the model drops the request at its next step.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from duplex.protocol.errors import DuplexError, ProtocolError
from duplex.protocol.ext.commands import DuplexResponseCreateParams
from duplex.protocol.ext.events import ResponseOutputImageDone
from duplex.protocol.images import ImageData, ImageGenerationRequest, ImagesResponse
from duplex.protocol.realtime.items import InputTextPart, MessageItem
from duplex.server.batch_sessions import request_session, response_events
from duplex.server.http_errors import error_response
from duplex.server.http_requests import Departed, admit, read_json, until_departed
from duplex.server.models import MODEL_HEADER, Wants

__all__ = ["image_params", "images_endpoint"]


def image_params(body: ImageGenerationRequest) -> DuplexResponseCreateParams:
    """The ``response.create`` parameters of an image request: the prompt as the input, the rest
    (those given) as ``extra_body``."""
    fields = ("n", "size", "seed", "steps", "guidance_scale", "negative_prompt")
    options: dict[str, Any] = {f: getattr(body, f) for f in fields if getattr(body, f) is not None}
    return DuplexResponseCreateParams(
        input=[MessageItem(role="user", content=[InputTextPart(text=body.prompt)])],
        extra_body=options or None,
    )


def _check(body: ImageGenerationRequest) -> None:
    """The route's own refusals (see the module docstring)."""
    if not body.prompt.strip():
        raise ProtocolError("response_create_without_input", "prompt is empty", param="prompt")
    if body.stream:
        raise ProtocolError("bad_event", "streaming image generation is not supported", param="stream")
    if body.response_format not in (None, "b64_json"):
        message = "only response_format 'b64_json' is supported (there is no file store)"
        raise ProtocolError("bad_event", message, param="response_format")
    if body.output_format not in (None, "png"):
        raise ProtocolError("bad_event", "only output_format 'png' is supported", param="output_format")
    if body.background == "transparent":
        raise ProtocolError("bad_event", "transparent backgrounds are not supported", param="background")


async def _generate(
    engine: Any, key_id: bytes | None, body: ImageGenerationRequest
) -> list[ResponseOutputImageDone]:
    """The request's images, from one session on ``engine`` (closed when they are all made)."""
    images: list[ResponseOutputImageDone] = []
    async with request_session(engine, key_id) as att:
        async for event in response_events(att, image_params(body)):
            if isinstance(event, ResponseOutputImageDone):
                images.append(event)
    return images


async def images_endpoint(request: Request) -> Response:
    """The route (see the module docstring)."""
    state = request.app.state.duplex
    try:
        key_id = admit(request)
        body = await read_json(request, ImageGenerationRequest, state.config.max_http_body_bytes)
        _check(body)
        model = state.models.pick(body.model, Wants.IMAGE).model
        images = await until_departed(request, _generate(model.engine, key_id, body))
    except DuplexError as err:
        state.metrics.errors.bump(err.code)
        status = 503 if err.code == "resource_exhausted" and (state.draining or not state.ready) else None
        return error_response(err, status=status)
    except Departed:  # its session was closed, its slot freed: nobody reads an answer
        state.metrics.detached.bump("client_gone")
        return Response(status_code=204)
    images.sort(key=lambda e: e.image_index)
    answer = ImagesResponse(
        created=int(time.time()),
        data=[ImageData(b64_json=base64.b64encode(e.image).decode("ascii")) for e in images],
        size=f"{images[0].width}x{images[0].height}" if images else None,
    )
    headers = {MODEL_HEADER: model.name}
    return Response(msgspec.json.encode(answer), media_type="application/json", headers=headers)
