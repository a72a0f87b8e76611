"""Model output into a session: open, extend and end responses (``Session.on_output``).

A ``frame``/``unit`` model opens a response with its first audio or text (the
pending ``response.create`` metadata, if any, rides on it); a ``listen`` decision
without a response is ``response.listen``; a ``listen`` without content during a
response ends it (``model_listen``), ``end_of_turn`` ends it (``stop``). Output of
an old epoch, or a turn chunk whose response already ended, is dropped and counted
(``Session.stale_outputs``). Audio is resampled to the session's output rate and
encoded to its output format here (``protocol.audio``); int16 output at the session's rate
for a pcm16 session is sent as it is (no float round trip).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from duplex.engine.input import RESAMPLE_QUALITY
from duplex.engine.response import ActiveResponse
from duplex.plugins.base import PluginKind, SlotOutput
from duplex.protocol.audio import StreamResampler, encode_audio, int16_to_float, pcm16_encode
from duplex.protocol.ext.events import ResponseListen
from duplex.protocol.ids import new_event_id
from duplex.protocol.realtime._base import Event
from duplex.protocol.realtime.events import ConversationItemInputAudioTranscriptionCompleted
from duplex.protocol.realtime.items import InputAudioPart, MessageItem

if TYPE_CHECKING:
    from duplex.engine.session import Session

__all__ = ["on_output"]

_INT16 = np.dtype(np.int16)
_NATIVE_LE = sys.byteorder == "little"


def on_output(s: Session, output: SlotOutput, now: float) -> list[Event]:
    """Apply one model output; stale or unwanted output is dropped and counted."""
    response = s.response
    pcm = output.pcm
    if (
        response is not None
        and pcm is not None
        and output.epoch == s.epoch
        and not s.closed
        and response.message_open
        and response.audio
        and not output.end_of_turn
        and output.tool_call is None
        and output.user_transcript is None
        and (response.speak_sent or output.decision != "speak")
    ):
        fmt = s.settings.output_format
        rate = output.sample_rate
        if rate == fmt.rate and fmt.encoding == "pcm16" and len(pcm):
            # The per-frame case: one more audio delta (and its text) of the open message, at
            # the session's rate in pcm16: exactly what ``apply_output`` gives for it.
            if pcm.dtype == _INT16:
                data = pcm.tobytes() if _NATIVE_LE else pcm.astype("<i2").tobytes()
            else:
                data = pcm16_encode(pcm)
            s.audio_started = True
            text = output.text
            events = [response.audio_delta(data, len(pcm) * 1000.0 / rate, text)]
            if text:
                events.append(response.transcript_delta(text))
            return s._journal(events, now)
    return apply_output(s, output, now)


def apply_output(s: Session, output: SlotOutput, now: float) -> list[Event]:
    """``on_output`` for every case (``on_output`` takes a shortcut for the per-frame one)."""
    if s.closed or output.epoch != s.epoch:
        s.stale_outputs += 1
        return []
    response = s.response
    pcm = output.pcm
    events: list[Event] = []
    if output.user_transcript is not None:
        events += user_transcript(s, output.user_transcript)
    pcm = pcm if pcm is not None and len(pcm) else None
    has_content = pcm is not None or bool(output.text) or output.tool_call is not None
    if response is None:
        if has_content and s.kind is not PluginKind.TURN:
            metadata, s._pending_metadata = s._pending_metadata, None
            events += s._open_response(metadata)
            response = s.response
        elif output.decision == "listen" and not output.end_of_turn:
            events.append(ResponseListen(event_id=new_event_id(), epoch=s.epoch))
            return s._journal(events, now)
        elif has_content:
            s.stale_outputs += 1  # a turn chunk after its response ended
            return s._journal(events, now)
    if response is not None:
        if pcm is not None or output.text:
            events += chunk(s, response, output, pcm)
        if output.tool_call is not None:
            events += response.add_tool_call(output.tool_call, previous_id(s))
            store_new_items(s, response)
        if output.end_of_turn:
            events += s._finish("completed", "stop")
        elif output.decision == "listen" and (pcm is None and not output.text):
            events += s._finish("completed", "model_listen")
            events.append(ResponseListen(event_id=new_event_id(), epoch=s.epoch))
    return s._journal(events, now)


def previous_id(s: Session) -> str | None:
    return s.conversation.last_id


def store_new_items(s: Session, response: ActiveResponse) -> None:
    for item, previous in response.new_items:
        if getattr(item, "id", None) not in s.conversation:
            s.conversation.add(item, previous)
    response.new_items.clear()


def chunk(s: Session, response: ActiveResponse, output: SlotOutput, pcm: np.ndarray | None) -> list[Event]:
    audio_bytes = None
    duration_ms = 0.0
    if pcm is not None and response.audio:
        fmt = s.settings.output_format
        rate = output.sample_rate
        duration_ms = len(pcm) * 1000.0 / rate
        if pcm.dtype == _INT16:
            if rate == fmt.rate and fmt.encoding == "pcm16":
                s.audio_started = True
                data = pcm.tobytes() if _NATIVE_LE else pcm.astype("<i2").tobytes()
                return _add_chunk(s, response, output, data, duration_ms)
            pcm = int16_to_float(pcm)
        if rate != fmt.rate:
            rs = s._out_resampler
            if rs is None or rs.in_rate != rate or rs.out_rate != fmt.rate:
                rs = s._out_resampler = StreamResampler(rate, fmt.rate, quality=RESAMPLE_QUALITY)
            pcm = rs.process(pcm)
        # pcm16, the common output format, without encode_audio's dispatch.
        audio_bytes = pcm16_encode(pcm) if fmt.encoding == "pcm16" else encode_audio(pcm, fmt)
        s.audio_started = True
    return _add_chunk(s, response, output, audio_bytes, duration_ms)


def _add_chunk(
    s: Session, response: ActiveResponse, output: SlotOutput, audio_bytes: bytes | None, duration_ms: float
) -> list[Event]:
    events = response.add_chunk(
        audio_bytes=audio_bytes,
        duration_ms=duration_ms,
        text=output.text,
        speak=output.decision == "speak",
        # Only the chunk that opens the message reads it (the conversation's last item).
        previous_item_id=None if response.message_open else previous_id(s),
    )
    if response.new_items:
        store_new_items(s, response)
    return events


def flush_audio(s: Session, response: ActiveResponse, *, completed: bool) -> list[Event]:
    """End the response's output resampler: a completed response gets the samples the resampler
    still held back (a filter delay's worth) as one last audio delta, so the client receives
    exactly the duration the ledger counted; a cancelled one drops them. Either way the next
    response starts a fresh stream, so no tail of this one leaks into it.

    The tail's duration was already counted with the chunks it came from, so it adds none.
    """
    rs, s._out_resampler = s._out_resampler, None
    if rs is None or not completed or not response.audio or not response.message_open:
        return []
    tail = rs.flush()
    if not len(tail):
        return []
    fmt = s.settings.output_format
    audio_bytes = pcm16_encode(tail) if fmt.encoding == "pcm16" else encode_audio(tail, fmt)
    return response.add_chunk(
        audio_bytes=audio_bytes, duration_ms=0.0, text="", speak=False, previous_item_id=None
    )


def user_transcript(s: Session, transcript: str) -> list[Event]:
    for item_id in reversed(s.conversation.ids()):
        item = s.conversation.get(item_id)
        if isinstance(item, MessageItem) and item.role == "user":
            s.conversation.replace(
                msgspec.structs.replace(item, content=[InputAudioPart(transcript=transcript)])
            )
            return [
                ConversationItemInputAudioTranscriptionCompleted(
                    event_id=new_event_id(), item_id=item_id, content_index=0, transcript=transcript
                )
            ]
    return []
