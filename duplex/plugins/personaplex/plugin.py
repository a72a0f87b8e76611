"""``personaplex``: NVIDIA PersonaPlex (a Moshi finetune) as a ``frame`` plugin.

Every 80 ms the model hears one Mimi frame of each session and speaks one, so a
session's audio flows both ways all the time and the model itself decides when
to talk (model-native turn-taking; no commit, no VAD, no barge-in: there is no
reply to cut, the model just keeps listening while it talks).

Slot lifecycle, as the engine sees it:

* ``open_slot(slot, options)`` resets the slot and queues its system prompt (voice,
  silence, persona, silence) for a prefill through a separate batch-1 state. With
  no other session being stepped it runs at once and **the slot is ready when
  ``open_slot`` returns**: the next ``step`` that includes it consumes the
  session's first frame of audio and returns its first frame of speech. While
  others are stepped it runs in chunks, one after each tick, so the open never
  holds their tick for a whole prompt; the slot's frames before it is ready are
  not heard and get empty outputs. The other slots are never touched.
* ``step(batch)``: one frame for every slot in the batch, in one batched call;
  slots not in the batch are frozen. Each input gets exactly one output with
  1920 samples of 24 kHz audio and the transcript delta of that frame.
* ``cancel_slot(slot, epoch)`` restarts the conversation: fresh state and the
  same prompt replayed (the model has no notion of a reply to cancel). The engine
  calls it when a response is cancelled or reaches ``max_output_tokens``.
* ``close_slot(slot)`` frees the slot.

Every heard frame's output reports its tokens (``Capabilities.reports_usage``), in the
model's units, from its configuration: ``input_audio`` the user's codebooks the model
read (``n_q - num_audio_codebooks``: 8), ``output_text`` the one text token it sampled
(PAD and EPAD included: moshi samples one text token every frame, and OpenAI counts
every generated token) and ``output_audio`` the agent codebooks it sampled
(``num_audio_codebooks``: 8, the depformer's first codebooks; the user codebooks it
could also predict are not computed). The model's own text and agent tokens, read back
at the next frame, are its output, not counted again as input. The first heard frame
after an open or a restart also counts the persona prompt's text tokens as
``input_text`` (the instructions); the voice prompt and the silences around the persona
are fixed conditioning, not counted. An unready frame (not heard) reports nothing.

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
in ``load()`` so that no session waits for it; default: on for CUDA),
``kv_cache`` ("model": the attention cache in the model's dtype; "fp8": e4m3 with
a scale per position and head, half the memory per session), ``attention``
("auto": the Triton decode kernel on CUDA, SDPA elsewhere; "sdpa"; "triton"),
``fp8_weights`` (False: the temporal transformer's projections in e4m3),
``prefill_chunk_frames`` (32: prompt positions per prefill chunk while other
sessions are being stepped), ``batch_buckets`` ("off": every step runs all
``max_sessions`` rows; "auto": 1, 4, 16, 64... rows, the smallest that holds every
stepped slot, one CUDA graph each; or row counts "1,8,32"). With buckets a session's
sums may run in another order with the number of rows (convolutions and matrix
products of other sizes): its audio may differ in the last float bits, and a choice
between two nearly tied tokens may go the other way, so "off" is the default: then a
session's output never depends on the others'.

A slot opened while other sessions are being stepped is prefilled one chunk after
each tick; until its prompt is done its frames are not heard and its outputs are
empty (``SlotOutput`` with no audio). Opens with nothing being stepped run the whole
prompt at once.
"""

from __future__ import annotations

import dataclasses
import logging
import time
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
    TokenUsage,
)
from duplex.plugins.options import parse_options, pick_default_voice, voice_not_found
from duplex.plugins.personaplex.attention import DecodeKernel
from duplex.plugins.personaplex.config import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    PersonaPlexConfig,
    full_config,
    tiny_config,
)
from duplex.plugins.personaplex.fp8_linear import use_fp8_weights
from duplex.plugins.personaplex.generation import BatchedGenerator, StepResult
from duplex.plugins.personaplex.loading import build_lm, build_mimi, find_checkpoint, load_voices
from duplex.plugins.personaplex.prompt import PromptScript, VoicePrompt, build_prompt, persona_text

