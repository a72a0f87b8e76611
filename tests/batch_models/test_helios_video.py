"""``helios`` at the plugin level on a tiny random-weight checkpoint (diffusers layout).

What is proved: a request's frames are diffusers' ``HeliosPipeline``'s for the same seed (text and
image to video, with guidance); progress every step and one chunk of frames every ``steps`` steps,
the last cut to ``num_frames``; a request's frames are bit-identical alone or batched with requests
that join at other steps and other sizes (one batch bucket); a stream without end runs until it
is cancelled; a prompt interaction is applied at the next chunk boundary, never inside a chunk,
blended over its transition and reported started / active / completed, the newest waiting one
winning; camera moves and bad interactions are refused with codes; bad requests are refused with
codes; weights load strictly by key.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest

from batch_models.video.plugin import HeliosVideoPlugin
from duplex.plugins.base import (
    BatchInteraction,
    BatchRequest,
    CameraControl,
    InteractionProgress,
    PluginError,
    PluginKind,
    SlotOptions,
    SlotOutput,
)
from tests.batch_models.driver import drive
from tests.batch_models.helios_parity import assert_frames_are_the_pipelines

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

SIZES = "32x32,48x32"
STEPS = 2
FRAMES_PER_CHUNK = 9  # 3 latent frames: (3 - 1) x 4 + 1


def loaded(path: Path, slots: int = 4, **options: object) -> HeliosVideoPlugin:
    settings = {
        "sizes": SIZES,
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


def request(slot: int, prompt: str = "a cat on a mat", epoch: int = 2, **options: object) -> BatchRequest:
    return BatchRequest(slot=slot, epoch=epoch, text=prompt, options={"seed": 7, "num_frames": 20, **options})


def video(outputs: list[SlotOutput]) -> np.ndarray:
    return np.concatenate([o.video for o in outputs if o.video is not None])


def png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("image", [False, True], ids=["text", "image"])
def test_frames_are_the_ones_diffusers_pipeline_makes_with_the_same_seed(
    helios_checkpoint: Path, image: bool
) -> None:
    from diffusers import HeliosPipeline
    from PIL import Image

    plugin = loaded(helios_checkpoint, slots=1, batch_buckets="1")  # the pipeline calls one row at a time
    reference = np.random.default_rng(3).integers(0, 256, (40, 40, 3), dtype=np.uint8)
    extra = {"image": png(reference)} if image else {}
    options = {"guidance_scale": 2.5, "negative_prompt": "blurry", "steps": 3, **extra}
    ours = video(drive(plugin, {0: [request(0, **options)]})[0].outputs)
    model = plugin.model
    pipe = HeliosPipeline(
        tokenizer=model.tokenizer,
        text_encoder=model.text_encoder,
        vae=model.vae,
        scheduler=model.scheduler_class.from_config(model.scheduler_config),
        transformer=model.transformer,
    )
    pipe.set_progress_bar_config(disable=True)
    # Given as embeddings: the pipeline's own prompt cleaning needs ftfy, not installed here.
    embeds = plugin.sampler.encode(["a cat on a mat", "blurry"])
    theirs = pipe(
        prompt_embeds=embeds[:1],
        negative_prompt_embeds=embeds[1:],
        image=Image.fromarray(reference) if image else None,
        height=32,
        width=32,
        num_frames=20,
        num_inference_steps=3,
        guidance_scale=2.5,
        generator=torch.Generator("cpu").manual_seed(7),
        max_sequence_length=16,
        num_latent_frames_per_chunk=3,
        output_type="np",
    ).frames[0]
    assert ours.shape == (20, 32, 32, 3) and ours.dtype == np.uint8
    assert theirs.shape[0] == 25  # three chunks of 9, rounded down to 4k + 1; ours is cut at 20
    assert_frames_are_the_pipelines(ours, theirs, plugin.model.vae, plugin.frames_per_chunk)


def test_a_request_reports_progress_each_step_and_sends_each_chunk_when_it_is_denoised(
    helios_checkpoint: Path,
) -> None:
    plugin = loaded(helios_checkpoint, slots=1)
    outputs = drive(plugin, {0: [request(0, num_frames=20)]})[0].outputs
    assert [o.progress for o in outputs] == pytest.approx([1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0])
    assert [None if o.video is None else o.video.shape for o in outputs] == [
        None,
        (9, 32, 32, 3),
        None,
        (9, 32, 32, 3),
        None,
        (2, 32, 32, 3),  # cut to num_frames = 20
    ]
    assert [o.chunk_index for o in outputs] == [None, 0, None, 1, None, 2]
    assert [o.end_of_turn for o in outputs] == [False] * 5 + [True]
    assert all(o.epoch == 2 and o.interactions is None for o in outputs)
    assert plugin.frames_per_chunk == FRAMES_PER_CHUNK
    plugin.begin(request(0))  # the slot is idle again after its last chunk


def test_a_requests_frames_are_the_same_alone_or_batched_with_others_joining_later(
    helios_checkpoint: Path,
) -> None:
    alone = drive(loaded(helios_checkpoint), {0: [request(1, num_frames=27)]})[1].outputs
    together = drive(
        loaded(helios_checkpoint),
        {
            0: [request(0, "a dog", seed=1, num_frames=40), request(2, "rain", seed=2, width=48)],
            3: [request(1, num_frames=27)],  # joins mid-chunk of the others
            4: [request(3, "snow", seed=3, guidance_scale=3.0)],
        },
    )
    assert [o.progress for o in together[1].outputs] == [o.progress for o in alone]
    np.testing.assert_array_equal(video(together[1].outputs), video(alone))
    assert video(together[2].outputs).shape == (20, 32, 48, 3)


def test_a_chunk_cut_short_decodes_only_the_latent_frames_its_frames_come_from(
    helios_checkpoint: Path,
) -> None:
    plugin = loaded(helios_checkpoint, slots=1)
    decoded: list[int] = []  # the Wan VAE decodes one latent frame a decoder call (it is causal)
    decoder = plugin.model.vae.decoder
    hook = decoder.register_forward_pre_hook(lambda _, args: decoded.append(args[0].shape[2]))
    try:
        outputs = drive(plugin, {0: [request(0, num_frames=20)]})[0].outputs
    finally:
        hook.remove()
    assert [len(o.video) for o in outputs if o.video is not None] == [9, 9, 2]
    # 3 latent frames for each whole chunk; the last one's 2 frames come from its first 2 (1 + 1 x 4).
    assert decoded == [1] * (3 + 3 + 2)


def test_cudnn_benchmark_decodes_a_whole_chunk_of_every_size_and_bucket_at_load(
    helios_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from diffusers import AutoencoderKLWan

    decoded: list[tuple[int, ...]] = []
    decode = AutoencoderKLWan.decode

    def counting(self: AutoencoderKLWan, z: torch.Tensor, *args: object, **kwargs: object) -> object:
        decoded.append(tuple(z.shape))
        return decode(self, z, *args, **kwargs)

    monkeypatch.setattr(AutoencoderKLWan, "decode", counting)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark)  # restored after
    loaded(helios_checkpoint, slots=2, batch_buckets="1,2", cudnn_benchmark=True)
    # (rows, latent channels, the chunk's 3 latent frames, latent height, latent width), VAE scale 8
    channels = decoded[0][1]
    assert decoded == [(rows, channels, 3, 4, w) for w in (4, 6) for rows in (1, 2)]
    decoded.clear()
    loaded(helios_checkpoint, slots=2, batch_buckets="1,2")
    assert decoded == []  # without it nothing is decoded at load


@pytest.mark.slow  # inductor compiles each shape's graph on a CPU: about a minute
def test_compiled_blocks_are_compiled_at_load_and_make_the_frames_the_eager_model_makes(
    helios_checkpoint: Path,
) -> None:
    from torch._dynamo.utils import counters

    eager = video(drive(loaded(helios_checkpoint, slots=1), {0: [request(0)]})[0].outputs)
    plugin = loaded(helios_checkpoint, slots=2, compile=True)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 2  # one a frame size (32x32, 48x32) at the one batch bucket
    compiled = video(drive(plugin, {0: [request(0)], 1: [request(1, width=48, epoch=3)]})[0].outputs)
    assert counters["stats"]["unique_graphs"] == graphs  # nothing compiled while serving
    assert compiled.shape == eager.shape == (20, 32, 32, 3)
    # Fused kernels round differently in the last bits; the frames are the same to a level or two.
    assert np.abs(compiled.astype(int) - eager.astype(int)).max() <= 2


def test_a_stream_without_end_runs_until_it_is_cancelled(helios_checkpoint: Path) -> None:
    plugin = loaded(helios_checkpoint, slots=1)
    plugin.begin(request(0, num_frames=0))
    outputs = [plugin.advance([0])[0] for _ in range(4 * STEPS)]
    assert [o.chunk_index for o in outputs if o.video is not None] == [0, 1, 2, 3]
    assert all(o.progress is None and not o.end_of_turn for o in outputs)
    plugin.cancel_slot(0, epoch=3)
    with pytest.raises(PluginError) as err:
        plugin.advance([0])
    assert err.value.code == "invalid_batch"
    plugin.begin(request(0, epoch=3))  # the slot takes a new request at once


def steps_with(
    plugin: HeliosVideoPlugin, count: int, interactions: dict[int, list[BatchInteraction]]
) -> list[SlotOutput]:
    """``count`` steps of slot 0, each step's interactions handed to the plugin before it."""
    outputs = []
    for step in range(count):
        for interaction in interactions.get(step, ()):
            plugin.interact(interaction)
        outputs.append(plugin.advance([0])[0])
    return outputs


