"""Camera frames in: decoded on the host; resized, patched, SigLIP + resampler batched on the device.

A frame (JPEG or PNG bytes) is decoded to RGB on the host (``prepare_frame``, on the generator's frame
threads). On the device it is resized with its aspect ratio kept so that its area is about
``image_size``² and each side a multiple of the patch size (MiniCPM-o's ``max_slice_nums=1``: one tile, no
slices, no image ids), normalised to [-1, 1] and cut into ``patch_size``² patches, row-major. The resize
is PIL's bicubic (the model's image processor uses it), done as PIL does it: a horizontal then a vertical
pass of the antialiased bicubic filter (``a = -0.5``), each rounded to 8 bits; it agrees with PIL within
one level on about 0.05 % of the pixels. On the host PIL's resize was 5 of the 8 ms a 640x480 frame cost
on one core, and the copies around it held the interpreter lock: 16 frames kept the step's host
layout at 18 ms on an H200 machine, the accelerator idle.

The frames of a step that share a patch grid (every frame of one camera does) run through the vision
tower together, one pass per grid, unpadded; positions are NaViT's (each patch's fractional coordinates
bucketed onto the ``image_size / patch_size`` grid of learned positions). The resampler's ``query_num``
queries then attend to each frame's patches (2-D sin-cos positions), giving ``query_num`` embeddings of
the language model's width per frame.

Why a pass per grid and not one padded batch with a key-padding mask: attention without a mask runs
the fused flash kernel, 3.6 times faster than the masked one for 16 frames of 1024 patches on an H200
(0.23 against 0.81 ms a layer), and the masked one is cuDNN's, which builds an execution plan for every
new shape: 1.2-1.7 s the first time a step had a frame count not seen before, a stall of every session
on the accelerator (``attention.eager_attention``).
"""

from __future__ import annotations

import io
import math

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError

from duplex.plugins.base import PluginError
from duplex.plugins.minicpmo.attention import eager_attention, fuse_biased_linears
from duplex.plugins.minicpmo.modules import Resampler, VisionTower

__all__ = ["PreparedFrame", "VisionEncoder", "prepare_frame", "resize_like_pil"]

_MAX_FRAME_PIXELS = 16_000_000  # refuse decompression bombs before resizing


class PreparedFrame:
    """One decoded frame on the host: ``pixels [H, W, 3]`` uint8 RGB, the ``size (h, w)`` it is resized to
    and its patch ``grid (h, w)``. The pixels stay uint8 until they are on the device (a quarter of the
    bytes to copy)."""

    __slots__ = ("grid", "pixels", "size")

    def __init__(self, pixels: np.ndarray, size: tuple[int, int], grid: tuple[int, int]) -> None:
        self.pixels = pixels
        self.size = size
        self.grid = grid


def _ensure_divide(length: float, patch: int) -> int:
    return max(round(length / patch) * patch, patch)


def best_size(width: int, height: int, resolution: int, patch: int) -> tuple[int, int]:
    """Resized ``(width, height)``: about ``resolution``², aspect kept, sides divisible by ``patch``."""
    r = width / height
    h = int(resolution / math.sqrt(r))
    w = int(h * r)
    return _ensure_divide(w, patch), _ensure_divide(h, patch)


def max_patches_for(resolution: int, patch: int) -> int:
    """An upper bound of the patches a resized frame has (rounding may add half a patch to each side)."""
    side = resolution // patch + 1
    return side * side


