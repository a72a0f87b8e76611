"""What a generated-video socket's ``session.start`` asks of the server: which model, and the
model's request options (``duplex.server.realtime_video``).

``video_model(models, name)`` is the served model named ``name`` when it makes video
(``Capabilities.output_modalities``), or the first served model that does when ``name`` names none
(clients name models freely, as stock Realtime clients do); a named model that makes no video, or
a server with none, is refused with ``unsupported_response_modality``.

``request_options(start)`` turns the message's fields into the request options batch plugins read
(``width``, ``height``, ``num_frames``, ``seed``, ``negative_prompt``, ``steps``, ``guidance_scale``,
``image``), adds ``extra_params`` (a key given both ways is refused, never silently overridden),
and decodes the reference image from its ``data:`` URL: the server fetches nothing, so an http(s)
URL is refused. The plugin then checks every option it reads and refuses the rest.
"""

from __future__ import annotations

import base64
import binascii

from duplex.protocol.errors import ProtocolError
from duplex.protocol.video_output import VideoSessionStart
from duplex.server.models import ServedModel, ServedModels

__all__ = ["request_options", "video_model"]

_IMAGE_PARAM = "image_reference.image_url"


def video_model(models: ServedModels, name: str | None) -> ServedModel:
    """The model a ``session.start`` naming ``name`` gets (see the module docstring). Raises
    ``ProtocolError("unsupported_response_modality")``."""
    named = models.get(name)
    if named is not None:
        if "video" not in named.engine.capabilities.output_modalities:
            message = f"model {name!r} does not generate video"
            raise ProtocolError("unsupported_response_modality", message, param="model")
        return named
    for model in models:
        if "video" in model.engine.capabilities.output_modalities:
            return model
    message = "this server serves no model that generates video"
    raise ProtocolError("unsupported_response_modality", message, param="model")


def image_bytes(url: str) -> bytes:
    """The bytes of a base64 ``data:`` URL's image. Raises ``ProtocolError("invalid_session_config")``."""
    head, comma, payload = url.partition(",")
    if not url.startswith("data:") or not comma:
        message = f"{_IMAGE_PARAM} must be a data: URL (data:image/png;base64,...); nothing is fetched"
        raise ProtocolError("invalid_session_config", message, param=_IMAGE_PARAM)
    if not head.endswith(";base64"):
        message = f"{_IMAGE_PARAM} must be base64 (data:image/...;base64,...)"
        raise ProtocolError("invalid_session_config", message, param=_IMAGE_PARAM)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        message = f"{_IMAGE_PARAM} is not valid base64"
        raise ProtocolError("invalid_session_config", message, param=_IMAGE_PARAM) from None


def request_options(start: VideoSessionStart) -> dict[str, object]:
    """The model's request options for ``start`` (see the module docstring). Raises
    ``ProtocolError("invalid_session_config")``."""
    options: dict[str, object] = {}
    for key, value in (
        ("width", start.width),
        ("height", start.height),
        ("num_frames", start.num_frames),
        ("seed", start.seed),
        ("negative_prompt", start.negative_prompt),
        ("steps", start.num_inference_steps),
        ("guidance_scale", start.guidance_scale),
    ):
        if value is not None:
            options[key] = value
    if start.image_reference is not None:
        options["image"] = image_bytes(start.image_reference.image_url)
    for key, value in (start.extra_params or {}).items():
        if key in options:
            message = f"extra_params.{key} is also given as a field of session.start"
            raise ProtocolError("invalid_session_config", message, param=f"extra_params.{key}")
        options[key] = value
    return options
