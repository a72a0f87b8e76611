"""The user's side of a session: what was said since the last commit, and how it overlaps a response.

``UserTurn`` owns the input state of one session: the audio of the current turn (buffered for a
model that answers whole turns; a model that hears the stream gets it fed instead) and the text
typed into it (``input.text.append``), how much of it was speech, the item id the server VAD gave
the utterance, the overlapping speech while a response plays (and the last ``overlap.decision``
reported), the audio of a commit that waits for a ``response.create``, the turns deferred until the
active response ends, how many turns the user committed, and how many inputs (commits and user
items) no response has begun after yet. It changes only through its methods, and decides nothing
about responses: the session reads ``overlap`` and ``commit_action`` and turns them into events
(``session.Session``).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from duplex.engine.input import DecodedAppend
from duplex.engine.overlap import (
    NO_HINTS,
    CommitAction,
    OverlapAction,
    OverlapHints,
    decide_commit,
    decide_overlap,
    resets_overlap,
)
from duplex.engine.settings import SessionSettings
from duplex.plugins.base import Capabilities, TurnRequest
from duplex.protocol.errors import ProtocolError
from duplex.protocol.ext.events import CommitDetails, OverlapDecision, OverlapDetails
from duplex.protocol.ids import new_event_id, new_item_id

__all__ = ["MAX_TURN_AUDIO_S", "MAX_TURN_TEXT_CHARS", "UserTurn"]

#: User audio a turn may buffer, in seconds of model-rate audio.
MAX_TURN_AUDIO_S = 300
#: Text a turn may hold from ``input.text.append``, in characters.
MAX_TURN_TEXT_CHARS = 131_072


class UserTurn:
    """The input state of one session (see the module docstring)."""

    def __init__(self, sample_rate: int, max_deferred: int) -> None:
        self._max_samples = MAX_TURN_AUDIO_S * sample_rate
        self._audio: list[np.ndarray] = []
        self._samples = 0
        # Audio dropped while a response played (``hold``): its tail leads the next audio kept.
        self._held: deque[np.ndarray] = deque()
        self._held_samples = 0
        self._held_keep = 0
        self._text: list[str] = []
        self._text_chars = 0
        self.input_ms = 0.0  # heard since the last commit
        self.speech_ms = 0.0  # of which speech
        self.speech_item_id: str | None = None  # the utterance the server VAD saw start
        self.overlap_ms = 0.0  # speech heard while the active response plays
        self._last_overlap: tuple[OverlapAction, str] | None = None
        self.committed_audio: np.ndarray | None = None  # a commit that waits for response.create
        self.deferred: deque[TurnRequest] = deque(maxlen=max_deferred)
        self.turns = 0  # user turns committed
        self.inputs = 0  # commits and user items so far
        self.answered = 0  # ``inputs`` when the latest response began

    # ------------------------------------------------------------------ the current turn

    @property
    def has_input(self) -> bool:
        """The current turn holds input: audio heard (or buffered), or typed text."""
        return self.input_ms > 0 or self._samples > 0 or self._text_chars > 0

    @property
    def unanswered(self) -> bool:
        """The user gave input that no response has begun after: a commit or a user item since
        the latest response began, or input in the current turn."""
        return self.inputs > self.answered or self.has_input

    def add_input(self) -> None:
        """A user item entered the conversation (``conversation.item.create``)."""
        self.inputs += 1

    def speech_started(self) -> str:
        """The server VAD saw speech start: a new utterance item id."""
        self.speech_item_id = new_item_id()
        return self.speech_item_id

    def hear(self, decoded: DecodedAppend, is_speech: bool) -> None:
        """Count one append's audio (and its speech) into the current turn."""
        self.input_ms += decoded.duration_ms
        if is_speech:
            self.speech_ms += decoded.duration_ms

    def buffer(self, pcm: np.ndarray) -> None:
        """Keep ``pcm`` for the turn's request, after the tail of what was held just before it
        (``hold``); refused past ``MAX_TURN_AUDIO_S`` (nothing kept)."""
        if self._held:
            held = np.concatenate(self._held)[-self._held_keep :]
            self._drop_held()
            pcm = np.concatenate([held, pcm]) if len(held) else pcm
        if self._samples + len(pcm) > self._max_samples:
            raise ProtocolError("input_backpressure", f"a turn holds at most {MAX_TURN_AUDIO_S} s of audio")
        self._audio.append(pcm)
        self._samples += len(pcm)

    def hold(self, pcm: np.ndarray, keep: int) -> None:
        """Audio the overlap policy dropped while a response played: only its last ``keep``
        samples are kept, and they lead the next audio buffered.

        Speech that interrupts a response is quiet at its onset, and a VAD confirms it only after
        ``min_speech_duration_ms``: the appends before the one that barges in were judged not speech
        and dropped. Without this the interrupting turn began there, its first syllable cut off
        (the default model heard "top, tell me about London" for "Stop, tell me about London")."""
        self._held.append(pcm)
        self._held_samples += len(pcm)
        self._held_keep = keep
        while self._held and self._held_samples - len(self._held[0]) >= keep:
            self._held_samples -= len(self._held.popleft())

    def _drop_held(self) -> None:
        self._held.clear()
        self._held_samples = 0

    def append_text(self, text: str) -> None:
        """Typed text joins the turn; refused past ``MAX_TURN_TEXT_CHARS`` (nothing kept)."""
        if self._text_chars + len(text) > MAX_TURN_TEXT_CHARS:
            raise ProtocolError(
                "input_backpressure", f"a turn holds at most {MAX_TURN_TEXT_CHARS} characters of text"
            )
        self._text.append(text)
        self._text_chars += len(text)

    @property
    def text(self) -> str | None:
        """The text typed into the current turn, or None."""
        return "".join(self._text) if self._text else None

    @property
    def has_audio(self) -> bool:
        """The current turn holds audio (heard or buffered)."""
        return self.input_ms > 0 or self._samples > 0

    def commit(self) -> np.ndarray | None:
        """End the turn (its item is in the conversation): its buffered audio; the next turn
        starts empty (read ``text`` before), its overlapping speech too."""
        pcm = np.concatenate(self._audio) if self._audio else None
        self.speech_item_id = None
        self.overlap_ms = 0.0  # the next turn's overlap with the response counts from here
        self.clear()
        self.turns += 1
        self.inputs += 1
        return pcm

    def clear(self) -> None:
        """Forget the uncommitted input (``input_audio_buffer.clear``, ``input.cancel``, a commit)."""
        self._audio = []
        self._samples = 0
        self._drop_held()
        self._text = []
        self._text_chars = 0
        self.input_ms = 0.0
        self.speech_ms = 0.0

    # ------------------------------------------------------------------ overlap with a response

    def overlap(
        self,
        settings: SessionSettings,
        caps: Capabilities,
        decoded: DecodedAppend,
        *,
        is_speech: bool,
        vad_started: bool,
        vad_in_speech: bool,
        hints: OverlapHints = NO_HINTS,
    ) -> tuple[OverlapAction, str, bool]:
        """The overlap decision for one append heard while a response is active
        (``overlap.decide_overlap``), and whether it differs from the last one reported. A
        decision the client made starts the overlapping speech over (``overlap.resets_overlap``)."""
        if is_speech:
            self.overlap_ms += decoded.duration_ms
        vad = settings.vad
        action, reason = decide_overlap(
            policy=settings.overlap_policy,
            is_speech=is_speech,
            vad_speech_started=vad_started,
            vad_in_speech=vad_in_speech,
            overlap_speech_ms=self.overlap_ms,
            short_ack_ms=settings.overlap_short_ack_ms,
            barge_in_ms=settings.overlap_barge_in_ms,
            supports_barge_in=caps.supports_barge_in,
            interrupt_response=vad.interrupt_response if vad is not None else True,
            hints=hints,
        )
        if resets_overlap(action, reason):
            self.overlap_ms = 0.0
        changed = (action, reason) != self._last_overlap
        self._last_overlap = (action, reason)
        return action, reason, changed

    def decision_event(
        self,
        action: OverlapAction,
        reason: str,
        *,
        settings: SessionSettings,
        decoded: DecodedAppend,
        hints: OverlapHints,
        response_id: str,
        session_id: str,
        epoch: int,
        cancel_reason: str,
    ) -> OverlapDecision:
        """``overlap.decision`` for the decision ``overlap`` just made on ``decoded``
        (``cancel_reason``: what a barge-in cancels the response with)."""
        overlap_ms = int(self.overlap_ms)
        return OverlapDecision(
            event_id=new_event_id(),
            action=action,
            reason=reason,
            policy=settings.overlap_policy,
            response_id=response_id,
            overlap_ms=overlap_ms,
            epoch=epoch,
            session_id=session_id,
            metadata=OverlapDetails(
                duration_ms=int(decoded.duration_ms),
                overlap_speech_ms=overlap_ms,
                buffer_audio=action is not OverlapAction.DROP,
                force_listen=hints.force_listen,
                cancel_reason=cancel_reason if action is OverlapAction.BARGE_IN else None,
            ),
        )

    def response_changed(self, *, began: bool = False) -> None:
        """A response began (``began``) or ended: overlapping speech counts from zero again; a
        response that begins answers every input so far."""
        self.overlap_ms = 0.0
        self._last_overlap = None
        if began:
            self.answered = self.inputs

    def commit_details(
        self, action: CommitAction, *, session_id: str, epoch: int, stream: bool
    ) -> CommitDetails:
        """What became of the commit just made with ``action`` (``input_audio_buffer.committed``'s
        ``event``). ``stream``: the model hears the stream and decides itself, so nothing waits."""
        deferred = action is CommitAction.DEFER and not stream
        return CommitDetails(
            type="input.committed",
            session_id=session_id,
            turn_id=self.turns,
            epoch=epoch,
            response_create_deferred=deferred,
            overlap_deferred=deferred,
            no_response=action in (CommitAction.SILENT, CommitAction.ACK_ONLY, CommitAction.COMMIT_ONLY),
            overlap_ack=True if action is CommitAction.ACK_ONLY else None,
            is_speech=False if action is CommitAction.SILENT else None,
        )

    def commit_action(
        self,
        settings: SessionSettings,
        *,
        is_speech: bool | None,
        create_response: bool,
        response_active: bool,
    ) -> CommitAction:
        """The row of the commit table for a commit now (``overlap.decide_commit``)."""
        return decide_commit(
            has_audio=self.has_input,
            is_speech=is_speech,
            create_response=create_response,
            response_active=response_active,
            overlap_speech_ms=self.overlap_ms,
            short_ack_ms=settings.overlap_short_ack_ms,
        )

    def reset(self) -> None:
        """Forget everything (the session ended)."""
        self.clear()
        self.deferred.clear()
        self.committed_audio = None