def prompt_change(event_id: str, prompt: str, transition: int | None = None) -> BatchInteraction:
    return BatchInteraction(slot=0, epoch=2, event_id=event_id, prompt=prompt, transition_chunks=transition)


def chunks(outputs: list) -> list[SlotOutput]:
    return [o for o in outputs if o.video is not None]


def test_a_new_prompt_starts_at_the_next_chunk_boundary_and_blends_in_over_its_transition(
    helios_checkpoint: Path,
) -> None:
    baseline = loaded(helios_checkpoint, slots=1)
    baseline.begin(request(0, num_frames=0))
    plain = chunks(steps_with(baseline, 5 * STEPS, {}))
    plugin = loaded(helios_checkpoint, slots=1)
    plugin.begin(request(0, num_frames=0))
    # Handed over in the middle of chunk 1 (after its first step): chunk 2 is the first to show it.
    changed = chunks(steps_with(plugin, 5 * STEPS, {STEPS + 1: [prompt_change("e1", "a red car", 2)]}))
    assert [c.interactions for c in changed] == [
        None,
        None,
        InteractionProgress(started=("e1",), active=("e1",)),
        InteractionProgress(active=("e1",), completed=("e1",)),
        None,
    ]
    for index in (0, 1):
        np.testing.assert_array_equal(changed[index].video, plain[index].video)
    for index in (2, 3, 4):
        assert not np.array_equal(changed[index].video, plain[index].video)


