"""Overlap policy and the commit-to-response table: pure decisions, no state.

Overlap: user audio that arrives while a response is
active. ``decide_overlap`` returns ``(action, reason)`` with action ``drop``,
``listen`` or ``barge_in``. The client's hints on the append come first, then the
audio itself, in this order:

1. the append asks for a barge-in (``overlap_action: barge_in``, or ``force_barge_in``)
   the model cannot do                     -> ``listen`` / ``barge_in_unsupported``
2. ``overlap_action`` (``barge_in`` | ``listen`` | ``drop``, any of its spellings)
                                           -> that action / ``client_overlap_action``
3. ``force_barge_in``                      -> ``barge_in`` / ``client_force_barge_in``
4. ``force_listen``                        -> ``listen`` / ``client_force_listen``
5. non-speech audio                        -> ``drop`` / ``silence_or_noise``
6. a ``transcript`` hint that is a short acknowledgement ("ok", "yeah", "go on", 嗯 ...)
                                           -> ``listen`` / ``short_ack_transcript``
7. ``listen_only``                         -> ``listen`` / ``policy_listen_only``
8. ``barge_in_on_speech`` and a VAD (the server's, or the client's ``vad.speech_started``)
   just saw speech start                   -> ``barge_in`` / ``server_vad_speech_started``
   (no wait for ``overlap_barge_in_ms``); while the VAD reports an utterance that
   began before the response, -> ``listen`` / ``server_vad_utterance_active``
9. ``barge_in_on_speech`` without a VAD, by accumulated overlapping speech:
   ``<= overlap_short_ack_ms`` -> ``listen`` / ``short_ack``;
   ``>= overlap_barge_in_ms`` -> ``barge_in`` / ``long_overlap_speech``;
   in between -> ``listen`` / ``accumulating_overlap_speech``.

Wherever 8 or 9 would barge in on a model that cannot (or with ``interrupt_response``
off), the answer is ``listen`` / ``barge_in_unsupported``. A decision the client made
(2 with ``listen`` or ``drop``, 4, 6) starts the overlapping speech over
(``resets_overlap``).

Commit: ``decide_commit`` maps the state at commit to
one of ``CommitAction``.
"""

from __future__ import annotations

import enum
import re
from typing import Final

import msgspec

from duplex.protocol.ext.commands import DuplexInputAudioBufferAppend

__all__ = [
    "CommitAction",
    "OverlapAction",
    "OverlapHints",
    "decide_commit",
    "decide_overlap",
    "hints_of",
    "is_short_ack",
    "resets_overlap",
]


class OverlapAction(enum.StrEnum):
    """What to do with user audio that overlaps a response (the ``action`` of ``overlap.decision``)."""

    DROP = "drop"
    LISTEN = "listen"
    BARGE_IN = "barge_in"


DROP, LISTEN, BARGE_IN = OverlapAction.DROP, OverlapAction.LISTEN, OverlapAction.BARGE_IN

#: Words a listener says to keep the speaker going, not to take the turn (compared without case,
#: spaces or punctuation).
SHORT_ACKS: Final = frozenset(
    {
        "ok",
        "okay",
        "yes",
        "yeah",
        "yep",
        "right",
        "sure",
        "mhm",
        "uhhuh",
        "continue",
        "goon",
        "keepgoing",
        "pleasecontinue",
        "嗯",
        "嗯嗯",
        "对",
        "对的",
        "好",
        "好的",
        "是的",
        "可以",
        "继续",
        "继续说",
    }
)
_NOT_WORD = re.compile(r"[\W_]+")


def is_short_ack(transcript: str | None) -> bool:
    """Whether a client's transcript hint is a short acknowledgement (``SHORT_ACKS``)."""
    if not transcript:
        return False
    return _NOT_WORD.sub("", transcript.lower()) in SHORT_ACKS


class OverlapHints(msgspec.Struct, frozen=True, kw_only=True):
    """What the client said about one append (``input_audio_buffer.append``'s hints): its
    ``overlap_action`` (folded to an action), ``force_barge_in``, ``force_listen``, whether its
    ``transcript`` is a short acknowledgement."""

    action: OverlapAction | None = None
    force_barge_in: bool = False
    force_listen: bool = False
    short_ack: bool = False


