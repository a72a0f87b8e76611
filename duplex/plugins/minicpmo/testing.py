"""Tiny MiniCPM-o 4.5 checkpoints with random weights, for tests and CPU serving.

``make_tiny_checkpoint(root, seed)`` writes a directory in the public layout (``config.json``,
``model.safetensors.index.json`` and two shards with the public tensor keys (the unused
``tts.projector_spk.*`` included), ``tokenizer.json`` with the special tokens of the duplex loop,
``tokenizer_config.json`` with ``bad_token_ids``, ``assets/token2wav/flow.pt`` and ``hift.pt`` in the
public key layout, and a small random ``prompt_voice.safetensors``) for ``config.TINY_CONFIG``. The same
seed writes the same bytes.
Nothing is downloaded: the tokenizer is a byte-level BPE trained on a short built-in text.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from duplex.plugins.minicpmo.config import TINY_CONFIG, MiniCPMOConfig
from duplex.plugins.minicpmo.loading import INDEX_FILE, TOKENIZER_FILE
from duplex.plugins.minicpmo.modules import MiniCPMOModel
from duplex.plugins.minicpmo.sampling import portable_normal
from duplex.plugins.minicpmo.tokens import SPECIAL_TOKENS

__all__ = ["make_tiny_checkpoint", "train_tokenizer", "write_token2wav_assets"]

_CORPUS = """\
you are a helpful assistant who answers questions about the weather
hello there how are you doing today my friend
i can see a cup of coffee on the table next to the window
the quick brown fox jumps over the lazy dog near the river bank
thank you for calling how can i help you today
what a lovely picture of the mountains in the morning light
""".splitlines()


def train_tokenizer(vocab_size: int = 420) -> Tokenizer:
    """A byte-level BPE with MiniCPM-o's special tokens (ids right after the learned pieces)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.add_special_tokens(list(SPECIAL_TOKENS.values()))
    return tok


def make_tiny_checkpoint(root: str | Path, seed: int = 0) -> Path:
    """Write a tiny random-weight checkpoint directory under ``root``; return ``root``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    vocab = tok.get_vocab_size(with_added_tokens=True)
    raw = copy.deepcopy(TINY_CONFIG)
    raw["vocab_size"] = vocab
    raw["tts_config"].update(
        num_text_tokens=vocab,
        audio_bos_token_id=tok.token_to_id(SPECIAL_TOKENS["tts_bos"]),
        text_eos_token_id=tok.token_to_id(SPECIAL_TOKENS["tts_eos"]),
    )
    cfg = MiniCPMOConfig.from_json(raw)
    torch.manual_seed(seed)
    model = MiniCPMOModel.random(cfg, torch.device("cpu"), torch.float32, seed=seed)
    state = _portable(model.state_dict(), seed)
    state.update(_unused_tensors(cfg, seed))
    shards = {
        "model-00001-of-00002.safetensors": {k: v for k, v in state.items() if k.startswith("llm.")},
        "model-00002-of-00002.safetensors": {k: v for k, v in state.items() if not k.startswith("llm.")},
    }
    weight_map = {}
    for name, part in shards.items():
        save_file(part, str(root / name), metadata={"format": "pt"})
        weight_map.update({key: name for key in part})
    total = sum(v.numel() * v.element_size() for v in state.values())
    (root / INDEX_FILE).write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    (root / "config.json").write_text(json.dumps(raw, indent=1))
    tok.save(str(root / TOKENIZER_FILE))
    write_token2wav_assets(root, cfg, seed)
    tokenizer_config = {
        "model_max_length": 8192,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bad_token_ids": list(BAD_TOKEN_IDS),
    }
    (root / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    return root


# Ids the tiny tokenizer's config bans from sampling (as the public ``tokenizer_config.json`` bans some
# byte pieces): ordinary byte tokens, none of them in the scripted tests' words.
BAD_TOKEN_IDS = (7, 8, 94, 95, 96, 97)


def _portable(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """``MiniCPMOModel.random``'s weights with every drawn tensor (each N(0, 0.02)) drawn again by
    ``sampling.portable_normal`` (the same bytes on every CPU), in key order; the constant ones (norms,
    biases) kept."""
    rng = np.random.default_rng(seed)
    out = {}
    for key in sorted(state):
        value = state[key].detach()
        constant = bool((value == value.flatten()[0]).all())
        drawn = value.is_floating_point() and value.numel() > 1 and not constant
        out[key] = portable_normal(rng, value.shape, 0.02) if drawn else value.contiguous().clone()
    return out


def _unused_tensors(cfg: MiniCPMOConfig, seed: int) -> dict[str, torch.Tensor]:
    """The public layout's tensors that the plugin does not run (``loading.UNUSED``), random."""
    t = cfg.tts
    rng = np.random.default_rng(seed + 1)
    shapes = {
        "tts.projector_spk.linear1.weight": (t.hidden_size, t.llm_dim),
        "tts.projector_spk.linear1.bias": (t.hidden_size,),
        "tts.projector_spk.linear2.weight": (t.hidden_size, t.hidden_size),
        "tts.projector_spk.linear2.bias": (t.hidden_size,),
    }
    return {key: portable_normal(rng, shape, 0.02) for key, shape in shapes.items()}


