"""MiniCPM-o 4.5 against the official duplex loop: goldens of its own code on our tiny checkpoint.

``tests/parity/minicpmo/goldens.npz`` holds what OpenBMB/MiniCPM-o-Demo's ``MiniCPMO45`` code (the
commit in ``goldens.json``; transformers 4.51.0, torch 2.13.0, CPU) computed, greedy, for a scenario
of four seconds of speech-like audio with a camera frame a second, on the checkpoint that ``duplex
tiny-checkpoint minicpmo_4_5`` writes with seed 0 (``tools/parity/minicpmo_goldens.py`` writes both;
CI cannot reach the reference). The plugin runs the same session in a batch of two slots (the other
slot talks alongside) and every unit is compared, end to end from the audio and the frames: the
system prompt's ids, the unit's layout, the log-mel frames and the audio embeddings of the audio
front end, the vision embeddings, the logits at the unit's first position, the tokens, the decision,
the tokens the speech head hears and its 25 codes. Two more scenarios hold the audio front end alone
to upstream's: 32 seconds of audio (the buffer's clamp from 5 s on, its slide at 30 s, the encoder
cache's restart), and a reference voice as the session's ``prepare`` encodes it. The four-unit session
runs again on a variant of the checkpoint that ends a turn and draws the speech head's end code
(``testing.ending_checkpoint``, two variants), with every chunk upstream's code buffer sent to the
flow. The flow
(minicpmo-utils') is compared on the chunks upstream's duplex loop makes.

Tolerances. Both sides compute the same float32 functions in other groupings (batched rows, one
prefill per unit against upstream's several feeds, fused projections), so they agree to rounding: to
first order a float32 sum of ``n`` terms is off by at most ``n`` units of roundoff (2**-24) of the
magnitudes summed. ``_terms`` counts the terms along the chain from the inputs to a logit (every
projection's inner width, the attended positions, the norms, layer after layer, the vision tower and
the resampler before the language model), and the tolerance is that many units of the values' peak.
The log-mel is a logarithm: a relative error of the mel power (the transform's ``n_fft`` terms, twice
for the square, the filters' bins) becomes an absolute one, divided by ``ln 10`` and by the scaling's
4 (``MEL_TOL``); the audio embeddings add the encoder's terms (``_audio_terms``).
Tokens and codes are argmaxes: where the two sides' logits differ by at most ``d``, a choice whose
margin over the runner-up (recorded by the reference) exceeds ``2 d`` cannot differ; a near tie may
go either way, and the session is compared up to it. None was met where this was written.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

from duplex.plugins.base import SlotInput, SlotOptions
from duplex.plugins.minicpmo.audio import N_FFT
from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin

GOLDENS = Path(__file__).parent / "minicpmo"
REGENERATE = (
    "regenerate the goldens with: .venv/bin/python tools/parity/minicpmo_goldens.py "
    "--reference-python .venv-parity-minicpmo/bin/python --reference PATH/TO/MiniCPM-o-Demo"
)
EPS = 2.0**-24


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def goldens() -> dict[str, np.ndarray]:
    return dict(np.load(GOLDENS / "goldens.npz"))


@pytest.fixture(scope="module")
def meta() -> dict:
    return json.loads((GOLDENS / "goldens.json").read_text())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, meta: dict) -> Path:
    root = tmp_path_factory.mktemp("minicpmo-parity") / "tiny"
    MiniCPMOPlugin.write_tiny_checkpoint(str(root), seed=int(meta["checkpoint_seed"]))
    return root


def test_the_goldens_were_made_from_the_checkpoint_we_write(checkpoint, meta):
    assert _digest(checkpoint) == meta["checkpoint_sha256"], "the tiny checkpoint changed: " + REGENERATE


def _terms(cfg, positions: int) -> tuple[int, int]:
    """Float32 terms summed along the chain to a language-model logit, and to a vision embedding."""
    v, llm = cfg.vision, cfg.llm
    patches = (cfg.image_size // cfg.patch_size) ** 2
    vision = 3 * v.patch_size**2  # the patch embedding
    vision += cfg.vision_layers * (4 * v.hidden_size + patches + v.intermediate_size + 2 * v.hidden_size)
    vision += v.hidden_size + 3 * llm.hidden_size + patches  # the resampler: kv, attention, projection
    hidden, inner = llm.hidden_size, llm.num_attention_heads * llm.head_dim
    layer = hidden + 2 * llm.head_dim + positions + inner + 2 * hidden + llm.intermediate_size
    lm = llm.num_hidden_layers * layer + 2 * hidden  # the final norm and the head
    return vision + lm, vision


# Terms behind a log-mel value, relative to the power it takes the logarithm of: the transform's
# ``n_fft`` terms, squared, and the mel filters' bins; then the tolerance in ``(log10 + 4) / 4`` units.
MEL_TERMS = 2 * N_FFT + N_FFT // 2 + 1
MEL_TOL = MEL_TERMS * EPS / (4 * math.log(10))


def _audio_terms(cfg, positions: int) -> int:
    """Terms along the chain from the audio to an audio embedding: the log-mel's, the two
    convolutions, every encoder layer (norms, projections, the attended positions, the feed-forward),
    the final norm, the projection's two layers and the pooling."""
    a, hidden = cfg.audio, cfg.llm.hidden_size
    d, head = a.d_model, a.d_model // a.encoder_attention_heads
    layer = 3 * d + positions + head + 2 * d + a.encoder_ffn_dim
    pool = cfg.audio_pool_step
    return MEL_TERMS + 3 * a.num_mel_bins + 3 * d + a.encoder_layers * layer + 2 * d + hidden + pool


