"""The MAP Realtime codec: its messages in, the engine's commands out; the engine's events in, its
messages out.

Theory of operation
-------------------
The dialect is a second rendering of the same sessions: nothing here
keeps session state, and the engine never sees the dialect.

* ``decode`` turns one text frame into a ``MapCommand`` (bounded like the OpenAI codec: frame bytes,
  then every field by its type), or raises ``ProtocolError`` with the code the OpenAI codec would
  use (``event_too_large``, ``invalid_json``, ``bad_event``, ``unknown_event``, ``bad_audio``).
* ``session_update`` turns ``session.init`` into the ``session.update`` the session opens with:
  instructions, float32 audio at 16 kHz in and 24 kHz out (the dialect's formats), model-native
  turns, text only when ``tts_enabled`` is false, the reference voice as a WAV data URI, and the
  knobs the engine has no word for kept in ``extra_body``.
* ``engine_command`` turns ``input.append`` into an append (``force_listen`` is the engine's
  ``force_barge_in``: the reply in progress is cancelled, nothing else happens when there is none)
  and ``session.close`` into ``session.close``.
* ``MapRenderer.render`` turns each engine event into its MAP message, or ``None`` for the events
  the dialect has no word for (the item and content-part bookkeeping, ``session.updated``,
  ``rate_limits.updated``, ...): they stay in the session's journal, the MAP client never sees
  them. The table (``RENDERED``) is keyed by event type.
* ``encode`` renders a MAP message as JSON bytes.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from typing import Any, Final

import msgspec

from duplex.protocol._elements import json_exceeds
from duplex.protocol.audio import encode_wav, f32_decode
from duplex.protocol.errors import ProtocolError
from duplex.protocol.ext.commands import (
    DuplexInputAudioBufferAppend,
    DuplexSessionConfig,
    DuplexSessionUpdate,
)
from duplex.protocol.ext.commands import SessionClose as EngineSessionClose
from duplex.protocol.ext.events import (
    DuplexResponseOutputAudioDelta,
    DuplexSessionCreated,
    ResponseListen,
    SessionClosed,
    SessionExpired,
)
from duplex.protocol.formats import AudioFormat, AudioFormatSpec
from duplex.protocol.limits import MAX_EVENT_ELEMENTS
from duplex.protocol.map.commands import InputAppend, MapCommand, MapSessionClose, SessionInit
from duplex.protocol.map.events import (
    MapError,
    MapErrorDetail,
    MapEvent,
    MapInputTokens,
    MapOutputTokens,
    MapResponse,
    MapResponseDone,
    MapResponseListen,
    MapSessionClosed,
    MapSessionCreated,
    MapTranscriptionCompleted,
    MapUsage,
    ResponseOutputAudioDelta,
    ResponseOutputTextDelta,
)
from duplex.protocol.realtime.events import (
    ConversationItemInputAudioTranscriptionCompleted,
    ErrorEvent,
    ResponseDone,
    ResponseOutputAudioTranscriptDelta,
)
from duplex.protocol.realtime.events import ResponseOutputAudioDelta as EngineAudioDelta
from duplex.protocol.realtime.events import ResponseOutputTextDelta as EngineTextDelta
from duplex.protocol.realtime.responses import Usage
from duplex.protocol.realtime.session import AudioConfig, AudioInputConfig, AudioOutputConfig
from duplex.protocol.wire import Command, Event

__all__ = [
    "INPUT_FORMAT",
    "MAP_SUBPROTOCOL",
    "MODES",
    "OUTPUT_FORMAT",
    "RENDERED",
    "MapRenderer",
    "decode",
    "encode",
    "engine_command",
    "session_update",
]

MAP_SUBPROTOCOL: Final = "map.realtime"
"""The WebSocket subprotocol OpenBMB's SDK offers."""
MODES: Final = frozenset({"audio", "video"})
"""The ``mode`` query values of the dialect."""
INPUT_FORMAT: Final = AudioFormat("f32", 16000)
"""``input.append.input.audio``: float32 PCM, mono, 16 kHz."""
OUTPUT_FORMAT: Final = AudioFormat("f32", 24000)
"""``response.output_audio.delta``: float32 PCM, mono, 24 kHz."""
_MAX_BYTES: Final = 15 * 1024 * 1024

_DECODER = msgspec.json.Decoder(MapCommand)


class _Outline(msgspec.Struct):
    """A refused frame's ``type`` alone: every other member is skipped unbuilt, so the value the
    typed decode refused (a number out of range, ``1e999``) cannot hide which message it was."""

    type: object = None


_OUTLINE = msgspec.json.Decoder(_Outline)
_ENCODER = msgspec.json.Encoder()
_TYPES: Final = frozenset({"session.init", "input.append", "session.close"})
_AT: Final = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_CODED: Final = re.compile(r"^(?P<code>[a-z_]+)@(?P<field>[\w.\[\]$-]+): (?P<msg>.*)$", re.DOTALL)


