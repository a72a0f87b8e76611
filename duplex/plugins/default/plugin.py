"""The embedded default model: listen (server VAD), understand (Whisper), answer, speak (Piper).

Theory of operation
-------------------
``DefaultPlugin`` is a ``turn`` plugin. The engine's server VAD (or the
client's commit) cuts the microphone stream into user turns and calls
``respond`` once per committed turn, on its model thread. ``respond`` is a
generator that streams the answer:

1. Understand: Whisper tiny.en transcribes the turn (16 kHz). The first chunk
   with content carries only ``user_transcript``, so the engine can send
   ``conversation.item.input_audio_transcription.completed`` before any audio.
   A turn without speech (silence, noise) ends there: one chunk with an empty
   transcript and ``end_of_turn``, no reply. A typed turn (``TurnRequest.text``)
   skips this step; it is refused with ``invalid_item`` when it is longer than
   ``max_input_text_chars`` or holds a NUL (the response fails, the session goes on).
2. Answer: the reply strategy (``lm``, ``echo``, ``openai``, ``vllm``; see ``lm.py``
   and ``reply.py``) streams text deltas (a reasoning model's ``<think>`` spans are
   dropped, and so are control characters other than tabs and line breaks).
   Its system prompt is the session's instructions and its history is
   ``TurnRequest.history``: what the listener actually heard.
3. Speak: the deltas are cut into sentences (long ones at clause marks, and none
   longer than ``max_piece_chars``) and
   each is synthesised with Piper as soon as it is complete (the first piece
   ends at the reply's first clause mark, so the first audio comes sooner). Every audio chunk
   carries exactly the text it speaks, so a truncated response leaves exactly
   the heard sentences in the transcript. A last chunk with no audio sets
   ``end_of_turn``.

Sharing the model thread: the engine pulls ``respond``'s chunks one at a time
on one model thread shared by every session, first come first served, so one
pull must never be long. Each pull does a bounded amount of work: one step of
the transcription (``WhisperTranscriber.transcription``: at most one encoder
pass or one decoding attempt), or the synthesis of one piece of at most
``max_piece_chars`` characters, or a wait of at most ``reply_poll_ms`` for the
reply backend. Where a pull has nothing to send it yields an empty chunk (valid,
and ignored by the session), so other sessions' calls run in between, and a
cancelled response stops at the next pull. ``max_input_text_chars`` bounds the
total work of a typed turn.

Interruption: the engine closes the generator on cancel or barge-in. The echo
reply simply stops; a remote or in-process LLM reply is read by a
``DeltaPump`` thread, which closes the HTTP request (or stops the llama.cpp
request, or aborts the vLLM request) when its next token arrives. ``cancel_slot``
additionally fences off any older epoch, so a response of a cancelled epoch
yields nothing more even if it were pulled again.

Tokens: every chunk of a reply reports the tokens the strategy streamed since the chunk before
(``SlotOutput.usage.output_text``; a delta of the stream is a token: llama.cpp, vLLM and streaming
chat endpoints send one a delta, the echo strategy one a word). A reply is generated with at most
``TurnRequest.max_output_tokens`` tokens (``ReplyPrompt.max_tokens``); the count that reaches the
limit rides on the turn's last chunk, so the engine, which ends a response at its limit, ends it
after every piece of the reply was spoken (``_Tokens``).

Waiting: a reply from an LLM mostly waits for tokens. That wait happens on the
pump's thread; while nothing new has arrived the response yields an empty
chunk every ``reply_poll_ms``, so the engine's shared model thread is never
held by one session's network wait.

Per-slot state is tiny (the instructions, the temperature and the epoch
fence); the models are loaded once in ``load()`` and shared by all slots,
which the engine calls from one thread at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing

import msgspec
import numpy as np

from duplex.plugins.base import (
    Capabilities,
    PluginError,
    PluginKind,
    SlotOptions,
    SlotOutput,
    TokenUsage,
    TurnPlugin,
    TurnRequest,
    unknown_options,
)
from duplex.plugins.default.asr import SAMPLE_RATE as INPUT_RATE
from duplex.plugins.default.asr import WhisperTranscriber
from duplex.plugins.default.pump import DeltaPump
from duplex.plugins.default.reply import ReplyPrompt, ReplyStrategy, without_controls, without_thinking
from duplex.plugins.default.sentences import SentenceSplitter
from duplex.plugins.default.strategies import STRATEGIES, make_strategy
from duplex.plugins.default.tts import VOICE_NAME, PiperSpeaker, SpokenPiece

__all__ = ["OUTPUT_RATE", "DefaultPlugin", "DefaultPluginConfig"]

OUTPUT_RATE = 22050
"""The joe voice's rate, in Hz: the plugin's output rate."""


class DefaultPluginConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Serve-time options of the default plugin (``duplex serve --plugin-option key=value``).

    Answering
        ``reply``: ``lm`` (a small language model on the CPU, shipped in a package) |
        ``echo`` (repeats what it heard) | ``openai`` | ``vllm``. ``reply_url``: the
        chat endpoint for ``openai``. ``reply_model``: a GGUF file for ``lm`` (None: the
        packaged SmolLM2-135M-Instruct), the model name for ``openai`` (None: the
        server's first) or the model directory for ``vllm``. ``reply_threads``: CPU
        threads for ``lm`` (1 leaves the other cores to Whisper and Piper).
        ``reply_api_key_env``: the name of an environment variable holding a bearer token.
        ``reply_timeout_s``: connection and read timeout. ``reply_max_tokens``: the
        longest reply, in tokens; None (the default): the reply kind's own, 96 for ``lm``
        (the small model's spoken answers take 4 to 56 tokens, and a longer run only
        delays the end of the turn and invents more: ``lm.LM_MAX_TOKENS``), 256 for
        ``openai`` and ``vllm``. ``reply_poll_ms``: while a remote reply has nothing new, the
        plugin hands the model thread back this often (see ``DeltaPump``).
    Typed input
        ``max_input_text_chars``: a typed user message longer than this (characters)
        is refused with ``invalid_item`` (it bounds the work of one typed turn:
        4,000 characters are about four minutes of speech).
    Speaking
        ``max_sentence_chars``: a spoken piece longer than this is cut at a clause
        mark. ``max_piece_chars``: no piece is longer than this (characters; cut at
        a word boundary, or inside a run without whitespace). It bounds one Piper call,
        which holds the model thread every session shares (about 0.33 s for 120
        characters on 2 idle CPU cores): another session's turn waits for about one
        such call per chunk it needs. ``first_clause``: the first piece of a reply ends
        at its first clause mark (earlier first audio). ``tts_length_scale``: > 1 speaks slower.
        ``tts_noise_scale`` / ``tts_noise_w_scale``: the voice's randomness (both 0:
        the same text always sounds the same). None keeps the voice's defaults.
    Resources
        ``max_sessions``: slots. ``asr_threads``: CPU threads for Whisper (0: one per
        CPU, at most 4). ``warm_up``: run each model once in ``load()`` so the first
        turn is as fast as later ones.

    An out-of-range value raises ``PluginError("invalid_plugin_config")``.
    """

    reply: str = "lm"
    reply_url: str | None = None
    reply_model: str | None = None
    reply_api_key_env: str | None = None
    reply_timeout_s: float = 30.0
    reply_max_tokens: int | None = None
    reply_threads: int = 1
    reply_poll_ms: int = 50
    max_input_text_chars: int = 4000
    max_sentence_chars: int = 80
    max_piece_chars: int = 120
    first_clause: bool = True
    tts_length_scale: float | None = None
    tts_noise_scale: float | None = None
    tts_noise_w_scale: float | None = None
    max_sessions: int = 4
    asr_threads: int = 0
    warm_up: bool = True

    def __post_init__(self) -> None:
        if self.reply not in STRATEGIES:
            raise PluginError(
                "invalid_plugin_config",
                f"unknown reply strategy {self.reply!r}; choose one of {', '.join(STRATEGIES)}",
            )
        if self.reply_max_tokens is not None and self.reply_max_tokens <= 0:
            raise PluginError(
                "invalid_plugin_config", f"reply_max_tokens must be positive, got {self.reply_max_tokens}"
            )
        for name in (
            "reply_timeout_s",
            "reply_threads",
            "reply_poll_ms",
            "max_input_text_chars",
            "max_sentence_chars",
            "max_piece_chars",
            "max_sessions",
        ):
            if getattr(self, name) <= 0:
                raise PluginError(
                    "invalid_plugin_config", f"{name} must be positive, got {getattr(self, name)}"
                )
        if self.max_piece_chars < self.max_sentence_chars:
            raise PluginError(
                "invalid_plugin_config",
                f"max_piece_chars ({self.max_piece_chars}) must be at least "
                f"max_sentence_chars ({self.max_sentence_chars})",
            )
        if self.asr_threads < 0:
            raise PluginError(
                "invalid_plugin_config", f"asr_threads must not be negative, got {self.asr_threads}"
            )
        if self.tts_length_scale is not None and self.tts_length_scale <= 0:
            raise PluginError("invalid_plugin_config", "tts_length_scale must be positive")


