"""The unit's decode loop: batches compacted to buckets, padded rows frozen, the same tokens at any bucket.

Another bucket or key span is another shape for the same rows, so its logits round differently. The
tests that compare tokens across them run the model in float64 and check every token's decisions
(``decisions``): each choice the sampler made has a margin that the two paths' rounding cannot close,
so the tokens are the same by construction on any CPU, and every token is compared.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from duplex.plugins.base import PluginError, SlotInput, SlotOptions
from duplex.plugins.minicpmo.decode import buckets_for
from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin
from duplex.plugins.minicpmo.token2wav import random_code_to_wave
from tests.plugins.minicpmo.decisions import Decisions


def _pcm(seed: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(16000)).astype(np.float32)


def _plugin(ckpt, slots: int = 5, **options: object) -> MiniCPMOPlugin:
    plugin = MiniCPMOPlugin.from_options(
        str(ckpt),
        max_sessions=slots,
        **options,
        context_tokens=1024,
        window_high_tokens=700,
        window_low_tokens=400,
        code_to_wave="silent",
    )
    plugin.load()
    for slot in range(slots):
        plugin.open_slot(slot, SlotOptions(temperature=0.7, seed=10 + slot))
    return plugin


def _step(plugin: MiniCPMOPlugin, slots: list[int], unit: int) -> dict[int, list[int]]:
    plugin.step([SlotInput(slot=s, epoch=0, pcm=_pcm(100 * s + unit)) for s in slots])
    return {s: plugin.last_results[s].tokens for s in slots}


def test_buckets_are_powers_of_two_below_the_slot_count_then_the_slot_count():
    assert buckets_for(1) == [1]
    assert buckets_for(5) == [1, 2, 4, 5]
    assert buckets_for(16) == [1, 2, 4, 8, 16]


def test_a_batch_is_compacted_to_its_bucket_and_padded_with_idle_slots(minicpmo_ckpt):
    decoder = _plugin(minicpmo_ckpt).generator.decoder
    assert decoder.plan([3, 1, 4]) == ([1, 3, 4, 0], [True, True, True, False])
    assert decoder.plan([2]) == ([2], [True])
    assert decoder.plan([4, 0]) == ([0, 4], [True, True])
    # Past the largest smaller bucket: every slot in order, the batch's live.
    assert decoder.plan([0, 1, 2, 4, 3]) == ([0, 1, 2, 3, 4], [True] * 5)
    assert decoder.plan([4, 2, 3, 0]) == ([0, 2, 3, 4], [True] * 4)  # a full bucket of four: no padding


def test_a_padded_row_leaves_its_slot_exactly_as_it_was(minicpmo_ckpt):
    plugin = _plugin(minicpmo_ckpt)
    gen = plugin.generator
    _step(plugin, [0, 1, 2, 3, 4], 0)  # every slot has a history
    assert gen.decoder.plan([1, 3, 4])[0] == [1, 3, 4, 0]  # slot 0 pads the batch of three
    cap = gen.thinker.cache.capacity
    names = ("lm_len", "seed", "counter", "temperature", "history", "turn_open", "audio_len", "tts_len")
    before = {name: getattr(gen, name)[0].clone() for name in names}
    keys = gen.thinker.cache.k[:, 0, :, :cap].clone()
    values = gen.thinker.cache.v[:, 0, :, :cap].clone()
    for unit in range(1, 4):
        _step(plugin, [1, 3, 4], unit)
    for name in names:
        assert torch.equal(getattr(gen, name)[0], before[name]), name
    assert torch.equal(gen.thinker.cache.k[:, 0, :, :cap], keys)
    assert torch.equal(gen.thinker.cache.v[:, 0, :, :cap], values)


def test_every_bucket_decodes_the_same_tokens_as_the_full_batch(minicpmo_ckpt):
    bucketed, full = _plugin(minicpmo_ckpt, dtype="float64"), _plugin(minicpmo_ckpt, dtype="float64")
    full.generator.decoder.buckets = [5]  # never compact: every slot's row, in order
    decisions = Decisions(full)
    schedule = [[0, 1, 2, 3, 4], [2], [1, 3], [0, 2, 4], [4], [0, 1, 2, 3]]
    for unit, slots in enumerate(schedule):
        tokens = _step(full, slots, unit)
        assert decisions.undecided == []  # every token is beyond the buckets' rounding (module docstring)
        assert _step(bucketed, slots, unit) == tokens
    assert decisions.tokens > 200
    for name in ("lm_len", "counter", "history", "turn_open"):
        assert torch.equal(getattr(bucketed.generator, name), getattr(full.generator, name)), name


@pytest.mark.parametrize("ckpt", ["minicpmo_ckpt", "speak_ckpt", "listen_ckpt"])
def test_the_early_exit_decodes_what_running_every_step_does(ckpt, request):
    """The early exit reads its flag one step late (``decode``): the step it launches after every row
    has ended changes nothing, so tokens and state equal those of a loop that runs every step."""
    path = request.getfixturevalue(ckpt)
    early, every = _plugin(path), _plugin(path, early_exit=False)
    schedule = [[0, 1, 2, 3, 4], [2], [1, 3], [0, 2, 4], [0, 1, 2, 3]]
    for unit, slots in enumerate(schedule):
        assert _step(early, slots, unit) == _step(every, slots, unit)
    for name in ("lm_len", "counter", "history", "turn_open", "tts_len"):
        assert torch.equal(getattr(early.generator, name), getattr(every.generator, name)), name


@pytest.mark.parametrize(("ckpt", "steps"), [("listen_ckpt", 0), ("speak_ckpt", 3)])
def test_the_early_exit_reads_the_first_token_at_once_and_later_flags_one_step_late(ckpt, steps, request):
    """A unit where every row listens runs no decode step; one whose rows end after three tokens
    (``<|tts_bos|> hello <|chunk_eos|>``: two steps) runs one step more, launched before the flag that
    ends the loop was read."""
    from duplex.plugins.stage_clock import StageClock

    plugin = _plugin(request.getfixturevalue(ckpt))
    clock = StageClock(torch.device("cpu"))
    with clock.active():
        _step(plugin, [0, 1, 2], 0)
    times = clock.collect()
    assert times["decode.step"].count == steps if steps else "decode.step" not in times
    assert times["decode.sync"].count == (1 if steps == 0 else steps)


def test_the_captured_steps_read_nothing_back_to_the_host(minicpmo_ckpt):
    """What a CUDA graph capture refuses, checked on a CPU: a step traced with fake tensors raises on
    any read of a tensor's value (``.item()``, ``bool()``, data-dependent shapes)."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    gen = _plugin(minicpmo_ckpt).generator
    spans = gen.thinker.cache.spans
    assert len(spans) > 1  # the tiny model's 1024-token context: 512, then the whole cache
    for size in gen.decoder.buckets:
        for span in spans:
            with FakeTensorMode(allow_non_fake_inputs=True):
                gen.decoder._step(gen.decoder._rows[size], span)
    with FakeTensorMode(allow_non_fake_inputs=True):
        gen.prefill._run_audio()
    assert len(gen.prefill.widths) == 3  # no frame, one, two
    for width in gen.prefill.widths:
        for span in spans:
            with FakeTensorMode(allow_non_fake_inputs=True):
                gen.prefill._run(width, span)
    for span in gen.speech.cache.spans:
        with FakeTensorMode(allow_non_fake_inputs=True):
            gen.speech._code_step(span)
    wave = random_code_to_wave(gen.cfg.token2wav, gen.slots, torch.device("cpu"), voice_codes=12)
    for size in wave.buckets:
        with FakeTensorMode(allow_non_fake_inputs=True):
            wave._run(wave._rows[size])
    with pytest.raises(DataDependentOutputException), FakeTensorMode(allow_non_fake_inputs=True):
        bool(gen.decoder._rows[1].active.any())  # the early-exit read, which stays outside the graph


