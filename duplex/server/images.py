"""``POST /v1/images/generations``: OpenAI's image route, served by a batch image model.

One request is one ``BatchStream`` on the model's engine (``batch_streams``): the prompt is the
request's text, ``n``, ``size`` and the diffusion parameters (those given) its options; the model's
images (PNG files, encoded by the engine's batch driver off the event loop) come back as OpenAI's
``ImagesResponse`` with each image in ``b64_json``, in the order they were made. The model steps
this request together with every other (realtime sessions' included).

Refused before a slot is taken (``invalid_request_error``, 400): an empty prompt, ``stream: true``,
``response_format: "url"``, an ``output_format`` other than ``png``, a transparent background, a
model that is not an image model (``invalid_model``; 404 ``model_not_found`` for a name not served
when several image models could answer it: ``ServedModels.pick``). The answer names the model that
made it in ``X-Duplex-Model``.
Refused by the model (its codes, ``batch_models/README.md``): a size it does not make or ``n`` over
its bound (``invalid_session_config``, 400), a prompt over its bound (``event_too_large``, 413).
These are our codes; the answer carries OpenAI's for them (``http_errors``: ``invalid_value``,
``string_above_max_length``).

A client that goes away before its images cancels the request at once: its stream is closed, its
request stopped and its slot freed (``http_requests.until_departed``).
"""

from __future__ import annotations

import base64
import time
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from duplex.protocol.errors import DuplexError, ProtocolError
from duplex.protocol.images import ImageData, ImageGenerationRequest, ImagesResponse
from duplex.protocol.png import png_size
from duplex.server.batch_streams import request_outputs, request_stream
from duplex.server.http_errors import error_response
from duplex.server.http_requests import Departed, admit, read_json, until_departed
from duplex.server.models import MODEL_HEADER, Wants

__all__ = ["image_options", "images_endpoint"]

_OPTIONS = ("n", "size", "seed", "steps", "guidance_scale", "negative_prompt")


def image_options(body: ImageGenerationRequest) -> dict[str, Any]:
    """The model's options for an image request: its parameters, those given."""
    return {f: getattr(body, f) for f in _OPTIONS if getattr(body, f) is not None}


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


async def _generate(engine: Any, body: ImageGenerationRequest) -> list[bytes]:
    """The request's images (PNG files), from one stream on ``engine`` (closed when they are all
    made)."""
    images: list[bytes] = []
    async with request_stream(engine) as stream:
        async for output in request_outputs(engine, stream, body.prompt, image_options(body)):
            image = output.image
            if image is not None:
                assert isinstance(image, bytes)  # the batch driver made it a PNG file, off the loop
                images.append(image)
    return images


async def images_endpoint(request: Request) -> Response:
    """The route (see the module docstring)."""
    state = request.app.state.duplex
    try:
        admit(request)  # the API key, when the server asks for one
        body = await read_json(request, ImageGenerationRequest, state.config.max_http_body_bytes)
        _check(body)
        model = state.models.pick(body.model, Wants.IMAGE).model
        images = await until_departed(request, _generate(model.engine, body))
    except DuplexError as err:
        state.metrics.errors.bump(err.code)
        status = 503 if err.code == "resource_exhausted" and (state.draining or not state.ready) else None
        return error_response(err, status=status)
    except Departed:  # its stream was closed, its slot freed: nobody reads an answer
        state.metrics.detached.bump("client_gone")
        return Response(status_code=204)
    size = "{}x{}".format(*png_size(images[0])) if images else None
    answer = ImagesResponse(
        created=int(time.time()),
        data=[ImageData(b64_json=base64.b64encode(png).decode("ascii")) for png in images],
        size=size,
    )
    headers = {MODEL_HEADER: model.name}
    return Response(msgspec.json.encode(answer), media_type="application/json", headers=headers)
