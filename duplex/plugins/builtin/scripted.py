"""Scripted ``unit``, ``turn`` and ``batch`` plugins: real plugins whose replies come from a script.

They exercise every engine path that a real model reaches (speak/listen decisions,
end of turn, streamed turn replies, tool calls, cancellation) with fully
predictable output, so tests can assert exact event sequences.

``ScriptedUnitPlugin`` (kind ``unit``, 1 s units, 16 kHz in, 24 kHz out) walks its
script one step per unit and per slot, cycling at the end:

* ``"listen"``: the unit's output says ``listen`` and has no audio;
* ``"speak:<text>"``: one unit of tone audio with transcript ``<text>``, ``speak``;
* ``"end:<text>"``: the same, and the output ends the turn.

A cancel skips the rest of the reply in progress (up to the next ``listen`` step). Every
output reports its tokens (``Capabilities.reports_usage``), by a fixed rule so tests can assert
them: each unit heard is ``AUDIO_TOKENS_PER_UNIT`` audio tokens and each camera frame with it
``IMAGE_TOKENS_PER_FRAME`` image tokens; a speaking unit produces one text token per word of
its transcript and ``AUDIO_TOKENS_PER_UNIT`` audio tokens.

``ScriptedTurnPlugin`` (kind ``turn``) answers the n-th request of a slot with the
n-th script entry (cycling). A reply text is streamed one word per chunk, each
chunk ``ms_per_char`` ms of tone per character; the last chunk sets
``end_of_turn``. ``{text}`` in a reply is replaced by the request's text, and an
entry ``"tool:<name>:<json arguments>"`` answers with one tool call instead. With
``reports_usage`` each chunk reports one output text token (its word); the plugin never stops a
reply at ``TurnRequest.max_output_tokens`` itself, so the engine's own cut is what a test sees.

``ScriptedBatchPlugin`` (kind ``batch``) speaks a request's text one word per step:
``advance(slots)`` gives every active request its next word (``ms_per_char`` ms of
tone per character, with the word as transcript and ``progress`` = words done /
words), the last word ends the request. Requests of different lengths and start
times share every step, as a batched decoder's would; ``steps`` counts the calls
and ``batch_sizes`` their sizes. An empty text is refused (``response_create_without_input``),
and so is an option ``voice`` other than ``"tone"``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from duplex.plugins.base import (
    BatchPlugin,
    BatchRequest,
    Capabilities,
    FramePlugin,
    PluginError,
    PluginKind,
    SlotInput,
    SlotOptions,
    SlotOutput,
    TokenUsage,
    ToolCall,
    TurnPlugin,
    TurnRequest,
    unknown_options,
)

__all__ = ["ScriptedBatchPlugin", "ScriptedTurnPlugin", "ScriptedUnitPlugin", "tone"]

OUTPUT_RATE = 24000


def tone(
    duration_ms: float, rate: int = OUTPUT_RATE, freq_hz: float = 220.0, level: float = 0.1
) -> np.ndarray:
    """A float32 sine of ``duration_ms`` at ``rate``: audible, deterministic model audio."""
    n = int(rate * duration_ms / 1000)
    t = np.arange(n, dtype=np.float32) / rate
    return (level * np.sin(2 * np.pi * freq_hz * t)).astype(np.float32)


def _options(cls_name: str, model_path: str | None, options: dict[str, object], known: set[str]) -> None:
    if model_path is not None:
        raise PluginError("invalid_plugin_config", f"{cls_name} takes no model path")
    unknown = sorted(set(options) - known)
    if unknown:
        raise unknown_options(cls_name, unknown, known)


class ScriptedUnitPlugin(FramePlugin):
    """See the module docstring."""

    name = "scripted-unit"
    UNIT_MS = 1000
    INPUT_RATE = 16000
    AUDIO_TOKENS_PER_UNIT = 25
    IMAGE_TOKENS_PER_FRAME = 64

    DEFAULT_SCRIPT: tuple[str, ...] = ("listen", "speak:Hello there, ", "end:how can I help?", "listen")

    def __init__(self, script: Sequence[str] = DEFAULT_SCRIPT, max_sessions: int = 64) -> None:
        steps = []
        for step in script:
            kind, _, text = step.partition(":")
            if kind not in ("listen", "speak", "end"):
                raise PluginError("invalid_plugin_config", f"scripted-unit: bad step {step!r}")
            steps.append((kind, text))
        if not steps:
            raise PluginError("invalid_plugin_config", "scripted-unit: empty script")
        self.steps = tuple(steps)
        self.max_sessions = max_sessions
        self._unit_audio = tone(self.UNIT_MS)

    @classmethod
    def from_options(cls, model_path: str | None = None, **options: object) -> ScriptedUnitPlugin:
        _options(cls.name, model_path, options, {"script", "max_sessions"})
        return cls(**options)  # type: ignore[arg-type]

    def capabilities(self) -> Capabilities:
        return Capabilities(
            kind=PluginKind.UNIT,
            chunk_period_ms=self.UNIT_MS,
            input_sample_rate=self.INPUT_RATE,
            output_sample_rate=OUTPUT_RATE,
            max_sessions=self.max_sessions,
            model_native_turns=True,
            supports_client_commit=True,
            supports_barge_in=True,
            supports_video_input=True,
            reports_usage=True,
        )

    def load(self) -> None:
        self._pos = [0] * self.max_sessions
        self._epoch = [0] * self.max_sessions
        self._open = [False] * self.max_sessions

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        self._check_slot_index(slot, self.max_sessions)
        self._pos[slot] = 0
        self._epoch[slot] = 0
        self._open[slot] = True

    def cancel_slot(self, slot: int, epoch: int) -> None:
        self._check_slot_index(slot, self.max_sessions)
        self._epoch[slot] = epoch
        # Skip the rest of the reply in progress.
        for _ in range(len(self.steps)):
            if self.steps[self._pos[slot] % len(self.steps)][0] == "listen":
                break
            self._pos[slot] += 1

    def close_slot(self, slot: int) -> None:
        self._check_slot_index(slot, self.max_sessions)
        self._open[slot] = False

    def step(self, batch: Sequence[SlotInput]) -> Sequence[SlotOutput]:
        outputs = []
        for item in batch:
            self._check_slot_index(item.slot, self.max_sessions)
            assert item.pcm.shape == (self.INPUT_RATE * self.UNIT_MS // 1000,), (
                f"scripted-unit: slot {item.slot} unit shape {item.pcm.shape}"
            )
            kind, text = self.steps[self._pos[item.slot] % len(self.steps)]
            self._pos[item.slot] += 1
            heard = {
                "input_audio": self.AUDIO_TOKENS_PER_UNIT,
                "input_image": self.IMAGE_TOKENS_PER_FRAME * len(item.video_frames),
            }
            if kind == "listen":
                usage = TokenUsage(**heard)
                outputs.append(SlotOutput(slot=item.slot, epoch=item.epoch, decision="listen", usage=usage))
            else:
                usage = TokenUsage(
                    **heard, output_text=len(text.split()), output_audio=self.AUDIO_TOKENS_PER_UNIT
                )
                outputs.append(
                    SlotOutput(
                        slot=item.slot,
                        epoch=item.epoch,
                        pcm=self._unit_audio,
                        sample_rate=OUTPUT_RATE,
                        text=text,
                        decision="speak",
                        end_of_turn=kind == "end",
                        usage=usage,
                    )
                )
        return outputs


class ScriptedTurnPlugin(TurnPlugin):
    """See the module docstring."""

    name = "scripted-turn"
    INPUT_RATE = 16000

    DEFAULT_SCRIPT: tuple[str, ...] = ("Sure, I can help with that.", "You said: {text}")

    def __init__(
        self,
        script: Sequence[str] = DEFAULT_SCRIPT,
        max_sessions: int = 64,
        ms_per_char: int = 60,
        reports_usage: bool = False,
    ):
        if not script:
            raise PluginError("invalid_plugin_config", "scripted-turn: empty script")
        self.script = tuple(script)
        self.max_sessions = max_sessions
        self.ms_per_char = ms_per_char
        self.reports_usage = reports_usage

    @classmethod
    def from_options(cls, model_path: str | None = None, **options: object) -> ScriptedTurnPlugin:
        _options(cls.name, model_path, options, {"script", "max_sessions", "ms_per_char", "reports_usage"})
        return cls(**options)  # type: ignore[arg-type]

    def capabilities(self) -> Capabilities:
        return Capabilities(
            kind=PluginKind.TURN,
            reports_usage=self.reports_usage,
            input_sample_rate=self.INPUT_RATE,
            output_sample_rate=OUTPUT_RATE,
            max_sessions=self.max_sessions,
            supports_server_vad=True,
            supports_client_commit=True,
            supports_barge_in=True,
            supports_text_input=True,
            supports_tools=True,
        )

    def load(self) -> None:
        self._turns = [0] * self.max_sessions
        self._epoch = [0] * self.max_sessions

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        self._check_slot_index(slot, self.max_sessions)
        self._turns[slot] = 0
        self._epoch[slot] = 0

    def cancel_slot(self, slot: int, epoch: int) -> None:
        self._check_slot_index(slot, self.max_sessions)
        self._epoch[slot] = epoch

    def close_slot(self, slot: int) -> None:
        self._check_slot_index(slot, self.max_sessions)

    def respond(self, request: TurnRequest) -> Iterator[SlotOutput]:
        self._check_slot_index(request.slot, self.max_sessions)
        n = self._turns[request.slot]
        self._turns[request.slot] = n + 1
        entry = self.script[n % len(self.script)]
        slot, epoch = request.slot, request.epoch
        if entry.startswith("tool:"):
            _, name, arguments = entry.split(":", 2)
            call = ToolCall(call_id=f"call_{slot}_{n}", name=name, arguments=arguments)
            yield SlotOutput(slot=slot, epoch=epoch, tool_call=call, end_of_turn=True)
            return
        words = entry.replace("{text}", request.text or "").split() or ["..."]
        usage = TokenUsage(output_text=1) if self.reports_usage else None
        for i, word in enumerate(words):
            text = word if i == len(words) - 1 else word + " "
            yield SlotOutput(
                slot=slot,
                epoch=epoch,
                pcm=tone(self.ms_per_char * len(text)),
                sample_rate=OUTPUT_RATE,
                text=text,
                end_of_turn=i == len(words) - 1,
                usage=usage,
            )


class ScriptedBatchPlugin(BatchPlugin):
    """See the module docstring."""

    name = "scripted-batch"

    def __init__(self, max_sessions: int = 64, ms_per_char: int = 60) -> None:
        self.max_sessions = max_sessions
        self.ms_per_char = ms_per_char
        self.steps = 0
        self.batch_sizes: list[int] = []

    @classmethod
    def from_options(cls, model_path: str | None = None, **options: object) -> ScriptedBatchPlugin:
        _options(cls.name, model_path, options, {"max_sessions", "ms_per_char"})
        return cls(**options)  # type: ignore[arg-type]

    def capabilities(self) -> Capabilities:
        return Capabilities(
            kind=PluginKind.BATCH,
            audio_input=False,
            output_sample_rate=OUTPUT_RATE,
            max_sessions=self.max_sessions,
            supports_text_input=True,
            supports_barge_in=True,
            voices=("tone",),
            default_voice="tone",
        )

    def load(self) -> None:
        self._words: list[list[str]] = [[] for _ in range(self.max_sessions)]
        self._done = [0] * self.max_sessions
        self._epoch = [0] * self.max_sessions

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        self._check_slot_index(slot, self.max_sessions)
        self._words[slot] = []

    def cancel_slot(self, slot: int, epoch: int) -> None:
        self._check_slot_index(slot, self.max_sessions)
        self._words[slot] = []
        self._epoch[slot] = epoch

    def close_slot(self, slot: int) -> None:
        self._check_slot_index(slot, self.max_sessions)
        self._words[slot] = []

    def begin(self, request: BatchRequest) -> None:
        self._check_slot_index(request.slot, self.max_sessions)
        words = request.text.split()
        if not words:
            raise PluginError("response_create_without_input", "scripted-batch: the text is empty")
        voice = request.options.get("voice", "tone")
        if voice not in (None, "tone"):
            raise PluginError("voice_not_found", f"scripted-batch: unknown voice {voice!r}")
        self._words[request.slot] = words
        self._done[request.slot] = 0
        self._epoch[request.slot] = request.epoch

    def advance(self, slots: Sequence[int]) -> Sequence[SlotOutput]:
        self.steps += 1
        self.batch_sizes.append(len(slots))
        outputs = []
        for slot in slots:
            words = self._words[slot]
            if not words:
                raise PluginError("invalid_slot", f"scripted-batch: slot {slot} has no request")
            i = self._done[slot]
            self._done[slot] = i + 1
            last = i + 1 == len(words)
            text = words[i] if last else words[i] + " "
            outputs.append(
                SlotOutput(
                    slot=slot,
                    epoch=self._epoch[slot],
                    pcm=tone(self.ms_per_char * len(text)),
                    sample_rate=OUTPUT_RATE,
                    text=text,
                    progress=(i + 1) / len(words),
                    end_of_turn=last,
                )
            )
            if last:
                self._words[slot] = []
        return outputs
