"""MiniCPM-o's camera frames: a pass per patch grid, each frame's embeddings as if it ran alone through
transformers' layers."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from duplex.plugins.minicpmo.config import TINY_CONFIG, MiniCPMOConfig
from duplex.plugins.minicpmo.modules import MiniCPMOModel
from duplex.plugins.minicpmo.vision import VisionEncoder, best_size
from tests.plugins.minicpmo.decisions import vision_lengths
from tests.rounding import depth_tolerance


@pytest.fixture(scope="module")
def encoder() -> VisionEncoder:
    cfg = MiniCPMOConfig.from_json(TINY_CONFIG)
    model = MiniCPMOModel.random(cfg, torch.device("cpu"), torch.float32, seed=3)
    return VisionEncoder(model.vpm, model.resampler, cfg.image_size, cfg.patch_size)


def _noise_jpeg(seed: int, size: tuple[int, int]) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG")
    return buf.getvalue()


def _pil_patches(data: bytes, enc: VisionEncoder) -> tuple[np.ndarray, tuple[int, int]]:
    """The model's image processing on the host: PIL's bicubic resize, then patches (channel-major)."""
    from PIL import Image

    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = best_size(img.width, img.height, enc.resolution, enc.patch)
    pixels = np.asarray(img.resize((w, h), resample=Image.Resampling.BICUBIC))
    p, gh, gw = enc.patch, h // enc.patch, w // enc.patch
    patches = pixels.reshape(gh, p, gw, p, 3).transpose(0, 2, 4, 1, 3).reshape(gh * gw, 3 * p * p)
    return patches, (gh, gw)


def _reference(enc: VisionEncoder, data: bytes) -> torch.Tensor:
    """One frame resized by PIL, through transformers' own SigLIP layers and the resampler's attention."""
    patches, grid = _pil_patches(data, enc)
    vpm, rs = enc.vpm, enc.resampler
    weight = vpm.embeddings.patch_embedding.weight
    x = (torch.from_numpy(patches).float()[None] / 255.0 - 0.5) / 0.5
    bias = vpm.embeddings.patch_embedding.bias
    x = torch.nn.functional.linear(x, weight.reshape(weight.shape[0], -1), bias)
    x = x + vpm.embeddings.position_embedding(enc._position_ids(grid))[None]
    for layer in vpm.encoder.layers:
        out = layer(x, attention_mask=None)
        x = out[0] if isinstance(out, tuple) else out
    x = vpm.post_layernorm(x)
    kv = rs.ln_kv(rs.kv_proj(x))
    q = rs.ln_q(rs.query)[:, None]
    pos = enc._resampler_pos(grid)[None]
    o, _ = rs.attn(q, (kv + pos).transpose(0, 1), kv.transpose(0, 1))
    return (rs.ln_post(o.transpose(0, 1)) @ rs.proj)[0]


def _tolerance(enc: VisionEncoder, patches: int, reference: torch.Tensor) -> float:
    """Our pass (fused q/k/v, batched frames) and the reference compute the same sums in other orders:
    ``depth_tolerance`` over the tower's and the resampler's reductions (``vision_lengths``)."""
    return depth_tolerance(float(reference.abs().max()), vision_lengths(enc, patches))


@torch.no_grad()
def test_frames_of_two_cameras_in_one_step_each_get_their_own_embeddings(encoder):
    # Two grids (4:3 and 16:9), interleaved: each frame comes back in its place, as if encoded alone.
    sizes = [(64, 48), (128, 72), (64, 48), (128, 72), (64, 48)]
    data = [_noise_jpeg(i, size) for i, size in enumerate(sizes)]
    frames = [encoder.prepare(d) for d in data]
    assert len({f.grid for f in frames}) == 2
    together = encoder.encode(frames)
    assert together.shape == (5, encoder.resampler.query.shape[0], encoder.resampler.proj.shape[1])
    tols = []
    for i, (d, frame) in enumerate(zip(data, frames, strict=True)):
        reference = _reference(encoder, d)
        tols.append(_tolerance(encoder, len(frame.patches), reference))
        torch.testing.assert_close(together[i], reference, rtol=0, atol=tols[i])
    # Different frames differ by more than that: a result put in the wrong place would fail above.
    assert not torch.allclose(together[0], together[2], rtol=0, atol=tols[0])


@torch.no_grad()
def test_a_frames_embedding_does_not_depend_on_the_other_frames_of_its_pass(encoder):
    data = [_noise_jpeg(10 + i, (64, 48)) for i in range(5)]
    frames = [encoder.prepare(d) for d in data]
    together = encoder.encode(frames[:3])
    # Between two other frames: the same pass, the same kernels on the same shapes, bit for bit.
    assert torch.equal(encoder.encode([frames[3], frames[1], frames[4]])[1], together[1])
    # Alone: a pass of another batch shape, so the same sums in other orders (derived bound).
    alone = encoder.encode(frames[1:2])[0]
    tol = _tolerance(encoder, len(frames[1].patches), alone)
    torch.testing.assert_close(together[1], alone, rtol=0, atol=tol)


@torch.no_grad()
def test_the_load_time_warm_pass_changes_no_frames_embedding(encoder):
    frame = encoder.prepare(_noise_jpeg(20, (64, 48)))
    before = encoder.encode([frame])
    encoder.warm()  # a blank square frame through the tower (on an accelerator, at load)
    assert torch.equal(encoder.encode([frame]), before)
