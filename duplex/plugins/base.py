"""The plugin contract: what a model must implement to be served by duplex.

Theory of operation
-------------------
A plugin is one model. The engine owns sessions; the plugin owns *slots*: fixed
indices ``0 .. capabilities.max_sessions - 1`` into its preallocated per-session
model state. The engine maps each session to one slot for the session's whole
life and calls the plugin only from its scheduler (never from a session's code),
so a plugin needs no locks of its own: every method below is called from one
thread at a time, in the order given by its docstring.

The plugin's ``kind`` decides how the engine drives it:

``frame``  ``step(batch)`` once per frame period (80 ms) with every slot that has
           one frame ready, batched across sessions (PersonaPlex, Nemotron).
``unit``   the same with one longer unit (1 s); each output carries a
           speak/listen decision (MiniCPM-o).
``turn``   ``respond(slot, request)`` once per committed user turn; a generator
           that streams output chunks (the embedded default: ASR -> reply -> TTS).
``batch``  requests with no microphone (TTS, diffusion, video generation), stepped
           together: ``begin(request)`` joins a request between steps and
           ``advance(slots)`` takes one step (a decode or denoising step) for every
           active request in one call; each request streams its media chunks and its
           progress, and leaves when its last output sets ``end_of_turn``. A running
           request may take ``interact(interaction)`` calls (a video generator's new
           prompt or camera move), which it applies at its next chunk boundary.

Each kind implements only its own methods: ``FramePlugin`` (``frame`` and
``unit``: ``step``), ``TurnPlugin`` (``respond``) and ``BatchPlugin``
(``begin``/``advance``) extend the common ``Plugin`` (capabilities, lifetime,
slots).

Epochs
------
Every cancel, barge-in or clear advances a session's epoch. The engine tags each
input with the session's current epoch, and ``cancel_slot(slot, epoch)`` tells
the plugin that everything before ``epoch`` is void: drop any pending output
and restart the reply state. A plugin copies the input's epoch into each output
it produces, so the engine can drop output of an older epoch (it does so
whatever the plugin does; the epoch is the fence, not the plugin's goodwill).

Errors
------
A plugin signals a bad request from one session by raising ``PluginError`` with
a code from the wire error table (``invalid_session_config``, ``voice_not_found``
...). Any other exception from ``step`` fails the sessions of that batch with
``server_error``; the engine then calls ``close_slot`` for them, and the other
sessions continue.

Layering: this module imports only numpy, msgspec, the standard library and the
error base of ``duplex.protocol``; it never imports the engine.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import typing
from abc import ABC, abstractmethod
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from typing import ClassVar

import msgspec
import numpy as np

from duplex.protocol.errors import DuplexError

__all__ = [
    "BatchInteraction",
    "BatchPlugin",
    "BatchRequest",
    "CameraControl",
    "Capabilities",
    "FramePlugin",
    "InteractionProgress",
    "Plugin",
    "PluginError",
    "PluginKind",
    "SlotInput",
    "SlotOptions",
    "SlotOutput",
    "TokenUsage",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "TurnPlugin",
    "TurnRequest",
    "unknown_options",
]


class PluginKind(enum.StrEnum):
    """How the engine drives a plugin (see the module docstring)."""

    FRAME = "frame"
    UNIT = "unit"
    TURN = "turn"
    BATCH = "batch"


class Capabilities(msgspec.Struct, frozen=True, kw_only=True):
    """What a plugin can do. The engine, the server, the clients and the benchmarks
    branch on these fields, never on a plugin's name.

    Rates are in Hz. ``chunk_period_ms`` is the frame (``frame``) or unit (``unit``)
    length; ``turn`` and ``batch`` plugins report 0. ``input_sample_rate`` is the
    rate of ``SlotInput.pcm``; the engine resamples client audio to it.
    """

    kind: PluginKind
    chunk_period_ms: int = 0
    input_sample_rate: int = 24000
    output_sample_rate: int = 24000
    max_sessions: int = 1
    # Turn-taking lanes.
    model_native_turns: bool = False  # the model decides when to speak (lane 1)
    supports_server_vad: bool = False  # lane 2
    supports_client_commit: bool = False  # lane 3: commit / response.create
    supports_barge_in: bool = False
    # Session layer features.
    supports_resume: bool = True
    supports_truncate: bool = True
    supports_playback_ack: bool = True
    # Inputs and outputs.
    # The model listens (``input_audio_buffer.append``). None: derived from the kind when the
    # capabilities are built (every kind but ``batch``, whose request carries no audio); always a
    # bool afterwards. A model that takes no audio has its appends and audio commits refused
    # (``invalid_input_modality``), never silently buffered.
    audio_input: bool | None = None
    # The model takes camera frames (``video_frames`` on an append) with its audio: ``frame`` and
    # ``unit`` kinds only (a turn or batch request carries no frames). Frames sent to any other
    # model are refused (``invalid_input_modality``, param ``video_frames``).
    supports_video_input: bool = False
    # The size of camera frame the model works at, in pixels (width x height): it scales every frame
    # to about this area, so a client that sends larger frames spends bandwidth for nothing. Clients
    # scale a larger frame down to it, aspect ratio kept. 0: no preference (``supports_video_input``
    # models only).
    video_frame_max_pixels: int = 0
    # The model reads typed user text: a ``turn`` or ``batch`` model in its request
    # (``TurnRequest.text``, ``BatchRequest.text``), a model that hears the stream with its next frame
    # or unit (``SlotInput.text``). Without it a model that hears the stream refuses typed text
    # (``native_text_append_unsupported``).
    supports_text_input: bool = False
    supports_tools: bool = False
    output_modalities: tuple[str, ...] = ("audio", "text")
    # What a running ``batch`` request takes through ``BatchPlugin.interact``: ``"prompt"`` (a new
    # prompt), ``"camera"`` (a camera move). Empty: the model takes no interaction.
    interactions: tuple[str, ...] = ()
    voices: tuple[str, ...] = ()
    default_voice: str | None = None
    # The slot options (``SlotOptions``) a ``session.update`` may still change once the slot is
    # open: ``"instructions"``, ``"voice"``, ``"tools"``. A model that fixes them when its slot
    # opens (a persona prompt, a voice prompt) leaves them out, and a later change is refused
    # with ``instructions_update_unsupported`` / ``voice_update_unsupported`` /
    # ``tools_update_unsupported`` instead of being silently ignored.
    updatable_options: tuple[str, ...] = ("instructions", "voice", "tools")
    # Session options beyond ``SlotOptions``' typed fields that the plugin reads from
    # ``SlotOptions.extra`` when its slot opens: ``"ref_audio"`` (a reference voice: the bytes of
    # an audio file, a WAV usually), ``"initial_user_text"`` (text that opens the conversation),
    # ``"force_listen_count"`` (listen for the first N units of a turn). A client that sets one the
    # plugin does not read is refused (``invalid_session_config``), never silently ignored.
    session_options: tuple[str, ...] = ()
    # Audio output needs a reference voice: a session that asks for audio without ``ref_audio`` is
    # refused with ``ref_audio_required``.
    requires_ref_audio: bool = False
    # ``instructions`` are the model's persona prompt, fixed when the slot opens: a later change is
    # ``persona_update_unsupported`` (rather than ``instructions_update_unsupported``).
    persona_instructions: bool = False
    # Execution: every call takes microseconds and never blocks, so the engine makes it on the
    # event loop instead of hopping to the model thread (``duplex.engine.model_thread``).
    calls_on_loop: bool = False
    # The sample type of ``SlotInput.pcm`` (``frame``/``unit`` kinds): ``"float32"`` in [-1, 1], or
    # ``"int16"``, the pcm16 samples as the client sent them (after resampling when its rate
    # differs). A model that converts on its accelerator takes int16 and converts a whole batch in
    # one operation; the engine then does no per-frame float conversion on the host.
    input_dtype: str = "float32"
    # Token accounting: the plugin's outputs carry the tokens each step consumed and produced
    # (``SlotOutput.usage``), which responses and sessions report (``response.done`` usage,
    # ``session.closed.usage``) and which hold a response to ``max_output_tokens`` (it ends
    # ``incomplete`` once they reach it). Without it every count a client sees is 0 and a token
    # limit is not applied (the client is told: ``max_output_tokens_not_applied``).
    reports_usage: bool = False

    def __post_init__(self) -> None:
        if self.input_dtype not in ("float32", "int16"):
            raise ValueError(f"input_dtype must be 'float32' or 'int16', not {self.input_dtype!r}")
        if self.input_dtype == "int16" and self.kind not in (PluginKind.FRAME, PluginKind.UNIT):
            raise ValueError("input_dtype 'int16' applies to frame and unit plugins only")
        if self.video_frame_max_pixels < 0:
            raise ValueError(f"video_frame_max_pixels must be >= 0, not {self.video_frame_max_pixels}")
        if self.audio_input is None:
            msgspec.structs.force_setattr(self, "audio_input", self.kind is not PluginKind.BATCH)
        elif self.audio_input and self.kind is PluginKind.BATCH:
            raise ValueError(
                "audio_input applies to frame, unit and turn plugins: a batch request carries no audio"
            )
        if self.supports_video_input and not self.hears_stream:
            raise ValueError(
                "supports_video_input applies to frame and unit plugins only: a turn or batch request "
                "carries no frames"
            )

    @property
    def hears_stream(self) -> bool:
        """The model hears the input as it arrives and decides itself when to speak (``frame``,
        ``unit``); otherwise it answers requests: a committed turn or a ``response.create``
        (``turn``), a text or prompt (``batch``). The one place the session layer derives
        behaviour from the kind."""
        return self.kind in (PluginKind.FRAME, PluginKind.UNIT)

    @property
    def chunk_samples(self) -> int:
        """Input samples per frame or unit at ``input_sample_rate`` (0 for turn/batch)."""
        return self.input_sample_rate * self.chunk_period_ms // 1000


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A function the model may call (``session.tools``, or ``extra_body.realtime_tools``):
    its name, description and JSON-schema parameters (as JSON text)."""

    name: str
    description: str = ""
    parameters: str = "{}"


