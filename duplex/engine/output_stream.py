"""The assistant's side of a session: responses, their audio on the wire, and what the listener heard.

``OutputStream`` owns the active response, the finished ones a late ack or truncation may still
name (the ``RECENT_RESPONSES`` newest), and the stream state that turns model audio into wire audio:
the output resampler (one per response: a cancelled response's filter tail never leaks into the
next) and, for audio produced faster than real time, the playout queue of each response.

Encoding (``encode``, ``WireAudio``): model audio is resampled to the session's output rate and
encoded to its format; int16 model audio at the session's rate for a pcm16 session is sent as it is.
The HTTP routes of batch models encode their requests' audio with the same ``WireAudio``.

Pacing: a model that answers whole turns (``turn``, ``batch``) produces a sentence of audio in a
fraction of its length. Sent at once, a barge-in one second into playback would find nothing left
to stop, and the history could not know what was heard. With ``lead_ms`` set, such audio is cut into
pieces of at most ``PIECE_MS`` and queued on its response (``Piece``); ``due`` releases the pieces
whose time has come: playback starts with the first piece sent, and a piece goes out once the audio
ahead of it is less than ``lead_ms`` ahead of the listener. A cancel drops what was not sent, and
for a client that never acknowledges playback the history keeps what the listener can have heard
(``PlaybackCursor.commit_all(heard_ms)``). Outputs without audio (text, a tool call, the end of the
turn, a batch model's image, video or progress) wait in the same queue, so they keep their place
behind the audio before them.

Playback truth: ``ack`` (``playback.ack``), ``truncate``
(``conversation.item.truncate``, a truncating ack) and ``commit_history``, which rewrites a
response's assistant item to exactly the text heard as far as ``committed_ms``. The rules are
listed in ``docs/sessions.md``.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Any

import msgspec
import numpy as np

from duplex.engine.conversation import Conversation
from duplex.engine.input import RESAMPLE_QUALITY
from duplex.engine.response import ActiveResponse
from duplex.plugins.base import SlotOutput
from duplex.protocol.audio import StreamResampler, encode_audio, int16_to_float, pcm16_encode
from duplex.protocol.errors import ProtocolError
from duplex.protocol.ext.commands import PlaybackAck
from duplex.protocol.ext.events import PlaybackAckDetails, PlaybackAcknowledged, PlaybackLedger
from duplex.protocol.formats import AudioFormat
from duplex.protocol.ids import new_event_id
from duplex.protocol.realtime.commands import ConversationItemTruncate
from duplex.protocol.realtime.events import ConversationItemTruncated
from duplex.protocol.realtime.items import MessageItem, OutputAudioPart, OutputTextPart
from duplex.protocol.wire import Event

__all__ = ["PIECE_MS", "RECENT_RESPONSES", "OutputStream", "Piece", "WireAudio"]

#: Finished responses kept for late playback acks and truncation.
RECENT_RESPONSES = 16
#: The longest piece of paced audio, in milliseconds: how finely a barge-in can cut a reply.
PIECE_MS = 100.0

_INT16 = np.dtype(np.int16)
_NATIVE_LE = sys.byteorder == "little"


class Piece(msgspec.Struct):
    """One queued part of a paced response: audio (``data``, ``duration_ms``) with the transcript it
    speaks, or an output without audio (``output``: text, a tool call, the end of the turn).

    The transcript of a model chunk rides on its first piece (a listener's captions keep up with
    the audio), and counts as heard only once its ``last`` piece is played (the history never holds
    a sentence the listener did not hear to its end)."""

    data: bytes | None = None
    duration_ms: float = 0.0
    text: str = ""
    last: bool = True
    output: SlotOutput | None = None


def _bytes_per_ms(fmt: AudioFormat) -> float:
    return (
        fmt.rate * (1 if fmt.encoding in ("pcmu", "pcma") else 4 if fmt.encoding == "pcm_f32" else 2) / 1000
    )


class WireAudio:
    """Model audio of one response as wire bytes in one format: one stream resampler for the
    response (created on its first audio that needs it), ended by ``flush``."""

    def __init__(self) -> None:
        self._resampler: StreamResampler | None = None

    def encode(self, pcm: np.ndarray, rate: int, fmt: AudioFormat) -> bytes:
        """Model audio at ``rate`` as wire bytes in ``fmt`` (resampled with this stream's resampler)."""
        if pcm.dtype == _INT16:
            if rate == fmt.rate and fmt.encoding == "pcm16":
                return pcm.tobytes() if _NATIVE_LE else pcm.astype("<i2").tobytes()
            pcm = int16_to_float(pcm)
        if rate != fmt.rate:
            rs = self._resampler
            if rs is None or rs.in_rate != rate or rs.out_rate != fmt.rate:
                rs = self._resampler = StreamResampler(rate, fmt.rate, quality=RESAMPLE_QUALITY)
            pcm = rs.process(pcm)
        # pcm16, the common output format, without encode_audio's dispatch.
        return pcm16_encode(pcm) if fmt.encoding == "pcm16" else encode_audio(pcm, fmt)

    def flush(self, fmt: AudioFormat, *, keep: bool) -> bytes:
        """End the response's resampler: the samples it still held back (a filter delay's worth) as
        wire bytes when ``keep`` (a completed response: the client receives exactly the duration the
        ledger counted), else nothing. The next response starts a fresh stream either way."""
        rs, self._resampler = self._resampler, None
        if rs is None or not keep:
            return b""
        tail = rs.flush()
        if not len(tail):
            return b""
        return pcm16_encode(tail) if fmt.encoding == "pcm16" else encode_audio(tail, fmt)

    def reset(self) -> None:
        """Drop the response's resampler and what it held back."""
        self._resampler = None


class OutputStream:
    """The assistant's side of one session (see the module docstring)."""

    def __init__(self, *, lead_ms: float | None) -> None:
        self.active: ActiveResponse | None = None
        self.recent: deque[ActiveResponse] = deque(maxlen=RECENT_RESPONSES)
        self.lead_ms = lead_ms  # None: not paced
        self._wire = WireAudio()
        self.encode = self._wire.encode  # model audio as wire bytes (``WireAudio.encode``)
        self.flush = self._wire.flush  # the end of a response's audio (``WireAudio.flush``)

    # ------------------------------------------------------------------ pacing

    def queue(
        self, response: ActiveResponse, output: SlotOutput, data: bytes | None, fmt: AudioFormat
    ) -> None:
        """Queue one output of a paced response: its audio cut into pieces of at most ``PIECE_MS``
        (the transcript rides on the first), then the output itself when it carries more than audio."""
        pending = response.pending
        text = output.text
        if data:
            step = max(2, int(_bytes_per_ms(fmt) * PIECE_MS) // 2 * 2)
            total_ms = len(output.pcm) * 1000.0 / output.sample_rate if output.pcm is not None else 0.0
            response.cursor.generate(total_ms)
            for start in range(0, len(data), step):
                piece = data[start : start + step]
                last = start + step >= len(data)
                pending.append(Piece(piece, total_ms * len(piece) / len(data), text, last))
                text = ""
        rest = msgspec.structs.replace(output, pcm=None, text=text)
        if (
            text
            or rest.tool_call is not None
            or rest.end_of_turn
            or rest.decision == "listen"
            or rest.image is not None
            or rest.video is not None
            or rest.progress is not None
        ):
            pending.append(Piece(output=rest))

    def due(self, response: ActiveResponse, now: float) -> tuple[list[Piece], float | None]:
        """The queued pieces whose time has come at ``now``, in order, and when the next one will be
        (``None``: nothing waits). The first audio piece starts the response's playback clock."""
        lead = self.lead_ms or 0.0
        pending = response.pending
        out: list[Piece] = []
        sent = response.cursor.sent_ms
        while pending:
            piece = pending[0]
            if piece.data is not None:
                if response.clock_start is None:
                    response.clock_start = now
                ahead = sent - (now - response.clock_start) * 1000.0
                if ahead >= lead - 1e-3:  # within a microsecond: clock arithmetic, not a gap
                    return out, response.clock_start + (sent - lead) / 1000.0
                sent += piece.duration_ms
            out.append(pending.popleft())
        return out, None

    def backlog_ms(self) -> float:
        """Audio of the active response waiting to be paced out, in milliseconds."""
        active = self.active
        if active is None or not active.pending:
            return 0.0
        return sum(piece.duration_ms for piece in active.pending)

    @staticmethod
    def heard_ms(response: ActiveResponse, now: float) -> float | None:
        """How much of a paced response the listener can have heard by ``now`` (None: not paced)."""
        if response.clock_start is None:
            return None if not response.paced else 0.0
        return (now - response.clock_start) * 1000.0

    # ------------------------------------------------------------------ finished responses

    def retire(self, response: ActiveResponse) -> None:
        """``response`` ended: it stays addressable among the recent ones."""
        response.pending.clear()
        self.active = None
        self.recent.append(response)

    def find(self, response_id: str | None, item_id: str | None) -> ActiveResponse:
        """The response a playback ack names (the newest one when it names none)."""
        candidates = [*self.recent, *([self.active] if self.active else [])]
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

    # ------------------------------------------------------------------ playback truth

    @staticmethod
    def commit_history(response: ActiveResponse, conversation: Conversation) -> bool:
        """Rewrite the response's assistant item to what was heard; True if it changed."""
        if response.item_id not in conversation:
            return False
        old = conversation.get(response.item_id)
        text = response.cursor.committed_text
        part: Any = OutputAudioPart(transcript=text) if response.audio else OutputTextPart(text=text)
        status = "completed" if response.status == "completed" else "incomplete"
        if not response.closed:
            status = "in_progress"
        new = MessageItem(id=response.item_id, role="assistant", content=[part], status=status)  # type: ignore[arg-type]
        conversation.replace(new)
        return new != old

    def ack(
        self,
        cmd: PlaybackAck,
        conversation: Conversation,
        *,
        user_turns: int,
        ack_only: bool,
        session_id: str = "",
        epoch: int = 0,
    ) -> Event:
        """``playback.ack``: move the response's cursors; ``playback.acknowledged`` (its fields
        also under ``event``, with the session, as the seeds' clients read them)."""
        response = self.find(cmd.response_id, cmd.item_id)
        if response.closed and response.user_turn < user_turns:
            raise ProtocolError(
                "playback_ack_too_late",
                f"response {response.response_id} is followed by a newer user turn; its history is fixed",
            )
        response.cursor.ack(cmd.played_ms, cmd.committed_ms, truncate=cmd.truncate)
        changed = self.commit_history(response, conversation) if response.closed or cmd.truncate else False
        if not response.closed and ack_only:
            changed = self.commit_history(response, conversation)
        cur = response.cursor
        ledger = PlaybackLedger(
            generated_ms=cur.generated_ms,
            sent_ms=cur.sent_ms,
            played_ms=cur.played_ms,
            committed_ms=cur.committed_ms,
        )
        details = PlaybackAckDetails(
            type="playback.acknowledged",
            session_id=session_id,
            epoch=epoch,
            response_id=response.response_id,
            item_id=response.item_id,
            played_ms=cur.played_ms,
            committed_ms=cur.committed_ms,
            truncate=cmd.truncate,
            history_committed=changed,
            playback=ledger,
        )
        return PlaybackAcknowledged(
            event_id=new_event_id(),
            response_id=response.response_id,
            item_id=response.item_id,
            played_ms=cur.played_ms,
            committed_ms=cur.committed_ms,
            truncate=cmd.truncate,
            history_committed=changed,
            playback=ledger,
            event=details,
        )

    def truncate(self, cmd: ConversationItemTruncate, conversation: Conversation) -> Event:
        """``conversation.item.truncate``: the client stopped playback of an assistant item there."""
        item = conversation.get(cmd.item_id)
        if not (isinstance(item, MessageItem) and item.role == "assistant"):
            raise ProtocolError(
                "bad_event", f"item {cmd.item_id} is not an assistant message", param="item_id"
            )
        if cmd.content_index != 0:
            raise ProtocolError("bad_event", f"item {cmd.item_id} has no content {cmd.content_index}")
        response = next((r for r in self.recent if r.item_id == cmd.item_id), None)
        if response is None and self.active is not None and self.active.item_id == cmd.item_id:
            response = self.active
        duration = response.cursor.sent_ms if response is not None else 0.0
        if cmd.audio_end_ms < 0 or cmd.audio_end_ms > duration:
            raise ProtocolError(
                "bad_event",
                f"audio_end_ms {cmd.audio_end_ms} is beyond the item's {int(duration)} ms of audio",
                param="audio_end_ms",
            )
        if response is not None:
            response.cursor.ack(cmd.audio_end_ms, cmd.audio_end_ms, truncate=True)
            self.commit_history(response, conversation)
        return ConversationItemTruncated(
            event_id=new_event_id(), item_id=cmd.item_id, content_index=0, audio_end_ms=cmd.audio_end_ms
        )

    def clear(self) -> None:
        """Forget every response (the session ended)."""
        if self.active is not None:
            self.active.pending.clear()
        self.active = None
        self.recent.clear()
        self._wire.reset()
