"""A tiny Nemotron VoiceChat checkpoint whose weights make the model follow a script.

Real model code, crafted weights: every backbone layer's output projection is
zero, so the thinker's last hidden state is its fused input, ``E(text_prev) +
2 E(function_prev)`` (plus the audio, made negligible by scale). The embeddings
of the tokens below are orthogonal, and each head row reads the pair of
previous tokens that should lead to it, so the model runs this state machine
(text, function) -> (text, function), one step per frame:

* ``(PAD, PAD) -> function SOTC``, then the call's two tokens, then EOTC: a
  call of ``get_weather`` with ``{"city": "Paris"}``;
* ``(PAD, EOTC)`` and ``(PAD, WAIT) -> function WAIT``: it waits;
* a tool result forced into the function channel ends with ``</TOOL_RESPONSE>``:
  ``(PAD, </TOOL_RESPONSE>) -> text BOS``, then `` It``, `` is``, `` sunny.``,
  then EOS: it says "It is sunny." and stops;
* ``(EOS, PAD) -> function WAIT``: it waits again.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from duplex.plugins.nemotron.loading import LLM_DIR, WEIGHTS_FILE
from duplex.plugins.nemotron.testing import make_tiny_checkpoint
from duplex.plugins.nemotron.tokens import TextTokenizer

__all__ = ["CALL", "SENTENCE", "WORDS", "make_scripted_checkpoint"]

CALL_TOKENS = ['<TOOLCALL>[{"name": "get_weather", ', '"arguments": {"city": "Paris"}}]</TOOLCALL>']
WORDS = [" It", " is", " sunny."]
WAIT = "<SPECIAL_5>"
CALL = ("get_weather", '{"city":"Paris"}')
SENTENCE = "".join(WORDS)
_SCALE = 100.0


def make_scripted_checkpoint(root: str | Path) -> Path:
    """Write the scripted checkpoint under ``root`` (a tiny checkpoint, then its weights rewritten)."""
    root = make_tiny_checkpoint(root, seed=11, extra_tokens=CALL_TOKENS + WORDS)
    tok = TextTokenizer(root / LLM_DIR / "tokenizer.json", "<s>", "</s>", "<SPECIAL_12>")
    sp = tok.special

    def tid(text: str) -> int:
        value = tok._tok.token_to_id(text)  # the exact added token
        assert value is not None, text
        return value

    call1, call2 = (tid(t) for t in CALL_TOKENS)
    w1, w2, w3 = (tid(t) for t in WORDS)
    wait, resp_end = tid(WAIT), tid("</TOOL_RESPONSE>")
    names = [sp.pad, sp.bos, sp.eos, sp.sotc, sp.eotc, wait, call1, call2, w1, w2, w3, resp_end]
    state = load_file(str(root / WEIGHTS_FILE))
    emb = state["stt_model.embed_tokens.weight"]
    hidden = emb.shape[1]
    assert len(names) <= hidden
    basis, _ = torch.linalg.qr(torch.randn(hidden, hidden, generator=torch.Generator().manual_seed(3)))
    u = {t: basis[:, i] for i, t in enumerate(names)}
    emb = emb * 0.01
    for t in names:
        emb[t] = _SCALE * u[t]
    text_head = torch.zeros_like(state["stt_model.lm_head.weight"])
    func_head = torch.zeros_like(state["stt_model.function_head.weight"])
    # Scores are read on E(text_prev) + 2 E(function_prev); see the module docstring.
    text_head[sp.pad] = u[sp.pad]
    text_head[sp.bos] = u[resp_end]
    text_head[w1] = 3 * u[sp.bos]
    text_head[w2] = 3 * u[w1]
    text_head[w3] = 3 * u[w2]
    text_head[sp.eos] = 3 * u[w3]
    func_head[sp.sotc] = u[sp.pad]
    func_head[sp.pad] = 3 * (u[sp.bos] + u[w1] + u[w2] + u[w3]) + 2 * u[resp_end]
    func_head[wait] = 3 * u[sp.eos] + 1.5 * u[sp.eotc] + 1.5 * u[wait]
    func_head[call1] = 1.5 * u[sp.sotc]
    func_head[call2] = 1.5 * u[call1]
    func_head[sp.eotc] = 1.5 * u[call2]
    state["stt_model.embed_tokens.weight"] = emb.contiguous()
    state["stt_model.lm_head.weight"] = text_head
    state["stt_model.function_head.weight"] = func_head
    state["stt_model.llm.norm_f.weight"] = torch.ones(hidden)
    for key in list(state):
        if key.startswith("stt_model.llm.layers.") and key.endswith(
            ("mixer.out_proj.weight", "mixer.o_proj.weight", "mixer.down_proj.weight")
        ):
            state[key] = torch.zeros_like(state[key])
    save_file(state, str(root / WEIGHTS_FILE))
    return root