class ToolResult(msgspec.Struct, frozen=True, kw_only=True):
    """The client's answer to a tool call (a ``function_call_output`` item), for the model."""

    call_id: str
    output: str


class SlotOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What a session fixes when its slot opens: persona and voice, from the session object."""

    instructions: str = ""
    voice: str | None = None
    temperature: float | None = None
    seed: int | None = None
    tools: tuple[ToolSpec, ...] = ()
    extra: dict[str, object] = {}


class SlotInput(msgspec.Struct, kw_only=True):
    """One frame or unit of one session, for ``Plugin.step``.

    ``pcm`` is mono at ``Capabilities.input_sample_rate`` with exactly
    ``Capabilities.chunk_samples`` samples: float32 in [-1, 1], or int16 samples when
    ``Capabilities.input_dtype`` is ``"int16"``. ``padded`` is True when the
    client was late and the engine filled the frame (wholly or partly) with
    silence to keep the model clocked. ``video_frames`` are encoded images (JPEG
    or PNG bytes) that arrived with this chunk, for plugins with video input.
    ``tool_results`` are the client's answers to earlier tool calls that arrived
    since the slot's previous chunk, in order (plugins with ``supports_tools``).
    ``text`` is the user's typed text that arrived since the slot's previous chunk,
    one string per message, in order (plugins with ``supports_text_input``): the
    model reads it before this chunk's audio.
    """

    slot: int
    epoch: int
    pcm: np.ndarray
    padded: bool = False
    video_frames: tuple[bytes, ...] = ()
    tool_results: tuple[ToolResult, ...] = ()
    text: tuple[str, ...] = ()


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A function call the model decided to make; ``arguments`` is a JSON string."""

    call_id: str
    name: str
    arguments: str