NO_HINTS: Final = OverlapHints()


def hints_of(append: DuplexInputAudioBufferAppend) -> OverlapHints:
    """The overlap hints of a seeds client's append."""
    action = append.overlap_action
    return OverlapHints(
        action=OverlapAction(action) if action is not None else None,
        force_barge_in=append.force_barge_in,
        force_listen=append.force_listen,
        short_ack=is_short_ack(append.transcript),
    )

_CLIENT_RESETS: Final = frozenset({"client_force_listen", "short_ack_transcript"})


def resets_overlap(action: OverlapAction, reason: str) -> bool:
    """Whether a decision starts the overlapping speech over: the client said the overlap is not
    the user taking the turn (a listen or drop it asked for, a forced listen, a short ack)."""
    if reason == "client_overlap_action":
        return action is not BARGE_IN
    return reason in _CLIENT_RESETS


def decide_overlap(
    *,
    policy: str,
    is_speech: bool,
    vad_speech_started: bool,
    vad_in_speech: bool,
    overlap_speech_ms: float,
    short_ack_ms: float,
    barge_in_ms: float,
    supports_barge_in: bool,
    interrupt_response: bool,
    hints: OverlapHints = NO_HINTS,
) -> tuple[OverlapAction, str]:
    """The action for one overlapping append, and its reason (see the module docstring)."""
    if not supports_barge_in and (hints.action is BARGE_IN or hints.force_barge_in):
        return LISTEN, "barge_in_unsupported"
    if hints.action is not None:
        return hints.action, "client_overlap_action"
    if hints.force_barge_in:
        return BARGE_IN, "client_force_barge_in"
    if hints.force_listen:
        return LISTEN, "client_force_listen"
    if not is_speech and not vad_speech_started:
        return DROP, "silence_or_noise"
    if hints.short_ack:
        return LISTEN, "short_ack_transcript"
    if policy == "listen_only":
        return LISTEN, "policy_listen_only"
    can_barge = supports_barge_in and interrupt_response
    if vad_speech_started:
        return (BARGE_IN, "server_vad_speech_started") if can_barge else (LISTEN, "barge_in_unsupported")
    if vad_in_speech:
        return LISTEN, "server_vad_utterance_active"
    if overlap_speech_ms <= short_ack_ms:
        return LISTEN, "short_ack"
    if overlap_speech_ms >= barge_in_ms:
        return (BARGE_IN, "long_overlap_speech") if can_barge else (LISTEN, "barge_in_unsupported")
    return LISTEN, "accumulating_overlap_speech"


class CommitAction(enum.StrEnum):
    """What a valid commit does (the rows of the commit table in ``docs/sessions.md``)."""

    REJECT_EMPTY = "reject_empty"  # nothing to commit: error, never a response
    SILENT = "silent"  # explicit silence: committed, then response.listen
    COMMIT_ONLY = "commit_only"  # keep the user item; no response until response.create
    RESPOND = "respond"  # committed before any model output; a response follows
    ACK_ONLY = "ack_only"  # short overlap during a response: committed, no response, nothing deferred
    DEFER = "defer"  # meaningful overlap during a response: respond after it ends


def decide_commit(
    *,
    has_audio: bool,
    is_speech: bool | None,
    create_response: bool,
    response_active: bool,
    overlap_speech_ms: float,
    short_ack_ms: float,
) -> CommitAction:
    """The row of the commit table that applies (``has_audio``: the turn holds input, audio or
    typed text)."""
    if not has_audio:
        return CommitAction.REJECT_EMPTY
    if is_speech is False:
        return CommitAction.SILENT
    if not create_response:
        return CommitAction.COMMIT_ONLY
    if response_active:
        return CommitAction.ACK_ONLY if overlap_speech_ms <= short_ack_ms else CommitAction.DEFER
    return CommitAction.RESPOND
