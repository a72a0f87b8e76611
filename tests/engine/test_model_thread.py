"""A plugin's model thread: the thread that loads it is the thread every engine steps it on, it
outlives each engine, and it ends with its plugin."""

from __future__ import annotations

import gc
import threading

import msgspec
import pytest

from duplex.engine import Engine, EngineConfig
from duplex.engine.model_thread import ModelThread, model_thread_of, on_model_thread
from duplex.plugins.builtin.scripted import ScriptedBatchPlugin

pytestmark = pytest.mark.timeout(30)


class Recording(ScriptedBatchPlugin):
    """The scripted batch plugin, off the loop, noting the thread of each call."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: dict[str, set[int]] = {}

    def _note(self, what: str) -> None:
        self.threads.setdefault(what, set()).add(threading.get_ident())

    def load(self) -> None:
        self._note("load")
        super().load()

    def capabilities(self):  # type: ignore[no-untyped-def]
        return msgspec.structs.replace(super().capabilities(), calls_on_loop=False)

    def advance(self, slots):  # type: ignore[no-untyped-def]
        self._note("advance")
        return super().advance(slots)


async def test_engines_step_the_plugin_on_the_thread_that_loaded_it() -> None:
    from tests.engine.test_batch_driver import ask  # one user message, then response.create

    from .conftest import until

    plugin = Recording()
    on_model_thread(plugin, plugin.load)
    for _ in range(2):  # two engines, one after the other, on one loaded plugin
        async with Engine(plugin, EngineConfig(output_lead_ms=None), model_name="batch") as eng:
            session = await eng.open()
            ask(session, "one two three")
            done = await until(session, "response.done")
            assert done[-1].response.status == "completed"
    assert plugin.threads["load"] == plugin.threads["advance"]
    assert plugin.threads["load"] != {threading.get_ident()}
    assert model_thread_of(plugin).submit(lambda: 7).result() == 7  # alive after both engines


def test_a_call_raises_on_the_caller_and_the_thread_goes_on() -> None:
    plugin = ScriptedBatchPlugin()

    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        on_model_thread(plugin, fail)
    assert on_model_thread(plugin, threading.get_ident) != threading.get_ident()
    # From the model thread itself: called there, not queued behind the call that waits for it.
    assert on_model_thread(plugin, on_model_thread, plugin, lambda: 5) == 5


def test_the_thread_ends_with_its_plugin_and_an_owned_one_with_its_shutdown() -> None:
    plugin = ScriptedBatchPlugin()
    ident = on_model_thread(plugin, threading.get_ident)
    thread = next(t for t in threading.enumerate() if t.ident == ident)
    assert thread.daemon  # Ctrl-C during a long load ends the process
    del plugin
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()
    owned = ModelThread(on_loop=False)
    owned.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        owned._executor.submit(print)  # type: ignore[union-attr]
