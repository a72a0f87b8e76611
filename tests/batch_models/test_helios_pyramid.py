"""``helios`` with the pyramid sampler (``HeliosPyramidPipeline``: each chunk denoised at three
rising resolutions), plain and distilled (Helios-Distilled: DMD steps), on tiny checkpoints.

What is proved: a request's frames are diffusers' ``HeliosPyramidPipeline``'s for the same seed
(distilled, with and without the amplified first chunk; plain with guidance); progress counts every
stage's steps; a request's frames are bit-identical alone or batched with requests at other stages,
chunks and sizes (one batch bucket); CFG-Zero* runs where the checkpoint asks for it; frame sizes
must allow the first stage's quarter resolution; the schedulers' default gamma of 1/3 (at which
the pipeline's own float32 Cholesky fails on a CPU) still draws its block noise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from batch_models.video.plugin import HeliosVideoPlugin
from duplex.plugins.base import BatchRequest, PluginError, SlotOptions, SlotOutput
from tests.batch_models.driver import drive
from tests.batch_models.helios_parity import assert_frames_are_the_pipelines

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

STEPS = 2  # a stage


def loaded(path: Path, slots: int = 4, **options: object) -> HeliosVideoPlugin:
    settings = {
        "sizes": "64x64,128x64",
        "default_steps": STEPS,
        "latent_frames_per_chunk": 3,
        "max_sequence_length": 16,
        "default_guidance": 1.0,
        "batch_buckets": "4",
        **options,
    }
    plugin = HeliosVideoPlugin.from_options(str(path), max_sessions=slots, **settings)
    plugin.load()
    for slot in range(slots):
        plugin.open_slot(slot, SlotOptions())
    return plugin


def request(slot: int, prompt: str = "a cat on a mat", **options: object) -> BatchRequest:
    return BatchRequest(slot=slot, epoch=2, text=prompt, options={"seed": 7, "num_frames": 20, **options})


def video(outputs: list[SlotOutput]) -> np.ndarray:
    return np.concatenate([o.video for o in outputs if o.video is not None])


@pytest.mark.parametrize(
    ("distilled", "guidance", "amplify"),
    [(True, 1.0, False), (True, 1.0, True), (False, 2.5, False)],
    ids=["distilled", "distilled-amplified", "guided"],
)
def test_frames_are_the_ones_diffusers_pyramid_pipeline_makes_with_the_same_seed(
    helios_pyramid_checkpoint: Path,
    helios_distilled_checkpoint: Path,
    distilled: bool,
    guidance: float,
    amplify: bool,
) -> None:
    from diffusers import HeliosPyramidPipeline

    path = helios_distilled_checkpoint if distilled else helios_pyramid_checkpoint
    plugin = loaded(path, slots=1, batch_buckets="1", amplify_first_chunk=amplify)
    options = {"guidance_scale": guidance, "negative_prompt": "blurry"}
    ours = video(drive(plugin, {0: [request(0, **options)]})[0].outputs)
    model = plugin.model
    pipe = HeliosPyramidPipeline(
        tokenizer=model.tokenizer,
        text_encoder=model.text_encoder,
        vae=model.vae,
        scheduler=model.scheduler_class.from_config(model.scheduler_config),
        transformer=model.transformer,
        is_distilled=distilled,
    )
    pipe.set_progress_bar_config(disable=True)
    embeds = plugin.sampler.encode(["a cat on a mat", "blurry"])  # the pipeline's cleaning needs ftfy
    theirs = pipe(
        prompt_embeds=embeds[:1],
        negative_prompt_embeds=embeds[1:],
        height=64,
        width=64,
        num_frames=20,
        guidance_scale=guidance,
        generator=torch.Generator("cpu").manual_seed(7),
        max_sequence_length=16,
        num_latent_frames_per_chunk=3,
        pyramid_num_inference_steps_list=[STEPS] * 3,
        is_amplify_first_chunk=amplify,
        output_type="np",
    ).frames[0]
    assert ours.shape == (20, 64, 64, 3)
    assert_frames_are_the_pipelines(ours, theirs, plugin.model.vae, plugin.frames_per_chunk)


@pytest.mark.parametrize("amplify", [False, True], ids=["plain", "amplified"])
def test_progress_counts_every_stages_steps(helios_distilled_checkpoint: Path, amplify: bool) -> None:
    plugin = loaded(helios_distilled_checkpoint, slots=1, amplify_first_chunk=amplify)
    outputs = drive(plugin, {0: [request(0, num_frames=18)]})[0].outputs
    first = 3 * STEPS * (2 if amplify else 1)  # three stages; the amplified first chunk twice the steps
    assert len(outputs) == first + 3 * STEPS
    assert [i for i, o in enumerate(outputs) if o.video is not None] == [first - 1, first + 3 * STEPS - 1]
    assert outputs[first - 1].progress == pytest.approx(0.5) and outputs[-1].progress == 1.0
    assert outputs[-1].end_of_turn


def test_a_requests_frames_are_the_same_alone_or_batched_with_requests_at_other_stages(
    helios_distilled_checkpoint: Path,
) -> None:
    alone = drive(loaded(helios_distilled_checkpoint), {0: [request(1, num_frames=27)]})[1].outputs
    together = drive(
        loaded(helios_distilled_checkpoint),
        {
            0: [request(0, "a dog", seed=1, num_frames=40), request(2, "rain", seed=2, width=128)],
            3: [request(1, num_frames=27)],  # joins while the others are in their second stage
            5: [request(3, "snow", seed=3, guidance_scale=2.0)],
        },
    )
    np.testing.assert_array_equal(video(together[1].outputs), video(alone))
    assert video(together[2].outputs).shape == (20, 64, 128, 3)


def test_cfg_zero_star_runs_where_the_checkpoint_asks_for_it(
    helios_pyramid_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from diffusers import HeliosPyramidPipeline

    root = tmp_path / "zero_star"
    shutil.copytree(helios_pyramid_checkpoint, root)
    index = json.loads((root / "model_index.json").read_text())
    (root / "model_index.json").write_text(json.dumps({**index, "is_cfg_zero_star": True}))
    guided = {"guidance_scale": 3.0, "negative_prompt": "blurry"}
    plugin = loaded(root, slots=1, batch_buckets="1")
    star = video(drive(plugin, {0: [request(0, **guided)]})[0].outputs)
    plain = video(drive(loaded(helios_pyramid_checkpoint, slots=1), {0: [request(0, **guided)]})[0].outputs)
    assert star.shape == plain.shape == (20, 64, 64, 3)
    assert not np.array_equal(star, plain)
    # The pipeline's CFG-Zero* takes a view of the transformer's output, which is not contiguous
    # (it raises): the same values, made contiguous, let it run.
    model = plugin.model
    forward = model.transformer.forward

    def contiguous_forward(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
        out = forward(*args, **kwargs)
        return (out[0].contiguous(), *out[1:])

    monkeypatch.setattr(model.transformer, "forward", contiguous_forward)
    pipe = HeliosPyramidPipeline(
        tokenizer=model.tokenizer,
        text_encoder=model.text_encoder,
        vae=model.vae,
        scheduler=model.scheduler_class.from_config(model.scheduler_config),
        transformer=model.transformer,
        is_distilled=False,
        is_cfg_zero_star=True,
    )
    pipe.set_progress_bar_config(disable=True)
    embeds = plugin.sampler.encode(["a cat on a mat", "blurry"])
    theirs = pipe(
        prompt_embeds=embeds[:1],
        negative_prompt_embeds=embeds[1:],
        height=64,
        width=64,
        num_frames=20,
        guidance_scale=3.0,
        generator=torch.Generator("cpu").manual_seed(7),
        max_sequence_length=16,
        num_latent_frames_per_chunk=3,
        pyramid_num_inference_steps_list=[STEPS] * 3,
        output_type="np",
    ).frames[0]
    assert_frames_are_the_pipelines(star, theirs, plugin.model.vae, plugin.frames_per_chunk)


def test_frame_sizes_must_allow_the_first_stages_quarter_resolution(
    helios_distilled_checkpoint: Path,
) -> None:
    with pytest.raises(PluginError) as err:
        HeliosVideoPlugin.from_options(str(helios_distilled_checkpoint), sizes="32x32").load()
    assert err.value.code == "invalid_plugin_config" and "multiples of 64" in err.value.message


def test_the_default_gamma_of_a_third_still_draws_its_block_noise(
    helios_distilled_checkpoint: Path, tmp_path: Path
) -> None:
    root = tmp_path / "third"
    shutil.copytree(helios_distilled_checkpoint, root)
    path = root / "scheduler" / "scheduler_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "gamma": 1 / 3}))
    outputs = drive(loaded(root, slots=1), {0: [request(0, num_frames=9)]})[0].outputs
    assert video(outputs).shape == (9, 64, 64, 3)


def test_a_pyramid_scheduler_with_the_one_stage_pipeline_is_refused(
    helios_pyramid_checkpoint: Path, tmp_path: Path
) -> None:
    root = tmp_path / "mixed"
    shutil.copytree(helios_pyramid_checkpoint, root)
    index = json.loads((root / "model_index.json").read_text())
    (root / "model_index.json").write_text(json.dumps({**index, "_class_name": "HeliosPipeline"}))
    with pytest.raises(PluginError) as err:
        HeliosVideoPlugin.from_options(str(root), sizes="64x64").load()
    assert err.value.code == "model_load_failed" and "stages" in err.value.message
