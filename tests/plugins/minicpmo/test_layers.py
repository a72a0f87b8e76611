"""Our batched forward passes over per-slot caches compute what transformers' own modules compute.

The language model (``Thinker``, on a Qwen3's weights) and the speech head's backbone
(``SpeechGenerator._forward``, on a Llama's) are our code over transformers' parameters: a prefill of
several tokens into one slot of a shared cache, then a decode step, must give transformers' hidden
states for the same sequence. Norm weights are randomised so that a norm applied in the wrong place
shows. (A model built on the meta device has no values in transformers' rotary buffers, which our
passes never read: the references get fresh rotary modules.)
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from duplex.plugins.minicpmo.attention import SlotCache
from duplex.plugins.minicpmo.config import TINY_CONFIG, MiniCPMOConfig
from duplex.plugins.minicpmo.modules import MiniCPMOModel
from duplex.plugins.minicpmo.speech import SpeechGenerator
from duplex.plugins.minicpmo.thinker import Thinker
from tests.rounding import EPS32, depth_tolerance, reduction_lengths

CPU = torch.device("cpu")
SLOTS, SLOT, T = 3, 1, 12


@pytest.fixture(scope="module")
def model() -> tuple[MiniCPMOModel, MiniCPMOConfig]:
    cfg = MiniCPMOConfig.from_json(TINY_CONFIG)
    model = MiniCPMOModel.random(cfg, CPU, torch.float32, seed=5)
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(0.5 + torch.rand(param.shape, generator=gen))
    model.llm.model.rotary_emb = Qwen3RotaryEmbedding(config=model.llm.config)
    model.tts.model.rotary_emb = LlamaRotaryEmbedding(config=model.tts.model.config)
    return model, cfg


def _prefill_then_decode(forward, embeds: torch.Tensor) -> torch.Tensor:
    """Hidden states ``[T + 1, H]``: ``T`` tokens into slot ``SLOT`` at once, then the last one alone."""
    rows = torch.tensor([[SLOT]])
    pos = torch.arange(T)[None]
    first = forward(embeds[:, :T], pos, pos, pos + 1, rows)
    last = torch.tensor([[T]])
    second = forward(embeds[:, T:], last, last, last + 1, rows)
    return torch.cat([first[0], second[0]])


def _tolerance(backbone: torch.nn.Module, layers: int, head_dim: int, theirs: torch.Tensor) -> float:
    """Our pass and transformers' compute the same sums in other orders (other kernels, fused
    products, other batch shapes): ``depth_tolerance`` over every matrix product of the backbone and,
    per layer, attention's sums over a head's width and over the ``T + 1`` keys (twice: the softmax's
    and the values')."""
    attention = [head_dim, T + 1, T + 1] * layers
    return depth_tolerance(float(theirs.abs().max()), reduction_lengths(backbone) + attention)


@torch.no_grad()
def test_the_language_model_over_slot_caches_is_transformers_qwen3(model):
    model, cfg = model
    llm = model.llm
    c = llm.config
    kv = c.num_key_value_heads
    cache = SlotCache(c.num_hidden_layers, SLOTS, kv, 64, c.head_dim, 16, CPU, torch.float32)
    thinker = Thinker(llm, cache, cfg.rope_theta)
    embeds = torch.randn(1, T + 1, c.hidden_size, generator=torch.Generator().manual_seed(1))
    ours = _prefill_then_decode(lambda x, p, w, lim, rows: thinker.forward(x, p, w, lim, rows=rows), embeds)
    theirs = llm.model(inputs_embeds=embeds).last_hidden_state[0]
    tol = _tolerance(llm.model, c.num_hidden_layers, c.head_dim, theirs)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=tol)


