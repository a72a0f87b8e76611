"""The official MiniCPM-o 4.5 duplex loop on our tiny checkpoint: the reference half of the goldens.

Runs in the parity environment only (transformers 4.51.0, as the reference's requirements pin; torch
2.13.0 on the CPU), never in the project's: ``minicpmo_goldens.py`` calls it. It imports the
reference's own ``MiniCPMO45`` package from a checkout of OpenBMB/MiniCPM-o-Demo (the commit is
checked), lays out a model directory it can load (our checkpoint's weights and tokenizer, its own
code and processor config), and drives ``MiniCPMO`` through ``DuplexCapability`` (``prepare``, then
per unit ``streaming_prefill``, ``streaming_generate``, ``finalize_unit``) as the demo server's
duplex view does, greedy. Then, each after the demo server's end of a session: a long session of
audio alone (``long_audio``, every unit prefilled, nothing generated: the audio front end over the
buffer's clamp, its slides at 30 s and the encoder cache's restart) and a session that opens with a
reference voice (``ref_audio``). What it records goes to ``--out`` (npz): among it each unit's log-mel
as upstream's streaming mel processor emits it and the audio embeddings.

Two choices are made deterministic without changing a rule: the speech head's draw
(``torch.multinomial`` over the codes' softmax) takes the most likely code, as a greedy session of
the plugin does; and every argmax and draw records its margin (best minus second best logit), so the
test knows which choices a rounding difference could flip. The code-to-wave stage is not run (it
needs CUDA and the two ONNX models); the generator then returns no audio, as it does uninitialised.
Two things are changed because the tiny model needs them: the vision resampler's head count,
``embed_dim // 128``, is 0 at the tiny width (64), so the reference gets one head, as the plugin has;
and the speech head's backbone takes the checkpoint's small vocabulary for its (unused) embedding.
"""

from __future__ import annotations

import argparse
import copy
import functools
import hashlib
import importlib
import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

PINNED_COMMIT = "28b60cfb2a4d7156d045121e9ca2d31cd33f5d5d"
# The reference's code at that commit (checked by content: a checkout, an archive or a copy will do).
PINNED_FILES = {
    "modeling_minicpmo_unified.py": "656540e47d2950e3c691cadfd9e7596d3fb98cbd27b8b7fdfbfefca7b5c2eaf6",
    "configuration_minicpmo.py": "b0c56c192d4aa57d3dc358338a4a93413b8b68e7c7a7c5b82a5af35afab1d86a",
    "utils.py": "4a4b75f9b1e2367badf457b41f1288feba0686998cf30cf72d2e79dede5ee57e",
    "processing_minicpmo.py": "3a1f017339b92c2fa768d7737db76cc4689d2280b68a71866b06f7dedc8ac1c2",
    "modeling_navit_siglip.py": "1a40a58cb7dfa93f723685f860d1cf3caf3a0ecf52b7904db0c4007aacd1536f",
    "tokenization_minicpmo_fast.py": "c9c71d0d7ef0c113829e2d810619c9e0a69cffe04c732c4d80599b40a33bc7bf",
}
PACKAGE = "minicpmo_reference"
LONG_MEL_UNITS = (0, 1, 3, 4, 5, 28, 29, 30, 31)  # the long session's units whose mel is kept
CHECKPOINT_FILES = ("model.safetensors.index.json", "tokenizer.json")
# What ``--session-only`` keeps of each unit (the front end's are those of the full run's session).
SESSION_KEYS = (
    "tokens",
    "first_logits",
    "token_margins",
    "listen",
    "end_of_turn",
    "speech_tokens",
    "codes",
    "code_margins",
    "code_peak",
)


def model_dir(reference: Path, checkpoint: Path, root: Path, query_num: int) -> Path:
    """A directory the reference's ``from_pretrained`` loads: its code, our weights and tokenizer."""
    target = root / PACKAGE
    target.mkdir()
    source = reference / "MiniCPMO45"
    for path in source.glob("*.py"):
        shutil.copy(path, target / path.name)
    (target / "__init__.py").write_text("")
    for path in checkpoint.iterdir():
        if path.suffix == ".safetensors" or path.name in CHECKPOINT_FILES:
            (target / path.name).symlink_to(path.resolve())
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(
        architectures=["MiniCPMO"],
        auto_map={"AutoConfig": "configuration_minicpmo.MiniCPMOConfig"},
        torch_dtype="float32",
    )
    (target / "config.json").write_text(json.dumps(config, indent=1))
    tokenizer = json.loads((checkpoint / "tokenizer_config.json").read_text())
    tokenizer.update(
        tokenizer_class="MiniCPMOTokenizerFast",
        auto_map={"AutoTokenizer": ["tokenization_minicpmo_fast.MiniCPMOTokenizerFast", None]},
    )
    (target / "tokenizer_config.json").write_text(json.dumps(tokenizer, indent=1))
    processor = json.loads((source / "preprocessor_config.json").read_text())
    processor["image_feature_size"] = query_num
    (target / "preprocessor_config.json").write_text(json.dumps(processor, indent=1))
    return target