def test_the_newest_waiting_prompt_wins_and_one_that_starts_mid_transition_ends_the_older(
    helios_checkpoint: Path,
) -> None:
    plugin = loaded(helios_checkpoint, slots=1)
    plugin.begin(request(0, num_frames=0))
    outputs = steps_with(
        plugin,
        4 * STEPS,
        {
            1: [prompt_change("a", "one"), prompt_change("b", "two", 3)],  # b replaces a, unstarted
            STEPS + 1: [prompt_change("c", "three", 0)],  # starts while b is blending: b ends there
        },
    )
    assert [c.interactions for c in chunks(outputs)] == [
        None,
        InteractionProgress(started=("b",), active=("b",)),
        InteractionProgress(started=("c",), active=("c",), completed=("b", "c")),
        None,
    ]


@pytest.mark.parametrize(
    ("interaction", "code"),
    [
        (
            BatchInteraction(
                slot=0,
                epoch=2,
                event_id="x",
                camera=CameraControl(mode="target", translation=(0, 0, 1), rotation=(0, 0, 0, 1)),
            ),
            "interaction_unsupported",
        ),
        (BatchInteraction(slot=0, epoch=2, event_id="x"), "invalid_interaction"),
        (BatchInteraction(slot=0, epoch=2, event_id="x", prompt="  "), "response_create_without_input"),
        (
            BatchInteraction(slot=0, epoch=2, event_id="x", prompt="p", transition_chunks=65),
            "invalid_interaction",
        ),
        (BatchInteraction(slot=0, epoch=1, event_id="x", prompt="p"), "invalid_slot"),  # an older request's
        (BatchInteraction(slot=1, epoch=2, event_id="x", prompt="p"), "invalid_slot"),  # no request there
    ],
    ids=["camera", "empty", "blank-prompt", "long-transition", "stale-epoch", "idle-slot"],
)
def test_bad_interactions_are_refused_with_a_code_and_change_nothing(
    helios_checkpoint: Path, interaction: BatchInteraction, code: str
) -> None:
    plugin = loaded(helios_checkpoint, slots=2)
    plugin.begin(request(0, num_frames=0))
    with pytest.raises(PluginError) as err:
        plugin.interact(interaction)
    assert err.value.code == code
    assert all(o.interactions is None for o in steps_with(plugin, 2 * STEPS, {}))


@pytest.mark.parametrize(
    ("text", "options", "code"),
    [
        ("", {}, "response_create_without_input"),
        ("x" * 2001, {}, "event_too_large"),
        ("a cat", {"width": 64}, "invalid_session_config"),  # 64x32 is not served
        ("a cat", {"num_frames": 100_001}, "invalid_session_config"),
        ("a cat", {"steps": 0}, "invalid_session_config"),
        ("a cat", {"guidance_scale": True}, "invalid_session_config"),
        ("a cat", {"fps": 24}, "invalid_session_config"),  # unknown option
        ("a cat", {"image": b"not an image"}, "invalid_session_config"),
        ("a cat", {"image": "data:image/png;base64,AAAA"}, "invalid_session_config"),  # bytes expected
    ],
    ids=["empty", "too-long", "size", "frames", "steps", "bool", "unknown", "bad-image", "image-str"],
)
def test_bad_requests_are_refused_with_a_code_and_leave_the_slot_idle(
    helios_checkpoint: Path, text: str, options: dict, code: str
) -> None:
    plugin = loaded(helios_checkpoint, slots=1)
    with pytest.raises(PluginError) as err:
        plugin.begin(BatchRequest(slot=0, epoch=1, text=text, options=options))
    assert err.value.code == code
    plugin.begin(request(0))  # still idle


