"""Sans-IO pieces of the engine: journal, resume credentials, lease, playback ledger."""

from __future__ import annotations

import gc
import random

import pytest

from duplex.engine.credentials import ResumeCredential
from duplex.engine.journal import Journal, JournalCursorError, JournalGap
from duplex.engine.lease import Lease, LeaseConflict
from duplex.engine.ledger import PlaybackCursor
from duplex.engine.transitions import TRANSITIONS, SessionState, TransitionError


def _journal(**kw: float) -> Journal[str]:
    return Journal(max_age_s=kw.get("age", 60.0), max_bytes=int(kw.get("bytes", 1000)))


def test_journal_replays_everything_after_the_cursor_in_order() -> None:
    j = _journal()
    for seq in range(1, 6):
        j.append(seq, f"e{seq}", 10, now=0.0)
    assert j.replay_after(2) == ["e3", "e4", "e5"]
    assert j.replay_after(5) == []
    assert j.replay_after(0) == ["e1", "e2", "e3", "e4", "e5"]


def test_journal_ack_trims_and_a_cursor_below_the_trim_is_a_gap() -> None:
    j = _journal()
    for seq in range(1, 6):
        j.append(seq, f"e{seq}", 10, now=0.0)
    j.ack(3)
    assert len(j) == 2 and j.size_bytes == 20
    assert j.replay_after(3) == ["e4", "e5"]
    with pytest.raises(JournalGap):
        j.replay_after(2)


def test_journal_refuses_acks_and_cursors_beyond_the_head() -> None:
    j = _journal()
    j.append(1, "e1", 10, now=0.0)
    with pytest.raises(JournalCursorError) as ack:
        j.ack(2)
    assert ack.value.code == "invalid_event_ack"
    with pytest.raises(JournalCursorError) as cur:
        j.replay_after(7)
    assert cur.value.code == "session_resume_conflict"
    with pytest.raises(JournalCursorError):
        j.ack(-1)


def test_journal_drops_oldest_by_bytes_and_by_age_and_counts_it() -> None:
    j = _journal(bytes=30, age=10.0)
    for seq in range(1, 5):
        j.append(seq, f"e{seq}", 10, now=float(seq))
    assert j.evicted == 1 and j.floor == 1 and j.size_bytes == 30
    with pytest.raises(JournalGap) as overflow:
        j.replay_after(0)
    assert overflow.value.reason == "journal_overflow"
    j.prune(now=13.5)  # e2 (t=2) and e3 (t=3) are older than 10 s
    assert j.evicted == 3 and j.replay_after(3) == ["e4"]
    with pytest.raises(JournalGap) as gap:
        j.replay_after(1)
    assert gap.value.reason == "journal_gap"


class _ModelJournal:
    """The journal's rules written the plain way (one entry at a time), for the test below."""

    def __init__(self, max_age_s: float, max_bytes: int) -> None:
        self.max_age_s, self.max_bytes = max_age_s, max_bytes
        self.entries: list[tuple[int, str, int, float]] = []  # (seq, event, size, time)
        self.head = self.floor = self.evicted = self.overflow_floor = 0

    def size(self) -> int:
        return sum(e[2] for e in self.entries)

    def append(self, event: str, size: int, now: float) -> None:
        self.head += 1
        self.entries.append((self.head, event, size, now))
        self.prune(now)

    def prune(self, now: float) -> None:
        while self.entries and (self.entries[0][3] < now - self.max_age_s or self.size() > self.max_bytes):
            if self.size() > self.max_bytes:
                self.overflow_floor = self.entries[0][0]
            self.floor = self.entries.pop(0)[0]
            self.evicted += 1

    def ack(self, seq: int) -> None:
        self.entries = [e for e in self.entries if e[0] > seq]
        self.floor = max(self.floor, seq)

    def replay_after(self, seq: int) -> list[str] | str:
        if seq > self.head:
            return "session_resume_conflict"
        if seq < self.floor:
            return "journal_overflow" if seq < self.overflow_floor else "journal_gap"
        return [e[1] for e in self.entries if e[0] > seq]