class Margins:
    """Best minus second-best value of every argmax and draw, grouped per call of ``take``."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    def note(self, values: torch.Tensor) -> None:
        top = torch.topk(values.reshape(-1).double(), 2).values
        self.seen.append(float(top[0] - top[1]))

    def take(self) -> float:
        out = min(self.seen, default=float("inf"))
        self.seen = []
        return out


class RecordingToken2wav:
    """Stands in for minicpmo-utils' ``Token2wav`` in the duplex loop, whose code buffer
    (``DuplexCapability._generate_waveform_from_tokens``) then runs as it does with audio on: each
    ``stream`` call's codes and ``last_chunk`` are recorded (and no audio returned: the loop then gives
    none, as uninitialised), and each turn's restore of the prompt's flow state as ``None``."""

    def __init__(self) -> None:
        object.__setattr__(self, "calls", [])

    def __setattr__(self, name, value) -> None:
        if name == "stream_cache":  # ``_reset_token2wav_for_new_turn``: a new turn
            self.calls.append(None)
        object.__setattr__(self, name, value)

    def stream(self, tokens, prompt_wav=None, last_chunk=False, return_waveform=False):
        self.calls.append(([int(x) for x in tokens], bool(last_chunk)))
        return b""


def code_buffer_on(duplex, recorder: RecordingToken2wav) -> None:
    """The duplex loop's token2wav state as ``_init_token2wav_cache`` leaves it (with ``recorder`` for the
    flow, whose look-ahead is three codes), then a turn's start (``prepare`` with a voice does both)."""
    duplex.model.tts.audio_tokenizer = recorder
    duplex.flow_cache_base, duplex.hift_cache_base = {}, {}
    duplex.pre_lookahead = 3
    duplex.token2wav_initialized = True
    duplex._reset_token2wav_for_new_turn()


