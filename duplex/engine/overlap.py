"""Overlap policy and the commit-to-response table: pure decisions, no state.

Overlap (``wire_protocol.md`` §11.6): user audio that arrives while a response is
active. ``decide_overlap`` returns ``(action, reason)`` with action ``drop``,
``listen`` or ``barge_in``, in this order:

0. the client forces a barge-in (``force_barge_in`` on the append)
                                           -> ``barge_in`` / ``client_force_barge_in``
1. non-speech audio                        -> ``drop`` / ``silence_or_noise``
2. a barge-in the model cannot do          -> ``listen`` / ``barge_in_unsupported``
   (checked wherever step 0, 4 or 5 would barge in)
3. ``listen_only``                         -> ``listen`` / ``policy_listen_only``
4. ``barge_in_on_speech`` and the server VAD just saw speech start
                                           -> ``barge_in`` / ``server_vad_speech_started``
   (no wait for ``overlap_barge_in_ms``); while the VAD reports an utterance that
   began before the response, -> ``listen`` / ``server_vad_utterance_active``
5. ``barge_in_on_speech`` without VAD, by accumulated overlapping speech:
   ``<= overlap_short_ack_ms`` -> ``listen`` / ``short_ack``;
   ``>= overlap_barge_in_ms`` -> ``barge_in`` / ``long_overlap_speech``;
   in between -> ``listen`` / ``accumulating_overlap_speech``.

Commit (``wire_protocol.md`` §11.3): ``decide_commit`` maps the state at commit to
one of ``CommitAction``.
"""

from __future__ import annotations

import enum

__all__ = ["CommitAction", "OverlapAction", "decide_commit", "decide_overlap"]


class OverlapAction(enum.StrEnum):
    """What to do with user audio that overlaps a response (the ``action`` of ``overlap.decision``)."""

    DROP = "drop"
    LISTEN = "listen"
    BARGE_IN = "barge_in"


DROP, LISTEN, BARGE_IN = OverlapAction.DROP, OverlapAction.LISTEN, OverlapAction.BARGE_IN


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
    forced: bool = False,
) -> tuple[OverlapAction, str]:
    """The action for one overlapping append, and its reason (see the module docstring)."""
    if forced:
        return (BARGE_IN, "client_force_barge_in") if supports_barge_in else (LISTEN, "barge_in_unsupported")
    if not is_speech and not vad_speech_started:
        return DROP, "silence_or_noise"
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
    """What a valid commit does (the rows of ``wire_protocol.md`` §11.3)."""

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
    """The row of the commit table that applies."""
    if not has_audio:
        return CommitAction.REJECT_EMPTY
    if is_speech is False:
        return CommitAction.SILENT
    if not create_response:
        return CommitAction.COMMIT_ONLY
    if response_active:
        return CommitAction.ACK_ONLY if overlap_speech_ms <= short_ack_ms else CommitAction.DEFER
    return CommitAction.RESPOND
