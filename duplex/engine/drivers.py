"""Kind drivers: how the engine feeds, steps and answers each kind of plugin.

Theory of operation
-------------------
The engine holds one ``Driver``, chosen once when the plugin loads (``driver_for``); nothing else
in the engine branches on the plugin's kind. The session layer talks to it through five calls, made
by the manager and the runners:

* ``join(slot, binding)`` when a session's slot opens (it returns the slot's input feed, for a
  driver whose model hears the stream), ``leave(slot)`` when it closes;
* ``start(slot, request, binding)`` when the session asks for an answer (``StartTurn``: a committed
  turn, a ``response.create``), ``stop(slot)`` when the epoch advances or the session closes:
  nothing more is produced for the request (the runner then calls ``plugin.cancel_slot``);
* ``run()`` for the engine's lifetime: the driver's own loop, if it has one.

Every output reaches its session through the slot's ``SlotBinding`` (``deliver``; ``fail`` for a
failure; ``epoch`` to tag inputs; ``paused`` while the session is behind, and ``drained`` set each
time it catches up), so a driver never touches a session.

Drivers:

``FrameDriver`` (``frame``, ``unit``)
    The ``FrameScheduler``: every slot with a frame or unit ready is stepped in one batched
    ``step`` call per tick. The model decides itself when to speak: it never ``start``\\ s.
``TurnDriver`` (``turn``)
    One task per answered request pulls ``respond(request)``'s chunks on the model thread, one
    ``next()`` per call (every session shares that thread, so each call is bounded work), pausing
    while its session is behind (``paused``: outputs unprocessed, or paced audio waiting).
``BatchDriver`` (``batch``, ``batch_driver.py``)
    Continuous batching: every active request of every session advances by one step in one
    ``advance`` call; a request joins (``begin``) and leaves between steps.

Adding a kind is writing one driver and one line of ``DRIVERS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable

from duplex.engine.batch_driver import BatchDriver
from duplex.engine.config import EngineConfig
from duplex.engine.driver import Driver
from duplex.engine.feed import SlotFeed
from duplex.engine.metrics import EngineMetrics
from duplex.engine.model_thread import ModelThread
from duplex.engine.scheduler import FrameScheduler, SlotBinding
from duplex.plugins.base import (
    BatchPlugin,
    Capabilities,
    FramePlugin,
    Plugin,
    PluginKind,
    SlotOutput,
    TurnPlugin,
    TurnRequest,
)

__all__ = ["DRIVERS", "Driver", "FrameDriver", "SlotBinding", "TurnDriver", "driver_for"]


class FrameDriver(Driver):
    """``frame`` and ``unit`` plugins: the frame scheduler's ticks."""

    def __init__(self, scheduler: FrameScheduler) -> None:
        self.scheduler = scheduler

    def join(self, slot: int, binding: SlotBinding) -> SlotFeed:
        return self.scheduler.join(slot, binding)

    def leave(self, slot: int) -> None:
        self.scheduler.leave(slot)

    def start(self, slot: int, request: TurnRequest, binding: SlotBinding) -> None:
        raise RuntimeError("a model that hears the stream decides when it speaks: it never starts a turn")

    async def run(self) -> None:
        await self.scheduler.run()


class TurnDriver(Driver):
    """``turn`` plugins: one task per answered request, pulling chunks on the model thread."""

    def __init__(self, plugin: TurnPlugin, model_thread: ModelThread) -> None:
        self.plugin = plugin
        self.model_thread = model_thread
        self._tasks: dict[int, asyncio.Task[None]] = {}

    def start(self, slot: int, request: TurnRequest, binding: SlotBinding) -> None:
        assert slot not in self._tasks, f"slot {slot} already answers a request"
        self._tasks[slot] = asyncio.create_task(self._answer(request, binding), name=f"turn-{slot}")

    async def stop(self, slot: int) -> None:
        task = self._tasks.pop(slot, None)
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _answer(self, request: TurnRequest, binding: SlotBinding) -> None:
        """Pull one reply into the session; the generator is closed however this ends."""
        call = self.model_thread.call
        gen = None
        try:
            if inspect.isgeneratorfunction(self.plugin.respond):
                # Calling a generator function runs none of its body: no model-thread hop, so the
                # first chunk waits behind one call of the other sessions instead of two.
                gen = self.plugin.respond(request)
            else:
                gen = await call(self.plugin.respond, request)
            while True:
                out = await call(next, gen, None)
                if out is None:  # ended without end_of_turn: end the response anyway
                    out = SlotOutput(slot=request.slot, epoch=request.epoch, end_of_turn=True)
                binding.deliver(out)
                if out.end_of_turn:
                    return
                # Pull the next chunk only once the session took this one and the audio still
                # waiting to be paced out is under its bound (a long reply is made as it is played).
                while binding.paused():
                    binding.drained.clear()
                    await binding.drained.wait()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            binding.fail(exc)
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                await asyncio.shield(call(close))


def _frame(
    plugin: Plugin, caps: Capabilities, config: EngineConfig, metrics: EngineMetrics, mt: ModelThread
) -> Driver:
    assert isinstance(plugin, FramePlugin)
    return FrameDriver(FrameScheduler(plugin, caps, config, metrics, mt))


def _unit(
    plugin: Plugin, caps: Capabilities, config: EngineConfig, metrics: EngineMetrics, mt: ModelThread
) -> Driver:
    """``frame``'s scheduler, gathering units that close together (``EngineConfig.unit_gather_ms``)."""
    assert isinstance(plugin, FramePlugin)
    return FrameDriver(FrameScheduler(plugin, caps, config, metrics, mt, gather_ms=config.unit_gather_ms))


def _turn(
    plugin: Plugin, caps: Capabilities, config: EngineConfig, metrics: EngineMetrics, mt: ModelThread
) -> Driver:
    assert isinstance(plugin, TurnPlugin)
    return TurnDriver(plugin, mt)


def _batch(
    plugin: Plugin, caps: Capabilities, config: EngineConfig, metrics: EngineMetrics, mt: ModelThread
) -> Driver:
    assert isinstance(plugin, BatchPlugin)
    return BatchDriver(plugin, metrics, mt)


DriverFactory = Callable[[Plugin, Capabilities, EngineConfig, EngineMetrics, ModelThread], Driver]

#: The driver of each kind.
DRIVERS: dict[PluginKind, DriverFactory] = {
    PluginKind.FRAME: _frame,
    PluginKind.UNIT: _unit,
    PluginKind.TURN: _turn,
    PluginKind.BATCH: _batch,
}


def driver_for(
    plugin: Plugin,
    caps: Capabilities,
    config: EngineConfig,
    metrics: EngineMetrics,
    model_thread: ModelThread,
) -> Driver:
    """The driver of ``plugin``'s kind (the engine checked that the plugin implements its kind)."""
    return DRIVERS[caps.kind](plugin, caps, config, metrics, model_thread)
