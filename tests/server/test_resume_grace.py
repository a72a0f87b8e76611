"""ResumeGrace: the previous resume token stays usable until the client shows it has the new one."""

from __future__ import annotations

from duplex.server.resume_grace import ResumeGrace


def test_held_token_maps_to_the_issued_one_until_confirmed():
    g = ResumeGrace()
    g.issued("s", "t0", "t1")
    assert g.substitute("s", "t0") == "t1"
    assert g.substitute("s", "t1") is None  # the new token is the engine's business
    assert g.substitute("other", "t0") is None
    g.confirmed("s")
    assert g.substitute("s", "t0") is None


def test_a_chain_of_lost_resumes_keeps_the_token_the_client_holds():
    g = ResumeGrace()
    g.issued("s", "t0", "t1")  # session.resumed carrying t1 was lost
    g.issued("s", "t0", "t2")  # resumed again with t0 (substituted by t1): t2 lost as well
    assert g.substitute("s", "t0") == "t2"


def test_entries_are_bounded_oldest_first():
    g = ResumeGrace(max_entries=2)
    for i in range(3):
        g.issued(f"s{i}", "old", f"new{i}")
    assert len(g) == 2
    assert g.substitute("s0", "old") is None and g.substitute("s2", "old") == "new2"