def test_capabilities_say_batch_video_and_prompt_interactions(helios_checkpoint: Path) -> None:
    caps = loaded(helios_checkpoint, slots=3).capabilities()
    assert caps.kind is PluginKind.BATCH and caps.max_sessions == 3
    assert caps.output_modalities == ("video",) and caps.interactions == ("prompt",)
    assert not caps.audio_input


def test_tiny_checkpoint_is_written_by_the_plugin_class(tmp_path: Path) -> None:
    HeliosVideoPlugin.write_tiny_checkpoint(str(tmp_path), seed=1)
    folders = {"transformer", "vae", "text_encoder", "tokenizer", "scheduler"}
    assert {p.name for p in tmp_path.iterdir()} >= folders


def _edit_weights(root: Path, folder: str, name: str, edit) -> None:
    from safetensors.torch import load_file, save_file

    path = root / folder / name
    state = load_file(str(path))
    edit(state)
    save_file(state, str(path))


@pytest.mark.parametrize(
    ("folder", "edit", "words"),
    [
        ("transformer", lambda s: s.pop("proj_out.weight"), "missing keys: proj_out.weight"),
        ("vae", lambda s: s.__setitem__("extra.weight", torch.zeros(1)), "unexpected keys: extra.weight"),
        ("text_encoder", lambda s: s.__setitem__("shared.weight", torch.zeros(3, 3)), "shape mismatch"),
    ],
    ids=["missing", "unexpected", "shape"],
)
def test_weights_load_strictly_by_key(
    helios_checkpoint: Path, tmp_path: Path, folder: str, edit, words: str
) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(helios_checkpoint, root)
    name = "model.safetensors" if folder == "text_encoder" else "diffusion_pytorch_model.safetensors"
    _edit_weights(root, folder, name, edit)
    plugin = HeliosVideoPlugin.from_options(str(root))
    with pytest.raises(PluginError) as err:
        plugin.load()
    assert err.value.code == "model_load_failed"
    assert words in err.value.message and folder in err.value.message


def test_the_text_encoders_tied_embedding_loads_under_either_name(
    helios_checkpoint: Path, tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(helios_checkpoint, root)
    _edit_weights(
        root,
        "text_encoder",
        "model.safetensors",
        lambda s: s.__setitem__("encoder.embed_tokens.weight", s.pop("shared.weight")),
    )
    from safetensors.torch import load_file

    stored = load_file(str(root / "text_encoder" / "model.safetensors"))
    assert "shared.weight" not in stored
    encoder = loaded(root, slots=1).model.text_encoder
    state = encoder.state_dict()
    # Every stored tensor is the model's under its name; the other name of the tied pair is the same tensor.
    assert set(state) == {*stored, "shared.weight"}
    for name, tensor in stored.items():
        assert torch.equal(state[name], tensor), name
    assert encoder.shared.weight is encoder.encoder.embed_tokens.weight


def test_a_missing_folder_or_a_pyramid_scheduler_is_refused(helios_checkpoint: Path, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(helios_checkpoint, root)
    config = root / "scheduler" / "scheduler_config.json"
    config.write_text(config.read_text().replace('"stages": 1', '"stages": 3'))
    with pytest.raises(PluginError) as err:
        HeliosVideoPlugin.from_options(str(root)).load()
    assert err.value.code == "model_load_failed" and "stages" in err.value.message
    config.write_text(config.read_text().replace('"stages": 3', '"stages": 1'))
    shutil.rmtree(root / "vae")
    with pytest.raises(PluginError) as err:
        HeliosVideoPlugin.from_options(str(root)).load()
    assert err.value.code == "model_path_unavailable"


@pytest.mark.parametrize(
    "options",
    [
        {"sizes": "30x32"},
        {"history_sizes": "16,2"},
        {"max_sessions": 0},
        {"unknown": 1},
        {"dtype": "int8"},
        {"attention_backend": "no-such-kernel"},
        {"attention_backend": "flash_hub"},  # fetched from a hub: never here
    ],
    ids=["size", "history", "sessions", "unknown", "dtype", "attention", "attention-hub"],
)
def test_bad_plugin_options_are_refused(helios_checkpoint: Path, options: dict) -> None:
    with pytest.raises(PluginError) as err:
        HeliosVideoPlugin.from_options(str(helios_checkpoint), **options).load()
    assert err.value.code == "invalid_plugin_config"
