"""``--mode accuracy``: what the fp8 cache, the fp8 weights and the decode kernel do to the text logits.

Two copies of the temporal transformer with the same random weights (the same seed) read the
same random token columns: a prefill of ``PREFILL`` positions, then ``--ticks`` positions one at
a time (the per-tick path, with the decode kernel when ``--attention`` picks it). The reference
is the model's dtype throughout, attended with SDPA; each variant changes one thing (or two). Per
variant: the largest logit difference relative to the reference logits' standard deviation, the
mean absolute difference, how often the greedy text token agrees (over all positions, and over
the *confident* ones, where the reference's best token beats its runner-up by more than
``CONFIDENT`` logit), and the mean KL divergence of the variant's softmax from the reference's.

Trained-like logits. Random weights give flat logits (a position's best token hardly beats the
next), so agreement over all positions understates what a listener would notice, and hardly any
position is confident. A trained model's text head is sharper; the text logits are the hidden
state through one linear map, so scaling that map's weights by ``s`` scales every logit, of the
reference and of each variant alike, by ``s``. ``PEAKED`` lists the reference's mean probability
of its best token that the sharper heads are scaled to (``s`` is found by bisection): the
confident-position agreement at those scales is what the plugin README's advice rests on. (This
sharpens the head only: the transformer's own activations, whose outliers fp8 handles worst, are
still random ones; a checkpoint's own figures need the checkpoint, ``--model-path`` is not wired.)
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["run_accuracy"]

PREFILL = 100
BATCH = 4
#: A position is confident where the reference's best text token beats the next by this many logits.
CONFIDENT = 1.0
#: Sharper text heads: the reference's mean probability of its best token at each.
PEAKED = (0.5, 0.9)

VARIANTS: dict[str, dict[str, bool]] = {
    "decode_kernel": {"kernel": True},
    "kv_fp8": {"kv_fp8": True, "kernel": True},
    "fp8_weights": {"fp8_weights": True},
    "kv_fp8_and_fp8_weights": {"kv_fp8": True, "fp8_weights": True, "kernel": True},
}


def _lm(cfg: Any, device: Any, dtype: Any, *, kv_fp8: bool, fp8_weights: bool, kernel: Any) -> Any:
    import torch

    from duplex.plugins.personaplex.attention import use_ring_cache
    from duplex.plugins.personaplex.fp8_linear import use_fp8_weights
    from duplex.plugins.personaplex.loading import build_lm

    torch.manual_seed(0)
    lm = build_lm(cfg, None, device, dtype)
    if fp8_weights:
        use_fp8_weights(lm)
    use_ring_cache(lm, fp8=kv_fp8, decode_kernel=kernel)
    return lm


def _logits(lm: Any, columns: Any) -> list[Any]:
    """Text logits (float32) of every position: one prefill call, then one position per call."""
    import torch

    def embed(col: Any) -> Any:
        x = lm.text_emb(col[:, 0])
        for k in range(lm.n_q):
            x = x + lm.emb[k](col[:, 1 + k])
        return x

    def text(out: Any) -> Any:
        return lm.text_linear(lm.out_norm(out)).float()

    out = []
    with torch.no_grad(), lm.streaming(columns.shape[0]):
        out.append(text(lm.transformer(embed(columns[:, :, :PREFILL]))))
        for t in range(PREFILL, columns.shape[2]):
            out.append(text(lm.transformer(embed(columns[:, :, t : t + 1]))))
    return out


def run_accuracy(args: argparse.Namespace) -> dict[str, Any]:
    """The table of the module docstring, one entry per variant."""
    import torch

    from duplex.plugins.personaplex.config import full_config, tiny_config

    cfg = tiny_config() if args.tiny else full_config()
    device = torch.device(args.device)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    kernel = None
    if args.device.startswith("cuda") and args.attention != "sdpa":
        from duplex.plugins.personaplex.triton_attention import decode_attention

        kernel = decode_attention
    gen = torch.Generator().manual_seed(1)
    T = PREFILL + args.ticks
    text = torch.randint(0, int(cfg.lm["text_card"]), (BATCH, 1, T), generator=gen)
    audio = torch.randint(0, int(cfg.lm["card"]), (BATCH, cfg.num_streams - 1, T), generator=gen)
    columns = torch.cat([text, audio], dim=1).to(device)
    ref_lm = _lm(cfg, device, dtype, kv_fp8=False, fp8_weights=False, kernel=None)
    ref = torch.cat(_logits(ref_lm, columns), dim=1)
    del ref_lm
    scales = {peak: _scale_for(ref, peak) for peak in PEAKED}
    result: dict[str, Any] = {
        "what": f"text logits of {BATCH} rows x ({PREFILL} prefill + {args.ticks} single) positions, random "
        f"weights ({'tiny' if args.tiny else 'full size'}), against the model's dtype with SDPA; confident: "
        f"the reference's best text token {CONFIDENT} logit above the next, with the random head and with "
        f"heads sharpened to a mean best-token probability of {', '.join(map(str, PEAKED))}",
        "reference_logit_std": round(float(ref.std()), 4),
        "reference_mean_top_probability": round(float(torch.softmax(ref, dim=-1).amax(-1).mean()), 4),
    }
    for name, change in VARIANTS.items():
        if change.get("kernel") and kernel is None and not change.get("kv_fp8"):
            continue  # the kernel alone is only a variant where it runs
        lm = _lm(
            cfg,
            device,
            dtype,
            kv_fp8=change.get("kv_fp8", False),
            fp8_weights=change.get("fp8_weights", False),
            kernel=kernel if change.get("kernel") else None,
        )
        got = torch.cat(_logits(lm, columns), dim=1)
        del lm
        diff = (got - ref).abs()
        p_ref = torch.log_softmax(ref, dim=-1)
        p_got = torch.log_softmax(got, dim=-1)
        kl = (p_ref.exp() * (p_ref - p_got)).sum(-1).mean()
        result[name] = {
            "max_abs_over_std": round(float(diff.max() / ref.std()), 4),
            "mean_abs_over_std": round(float(diff.mean() / ref.std()), 5),
            "top1_agreement": round(float((got.argmax(-1) == ref.argmax(-1)).float().mean()), 4),
            "kl_mean": round(float(kl), 6),
            **_agreement(ref, got, 1.0, "random_head"),
        }
        for peak in PEAKED:
            scale = scales[peak]
            result[name].update(_agreement(ref, got, scale, f"head_p{peak}"))
        print(name, result[name], flush=True)
    return result


def _agreement(ref: Any, got: Any, scale: float, label: str) -> dict[str, Any]:
    """Greedy agreement over the positions where the reference (its logits times ``scale``) is
    confident, and how many those are."""
    import torch

    top2 = (ref * scale).topk(2, dim=-1).values
    confident = (top2[..., 0] - top2[..., 1]) > CONFIDENT
    same = got.argmax(-1) == ref.argmax(-1)
    share = float(confident.float().mean())
    agree = float(same[confident].float().mean()) if bool(confident.any()) else float("nan")
    return {
        f"{label}_scale": round(scale, 3),
        f"{label}_confident_share": round(share, 4),
        f"{label}_confident_top1_agreement": round(agree, 5),
        f"{label}_confident_positions": int(confident.sum()),
        f"{label}_disagreements_confident": int((~same & confident).sum()),
    } | ({} if torch.isfinite(torch.tensor(agree)) else {f"{label}_note": "no confident position"})


def _scale_for(ref: Any, peak: float) -> float:
    """The factor on the text head's weights at which the reference's mean probability of its best
    token is ``peak`` (bisection on a log scale; that mean grows with the factor)."""
    import torch

    def mean_top(scale: float) -> float:
        return float(torch.softmax(ref * scale, dim=-1).amax(-1).mean())

    lo, hi = 1e-3, 1e3
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if mean_top(mid) < peak else (lo, mid)
    return (lo * hi) ** 0.5