def _speech_terms(cfg, positions: int) -> int:
    """Terms along the chain to a speech-code logit: the language model's hidden state, the
    projector, the backbone's layers and the code head."""
    t = cfg.tts
    lm, _ = _terms(cfg, positions)
    layer = 4 * t.hidden_size + positions + t.intermediate_size
    return lm + t.llm_dim + t.hidden_size + t.num_hidden_layers * layer + t.hidden_size


def _compare_choices(ours: list[int], theirs: list[int], margins: np.ndarray, d: float) -> int:
    """How many leading choices agree: all of them, or those before a near tie that went the other way
    (its margin at most ``2 d``); a choice that differs with a wider margin fails."""
    for i, choice in enumerate(theirs):
        if i < len(ours) and ours[i] == choice:
            continue
        assert margins[i] <= 2 * d, f"choice {i}: {ours[i : i + 1]} against {choice}, margin {margins[i]:.2e}"
        return i
    assert len(ours) == len(theirs)
    return len(theirs)


def test_a_session_decides_says_and_speaks_what_the_official_loop_does(checkpoint, goldens, meta, capsys):
    plugin = MiniCPMOPlugin.from_options(
        str(checkpoint), max_sessions=2, context_tokens=1024, window_high_tokens=700, window_low_tokens=400
    )
    plugin.load()
    gen = plugin.generator
    sp, q = gen.sp, gen.cfg.query_num
    units = int(meta["units"])
    # The system prompt: the ids the reference fed, and the plugin's prompt length.
    prompt = [int(x) for x in goldens["prompt_ids"]]
    plugin.open_slot(0, SlotOptions(temperature=0.0, instructions=str(goldens["instructions"])))
    plugin.open_slot(1, SlotOptions(temperature=0.7, seed=5, instructions="be brief"))
    ours_prompt = (
        gen.tok.encode(
            "<|im_start|>system\n" + str(goldens["instructions"]) + "\n<|audio_start|>",
            add_special_tokens=False,
        ).ids
        + gen.tok.encode("<|audio_end|><|im_end|>", add_special_tokens=False).ids
    )
    assert ours_prompt == prompt and int(gen.lm_len[0]) == len(prompt)

    mels = _recording_mel(gen)
    rows = []
    previous_terminator = None
    for u in range(units):
        pcm = goldens["audio"][u]
        frame = goldens[f"frame{u}"].tobytes()
        # The unit's layout, as the reference laid it out after the previous unit's terminator and </unit>.
        ids, kind, _src, valid, _frames = gen.layout({0: (pcm, [frame])})
        expected = [] if u == 0 else [(0, previous_terminator), (0, sp.unit_end)]
        for k, value in goldens[f"unit{u}_layout"]:
            expected += [(0, int(value))] if k == 0 else [(int(k), 0)] * int(value)
        row = zip(ids[0, : valid[0]], kind[0, : valid[0]], strict=True)
        ours = [(int(k), int(i) if k == 0 else 0) for i, k in row]
        assert ours == expected, f"unit {u}: layout"
        # The vision tower and resampler on the unit's frame.
        vision = gen.vision.encode([gen.vision.prepare(frame)]).float().numpy()
        golden_vision = goldens[f"unit{u}_vision_embeds"]
        assert vision.shape == golden_vision.shape == (1, q, gen.cfg.llm.hidden_size)
        positions = len(prompt) + 120 * (u + 1)  # at most the keys a unit's positions attend to
        lm_terms, vision_terms = _terms(gen.cfg, positions)
        vision_tol = vision_terms * EPS * float(np.abs(golden_vision).max())
        vision_diff = float(np.abs(vision - golden_vision).max())
        assert vision_diff <= vision_tol, f"unit {u}: vision embeddings"
        # The step, slot 1 alongside.
        other = (0.1 * np.random.default_rng(u).standard_normal(16000)).astype(np.float32)
        plugin.step(
            [
                SlotInput(slot=0, epoch=0, pcm=pcm, video_frames=(frame,)),
                SlotInput(slot=1, epoch=0, pcm=other, video_frames=(goldens[f"frame{3 - u}"].tobytes(),)),
            ]
        )
        res = plugin.last_results[0]
        # What slot 0 heard: its unit's log-mel frames and audio embeddings.
        golden_mel = goldens[f"unit{u}_mel"]
        mel_diff = float(np.abs(mels[u][0][:, -golden_mel.shape[1] :] - golden_mel).max())
        assert mel_diff <= MEL_TOL, f"unit {u}: log-mel"
        golden_audio = goldens[f"unit{u}_audio_embeds"]
        audio = gen.prefill.audio_emb[: golden_audio.shape[0]].float().numpy()
        audio_tol = _audio_terms(gen.cfg, 50 * (u + 1)) * EPS * float(np.abs(golden_audio).max())
        audio_diff = float(np.abs(audio - golden_audio).max())
        assert audio_diff <= audio_tol, f"unit {u}: audio embeddings"
        logits = gen.prefill.logits[0].numpy()
        golden_logits = goldens[f"unit{u}_first_logits"]
        tol = lm_terms * EPS * float(np.abs(golden_logits).max())
        d = float(np.abs(logits - golden_logits).max())
        assert d <= tol, f"unit {u}: first-position logits"
        theirs = [int(x) for x in goldens[f"unit{u}_tokens"]]
        n = _compare_choices(res.tokens, theirs, goldens[f"unit{u}_token_margins"], tol)
        if n < len(theirs):  # a near tie went the other way: the conversations part here
            rows.append((u, f"near tie at token {n}", n, audio_diff, audio_tol, vision_diff, d, tol, None))
            break
        assert (res.decision == "listen") == bool(goldens[f"unit{u}_listen"])
        assert res.end_of_turn == bool(goldens[f"unit{u}_end_of_turn"])
        previous_terminator = theirs[-1]
        code_diff = None
        if f"unit{u}_codes" in goldens:
            assert res.speech_tokens == [int(x) for x in goldens[f"unit{u}_speech_tokens"]]
            # The reference's margins are of the logits over the temperature.
            peak = float(goldens[f"unit{u}_code_peak"]) / gen.opts.tts_temperature
            code_tol = _speech_terms(gen.cfg, 200) * EPS * peak
            golden_codes = [int(x) for x in goldens[f"unit{u}_codes"]]
            m = _compare_choices(
                [int(x) for x in res.codes], golden_codes, goldens[f"unit{u}_code_margins"], code_tol
            )
            code_diff = "equal" if m == len(golden_codes) else f"equal up to a near tie at {m}"
        else:
            assert res.codes is None
        rows.append((u, res.decision, len(theirs), audio_diff, audio_tol, vision_diff, d, tol, code_diff))
    with capsys.disabled():
        print("\nunit decision tokens | audio diff (tol) | vision diff | logits diff (tol) | codes")
        for u, dec, n, ad, at, vd, ld, lt, cd in rows:
            print(f"{u} {dec} {n} | {ad:.1e} ({at:.1e}) | {vd:.1e} | {ld:.1e} ({lt:.1e}) | {cd}")


