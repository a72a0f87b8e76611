"""``nemotron_voicechat``: NVIDIA Nemotron VoiceChat as a batched ``frame`` plugin with tools.

Every 80 ms the model hears one frame of each session (16 kHz) and writes one
text token, one function token and one frame of speech (22,050 Hz): it decides
by itself when to talk (model-native turns). There is no reply to cut (no
barge-in, no truncation); sessions resume with their state kept in the plugin.

Slot lifecycle, as the engine sees it:

* ``open_slot(slot, options)`` resets the slot and runs its system prompt (the
  instructions, and the tools, at most five, in the model's tool format) and
  its voice's speaker prompt. **The slot is ready when ``open_slot`` returns**:
  its first ``step`` consumes the session's first frame.
* ``step(batch)``: one frame for every slot in the batch, in one batched call
  (``generation.BatchedVoiceChat``); slots not in it are frozen. Each input gets
  one output:

  - while the model speaks (from a text token other than PAD until EOS): the
    frame's audio (int16 at 22,050 Hz) and transcript delta, ``decision="speak"``
    on the first frame of a turn, ``end_of_turn`` on the frame of its EOS;
  - while it listens: nothing (an empty output);
  - a tool call the function channel closed: ``tool_call`` (a fresh
    ``call_id``; the calls of one span on consecutive frames); the response
    ends with the last of them unless the model is speaking;
  - ``SlotInput.tool_results`` are queued and fed to the function channel one
    token per frame (the model listens meanwhile), then the model continues.
* ``cancel_slot(slot, epoch)`` restarts the conversation (fresh state, same prompt).
  The engine calls it when a response is cancelled or reaches ``max_output_tokens``.
* ``close_slot(slot)`` frees the slot.

Every output reports the frame's tokens (``Capabilities.reports_usage``), in the model's
units, listening or not (the model runs every stage every frame): ``input_audio`` 1 (the
perception's one embedding of the frame), ``output_text`` the text token and, with a
function head, the function token the thinker chose (PAD included: it chooses one of each
every frame), ``output_audio`` the talker's codec codes (``num_quantizers``: 31). On a
frame fed a tool result's token, that token is ``input_text`` and no text or function
token is chosen (the text is held at PAD). The first frame after an open or a restart also
counts the system prompt's tokens (``[bos] + instructions and tools + [eos]``) as
``input_text``.

Options (``from_options``): ``max_sessions`` (4), ``device`` ("cpu" /
"cuda[:N]"), ``dtype`` (thinker and perception; bfloat16 on CUDA, float32 on a
CPU), ``talker_dtype`` (float32), ``seed`` (0; a session without its own seed
gets ``seed + n`` for its n-th open), ``cuda_graphs`` (True), ``warm_up``
(capture the graphs in ``load``; CUDA: on), ``context_frames`` (8192: the
thinker's attention positions per slot), ``talker_context_frames`` (2048),
``guidance`` (the checkpoint's ``inference_guidance_enabled`` when unset),
``llm_path`` (the backbone's config and tokenizer, when not in ``llm/``),
``default_voice``, ``max_tool_result_tokens`` (2048), ``random_weights`` (build
the architecture of the folder's configs with random weights, for benchmarks),
``encoder_stream_start`` (``"cache_aware"``: the encoder's second frame as NVIDIA's
streaming pipeline computes it; ``"causal"``: as a whole-utterance causal pass
does; see ``perception``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from duplex.plugins.base import (
    Capabilities,
    FramePlugin,
    PluginError,
    PluginKind,
    SlotInput,
    SlotOptions,
    SlotOutput,
    TokenUsage,
    ToolCall,
)
from duplex.plugins.nemotron.config import FRAME_SAMPLES, INPUT_RATE, VoiceChatConfig
from duplex.plugins.nemotron.generation import BatchedVoiceChat, StepResult
from duplex.plugins.nemotron.talker import VoicePrefill
from duplex.plugins.nemotron.tokens import Detokenizer, TextTokenizer
from duplex.plugins.nemotron.tools import ToolCallParser, system_prompt, tool_response_text
from duplex.plugins.options import parse_options, pick_default_voice, voice_not_found

__all__ = ["NemotronVoiceChatPlugin", "frame_usages"]

log = logging.getLogger(__name__)

_OPTION_TYPES: dict[str, type] = {
    "max_sessions": int,
    "device": str,
    "dtype": str,
    "talker_dtype": str,
    "seed": int,
    "cuda_graphs": bool,
    "warm_up": bool,
    "context_frames": int,
    "talker_context_frames": int,
    "guidance": bool,
    "llm_path": str,
    "default_voice": str,
    "max_tool_result_tokens": int,
    "random_weights": bool,
    "encoder_stream_start": str,
}
_STREAM_STARTS = ("cache_aware", "causal")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DEFAULT_VOICE = "default"


@dataclass
class _Slot:
    """Host-side state of one open slot (the model state is in the generator)."""

    options: SlotOptions
    prompt: list[int]
    voice: str
    seed: int
    detok: Detokenizer
    parser: ToolCallParser
    forced: deque[int] = field(default_factory=deque)
    calls: deque[ToolCall] = field(default_factory=deque)
    speaking: bool = False
    frames: int = 0


class NemotronVoiceChatPlugin(FramePlugin):
    """Nemotron VoiceChat served as a batched ``frame`` plugin (see the module docstring)."""

    name = "nemotron_voicechat"

    @classmethod
    def write_tiny_checkpoint(cls, directory: str, *, seed: int = 0) -> None:
        from duplex.plugins.nemotron.testing import make_tiny_checkpoint

        make_tiny_checkpoint(directory, seed=seed)

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        max_sessions: int = 4,
        device: str = "cpu",
        dtype: str | None = None,
        talker_dtype: str = "float32",
        seed: int = 0,
        cuda_graphs: bool = True,
        warm_up: bool | None = None,
        context_frames: int = 8192,
        talker_context_frames: int = 2048,
        guidance: bool | None = None,
        llm_path: str | None = None,
        default_voice: str | None = None,
        max_tool_result_tokens: int = 2048,
        random_weights: bool = False,
        encoder_stream_start: str = "cache_aware",
    ) -> None:
        if model_path is None:
            raise PluginError("invalid_plugin_config", "nemotron_voicechat needs a model path")
        if max_sessions < 1:
            raise PluginError("invalid_plugin_config", "max_sessions must be at least 1")
        for label, value in (("dtype", dtype), ("talker_dtype", talker_dtype)):
            if value is not None and value not in _DTYPES:
                raise PluginError(
                    "invalid_plugin_config", f"{label} must be one of {sorted(_DTYPES)}, got {value!r}"
                )
        if context_frames < 64 or talker_context_frames < 64:
            raise PluginError(
                "invalid_plugin_config", "context_frames and talker_context_frames must be >= 64"
            )
        if max_tool_result_tokens < 1:
            raise PluginError("invalid_plugin_config", "max_tool_result_tokens must be at least 1")
        if encoder_stream_start not in _STREAM_STARTS:
            raise PluginError(
                "invalid_plugin_config",
                f"encoder_stream_start must be one of {list(_STREAM_STARTS)}, got {encoder_stream_start!r}",
            )
        self._root = Path(model_path)
        self._max_sessions = max_sessions
        self._device = torch.device(device)
        cuda = self._device.type == "cuda"
        self._dtype = _DTYPES[dtype] if dtype else (torch.bfloat16 if cuda else torch.float32)
        self._talker_dtype = _DTYPES[talker_dtype]
        self._seed = seed
        self._cuda_graphs = cuda_graphs
        self._warm_up = cuda if warm_up is None else warm_up
        self._context = context_frames
        self._talker_context = talker_context_frames
        self._guidance = guidance
        self._llm_path = llm_path
        self._default_voice_opt = default_voice
        self._max_tool_tokens = max_tool_result_tokens
        self._random = random_weights
        self._causal_start = encoder_stream_start == "causal"
        self._cfg: VoiceChatConfig | None = None
        self._tok: TextTokenizer | None = None
        self._gen: BatchedVoiceChat | None = None
        self._voices: dict[str, VoicePrefill] = {}
        self._default_voice: str | None = None
        self._slots: dict[int, _Slot] = {}
        self.last_step: StepResult | None = None  # host copy of the latest step's tokens and audio
        # A frame's tokens (``load``), one shared instance each: a chosen frame, a forced one.
        self._frame_usage = TokenUsage()
        self._forced_usage = TokenUsage()
        self._opens = 0
        self._closed = False
        self.tool_results_truncated = 0
        self._exec_host = np.zeros(max_sessions, dtype=bool)
        self._pcm_host = np.zeros((max_sessions, FRAME_SAMPLES), dtype=np.float32)
        self._forced_host = np.full(max_sessions, -1, dtype=np.int64)

    @classmethod
    def from_options(cls, model_path: str | None = None, **options: object) -> NemotronVoiceChatPlugin:
        """Build from serve-time options; strings (``--plugin-option max_sessions=8``) are parsed.

        Raises ``PluginError("invalid_plugin_config")`` for an unknown option or a bad value.
        """
        return cls(model_path, **parse_options(cls.name, options, _OPTION_TYPES))  # type: ignore[arg-type]

    # -- lifetime ------------------------------------------------------------------------------

    @property
    def config(self) -> VoiceChatConfig:
        assert self._cfg is not None, "load() first"
        return self._cfg

    @property
    def tokenizer(self) -> TextTokenizer:
        assert self._tok is not None, "load() first"
        return self._tok

    @property
    def generator(self) -> BatchedVoiceChat:
        """The batched generator (for benchmarks and tests that look at the model's state)."""
        if self._gen is None:
            raise PluginError(
                "plugin_not_loaded", "nemotron_voicechat: load() has not been called or close() was"
            )
        return self._gen

    def load(self) -> None:
        if self._closed:
            raise PluginError("plugin_closed", "nemotron_voicechat: the plugin was closed")
        if self._gen is not None:
            return
        from duplex.plugins.nemotron import loading

        files = loading.find_checkpoint(self._root, self._llm_path, require_weights=not self._random)
        cfg = files.config
        tok = loading.load_tokenizer(files.llm_dir, cfg)
        with torch.no_grad():
            if self._random:
                from duplex.plugins.nemotron.testing import random_model

                model = random_model(
                    cfg.raw,
                    cfg.llm,
                    tok,
                    [cfg.default_speaker],
                    seed=self._seed,
                    device=self._device,
                    dtype=self._dtype,
                    talker_dtype=self._talker_dtype,
                )
            else:
                state = loading.read_state(files.weights)
                model = loading.build_model(
                    cfg, tok, loading.voices_of(state), self._device, self._dtype, self._talker_dtype
                )
                loading.load_weights(model, state, str(self._root))
                del state
            model.perception.causal_start = self._causal_start
            model.thinker.set_text_boosts(tok.special.pad, tok.special.bos, tok.special.eos)
            model.perception.prepare()
            model.talker.prepare(cfg.vocab_size)
            guidance = cfg.talker.guidance if self._guidance is None else self._guidance
            names = list(model.talker.audio_prompt_latents.keys()) or [None]
            special = tok.special
            talker = model.talker.tokens  # the talker's own EOS and pad mark its speaker prompt
            self._voices = {
                (name or _DEFAULT_VOICE): model.talker.prefill_voice(name, talker.eos, talker.pad, guidance)
                for name in names
            }
        self._cfg, self._tok = cfg, tok
        self._default_voice = pick_default_voice(self._default_voice_opt, self._voices, cfg.default_speaker)
        gen = BatchedVoiceChat(
            model,
            special,
            self._max_sessions,
            context=self._context,
            talker_context=self._talker_context,
            guidance=guidance,
            cuda_graphs=self._cuda_graphs,
        )
        if self._warm_up:
            gen.warm_up()
        self._gen = gen
        self._frame_usage, self._forced_usage = frame_usages(gen.Q, model.thinker.function_head is not None)
        log.info(
            "nemotron_voicechat loaded from %s on %s: %d slots, voices %s, guidance %s",
            self._root,
            self._device,
            self._max_sessions,
            sorted(self._voices),
            guidance,
        )

    def close(self) -> None:
        self._gen = None
        self._slots.clear()
        self._voices.clear()
        self._closed = True

    def capabilities(self) -> Capabilities:
        return Capabilities(
            kind=PluginKind.FRAME,
            chunk_period_ms=80,
            input_sample_rate=INPUT_RATE,
            output_sample_rate=self._cfg.codec.sample_rate if self._cfg else 22050,
            max_sessions=self._max_sessions,
            model_native_turns=True,
            supports_server_vad=False,
            supports_client_commit=False,
            supports_barge_in=False,
            supports_truncate=False,
            supports_resume=True,
            supports_tools=True,
            output_modalities=("audio", "text"),
            voices=tuple(sorted(self._voices)),
            default_voice=self._default_voice,
            updatable_options=(),  # instructions, tools and voice are in the prompt the slot opens with
            reports_usage=True,  # per frame: its audio embedding in, text (and function) tokens and codes out
        )

    # -- slots ---------------------------------------------------------------------------------

    def prompt_for(self, options: SlotOptions) -> list[int]:
        """The system prompt's token ids (``[bos] + prompt + [eos]``); raises ``PluginError``."""
        try:
            text = system_prompt(options.instructions, options.tools)
        except ValueError as exc:
            raise PluginError("invalid_session_config", str(exc)) from exc
        special = self.tokenizer.special
        ids = [special.bos, *self.tokenizer.encode(text), special.eos]
        if len(ids) >= self._context:
            raise PluginError(
                "invalid_session_config",
                f"the instructions and tools take {len(ids)} tokens; the model's context is {self._context}",
            )
        return ids

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        self._check_slot_index(slot, self._max_sessions)
        gen = self.generator
        voice = options.voice or self._default_voice
        if voice not in self._voices:
            raise voice_not_found(voice, self._voices)
        prompt = self.prompt_for(options)
        seed = options.seed if options.seed is not None else self._seed + self._opens
        self._opens += 1
        special = self.tokenizer.special
        state = _Slot(
            options=options,
            prompt=prompt,
            voice=voice,
            seed=int(seed),
            detok=Detokenizer(self.tokenizer),
            parser=ToolCallParser(sotc=special.sotc, eotc=special.eotc, pad=special.pad),
        )
        gen.start_slot(slot, prompt, self._voices[voice], state.seed)
        self._slots[slot] = state

    def cancel_slot(self, slot: int, epoch: int) -> None:
        self._check_slot_index(slot, self._max_sessions)
        state = self._slots.get(slot)
        if state is None:
            raise PluginError("invalid_slot", f"slot {slot} is not open")
        self.generator.start_slot(slot, state.prompt, self._voices[state.voice], state.seed)
        state.detok.reset()
        state.parser.reset()
        state.forced.clear()
        state.calls.clear()
        state.speaking = False
        state.frames = 0

    def close_slot(self, slot: int) -> None:
        self._check_slot_index(slot, self._max_sessions)
        self._slots.pop(slot, None)

    # -- the tick ------------------------------------------------------------------------------

    def _queue_results(self, state: _Slot, item: SlotInput) -> None:
        for result in item.tool_results:
            tokens = self.tokenizer.encode(tool_response_text(result.output))
            room = self._max_tool_tokens - len(state.forced)
            if len(tokens) > room:
                self.tool_results_truncated += 1
                log.warning(
                    "nemotron_voicechat: slot %d: tool result %s is %d tokens, %d fit; cut",
                    item.slot,
                    result.call_id,
                    len(tokens),
                    max(room, 0),
                )
                tokens = tokens[: max(room, 0)]
            state.forced.extend(tokens)

    def step(self, batch: Sequence[SlotInput]) -> Sequence[SlotOutput]:
        gen = self.generator
        exec_host, pcm_host, forced_host = self._exec_host, self._pcm_host, self._forced_host
        exec_host[:] = False
        forced_host[:] = -1
        self._check_inputs(batch, self._slots, FRAME_SAMPLES)
        for item in batch:
            exec_host[item.slot] = True
            pcm_host[item.slot] = item.pcm
        for item in batch:
            state = self._slots[item.slot]
            self._queue_results(state, item)
            if state.forced:
                forced_host[item.slot] = state.forced.popleft()
        result = gen.step(exec_host, pcm_host, forced_host)
        self.last_step = result
        audio = np.clip(result.pcm * 32767.0, -32768, 32767).astype(np.int16)
        special = self.tokenizer.special
        rate = self.config.codec.sample_rate
        outputs = []
        for item in batch:
            slot, state = item.slot, self._slots[item.slot]
            state.frames += 1
            token, func = int(result.text[slot]), int(result.function[slot])
            if forced_host[slot] < 0:
                state.calls.extend(state.parser.push(func, self.tokenizer.decode))
                usage = self._frame_usage
            else:
                usage = self._forced_usage
            if state.frames == 1:  # the first frame after a (re)start: the system prompt it ran too
                usage = usage.with_prompt(len(state.prompt))
            out = SlotOutput(slot=slot, epoch=item.epoch, sample_rate=rate, usage=usage)
            started = ended = False
            if token == special.eos:
                ended = state.speaking
                state.speaking = False
                state.detok.reset()
            elif token == special.bos:
                started = not state.speaking
                state.speaking = True
                state.detok.reset()
            elif token != special.pad:
                started = not state.speaking
                state.speaking = True
                out.text = state.detok.push(token) if token < self.tokenizer.size else ""
            if state.speaking or ended:
                out.pcm = audio[slot].copy()
                if started:
                    out.decision = "speak"
            if state.calls:
                out.tool_call = state.calls.popleft()
            # The calls of one span share a response; it ends with the last unless the model speaks.
            out.end_of_turn = ended or (out.tool_call is not None and not state.calls and not state.speaking)
            outputs.append(out)
        return outputs


def frame_usages(codebooks: int, function_head: bool) -> tuple[TokenUsage, TokenUsage]:
    """The tokens of one frame: one where the thinker chose its tokens (the audio embedding read; the
    text token, the function token with a ``function_head``, and ``codebooks`` codes made), and one
    where a tool result's token was forced (that token read, the text held at PAD, the codes made)."""
    chosen = TokenUsage(input_audio=1, output_text=1 + int(function_head), output_audio=codebooks)
    forced = TokenUsage(input_text=1, input_audio=1, output_audio=codebooks)
    return chosen, forced
