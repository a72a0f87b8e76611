"""Whether rounding can change a token MiniCPM-o's sampler draws: the margins of its decisions.

Two runs that reach a slot's logits along different paths (another batch bucket, another key span of
the cache) round differently, so the same slot's logits differ by up to ``logit_bound``. The sampler
(``LMDecoder._sample``) turns logits into a token through a few choices, and a token is *decided*
when each choice it made has a margin wider than that difference can close:

* the boundary draw (does the unit end with ``<|chunk_eos|>``): the noisy logit of ``<|chunk_eos|>``
  against the largest other one;
* the top-p nucleus's size: no cumulative probability of the top-k candidates within reach of
  ``top_p`` (the logits' difference moves each probability by a factor of at most ``exp(2 delta)``,
  and the float32 softmax and sums add their own rounding);
* the draw over the nucleus: its winner (noisy logits) is surely a member, whichever tokens near the
  nucleus's edge swap places, and beats every token that may be a member by more than twice the
  difference;
* a greedy row's argmax: the top two logits further apart than twice the difference.

``Decisions`` records this for every token of one run, computed in float64 from that run's logits.
When every token of the run is decided, the other run's tokens are the same by induction: equal
tokens so far give both runs the same inputs, so their next logits are again within the bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from duplex.plugins.minicpmo.decode import SALT_BOUNDARY, SALT_TOKEN
from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin
from duplex.plugins.minicpmo.sampling import gumbel, gumbel_at, penalize_presence
from duplex.plugins.minicpmo.vision import VisionEncoder
from tests.rounding import EPS32, EPS64, depth_tolerance, reduction_lengths, sum_tolerance

__all__ = ["Decisions", "logit_bound", "vision_lengths"]


def vision_lengths(encoder: VisionEncoder, patches: int) -> list[int]:
    """The reductions a frame's embeddings went through: every matrix product and convolution of the
    vision tower and the resampler, the resampler's input projection (a bare weight) and its output
    matrix, and attention's sums over a head's width and over the frame's ``patches`` keys (the
    softmax's and the values'), per layer."""
    vpm, rs = encoder.vpm, encoder.resampler
    layers = len(vpm.encoder.layers)
    head_dim = vpm.encoder.layers[0].self_attn.head_dim
    tower_heads = [head_dim, patches, patches] * layers
    resampler = [rs.embed_dim, rs.embed_dim // rs.num_heads, patches, patches, rs.proj.shape[0]]
    return reduction_lengths(vpm) + reduction_lengths(rs) + tower_heads + resampler


def logit_bound(plugin: MiniCPMOPlugin, logits: torch.Tensor, upstream: Sequence[int] = ()) -> torch.Tensor:
    """How far two runs' float32 logits ``[rows, vocab]`` of one position may be apart, per row.

    ``depth_tolerance`` at the model's precision over the language model's reductions (every matrix
    product, per layer its two RMS norms, the per-head norms and query-key products over a head's
    width and the attention's two sums over every key a row can read, then the final norm) and the
    ``upstream`` reductions of inputs the two runs encode at other shapes (``vision_lengths``), with
    activations the size of the row's largest logit. Some roundings are float32 whatever the model's
    precision: the rotary cosines and sines are float32 values on every path (their vector and scalar
    kernels may differ by an ulp on two shapes, which moves each rotated query and key by at most 2
    ulps of its size), and a float64 model's logits are rounded to float32 at the end.
    """
    thinker = plugin.generator.thinker
    c = thinker.llm.config
    keys = thinker.cache.capacity
    per_layer = [c.hidden_size, c.head_dim, c.head_dim, keys, keys, c.hidden_size]
    lengths = [*upstream, *reduction_lengths(thinker.llm), *per_layer * c.num_hidden_layers, c.hidden_size]
    rotations = [2, 2] * c.num_hidden_layers
    magnitude = logits.abs().amax(dim=-1).double()
    if thinker.embed_tokens.weight.dtype == torch.float64:
        return depth_tolerance(magnitude, lengths, EPS64) + depth_tolerance(magnitude, [*rotations, 1])
    return depth_tolerance(magnitude, [*lengths, *rotations])


@dataclass(frozen=True)
class Undecided:
    """A token whose choice rounding could have changed: the slot, its unit step's index and why."""

    slot: int
    step: int
    choice: str


class Decisions:
    """Every token ``plugin``'s decoder samples from now on, checked for the margins of its choices.

    ``tokens`` counts the tokens checked, ``undecided`` lists those that another run's rounding could
    have changed (module docstring); ``upstream`` as ``logit_bound``'s. The plugin's decoder is
    observed, not altered: its sampler runs as before, after each check.
    """

    def __init__(self, plugin: MiniCPMOPlugin, upstream: Sequence[int] = ()) -> None:
        self.plugin = plugin
        self.upstream = list(upstream)
        self.tokens = 0
        self.undecided: list[Undecided] = []
        decoder = plugin.generator.decoder
        sample = decoder._sample

        def checked(r, logits: torch.Tensor) -> None:
            self._check(r, logits)
            sample(r, logits)

        decoder._sample = checked

    def _check(self, r, logits: torch.Tensor) -> None:
        opts = self.plugin.generator.decoder.opts
        bound = logit_bound(self.plugin, logits, self.upstream)
        step = int(r.step)
        last = step >= opts.max_new_tokens - 1  # the unit ends here whatever the logits say
        for i in torch.nonzero(r.active)[:, 0].tolist():
            if last or (bool(r.force_listen[i]) and step == 0):
                continue
            self.tokens += 1
            choice = self._undecided_choice(r, i, logits[i].double(), float(bound[i]))
            if choice is not None:
                self.undecided.append(Undecided(int(r.rows[i]), step, choice))

    def _undecided_choice(self, r, i: int, row: torch.Tensor, delta: float) -> str | None:
        """The first of row ``i``'s choices whose margin rounding can close, or None."""
        decoder = self.plugin.generator.decoder
        opts, sp = decoder.opts, decoder.sp
        temp = float(r.temperature[i])
        seed, counter = r.seed[i : i + 1], r.counter[i : i + 1]
        # The boundary draw; adding the float32 noise rounds once more (an ulp of the sum).
        noisy = row + gumbel(seed, counter, row.shape[0], SALT_BOUNDARY)[0].double() if temp > 0 else row
        others = torch.cat([noisy[: sp.chunk_eos], noisy[sp.chunk_eos + 1 :]])
        if abs(float(noisy[sp.chunk_eos] - others.max())) <= 2 * (delta + EPS32 * float(noisy.abs().max())):
            return "boundary"
        if int(noisy.argmax()) == sp.chunk_eos:
            return None  # the unit ends: nothing else is drawn
        # The second draw's logits: banned tokens, the presence and length penalties, the temperature.
        # Each scales a logit by at most ``length_penalty / temperature`` and rounds it once more.
        masked = row.index_fill(0, decoder._forbidden, float("-inf"))
        masked = penalize_presence(masked[None], r.history[i : i + 1], opts.repetition_penalty)[0]
        eos = masked[sp.turn_eos]
        masked[sp.turn_eos] = eos / opts.length_penalty if eos > 0 else eos * opts.length_penalty
        scale = max(opts.length_penalty, 1 / opts.length_penalty) / (temp if temp > 0 else 1.0)
        magnitude = float(row.abs().max())
        delta = (delta + 3 * EPS32 * magnitude) * scale
        values = torch.sort(masked / temp if temp > 0 else masked, descending=True).values
        if temp == 0:
            return "greedy" if float(values[0] - values[1]) <= 2 * delta else None
        return self._undecided_draw(r, i, masked / temp, values, delta)

    def _undecided_draw(
        self, r, i: int, scaled: torch.Tensor, values: torch.Tensor, delta: float
    ) -> str | None:
        opts = self.plugin.generator.decoder.opts
        vocab = scaled.shape[0]
        k = opts.top_k if 0 < opts.top_k < vocab else vocab
        cum = torch.cumsum(torch.softmax(values[:k], dim=0), dim=0)[: k - 1]
        members = k
        if 0.0 < opts.top_p < 1.0:
            reach = math.expm1(2 * delta) + sum_tolerance(2 * k + 4, 1.0)
            if bool(((cum - opts.top_p).abs() <= reach).any()):
                return "nucleus size"
            members = 1 + int((cum <= opts.top_p).sum())
        # Members on either run: a token clearly above the first one left out is surely in; one that
        # could reach the last member's value may be.
        beyond = float(values[members]) if members < vocab else -math.inf
        sure = scaled > beyond + 2 * delta
        maybe = torch.nonzero(scaled >= float(values[members - 1]) - 2 * delta)[:, 0]
        noise = gumbel_at(r.seed[i : i + 1], r.counter[i : i + 1], maybe[None], SALT_TOKEN)[0].double()
        noisy = scaled[maybe] + noise
        order = torch.argsort(noisy, descending=True)
        if not bool(sure[maybe[order[0]]]):
            return "nucleus edge"
        if len(order) > 1:
            gap = float(noisy[order[0]] - noisy[order[1]])
            if gap <= 2 * (delta + EPS32 * float(noisy.abs().max())):
                return "draw"
        return None