def _open(data: bytes) -> Image.Image:
    """The image (header read, pixels not yet decoded); ``PluginError`` for what is not a usable frame."""
    if not data.startswith((b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")):
        raise PluginError("invalid_video_frames", "a video frame must be JPEG or PNG bytes")
    try:
        img = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise PluginError("invalid_video_frames", f"a video frame could not be decoded: {exc}") from exc
    if img.width * img.height > _MAX_FRAME_PIXELS:
        raise PluginError("invalid_video_frames", f"a video frame of {img.width}x{img.height} is too large")
    return img


def _sizes(width: int, height: int, resolution: int, patch: int, max_patches: int) -> tuple[tuple, tuple]:
    """The resized ``(h, w)`` and the patch grid ``(h, w)`` of a ``width`` x ``height`` frame."""
    new_w, new_h = best_size(width, height, resolution, patch)
    gh, gw = new_h // patch, new_w // patch
    if gh * gw > max_patches:
        raise PluginError("invalid_video_frames", f"a video frame of aspect {width}:{height} is unsupported")
    return (new_h, new_w), (gh, gw)


def prepare_frame(data: bytes, resolution: int, patch: int, max_patches: int) -> PreparedFrame:
    """Decode one frame on the host; raises ``PluginError("invalid_video_frames")`` for a bad image."""
    try:
        with _open(data) as img:
            img.load()
            rgb = img if img.mode == "RGB" else img.convert("RGB")
            pixels = np.asarray(rgb, dtype=np.uint8)  # [H, W, 3]
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise PluginError("invalid_video_frames", f"a video frame could not be decoded: {exc}") from exc
    size, grid = _sizes(pixels.shape[1], pixels.shape[0], resolution, patch, max_patches)
    return PreparedFrame(pixels, size, grid)


def resize_like_pil(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``x [N, C, H, W]`` (float, 0-255) resized to ``size (h, w)`` as PIL's 8-bit bicubic resize does it:
    horizontally, rounded to 8 bits, then vertically, rounded again (module docstring)."""
    h, w = size
    if x.shape[3] != w:
        x = F.interpolate(x, size=(x.shape[2], w), mode="bicubic", antialias=True).round_().clamp_(0, 255)
    if x.shape[2] != h:
        x = F.interpolate(x, size=(h, w), mode="bicubic", antialias=True).round_().clamp_(0, 255)
    return x


def _sincos_2d(dim: int, h: int, w: int) -> np.ndarray:
    """MiniCPM-V's 2-D sin-cos table ``[h, w, dim]``: half the channels encode the column, half the row."""

    def one_d(d: int, pos: np.ndarray) -> np.ndarray:
        omega = 1.0 / 10000 ** (np.arange(d // 2, dtype=np.float32) / (d / 2.0))
        out = np.einsum("hw,d->hwd", pos, omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=-1)

    grid_w, grid_h = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    return np.concatenate([one_d(dim // 2, grid_w), one_d(dim // 2, grid_h)], axis=-1)


class VisionEncoder:
    """Frames -> ``[F, query_num, llm_hidden]`` embeddings (see the module docstring)."""

    def __init__(self, vpm: VisionTower, resampler: Resampler, resolution: int, patch: int) -> None:
        self.vpm = vpm
        self.resampler = resampler
        self.resolution = resolution
        self.patch = patch
        self.max_patches = max_patches_for(resolution, patch)
        self.side = vpm.embeddings.num_patches_per_side
        # Per grid, on the device: the NaViT position ids and the resampler's sin-cos table (computed once).
        self._pos_ids: dict[tuple[int, int], torch.Tensor] = {}
        self._sincos: dict[tuple[int, int], torch.Tensor] = {}
        layer0 = vpm.encoder.layers[0] if len(vpm.encoder.layers) else None
        self.heads = int(layer0.self_attn.num_heads) if layer0 is not None else 1
        # Each layer's q, k and v projections as one matrix product (the modules keep views).
        self._qkv = [
            fuse_biased_linears(x.self_attn.q_proj, x.self_attn.k_proj, x.self_attn.v_proj)
            for x in vpm.encoder.layers
        ]

    def prepare(self, data: bytes) -> PreparedFrame:
        return prepare_frame(data, self.resolution, self.patch, self.max_patches)

    def _position_ids(self, grid: tuple[int, int]) -> torch.Tensor:
        ids = self._pos_ids.get(grid)
        if ids is None:
            h, w = grid
            boundaries = np.arange(1 / self.side, 1.0, 1 / self.side)
            fh = np.arange(0, 1 - 1e-6, 1 / h)[:h]
            fw = np.arange(0, 1 - 1e-6, 1 / w)[:w]
            bh = np.searchsorted(boundaries, fh, side="right")
            bw = np.searchsorted(boundaries, fw, side="right")
            host = (bh[:, None] * self.side + bw).reshape(-1)
            ids = torch.from_numpy(host).to(self.vpm.embeddings.patch_embedding.weight.device)
            self._pos_ids[grid] = ids
        return ids

    def _resampler_pos(self, grid: tuple[int, int]) -> torch.Tensor:
        table = self._sincos.get(grid)
        if table is None:
            host = _sincos_2d(self.resampler.embed_dim, *grid).reshape(grid[0] * grid[1], -1)
            weight = self.vpm.embeddings.patch_embedding.weight
            table = torch.from_numpy(host).to(device=weight.device, dtype=weight.dtype)
            self._sincos[grid] = table
        return table

    @torch.no_grad()
    def encode(self, frames: list[PreparedFrame]) -> torch.Tensor:
        """Embeddings ``[F, query_num, llm_hidden]`` of ``frames``, in order (a pass per patch grid)."""
        groups: dict[tuple[int, int], list[int]] = {}
        for i, frame in enumerate(frames):
            groups.setdefault(frame.grid, []).append(i)
        if len(groups) == 1:
            return self._encode_grid(frames)
        out: torch.Tensor | None = None
        for idx in groups.values():
            part = self._encode_grid([frames[i] for i in idx])
            if out is None:
                out = part.new_empty(len(frames), *part.shape[1:])
            out[torch.tensor(idx, device=part.device)] = part
        assert out is not None
        return out

    def _pixels(self, frames: list[PreparedFrame]) -> torch.Tensor:
        """The frames (one grid) resized and cut into patches on the device: ``[N, patches, 3 * p * p]``
        float, 0-255, each patch channel-major (channel, row, column) as the patch embedding's weight."""
        device = self.vpm.embeddings.patch_embedding.weight.device
        (gh, gw), size, p = frames[0].grid, frames[0].size, self.patch
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i, frame in enumerate(frames):
            by_shape.setdefault(frame.pixels.shape, []).append(i)
        out = torch.empty(len(frames), 3, *size, device=device)
        for idx in by_shape.values():
            host = torch.from_numpy(np.stack([frames[i].pixels for i in idx]))
            x = host.to(device).permute(0, 3, 1, 2).float()
            out[torch.tensor(idx, device=device)] = resize_like_pil(x, size)
        n = len(frames)
        return out.view(n, 3, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(n, gh * gw, 3 * p * p)

    @torch.no_grad()
    def _encode_grid(self, frames: list[PreparedFrame]) -> torch.Tensor:
        """``encode`` of frames that share one patch grid: one batched pass, no padding, no mask."""
        vpm, rs = self.vpm, self.resampler
        weight = vpm.embeddings.patch_embedding.weight
        dtype = weight.dtype
        grid = frames[0].grid
        n, p = len(frames), grid[0] * grid[1]
        x = (self._pixels(frames) / 255.0 - 0.5) / 0.5
        x = F.linear(x.to(dtype), weight.reshape(weight.shape[0], -1), vpm.embeddings.patch_embedding.bias)
        x = x + vpm.embeddings.position_embedding(self._position_ids(grid))[None]
        with eager_attention():
            for i, layer in enumerate(vpm.encoder.layers):
                attn = layer.self_attn
                h = layer.layer_norm1(x)
                qkv = F.linear(h, *self._qkv[i]).view(n, p, 3, self.heads, -1)
                q, k, v = (x.transpose(1, 2) for x in qkv.unbind(2))
                o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, p, -1)
                x = x + attn.out_proj(o)
                h = layer.layer_norm2(x)
                x = x + layer.mlp.fc2(F.gelu(layer.mlp.fc1(h), approximate="tanh"))
            x = vpm.post_layernorm(x)
            # Resampler: the queries attend to each frame's patches.
            kv = rs.ln_kv(rs.kv_proj(x))
            q = rs.ln_q(rs.query)[:, None].expand(-1, n, -1)
            pos = self._resampler_pos(grid)[None]
            out, _ = rs.attn(q, (kv + pos).transpose(0, 1), kv.transpose(0, 1), need_weights=False)
        out = rs.ln_post(out.transpose(0, 1))
        return out @ rs.proj
