"""``personaplex``: NVIDIA PersonaPlex (a Moshi finetune) as a ``frame`` plugin.

Every 80 ms the model hears one Mimi frame of each session and speaks one, so a
session's audio flows both ways all the time and the model itself decides when
to talk (model-native turn-taking; no commit, no VAD, no barge-in: there is no
reply to cut, the model just keeps listening while it talks).

Slot lifecycle, as the engine sees it:

* ``open_slot(slot, options)`` resets the slot and runs its system prompt (voice,
  silence, persona, silence) in one prefill through a separate batch-1 state.
  **The slot is ready when ``open_slot`` returns**: the very next ``step`` that
  includes it consumes the session's first frame of audio and returns its first
  frame of speech. No frame is spent on the prompt, so no input is dropped, and
  the other slots are not touched (their state and outputs are unchanged).
  Cost: one forward pass over the prompt (a few ms on a GPU), on the model thread.
* ``step(batch)``: one frame for every slot in the batch, in one batched call;
  slots not in the batch are frozen. Each input gets exactly one output with
  1920 samples of 24 kHz audio and the transcript delta of that frame.
* ``cancel_slot(slot, epoch)`` restarts the conversation: fresh state and the
  same prompt replayed (the model has no notion of a reply to cancel).
* ``close_slot(slot)`` frees the slot.

Per-session state lives in the plugin for the session's whole life, so a
session that detaches and resumes continues where it was (``supports_resume``).

Plugin options (``from_options``): ``max_sessions`` (4), ``device`` ("cpu" or
"cuda[:N]"), ``dtype`` ("float32"/"bfloat16"; default bfloat16 on CUDA, float32
on CPU), ``seed`` (0; a session without its own seed gets ``seed + n`` for the
n-th open), ``cuda_graphs`` (True), ``random_weights`` (False: build the
architecture with random weights, for benchmarks; ``model_path`` then only
supplies the tokenizer, voices and config, and may be omitted), ``config``
("full" or "tiny", for random weights without a ``config.json``),
``default_voice``, ``torch_compile`` (moshi's lazily compiled layers; default:
on for CUDA, off on a CPU), ``warm_up`` (compile and capture the CUDA graphs
in ``load()`` so that no session waits for it; default: on for CUDA).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
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
)
from duplex.plugins.personaplex.config import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    PersonaPlexConfig,
    full_config,
    tiny_config,
)
from duplex.plugins.personaplex.generation import BatchedGenerator, StepResult
from duplex.plugins.personaplex.loading import build_lm, build_mimi, find_checkpoint, load_voices
from duplex.plugins.personaplex.prompt import PromptScript, VoicePrompt, build_prompt, persona_text

__all__ = ["PersonaPlexPlugin"]

log = logging.getLogger(__name__)

_PREFERRED_DEFAULT_VOICE = "NATF2"
_OPTION_TYPES: dict[str, tuple[type]] = {
    "max_sessions": (int,),
    "device": (str,),
    "dtype": (str,),
    "seed": (int,),
    "cuda_graphs": (bool,),
    "random_weights": (bool,),
    "config": (str,),
    "default_voice": (str,),
    "torch_compile": (bool,),
    "warm_up": (bool,),
}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class _Slot:
    """Host-side bookkeeping of one open slot (the model state is in the generator)."""

    options: SlotOptions
    script: PromptScript
    seed: int
    temp_text: float
    temp_audio: float
    frames: int = 0  # conversation frames stepped since the last (re)start


class PersonaPlexPlugin(FramePlugin):
    """PersonaPlex served as a batched ``frame`` plugin (see the module docstring)."""

    name = "personaplex"

    @classmethod
    def write_tiny_checkpoint(cls, directory: str, *, seed: int = 0) -> None:
        from duplex.plugins.personaplex.testing import make_tiny_checkpoint

        make_tiny_checkpoint(directory, seed=seed)

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        max_sessions: int = 4,
        device: str = "cpu",
        dtype: str | None = None,
        seed: int = 0,
        cuda_graphs: bool = True,
        random_weights: bool = False,
        config: str | None = None,
        default_voice: str | None = None,
        torch_compile: bool | None = None,
        warm_up: bool | None = None,
    ) -> None:
        if max_sessions < 1:
            raise PluginError("invalid_plugin_config", "max_sessions must be at least 1")
        if model_path is None and not random_weights:
            raise PluginError(
                "invalid_plugin_config", "personaplex needs a model path (or random_weights=True)"
            )
        if config not in (None, "full", "tiny"):
            raise PluginError("invalid_plugin_config", f"config must be 'full' or 'tiny', got {config!r}")
        if dtype is not None and dtype not in _DTYPES:
            raise PluginError(
                "invalid_plugin_config", f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}"
            )
        self._model_path = Path(model_path) if model_path is not None else None
        self._max_sessions = max_sessions
        self._device = torch.device(device)
        self._dtype = (
            _DTYPES[dtype] if dtype else (torch.bfloat16 if self._device.type == "cuda" else torch.float32)
        )
        self._seed = seed
        self._cuda_graphs = cuda_graphs
        self._random = random_weights
        self._config_name = config
        self._default_voice_opt = default_voice
        self._torch_compile = torch_compile
        self._warm_up = self._device.type == "cuda" if warm_up is None else warm_up
        self._cfg: PersonaPlexConfig | None = None
        self._gen: BatchedGenerator | None = None
        self._tokenizer = None
        self._pieces: list[str] = []
        self._voices: dict[str, VoicePrompt] = {}
        self._default_voice: str | None = None
        self._slots: dict[int, _Slot] = {}
        self.last_step: StepResult | None = None  # host copy of the latest step's tokens and audio
        self._opens = 0
        self._closed = False
        self._exec_host = np.zeros(max_sessions, dtype=bool)
        self._pcm_host = np.zeros((max_sessions, FRAME_SAMPLES), dtype=np.float32)

    @classmethod
    def from_options(cls, model_path: str | None = None, **options: object) -> PersonaPlexPlugin:
        """Build from serve-time options; strings (``--plugin-option max_sessions=64``) are parsed.

        Raises ``PluginError("invalid_plugin_config")`` for an unknown option or a bad value.
        """
        unknown = sorted(set(options) - set(_OPTION_TYPES))
        if unknown:
            raise PluginError("invalid_plugin_config", f"personaplex: unknown options {unknown}")
        parsed = {key: _parse_option(key, value) for key, value in options.items()}
        return cls(model_path, **parsed)  # type: ignore[arg-type]

    # -- lifetime ---------------------------------------------------------

    @property
    def config(self) -> PersonaPlexConfig:
        assert self._cfg is not None, "load() first"
        return self._cfg

    @property
    def generator(self) -> BatchedGenerator:
        """The batched generator (for benchmarks and tests that look at tokens)."""
        if self._gen is None:
            raise PluginError("plugin_not_loaded", "personaplex: load() has not been called or close() was")
        return self._gen

    def load(self) -> None:
        if self._closed:
            raise PluginError("plugin_closed", "personaplex: the plugin was closed")
        if self._gen is not None:
            return
        files = None
        if self._model_path is not None and not self._random:
            files = find_checkpoint(self._model_path)
            cfg = files.config
        elif self._config_name == "tiny":
            cfg = tiny_config()
        elif (
            self._model_path is not None
            and (self._model_path / "config.json").is_file()
            and not self._config_name
        ):
            cfg = find_checkpoint_config(self._model_path)
        else:
            cfg = full_config()
        dev = self._device
        lm = build_lm(cfg, files.lm if files else None, dev, self._dtype)
        mimi_path = files.mimi if files else None
        enc_mimi = build_mimi(cfg, mimi_path, dev)
        dec_mimi = build_mimi(cfg, mimi_path, dev)
        if not files:
            dec_mimi.load_state_dict(enc_mimi.state_dict())
        tok_path = files.tokenizer if files else _find_tokenizer(self._model_path)
        if tok_path is not None:
            import sentencepiece

            self._tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(tok_path))
            self._pieces = _piece_table(self._tokenizer, cfg)
        if self._model_path is not None:
            self._voices = load_voices(self._model_path, cfg, enc_mimi)
        self._default_voice = self._pick_default_voice()
        self._cfg = cfg
        gen = BatchedGenerator(
            lm,
            enc_mimi,
            dec_mimi,
            cfg,
            self._max_sessions,
            cuda_graphs=self._cuda_graphs,
            torch_compile=self._torch_compile,
        )
        gen.__enter__()
        self._gen = gen
        if self._warm_up:
            gen.warm_up(
                [self.prompt_for(SlotOptions()), self.prompt_for(SlotOptions(instructions="warm up"))]
            )
        log.info(
            "personaplex loaded: %s on %s, %d slots, %d voices",
            cfg.name,
            dev,
            self._max_sessions,
            len(self._voices),
        )

    def _pick_default_voice(self) -> str | None:
        if self._default_voice_opt is not None:
            if self._default_voice_opt not in self._voices:
                raise PluginError(
                    "voice_not_found", f"default voice {self._default_voice_opt!r} is not installed"
                )
            return self._default_voice_opt
        if _PREFERRED_DEFAULT_VOICE in self._voices:
            return _PREFERRED_DEFAULT_VOICE
        return min(self._voices) if self._voices else None

    def close(self) -> None:
        if self._gen is not None:
            self._gen.__exit__(None, None, None)
        self._gen = None
        self._slots.clear()
        self._closed = True

    def capabilities(self) -> Capabilities:
        return Capabilities(
            kind=PluginKind.FRAME,
            chunk_period_ms=80,
            input_sample_rate=SAMPLE_RATE,
            output_sample_rate=SAMPLE_RATE,
            max_sessions=self._max_sessions,
            model_native_turns=True,
            supports_server_vad=False,
            supports_client_commit=False,
            supports_barge_in=False,
            supports_resume=True,
            output_modalities=("audio", "text"),
            voices=tuple(sorted(self._voices)),
            default_voice=self._default_voice,
            updatable_options=(),  # the voice and persona prompts run when the slot opens
            persona_instructions=True,  # ``instructions`` are the persona prompt
        )

    # -- slots ------------------------------------------------------------

    def prompt_for(self, options: SlotOptions) -> PromptScript:
        """The system-prompt script a slot opened with ``options`` runs (raises ``PluginError``)."""
        cfg = self.config
        name = options.voice or self._default_voice
        voice = None
        if name is not None:
            voice = self._voices.get(name)
            if voice is None:
                installed = ", ".join(sorted(self._voices)) or "none"
                raise PluginError(
                    "voice_not_found", f"voice {name!r} is not installed (installed: {installed})"
                )
        tokens = (
            self._tokenizer.encode(persona_text(options.instructions)) if self._tokenizer is not None else []
        )
        script = build_prompt(cfg, voice, list(tokens))
        if script.tokens.shape[0] >= cfg.context:
            raise PluginError(
                "invalid_session_config",
                f"the voice and instructions take {script.tokens.shape[0]} frames; the model's context is "
                f"{cfg.context}",
            )
        return script

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        self._check_slot_index(slot, self._max_sessions)
        gen = self.generator
        script = self.prompt_for(options)
        cfg = self.config
        temp_text, temp_audio = cfg.temperature_text, cfg.temperature_audio
        if options.temperature is not None:
            if options.temperature < 0:
                raise PluginError("invalid_session_config", "temperature must be >= 0")
            temp_text = temp_audio = float(options.temperature)
        seed = options.seed if options.seed is not None else self._seed + self._opens
        self._opens += 1
        state = _Slot(
            options=options, script=script, seed=int(seed), temp_text=temp_text, temp_audio=temp_audio
        )
        gen.start_slot(slot, script, seed=state.seed, temp_text=temp_text, temp_audio=temp_audio)
        self._slots[slot] = state

    def cancel_slot(self, slot: int, epoch: int) -> None:
        self._check_slot_index(slot, self._max_sessions)
        state = self._slots.get(slot)
        if state is None:
            raise PluginError("invalid_slot", f"slot {slot} is not open")
        self.generator.start_slot(
            slot, state.script, seed=state.seed, temp_text=state.temp_text, temp_audio=state.temp_audio
        )
        state.frames = 0

    def close_slot(self, slot: int) -> None:
        self._check_slot_index(slot, self._max_sessions)
        self._slots.pop(slot, None)

    # -- the tick ---------------------------------------------------------

    def step(self, batch: Sequence[SlotInput]) -> Sequence[SlotOutput]:
        gen = self.generator
        exec_host, pcm_host = self._exec_host, self._pcm_host
        exec_host[:] = False
        for item in batch:
            slot = item.slot
            if slot not in self._slots:
                raise PluginError("invalid_slot", f"slot {slot} is not open")
            if exec_host[slot]:
                raise PluginError("invalid_batch", f"slot {slot} appears twice in one batch")
            pcm = item.pcm
            if pcm.shape != (FRAME_SAMPLES,):
                raise PluginError(
                    "bad_audio", f"slot {slot}: expected {FRAME_SAMPLES} samples, got {pcm.shape}"
                )
            exec_host[slot] = True
            pcm_host[slot] = pcm
        result = gen.step(exec_host, pcm_host)
        self.last_step = result
        outputs = []
        for item in batch:
            slot = item.slot
            self._slots[slot].frames += 1
            outputs.append(
                SlotOutput(
                    slot=slot,
                    epoch=item.epoch,
                    pcm=result.pcm[slot].copy(),
                    sample_rate=SAMPLE_RATE,
                    text=self._piece(int(result.text[slot])),
                )
            )
        return outputs

    def _piece(self, token: int) -> str:
        if 0 <= token < len(self._pieces):
            return self._pieces[token]
        return ""


def _parse_option(key: str, value: object) -> object:
    (kind,) = _OPTION_TYPES[key]
    if isinstance(value, str) and kind is not str:
        text = value.strip().lower()
        if kind is bool and text in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return text in ("1", "true", "yes", "on")
        if kind is int and text.lstrip("-").isdigit():
            return int(text)
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    raise PluginError(
        "invalid_plugin_config", f"personaplex: option {key!r} expects {kind.__name__}, got {value!r}"
    )


def _piece_table(sp: object, cfg: PersonaPlexConfig) -> list[str]:
    """Transcript text of each token id: PAD, EPAD, control and unknown pieces are empty."""
    table = []
    for i in range(sp.get_piece_size()):  # type: ignore[attr-defined]
        if i in (cfg.text_pad, cfg.text_epad) or sp.is_control(i) or sp.is_unknown(i):  # type: ignore[attr-defined]
            table.append("")
        else:
            table.append(sp.id_to_piece(i).replace("\u2581", " "))  # type: ignore[attr-defined]
    return table


def _find_tokenizer(root: Path | None) -> Path | None:
    if root is None:
        return None
    found = sorted(root.glob("*.model"))
    return found[0] if found else None


def find_checkpoint_config(root: Path) -> PersonaPlexConfig:
    """The architecture of ``root/config.json`` (for random weights shaped like a checkpoint)."""
    import json

    from duplex.plugins.personaplex.config import config_from_json

    try:
        return config_from_json(json.loads((root / "config.json").read_text()))
    except (ValueError, json.JSONDecodeError) as exc:
        raise PluginError("invalid_plugin_config", f"{root / 'config.json'}: {exc}") from exc