class TokenUsage(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """The tokens one step consumed and produced for one slot (``SlotOutput.usage``): the audio,
    camera frames and text it read (``input_*``) and the text and audio tokens it generated
    (``output_*``). Counts are non-negative; a model reports what it can."""

    input_text: int = 0
    input_audio: int = 0
    input_image: int = 0
    output_text: int = 0
    output_audio: int = 0

    def with_prompt(self, prompt_tokens: int) -> TokenUsage:
        """These counts and a prompt's ``prompt_tokens`` text tokens read (a model counts its
        prompt on the first step after its slot opens or restarts)."""
        return msgspec.structs.replace(self, input_text=self.input_text + prompt_tokens)


class InteractionProgress(msgspec.Struct, frozen=True, kw_only=True):
    """Which interactions one video chunk shows, by ``event_id``: ``started`` (the first chunk that
    shows it), ``active`` (every chunk during its transition, the first included) and
    ``completed`` (the chunk that finished its transition). An interaction replaced before it
    started is neither: a later one took its place (last write wins)."""

    started: tuple[str, ...] = ()
    active: tuple[str, ...] = ()
    completed: tuple[str, ...] = ()


class SlotOutput(msgspec.Struct, kw_only=True):
    """What a plugin produced for one slot in one step (or one chunk of a turn).

    Every field is optional; an output with nothing set is valid (the model
    listened). ``pcm`` is mono at ``sample_rate``: float32 in [-1, 1], or int16 samples
    (sent as they are when the session's output is pcm16 at that rate; any plugin may give
    either). ``text`` is a delta of
    the assistant transcript that belongs to this chunk's audio (so truncation can
    cut the transcript at what was heard). ``decision`` is ``"speak"`` or
    ``"listen"`` for model-native plugins. ``end_of_turn`` ends the current
    response. ``user_transcript`` is the text the model heard in the user's last
    turn (ASR), reported once per turn.

    Media of the ``batch`` kind: ``image`` is one generated image (H x W x 3 uint8),
    ``video`` a chunk of generated frames (T x H x W x 3 uint8); ``progress`` is the
    request's completed fraction in [0, 1] after this step (None when the request has no
    end: a video stream that runs until it is stopped). ``chunk_index`` numbers a request's
    video chunks from 0, and ``interactions`` says which interactions (``BatchInteraction``)
    the chunk shows. ``chunk_steps`` is ``(done, total)``: the denoising steps of the chunk being
    made, for a plugin that makes each chunk over many steps (a stream's first chunk can take a
    minute: this is what a viewer can be shown meanwhile). A plugin gives images as arrays; the
    engine's batch driver replaces each by its PNG file (``bytes``) on the model thread, so the
    session never spends the event loop's time encoding one.

    ``usage``: the tokens this step consumed and produced for the slot, from plugins with
    ``Capabilities.reports_usage``.
    """

    slot: int
    epoch: int
    pcm: np.ndarray | None = None
    sample_rate: int = 24000
    text: str = ""
    decision: str | None = None
    end_of_turn: bool = False
    tool_call: ToolCall | None = None
    user_transcript: str | None = None
    image: np.ndarray | bytes | None = None
    video: np.ndarray | None = None
    progress: float | None = None
    usage: TokenUsage | None = None
    chunk_index: int | None = None
    interactions: InteractionProgress | None = None
    chunk_steps: tuple[int, int] | None = None


class TurnRequest(msgspec.Struct, kw_only=True):
    """One committed user turn (``turn`` kind) or one request (``batch`` kind).

    ``pcm`` is the user's audio of the turn (float32 at ``input_sample_rate``),
    ``text`` a text input (a user text item, or a batch prompt), ``history`` the
    conversation as far as the listener heard it: ``(role, text)`` pairs, oldest
    first, ending before this turn. ``max_output_tokens``: the most tokens the reply may produce
    (None: no limit), set only for a plugin with ``Capabilities.reports_usage``; the engine ends the
    response there whatever the plugin does, and a plugin that stops its reply there itself saves
    the work past it.
    """

    slot: int
    epoch: int
    pcm: np.ndarray | None = None
    text: str | None = None
    history: tuple[tuple[str, str], ...] = ()
    instructions: str = ""
    options: dict[str, object] = {}
    max_output_tokens: int | None = None


class BatchRequest(msgspec.Struct, kw_only=True):
    """One request of a ``batch`` plugin: ``text`` is the input (the text to speak, the
    prompt), ``options`` the request's own parameters (voice, speed, size, n, seed,
    steps ...; each plugin documents and validates the ones it takes)."""

    slot: int
    epoch: int
    text: str = ""
    options: dict[str, object] = {}


class CameraControl(msgspec.Struct, frozen=True, kw_only=True):
    """A camera move for a camera-conditioned video generator: a rigid pose in Unity axes (+X right,
    +Y up, +Z forward), ``translation`` ``(x, y, z)`` and ``rotation`` a unit quaternion
    ``(qx, qy, qz, qw)``. ``mode`` ``"target"``: move to that pose (over the interaction's
    ``transition_chunks``); ``"velocity"``: move by that delta every frame until the next move."""

    mode: str
    translation: tuple[float, float, float]
    rotation: tuple[float, float, float, float]


class BatchInteraction(msgspec.Struct, frozen=True, kw_only=True):
    """A change to a running ``batch`` request (``BatchPlugin.interact``), applied by the plugin at
    the request's next chunk boundary: a new ``prompt``, a ``camera`` move, or both.

    ``event_id`` names it in the outputs' ``InteractionProgress``. ``transition_chunks``: over how
    many chunks the change is blended in (0: at once; None: the plugin's default). The plugin
    lists what it takes in ``Capabilities.interactions``.
    """

    slot: int
    epoch: int
    event_id: str
    prompt: str | None = None
    camera: CameraControl | None = None
    transition_chunks: int | None = None


class PluginError(DuplexError):
    """A request the plugin refuses, with a code from the wire error table.

    The engine sends ``error{code, message}`` to the one session concerned and
    leaves the session open unless the error happened while opening its slot.

    ``fatal`` (a class attribute) marks an error after which the session cannot go on with
    this model at all (its worker process died, ``duplex.engine.worker.WorkerFailed``): the
    engine sends the error and then closes the session with the code as the close reason.
    """

    fatal: ClassVar[bool] = False

    def __init__(self, code: str, message: str, *, param: str | None = None) -> None:
        super().__init__(code, message, param=param)


def unknown_options(plugin: str, unknown: Iterable[str], valid: Iterable[str]) -> PluginError:
    """The error ``from_options`` raises for options ``plugin`` does not take: it names them and
    lists the ones it takes (``Plugin.option_defaults``), so a typo can be fixed from the message."""
    return PluginError(
        "invalid_plugin_config",
        f"{plugin}: unknown options {sorted(unknown)}; valid options: {', '.join(sorted(valid))}",
    )


class Plugin(ABC):
    """A model served by duplex. Subclasses set ``name`` and implement the kind's methods.

    Lifetime: the server builds the plugin once with ``from_options``, calls
    ``load()`` before accepting sessions and ``close()`` at shutdown (``with
    plugin:`` does both). Slots are opened and closed between steps, never during
    one. All methods are synchronous and may block (they run on the engine's
    model thread, never on the event loop).
    """

    name: ClassVar[str]

    @classmethod
    def from_options(cls, model_path: str | None = None, **options: object) -> Plugin:
        """Build the plugin from serve-time options (``--model-path``, config file keys).

        Raises ``PluginError("invalid_plugin_config", ...)`` for options it does not know.
        """
        if options:
            raise unknown_options(cls.name, options, cls.option_defaults())
        if model_path is not None:
            raise PluginError("invalid_plugin_config", f"{cls.name} takes no model path")
        return cls()

    @classmethod
    def option_defaults(cls) -> dict[str, object]:
        """The options ``from_options`` takes, each with its default (``duplex plugins NAME``).

        This default reads ``__init__``: its parameters with a default but ``model_path``, and in
        place of a parameter typed as a ``msgspec.Struct`` or a dataclass (a config object), that
        type's fields. A plugin whose ``from_options`` takes other options overrides it.
        """
        hints = typing.get_type_hints(cls.__init__)
        found: dict[str, object] = {}
        for param in list(inspect.signature(cls.__init__).parameters.values())[1:]:
            if param.name == "model_path" or param.default is inspect.Parameter.empty:
                continue
            config = next((t for t in typing.get_args(hints.get(param.name)) if _is_config(t)), None)
            if config is not None:
                found.update(_field_defaults(config))
            else:
                found[param.name] = param.default
        return found

    @abstractmethod
    def capabilities(self) -> Capabilities:
        """The plugin's capabilities; constant after ``load()``."""

    @classmethod
    def write_tiny_checkpoint(cls, directory: str, *, seed: int = 0) -> None:
        """Write a tiny random-weight checkpoint of this model to ``directory``, in the public
        checkpoint's layout (the same file names and tensor keys, tiny shapes), so
        ``--model-path directory`` serves it on a CPU with nothing downloaded
        (``duplex tiny-checkpoint NAME DIR``). Deterministic for a given ``seed``.

        Raises ``PluginError("not_supported")`` for a plugin that loads no weights.
        """
        raise PluginError("not_supported", f"{cls.name} has no checkpoint to write")

    @classmethod
    def prefers_worker(cls, options: Mapping[str, object]) -> bool:
        """Whether the server runs this plugin in a worker process when its configuration does not
        say (``worker:`` unset): a model on an accelerator does (heavy models live in
        workers, so a crash or a leak never takes the server down); a light one does not. The
        default: when ``options`` put it on a CUDA device."""
        return str(options.get("device", "cpu")).startswith("cuda")

    def load(self) -> None:  # noqa: B027 - optional hook
        """Load weights and allocate per-slot state. Called once, before any slot opens."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release everything ``load`` acquired. Called once; the plugin is unusable afterwards."""

    def __enter__(self) -> Plugin:
        self.load()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_slot_index(self, slot: int, max_sessions: int, code: str = "invalid_slot") -> None:
        """Raise ``PluginError(code)`` unless ``0 <= slot < max_sessions``.

        For subclasses, at the top of every method that takes a slot index. The
        engine only hands out slots below ``capabilities().max_sessions``, so an
        index outside that range is a caller's bug; checking it first keeps the
        per-slot arrays from being indexed out of range (or, for a negative
        index, from the end) and gives every plugin the same error for it.
        """
        if not 0 <= slot < max_sessions:
            raise PluginError(code, f"{self.name}: slot {slot} is outside 0..{max_sessions - 1}")

    @abstractmethod
    def open_slot(self, slot: int, options: SlotOptions) -> None:
        """Reset ``slot``'s state for a new session (prompt phases start here).

        Raises ``PluginError`` when the options are refused (unknown voice ...);
        the session is then not opened.
        """

    @abstractmethod
    def cancel_slot(self, slot: int, epoch: int) -> None:
        """Void everything of ``slot`` before ``epoch`` (cancel, barge-in, clear).

        After this call the plugin produces no output tagged with an older epoch.
        """

    @abstractmethod
    def close_slot(self, slot: int) -> None:
        """Free ``slot``; it may be reopened for another session later."""


def _is_config(kind: object) -> bool:
    return isinstance(kind, type) and (issubclass(kind, msgspec.Struct) or dataclasses.is_dataclass(kind))


def _field_defaults(config: type) -> dict[str, object]:
    """The fields of a ``msgspec.Struct`` or dataclass type that have a default, with it."""
    if issubclass(config, msgspec.Struct):
        return {
            f.name: f.default for f in msgspec.structs.fields(config) if f.default is not msgspec.NODEFAULT
        }
    return {f.name: f.default for f in dataclasses.fields(config) if f.default is not dataclasses.MISSING}


class FramePlugin(Plugin):
    """A ``frame`` or ``unit`` plugin: the scheduler steps every slot with a chunk ready, together."""

    @abstractmethod
    def step(self, batch: Sequence[SlotInput]) -> Sequence[SlotOutput]:
        """Advance every slot of ``batch`` by one chunk, together.

        ``batch`` holds at most one input per slot, in no particular order; slots
        not in it are frozen this tick (their state must not change). Returns at
        most one output per input slot. Must not depend on which other slots are
        in the batch: a slot's outputs are the same batched or alone.

        Each ``SlotInput.pcm`` is a fresh array that the plugin owns from then on: it
        may keep it (a delay line) or change it in place. The engine only reads an
        output's ``pcm``, and never after it has encoded it.
        """

    def _check_inputs(self, batch: Sequence[SlotInput], open_slots: Container[int], samples: int) -> None:
        """Raise unless every input of ``batch`` is for a slot of ``open_slots`` (else
        ``invalid_slot``), no slot comes twice (``invalid_batch``) and each ``pcm`` holds
        ``samples`` samples (``bad_audio``). For subclasses, at the top of ``step``: a refused
        batch changes nothing."""
        seen: set[int] = set()
        for item in batch:
            slot = item.slot
            if slot not in open_slots:
                raise PluginError("invalid_slot", f"slot {slot} is not open")
            if slot in seen:
                raise PluginError("invalid_batch", f"slot {slot} appears twice in one batch")
            if item.pcm.shape != (samples,):
                raise PluginError(
                    "bad_audio", f"slot {slot}: expected {samples} samples, got {item.pcm.shape}"
                )
            seen.add(slot)


class TurnPlugin(Plugin):
    """A ``turn`` plugin: one streamed answer per committed user turn."""

    @abstractmethod
    def respond(self, request: TurnRequest) -> Iterator[SlotOutput]:
        """Answer one request, streaming output chunks.

        The engine pulls chunks one at a time and stops pulling (and closes the
        generator) when the response is cancelled, so a plugin should yield
        often: each ``next()`` must be a bounded amount of work (a sentence of
        audio at most), because every session shares the model thread. The last
        chunk sets ``end_of_turn``.
        """


class BatchPlugin(Plugin):
    """A ``batch`` plugin: requests from many sessions stepped together (continuous batching).

    Call order: ``open_slot`` when a session opens; ``begin(request)`` when a request
    of that slot starts (between steps, never during one); ``advance(slots)`` once
    per step with every slot whose request is active; ``cancel_slot(slot, epoch)``
    drops the slot's request at once (it is not in the next ``advance``). Only
    ``interrupt`` is called during a step, from another thread.
    """

    @abstractmethod
    def begin(self, request: BatchRequest) -> None:
        """Start ``request`` on its slot; it joins the next step.

        Raises ``PluginError`` for a request it refuses (empty text, unknown voice or
        size ...); the slot is then idle as before.
        """

    @abstractmethod
    def advance(self, slots: Sequence[int]) -> Sequence[SlotOutput]:
        """One step for every slot in ``slots`` (each with an active request), in one call.

        Returns one output per slot, in any order: a media chunk (``pcm``, ``image``,
        ``video``), ``progress``, or nothing new; the output that ends a request sets
        ``end_of_turn`` and the slot is idle afterwards. A slot's outputs do not depend
        on which other slots share the step.
        """

    def interact(self, interaction: BatchInteraction) -> None:
        """Queue ``interaction`` for its slot's running request; the plugin applies it at the
        request's next chunk boundary (never in the middle of a chunk) and reports it in the
        outputs' ``interactions``. Called between steps, like ``begin``.

        Raises ``PluginError`` when it is refused, with nothing changed: ``interaction_unsupported``
        for what the model does not take (see ``Capabilities.interactions``), ``invalid_interaction``
        for a bad value, ``invalid_slot`` for a slot without a running request.
        """
        raise PluginError("interaction_unsupported", f"{self.name} takes no interactions")

    def interrupt(self, slot: int, epoch: int) -> None:
        """Cut short the work of the slot's request of ``epoch`` in the step in flight.

        Called on the event loop's thread while the model thread may be inside ``begin`` or
        ``advance`` for that request: the engine has already stopped it (its outputs of this step
        are dropped, whatever they are) and calls ``cancel_slot`` or ``close_slot`` on the model
        thread once the step returns; the slot is free only then. It must return at once and
        never raise. The default does nothing, so the step runs to its end: a plugin whose step
        can take long (a TTS piece, a video chunk) overrides it, so that the slot of a client
        who left frees within a fraction of a step.
        """