class _Slot:
    """What one session fixes at open, plus its epoch fence."""

    __slots__ = ("instructions", "min_epoch", "temperature")

    def __init__(self, options: SlotOptions) -> None:
        self.instructions = options.instructions
        self.temperature = options.temperature
        self.min_epoch = 0


class DefaultPlugin(TurnPlugin):
    """VAD -> Whisper tiny.en -> reply strategy -> Piper, as a ``turn`` plugin (see the module docstring)."""

    name = "default"

    def __init__(
        self,
        config: DefaultPluginConfig | None = None,
        *,
        model_path: str | None = None,
        asr: WhisperTranscriber | None = None,
        tts: PiperSpeaker | None = None,
    ) -> None:
        """``asr`` and ``tts`` may be shared with another instance (they load once)."""
        self.config = config or DefaultPluginConfig()
        if model_path is not None and self.config.reply != "vllm":
            raise PluginError(
                "invalid_plugin_config",
                "the default plugin takes a model path only with reply='vllm' (the LLM directory)",
            )
        self.reply_strategy: ReplyStrategy = make_strategy(
            self.config.reply,
            model_path=model_path,
            reply_url=self.config.reply_url,
            reply_model=self.config.reply_model,
            reply_api_key_env=self.config.reply_api_key_env,
            reply_timeout_s=self.config.reply_timeout_s,
            reply_max_tokens=self.config.reply_max_tokens,
            reply_threads=self.config.reply_threads,
            max_sessions=self.config.max_sessions,
            warm_up=self.config.warm_up,
        )
        self.asr = asr or WhisperTranscriber(cpu_threads=self.config.asr_threads)
        self.tts = tts or PiperSpeaker(
            length_scale=self.config.tts_length_scale,
            noise_scale=self.config.tts_noise_scale,
            noise_w_scale=self.config.tts_noise_w_scale,
        )
        self._slots: list[_Slot | None] = [None] * self.config.max_sessions
        self._loaded = False
        self._closed = False

    @classmethod
    def from_options(cls, model_path: str | None = None, **options: object) -> DefaultPlugin:
        """Build from serve-time options (the fields of ``DefaultPluginConfig``).

        Values may be strings (from a command line); they are converted to the
        field's type. Raises ``PluginError("invalid_plugin_config")`` for an
        unknown option, a value of the wrong type, or a strategy whose needs are
        unmet (``openai`` without ``reply_url``; ``vllm`` without a model
        directory or without the vllm package).
        """
        known = set(DefaultPluginConfig.__struct_fields__)
        unknown = sorted(set(options) - known)
        if unknown:
            raise unknown_options("default", unknown, known)
        try:
            config = msgspec.convert(options, DefaultPluginConfig, strict=False)
        except msgspec.ValidationError as exc:
            raise PluginError("invalid_plugin_config", f"default: {exc}") from exc
        return cls(config, model_path=model_path)

    @classmethod
    def option_defaults(cls) -> dict[str, object]:
        """The fields of ``DefaultPluginConfig`` (``asr`` and ``tts`` are for tests, not options)."""
        return {f.name: f.default for f in msgspec.structs.fields(DefaultPluginConfig)}

    def capabilities(self) -> Capabilities:
        return Capabilities(
            kind=PluginKind.TURN,
            input_sample_rate=INPUT_RATE,
            output_sample_rate=OUTPUT_RATE,
            max_sessions=self.config.max_sessions,
            supports_server_vad=True,
            supports_client_commit=True,
            supports_barge_in=True,
            supports_text_input=True,
            output_modalities=("audio", "text"),
            voices=(VOICE_NAME,),
            default_voice=VOICE_NAME,
            reports_usage=True,
        )

    def load(self) -> None:
        """Load Whisper, the Piper voice and the reply strategy (the language model for ``lm``);
        warm them up once."""
        if self._closed:
            raise PluginError("internal_error", "the default plugin was closed; build a new one")
        if self._loaded:
            return
        self.asr.load()
        self.tts.load()
        if self.tts.sample_rate != OUTPUT_RATE:
            raise PluginError(
                "model_path_unavailable",
                f"the Piper voice speaks at {self.tts.sample_rate} Hz, not {OUTPUT_RATE}",
            )
        self.reply_strategy.load()
        if self.config.warm_up:
            self._warm_up()
        self._loaded = True

    def _warm_up(self) -> None:
        """Run each model once: the first inference of ONNX Runtime and CTranslate2 is slow."""
        import soxr

        speech = self.tts.speak("Hello there.")
        self.asr.transcribe(soxr.resample(speech, OUTPUT_RATE, INPUT_RATE).astype(np.float32))

    def close(self) -> None:
        self.reply_strategy.close()
        self._slots = [None] * self.config.max_sessions
        self._closed = True
        self._loaded = False

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        """Start a session in ``slot``. Any voice name is accepted: the plugin has one voice."""
        self._check_slot_index(slot, len(self._slots), "internal_error")
        self._slots[slot] = _Slot(options)

    def cancel_slot(self, slot: int, epoch: int) -> None:
        state = self._state(slot)
        state.min_epoch = max(state.min_epoch, epoch)

    def close_slot(self, slot: int) -> None:
        self._check_slot_index(slot, len(self._slots), "internal_error")
        self._slots[slot] = None

    def _state(self, slot: int) -> _Slot:
        self._check_slot_index(slot, len(self._slots), "internal_error")
        state = self._slots[slot]
        if state is None:
            raise PluginError("internal_error", f"slot {slot} is not open")
        return state

    def respond(self, request: TurnRequest) -> Iterator[SlotOutput]:
        """Answer one committed user turn (see the module docstring for the chunk sequence).

        ``request.pcm`` (16 kHz float32) is transcribed; a request with ``text`` and
        no ``pcm`` (a typed user message) is answered as is, without a transcript
        chunk; a request with neither ends at once (one ``end_of_turn`` chunk).
        """
        if not self._loaded:
            raise PluginError("internal_error", "the default plugin is not loaded")
        state = self._state(request.slot)
        slot, epoch = request.slot, request.epoch
        if epoch < state.min_epoch:
            return
        if request.pcm is None:
            user_text = self._typed(request.text or "").strip()  # a typed message, or nothing to answer
        else:
            user_text = ""
            with closing(self.asr.transcription(request.pcm)) as steps:
                for step in steps:
                    if step is not None:
                        user_text = step
                        continue
                    yield SlotOutput(slot=slot, epoch=epoch, sample_rate=OUTPUT_RATE)  # between steps
                    if epoch < state.min_epoch:
                        return
            if not user_text:
                yield SlotOutput(slot=slot, epoch=epoch, user_transcript="", end_of_turn=True)
                return
            yield SlotOutput(slot=slot, epoch=epoch, user_transcript=user_text)
        if epoch < state.min_epoch:
            return
        if not user_text:
            yield SlotOutput(slot=slot, epoch=epoch, end_of_turn=True)
            return
        prompt = ReplyPrompt(
            user_text=user_text,
            history=_history_before(request.history, user_text),
            instructions=request.instructions or state.instructions,
            temperature=state.temperature,
            max_tokens=request.max_output_tokens,
        )
        tokens = _Tokens(request.max_output_tokens)
        with closing(self._deltas(prompt, tokens)) as deltas:
            for piece in self._spoken(deltas):
                if epoch < state.min_epoch:
                    return
                if piece is None:  # nothing to send yet (a silent piece, a thinking backend)
                    yield SlotOutput(slot=slot, epoch=epoch, sample_rate=OUTPUT_RATE, usage=tokens.take())
                    continue
                pcm_out = piece.pcm if piece.pcm.size else None
                yield SlotOutput(
                    slot=slot,
                    epoch=epoch,
                    pcm=pcm_out,
                    sample_rate=OUTPUT_RATE,
                    text=piece.text,
                    usage=tokens.take(),
                )
        last = tokens.take(last=True)
        yield SlotOutput(slot=slot, epoch=epoch, sample_rate=OUTPUT_RATE, end_of_turn=True, usage=last)

    def _typed(self, text: str) -> str:
        """``text``, a typed user message, if the plugin reads it; else ``PluginError("invalid_item")``."""
        limit = self.config.max_input_text_chars
        if len(text) > limit:
            raise PluginError(
                "invalid_item",
                f"the user message has {len(text)} characters; this model reads at most {limit} "
                "(max_input_text_chars)",
            )
        if "\x00" in text:
            raise PluginError("invalid_item", "the user message contains a NUL character (U+0000)")
        return text

    def _deltas(self, prompt: ReplyPrompt, tokens: _Tokens) -> Iterator[str | None]:
        """The reply's text deltas, thoughts and control characters removed (counted in ``tokens``
        before, as the model produced them); ``None`` where a blocking backend had nothing yet."""
        deltas = without_controls(without_thinking(tokens.counting(self.reply_strategy.reply(prompt))))
        if not self.reply_strategy.blocking:
            return deltas
        return DeltaPump(deltas, poll_s=self.config.reply_poll_ms / 1000).deltas()

    def _spoken(self, deltas: Iterator[str | None]) -> Iterator[SpokenPiece | None]:
        """Speak each complete piece of the stream; ``None`` passes through (nothing new yet).

        A piece with no audio (only punctuation) is carried into the next spoken
        piece, or into a last silent piece, so the texts always join to the reply
        (``PiperSpeaker.speak_all``).
        """
        return self.tts.speak_all(self._pieces(deltas))

    def _pieces(self, deltas: Iterator[str | None]) -> Iterator[str | None]:
        """The stream cut into sentences (or a first clause) as they complete; ``None`` passes through."""
        splitter = SentenceSplitter(
            max_chars=self.config.max_sentence_chars,
            max_piece_chars=self.config.max_piece_chars,
            first_clause=self.config.first_clause,
        )
        for delta in deltas:
            if delta is None:
                yield None
                continue
            yield from splitter.feed(delta)
        yield from splitter.flush()