# -- decoding --------------------------------------------------------------------------------------


def decode(data: str | bytes, *, max_bytes: int = _MAX_BYTES) -> MapCommand:
    """One client frame as a ``MapCommand``; raises ``ProtocolError`` (see the module docstring).
    A refused frame changes nothing."""
    size = len(data.encode() if isinstance(data, str) else data)
    if size > max_bytes:
        raise ProtocolError("event_too_large", f"the message is {size} bytes, over {max_bytes}")
    if len(data) > MAX_EVENT_ELEMENTS and json_exceeds(data, MAX_EVENT_ELEMENTS):
        raise ProtocolError(
            "event_too_large", f"the message holds more than {MAX_EVENT_ELEMENTS} elements (its limit)"
        )
    try:
        return _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise _refusal(data, str(exc)) from None
    except msgspec.DecodeError:
        raise ProtocolError("invalid_json", "The frame is not valid JSON") from None
    except RecursionError:
        raise ProtocolError("bad_event", "The message is nested too deeply") from None


def _refusal(data: str | bytes, message: str) -> ProtocolError:
    """The error for a frame that parsed as JSON but not as a MAP message."""
    try:
        kind = _OUTLINE.decode(data).type
    except msgspec.DecodeError:  # not an object (a ValidationError is a DecodeError)
        return ProtocolError("bad_event", "A message must be an object with a string `type`")
    except RecursionError:
        return ProtocolError("bad_event", "The message is nested too deeply")
    if not isinstance(kind, str):
        return ProtocolError("bad_event", "A message must be an object with a string `type`", param="type")
    if kind not in _TYPES:
        known = ", ".join(sorted(_TYPES))
        return ProtocolError("unknown_event", f"Unknown message type {kind!r}; expected one of {known}")
    found = _AT.match(message)
    text, path = (found["msg"], found["path"] or "") if found else (message, "")
    param = path.lstrip(".") or None
    if "base64" in text:
        return ProtocolError("bad_audio", f"{param or 'audio'}: {text}", param=param)
    where = f" at {param}" if param else ""
    return ProtocolError("bad_event", f"Invalid {kind}{where}: {text}", param=param)


# -- onto the engine's vocabulary --------------------------------------------------------------------


def session_update(init: SessionInit, *, text_only: bool = False) -> DuplexSessionUpdate:
    """The ``session.update`` a session opens with (see the module docstring). ``text_only``: the
    model speaks no audio, so the session is text whatever ``tts_enabled`` says. Raises
    ``ProtocolError`` for a reference voice that is not float32 PCM."""
    payload = init.payload
    config = payload.config
    extra: dict[str, Any] = {}
    if config is not None:
        extra.update(
            (key, value)
            for key, value in (
                ("length_penalty", config.length_penalty),
                ("max_kv_tokens", config.max_kv_tokens),
                ("vision_hd", config.vision_hd),
            )
            if value is not None
        )
    if payload.max_slice_nums is not None:
        extra["max_slice_nums"] = payload.max_slice_nums
    tts = config.tts_enabled if config is not None else None
    voice = payload.voice
    ref = None
    if voice is not None:
        pcm = voice.tts_ref_audio_base64 or voice.ref_audio_base64
        ref = _ref_audio_uri(pcm, "payload.voice") if pcm else None
    session = DuplexSessionConfig(
        instructions=payload.system_prompt if payload.system_prompt is not None else payload.instructions,
        output_modalities=["text"] if text_only or tts is False else ["audio"],
        audio=AudioConfig(
            input=AudioInputConfig(format=_spec(INPUT_FORMAT), turn_detection=None),
            output=AudioOutputConfig(format=_spec(OUTPUT_FORMAT)),
        ),
        temperature=config.temperature if config is not None else None,
        max_output_tokens=config.max_tokens if config is not None else None,
        ref_audio=ref,
        extra_body={"map": extra} if extra else None,
    )
    return DuplexSessionUpdate(session=session)


def _spec(fmt: AudioFormat) -> AudioFormatSpec:
    return fmt.to_ga()


def _ref_audio_uri(pcm: bytes, where: str) -> str:
    """Reference audio (float32 PCM, 16 kHz) as the ``data:`` URI of a WAV, as a session's
    ``ref_audio`` is given."""
    try:
        samples = f32_decode(pcm)
    except ProtocolError as exc:
        raise ProtocolError("bad_audio", f"{where}: {exc.message}", param=where) from None
    wav = encode_wav(samples, INPUT_FORMAT.rate, subtype="FLOAT")
    return "data:audio/wav;base64," + base64.b64encode(wav).decode()


