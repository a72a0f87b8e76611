"""Playback acknowledgements, truncation and the honest history (DESIGN §6, ``wire_protocol.md`` §11.7).

Functions of the sans-IO ``Session`` (they read and change its state and return its
events, never journaled here): ``playback_ack`` (``playback.ack``), ``truncate``
(``conversation.item.truncate``, a truncating ack) and ``commit_history``, which
rewrites a response's assistant item to exactly the text heard as far as
``committed_ms`` (``ledger.PlaybackCursor.committed_text``). The rules are listed
in ``docs/sessions.md``. Finished responses stay addressable while they are among
the session's ``RECENT_RESPONSES`` newest (older ones answer ``playback_item_not_found``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from duplex.engine.response import ActiveResponse
from duplex.protocol.errors import ProtocolError
from duplex.protocol.ext.commands import PlaybackAck
from duplex.protocol.ext.events import PlaybackAcknowledged, PlaybackLedger
from duplex.protocol.ids import new_event_id
from duplex.protocol.realtime._base import Event
from duplex.protocol.realtime.commands import ConversationItemTruncate
from duplex.protocol.realtime.events import ConversationItemTruncated
from duplex.protocol.realtime.items import MessageItem, OutputAudioPart, OutputTextPart

if TYPE_CHECKING:
    from duplex.engine.session import Session

__all__ = ["commit_history", "find_response", "playback_ack", "truncate"]


def commit_history(s: Session, response: ActiveResponse) -> bool:
    """Rewrite the response's assistant item to what was heard; True if it changed."""
    if response.item_id not in s.conversation:
        return False
    old = s.conversation.get(response.item_id)
    text = response.cursor.committed_text
    part: Any = OutputAudioPart(transcript=text) if response.audio else OutputTextPart(text=text)
    status = "completed" if response.status == "completed" else "incomplete"
    if not response.closed:
        status = "in_progress"
    new = MessageItem(id=response.item_id, role="assistant", content=[part], status=status)  # type: ignore[arg-type]
    s.conversation.replace(new)
    return new != old


def find_response(s: Session, response_id: str | None, item_id: str | None) -> ActiveResponse:
    candidates = [*s.recent, *([s.response] if s.response else [])]
    if response_id is not None:
        for r in candidates:
            if r.response_id == response_id:
                if item_id is not None and item_id != r.item_id:
                    raise ProtocolError(
                        "playback_item_mismatch",
                        f"item {item_id} is not the item of response {response_id}",
                    )
                return r
        raise ProtocolError("playback_item_not_found", f"no response {response_id} to acknowledge")
    if item_id is not None:
        for r in candidates:
            if r.item_id == item_id:
                return r
        raise ProtocolError("playback_item_not_found", f"no response item {item_id} to acknowledge")
    if not candidates:
        raise ProtocolError("playback_item_not_found", "there is no response to acknowledge")
    return candidates[-1]


def playback_ack(s: Session, cmd: PlaybackAck) -> list[Event]:
    response = find_response(s, cmd.response_id, cmd.item_id)
    if response.closed and response.user_turn < s.user_turns:
        raise ProtocolError(
            "playback_ack_too_late",
            f"response {response.response_id} is followed by a newer user turn; its history is fixed",
        )
    response.cursor.ack(cmd.played_ms, cmd.committed_ms, truncate=cmd.truncate)
    changed = commit_history(s, response) if response.closed or cmd.truncate else False
    if not response.closed and s.settings.playback_commit_policy == "ack_only":
        changed = commit_history(s, response)
    cur = response.cursor
    return [
        PlaybackAcknowledged(
            event_id=new_event_id(),
            response_id=response.response_id,
            item_id=response.item_id,
            played_ms=cur.played_ms,
            committed_ms=cur.committed_ms,
            truncate=cmd.truncate,
            history_committed=changed,
            playback=PlaybackLedger(
                generated_ms=cur.generated_ms,
                sent_ms=cur.sent_ms,
                played_ms=cur.played_ms,
                committed_ms=cur.committed_ms,
            ),
        )
    ]


def truncate(s: Session, cmd: ConversationItemTruncate) -> list[Event]:
    if not s.caps.supports_truncate:
        raise ProtocolError("bad_event", "this model does not support truncation")
    item = s.conversation.get(cmd.item_id)
    if not (isinstance(item, MessageItem) and item.role == "assistant"):
        raise ProtocolError("bad_event", f"item {cmd.item_id} is not an assistant message", param="item_id")
    if cmd.content_index != 0:
        raise ProtocolError("bad_event", f"item {cmd.item_id} has no content {cmd.content_index}")
    response = next((r for r in s.recent if r.item_id == cmd.item_id), None)
    if response is None and s.response is not None and s.response.item_id == cmd.item_id:
        response = s.response
    duration = response.cursor.sent_ms if response is not None else 0.0
    if cmd.audio_end_ms < 0 or cmd.audio_end_ms > duration:
        raise ProtocolError(
            "bad_event",
            f"audio_end_ms {cmd.audio_end_ms} is beyond the item's {int(duration)} ms of audio",
            param="audio_end_ms",
        )
    if response is not None:
        response.cursor.ack(cmd.audio_end_ms, cmd.audio_end_ms, truncate=True)
        commit_history(s, response)
    return [
        ConversationItemTruncated(
            event_id=new_event_id(), item_id=cmd.item_id, content_index=0, audio_end_ms=cmd.audio_end_ms
        )
    ]
