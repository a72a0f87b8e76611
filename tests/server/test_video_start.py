"""``session.start`` of the generated-video route: which served model it gets, and the model's options.

Real engines (not started: only their capabilities are read): the echo plugin, which speaks, and the
``helios`` plugin, which makes video.
"""

from __future__ import annotations

import base64

import pytest

from duplex.engine import Engine
from duplex.plugins.builtin.echo import EchoPlugin
from duplex.protocol.errors import ProtocolError
from duplex.protocol.video_output import ImageReference, VideoSessionStart
from duplex.server.models import ServedModel, ServedModels
from duplex.server.video_start import request_options, video_model

pytest.importorskip("torch")


def served(*names: str) -> ServedModels:
    from batch_models.video.plugin import HeliosVideoPlugin

    models = []
    for name in names:
        plugin = HeliosVideoPlugin("/nonexistent") if name.startswith("video") else EchoPlugin(max_sessions=2)
        models.append(ServedModel(name, Engine(plugin)))
    return ServedModels(models)


def test_the_named_model_or_the_first_that_makes_video() -> None:
    models = served("voice", "video-a", "video-b")
    assert video_model(models, "video-b").name == "video-b"
    assert video_model(models, None).name == "video-a"
    assert video_model(models, "gpt-realtime").name == "video-a"  # a name it does not serve


@pytest.mark.parametrize(("names", "asked"), [(("voice", "video-a"), "voice"), (("voice",), None)])
def test_a_model_that_makes_no_video_is_refused(names: tuple[str, ...], asked: str | None) -> None:
    with pytest.raises(ProtocolError) as err:
        video_model(served(*names), asked)
    assert (err.value.code, err.value.param) == ("unsupported_response_modality", "model")


def test_the_fields_become_the_models_request_options() -> None:
    png = b"\x89PNG fake bytes"
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    start = VideoSessionStart(
        prompt="p",
        width=640,
        height=384,
        num_frames=0,
        seed=3,
        negative_prompt="blur",
        num_inference_steps=4,
        guidance_scale=1.0,
        fps=24,
        image_reference=ImageReference(image_url=url),
        extra_params={"flow_shift": 5.0},
    )
    assert request_options(start) == {
        "width": 640,
        "height": 384,
        "num_frames": 0,
        "seed": 3,
        "negative_prompt": "blur",
        "steps": 4,
        "guidance_scale": 1.0,
        "image": png,
        "flow_shift": 5.0,
    }  # fps labels the stream: the route's, not the model's


def with_image(url: str) -> VideoSessionStart:
    return VideoSessionStart(prompt="p", image_reference=ImageReference(image_url=url))


@pytest.mark.parametrize(
    ("start", "param"),
    [
        (with_image("https://a.test/x.png"), None),
        (with_image("data:image/png,raw"), None),
        (with_image("data:image/png;base64,@@"), None),
        (VideoSessionStart(prompt="p", seed=1, extra_params={"seed": 2}), "extra_params.seed"),
    ],
    ids=["http", "not-base64-url", "bad-base64", "given-twice"],
)
def test_a_field_the_model_cannot_take_is_refused(start: VideoSessionStart, param: str | None) -> None:
    with pytest.raises(ProtocolError) as err:
        request_options(start)
    assert err.value.code == "invalid_session_config"
    assert err.value.param == (param or "image_reference.image_url")