def write_token2wav_assets(root: Path, cfg: MiniCPMOConfig, seed: int, voice_codes: int = 12) -> None:
    """Random ``assets/token2wav/flow.pt``, ``hift.pt`` and ``prompt_voice.safetensors`` for ``cfg``."""
    from duplex.plugins.minicpmo.token2wav import ASSETS_DIR, VOICE_FILE, random_state, random_voice

    assets = root / ASSETS_DIR
    assets.mkdir(parents=True, exist_ok=True)
    flow, hift = random_state(cfg.token2wav, seed)
    torch.save(flow, str(assets / "flow.pt"))
    torch.save(hift, str(assets / "hift.pt"))
    voice = random_voice(cfg.token2wav, voice_codes, seed)
    save_file(
        {"speech_tokens": voice.tokens, "mel": voice.mel, "speaker_embedding": voice.speaker},
        str(assets / VOICE_FILE),
    )


def script_checkpoint(root: str | Path, script: dict[str, str]) -> Path:
    """Turn the tiny checkpoint at ``root`` into a bigram model whose next token is ``script[token]``.

    The language model's attention and MLP outputs are zeroed, so its last hidden state is the normed
    input embedding; each scripted successor's ``lm_head`` row is set to that direction, so greedy
    decoding follows the script exactly. ``script["audio"]`` is what follows a unit's audio (every
    audio embedding is made one constant vector). For tests that need known decisions from a real
    checkpoint (listen, speak, end of turn) without a trained model.
    """
    from safetensors.torch import load_file

    root = Path(root)
    index = json.loads((root / INDEX_FILE).read_text())["weight_map"]
    tok = Tokenizer.from_file(str(root / TOKENIZER_FILE))
    files = sorted(set(index.values()))
    state = {name: load_file(str(root / name)) for name in files}

    def get(key: str) -> torch.Tensor:
        return state[index[key]][key]

    for key in index:
        if key.startswith("llm.model.layers.") and key.endswith(("o_proj.weight", "down_proj.weight")):
            get(key).zero_()
    bias = get("audio_projection_layer.linear2.bias")
    get("audio_projection_layer.linear2.weight").zero_()
    gen = torch.Generator().manual_seed(1)
    bias.copy_(torch.randn(bias.shape, generator=gen))
    embed = get("llm.model.embed_tokens.weight")
    head = get("llm.lm_head.weight")
    head.mul_(0.01)
    norm = get("llm.model.norm.weight")

    def direction(vec: torch.Tensor) -> torch.Tensor:
        return vec / vec.pow(2).mean().sqrt() * norm

    for before, after in script.items():
        target = tok.token_to_id(after)
        if target is None:
            raise ValueError(f"{after!r} is not one token")
        if before == "audio":
            head[target] = direction(bias)
        else:
            source = tok.token_to_id(before)
            if source is None:
                raise ValueError(f"{before!r} is not one token")
            head[target] = direction(embed[source])
    for name, part in state.items():
        save_file(part, str(root / name), metadata={"format": "pt"})
    return root


def ending_checkpoint(root: str | Path, *, turn_end: tuple[int, float], code_end: tuple[int, float]) -> Path:
    """Make the tiny checkpoint at ``root`` end a turn and draw the speech head's end code (test-only).

    The random tiny model never draws ``<|turn_eos|>`` nor the end-of-speech code. ``turn_end = (token,
    scale)`` sets ``<|turn_eos|>``'s ``lm_head`` row to ``scale`` times ``token``'s, and ``code_end =
    (code, scale)`` sets the end code's row of the speech head's weight-normed ``head_code.0`` to
    ``code``'s direction with ``scale`` times its norm: the new logit is ``scale`` times the other's
    (to rounding), so it wins where that token or code leads and the scale outweighs the rules' penalties.
    Everything else keeps its bytes; the rows are computed in float32 and saved, so any code that loads
    the directory runs the same weights.
    """
    from safetensors.torch import load_file

    root = Path(root)
    index = json.loads((root / INDEX_FILE).read_text())["weight_map"]
    tok = Tokenizer.from_file(str(root / TOKENIZER_FILE))
    state = {name: load_file(str(root / name)) for name in sorted(set(index.values()))}

    def get(key: str) -> torch.Tensor:
        return state[index[key]][key]

    head = get("llm.lm_head.weight")
    token, scale = turn_end
    head[tok.token_to_id(SPECIAL_TOKENS["turn_eos"])] = head[token] * scale
    norm = get("tts.head_code.0.parametrizations.weight.original0")  # [codes, 1]
    direction = get("tts.head_code.0.parametrizations.weight.original1")  # [codes, hidden]
    eos = direction.shape[0] - 1
    code, scale = code_end
    direction[eos] = direction[code]
    norm[eos] = norm[code] * scale
    for name, part in state.items():
        save_file(part, str(root / name), metadata={"format": "pt"})
    return root
