"""``qwen3_tts``: Qwen3-TTS 12 Hz CustomVoice as a continuously batched ``batch`` plugin.

Theory of operation
-------------------
A request is a text and a voice (one of the checkpoint's preset speakers). ``begin`` checks it,
tokenizes ``<|im_start|>assistant\\n{text}<|im_end|>...``, builds the prompt (role tokens, the
codec's language and speaker tokens, the first text token) and runs it through the talker for that
slot alone, filling the slot's row of the key/value cache (``generation.BatchedTalker.start``).
The rest of the text is read one token per frame while the model speaks (Qwen3-TTS's streaming
text input), so a long text costs no longer prompt.

Each ``advance`` takes one 80 ms frame for every slot at once: codebook 0 from the talker, the
other codebooks from the code predictor, then one talker step with each row at its own position
(``generation``). A slot's codes are turned into audio by the codec decoder in chunks: the first
after ``first_chunk_frames`` frames, then every ``chunk_frames`` frames, each
decoded with up to ``left_context_frames`` earlier frames as context (the decoder is causal, so
the chunks join into the audio a whole-utterance decode gives, up to its receptive field). One
frame is the fewest the codec allows and the default for the first chunk: every convolution of
the decoder is padded on the left only, its transposed convolutions are trimmed on the right and
its attention sees only the past, so the 1,920 samples of frame t depend on frames 0..t alone and
need no lookahead frame. The request ends when the model emits end-of-speech, or at
``max_audio_s``; the last output carries the rest of the audio and ``end_of_turn``.

Each output's ``text`` is the part of the input the model has read by the end of that chunk (one
text token per frame, so it runs a little ahead of the audio), and ``progress`` the share of the
text read; the texts join back to the input. Sampling (temperature, top-k, repetition penalty,
from ``generation_config.json``) draws counter-based noise keyed by each request's ``seed``
(``noise``), so a request's audio is the same alone or batched.

Plugin options (``from_options``): ``max_sessions`` (16), ``device`` ("cpu", "cuda[:N]"), ``dtype``
(bfloat16 on CUDA, float32 on a CPU), ``random_weights`` (False: the configs of the model path
with random weights, for benchmarks), ``default_voice`` (the first speaker by name),
``max_input_chars`` (4096), ``max_text_tokens`` (1024), ``max_instruction_tokens`` (256),
``max_audio_s`` (120), ``first_chunk_frames`` (1), ``chunk_frames`` (10), ``left_context_frames``
(the codec's attention window, 72), ``cuda_graphs`` (True: on CUDA the decode step and each
prefill bucket run as captured graphs; False runs the same code eagerly).

Request options: ``voice`` (a speaker of ``config.json``; default: the session's voice, given when
its slot opened, else ``default_voice``), ``language``
(``auto`` or one of the checkpoint's languages), ``instructions`` (a style instruction, for
checkpoints trained with them), ``seed``, ``speed`` (1.0 only: the model has no speed control).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from batch_models.base import SlotBatchPlugin, check_at_least, model_dir
from batch_models.devices import TORCH_OPTION_TYPES, device_and_dtype
from batch_models.qwen3_tts.config import FRAME_SAMPLES, SAMPLE_RATE
from batch_models.qwen3_tts.generation import BatchedTalker, Sampling
from batch_models.qwen3_tts.loading import (
    ROLE_TOKENS,
    TAIL_TOKENS,
    LoadedTTS,
    chat_text,
    instruct_text,
    load_model,
)
from batch_models.requests import INPUT_TOO_LONG, INVALID_OPTION, OptionReader, check_text
from duplex.plugins.base import BatchRequest, Capabilities, PluginError, PluginKind, SlotOptions, SlotOutput

__all__ = ["Qwen3TTSPlugin"]

log = logging.getLogger(__name__)

FRAME_RATE_HZ = SAMPLE_RATE / FRAME_SAMPLES  # 12.5
_PROMPT_EXTRA_POSITIONS = 16  # role tokens, codec prefix, speaker, first text token


@dataclass
class _Request:
    """Host-side state of one request: where its audio and its text are."""

    epoch: int
    text_ids: list[int]
    frames: int = 0  # frames generated (end-of-speech not counted)
    decoded: int = 0  # frames already sent as audio
    text_sent: str = ""


class Qwen3TTSPlugin(SlotBatchPlugin[_Request]):
    """Qwen3-TTS CustomVoice served with continuous batching (see the module docstring)."""

    name = "qwen3_tts"
    option_types = {
        **TORCH_OPTION_TYPES,
        "default_voice": str,
        "max_input_chars": int,
        "max_text_tokens": int,
        "max_instruction_tokens": int,
        "max_audio_s": float,
        "first_chunk_frames": int,
        "chunk_frames": int,
        "left_context_frames": int,
        "cuda_graphs": bool,
    }

    @classmethod
    def write_tiny_checkpoint(cls, directory: str, *, seed: int = 0) -> None:
        from batch_models.qwen3_tts.testing import write_checkpoint

        write_checkpoint(directory, seed=seed)

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        max_sessions: int = 16,
        device: str = "cpu",
        dtype: str | None = None,
        random_weights: bool = False,
        default_voice: str | None = None,
        max_input_chars: int = 4096,
        max_text_tokens: int = 1024,
        max_instruction_tokens: int = 256,
        max_audio_s: float = 120.0,
        first_chunk_frames: int = 1,
        chunk_frames: int = 10,
        left_context_frames: int | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        self._model_path = model_dir(self.name, model_path, "a checkpoint directory")
        check_at_least(
            self.name,
            (
                ("max_sessions", max_sessions, 1),
                ("max_input_chars", max_input_chars, 1),
                ("max_text_tokens", max_text_tokens, 1),
                ("max_instruction_tokens", max_instruction_tokens, 0),
                ("first_chunk_frames", first_chunk_frames, 1),
                ("chunk_frames", chunk_frames, 1),
                ("left_context_frames", left_context_frames or 0, 0),
            ),
        )
        if not 0 < max_audio_s <= 3600:
            raise PluginError("invalid_plugin_config", "qwen3_tts: max_audio_s must be in (0, 3600]")
        self._device, self._dtype = device_and_dtype(self.name, device, dtype)
        super().__init__(max_sessions)
        self._random = random_weights
        self._default_voice_opt = default_voice
        self._max_input_chars = max_input_chars
        self._max_text_tokens = max_text_tokens
        self._max_instruction_tokens = max_instruction_tokens
        self._max_frames = max(1, int(max_audio_s * FRAME_RATE_HZ))
        self._first_chunk = first_chunk_frames
        self._chunk = chunk_frames
        self._left_context_opt = left_context_frames
        self._cuda_graphs = cuda_graphs
        self._loaded: LoadedTTS | None = None
        self._gen: BatchedTalker | None = None
        self._sampling = Sampling()
        self._voices: tuple[str, ...] = ()
        self._default_voice = ""

    # -- lifetime ---------------------------------------------------------

    @property
    def generator(self) -> BatchedTalker:
        """The batched decoding state (for benchmarks and tests that look at codes)."""
        if self._gen is None:
            raise self._not_loaded()
        return self._gen

    def _is_loaded(self) -> bool:
        return self._gen is not None

    def _load(self) -> None:
        loaded = load_model(
            self._model_path, device=self._device, dtype=self._dtype, random_weights=self._random
        )
        cfg = loaded.config
        self._voices = tuple(sorted(cfg.talker.spk_id))
        wanted = self._default_voice_opt
        if wanted is not None and wanted not in self._voices:
            message = f"qwen3_tts: default voice {wanted!r} is not a speaker of the model"
            raise PluginError("voice_not_found", message)
        self._default_voice = wanted or self._voices[0]
        g = loaded.generation
        self._sampling = Sampling(
            temperature=float(g.get("temperature", 0.9)) if g.get("do_sample", True) else 0.0,
            repetition_penalty=float(g.get("repetition_penalty", 1.05)),
            subtalker_temperature=float(g.get("subtalker_temperature", 0.9))
            if g.get("subtalker_dosample", True)
            else 0.0,
        )
        self._left_context = (
            self._left_context_opt if self._left_context_opt is not None else cfg.codec.sliding_window
        )
        self._loaded = loaded
        pinned = self._device.type == "cuda"  # the step's one upload needs no sync
        self._exec_host = torch.zeros(self._max_sessions, dtype=torch.bool, pin_memory=pinned)
        self._gen = BatchedTalker(
            loaded.model.talker,
            loaded.codec.decoder,
            cfg,
            max_slots=self._max_sessions,
            max_positions=self._max_instruction_tokens + _PROMPT_EXTRA_POSITIONS + self._max_frames,
            max_frames=self._max_frames,
            max_text_tokens=self._max_text_tokens,
            top_k=int(g.get("top_k", 50)),
            subtalker_top_k=int(g.get("subtalker_top_k", 50)),
            device=self._device,
            dtype=self._dtype,
            cuda_graphs=self._cuda_graphs,
        )
        log.info(
            "qwen3_tts loaded: %s on %s (%s), %d voices, %d slots",
            cfg.tts_model_size or "?",
            self._device,
            self._dtype,
            len(self._voices),
            self._max_sessions,
        )

    def _unload(self) -> None:
        self._gen = None
        self._loaded = None

    def capabilities(self) -> Capabilities:
        return Capabilities(
            kind=PluginKind.BATCH,
            output_sample_rate=SAMPLE_RATE,
            max_sessions=self._max_sessions,
            supports_text_input=True,
            supports_barge_in=True,
            output_modalities=("audio", "text"),
            voices=self._voices,
            default_voice=self._default_voice or None,
        )

    # -- slots and requests -----------------------------------------------

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        self.generator  # noqa: B018 - raises plugin_not_loaded
        if options.voice is not None and options.voice.lower() not in self._voices:
            message = f"qwen3_tts: voice {options.voice!r} is not a speaker of the model"
            raise PluginError("voice_not_found", message)
        super().open_slot(slot, options)

    def _release(self, slot: int) -> None:
        if self._gen is not None:
            self._gen.release(slot)

    def begin(self, request: BatchRequest) -> None:
        """Check the request and run its prompt for its slot alone; it speaks from the next step on.

        Raises ``PluginError`` (codes in ``batch_models.requests``) with nothing changed.
        """
        gen = self.generator
        assert self._loaded is not None
        cfg = self._loaded.config.talker
        self._slots.check_idle(request.slot)
        text = check_text(self.name, request.text, self._max_input_chars)
        options = dict(request.options)
        for key in ("voice", "language"):  # names are matched lower-case, as the reference code does
            if isinstance(options.get(key), str):
                options[key] = str(options[key]).lower()
        reader = OptionReader(self.name, options)
        session_voice = self._slots.options(request.slot).voice
        default = session_voice.lower() if session_voice else self._default_voice
        voice = reader.take_voice(default, self._voices)
        language = reader.take_choice("language", "auto", ("auto", *sorted(cfg.codec_language_id)))
        instructions = reader.take_str("instructions", "", self._max_input_chars)
        seed = reader.take_seed()
        speed = reader.take_float("speed", 1.0, 0.25, 4.0)
        reader.done()
        if speed != 1.0:
            message = "qwen3_tts: option 'speed' must be 1.0 (the model has no speed control)"
            raise PluginError(INVALID_OPTION, message)
        tokenizer = self._loaded.tokenizer
        ids = tokenizer(chat_text(text)).input_ids  # type: ignore[operator]
        text_ids = list(ids[ROLE_TOKENS:-TAIL_TOKENS])
        if len(text_ids) > self._max_text_tokens:
            message = f"qwen3_tts: the input is {len(text_ids)} tokens; at most {self._max_text_tokens}"
            raise PluginError(INPUT_TOO_LONG, message + " are accepted")
        instruct_ids = tokenizer(instruct_text(instructions)).input_ids if instructions else []  # type: ignore[operator]
        if len(instruct_ids) > self._max_instruction_tokens:
            message = f"qwen3_tts: the instructions are {len(instruct_ids)} tokens; at most"
            raise PluginError(INPUT_TOO_LONG, f"{message} {self._max_instruction_tokens} are accepted")
        prompt, trailing = self._prompt(ids[:ROLE_TOKENS], text_ids, instruct_ids, voice, language)
        gen.start(request.slot, prompt, trailing, int(seed), self._sampling)
        self._slots.start(request.slot, _Request(epoch=request.epoch, text_ids=text_ids))

    @torch.inference_mode()
    def _prompt(
        self, role_ids: list[int], text_ids: list[int], instruct_ids: list[int], voice: str, language: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefill embeddings ``[P, H]`` and the text read during decoding ``[N, H]``."""
        assert self._loaded is not None
        full = self._loaded.config
        cfg = full.talker
        talker = self._loaded.model.talker
        device = self._device

        def text(ids: list[int]) -> torch.Tensor:
            return talker.embed_text(torch.tensor(ids, dtype=torch.long, device=device))

        def codec(ids: list[int]) -> torch.Tensor:
            return talker.model.codec_embedding(torch.tensor(ids, dtype=torch.long, device=device))

        dialect = cfg.spk_is_dialect.get(voice)
        language_id = cfg.codec_language_id.get(language)
        if language in ("auto", "chinese") and isinstance(dialect, str) and dialect in cfg.codec_language_id:
            language_id = cfg.codec_language_id[dialect]
        if language_id is None:
            prefix = [cfg.codec_nothink_id, cfg.codec_think_bos_id, cfg.codec_think_eos_id]
        else:
            prefix = [cfg.codec_think_id, cfg.codec_think_bos_id, language_id, cfg.codec_think_eos_id]
        codes = codec([*prefix, cfg.spk_id[voice], cfg.codec_pad_id, cfg.codec_bos_id])
        bos, eos, pad = text([full.tts_bos_token_id, full.tts_eos_token_id, full.tts_pad_token_id])
        # Under every codec prefix token but the last: text pads, then the text's beginning (bos).
        specials = torch.cat([pad.expand(codes.shape[0] - 2, -1), bos[None]]) + codes[:-1]
        parts = [text(role_ids), specials, text(text_ids[:1]) + codes[-1:]]
        if instruct_ids:
            parts.insert(0, text(instruct_ids))
        trailing = torch.cat([text(text_ids[1:]), eos[None]]) if len(text_ids) > 1 else eos[None]
        return torch.cat(parts), trailing

    # -- the step ---------------------------------------------------------

    def advance(self, slots: Sequence[int]) -> Sequence[SlotOutput]:
        """One frame for every request in ``slots``; each gets an output (audio when a chunk is due)."""
        gen = self.generator
        batch = self._slots.batch(slots)
        rows = [slot for slot, _ in batch]
        self._exec_host.zero_()
        self._exec_host[rows] = True
        codes = gen.step(self._exec_host)
        # The one read back per step: which rows said end-of-speech (the host decides chunks and ends).
        eos = (codes[:, 0] == gen.cfg.talker.codec_eos_token_id).cpu().tolist()
        ended: dict[int, bool] = {}
        due: list[int] = []
        for slot, request in batch:
            if not eos[slot]:
                request.frames += 1
            ended[slot] = eos[slot] or request.frames >= self._max_frames
            chunk = self._first_chunk if request.decoded == 0 else self._chunk
            waiting = request.frames - request.decoded
            if waiting > 0 and (ended[slot] or waiting >= chunk):
                due.append(slot)
        # First chunks of a full first_chunk_frames: one codec call for all rows (first audio).
        requests = dict(batch)
        openings = [s for s in due if requests[s].decoded == 0 and requests[s].frames == self._first_chunk]
        opening = gen.decode_opening(self._first_chunk) if openings else None
        outputs = []
        for slot, request in batch:
            pcm = None
            if opening is not None and slot in openings:
                pcm = opening[slot].numpy()
            elif slot in due:
                pcm = gen.decode(slot, request.decoded, request.frames, self._left_context).numpy()
            if pcm is not None:
                request.decoded = request.frames
            end = ended[slot]
            text = self._text_delta(request, end) if pcm is not None or end else ""
            read = min(len(request.text_ids), request.frames + 1)
            outputs.append(
                SlotOutput(
                    slot=slot,
                    epoch=request.epoch,
                    pcm=pcm,
                    sample_rate=SAMPLE_RATE,
                    text=text,
                    progress=1.0 if end else min(0.99, read / len(request.text_ids)),
                    end_of_turn=end,
                )
            )
            if end:
                self._slots.drop(slot)
                gen.release(slot)
        return outputs

    def _text_delta(self, request: _Request, ended: bool) -> str:
        """The input text read since the last chunk (all of the rest when the request ends)."""
        assert self._loaded is not None
        read = len(request.text_ids) if ended else min(len(request.text_ids), request.decoded + 1)
        text = self._loaded.tokenizer.decode(request.text_ids[:read])  # type: ignore[attr-defined]
        if not ended and text.endswith("\ufffd"):  # a character split between tokens: wait for the rest
            return ""
        delta = text[len(request.text_sent) :]
        request.text_sent = text
        return delta
