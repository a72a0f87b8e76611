"""The rotated-out resume token stays valid until the client speaks on the new attachment.

A resume whose ``session.resumed`` (carrying the new token) is lost with its socket must be
resumable again with the token the client still holds; once the new attachment has sent anything
(an ack or a command), or a later resume presented the new token, the old token is refused with
``invalid_resume_token``.
"""

from __future__ import annotations

import hashlib

import pytest

from duplex.engine import Engine, EngineConfig, SessionError
from duplex.engine.credentials import ResumeCredential
from duplex.plugins.builtin.scripted import ScriptedTurnPlugin
from duplex.protocol.ext.commands import SessionHeartbeat
from tests.engine.conftest import drain

from .conftest import types

pytestmark = pytest.mark.timeout(30)


def engine() -> Engine:
    plugin = ScriptedTurnPlugin()
    plugin.load()
    return Engine(plugin, EngineConfig(reaper_interval_s=3600), model_name="served")


async def opened_with_history(eng: Engine):
    """A detached session whose journal holds two heartbeat acks (seq 1, 2)."""
    att = await eng.open()
    await att.next_event()
    att.submit(SessionHeartbeat())
    att.submit(SessionHeartbeat())
    live = [await att.next_event(), await att.next_event()]
    await att.detach()
    return att, live


async def refused(eng: Engine, session_id: str, token: str) -> str:
    with pytest.raises(SessionError) as err:
        await eng.resume(session_id, token, 0)
    return err.value.code


async def test_a_resume_whose_session_resumed_was_lost_resumes_again_with_the_old_token() -> None:
    async with engine() as eng:
        att, live = await opened_with_history(eng)
        sid, held = att.session_id, att.resume_token
        lost = await eng.resume(sid, held, 0)  # its session.resumed never reaches the client
        await lost.detach()
        again = await eng.resume(sid, held, 0)  # cut again before session.resumed: still fine
        await again.detach()
        third = await eng.resume(sid, held, 0)
        resumed = await third.next_event()
        assert types([resumed]) == ["session.resumed"]
        assert (resumed.attachment_generation, resumed.resume_token) == (4, third.resume_token)
        assert [await third.next_event(), await third.next_event()] == live
        assert len({held, lost.resume_token, again.resume_token, third.resume_token}) == 4
        # Tokens issued but never presented stop working at the next rotation.
        assert await refused(eng, sid, lost.resume_token) == "invalid_resume_token"
        assert await refused(eng, sid, again.resume_token) == "invalid_resume_token"


async def test_once_the_new_attachment_acks_the_old_token_is_refused() -> None:
    async with engine() as eng:
        att, live = await opened_with_history(eng)
        new = await eng.resume(att.session_id, att.resume_token, 0)
        await new.next_event()
        new.ack(live[-1].server_event_seq)
        assert await refused(eng, att.session_id, att.resume_token) == "invalid_resume_token"
        await new.detach()
        newer = await eng.resume(att.session_id, new.resume_token, 2)
        assert types(await drain_until_quiet(newer)) == ["session.resumed"]


async def test_once_the_new_attachment_sends_a_command_the_old_token_is_refused() -> None:
    async with engine() as eng:
        att, _ = await opened_with_history(eng)
        new = await eng.resume(att.session_id, att.resume_token, 2)
        new.submit(SessionHeartbeat())
        assert await refused(eng, att.session_id, att.resume_token) == "invalid_resume_token"
        events = [await new.next_event(), await new.next_event()]
        assert types(events) == ["session.resumed", "session.heartbeat_ack"]
        assert events[1].server_event_seq == 3  # the refused resume changed nothing


async def test_a_resume_with_the_new_token_retires_the_old_one() -> None:
    async with engine() as eng:
        att, _ = await opened_with_history(eng)
        new = await eng.resume(att.session_id, att.resume_token, 2)
        newer = await eng.resume(att.session_id, new.resume_token, 2)  # a takeover, silently
        assert await refused(eng, att.session_id, att.resume_token) == "invalid_resume_token"
        events, reason = await drain(new)
        assert types(events) == ["session.resumed", "session.replaced"] and reason == "replaced"
        # The token presented to the latest resume is now the grace one.
        latest = await eng.resume(att.session_id, new.resume_token, 2)
        assert latest.generation == newer.generation + 1


async def test_the_replaced_attachment_cannot_retire_the_old_token() -> None:
    async with engine() as eng:
        att, _ = await opened_with_history(eng)
        new = await eng.resume(att.session_id, att.resume_token, 2)
        with pytest.raises(SessionError) as err:
            att.submit(SessionHeartbeat())  # the transport the client left
        assert err.value.code == "session_closed"
        att.ack(2)
        await new.detach()
        again = await eng.resume(att.session_id, att.resume_token, 2)
        assert again.generation == 3


def test_the_credential_keeps_only_sha256_digests() -> None:
    owner = hashlib.sha256(b"sk-key").digest()
    cred = ResumeCredential(owner)
    first = cred.issue()
    second = cred.rotate(first)
    stored = [v for v in vars(cred).values() if not isinstance(v, bool)]  # beside the flag: digests only
    digests = [owner, hashlib.sha256(second.encode()).digest(), hashlib.sha256(first.encode()).digest()]
    assert stored == digests
    cred = ResumeCredential()
    first = cred.issue()
    second = cred.rotate(first)
    assert cred.verify(first) and cred.verify(second) and cred.unconfirmed
    assert not cred.verify("") and not cred.verify(first + "x")
    cred.confirm()
    assert not cred.verify(first) and cred.verify(second) and not cred.unconfirmed
    assert not ResumeCredential().verify("")


def test_a_credential_bound_to_an_owner_verifies_only_for_that_owner() -> None:
    alice, bob = hashlib.sha256(b"sk-alice").digest(), hashlib.sha256(b"sk-bob").digest()
    cred = ResumeCredential(alice)
    token = cred.issue()
    assert cred.verify(token, alice)
    assert not cred.verify(token, bob) and not cred.verify(token)
    unbound = ResumeCredential()
    token = unbound.issue()
    assert unbound.verify(token) and not unbound.verify(token, alice)


async def drain_until_quiet(att) -> list:
    """Every event already queued for ``att`` (the resume preloads its whole replay)."""
    events = []
    while att.pending():
        events.append(await att.next_event())
    return events