def run(args: argparse.Namespace) -> None:
    reference = Path(args.reference).resolve()
    for name, digest in PINNED_FILES.items():
        path = reference / "MiniCPMO45" / name
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            raise SystemExit(f"{path} is not the file of commit {PINNED_COMMIT}")
    inputs = np.load(args.inputs)
    checkpoint = Path(args.checkpoint).resolve()
    query_num = int(json.loads((checkpoint / "config.json").read_text())["query_num"])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="minicpmo-reference-"))
    os.environ["HF_HOME"] = str(work / "hf")
    os.environ["HF_HUB_OFFLINE"] = "1"
    target = model_dir(reference, checkpoint, work, query_num)
    sys.path.insert(0, str(work))
    modeling = importlib.import_module(f"{PACKAGE}.modeling_minicpmo_unified")

    def init_resampler(self, embed_dim, vision_dim):  # embed_dim // 128 heads is 0 at the tiny width
        return modeling.Resampler(
            num_queries=self.config.query_num,
            embed_dim=embed_dim,
            num_heads=max(1, embed_dim // 128),
            kv_dim=vision_dim,
            adaptive=True,
        )

    modeling.MiniCPMO.init_resampler = init_resampler
    # The speech head's backbone has Llama's default vocabulary (32000) upstream, an unused embedding
    # the tiny checkpoint keeps small (its tts_config.backbone_vocab_size).
    tts_config = json.loads((checkpoint / "config.json").read_text())["tts_config"]
    backbone_vocab = int(tts_config["backbone_vocab_size"])
    modeling.LlamaConfig = functools.partial(modeling.LlamaConfig, vocab_size=backbone_vocab)
    model, info = modeling.MiniCPMO.from_pretrained(
        str(target), torch_dtype=torch.float32, attn_implementation="sdpa", output_loading_info=True
    )
    model.eval()
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise SystemExit(f"the reference did not load the checkpoint cleanly: {problems}")
    official_keys = sorted(model.state_dict().keys())

    margins = Margins()
    real_argmax, real_multinomial = torch.argmax, torch.multinomial

    def argmax(values, *a, **kw):
        margins.note(values)
        return real_argmax(values, *a, **kw)

    codes_margins: list[float] = []

    def multinomial(probs, num_samples=1, **kw):  # the speech head's draw: its most likely code
        top = torch.topk(probs.reshape(-1).double().log(), 2).values
        codes_margins.append(float(top[0] - top[1]))
        return real_argmax(probs, dim=-1, keepdim=True)

    duplex = modeling.DuplexCapability(model=model, device="cpu", generate_audio=True)
    decode = duplex.decoder.decode
    token_margins: list[float] = []

    def recording_decode(*a, **kw):  # one margin per token drawn: the smaller of its two argmaxes
        torch.argmax = argmax
        try:
            return decode(*a, **kw)
        finally:
            torch.argmax = real_argmax
            token_margins.append(margins.take())

    duplex.decoder.decode = recording_decode
    tts_inputs: list[list[int]] = []
    convert = duplex._convert_results_to_tts_input

    def recording_convert(results):
        tts_inputs.append([int(r[0]) for r in results])
        return convert(results)

    duplex._convert_results_to_tts_input = recording_convert
    codes: list[list[int]] = []
    generate_chunk = model.tts.generate_chunk

    def recording_generate_chunk(*a, **kw):
        torch.multinomial = multinomial
        try:
            new, kv = generate_chunk(*a, **kw)
        finally:
            torch.multinomial = real_multinomial
        codes.append([int(x) for x in new.reshape(-1)])
        return new, kv

    model.tts.generate_chunk = recording_generate_chunk
    code_peaks: list[float] = []
    model.tts.head_code[0].register_forward_hook(lambda _m, _i, o: code_peaks.append(float(o.abs().max())))
    audio_embeds: list[np.ndarray] = []
    vision_embeds: list[np.ndarray] = []
    audio_embedding, vision_embedding = model.get_audio_embedding_streaming, model.get_vision_embedding

    def recording_audio(*a, **kw):
        out = audio_embedding(*a, **kw)
        audio_embeds.append(torch.cat([t for g in out for t in g], dim=0).float().numpy())
        return out

    def recording_vision(*a, **kw):
        out = vision_embedding(*a, **kw)
        vision_embeds.append(out[0].float().numpy())
        return out

    model.get_audio_embedding_streaming = recording_audio
    model.get_vision_embedding = recording_vision
    mels: list[np.ndarray] = []
    streaming_mel = duplex.processor.process_audio_streaming

    def recording_mel(*a, **kw):
        out = streaming_mel(*a, **kw)
        mels.append(out.audio_features[0].float().numpy().copy())
        return out

    duplex.processor.process_audio_streaming = recording_mel

    instructions = str(inputs["instructions"])
    prefix = f"<|im_start|>system\n{instructions}\n<|audio_start|>"
    suffix = "<|audio_end|><|im_end|>"
    tok = duplex.tokenizer
    prompt_ids = tok.encode(prefix, add_special_tokens=False) + tok.encode(suffix, add_special_tokens=False)
    duplex.prepare(prefix_system_prompt=prefix, suffix_system_prompt=suffix)
    recorder = RecordingToken2wav()
    code_buffer_on(duplex, recorder)
    audio = inputs["audio"]
    out: dict[str, np.ndarray] = {"prompt_ids": np.asarray(prompt_ids, dtype=np.int64)}
    wave_calls: list[list] = []
    unit_end = tok.convert_tokens_to_ids("</unit>")
    for unit in range(audio.shape[0]):
        frame = Image.open(io.BytesIO(inputs[f"frame{unit}"].tobytes())).convert("RGB")
        duplex.streaming_prefill(audio_waveform=audio[unit], frame_list=[frame], max_slice_nums=1)
        first_logits = duplex.pending_logits[0].float().numpy().copy()
        before = len(duplex.total_ids)
        n_tts = len(codes)
        n_calls = len(recorder.calls)
        codes_margins.clear()
        code_peaks.clear()
        token_margins.clear()
        result = duplex.streaming_generate(decode_mode="greedy", listen_top_k=None)
        duplex.finalize_unit()
        wave_calls.append(recorder.calls[n_calls:])
        generated = duplex.total_ids[before:]
        assert generated[-1] == unit_end
        schema = duplex.prefill_schema_tokens[unit]
        layout = [("t", x) if not isinstance(x, tuple) else (x[0], x[1]) for x in schema]
        out[f"unit{unit}_layout"] = np.asarray(
            [[{"t": 0, "audio": 1, "img": 2}[k], v] for k, v in layout], dtype=np.int64
        )
        out[f"unit{unit}_tokens"] = np.asarray(generated[:-1], dtype=np.int64)
        out[f"unit{unit}_first_logits"] = first_logits
        out[f"unit{unit}_token_margins"] = np.asarray(token_margins, dtype=np.float64)
        out[f"unit{unit}_listen"] = np.asarray(bool(result["is_listen"]))
        out[f"unit{unit}_end_of_turn"] = np.asarray(bool(result["end_of_turn"]))
        out[f"unit{unit}_audio_embeds"] = audio_embeds[unit]
        out[f"unit{unit}_mel"] = mels[unit]
        out[f"unit{unit}_vision_embeds"] = vision_embeds[unit]
        if len(codes) > n_tts:
            out[f"unit{unit}_speech_tokens"] = np.asarray(tts_inputs[-1], dtype=np.int64)
            out[f"unit{unit}_codes"] = np.asarray(codes[-1], dtype=np.int64)
            out[f"unit{unit}_code_margins"] = np.asarray(codes_margins[: len(codes[-1])], dtype=np.float64)
            out[f"unit{unit}_code_peak"] = np.asarray(max(code_peaks))
        print(f"unit {unit}: listen={result['is_listen']} tokens={generated[:-1]} codes={len(codes) > n_tts}")
    if args.session_only:  # the session and its code buffer's chunks through the flow
        if "flow_noise" in inputs:
            out.update(session_flow(checkpoint, inputs, wave_calls))
        kept = {k: v for k, v in out.items() if k.startswith("wave") or k.split("_", 1)[-1] in SESSION_KEYS}
        np.savez(args.out, **{args.prefix + k: v for k, v in kept.items()})
        return
    out["official_keys"] = np.asarray(official_keys)
    # A long session of audio alone, every unit prefilled (no generation): the buffer's clamp from 5 s
    # on, its slides at 30 s, the encoder cache's restart.
    end_session(model, duplex)
    duplex.prepare(prefix_system_prompt=prefix, suffix_system_prompt=suffix)
    del mels[:], audio_embeds[:]
    for unit, pcm in enumerate(inputs["long_audio"]):  # 16-bit PCM, read as the plugin reads it
        duplex.streaming_prefill(audio_waveform=pcm.astype(np.float32) / 32768.0)
        if unit in LONG_MEL_UNITS:
            out[f"long{unit}_mel"] = mels[unit]
    out["long_audio_embeds"] = np.stack(audio_embeds)
    print(f"long session: {len(audio_embeds)} units")
    # A reference voice, encoded as ``prepare`` encodes it, with the feature extractor's clamp as a
    # fresh process has it (the streaming processor leaves it as its last buffer asked).
    end_session(model, duplex)
    duplex.processor.audio_processor.set_spac_log_norm(dynamic_range_db=8)
    clip_embedding = model.get_audio_embedding
    clips: list[np.ndarray] = []

    def recording_clip(*a, **kw):
        emb = clip_embedding(*a, **kw)
        clips.append(torch.cat([t for g in emb for t in g], dim=0).detach().float().numpy())
        return emb

    model.get_audio_embedding = recording_clip
    duplex.prepare(prefix_system_prompt=prefix, suffix_system_prompt=suffix, ref_audio=inputs["ref_audio"])
    out["ref_audio_embeds"] = clips[0]
    if "flow_noise" in inputs:
        units = [[int(x) for x in out[f"unit{u}_codes"]] for u in range(2)]
        out.update(
            flow_chunks(checkpoint, inputs, units, functools.partial(upstream_chunks, duplex, recorder))
        )
    np.savez(args.out, **out)


def end_session(model, duplex) -> None:
    """What the demo server does when a duplex session ends (``cleanup``): the loop's state, the language
    model's cache, the model's session state (the audio encoder's cache among it)."""
    duplex._reset_streaming_state()
    duplex.decoder.reset()
    model.reset_session(reset_token2wav_cache=True)


def _stepaudio2():
    """minicpmo-utils' ``stepaudio2`` flow modules, without its package ``__init__`` (which imports
    torchaudio, onnxruntime and the S3 tokenizer for the prompt preparation we do not run)."""
    import importlib.machinery
    import types

    import torch._dynamo  # noqa: F401 - before the stub below, which it would look up

    spec = importlib.util.find_spec("stepaudio2")
    if spec is None:
        raise SystemExit("minicpmo-utils is not installed in the parity environment")
    package = types.ModuleType("stepaudio2")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["stepaudio2"] = package
    stub = types.ModuleType("onnxruntime")  # flow_matching imports it for its TensorRT path only
    stub.__spec__ = importlib.machinery.ModuleSpec("onnxruntime", None)
    sys.modules.setdefault("onnxruntime", stub)
    flow = importlib.import_module("stepaudio2.cosyvoice2.flow.flow")
    matching = importlib.import_module("stepaudio2.cosyvoice2.flow.flow_matching")
    dit = importlib.import_module("stepaudio2.cosyvoice2.flow.decoder_dit")
    encoder = importlib.import_module("stepaudio2.cosyvoice2.transformer.upsample_encoder_v2")
    return flow, matching, dit, encoder


def upstream_chunks(duplex, recorder: RecordingToken2wav, units: list[tuple[list[int], bool]]) -> list:
    """The flow calls upstream's duplex loop makes for a turn of ``units`` (each a unit's codes and
    whether it ends the turn): a turn's start (``code_buffer_on``), then per unit
    ``_generate_waveform_from_tokens`` as ``streaming_generate`` calls it (always flushing), with
    ``recorder`` for the flow."""
    code_buffer_on(duplex, recorder)  # the session ended since: the loop's token2wav state is reset
    start = len(recorder.calls)
    for unit, end in units:
        duplex._generate_waveform_from_tokens(torch.tensor([unit]), None, end, force_flush=True)
    return [call for call in recorder.calls[start:] if call is not None]


def flow_model(checkpoint: Path, inputs):
    """minicpmo-utils 1.0.7's flow (``CausalMaskedDiffWithXvec``) on our ``flow.pt`` and voice, the DiT's
    noise buffer set to the plugin's noise table, and its state after the voice prompt (with the
    prompt's first three codes as look-ahead, as ``Token2wav.set_stream_cache`` prepares it)."""
    from safetensors.torch import load_file

    flow_mod, matching, dit, encoder = _stepaudio2()
    t = json.loads((checkpoint / "config.json").read_text())["token2wav_config"]
    model = flow_mod.CausalMaskedDiffWithXvec(
        input_size=t["encoder_size"],
        output_size=t["mel_bins"],
        spk_embed_dim=t["speaker_dim"],
        vocab_size=t["vocab_size"],
        encoder=encoder.UpsampleConformerEncoderV2(
            input_size=t["encoder_size"],
            output_size=t["encoder_size"],
            pre_lookahead_len=t["lookahead_tokens"],
            num_blocks=t["encoder_blocks"],
            num_up_blocks=t["encoder_up_blocks"],
            up_stride=t["up_rate"],
            up_scale_factor=float(t["up_rate"]),
            attention_heads=t["encoder_heads"],
            linear_units=t["encoder_ffn"],
        ),
        decoder=matching.CausalConditionalCFM(
            dit.DiT(
                in_channels=4 * t["mel_bins"],
                out_channels=t["mel_bins"],
                mlp_ratio=t["dit_mlp_ratio"],
                depth=t["dit_depth"],
                num_heads=t["dit_heads"],
                head_dim=t["dit_head_dim"],
                hidden_size=t["dit_size"],
            ),
            inference_cfg_rate=t["cfg_rate"],
        ),
    )
    # The DiT's chunk caches are buffers sized for the public architecture (16 blocks, 8 heads of 64,
    # 512 channels): sized here for the checkpoint's.
    estimator = model.decoder.estimator
    depth, heads, dim = t["dit_depth"], t["dit_heads"], t["dit_head_dim"]
    estimator.att_cache_buffer = torch.zeros(depth, 2, heads, 1000, 2 * dim)
    estimator.cnn_cache_buffer = torch.zeros(depth, 2, 2 * t["dit_size"], 2)
    steps = int(t["flow_steps"])  # the solver's, per Euler step (16 slots upstream)
    model.decoder.cnn_cache_buffer = torch.zeros(16, depth, 2, 2 * t["dit_size"], 2)
    model.decoder.att_cache_buffer = torch.zeros(16, depth, 2, heads, 1000, 2 * dim)
    assets = checkpoint / "assets" / "token2wav"
    model.load_state_dict(torch.load(assets / "flow.pt", map_location="cpu", weights_only=True), strict=True)
    model.eval()
    model.decoder.rand_noise = torch.from_numpy(inputs["flow_noise"])[None]
    voice = load_file(str(assets / "prompt_voice.safetensors"))
    tokens = voice["speech_tokens"].long()[None]
    spk = voice["speaker_embedding"].float()[None]
    la = int(t["lookahead_tokens"])
    assert la == 3, "the tiny flow's look-ahead is the duplex loop's three codes (code_buffer_on)"
    prompt = torch.cat([tokens, tokens[:, :la]], dim=1)
    # A copy: the returned cache holds the solver's own buffers, which the next chunk overwrites (as
    # Token2wav keeps a clone of it to restore each turn).
    cache = copy.deepcopy(model.setup_cache(prompt, voice["mel"].float()[None], spk, steps))
    prompt_frames = voice["mel"].shape[0]
    return model, cache, spk, steps, prompt_frames


def run_stream(flow, calls: list, name: str, past_trims: bool = False) -> dict[str, np.ndarray]:
    """``calls`` (each ``(codes, last_chunk)``, or ``None`` where a turn starts again from the prompt's
    state) through ``inference_chunk`` as ``Token2wav.stream`` runs them; per call its codes, its flag
    and the mel, as ``flow_{name}{i}_*``. ``Token2wav.stream`` trims both caches past the prompt + 100
    frames after a chunk, which our history does not follow (README): a call after a trim fails, or
    with ``past_trims`` is kept without its mel (until the next turn)."""
    model, cache, spk, steps, prompt_frames = flow
    out: dict[str, np.ndarray] = {}
    state = copy.deepcopy(cache)
    i, trimmed = 0, False
    for call in calls:
        if call is None:
            state, trimmed = copy.deepcopy(cache), False
            continue
        if trimmed and not past_trims:
            raise SystemExit(f"the flow scenario {name} reaches upstream's cache trims (our history differs)")
        chunk, last = call
        out[f"flow_{name}{i}_codes"] = np.asarray(chunk, dtype=np.int64)
        out[f"flow_{name}{i}_last"] = np.asarray(last)
        if not trimmed:
            mel, state = model.inference_chunk(
                torch.tensor([chunk], dtype=torch.long), spk, state, last_chunk=last, n_timesteps=steps
            )
            out[f"flow_{name}{i}_mel"] = mel[0].float().numpy()
            trimmed = state["estimator_att_cache"].shape[4] > prompt_frames + 100 or (
                state["conformer_att_cache"].shape[3] > prompt_frames + 100
            )
            print(f"flow {name} chunk {i}: {len(chunk)} codes in, {mel.shape[2]} frames out")
        i += 1
    return out


def flow_chunks(checkpoint: Path, inputs, codes: list[list[int]], chunks) -> dict[str, np.ndarray]:
    """The flow (``flow_model``) streamed as upstream's duplex loop streams two units' codes
    (``chunks``: ``upstream_chunks``) in three turns, each from the prompt's state: a turn of one unit,
    a turn's first unit and a later one, a turn's first unit and its last."""
    flow = flow_model(checkpoint, inputs)
    first, second = codes
    streams = {
        "one_unit_turn": [(first, True)],
        "middle": [(first, False), (second, False)],
        "last": [(first, False), (second, True)],
    }
    out: dict[str, np.ndarray] = {}
    for name, units in streams.items():
        out.update(run_stream(flow, chunks(units), name))
    return out


def session_flow(checkpoint: Path, inputs, calls: list[list]) -> dict[str, np.ndarray]:
    """The flow on the calls the session's code buffer made (per unit, ``None`` where a turn started;
    no mel past a cache trim), and which unit made each call (``wave_units``)."""
    flow = flow_model(checkpoint, inputs)
    flat = [None] + [c for unit in calls for c in unit]  # the session's first turn starts at ``prepare``
    out = run_stream(flow, flat, "session", past_trims=True)
    out = {"wave" + k[len("flow_session") :]: v for k, v in out.items()}
    units = [u for u, unit in enumerate(calls) for call in unit if call is not None]
    out["wave_units"] = np.asarray(units, dtype=np.int64)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", required=True, help="a checkout of OpenBMB/MiniCPM-o-Demo")
    parser.add_argument("--checkpoint", required=True, help="duplex tiny-checkpoint minicpmo_4_5 DIR")
    parser.add_argument("--inputs", required=True, help="the scenario's audio and frames (npz)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--session-only", action="store_true", help="the duplex session and its flow only")
    parser.add_argument("--prefix", default="", help="put before every key written (with --session-only)")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