__all__ = ["VOICED_RMS", "PersonaPlexPlugin", "SlotTimeline", "heard_frame_usage"]

log = logging.getLogger(__name__)

_PREFERRED_DEFAULT_VOICE = "NATF2"
_OPTION_TYPES: dict[str, type] = {
    "max_sessions": int,
    "device": str,
    "dtype": str,
    "seed": int,
    "cuda_graphs": bool,
    "random_weights": bool,
    "config": str,
    "default_voice": str,
    "torch_compile": bool,
    "warm_up": bool,
    "kv_cache": str,
    "attention": str,
    "prefill_chunk_frames": int,
    "fp8_weights": bool,
    "batch_buckets": str,
}
_KV_CACHES = ("model", "fp8")
# The decode kernel's largest difference from SDPA on a random check (bf16 rounding is ~1e-2).
_KERNEL_TOLERANCE = 5e-2
_ATTENTIONS = ("auto", "sdpa", "triton")
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
    unready_frames: int = 0  # frames that came while the prompt was still being prefilled (not heard)
    timeline: SlotTimeline | None = None


@dataclass
class SlotTimeline:
    """Where a session's first audio comes from, on the ``time.monotonic()`` clock (seconds).

    ``open_started``/``open_ended``: ``open_slot`` (with the whole prompt when it ran at once);
    ``prefilled_in_open``: whether it did; ``first_frame_at``: the first step that held one of the
    slot's frames (heard or not); ``first_step_at``/``first_step_ended``: the first step that heard
    one (the model's first output for the slot); ``unready_frames``: frames before that, not heard;
    ``first_voiced_frame``: the conversation frame whose output is the first above -60 dBFS
    (``None``: none yet). The clock is the system's monotonic one, which other processes on the
    machine (a benchmark's clients) read too.
    """

    open_started: float
    open_ended: float = 0.0
    prefilled_in_open: bool = False
    first_frame_at: float | None = None
    first_step_at: float | None = None
    first_step_ended: float | None = None
    unready_frames: int = 0
    first_voiced_frame: int | None = None

    def as_dict(self) -> dict[str, float | int | bool | None]:
        return dataclasses.asdict(self)


