"""Session ids that name their owner, and signed resume tokens (``duplex.engine.ids``)."""

from __future__ import annotations

import pytest

from duplex.engine.credentials import ResumeCredential
from duplex.engine.ids import OwnedSessionIds, SessionIds, owner_of

SECRET = b"s" * 32


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_an_owned_session_id_names_its_owner() -> None:
    sid = OwnedSessionIds("r1b2c3d4", SECRET).new_session_id()
    assert sid.startswith("s_r1b2c3d4_")
    assert owner_of(sid) == "r1b2c3d4"


def test_ids_of_one_process_and_other_text_name_no_owner() -> None:
    assert owner_of(SessionIds().new_session_id()) is None
    assert owner_of("s_a_b") is None
    assert owner_of("s_abc_" + "0" * 24 + "x") is None


def test_a_signed_token_is_good_for_its_session_until_it_expires() -> None:
    clock = Clock(1000.0)
    ids = OwnedSessionIds("r1", SECRET, token_ttl_s=60, clock=clock)
    sid = ids.new_session_id()
    token = ids.new_token(sid)
    assert ids.token_ok(sid, token)
    assert not ids.token_ok(ids.new_session_id(), token)  # another session's
    clock.now = 1060.0
    assert not ids.token_ok(sid, token)  # expired


def test_another_replica_with_the_shared_secret_checks_the_token() -> None:
    owner = OwnedSessionIds("r1", SECRET)
    sid = owner.new_session_id()
    token = owner.new_token(sid)
    assert OwnedSessionIds("r2", SECRET).token_ok(sid, token)
    assert not OwnedSessionIds("r2", b"t" * 32).token_ok(sid, token)


@pytest.mark.parametrize(
    "forge",
    [
        lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"),  # another signature
        lambda t: str(int(t.split(".")[0]) + 3600) + t[t.index(".") :],  # a later expiry
        lambda t: "",
        lambda t: "not.a.token.at.all",
        lambda t: "x" * 43,
    ],
)
def test_a_forged_token_is_refused(forge) -> None:
    ids = OwnedSessionIds("r1", SECRET)
    sid = ids.new_session_id()
    assert not ids.token_ok(sid, forge(ids.new_token(sid)))


def test_the_credential_of_an_owned_session_issues_signed_tokens_and_refuses_expired_ones() -> None:
    clock = Clock(0.0)
    ids = OwnedSessionIds("r1", SECRET, token_ttl_s=100, clock=clock)
    sid = ids.new_session_id()
    cred = ResumeCredential(session_id=sid, ids=ids)
    token = cred.issue()
    assert ids.token_ok(sid, token) and cred.verify(token)
    rotated = cred.rotate(token)
    assert ids.token_ok(sid, rotated) and cred.verify(rotated) and cred.verify(token)
    clock.now = 150.0
    assert not cred.verify(rotated)  # its own digest, but expired


def test_a_token_signed_for_the_session_but_not_issued_by_its_credential_is_refused() -> None:
    ids = OwnedSessionIds("r1", SECRET)
    sid = ids.new_session_id()
    cred = ResumeCredential(session_id=sid, ids=ids)
    cred.issue()
    assert not cred.verify(ids.new_token(sid))


def test_bad_owners_and_short_secrets_are_refused() -> None:
    with pytest.raises(ValueError):
        OwnedSessionIds("has_underscore", SECRET)
    with pytest.raises(ValueError):
        OwnedSessionIds("r1", b"short")