@torch.no_grad()
def test_the_speech_heads_backbone_over_slot_caches_is_transformers_llama(model):
    model, cfg = model
    head = model.tts
    b = head.model.config
    dim = b.hidden_size // b.num_attention_heads
    cache = SlotCache(b.num_hidden_layers, SLOTS, b.num_key_value_heads, 64, dim, 16, CPU, torch.float32)
    speech = SpeechGenerator(head, cfg.tts, cache, max_condition=8)
    embeds = torch.randn(1, T + 1, b.hidden_size, generator=torch.Generator().manual_seed(2))

    def forward(x, positions, write_pos, limit, rows):
        # The speech head's pass runs every slot's row: the other rows are frozen (scratch writes).
        full = torch.zeros(SLOTS, x.shape[1], x.shape[2])
        full[SLOT] = x[0]
        n = x.shape[1]
        scratch = cache.capacity + torch.arange(n)[None].expand(SLOTS, n)
        pos = positions.expand(SLOTS, n)
        write = torch.where(torch.arange(SLOTS)[:, None] == SLOT, write_pos.expand(SLOTS, n), scratch)
        lim = torch.where(torch.arange(SLOTS)[:, None] == SLOT, limit.expand(SLOTS, n), scratch + 1)
        return speech._forward(full, pos, write, lim, cache.total)[SLOT : SLOT + 1]

    ours = _prefill_then_decode(forward, embeds)
    theirs = head.model(inputs_embeds=embeds).last_hidden_state[0]
    tol = _tolerance(head.model, b.num_hidden_layers, dim, theirs)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=tol)


def _first_layer_kv(llm, cfg, embeds: torch.Tensor, start: int, move_to: int | None = None) -> tuple:
    """The first layer's keys and values of ``embeds`` written at ``start..`` into a fresh cache (then
    moved to ``move_to..`` by the context window's ``shift_keys``), where they end up."""
    c = llm.config
    kv = c.num_key_value_heads
    cache = SlotCache(c.num_hidden_layers, SLOTS, kv, 64, c.head_dim, 16, CPU, torch.float32)
    thinker = Thinker(llm, cache, cfg.rope_theta)
    n = embeds.shape[1]
    at = torch.arange(start, start + n)[None]
    thinker.forward(embeds, at, at, at + 1, rows=torch.tensor([[SLOT]]))
    if move_to is not None:
        thinker.shift_keys(SLOT, start, start + n, move_to)
        start = move_to
    return cache.k[0, SLOT, :, start : start + n], cache.v[0, SLOT, :, start : start + n]


@torch.no_grad()
def test_keys_moved_by_the_context_window_are_the_keys_of_their_new_positions(model):
    """The first layer's keys and values depend on the token and its position only (deeper ones also on
    what each token attended to): moved from 20.. to 5.., they are those of the tokens written at 5.."""
    model, cfg = model
    embeds = torch.randn(1, T, model.llm.config.hidden_size, generator=torch.Generator().manual_seed(3))
    moved_k, moved_v = _first_layer_kv(model.llm, cfg, embeds, 20, move_to=5)
    direct_k, direct_v = _first_layer_kv(model.llm, cfg, embeds, 5)
    # The projections and norms are the same kernels on the same shapes (bit for bit); the keys differ
    # by their rotations: rotated to 20.. then by -15, or to 5.. at once. A rotation by an angle
    # p * f (f = theta ** (-2i / head_dim) <= 1, the rotary frequencies) moves a pair of norm r by
    # at most u * r * (p * f + 4): the angle's product (u * p * f), cos and sin within an ulp each,
    # the products and their sum.
    # The three rotations reach angles up to 31, 15 and 16 (12 keys from 20, 15 back, from 5).
    pair = 2**0.5 * float(direct_k.abs().max())
    tol = EPS32 / 2 * pair * ((20 + T - 1 + 15 + 5 + T - 1) + 3 * 4)
    torch.testing.assert_close(moved_k, direct_k, rtol=0, atol=tol)
    assert torch.equal(moved_v, direct_v)
    before_k, _ = _first_layer_kv(model.llm, cfg, embeds, 20)
    assert not torch.allclose(before_k, direct_k, atol=1e-3)  # the move did rotate them