@pytest.mark.parametrize("seed", range(40))
def test_journal_matches_the_one_entry_at_a_time_model(seed: int) -> None:
    # Acks and prunes drop runs of entries at once; whatever the mix of appends, acks, prunes,
    # ages and sizes, every figure and every replay must be what dropping one entry at a time gives.
    rng = random.Random(seed)
    j: Journal[str] = Journal(max_age_s=rng.choice([0.5, 2.0, 60.0]), max_bytes=rng.choice([50, 200, 10**6]))
    model = _ModelJournal(j.max_age_s, j.max_bytes)
    now = 0.0
    for step in range(300):
        now += rng.choice([0.0, 0.01, 0.08, 0.3])
        op = rng.random()
        if op < 0.6:
            size = rng.choice([1, 10, 40])
            j.append(j.next_seq, f"e{step}", size, now)
            model.append(f"e{step}", size, now)
        elif op < 0.8:
            seq = rng.randint(0, j.head)
            j.ack(seq)
            model.ack(seq)
        elif op < 0.9:
            j.prune(now)
            model.prune(now)
        else:
            seq = rng.randint(0, j.head + 1)
            try:
                got: list[str] | str = j.replay_after(seq)
            except JournalGap as gap:
                got = gap.reason
            except JournalCursorError as err:
                got = err.code
            assert got == model.replay_after(seq)
        assert (j.head, j.floor, j.evicted, j.overflow_floor, j.size_bytes, len(j)) == (
            model.head,
            model.floor,
            model.evicted,
            model.overflow_floor,
            model.size(),
            len(model.entries),
        )


def test_journal_refuses_out_of_order_seq() -> None:
    j = _journal()
    with pytest.raises(ValueError):
        j.append(2, "e2", 1, now=0.0)


def test_journaled_audio_deltas_leave_nothing_for_the_cyclic_collector_to_track() -> None:
    # A session journals an audio delta per frame and keeps it until the client's ack; neither
    # the event nor its journal entry may be a tracked object (young collections would walk
    # thousands of them, a pause every session waits behind).
    from duplex.protocol.ext.events import DuplexResponseOutputAudioDelta

    j: Journal[object] = Journal(max_age_s=60.0, max_bytes=1 << 30)
    events = [
        DuplexResponseOutputAudioDelta(
            event_id=f"event_{i}", response_id="resp_1", item_id="item_1", output_index=0,
            content_index=0, delta=b"\x00" * 3840, format="pcm16", sample_rate_hz=24000,
        )
        for i in range(1, 2001)
    ]  # fmt: skip
    assert not any(gc.is_tracked(e) for e in events)
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for seq, event in enumerate(events, start=1):
            j.append(seq, event, 3840, seq * 0.001)
        assert gc.get_count()[0] - before < 10  # not one object per entry
    finally:
        gc.enable()
    assert j.replay_after(1990) == events[1990:]
    j.ack(1500)
    assert len(j) == 500 and j.replay_after(1500) == events[1500:]


def test_resume_token_is_verified_in_constant_time_and_rotates() -> None:
    cred = ResumeCredential()
    assert not cred.verify("anything")
    first = cred.issue()
    assert len(first) >= 43 and cred.verify(first)
    second = cred.issue()
    assert cred.verify(second) and not cred.verify(first)
    assert first.encode() not in repr(vars(cred)).encode()


def test_lease_attach_detach_resume_is_compare_and_swap() -> None:
    lease = Lease("s", 0.0, idle_ttl_s=300.0, disconnect_grace_s=30.0)
    g1 = lease.attach(0.0)
    g2 = lease.resume(1.0, expected_generation=g1)  # takeover while attached
    assert (g1, g2, lease.state) == (1, 2, SessionState.ATTACHED)
    assert not lease.detach(2.0, expected_generation=g1)  # the stale transport cannot detach
    assert lease.state is SessionState.ATTACHED
    assert lease.detach(2.0, expected_generation=g2)
    with pytest.raises(LeaseConflict):
        lease.resume(3.0, expected_generation=g1)
    assert lease.resume(3.0, expected_generation=g2) == 3


