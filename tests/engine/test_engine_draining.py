"""An engine that drains before its process stops: it refuses new opens (and the queued ones), closes
the sessions that have a transport with reason ``draining``, and lets detached ones be resumed
until they end or expire. ``occupancy`` counts what a router needs to place the next session."""

from __future__ import annotations

import pytest

from duplex.engine import Engine, EngineConfig, SessionError
from duplex.plugins.builtin.scripted import ScriptedTurnPlugin
from duplex.protocol.ext.events import SessionClosed
from tests.engine.conftest import drain

pytestmark = pytest.mark.timeout(30)


def engine(**config) -> Engine:
    plugin = ScriptedTurnPlugin()
    plugin.load()
    config.setdefault("reaper_interval_s", 3600)
    return Engine(plugin, EngineConfig(**config), model_name="served")


async def test_occupancy_counts_attached_detached_and_reserved_slots() -> None:
    async with engine(max_sessions=4) as eng:
        assert eng.occupancy() == (4, 0, 0, 0)
        a = await eng.open()
        b = await eng.open()
        await b.detach()
        async with eng.admit() as _admission:
            assert eng.occupancy() == (4, 1, 1, 1)
        assert eng.occupancy() == (4, 1, 1, 0)
        assert a.session_id != b.session_id


async def test_a_draining_engine_refuses_new_and_queued_opens() -> None:
    async with engine(max_sessions=1, max_queue_length=4) as eng:
        await eng.open()
        eng.stop_admitting("this replica is draining; open the session elsewhere")
        with pytest.raises(SessionError) as err:
            await eng.open()
        assert err.value.code == "resource_exhausted"
        assert "draining" in err.value.message
        with pytest.raises(SessionError) as queued:
            async with eng.admit(on_queued=lambda status: None):
                pass
        assert queued.value.code == "resource_exhausted"


async def test_draining_closes_attached_sessions_and_lets_detached_ones_resume() -> None:
    async with engine(max_sessions=4) as eng:
        live = await eng.open()
        parked = await eng.open()
        token = parked.resume_token
        await parked.detach()
        eng.stop_admitting("draining")
        assert eng.close_attached("draining") == 1
        events, reason = await drain(live)
        closed = [e for e in events if isinstance(e, SessionClosed)]
        assert [e.reason for e in closed] == ["draining"] and reason == "closed"
        back = await eng.resume(parked.session_id, token, 0)
        assert back.session_id == parked.session_id
        assert eng.occupancy()[1:] == (1, 0, 0)