def engine_command(cmd: InputAppend | MapSessionClose) -> Command:
    """The engine's command for a MAP message of a running session. Raises ``ProtocolError``
    (``invalid_video_frames`` with the field at fault) for frames the engine refuses."""
    if isinstance(cmd, MapSessionClose):
        return EngineSessionClose(reason=cmd.reason)
    part = cmd.input
    hints = part.hints
    force = part.force_listen or (hints is not None and hints.force_listen)
    try:
        return DuplexInputAudioBufferAppend(
            audio=part.audio,
            video_frames=part.video_frames or None,
            force_barge_in=force,
        )
    except ValueError as exc:  # the append's own checks (``field_error``: "code@field: message")
        found = _CODED.match(str(exc))
        if found is None:
            raise ProtocolError("bad_event", str(exc)) from None
        param = f"input.{found['field']}"
        raise ProtocolError(found["code"], f"{param}: {found['msg']}", param=param) from None


# -- rendering -------------------------------------------------------------------------------------


def _usage(usage: Usage | None) -> MapUsage | None:
    if usage is None:
        return None
    inputs, outputs = usage.input_token_details or {}, usage.output_token_details or {}
    return MapUsage(
        input_tokens=usage.input_tokens or 0,
        output_tokens=usage.output_tokens or 0,
        total_tokens=usage.total_tokens or 0,
        input_token_details=MapInputTokens(
            text_tokens=inputs.get("text_tokens", 0),
            audio_tokens=inputs.get("audio_tokens", 0),
            vision_tokens=inputs.get("image_tokens", 0),
        ),
        output_token_details=MapOutputTokens(
            text_tokens=outputs.get("text_tokens", 0), audio_tokens=outputs.get("audio_tokens", 0)
        ),
    )


class MapRenderer:
    """Engine events as MAP messages for one connection (``mode``: ``audio`` or ``video``)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._table: dict[type, Callable[[MapRenderer, Any], MapEvent | None]] = dict(RENDERED)

    def render(self, event: Event) -> MapEvent | None:
        """The MAP message for ``event``, or ``None`` when the dialect has none for it."""
        kind = type(event)
        fn = self._table.get(kind)
        if fn is None:  # a subclass of a rendered type renders as its base; anything else not at all
            fn = next((RENDERED[base] for base in kind.__mro__ if base in RENDERED), _nothing)
            self._table[kind] = fn
        return fn(self, event)

    def _created(self, event: DuplexSessionCreated) -> MapEvent:
        return MapSessionCreated(session_id=event.session.id or "", mode=self.mode)

    def _audio(self, event: EngineAudioDelta) -> MapEvent:
        rate = getattr(event, "sample_rate_hz", None) or OUTPUT_FORMAT.rate
        return ResponseOutputAudioDelta(response_id=event.response_id, delta=event.delta, sample_rate=rate)

    def _text(self, event: EngineTextDelta | ResponseOutputAudioTranscriptDelta) -> MapEvent | None:
        if not event.delta:
            return None
        return ResponseOutputTextDelta(response_id=event.response_id, delta=event.delta)

    def _listen(self, event: ResponseListen) -> MapEvent:
        return MapResponseListen()

    def _done(self, event: ResponseDone) -> MapEvent:
        r = event.response
        return MapResponseDone(response=MapResponse(id=r.id, status=r.status, usage=_usage(r.usage)))

    def _transcript(self, event: ConversationItemInputAudioTranscriptionCompleted) -> MapEvent | None:
        return MapTranscriptionCompleted(transcript=event.transcript) if event.transcript else None

    def _error(self, event: ErrorEvent) -> MapEvent:
        detail = event.error
        return MapError(error=MapErrorDetail(code=detail.code or "server_error", message=detail.message))

    def _closed(self, event: SessionClosed) -> MapEvent:
        return MapSessionClosed(reason=event.reason, usage=_usage(event.usage))

    def _expired(self, event: SessionExpired) -> MapEvent:
        return MapSessionClosed(reason=event.reason)


def _nothing(renderer: MapRenderer, event: Any) -> None:
    return None


RENDERED: Final[dict[type, Callable[[MapRenderer, Any], MapEvent | None]]] = {
    DuplexSessionCreated: MapRenderer._created,
    EngineAudioDelta: MapRenderer._audio,
    DuplexResponseOutputAudioDelta: MapRenderer._audio,
    ResponseOutputAudioTranscriptDelta: MapRenderer._text,
    EngineTextDelta: MapRenderer._text,
    ResponseListen: MapRenderer._listen,
    ResponseDone: MapRenderer._done,
    ConversationItemInputAudioTranscriptionCompleted: MapRenderer._transcript,
    ErrorEvent: MapRenderer._error,
    SessionClosed: MapRenderer._closed,
    SessionExpired: MapRenderer._expired,
}
"""The engine events the dialect renders, and how; every other event is not sent."""


def encode(event: MapEvent) -> bytes:
    """A MAP message as the UTF-8 JSON payload of a text frame (bytes as base64)."""
    return _ENCODER.encode(event)