def _recording_mel(gen) -> list[np.ndarray]:
    """Every unit's log-mel frames (``[slots, bins, 104]``) the audio front end computes from now on."""
    mels: list[np.ndarray] = []
    step = gen.audio.mel.step

    def recording(unit, first, exec_mask):
        frames = step(unit, first, exec_mask)
        mels.append(frames.float().numpy().copy())
        return frames

    gen.audio.mel.step = recording
    return mels


def test_the_audio_front_end_hears_a_long_session_as_the_official_one_does(checkpoint, goldens, capsys):
    """32 seconds of audio alone through the audio step (no language model): upstream's streaming mel
    processor and encoder, past the switch to the buffer's clamp at 5 s, the buffer's slide and the
    encoder cache's restart at 29 s. Slot 1 hears other audio beside it and sits out every third unit."""
    plugin = MiniCPMOPlugin.from_options(
        str(checkpoint), max_sessions=2, context_tokens=1024, window_high_tokens=700, window_low_tokens=400
    )
    plugin.load()
    gen = plugin.generator
    for slot in (0, 1):
        plugin.open_slot(slot, SlotOptions(temperature=0.0))
    mels = _recording_mel(gen)
    audio = goldens["long_audio"].astype(np.float32) / 32768.0  # 16-bit PCM, as ``step`` reads it
    golden_embeds = goldens["long_audio_embeds"]
    rng = np.random.default_rng(7)
    worst = [0.0, 0.0, 0.0]
    for u, pcm in enumerate(audio):
        other = (0.1 * rng.standard_normal(pcm.shape[0])).astype(np.float32)
        gen.prefill.run_audio(np.stack([pcm, other]), np.array([True, u % 3 != 1]))
        if f"long{u}_mel" in goldens:
            golden_mel = goldens[f"long{u}_mel"]
            diff = float(np.abs(mels[u][0][:, -golden_mel.shape[1] :] - golden_mel).max())
            assert diff <= MEL_TOL, f"unit {u}: log-mel"
            worst[0] = max(worst[0], diff)
        golden = golden_embeds[u]
        ours = gen.prefill.audio_emb[: golden.shape[0]].float().numpy()
        positions = 50 * (u % 29 + 1)  # the keys attended: the cache restarts at unit 29
        tol = _audio_terms(gen.cfg, positions) * EPS * float(np.abs(golden).max())
        diff = float(np.abs(ours - golden).max())
        assert diff <= tol, f"unit {u}: audio embeddings"
        worst[1:] = max(worst[1], diff), max(worst[2], tol)
    assert int(gen.audio_len[0]) == 50 * (len(audio) - 29)  # the cache restarted once
    with capsys.disabled():
        mel, embeddings = f"{worst[0]:.1e} ({MEL_TOL:.1e})", f"{worst[1]:.1e} ({worst[2]:.1e})"
        print(f"\nlong session: log-mel within {mel}, audio embeddings within {embeddings}")