def test_lease_expiry_reasons() -> None:
    lease = Lease("s", 0.0, idle_ttl_s=300.0, disconnect_grace_s=30.0)
    lease.attach(0.0)
    assert lease.expiry(299.0) is None
    lease.touch(100.0)
    assert lease.expiry(399.0) is None and lease.expiry(400.0) == "idle_ttl_expired"
    assert lease.detach(410.0, expected_generation=1)
    assert lease.expiry(439.0) is None or lease.expiry(439.0) == "idle_ttl_expired"
    assert lease.expiry(440.0) == "disconnect_grace_expired"


def test_lease_close_is_irreversible_and_illegal_inputs_name_the_state() -> None:
    lease = Lease("s1", 0.0, idle_ttl_s=None, disconnect_grace_s=30.0)
    lease.attach(0.0)
    lease.begin_close("client_close")
    assert not lease.live and lease.expiry(1e9) is None
    with pytest.raises(TransitionError) as err:
        lease.begin_close("again")
    assert "s1" in str(err.value) and "closing" in str(err.value)
    assert lease.finish() is SessionState.CLOSED
    lease2 = Lease("s2", 0.0, idle_ttl_s=None, disconnect_grace_s=30.0)
    lease2.attach(0.0)
    lease2.begin_close("idle_ttl_expired", expired=True)
    assert lease2.finish() is SessionState.EXPIRED


def test_transition_table_has_no_exit_from_terminal_states() -> None:
    assert not [pair for pair in TRANSITIONS if pair[0] in (SessionState.CLOSED, SessionState.EXPIRED)]


def test_ledger_cuts_text_at_marks() -> None:
    cur = PlaybackCursor()
    cur.add_audio(400, "w1 ")
    cur.add_audio(400, "w2 ")
    cur.add_audio(400, "w3 ")
    assert cur.text_at(0) == ""
    assert cur.text_at(399) == ""
    assert cur.text_at(400) == "w1 "
    assert cur.text_at(1000) == "w1 w2 "
    assert cur.text_at(1200) == "w1 w2 w3 "


def test_ledger_proportional_cut_without_marks_and_text_only_response() -> None:
    cur = PlaybackCursor()
    cur.add_text("abcdefghij")
    cur.finished = True
    assert cur.committed_text == "abcdefghij"  # text-only: nothing to play, whole text
    cur2 = PlaybackCursor()
    cur2.generated_ms = cur2.sent_ms = 1000
    cur2.text = "abcdefghij"
    assert cur2.text_at(500) == "abcde"


def test_ledger_acks_are_monotone_clamped_and_truncate_caps_later_acks() -> None:
    cur = PlaybackCursor()
    cur.add_audio(1000, "hello ")
    cur.ack(300)
    cur.ack(200)
    assert (cur.played_ms, cur.committed_ms) == (300, 300)
    cur.ack(5000)
    assert cur.committed_ms == 1000  # clamped to sent
    cur.ack(250, truncate=True)
    assert cur.committed_ms == 250 and cur.committed_text == ""
    cur.ack(1000)
    assert cur.committed_ms == 250  # a later full ack cannot undo the truncation
    cur.commit_all()
    assert cur.committed_ms == 250
    assert cur.snapshot() == {"generated_ms": 1000, "sent_ms": 1000, "played_ms": 250, "committed_ms": 250}


def test_conversation_is_bounded_drop_oldest_and_counts_it() -> None:
    from duplex.engine.conversation import Conversation
    from duplex.protocol.realtime.items import InputTextPart, MessageItem

    conv = Conversation(max_items=2)
    for i in range(3):
        conv.add(MessageItem(id=f"item_{i}", role="user", content=[InputTextPart(text=str(i))]))
    assert conv.ids() == ["item_1", "item_2"] and conv.evicted == 1
    assert conv.history() == (("user", "1"), ("user", "2"))