class _Tokens:
    """The tokens of one reply: counted as the strategy streams them (``counting``, on the pump's
    thread for a blocking strategy) and reported on the chunks (``take``). Until the turn's last
    chunk at most ``limit - 1`` are reported: the engine ends a response the moment its count
    reaches the limit, and a reply cut there by its strategy still has text waiting to be spoken."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.counted = 0
        self.reported = 0

    def counting(self, deltas: Iterator[str]) -> Iterator[str]:
        for delta in deltas:
            self.counted += 1
            yield delta

    def take(self, *, last: bool = False) -> TokenUsage | None:
        """The tokens not yet reported (None: none); ``last``: all of them."""
        upto = self.counted
        if not last and self.limit is not None:
            upto = min(upto, self.limit - 1)
        new, self.reported = upto - self.reported, max(upto, self.reported)
        return TokenUsage(output_text=new) if new > 0 else None


def _history_before(history: tuple[tuple[str, str], ...], user_text: str) -> tuple[tuple[str, str], ...]:
    """``history`` without the current turn's own entries at its end.

    The engine may list the turn being answered already: its user item (empty
    until transcribed, or the typed text) and an empty assistant item of the new
    response. The strategy adds the user's words itself, so they would appear twice.
    """
    end = len(history)
    while end and history[end - 1][0] == "assistant" and not history[end - 1][1]:
        end -= 1
    if end and history[end - 1][0] == "user" and history[end - 1][1] in ("", user_text):
        end -= 1
    return history[:end]