def test_a_reference_voice_is_encoded_as_the_official_prepare_encodes_it(checkpoint, goldens):
    """A 2.5 s reference clip: upstream's offline path (the clip's own log-mel, chunked attention), 25
    embeddings (not whole seconds' worth), the slots' audio state untouched."""
    import torch

    plugin = MiniCPMOPlugin.from_options(str(checkpoint), max_sessions=1)
    plugin.load()
    audio = plugin.generator.audio
    golden = goldens["ref_audio_embeds"]
    ours = audio.encode_clip(torch.from_numpy(goldens["ref_audio"].astype(np.float32))).float().numpy()
    assert ours.shape == golden.shape
    tol = _audio_terms(plugin.generator.cfg, golden.shape[0] * 5) * EPS * float(np.abs(golden).max())
    assert float(np.abs(ours - golden).max()) <= tol
    assert not audio.mel.buffer.any() and not audio.mel.length.any()


def test_every_tensor_of_the_official_class_loads_or_is_named_unused(goldens, checkpoint):
    """The official class's module tree (its state dict's keys at the tiny size) against our loader:
    each key is one our tree holds or one ``loading.UNUSED`` names; none of ours is missing there."""
    from duplex.plugins.minicpmo.config import MiniCPMOConfig
    from duplex.plugins.minicpmo.loading import UNUSED
    from duplex.plugins.minicpmo.modules import MiniCPMOModel

    official = {str(k) for k in goldens["official_keys"]}
    cfg = MiniCPMOConfig.from_json(json.loads((checkpoint / "config.json").read_text()))
    ours = set(MiniCPMOModel.on_meta(cfg).state_dict())
    assert ours <= official
    assert {k for k in official - ours if not k.startswith(tuple(UNUSED))} == set()
    for prefix in UNUSED:  # every entry names tensors the official class does have
        assert any(k.startswith(prefix) for k in official)


