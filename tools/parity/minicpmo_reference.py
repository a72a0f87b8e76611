"""The official MiniCPM-o 4.5 duplex loop on our tiny checkpoint: the reference half of the goldens.

Runs in the parity environment only (transformers 4.51.0, as the reference's requirements pin; torch
2.13.0 on the CPU), never in the project's: ``minicpmo_goldens.py`` calls it. It imports the
reference's own ``MiniCPMO45`` package from a checkout of OpenBMB/MiniCPM-o-Demo (the commit is
checked), lays out a model directory it can load (our checkpoint's weights and tokenizer, its own
code and processor config), and drives ``MiniCPMO`` through ``DuplexCapability`` (``prepare``, then
per unit ``streaming_prefill``, ``streaming_generate``, ``finalize_unit``) as the demo server's
duplex view does, greedy. What it records goes to ``--out`` (npz).

Two choices are made deterministic without changing a rule: the speech head's draw
(``torch.multinomial`` over the codes' softmax) takes the most likely code, as a greedy session of
the plugin does; and every argmax and draw records its margin (best minus second best logit), so the
test knows which choices a rounding difference could flip. The code-to-wave stage is not run (it
needs CUDA and the two ONNX models); the generator then returns no audio, as it does uninitialised.
The unit's 28-character text cut, which the plugin does not have, is off (``--char-limit 28`` puts
it back). Two things are changed because the tiny model needs them: the vision resampler's head count,
``embed_dim // 128``, is 0 at the tiny width (64), so the reference gets one head, as the plugin has;
and the speech head's backbone takes the checkpoint's small vocabulary for its (unused) embedding.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

PINNED_COMMIT = "28b60cfb2a4d7156d045121e9ca2d31cd33f5d5d"
PACKAGE = "minicpmo_reference"
CHECKPOINT_FILES = ("model.safetensors.index.json", "tokenizer.json")


def model_dir(reference: Path, checkpoint: Path, root: Path, query_num: int) -> Path:
    """A directory the reference's ``from_pretrained`` loads: its code, our weights and tokenizer."""
    target = root / PACKAGE
    target.mkdir()
    source = reference / "MiniCPMO45"
    for path in source.glob("*.py"):
        shutil.copy(path, target / path.name)
    # The 28-character cut of a unit's text is a documented difference of the plugin (it has none):
    # its constant becomes a module attribute the run sets (``--char-limit``; off by default).
    code = target / "modeling_minicpmo_unified.py"
    text = code.read_text()
    cut = "if len(_chunk_text) >= 28:"
    if text.count(cut) != 1:
        raise SystemExit(f"the reference no longer has exactly one {cut!r}")
    limit = "if len(_chunk_text) >= CHUNK_CHAR_LIMIT:"
    code.write_text(text.replace(cut, limit) + "\nCHUNK_CHAR_LIMIT = 28\n")
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


def run(args: argparse.Namespace) -> None:
    reference = Path(args.reference).resolve()
    commit = subprocess.run(
        ["git", "-C", str(reference), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if commit and commit != PINNED_COMMIT:
        raise SystemExit(f"the reference checkout is at {commit}, the goldens pin {PINNED_COMMIT}")
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
    modeling.CHUNK_CHAR_LIMIT = args.char_limit if args.char_limit is not None else float("inf")
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

    instructions = str(inputs["instructions"])
    prefix = f"<|im_start|>system\n{instructions}\n<|audio_start|>"
    suffix = "<|audio_end|><|im_end|>"
    tok = duplex.tokenizer
    prompt_ids = tok.encode(prefix, add_special_tokens=False) + tok.encode(suffix, add_special_tokens=False)
    duplex.prepare(prefix_system_prompt=prefix, suffix_system_prompt=suffix)
    audio = inputs["audio"]
    out: dict[str, np.ndarray] = {"prompt_ids": np.asarray(prompt_ids, dtype=np.int64)}
    unit_end = tok.convert_tokens_to_ids("</unit>")
    for unit in range(audio.shape[0]):
        frame = Image.open(io.BytesIO(inputs[f"frame{unit}"].tobytes())).convert("RGB")
        duplex.streaming_prefill(audio_waveform=audio[unit], frame_list=[frame], max_slice_nums=1)
        first_logits = duplex.pending_logits[0].float().numpy().copy()
        before = len(duplex.total_ids)
        n_tts = len(codes)
        codes_margins.clear()
        code_peaks.clear()
        token_margins.clear()
        result = duplex.streaming_generate(decode_mode="greedy", listen_top_k=None)
        duplex.finalize_unit()
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
        out[f"unit{unit}_vision_embeds"] = vision_embeds[unit]
        if len(codes) > n_tts:
            out[f"unit{unit}_speech_tokens"] = np.asarray(tts_inputs[-1], dtype=np.int64)
            out[f"unit{unit}_codes"] = np.asarray(codes[-1], dtype=np.int64)
            out[f"unit{unit}_code_margins"] = np.asarray(codes_margins[: len(codes[-1])], dtype=np.float64)
            out[f"unit{unit}_code_peak"] = np.asarray(max(code_peaks))
        print(f"unit {unit}: listen={result['is_listen']} tokens={generated[:-1]} codes={len(codes) > n_tts}")
    out["official_keys"] = np.asarray(official_keys)
    np.savez(args.out, **out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", required=True, help="a checkout of OpenBMB/MiniCPM-o-Demo")
    parser.add_argument("--checkpoint", required=True, help="duplex tiny-checkpoint minicpmo_4_5 DIR")
    parser.add_argument("--inputs", required=True, help="the scenario's audio and frames (npz)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--char-limit", type=int, default=None, help="upstream's cut (28); default off")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
