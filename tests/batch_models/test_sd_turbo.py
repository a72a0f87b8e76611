"""``sd_turbo`` at the plugin level on tiny random-weight checkpoints (SD and SDXL layouts).

What is proved: a request's images are diffusers' own for the same seed; progress per step and
one image per output; a request's images are bit-identical alone or batched with requests that
join at other steps (one batch bucket), and with the default buckets do not depend on what the
requests sharing their calls hold; cancel frees the slot for the next step; bad requests are
refused with codes; weights load strictly.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from batch_models.diffusion.plugin import StableDiffusionPlugin
from duplex.plugins.base import BatchRequest, PluginError, PluginKind, SlotOptions
from tests.batch_models.driver import drive
from tests.rounding import depth_tolerance, reduction_lengths

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

SIZES = "32x32,48x32"


def loaded(path: Path, slots: int = 4, **options: object) -> StableDiffusionPlugin:
    plugin = StableDiffusionPlugin.from_options(str(path), max_sessions=slots, sizes=SIZES, **options)
    plugin.load()
    for slot in range(slots):
        plugin.open_slot(slot, SlotOptions())
    return plugin


def request(slot: int, prompt: str = "a cat on a mat", **options: object) -> BatchRequest:
    return BatchRequest(slot=slot, epoch=2, text=prompt, options={"seed": 7, **options})


def images(trace) -> list[np.ndarray]:
    return [o.image for o in trace.outputs if o.image is not None]


@pytest.mark.parametrize("xl", [False, True], ids=["sd", "sdxl"])
@pytest.mark.parametrize(
    "options",
    [{"steps": 2, "n": 2}, {"steps": 3, "guidance_scale": 3.0, "negative_prompt": "a dog", "size": "48x32"}],
    ids=["turbo", "guided"],
)
def test_images_are_the_ones_diffusers_pipeline_makes_with_the_same_seed(
    sd_checkpoint: Path, sdxl_checkpoint: Path, xl: bool, options: dict
) -> None:
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

    path = sdxl_checkpoint if xl else sd_checkpoint
    plugin = loaded(path, slots=1)
    ours = images(drive(plugin, {0: [request(0, **options)]})[0])
    pipe = (StableDiffusionXLPipeline if xl else StableDiffusionPipeline).from_pretrained(
        str(path), local_files_only=True
    )
    pipe.set_progress_bar_config(disable=True)
    width, height = (int(v) for v in options.get("size", "32x32").split("x"))
    # Bit for bit, by construction: every model call runs on the same shapes on both sides (the
    # UNet on the request's rows, the VAE on its n images). The pipeline encodes a negative prompt in
    # a call of its own, where the plugin encodes it with the prompt in one call of two rows; so the
    # pipeline is given the prompts as diffusers' own encode_prompt makes them in that one call.
    guided = options.get("guidance_scale", 0.0) > 1.0
    prompts = [options["negative_prompt"], "a cat on a mat"] if guided else ["a cat on a mat"]
    encoded = pipe.encode_prompt(
        prompt=prompts, device=pipe.device, num_images_per_prompt=1, do_classifier_free_guidance=False
    )
    given = {"prompt_embeds": encoded[0][-1:]}
    if guided:
        given["negative_prompt_embeds"] = encoded[0][:1]
    if xl:
        given["pooled_prompt_embeds"] = encoded[2][-1:]
        if guided:
            given["negative_pooled_prompt_embeds"] = encoded[2][:1]
    theirs = pipe(
        num_inference_steps=options["steps"],
        guidance_scale=options.get("guidance_scale", 0.0),
        num_images_per_prompt=options.get("n", 1),
        generator=torch.Generator("cpu").manual_seed(7),
        width=width,
        height=height,
        output_type="np",
        **given,
    ).images
    assert len(ours) == options.get("n", 1)
    for mine, ref in zip(ours, theirs, strict=True):
        assert mine.shape == (height, width, 3) and mine.dtype == np.uint8
        np.testing.assert_array_equal(mine, (ref * 255).round().astype(np.uint8))


def test_a_request_reports_progress_each_step_then_sends_one_image_per_output(sd_checkpoint: Path) -> None:
    plugin = loaded(sd_checkpoint, slots=1)
    caps = plugin.capabilities()
    assert caps.kind is PluginKind.BATCH and caps.output_modalities == ("image",)
    assert plugin.image_sizes == ("32x32", "48x32")
    outs = drive(plugin, {0: [request(0, steps=3, n=2)]})[0].outputs
    assert [o.progress for o in outs] == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0])
    assert [o.image is not None for o in outs] == [False, False, True, True]
    assert [o.end_of_turn for o in outs] == [False, False, False, True]
    assert all(o.epoch == 2 and o.pcm is None for o in outs)
    assert not np.array_equal(outs[2].image, outs[3].image)  # n images, each from its own noise
    again = drive(plugin, {0: [request(0, steps=3, n=2)]})[0].outputs  # the slot is free again
    np.testing.assert_array_equal(again[3].image, outs[3].image)


def _mixed_batch(plugin: StableDiffusionPlugin, *, others: int = 0) -> dict:
    """Request 0 of ``test_..._alone`` beside others that join at other steps, sizes and settings
    (``others``: another set of their prompts, seeds and guidance, with the same shapes)."""
    prompts = [("a red house", "a boat", "a tree"), ("a blue car", "a bird", "snow")][others]
    joins = {
        0: [request(1, prompts[0], steps=4, seed=1 + others, guidance_scale=2.0 + others)],
        1: [request(0, steps=3, n=2), request(2, prompts[1], steps=1, size="48x32", seed=7 + others)],
        2: [request(3, prompts[2], steps=2, n=3, seed=5 + others)],
    }
    return drive(plugin, joins)


@pytest.mark.parametrize("xl", [False, True], ids=["sd", "sdxl"])
def test_a_request_is_bit_identical_alone_or_batched_with_one_bucket(
    sd_checkpoint: Path, sdxl_checkpoint: Path, xl: bool
) -> None:
    plugin = loaded(sdxl_checkpoint if xl else sd_checkpoint, batch_buckets="8", max_batch_rows=8)
    alone = drive(plugin, {0: [request(0, steps=3, n=2)]})[0]
    batched = _mixed_batch(plugin)
    assert batched[0].steps == [1, 2, 3, 4] and batched[3].steps[0] == 2  # joined at different steps
    for mine, ref in zip(images(batched[0]), images(alone), strict=True):
        np.testing.assert_array_equal(mine, ref)
    assert len(images(batched[3])) == 3 and images(batched[2])[0].shape == (32, 48, 3)


def test_with_the_default_buckets_a_request_does_not_depend_on_what_the_others_in_its_calls_hold(
    sd_checkpoint: Path,
) -> None:
    # Bit for bit, by construction: the other requests change their prompts, seeds and guidance but
    # not their shapes, so every call has the same bucket on both runs. (Against the request alone,
    # in other buckets, a row's rounding may differ: no useful bound on the pixels can be derived
    # through the denoising steps' noise scales and the VAE, and one bucket is bit-identical above.)
    plugin = loaded(sd_checkpoint)
    one, other = _mixed_batch(plugin), _mixed_batch(plugin, others=1)
    for mine, ref in zip(images(one[0]), images(other[0]), strict=True):
        np.testing.assert_array_equal(mine, ref)
    assert not np.array_equal(images(one[1])[0], images(other[1])[0])  # the others did change


def test_cancel_mid_generation_frees_the_slot_for_the_next_step(sd_checkpoint: Path) -> None:
    plugin = loaded(sd_checkpoint, batch_buckets="4", max_batch_rows=4)
    b_alone = drive(plugin, {0: [request(1, "a boat", steps=3)]})[1]
    plugin.begin(request(0, steps=4))
    plugin.begin(request(1, "a boat", steps=3))
    plugin.advance([0, 1])
    plugin.cancel_slot(0, epoch=3)
    with pytest.raises(PluginError) as err:
        plugin.advance([0, 1])
    assert err.value.code == "invalid_batch"
    plugin.begin(request(0, "a tree", steps=1))  # the cancelled request's slot takes a new one at once
    outs = plugin.advance([0, 1])
    assert outs[0].end_of_turn and outs[0].image is not None and not outs[1].end_of_turn
    last = plugin.advance([1])[0]
    assert last.end_of_turn
    np.testing.assert_array_equal(last.image, images(b_alone)[0])


@pytest.mark.parametrize(
    ("prompt", "options", "code", "param"),
    [
        ("", {}, "response_create_without_input", "prompt"),
        ("  ", {}, "response_create_without_input", "prompt"),
        ("x" * 1001, {}, "event_too_large", "prompt"),
        ("a cat", {"n": 5}, "invalid_session_config", "n"),
        ("a cat", {"n": 0}, "invalid_session_config", "n"),
        ("a cat", {"n": "2"}, "invalid_session_config", "n"),
        ("a cat", {"n": True}, "invalid_session_config", "n"),
        ("a cat", {"size": "1024x1024"}, "invalid_session_config", "size"),
        ("a cat", {"steps": 0}, "invalid_session_config", "steps"),
        ("a cat", {"steps": 51}, "invalid_session_config", "steps"),
        ("a cat", {"guidance_scale": -1}, "invalid_session_config", "guidance_scale"),
        ("a cat", {"seed": -1}, "invalid_session_config", "seed"),
        ("a cat", {"negative_prompt": "y" * 1001}, "event_too_large", "negative_prompt"),
        ("a cat", {"quality": "hd"}, "invalid_session_config", "quality"),
    ],
)
def test_bad_requests_are_refused_with_a_code_and_leave_the_slot_idle(
    sd_checkpoint: Path, prompt: str, options: dict, code: str, param: str
) -> None:
    plugin = loaded(sd_checkpoint, slots=1)
    with pytest.raises(PluginError) as err:
        plugin.begin(BatchRequest(slot=0, epoch=0, text=prompt, options=options))
    assert (err.value.code, err.value.param) == (code, param)
    assert drive(plugin, {0: [request(0, size="auto")]})[0].outputs[-1].image.shape == (32, 32, 3)


def test_calls_out_of_order_are_refused(sd_checkpoint: Path) -> None:
    plugin = loaded(sd_checkpoint, slots=2)
    plugin.begin(request(0, steps=2))
    with pytest.raises(PluginError) as err:
        plugin.begin(request(0))
    assert err.value.code == "conversation_already_has_active_response"
    with pytest.raises(PluginError) as err:
        plugin.advance([1])
    assert err.value.code == "invalid_batch"
    plugin.close_slot(1)
    with pytest.raises(PluginError) as err:
        plugin.begin(request(1))
    assert err.value.code == "invalid_slot"
    plugin.close()
    with pytest.raises(PluginError) as err:
        plugin.advance([0])
    assert err.value.code == "plugin_not_loaded"
    with pytest.raises(PluginError) as err:
        plugin.load()
    assert err.value.code == "plugin_closed"


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_weights_load_strictly_and_a_wrong_key_is_named(sd_checkpoint: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    for change, expected in (
        ("drop", "missing keys: conv_in.bias"),
        ("extra", "unexpected keys: conv_in.extra"),
        ("shape", "shape mismatch: conv_in.bias (3,) != (32,)"),
    ):
        root = _copy(sd_checkpoint, tmp_path / change)
        weights = root / "unet" / "diffusion_pytorch_model.safetensors"
        state = load_file(str(weights))
        if change == "drop":
            del state["conv_in.bias"]
        elif change == "extra":
            state["conv_in.extra"] = torch.zeros(1)
        else:
            state["conv_in.bias"] = torch.zeros(3)
        save_file(state, str(weights))
        with pytest.raises(PluginError) as err:
            loaded(root)
        assert err.value.code == "model_load_failed"
        assert err.value.message.startswith("unet: ") and expected in err.value.message
    root = _copy(sd_checkpoint, tmp_path / "no-vae")
    shutil.rmtree(root / "vae")
    with pytest.raises(PluginError) as err:
        loaded(root)
    assert err.value.code == "model_path_unavailable" and "vae/" in err.value.message
    (root / "vae").mkdir()
    shutil.copy(sd_checkpoint / "vae" / "config.json", root / "vae")
    with pytest.raises(PluginError) as err:
        loaded(root)
    assert err.value.code == "model_path_unavailable"
    assert "diffusion_pytorch_model.safetensors" in err.value.message


def test_random_weights_need_only_the_configs(tmp_path: Path) -> None:
    from batch_models.diffusion.testing import write_checkpoint

    root = write_checkpoint(tmp_path / "configs", preset="tiny", weights=False)
    assert not list(root.rglob("*.safetensors"))
    plugin = loaded(root, random_weights="true")
    assert drive(plugin, {0: [request(0)]})[0].outputs[-1].image.shape == (32, 32, 3)
    StableDiffusionPlugin.write_tiny_checkpoint(str(tmp_path / "tiny"), seed=3)
    assert (tmp_path / "tiny" / "unet" / "diffusion_pytorch_model.safetensors").is_file()


@pytest.mark.parametrize(
    "options",
    [
        {"sizes": "33x32"},
        {"sizes": "big"},
        {"dtype": "int8"},
        {"batch_buckets": "0,4"},
        {"max_sessions": 0},
        {"colour": "red"},
        {"default_guidance": 99.0},
        {"warmup": "maybe"},
        {"max_decode_images": 0},
    ],
)
def test_plugin_options_are_checked(sd_checkpoint: Path, options: dict) -> None:
    with pytest.raises(PluginError) as err:
        plugin = StableDiffusionPlugin.from_options(str(sd_checkpoint), **options)
        plugin.load()
    assert err.value.code == "invalid_plugin_config"
    with pytest.raises(PluginError) as err:
        StableDiffusionPlugin.from_options(None)
    assert err.value.code == "invalid_plugin_config"


@pytest.mark.parametrize("xl", [False, True], ids=["sd", "sdxl"])
def test_the_warm_up_runs_every_reachable_bucket_at_every_size_and_changes_no_image(
    sd_checkpoint: Path, sdxl_checkpoint: Path, xl: bool
) -> None:
    from torch.nn.modules.module import register_module_forward_pre_hook

    calls: set[tuple[str, tuple[int, ...]]] = set()
    watched = ("UNet2DConditionModel", "Decoder", "CLIPTextModel", "CLIPTextModelWithProjection")

    def record(module: torch.nn.Module, args: tuple) -> None:
        name = type(module).__name__
        if name in watched and args and isinstance(args[0], torch.Tensor):  # inner calls pass keywords
            calls.add((name, tuple(args[0].shape)))

    path = sdxl_checkpoint if xl else sd_checkpoint
    options = {"batch_buckets": "1,2,4", "max_batch_rows": 4, "max_images": 1}
    options["max_decode_images"] = 2 if xl else 1  # the VAE's calls: at most 2 images, or 1
    hook = register_module_forward_pre_hook(record)
    try:
        warm = loaded(path, slots=2, warmup=True, **options)
    finally:
        hook.remove()
    # two slots, one image each: at most 4 prompts (guided), 4 UNet rows and 2 images (decoded)
    encoders = ["CLIPTextModel"] + (["CLIPTextModelWithProjection"] if xl else [])
    latents = {"32x32": (16, 16), "48x32": (16, 24)}
    expected = {(name, (b, 77)) for name in encoders for b in (1, 2, 4)}
    expected |= {("UNet2DConditionModel", (b, 4, *latents[s])) for b in (1, 2, 4) for s in latents}
    expected |= {("Decoder", (b, 4, *latents[s])) for b in ((1, 2) if xl else (1,)) for s in latents}
    assert calls == expected
    cold = loaded(path, slots=2, warmup=False, **options)
    joins = {0: [request(0, steps=2)], 1: [request(1, "a boat", steps=2, size="48x32", guidance_scale=2.0)]}
    for slot, trace in drive(warm, joins).items():  # every slot idle after the warm-up
        np.testing.assert_array_equal(images(trace)[0], images(drive(cold, joins)[slot])[0])


def test_more_images_than_max_decode_images_are_decoded_in_more_calls(sd_checkpoint: Path) -> None:
    joins = {0: [request(0, steps=2, n=3)], 1: [request(1, "a boat", steps=1, n=2)]}  # 5 images at step 1
    whole_plugin = loaded(sd_checkpoint, slots=2)
    whole = drive(whole_plugin, joins)
    one_by_one = drive(loaded(sd_checkpoint, slots=2, max_decode_images=1), joins)
    # Only the VAE's calls differ in shape (the UNet's are the same), so a pixel in [0, 1], half the
    # decoder's output in [-1, 1] plus a half, is off by at most half its depth_tolerance: far below
    # one level, so the two roundings to uint8 are at most one level apart.
    vae = whole_plugin.model.vae
    lengths = reduction_lengths(vae.post_quant_conv) + reduction_lengths(vae.decoder)
    assert 255 * depth_tolerance(1.0, lengths) / 2 < 1
    for slot in (0, 1):
        assert len(images(one_by_one[slot])) == len(images(whole[slot])) == 3 - slot
        for mine, ref in zip(images(one_by_one[slot]), images(whole[slot]), strict=True):
            assert np.abs(mine.astype(int) - ref.astype(int)).max() <= 1
