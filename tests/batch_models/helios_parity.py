"""Our Helios frames against the diffusers pipeline's, for the parity tests of both samplers.

Where both sides decode a whole chunk, every model call runs on the same shapes on both sides (the
plugin with one row per call, as the pipeline calls the transformer), so the frames are the
pipeline's bit for bit. The last chunk of a request is cut to the frames it asks for, and the
plugin decodes only the latent frames they come from, where the pipeline decodes the whole chunk:
the Wan VAE decodes latent frame by latent frame on the same shapes, but its first (pointwise)
convolution runs over the chunk's whole length, another shape. Those frames are the pipeline's
within ``depth_tolerance`` over the decoder's sums (its output, clamped to [-1, 1], is twice a
pixel in [0, 1] less one), so a pixel may be one level off only where the pipeline's value lies that
close to a rounding boundary.
"""

from __future__ import annotations

import numpy as np
import torch

from tests.rounding import depth_tolerance, reduction_lengths

__all__ = ["assert_frames_are_the_pipelines"]


def assert_frames_are_the_pipelines(
    ours: np.ndarray, theirs: np.ndarray, vae: torch.nn.Module, frames_per_chunk: int
) -> None:
    """``ours``: uint8 ``[T, H, W, 3]``; ``theirs``: the pipeline's float frames in [0, 1] (at least T)."""
    whole = len(ours) // frames_per_chunk * frames_per_chunk
    np.testing.assert_array_equal(ours[:whole], (theirs[:whole] * 255).round().astype(np.uint8))
    lengths = reduction_lengths(vae.post_quant_conv) + reduction_lengths(vae.decoder)
    levels = 255 * depth_tolerance(1.0, lengths) / 2
    off = np.abs(ours[whole:].astype(np.float64) - theirs[whole : len(ours)].astype(np.float64) * 255)
    assert off.max(initial=0.0) <= 0.5 + levels, (off.max(), levels)