def _flow_terms(t, positions: int) -> int:
    """Float32 terms along the chain from a code to a mel value: the conformer (its projections, the
    attended positions, its feed-forward, its look-ahead and up-sampling convolutions), the projection
    to mel, then every Euler step's DiT (input projection, per block the attention, its positions and
    the MLP, the output layer) and the step's update."""
    size, dit = t.encoder_size, t.dit_size
    encoder = (t.encoder_blocks + t.encoder_up_blocks) * (4 * size + positions + t.encoder_ffn)
    encoder += 4 * size + size * t.up_rate * 2 + size
    block = 4 * dit + positions + int(dit * t.dit_mlp_ratio) + dit
    return encoder + t.flow_steps * (4 * t.mel_bins + t.dit_depth * block + dit + 2)


def _flow_chunk(flow, t, chunk: list[int], last: bool, theirs: np.ndarray) -> tuple[float, float, int]:
    """One chunk through our ``FlowStream`` (slot 0): the largest difference of its mel from the
    reference's, the tolerance (``_flow_terms`` units of the mel's peak) and the frames."""
    import torch

    count = torch.tensor([len(chunk)])
    tokens = torch.nn.functional.pad(torch.tensor([chunk]), (0, flow.width - len(chunk)))
    mel, frames = flow.chunk(torch.tensor([0]), tokens, count, torch.tensor([last]))
    ours = mel[0, :, : int(frames[0])].float().numpy()
    assert ours.shape == theirs.shape
    return _mel_diff(ours, theirs, t, len(chunk))


def _mel_diff(ours: np.ndarray, theirs: np.ndarray, t, codes: int) -> tuple[float, float, int]:
    positions = 2 * (codes + 100) + 50
    tol = _flow_terms(t, positions) * EPS * float(np.abs(theirs).max())
    return float(np.abs(ours - theirs).max()), tol, theirs.shape[1]