def test_cuda_graphs_need_a_cuda_device(minicpmo_ckpt):
    plugin = MiniCPMOPlugin.from_options(
        str(minicpmo_ckpt),
        cuda_graphs="true",
        context_tokens=1024,
        window_high_tokens=700,
        window_low_tokens=400,
    )
    with pytest.raises(PluginError) as exc:
        plugin.load()
    assert exc.value.code == "invalid_plugin_config" and "cuda_graphs" in exc.value.message


def test_a_key_span_reads_what_the_whole_cache_would(minicpmo_ckpt):
    spanned = _plugin(minicpmo_ckpt, slots=2, dtype="float64")
    whole = _plugin(minicpmo_ckpt, slots=2, dtype="float64")
    cache = whole.generator.thinker.cache
    cache.span_for = lambda needed: cache.total  # every unit reads the whole cache
    decisions = Decisions(whole)
    short = spanned.generator.thinker.cache.spans[0]
    lengths = []
    for unit in range(20):
        tokens = _step(whole, [0, 1], unit)
        assert decisions.undecided == []  # every token is beyond the spans' rounding (module docstring)
        assert _step(spanned, [0, 1], unit) == tokens
        lengths.append(int(spanned.generator.lm_len.max()))
    assert decisions.tokens > 300
    assert min(lengths) < short - 100 and max(lengths) > short  # both spans were read
    for name in ("lm_len", "counter", "history", "turn_open", "tts_len"):
        assert torch.equal(getattr(spanned.generator, name), getattr(whole.generator, name)), name
