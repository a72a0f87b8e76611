"""Run NVIDIA's reference implementation of Nemotron VoiceChat on a checkpoint folder; write what it computes.

This script runs ONLY in the parity environment (``nemo-toolkit[speechlm2]==3.0.0`` and
torch; ``nemotron_goldens.py`` says how to build it); the ``duplex`` package never imports
it and it never imports ``duplex``. ``tools/parity/nemotron_goldens.py`` calls it.

What "the reference" is, stage by stage (NeMo 3.0.0's own modules and methods, driven
frame by frame the way NVIDIA's real-time pipeline drives them):

* **prompt**: the system prompt (instructions and tools) is rendered by vLLM-Omni's
  Nemotron VoiceChat plugin functions (``_render_tool_prompt``, ``_render_tool_response``,
  read from the ``vllm-omni`` wheel given on the command line and executed here; vLLM
  itself is not needed for them) and tokenized by NeMo's ``AutoTokenizer``
  (``[bos] + text_to_ids(prompt) + [eos]``);
* **perception**: NeMo's cache-aware streaming: ``CacheAwareStreamingAudioBuffer`` cuts
  the mel into the encoder's streaming chunks, ``ConformerEncoder.cache_aware_stream_step``
  encodes one 80 ms frame per call with its caches, then the modality adapter runs on that
  frame alone and ``proj`` maps it to the backbone's width (the real-time pipeline's
  per-frame perception);
* **thinker**: ``DuplexSTTModel`` through its streaming-inference helpers
  (``_init_inference``, ``_step_zero``, ``_step_inference``: the prompt positions, then one
  position per frame, greedy text). NeMo 3.0.0 has no function channel; the checkpoint's
  ``function_head`` is added as vLLM-Omni's thinker defines it: ``E(function_prev) *
  duplex_function_channel_weight`` joins every position's fused input (PAD on the prompt
  and before the first frame) and the function token is the greedy ``function_head`` of
  the position's last hidden state; a forced token (a tool result) replaces it and holds
  the text channel at PAD;
* **talker**: ``DuplexEARTTS``: the speaker prompt (``set_init_inputs`` with the voice's
  cached latent, one backbone pass), then ``infer_codes_one_step`` once per frame with that
  frame's text token, as the real-time pipeline feeds it (the talker never sees the system
  prompt's positions; NeMo 3.0.0's ``offline_inference`` runs it over them too);
* **codec**: ``RVQVAEModel.decode`` one frame per call with its ``CausalConv1dCache`` (the
  serving path; a whole-sequence decode gives the same samples 8 earlier, the cache's
  inverse-STFT look-behind).

Output (``--out``, an ``.npz``): ``prompt_ids [P]``, ``perception [F, H]``,
``text_logits [F, V]``, ``function_logits [F, V]`` (before any forcing), ``text [F]``,
``function [F]``, ``codes [F, Q]``, ``pcm [F * samples_per_frame]``.

Usage::

    python tools/parity/nemotron_reference.py --checkpoint DIR --scenario SCENARIO.json \\
        --vllm-omni-wheel vllm_omni-0.30.0-py3-none-any.whl --dtype float32 --out OUT.npz
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import torch

_PLUGIN_FILE = "vllm_omni/model_executor/models/nemotron_voicechat/duplex/plugin.py"
_RENDERERS = ("_render_tool_prompt", "_render_tool_response")
_DEFAULT_PROMPT = "_DEFAULT_SYSTEM_PROMPT"


def load_renderers(wheel: Path) -> dict:
    """vLLM-Omni's prompt and tool-response renderers, executed from the wheel's source."""
    with zipfile.ZipFile(wheel) as zf:
        source = zf.read(_PLUGIN_FILE).decode()
    tree = ast.parse(source)
    chosen = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in _RENDERERS]
    chosen += [
        n
        for n in tree.body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == _DEFAULT_PROMPT for t in n.targets)
    ]
    if len(chosen) != len(_RENDERERS) + 1:
        raise SystemExit(f"{wheel}: {_PLUGIN_FILE} no longer defines {_RENDERERS} and {_DEFAULT_PROMPT}")
    namespace: dict = {"json": json}
    module = ast.Module(body=chosen, type_ignores=[])
    exec(compile(module, _PLUGIN_FILE, "exec"), namespace)  # the vendor's own code, read from its wheel
    return namespace


def build_model(checkpoint: Path, work: Path):
    """NeMo's ``NemotronVoiceChat`` from the folder's config, every tensor loaded strictly.

    Only run-time fields NeMo needs and the checkpoint's training config lacks are added
    (local paths, ``pretrained_weights=False``, NemotronH's embedding attribute name).
    Returns ``(model, function_head, config)``.
    """
    from nemo.collections.speechlm2.models import NemotronVoiceChat
    from safetensors.torch import load_file

    # NeMo picks its Nemotron code path by the backbone's name ("Nemotron" in pretrained_llm).
    llm = work / "NVIDIA-Nemotron-backbone"
    llm.symlink_to((checkpoint / "llm").resolve())
    cfg = json.loads((checkpoint / "config.json").read_text())
    stt = cfg["model"]["stt"]["model"]
    stt.update(
        pretrained_llm=str(llm),
        pretrained_weights=False,
        source_sample_rate=16000,
        validation_save_path=str(work),
        embed_tokens_attr_name="embeddings",
    )
    gen = cfg["model"]["speech_generation"]
    gen["model"]["pretrained_lm_name"] = str(llm)
    gen["exp_manager"] = {"explicit_log_dir": str(work)}
    cfg["exp_manager"] = {"explicit_log_dir": str(work)}
    model = NemotronVoiceChat(cfg).eval()
    state = load_file(str(checkpoint / "model.safetensors"))
    head_weight = state.pop("stt_model.function_head.weight", None)
    model.tts_model.maybe_recreate_cached_audio_prompt_latents_structure(state)
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise SystemExit(f"the reference cannot load the checkpoint: missing {missing}, extra {unexpected}")
    model.load_state_dict(state, strict=True)
    function_head = None
    if head_weight is not None and stt.get("use_function_head", True):
        function_head = torch.nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=False)
        function_head.weight.data.copy_(head_weight)
    return model, function_head, cfg


def prompt_ids(model, renderers: dict, case: dict) -> list[int]:
    """A session's prompt as vLLM-Omni builds it: the default persona for no instructions."""
    tok = model.stt_model.tokenizer
    instructions = case["instructions"] or renderers[_DEFAULT_PROMPT]
    text = renderers["_render_tool_prompt"](instructions, case["tools"])
    ids = tok.text_to_ids(text)
    # vLLM-Omni tokenizes with the transformers tokenizer's encode(); the two must agree.
    assert ids == tok.tokenizer.encode(text, add_special_tokens=False), "NeMo and HF tokenization differ"
    return [tok.bos_id, *ids, tok.eos_id]


@torch.no_grad()
def stream_perception(model, audio: np.ndarray, frames: int, dtype: torch.dtype) -> torch.Tensor:
    """NeMo's cache-aware streaming perception: one embedding per 80 ms frame ``[frames, H]``."""
    from nemo.collections.asr.parts.utils.streaming_utils import CacheAwareStreamingAudioBuffer
    from nemo.core import typecheck
    from omegaconf import OmegaConf

    perception = model.stt_model.perception
    encoder = perception.encoder

    class _Asr:  # what the buffer reads from an ASR model
        pass

    asr = _Asr()
    asr.encoder = encoder
    asr._cfg = OmegaConf.create({"preprocessor": OmegaConf.to_container(perception.cfg.preprocessor)})
    asr.from_config_dict = perception.from_config_dict
    asr.device = torch.device("cpu")
    buffer = CacheAwareStreamingAudioBuffer(asr, pad_and_drop_preencoded=False)
    # The buffer builds a fresh preprocessor from the config; use the checkpoint's filter bank and window.
    fresh, loaded = buffer.preprocessor.featurizer, perception.preprocessor.featurizer
    fresh.fb.copy_(loaded.fb)
    fresh.window.copy_(loaded.window)
    buffer.preprocessor.to(dtype)
    buffer.append_audio(audio.astype(np.float64 if dtype == torch.float64 else np.float32), stream_id=-1)
    caches = encoder.get_initial_cache_state(batch_size=1, dtype=dtype, device=torch.device("cpu"))
    out = []
    with typecheck.disable_checks():
        for step, (chunk, lengths) in enumerate(buffer):
            if step == frames:
                break
            encoded, encoded_len, *caches = encoder.cache_aware_stream_step(
                processed_signal=chunk.to(dtype),
                processed_signal_length=lengths,
                cache_last_channel=caches[0],
                cache_last_time=caches[1],
                cache_last_channel_len=caches[2],
                keep_all_outputs=True,
                drop_extra_pre_encoded=0 if step == 0 else encoder.streaming_cfg.drop_extra_pre_encoded,
            )
            assert int(encoded_len[0]) == 1, f"frame {step}: {int(encoded_len[0])} encoder frames"
            adapted, _ = perception.modality_adapter(audio_signal=encoded, length=encoded_len)
            out.append(perception.proj(adapted.transpose(1, 2))[0, 0])
    assert len(out) == frames, f"the streaming buffer gave {len(out)} frames, wanted {frames}"
    return torch.stack(out)


@contextlib.contextmanager
def codec_precision(codec, dtype: torch.dtype):
    """Decode in ``dtype``. NeMo casts the decoder's spectrogram to float32 (``.float()``) and
    builds its window in the default dtype; for a float64 run both follow ``dtype``, so the
    float64 reference is float64 throughout (the float32 run is NeMo's code unchanged)."""
    if dtype != torch.float64:
        yield
        return
    original, default = torch.Tensor.float, torch.get_default_dtype()

    def keep_double(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else original(self, *args, **kwargs)

    codec.double()
    torch.Tensor.float = keep_double
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.Tensor.float = original
        torch.set_default_dtype(default)
        codec.float()


class TalkerChoices:
    """Records the scores behind the talker's discrete choices, for their margins: the mixture
    logits each MoG round picks a component from (top-1: the largest), and each codebook's
    ``|e|^2 - 2 r.e`` the residual quantizer takes the smallest of."""

    def __init__(self, tts_model) -> None:
        from nemo.collections.speechlm2.modules import ear_tts_model

        self.module = ear_tts_model
        self.original = ear_tts_model.depthsum_encoding_step
        self.mog: list[torch.Tensor] = []
        self.rvq: list[torch.Tensor] = []
        self.hook = tts_model.mog_head.proj_logits.register_forward_hook(
            lambda _m, _a, out: self.mog.append(out.detach().reshape(-1, out.shape[-1]).clone())
        )

        def recorded(embs, r, code, depth_str=0, k=72):
            residual = r
            for i in range(depth_str, depth_str + k):
                dots = (residual.unsqueeze(-2) @ embs[i].transpose(-1, -2)).squeeze(-2)
                scores = embs[i].pow(2).sum(-1) - 2 * dots
                self.rvq.append(scores.detach().reshape(-1, scores.shape[-1]).clone())
                residual = residual - torch.nn.functional.embedding(scores.argmin(-1), embs[i])
            return self.original(embs, r, code, depth_str, k)

        ear_tts_model.depthsum_encoding_step = recorded

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        mog, rvq = torch.cat(self.mog).double().numpy(), torch.cat(self.rvq).double().numpy()
        self.mog.clear()
        self.rvq.clear()
        return mog, rvq

    def close(self) -> None:
        self.hook.remove()
        self.module.depthsum_encoding_step = self.original


class FunctionChannel:
    """The function channel NeMo 3.0.0 lacks, as forward hooks on ``DuplexSTTModel`` (see the docstring).

    A pre-hook on the backbone adds ``E(function_prev) * weight`` to every position it is given;
    a hook on ``lm_head`` records the last position's text logits, computes the function token,
    and, on a frame with a forced token, makes the text argmax PAD.
    """

    def __init__(self, stt, head, weight: float, prompt_len: int, pad: int, forced: dict[int, int]) -> None:
        self.stt, self.head, self.weight = stt, head, weight
        self.prompt_len, self.pad, self.forced = prompt_len, pad, forced
        self.function: list[int] = []  # one per position
        self.text_logits: list[torch.Tensor] = []  # per frame
        self.function_logits: list[torch.Tensor] = []
        self.hooks = [
            stt.llm.register_forward_pre_hook(self._add_channel, with_kwargs=True),
            stt.lm_head.register_forward_hook(self._heads),
        ]

    def _previous(self, positions: int) -> torch.Tensor:
        prev = [self.pad] * positions
        for p in range(self.prompt_len + 1, positions):
            prev[p] = self.function[p - 1]
        return torch.tensor(prev)

    def _add_channel(self, module, args, kwargs):
        if self.head is None:
            return None
        x = kwargs["inputs_embeds"]
        extra = self.stt.embed_tokens(self._previous(x.shape[1])).to(x.dtype) * self.weight
        kwargs["inputs_embeds"] = x + extra[None]
        return args, kwargs

    def _heads(self, module, args, output):
        positions = output.shape[1]
        if positions <= len(self.function):  # the prompt positions are run again every step
            return output
        frame = positions - 1 - self.prompt_len
        hidden = args[0][0, -1]
        if frame < 0:
            self.function.append(self.pad)
            return output
        self.text_logits.append(output[0, -1].detach().clone())
        if self.head is not None:
            logits = self.head(hidden)
            self.function_logits.append(logits.detach().clone())
            token = int(logits.argmax())
        else:
            self.function_logits.append(torch.full_like(output[0, -1], float("nan")))
            token = self.pad
        if frame in self.forced:
            token = self.forced[frame]
            output = output.clone()
            output[0, -1] = torch.where(
                torch.arange(output.shape[-1]) == self.pad, torch.inf, -torch.inf
            ).to(output.dtype)
        self.function.append(token)
        return output

    def close(self) -> None:
        for h in self.hooks:
            h.remove()


def speaker_prompt(tts, voice: str):
    """The talker after the voice's speaker prompt: ``(cache, last code, last subword id)``."""
    tts.set_init_inputs(speaker_name=voice)
    init = tts.get_init_inputs(B=1)
    init.update(use_cache=True, past_key_values=None, guidance_enabled=True)
    cache = tts.tts_model(**init).past_key_values
    return cache, init["code"][:, -1:], init["subword_ids"][:, -1:]


def talk(tts, voice: str, text: list[int]) -> torch.Tensor:
    """The talker's codes ``[len(text), Q]`` for one text token per frame, after the speaker prompt."""
    cache, code, previous = speaker_prompt(tts, voice)
    generation = tts._get_generation_config(guidance_enabled=True)
    codes = []
    for token in text:
        current = torch.tensor([[token]])
        code, cache = tts.infer_codes_one_step(
            current_subword_id=current,
            prev_subword_id=previous,
            current_subword_mask=torch.ones(1, 1, dtype=torch.bool),
            prev_audio_tokens=code,
            past_key_values=cache,
            guidance_enabled=True,
            generation_config=generation,
            ignore_eos_flag_stop=True,
        )
        codes.append(code[0, 0].clone())
        previous = current
    return torch.stack(codes)


@torch.no_grad()
def run(model, head, cfg: dict, scenario: dict, audio: np.ndarray, renderers: dict, dtype: torch.dtype):
    stt, tts = model.stt_model, model.tts_model
    spf = tts.audio_codec.config.wav_to_token_ratio
    frames = len(audio) // 1280
    ids = prompt_ids(model, renderers, scenario)
    features = stream_perception(model, audio, frames, dtype)
    forced: dict[int, int] = {}
    for item in scenario.get("tool_results", []):
        text = renderers["_render_tool_response"](item["output"])
        tokens = stt.tokenizer.text_to_ids(text)
        for i, t in enumerate(tokens):
            forced[item["frame"] + i] = t

    # The perception of the whole input, as _init_inference asks for it: the streamed frames.
    def streamed(*_args, **_kwargs):
        lengths = torch.tensor([frames])
        return features[None].to(dtype), lengths, None

    stt.perception.forward = streamed
    stt_cfg = cfg["model"]["stt"]["model"]
    channel = FunctionChannel(
        stt,
        head,
        float(stt_cfg.get("duplex_function_channel_weight", 1.0)),
        len(ids),
        stt.text_pad_id,
        forced,
    )
    engine = stt.streaming_inference
    state = engine._init_inference(
        torch.zeros(1, frames * 1280, dtype=dtype),
        torch.tensor([frames * 1280]),
        0,
        torch.tensor([ids]),
        torch.tensor([len(ids)]),
    )
    ans, state = engine._step_zero(state)
    for t in range(1, state["T"]):
        ans = engine._step_inference(t, state, ans)
    channel.close()
    text = state["gen_text"][0, len(ids) :].clone()

    # The talker, one step per frame's text token; then a scripted text (turns with BOS and EOS).
    choices = TalkerChoices(tts.tts_model)
    codes = talk(tts, scenario["voice"], text.tolist())
    mog, rvq = choices.take()
    script_codes = talk(tts, scenario["voice"], scenario["talker_script"])
    script_mog, script_rvq = choices.take()
    choices.close()

    # The codec streams with its causal-conv cache, one frame per call (NVIDIA's serving path).
    from nemo.collections.speechlm2.modules.ear_tts_vae_codec import CausalConv1dCache

    codec_cache = CausalConv1dCache()
    pieces = []
    with torch.autocast("cpu", enabled=False), codec_precision(tts.audio_codec, dtype):
        for k in range(frames):
            wav, _ = tts.audio_codec.decode(codes[None, k : k + 1], torch.tensor([1]), cache=codec_cache)
            pieces.append(wav.reshape(-1))
    pcm = torch.cat(pieces)
    assert pcm.shape[-1] == frames * spf
    cases = [np.array(prompt_ids(model, renderers, c), dtype=np.int64) for c in scenario["prompt_cases"]]
    return {
        "prompt_ids": np.array(ids, dtype=np.int64),
        **{f"prompt_case_{i}": case for i, case in enumerate(cases)},
        "perception": features.double().numpy(),
        "text_logits": torch.stack(channel.text_logits).double().numpy(),
        "function_logits": torch.stack(channel.function_logits).double().numpy(),
        "text": text.numpy().astype(np.int64),
        "function": np.array(channel.function[len(ids) :], dtype=np.int64),
        "codes": codes.numpy().astype(np.int64),
        "mog_logits": mog,
        "rvq_scores": rvq,
        "script_codes": script_codes.numpy().astype(np.int64),
        "script_mog_logits": script_mog,
        "script_rvq_scores": script_rvq,
        "pcm": pcm.double().numpy(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--scenario", type=Path, required=True, help="JSON: instructions, tools, voice, ...")
    parser.add_argument("--audio", type=Path, required=True, help=".npy float32 16 kHz input")
    parser.add_argument("--vllm-omni-wheel", type=Path, required=True)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    renderers = load_renderers(args.vllm_omni_wheel)
    scenario = json.loads(args.scenario.read_text())
    audio = np.load(args.audio)
    with tempfile.TemporaryDirectory() as work:
        model, head, cfg = build_model(args.checkpoint, Path(work))
        model.to(dtype)
        model.tts_model.audio_codec.float()  # NeMo pins the codec to float32 (see decode_codec)
        if head is not None:
            head.to(dtype)
        out = run(model, head, cfg, scenario, audio, renderers, dtype)
    from importlib.metadata import version

    names = ("nemo-toolkit", "torch", "transformers")
    out["versions"] = np.array(json.dumps({name: version(name) for name in names}))
    np.savez(args.out, **out)
    print(f"wrote {args.out}: " + ", ".join(f"{k} {v.shape}" for k, v in out.items()), file=sys.stderr)


if __name__ == "__main__":
    main()
