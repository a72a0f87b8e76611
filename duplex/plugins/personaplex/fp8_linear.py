"""fp8 weights for the temporal transformer's linear layers (opt-in: ``fp8_weights``).

The temporal transformer's four projections per layer (attention in/out, gating in/out) are
6.44 B of PersonaPlex's 7.69 B serving parameters: 12.0 GiB in bf16, 6.0 GiB in e4m3 with one
float32 scale per output row (0.4 MB more). Embeddings, the text head, the depformer and Mimi
keep the model's dtype.

``Fp8Linear`` computes ``x @ W.T`` in one of two ways:

* on a GPU with fp8 tensor cores (compute capability 8.9 or more) and dimensions that are
  multiples of 16: ``torch._scaled_mm`` on e4m3 activations (one scale per row, computed on
  the fly) and e4m3 weights, accumulating in float32, output in the model's dtype (W8A8);
* elsewhere (a CPU, an older GPU): the weight dequantized to the model's dtype for each call
  (W8A16: the memory saving holds at rest; the call costs a transient copy of the weight).

What the accuracy costs is measured, not assumed: ``bench.personaplex_capacity --mode accuracy``
compares logits with and without it on the full-size model, and a test bounds it on the tiny one.
"""

from __future__ import annotations

import torch
from moshi.models.lm import LMModel
from torch import nn
from torch.nn import functional as F

from duplex.plugins.personaplex.kv_cache import FP8_DTYPE, FP8_MAX

__all__ = ["Fp8Linear", "use_fp8_weights"]

_MIN_SCALE = 1e-12


class Fp8Linear(nn.Module):
    """A bias-free linear layer with an e4m3 weight ``[N, K]`` and a float32 scale per output row."""

    def __init__(self, linear: nn.Linear, *, scaled_mm: bool) -> None:
        super().__init__()
        assert linear.bias is None, "Fp8Linear has no bias"
        w = linear.weight.detach().float()
        scale = (w.abs().amax(dim=1) / FP8_MAX).clamp_min(_MIN_SCALE)
        self.register_buffer("weight_fp8", (w / scale[:, None]).to(FP8_DTYPE).contiguous())
        self.register_buffer("weight_scale", scale)
        self.out_features, self.in_features = w.shape
        self.dtype = linear.weight.dtype
        self.scaled_mm = scaled_mm and self.in_features % 16 == 0 and self.out_features % 16 == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        if self.scaled_mm:
            xf = x2.float()
            x_scale = (xf.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(_MIN_SCALE)
            xq = (xf / x_scale).to(FP8_DTYPE)
            y = torch._scaled_mm(
                xq,
                self.weight_fp8.t(),
                scale_a=x_scale,
                scale_b=self.weight_scale[None, :],
                out_dtype=self.dtype,
            )
        else:
            w = (self.weight_fp8.to(torch.float32) * self.weight_scale[:, None]).to(x.dtype)
            y = F.linear(x2, w)
        return y.reshape(*shape[:-1], self.out_features)


def _has_fp8_matmul(device: torch.device) -> bool:
    """Whether ``torch._scaled_mm`` with row-wise scales runs here (tried once on a small product)."""
    if device.type != "cuda" or not hasattr(torch, "_scaled_mm"):
        return False
    if torch.cuda.get_device_capability(device) < (8, 9):
        return False
    try:
        probe = Fp8Linear(nn.Linear(32, 16, bias=False, device=device, dtype=torch.bfloat16), scaled_mm=True)
        x = torch.randn(3, 32, device=device, dtype=torch.bfloat16)
        want = F.linear(x.float(), probe.weight_fp8.float() * probe.weight_scale[:, None])
        return bool(torch.allclose(probe(x).float(), want, atol=0.1, rtol=0.1))
    except RuntimeError:  # this torch's _scaled_mm takes other arguments: the fallback it is
        return False


def use_fp8_weights(lm: LMModel) -> int:
    """Replace the temporal transformer's projections with ``Fp8Linear``s; returns how many.

    Call after the weights are loaded and before streaming. The depformer, the embeddings, the
    text head and Mimi are left as they are.
    """
    device = lm.text_emb.weight.device
    scaled_mm = _has_fp8_matmul(device)
    n = 0
    for layer in lm.transformer.layers:
        attn = layer.self_attn
        for projs in (attn.in_projs, attn.out_projs):
            for i, linear in enumerate(projs):
                if isinstance(linear, nn.Linear):
                    projs[i] = Fp8Linear(linear, scaled_mm=scaled_mm)
                    n += 1
        gating = layer.gating
        for name in ("linear_in", "linear_out"):
            linear = getattr(gating, name, None)
            if isinstance(linear, nn.Linear):
                setattr(gating, name, Fp8Linear(linear, scaled_mm=scaled_mm))
                n += 1
    return n