def test_the_flow_turns_codes_into_the_mel_minicpmo_utils_does(checkpoint, goldens, capsys):
    """minicpmo-utils 1.0.7's ``CausalMaskedDiffWithXvec`` (``setup_cache`` + ``inference_chunk``, as its
    ``Token2wav.stream`` calls them) against our ``FlowStream``, on the tiny ``flow.pt`` and voice and the
    first two units' speech codes of the session above, the reference given our noise table: a turn of
    one unit, a turn's first unit and a later one, a turn's first unit and its last, each chunked as
    upstream's duplex loop chunks it (its ``_generate_waveform_from_tokens``: the turn's three silence
    codes first, a chunk of 28 codes, all but 3 leave, the end of the turn flushed as a last chunk of
    its own), which our code buffer must match call for call. Before upstream's cache trims (which
    differ from our history: README), so the two compute the same function."""
    import torch

    from duplex.plugins.minicpmo.flow import CodeBuffer
    from duplex.plugins.minicpmo.loading import find_checkpoint
    from duplex.plugins.minicpmo.token2wav import load_code_to_wave

    files = find_checkpoint(checkpoint)
    t = files.config.token2wav
    flow = load_code_to_wave(files.root, t, 1, torch.device("cpu")).flow
    units = [[int(x) for x in goldens[f"unit{u}_codes"]] for u in range(2)]
    streams = {  # each unit's codes and whether it ends the turn
        "one_unit_turn": [(0, True)],
        "middle": [(0, False), (1, False)],
        "last": [(0, False), (1, True)],
    }
    rows = []
    for name, turn in streams.items():
        flow.reset(0)
        # The chunks the reference ran (upstream's duplex loop's calls): our code buffer's.
        buffer = CodeBuffer(flow.la)
        chunks = [chunk for u, end in turn for chunk in buffer.push(units[u], end)]
        theirs = [
            ([int(x) for x in goldens[f"flow_{name}{i}_codes"]], bool(goldens[f"flow_{name}{i}_last"]))
            for i in range(sum(1 for k in goldens if k.startswith(f"flow_{name}") and k.endswith("_mel")))
        ]
        assert chunks == theirs, name
        for i, (chunk, last) in enumerate(chunks):
            diff, tol, frames = _flow_chunk(flow, t, chunk, last, goldens[f"flow_{name}{i}_mel"])
            assert diff <= tol, f"{name} chunk {i}: mel"
            rows.append((name, i, frames, diff, tol))
    with capsys.disabled():
        print("\nstream chunk frames | mel diff (tol)")
        for name, i, frames, diff, tol in rows:
            print(f"{name} {i} {frames} | {diff:.1e} ({tol:.1e})")


