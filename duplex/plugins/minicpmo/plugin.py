"""``minicpmo_4_5``: MiniCPM-o 4.5 as a batched ``unit`` plugin.

Once a second the model hears one unit (16 kHz) of every session, sees the camera frame that came
with it, and decides: listen (``SlotOutput.decision = "listen"``) or speak (``"speak"``, with the
unit's transcript delta and one second of 24 kHz audio). ``<|turn_eos|>`` ends the response
(``end_of_turn``). Every session with a unit ready is stepped in one batched call
(``generation.UnitGenerator``).

Slot lifecycle, as the engine sees it:

* ``open_slot(slot, options)`` resets the slot and prefills its system context in its own row:
  ``instructions`` (fixed for the session) and, when ``options.extra["ref_audio"]`` is given, the
  reference voice (a WAV as bytes, base64 or a ``data:`` URL, or float32 samples at 16 kHz). The slot
  is ready when it returns. ``temperature`` (default 0.7; 0 is greedy) and ``seed`` are per session.
* ``step(batch)``: one unit per slot; frames beyond ``max_frames_per_unit`` and frames that do not
  decode are skipped and counted (``frames_dropped``), the unit still runs. The user's typed text
  (``SlotInput.text``, ``Capabilities.supports_text_input``) is read before the unit, each message a
  user turn of the chat template between two units (``generation``); a text longer than the context
  window is read from its end, the rest counted (``text_tokens_dropped``).
* ``cancel_slot(slot, epoch)`` (barge-in): the reply in progress is void; the model keeps what it
  heard and keeps listening.
* ``close_slot(slot)`` frees the slot.

Every output reports its tokens (``Capabilities.reports_usage``): the unit's input positions by kind
(text markers, audio embeddings, vision embeddings) and the text tokens and speech codes it produced.

Plugin options (``from_options``): ``max_sessions`` (4), ``device`` ("cpu", "cuda[:N]"), ``dtype``
(bfloat16 on CUDA, float32 on a CPU; float64 too, for tests that compare two computation paths),
``seed`` (0; a session without a seed gets ``seed + n`` for its
n-th open), ``temperature`` (0.7), ``max_new_tokens`` (20 per unit), ``top_p`` (0.8), ``top_k`` (20),
``repetition_penalty`` (1.05), ``length_penalty`` (1.1, on ``<|turn_eos|>``), ``char_limit`` (28: a
unit's text ends with ``<|chunk_eos|>`` before it reaches 28 characters, as upstream's; 0: never),
``force_listen_units`` (0: a session's first units that listen whatever the model says; MiniCPM-o's
demo server uses 3),
``tts_temperature`` (0.8), ``tts_top_k`` (0, off) and ``tts_top_p`` (1.0, off) for the speech codes,
``tts_early_end`` (True: the speech head may end a turn's first and last unit early, as upstream; False:
every speaking unit is a full second of codes),
``voice_markers`` ("always": ``<|audio_start|><|audio_end|>`` in the system prompt with or without a
reference voice, as MiniCPM-o's demo; "with_voice"), ``context_tokens`` (8192), ``window_high_tokens`` (8000),
``window_low_tokens`` (6000), ``max_frames_per_unit`` (2), ``frame_threads`` (16: threads that decode
and resize a step's camera frames), ``max_ref_audio_s`` (10),
``early_exit`` (True), ``cuda_graphs`` (False; CUDA only: the prefill, the decode step of the language
model, the speech head's code step and the code-to-wave stage replay CUDA graphs captured at load, per
batch-size bucket and key span, see the README),
``random_weights`` (False; the architecture with random weights, for
benchmarks) with ``config`` ("full" or "tiny"), ``code_to_wave`` ("flow": the checkpoint's
``assets/token2wav``; "silent": one second of silence per speaking unit, to measure the rest alone),
``voice`` (a voice-prompt file for the code-to-wave stage; default
``assets/token2wav/prompt_voice.safetensors`` when present, see ``token2wav``).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import logging
from collections.abc import Sequence
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
    unknown_options,
)
from duplex.plugins.minicpmo.config import (
    FULL_CONFIG,
    OUTPUT_RATE,
    SAMPLE_RATE,
    TINY_CONFIG,
    UNIT_SAMPLES,
    MiniCPMOConfig,
)
from duplex.plugins.minicpmo.generation import GenerationOptions, UnitGenerator, UnitResult
from duplex.plugins.minicpmo.token2wav import CodeToWave, SilentCodeToWave
from duplex.plugins.options import parse_options

__all__ = ["MiniCPMOPlugin"]

log = logging.getLogger(__name__)

PUBLISHED_FRAME_SIDE = 448  # MiniCPM-o 4.5's ``slice_config.scale_resolution``

_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}
_OPTION_TYPES: dict[str, type] = {
    "max_sessions": int,
    "device": str,
    "dtype": str,
    "seed": int,
    "temperature": float,
    "max_new_tokens": int,
    "top_p": float,
    "top_k": int,
    "repetition_penalty": float,
    "length_penalty": float,
    "char_limit": int,
    "force_listen_units": int,
    "tts_temperature": float,
    "tts_top_k": int,
    "tts_top_p": float,
    "tts_early_end": bool,
    "voice_markers": str,
    "context_tokens": int,
    "window_high_tokens": int,
    "window_low_tokens": int,
    "max_frames_per_unit": int,
    "frame_threads": int,
    "max_ref_audio_s": float,
    "early_exit": bool,
    "cuda_graphs": bool,
    "random_weights": bool,
    "config": str,
    "code_to_wave": str,
    "flow_dtype": str,
    "voice": str,
}
_GENERATION_OPTIONS = (
    "max_new_tokens",
    "top_p",
    "top_k",
    "repetition_penalty",
    "length_penalty",
    "char_limit",
    "force_listen_units",
    "tts_temperature",
    "tts_top_k",
    "tts_top_p",
    "tts_early_end",
    "voice_markers",
    "context_tokens",
    "window_high_tokens",
    "window_low_tokens",
    "max_frames_per_unit",
    "frame_threads",
    "early_exit",
    "cuda_graphs",
)


class MiniCPMOPlugin(FramePlugin):
    """MiniCPM-o 4.5 served as a batched ``unit`` plugin (see the module docstring)."""

    name = "minicpmo_4_5"

    @classmethod
    def write_tiny_checkpoint(cls, directory: str, *, seed: int = 0) -> None:
        from duplex.plugins.minicpmo.testing import make_tiny_checkpoint

        make_tiny_checkpoint(directory, seed=seed)

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        max_sessions: int = 4,
        device: str = "cpu",
        dtype: str | None = None,
        seed: int = 0,
        temperature: float = 0.7,
        max_ref_audio_s: float = 10.0,
        random_weights: bool = False,
        config: str | None = None,
        code_to_wave: str = "flow",
        flow_dtype: str = "float32",
        voice: str | None = None,
        **generation: object,
    ) -> None:
        if max_sessions < 1:
            raise PluginError("invalid_plugin_config", "max_sessions must be at least 1")
        if model_path is None and not random_weights:
            raise PluginError(
                "invalid_plugin_config", "minicpmo_4_5 needs a model path (or random_weights=True)"
            )
        if config not in (None, "full", "tiny"):
            raise PluginError("invalid_plugin_config", f"config must be 'full' or 'tiny', got {config!r}")
        if dtype is not None and dtype not in _DTYPES:
            raise PluginError(
                "invalid_plugin_config", f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}"
            )
        if temperature < 0:
            raise PluginError("invalid_plugin_config", "temperature must be >= 0")
        if code_to_wave not in ("flow", "silent"):
            raise PluginError(
                "invalid_plugin_config", f"code_to_wave must be 'flow' or 'silent', got {code_to_wave!r}"
            )
        if flow_dtype not in _DTYPES:
            raise PluginError(
                "invalid_plugin_config", f"flow_dtype must be one of {sorted(_DTYPES)}, got {flow_dtype!r}"
            )
        unknown = sorted(set(generation) - set(_GENERATION_OPTIONS))
        if unknown:
            raise unknown_options("minicpmo_4_5", unknown, _OPTION_TYPES)
        self._model_path = Path(model_path) if model_path is not None else None
        self._max_sessions = max_sessions
        self._device = torch.device(device)
        self._dtype = (
            _DTYPES[dtype] if dtype else (torch.bfloat16 if self._device.type == "cuda" else torch.float32)
        )
        self._seed = seed
        self._temperature = temperature
        self._max_ref_samples = int(max_ref_audio_s * SAMPLE_RATE)
        self._random = random_weights
        self._config_name = config
        self._code_to_wave = code_to_wave
        self._flow_dtype = _DTYPES[flow_dtype]
        self._voice = voice
        self._gen_options = GenerationOptions(**generation)  # type: ignore[arg-type]
        self._gen: UnitGenerator | None = None
        self._epochs: dict[int, int] = {}
        self._opens = 0
        self._closed = False
        self.last_results: dict[int, UnitResult] = {}

    @classmethod
    def from_options(cls, model_path: str | None = None, **options: object) -> MiniCPMOPlugin:
        """Build from serve-time options; strings (``--plugin-option max_sessions=16``) are parsed."""
        return cls(model_path, **parse_options(cls.name, options, _OPTION_TYPES))  # type: ignore[arg-type]

    @classmethod
    def option_defaults(cls) -> dict[str, object]:
        """``__init__``'s options and the sampling options (``GenerationOptions``) it takes."""
        sampling = {f.name: f.default for f in dataclasses.fields(GenerationOptions)}
        return {**super().option_defaults(), **{k: sampling[k] for k in _GENERATION_OPTIONS}}

    # -- lifetime ---------------------------------------------------------

    @property
    def generator(self) -> UnitGenerator:
        if self._gen is None:
            raise PluginError("plugin_not_loaded", "minicpmo_4_5: load() has not been called or close() was")
        return self._gen

    def load(self) -> None:
        if self._closed:
            raise PluginError("plugin_closed", "minicpmo_4_5: the plugin was closed")
        if self._gen is not None:
            return
        from duplex.plugins.minicpmo.loading import find_checkpoint, load_model
        from duplex.plugins.minicpmo.modules import MiniCPMOModel
        from duplex.plugins.minicpmo.testing import train_tokenizer
        from duplex.plugins.minicpmo.token2wav import load_code_to_wave, random_code_to_wave
        from duplex.plugins.minicpmo.tokens import SPECIAL_TOKENS, SpecialTokens, load_tokenizer

        slots, device = self._max_sessions, self._device
        capture = self._gen_options.cuda_graphs
        if capture and device.type != "cuda":
            raise PluginError(
                "invalid_plugin_config", f"cuda_graphs needs a CUDA device, not {device.type!r}"
            )
        wave: CodeToWave = SilentCodeToWave()
        if self._random:
            tiny = self._config_name == "tiny"
            cfg = MiniCPMOConfig.from_json(TINY_CONFIG if tiny else FULL_CONFIG)
            model = MiniCPMOModel.random(cfg, device, self._dtype, seed=self._seed)
            tok = train_tokenizer()
            special = SpecialTokens(**{k: int(tok.token_to_id(v)) for k, v in SPECIAL_TOKENS.items()})
            if self._code_to_wave == "flow":
                codes = 12 if tiny else 150
                wave = random_code_to_wave(
                    cfg.token2wav,
                    slots,
                    device,
                    self._seed,
                    voice_codes=codes,
                    capture=capture,
                    flow_dtype=self._flow_dtype,
                )
        else:
            assert self._model_path is not None
            files = find_checkpoint(self._model_path)
            cfg = files.config
            if self._code_to_wave == "flow":
                wave = load_code_to_wave(
                    files.root,
                    cfg.token2wav,
                    slots,
                    device,
                    self._voice,
                    capture=capture,
                    flow_dtype=self._flow_dtype,
                )
            model = load_model(files, device, self._dtype)
            tok, special = load_tokenizer(files.tokenizer)
        self._gen = UnitGenerator(model, cfg, tok, special, slots, self._gen_options, wave)
        log.info("minicpmo_4_5 loaded on %s (%s), %d slots", self._device, self._dtype, self._max_sessions)

    def close(self) -> None:
        if self._gen is not None:
            self._gen.close()
        self._gen = None
        self._epochs.clear()
        self._closed = True

    def capabilities(self) -> Capabilities:
        return Capabilities(
            kind=PluginKind.UNIT,
            chunk_period_ms=1000,
            input_sample_rate=SAMPLE_RATE,
            output_sample_rate=OUTPUT_RATE,
            max_sessions=self._max_sessions,
            model_native_turns=True,
            supports_server_vad=False,
            supports_client_commit=False,
            supports_barge_in=True,
            supports_resume=True,
            supports_video_input=True,
            supports_text_input=True,  # typed text, read between two units (``step``)
            video_frame_max_pixels=self._frame_side() ** 2,
            output_modalities=("audio", "text"),
            reports_usage=True,
            updatable_options=(),  # the system prompt and the reference voice are prefilled at open
            session_options=("ref_audio",),  # ``open_slot`` reads ``options.extra["ref_audio"]``
        )

    def _frame_side(self) -> int:
        """The side of the square whose area every camera frame is scaled to (``scale_resolution``):
        the loaded checkpoint's, or the published one's before ``load``."""
        return self._gen.cfg.image_size if self._gen is not None else PUBLISHED_FRAME_SIDE

    @property
    def frames_dropped(self) -> int:
        """Camera frames skipped (undecodable, or past ``max_frames_per_unit``) since load."""
        return self.generator.frames_dropped

    @property
    def text_tokens_dropped(self) -> int:
        """Tokens of typed text left unread (the start of a text longer than the window) since load."""
        return self.generator.text_tokens_dropped

    # -- slots ------------------------------------------------------------

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        self._check_slot_index(slot, self._max_sessions)
        gen = self.generator
        temperature = self._temperature if options.temperature is None else float(options.temperature)
        if temperature < 0:
            raise PluginError("invalid_session_config", "temperature must be >= 0")
        ref = self._reference_audio(options.extra.get("ref_audio"))
        seed = options.seed if options.seed is not None else self._seed + self._opens
        self._opens += 1
        gen.open_slot(slot, options.instructions, ref, int(seed), temperature)
        self._epochs[slot] = 0

    def _reference_audio(self, value: object) -> np.ndarray | None:
        """The reference voice as float32 mono 16 kHz samples (see the module docstring)."""
        if value is None:
            return None
        if isinstance(value, np.ndarray):
            pcm = value.astype(np.float32).reshape(-1)
        else:
            if isinstance(value, str):
                text = value.split(",", 1)[1] if value.startswith("data:") else value
                try:
                    data = base64.b64decode(text, validate=True)
                except ValueError as exc:
                    raise PluginError("invalid_session_config", "ref_audio is not valid base64") from exc
            elif isinstance(value, bytes | bytearray):
                data = bytes(value)
            else:
                raise PluginError(
                    "invalid_session_config", "ref_audio must be a WAV (bytes, base64 or data URL)"
                )
            pcm = _decode_wav(data)
        if pcm.size == 0:
            raise PluginError("invalid_session_config", "ref_audio is empty")
        if pcm.size > self._max_ref_samples:
            raise PluginError(
                "invalid_session_config",
                f"ref_audio is {pcm.size / SAMPLE_RATE:.1f} s, over max_ref_audio_s",
            )
        return np.clip(pcm, -1.0, 1.0)

    def cancel_slot(self, slot: int, epoch: int) -> None:
        self._check_slot_index(slot, self._max_sessions)
        if slot not in self._epochs:
            raise PluginError("invalid_slot", f"slot {slot} is not open")
        self._epochs[slot] = epoch
        self.generator.cancel_slot(slot)

    def close_slot(self, slot: int) -> None:
        self._check_slot_index(slot, self._max_sessions)
        self._epochs.pop(slot, None)
        if self._gen is not None:
            self._gen.close_slot(slot)

    # -- the step ---------------------------------------------------------

    def step(self, batch: Sequence[SlotInput]) -> Sequence[SlotOutput]:
        gen = self.generator
        units: dict[int, tuple[np.ndarray, list[bytes]]] = {}
        texts: dict[int, tuple[str, ...]] = {}
        self._check_inputs(batch, self._epochs, UNIT_SAMPLES)
        for item in batch:
            slot, pcm = item.slot, item.pcm
            if pcm.dtype != np.float32:
                pcm = pcm.astype(np.float32) / (32768.0 if pcm.dtype == np.int16 else 1.0)
            units[slot] = (pcm, list(item.video_frames))
            if item.text:
                texts[slot] = tuple(item.text)
        results = gen.step(units, texts)
        self.last_results = results
        outputs = []
        for item in batch:
            res = results[item.slot]
            speak = res.decision == "speak"
            text_in, audio_in, image_in = res.input_tokens
            usage = TokenUsage(
                input_text=text_in,
                input_audio=audio_in,
                input_image=image_in,
                output_text=len(res.tokens),
                output_audio=0 if res.codes is None else int(res.codes.size),
            )
            outputs.append(
                SlotOutput(
                    slot=item.slot,
                    epoch=item.epoch,
                    pcm=res.pcm if speak else None,
                    sample_rate=OUTPUT_RATE,
                    text=res.text,
                    decision=res.decision,
                    end_of_turn=speak and res.end_of_turn,
                    usage=usage,
                )
            )
        return outputs


def _decode_wav(data: bytes) -> np.ndarray:
    import soundfile
    import soxr

    try:
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (RuntimeError, soundfile.LibsndfileError) as exc:
        raise PluginError("invalid_session_config", f"ref_audio could not be decoded: {exc}") from exc
    pcm = samples.mean(axis=1)
    if rate != SAMPLE_RATE:
        pcm = soxr.resample(pcm, rate, SAMPLE_RATE)
    return np.ascontiguousarray(pcm, dtype=np.float32)
