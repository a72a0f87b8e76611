"""User input into a session: ``input_audio_buffer.append`` and ``commit`` (DESIGN §6).

``append`` applies one decoded append: VAD events become ``speech_started`` /
``speech_stopped`` (the stop commits the turn), audio that overlaps an active
response goes through the overlap policy (``overlap.decide_overlap``, reported
as ``overlap.decision`` when the decision changes, a barge-in cancels the
response), and the audio is fed to a frame/unit model or buffered for a turn
model. ``commit`` applies the commit table (``overlap.decide_commit``). Deferred
turns wait in a bounded queue (``max_pending_turns``); one more is refused with
``input_backpressure`` before anything is committed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from duplex.engine.actions import FeedAudio
from duplex.engine.input import DecodedAppend
from duplex.engine.overlap import CommitAction, decide_commit, decide_overlap
from duplex.engine.settings import Lane
from duplex.engine.transitions import TurnState
from duplex.engine.vad import SpeechStarted, SpeechStopped
from duplex.plugins.base import PluginKind
from duplex.protocol.errors import ProtocolError
from duplex.protocol.ext.events import OverlapDecision, ResponseListen
from duplex.protocol.ids import new_event_id, new_item_id
from duplex.protocol.realtime._base import Event
from duplex.protocol.realtime.commands import InputAudioBufferAppend
from duplex.protocol.realtime.events import (
    ConversationItemAdded,
    ConversationItemDone,
    InputAudioBufferCommitted,
    InputAudioBufferSpeechStarted,
    InputAudioBufferSpeechStopped,
)
from duplex.protocol.realtime.items import InputAudioPart, MessageItem

if TYPE_CHECKING:
    from duplex.engine.session import Session

__all__ = ["append", "commit"]

#: User audio a turn plugin may buffer for one turn, in seconds of model-rate audio.
MAX_TURN_AUDIO_S = 300
#: Plugin kinds whose input is fed to the frame scheduler as it arrives.
_FED_KINDS = frozenset({PluginKind.FRAME, PluginKind.UNIT})


def append(s: Session, cmd: InputAudioBufferAppend, decoded: DecodedAppend, now: float) -> list[Event]:
    events: list[Event] = []
    settings = s.settings
    vad_events = decoded.vad_events
    vad_started = False
    if vad_events:
        for vad_event in vad_events:
            if isinstance(vad_event, SpeechStarted):
                vad_started = True
                s._speech_item_id = new_item_id()
                s.turn_state = TurnState.USER_SPEAKING
                events.append(
                    InputAudioBufferSpeechStarted(
                        event_id=new_event_id(),
                        audio_start_ms=vad_event.audio_start_ms,
                        item_id=s._speech_item_id,
                    )
                )
    if settings.vad is not None:
        is_speech = vad_started or decoded.vad_in_speech
    else:
        hint = getattr(cmd, "is_speech", None)
        is_speech = hint if hint is not None else decoded.rms >= settings.overlap_silence_rms
    action = "listen"
    if s.response is not None:
        if is_speech:
            s._overlap_speech_ms += decoded.duration_ms
        vad = settings.vad
        decision = decide_overlap(
            policy=settings.overlap_policy,
            is_speech=is_speech,
            vad_speech_started=vad_started,
            vad_in_speech=decoded.vad_in_speech,
            overlap_speech_ms=s._overlap_speech_ms,
            short_ack_ms=settings.overlap_short_ack_ms,
            barge_in_ms=settings.overlap_barge_in_ms,
            supports_barge_in=s.caps.supports_barge_in,
            interrupt_response=vad.interrupt_response if vad is not None else True,
        )
        action, reason = decision
        if decision != s._overlap_last:
            s._overlap_last = decision
            events.append(
                OverlapDecision(
                    event_id=new_event_id(),
                    action=action,  # type: ignore[arg-type]
                    reason=reason,
                    policy=settings.overlap_policy,
                    response_id=s.response.response_id,
                    overlap_ms=int(s._overlap_speech_ms),
                    epoch=s.epoch,
                )
            )
        if action == "barge_in":
            events += s._cancel("turn_detected" if vad_started else "barge_in")
    duration_ms = decoded.duration_ms
    s._input_ms += duration_ms
    if is_speech:
        s._speech_ms += duration_ms
    if s.caps.kind in _FED_KINDS:
        s._actions.append(FeedAudio(decoded.pcm, decoded.video_frames, now))
    elif action != "drop":
        if s._turn_samples + len(decoded.pcm) > MAX_TURN_AUDIO_S * s.caps.input_sample_rate:
            raise ProtocolError("input_backpressure", f"a turn holds at most {MAX_TURN_AUDIO_S} s of audio")
        s._turn_audio.append(decoded.pcm)
        s._turn_samples += len(decoded.pcm)
    if not vad_events:
        return events
    for vad_event in vad_events:
        if isinstance(vad_event, SpeechStopped):
            events.append(
                InputAudioBufferSpeechStopped(
                    event_id=new_event_id(),
                    audio_end_ms=vad_event.audio_end_ms,
                    item_id=s._speech_item_id or new_item_id(),
                )
            )
            vad = settings.vad
            events += commit(s, is_speech=True, create_response=vad.create_response if vad else None)
    return events


def commit(s: Session, *, is_speech: bool | None, create_response: bool | None) -> list[Event]:
    if create_response is None:
        create_response = {
            Lane.MODEL_NATIVE: True,
            Lane.SERVER_VAD: s.settings.vad.create_response if s.settings.vad else True,
            Lane.CLIENT: False,
        }[s.lane]
    has_audio = s._input_ms > 0 or s._turn_samples > 0
    action = decide_commit(
        has_audio=has_audio,
        is_speech=is_speech,
        create_response=create_response,
        response_active=s.response is not None,
        overlap_speech_ms=s._overlap_speech_ms,
        short_ack_ms=s.settings.overlap_short_ack_ms,
    )
    if action is CommitAction.DEFER and s.kind is PluginKind.TURN and len(s._deferred) == s._deferred.maxlen:
        raise ProtocolError(
            "input_backpressure", f"{s._deferred.maxlen} turns already wait for the active response to end"
        )
    if action is CommitAction.REJECT_EMPTY:
        raise ProtocolError(
            "input_audio_buffer_empty",
            "input_audio_buffer.commit requires a non-empty input audio buffer",
        )
    item_id = s._speech_item_id or new_item_id()
    s._speech_item_id = None
    item = MessageItem(id=item_id, role="user", content=[InputAudioPart(transcript=None)], status="completed")
    item, previous = s.conversation.add(item)
    s.user_turns += 1
    events: list[Event] = [
        ConversationItemAdded(event_id=new_event_id(), item=item, previous_item_id=previous),
        InputAudioBufferCommitted(event_id=new_event_id(), item_id=item_id, previous_item_id=previous),
        ConversationItemDone(event_id=new_event_id(), item=item, previous_item_id=previous),
    ]
    pcm = np.concatenate(s._turn_audio) if s._turn_audio else None
    s._reset_input()
    if action is CommitAction.SILENT:
        events.append(ResponseListen(event_id=new_event_id(), reason="silence", epoch=s.epoch))
        s.turn_state = TurnState.IDLE if s.response is None else s.turn_state
        return events
    s.turn_state = TurnState.USER_COMMITTED if s.response is None else s.turn_state
    if s.kind is not PluginKind.TURN:
        return events  # frame/unit models hear the audio as it comes and decide themselves
    if action is CommitAction.COMMIT_ONLY:
        s._committed_audio = pcm
    elif action is CommitAction.RESPOND:
        events += s._start_turn(pcm, text=None, metadata=None)
    elif action is CommitAction.DEFER:
        s._deferred.append(s._turn_request(pcm, text=None))
    return events