@pytest.mark.parametrize("name", ["end", "reopen"])
def test_a_turn_ends_and_the_speech_head_ends_early_as_in_the_official_loop(
    name, checkpoint, goldens, meta, tmp_path_factory, capsys
):
    """The session above again on variants of the checkpoint that end a turn and draw the speech head's
    end code (``testing.ending_checkpoint`` with ``goldens.json``'s ``endings``; the same weights on both
    sides). ``end``: the turn's first unit ends its speech after 7 codes, the second runs its 25 (the
    end code masked), the third ends the turn (``<|turn_eos|>``, then the forced ``<|chunk_eos|>``) and
    its speech after 15 codes, the fourth opens a new turn. ``reopen``: the second unit's
    ``<|turn_eos|>`` is followed by text, which upstream's loop reports as no end of the turn (the turn
    and its speech go on, 25 codes a unit). Per unit the tokens, the decision, the end of the turn, the
    tokens the speech head hears and its codes (their number too), equal; then every chunk the code
    buffer ran (codes, last flag, the unit that ran it: upstream's ``_generate_waveform_from_tokens``
    calls) and the flow's mel of each before upstream's cache trims, within the flow test's
    tolerance."""
    import shutil

    from duplex.plugins.minicpmo.testing import ending_checkpoint

    variant = meta["endings"][name]
    root = tmp_path_factory.mktemp(f"minicpmo-parity-{name}") / "tiny"
    shutil.copytree(checkpoint, root)
    ending_checkpoint(
        root, **{key: (int(variant[key][0]), float(variant[key][1])) for key in ("turn_end", "code_end")}
    )
    assert _digest(root) == variant["sha256"], f"the {name} checkpoint changed: " + REGENERATE
    plugin = MiniCPMOPlugin.from_options(
        str(root), max_sessions=2, context_tokens=1024, window_high_tokens=700, window_low_tokens=400
    )
    plugin.load()
    gen = plugin.generator
    plugin.open_slot(0, SlotOptions(temperature=0.0, instructions=str(goldens["instructions"])))
    plugin.open_slot(1, SlotOptions(temperature=0.7, seed=5, instructions="be brief"))
    flow = gen.code_to_wave.flow
    chunk = flow.chunk
    ran: list[tuple[int, list[int], bool, np.ndarray]] = []  # slot 0's chunks: unit, codes, last, mel
    unit = 0

    def recording_chunk(rows, tokens, count, last):
        mel, frames = chunk(rows, tokens, count, last)
        for j in np.flatnonzero(rows.numpy() == 0):
            codes = [int(x) for x in tokens[j, : int(count[j])]]
            ran.append((unit, codes, bool(last[j]), mel[j, :, : int(frames[j])].float().numpy().copy()))
        return mel, frames

    flow.chunk = recording_chunk
    rows = []
    prompt_len = len(goldens["prompt_ids"])
    for unit in range(int(meta["units"])):
        pcm, frame = goldens["audio"][unit], goldens[f"frame{unit}"].tobytes()
        other = (0.1 * np.random.default_rng(unit).standard_normal(16000)).astype(np.float32)
        plugin.step(
            [
                SlotInput(slot=0, epoch=0, pcm=pcm, video_frames=(frame,)),
                SlotInput(slot=1, epoch=0, pcm=other, video_frames=(goldens[f"frame{3 - unit}"].tobytes(),)),
            ]
        )
        res = plugin.last_results[0]
        key = f"{name}_unit{unit}"
        lm_terms, _ = _terms(gen.cfg, prompt_len + 120 * (unit + 1))
        golden_logits = goldens[f"{key}_first_logits"]
        tol = lm_terms * EPS * float(np.abs(golden_logits).max())
        d = float(np.abs(gen.prefill.logits[0].numpy() - golden_logits).max())
        assert d <= tol, f"unit {unit}: first-position logits"
        theirs = [int(x) for x in goldens[f"{key}_tokens"]]
        assert _compare_choices(res.tokens, theirs, goldens[f"{key}_token_margins"], tol) == len(theirs)
        assert (res.decision == "listen") == bool(goldens[f"{key}_listen"])
        assert res.end_of_turn == bool(goldens[f"{key}_end_of_turn"]), f"unit {unit}: end of turn"
        assert res.speech_tokens == [int(x) for x in goldens[f"{key}_speech_tokens"]]
        peak = float(goldens[f"{key}_code_peak"]) / gen.opts.tts_temperature
        code_tol = _speech_terms(gen.cfg, 200) * EPS * peak
        golden_codes = [int(x) for x in goldens[f"{key}_codes"]]
        ours = [int(x) for x in res.codes]
        m = _compare_choices(ours, golden_codes, goldens[f"{key}_code_margins"], code_tol)
        assert m == len(golden_codes) and ours == golden_codes, f"unit {unit}: codes"
        rows.append((unit, res.end_of_turn, len(ours), d, tol))
    # The code buffer's chunks, as upstream's loop made its flow calls, and their mel.
    waves = int(goldens[f"{name}_wave_units"].shape[0])
    assert [(u, c, last) for u, c, last, _mel in ran] == [
        (
            int(goldens[f"{name}_wave_units"][i]),
            [int(x) for x in goldens[f"{name}_wave{i}_codes"]],
            bool(goldens[f"{name}_wave{i}_last"]),
        )
        for i in range(waves)
    ]
    t = gen.cfg.token2wav
    chunks = []
    for i, (u, codes, last, mel) in enumerate(ran):
        if f"{name}_wave{i}_mel" not in goldens:  # past upstream's cache trim
            chunks.append((i, u, len(codes), last, mel.shape[1], None, None))
            continue
        theirs = goldens[f"{name}_wave{i}_mel"]
        assert mel.shape == theirs.shape, f"chunk {i}"
        diff, tol, frames = _mel_diff(mel, theirs, t, len(codes))
        assert diff <= tol, f"chunk {i}: mel"
        chunks.append((i, u, len(codes), last, frames, diff, tol))
    with capsys.disabled():
        print(f"\n{name}: unit end_of_turn codes | logits diff (tol)")
        for u, end, n, d, tol in rows:
            print(f"{u} {end} {n} | {d:.1e} ({tol:.1e})")
        print("chunk unit codes last frames | mel diff (tol)")
        for i, u, n, last, frames, diff, tol in chunks:
            mel = "not compared (past upstream's cache trim)" if diff is None else f"{diff:.1e} ({tol:.1e})"
            print(f"{i} {u} {n} {last} {frames} | {mel}")