#: RMS above which an output frame counts as voiced (-60 dBFS).
VOICED_RMS = 1e-3


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
        kv_cache: str = "model",
        attention: str = "auto",
        prefill_chunk_frames: int = 32,
        fp8_weights: bool = False,
        batch_buckets: str = "off",
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
        if kv_cache not in _KV_CACHES:
            raise PluginError(
                "invalid_plugin_config", f"kv_cache must be one of {_KV_CACHES}, got {kv_cache!r}"
            )
        if attention not in _ATTENTIONS:
            raise PluginError(
                "invalid_plugin_config", f"attention must be one of {_ATTENTIONS}, got {attention!r}"
            )
        if prefill_chunk_frames < 1:
            raise PluginError("invalid_plugin_config", "prefill_chunk_frames must be at least 1")
        self._prefill_chunk = prefill_chunk_frames
        self._fp8_weights = fp8_weights
        self._buckets = _parse_buckets(batch_buckets, max_sessions)
        self._kv_fp8 = kv_cache == "fp8"
        self._attention = attention
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
        self._frame_usage = TokenUsage()  # one heard frame's tokens (``load``), shared by every output
        self._opens = 0
        self._stepped = False  # a step ran since the latest open (``_ticking``)
        self._closed = False
        self._exec_host = np.zeros(max_sessions, dtype=bool)
        self._pcm_host = np.zeros((max_sessions, FRAME_SAMPLES), dtype=np.float32)

    @classmethod
    def from_options(cls, model_path: str | None = None, **options: object) -> PersonaPlexPlugin:
        """Build from serve-time options; strings (``--plugin-option max_sessions=64``) are parsed.

        Raises ``PluginError("invalid_plugin_config")`` for an unknown option or a bad value.
        """
        return cls(model_path, **parse_options(cls.name, options, _OPTION_TYPES))  # type: ignore[arg-type]

    # -- lifetime ---------------------------------------------------------

    @property
    def config(self) -> PersonaPlexConfig:
        assert self._cfg is not None, "load() first"
        return self._cfg

    @property
    def kv_cache(self) -> str:
        """The attention cache's form: ``"model"`` (the model's dtype) or ``"fp8"``."""
        return "fp8" if self._kv_fp8 else "model"

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
        if self._fp8_weights:
            use_fp8_weights(lm)
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
        self._default_voice = pick_default_voice(
            self._default_voice_opt, self._voices, _PREFERRED_DEFAULT_VOICE
        )
        self._cfg = cfg
        gen = BatchedGenerator(
            lm,
            enc_mimi,
            dec_mimi,
            cfg,
            self._max_sessions,
            cuda_graphs=self._cuda_graphs,
            torch_compile=self._torch_compile,
            kv_fp8=self._kv_fp8,
            decode_kernel=self._decode_kernel(),
            prefill_chunk_frames=self._prefill_chunk,
            batch_buckets=self._buckets,
        )
        gen.__enter__()
        self._gen = gen
        self._frame_usage = heard_frame_usage(gen.A, gen.K - 1 - gen.A)
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

    def _decode_kernel(self) -> DecodeKernel | None:
        """The one-position attention path: the Triton kernel on CUDA (``auto``/``triton``), else SDPA."""
        if self._attention == "sdpa" or (self._attention == "auto" and self._device.type != "cuda"):
            return None
        try:
            from duplex.plugins.personaplex.triton_attention import check_decode_attention, decode_attention

            # Compile and check it once now: a kernel that fails or disagrees never reaches a session.
            error = check_decode_attention(self._device, self._dtype, self._kv_fp8)
            if not error < _KERNEL_TOLERANCE:
                raise RuntimeError(f"the decode kernel differs from SDPA by {error:.3g}")
        except Exception as exc:  # ImportError, a Triton compile error, or the check above
            if self._attention == "triton":
                raise PluginError("invalid_plugin_config", f"attention='triton' unavailable: {exc}") from exc
            log.warning("personaplex: no Triton decode kernel (%s); attention runs on SDPA", exc)
            return None
        return decode_attention

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
            reports_usage=True,  # per heard frame: the user's codebooks in, a text token and codes out
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
                raise voice_not_found(name, self._voices)
        tokens = (
            self._tokenizer.encode(persona_text(options.instructions)) if self._tokenizer is not None else []
        )
        script = build_prompt(cfg, voice, list(tokens))
        try:
            self.generator.check_prompt(script.tokens.shape[0])
        except ValueError:
            raise PluginError(
                "invalid_session_config",
                f"the voice and instructions take {script.tokens.shape[0]} frames; the model's context is "
                f"{cfg.context}",
            ) from None
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
        timeline = SlotTimeline(open_started=time.monotonic())
        ready = gen.start_slot(
            slot, script, seed=state.seed, temp_text=temp_text, temp_audio=temp_audio, defer=self._ticking()
        )
        timeline.open_ended = time.monotonic()
        timeline.prefilled_in_open = ready
        state.timeline = timeline
        self._slots[slot] = state

    def cancel_slot(self, slot: int, epoch: int) -> None:
        self._check_slot_index(slot, self._max_sessions)
        state = self._slots.get(slot)
        if state is None:
            raise PluginError("invalid_slot", f"slot {slot} is not open")
        self.generator.start_slot(
            slot,
            state.script,
            seed=state.seed,
            temp_text=state.temp_text,
            temp_audio=state.temp_audio,
            defer=self._ticking(),
        )
        state.frames = 0
        state.unready_frames = 0

    def close_slot(self, slot: int) -> None:
        self._check_slot_index(slot, self._max_sessions)
        self._slots.pop(slot, None)
        if self._gen is not None:
            self._gen.stop_slot(slot)

    # -- the tick ---------------------------------------------------------

    def _ticking(self) -> bool:
        """Whether sessions are being stepped: a step ran since the previous open. Then a prompt is
        prefilled in chunks between their ticks instead of at once (opens back to back, before
        anyone streams, each run at once). Reading it starts a new period."""
        stepped, self._stepped = self._stepped, False
        return stepped

    def step(self, batch: Sequence[SlotInput]) -> Sequence[SlotOutput]:
        self._stepped = True
        gen = self.generator
        exec_host, pcm_host = self._exec_host, self._pcm_host
        exec_host[:] = False
        self._check_inputs(batch, self._slots, FRAME_SAMPLES)
        for item in batch:
            exec_host[item.slot] = True
            pcm_host[item.slot] = item.pcm
        # A slot whose prompt is still being prefilled (it opened while others were talking) is
        # frozen: its frame is not heard and its output is empty, until its prefill is done.
        exec_host &= gen.ready
        started = time.monotonic()
        result = gen.step(exec_host, pcm_host) if exec_host.any() else None
        ended = time.monotonic()
        if gen.prefilling:
            gen.advance_prefill()  # enqueued behind this tick's work: it runs while outputs go out
        self.last_step = result
        per_frame = self._frame_usage
        outputs = []
        for item in batch:
            slot = item.slot
            state = self._slots[slot]
            timeline = state.timeline
            if timeline is not None and timeline.first_frame_at is None:
                timeline.first_frame_at = started
            if result is None or not exec_host[slot]:
                state.unready_frames += 1
                outputs.append(SlotOutput(slot=slot, epoch=item.epoch))
                continue
            if timeline is not None:
                self._follow(slot, state, timeline, result.pcm[slot], started, ended)
            usage = per_frame
            if state.frames == 0:  # the first heard frame after a (re)start: the persona prompt it ran too
                usage = per_frame.with_prompt(state.script.phases.count("text"))
            state.frames += 1
            outputs.append(
                SlotOutput(
                    slot=slot,
                    epoch=item.epoch,
                    pcm=result.pcm[slot].copy(),
                    sample_rate=SAMPLE_RATE,
                    text=self._piece(int(result.text[slot])),
                    usage=usage,
                )
            )
        return outputs

    def _follow(
        self, slot: int, state: _Slot, timeline: SlotTimeline, pcm: np.ndarray, started: float, ended: float
    ) -> None:
        """Fill a slot's first-audio timeline from its heard frames; log it once it is complete."""
        if timeline.first_step_at is None:
            timeline.first_step_at, timeline.first_step_ended = started, ended
            timeline.unready_frames = state.unready_frames
        if timeline.first_voiced_frame is None and float(np.sqrt(np.mean(pcm * pcm))) > VOICED_RMS:
            timeline.first_voiced_frame = state.frames
            log.info(
                "personaplex slot %d: open %.1f ms (prompt %s), first frame stepped %.1f ms after the "
                "open, %d frames before ready, first voiced output at conversation frame %d",
                slot,
                (timeline.open_ended - timeline.open_started) * 1e3,
                "in the open" if timeline.prefilled_in_open else "in chunks between ticks",
                ((timeline.first_step_at or started) - timeline.open_ended) * 1e3,
                timeline.unready_frames,
                state.frames,
            )

    def timelines(self) -> dict[int, dict[str, float | int | bool | None]]:
        """The first-audio timeline of every open slot (``SlotTimeline``), by slot."""
        return {slot: s.timeline.as_dict() for slot, s in self._slots.items() if s.timeline is not None}

    def _piece(self, token: int) -> str:
        if 0 <= token < len(self._pieces):
            return self._pieces[token]
        return ""


def heard_frame_usage(agent_codebooks: int, user_codebooks: int) -> TokenUsage:
    """The tokens of one heard frame: the user's ``user_codebooks`` Mimi codes read, one text token
    and ``agent_codebooks`` codes sampled."""
    return TokenUsage(input_audio=user_codebooks, output_text=1, output_audio=agent_codebooks)


def _parse_buckets(text: str, max_sessions: int) -> tuple[int, ...]:
    """``batch_buckets``: ``off`` (every step at ``max_sessions`` rows), ``auto`` (1, 4, 16, 64, ...
    below it) or row counts such as ``1,8,32``. Raises ``PluginError("invalid_plugin_config")``."""
    text = text.strip().lower()
    if text in ("off", "none", ""):
        return ()
    if text == "auto":
        out, n = [], 1
        while n < max_sessions:
            out.append(n)
            n *= 4
        return tuple(out)
    try:
        buckets = tuple(int(part) for part in text.split(","))
    except ValueError:
        buckets = ()
    if not buckets or any(b < 1 for b in buckets):
        raise PluginError(
            "invalid_plugin_config", f"batch_buckets: off, auto or row counts like 1,8,32; got {text!r}"
        )
    return buckets


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
