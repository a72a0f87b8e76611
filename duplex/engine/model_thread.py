"""Where plugin calls run: one dedicated model thread, or the event loop itself.

Every plugin call (``open_slot``, ``step``, ``cancel_slot``, ``close_slot``, ``respond``) goes
through one ``ModelThread``, so the calls are serialized in the order they were made and a
slot is never opened or closed during a step (the plugin contract).

A real model's step takes milliseconds of accelerator or CPU time and releases the GIL, so it
runs on a dedicated thread and the event loop keeps serving sockets meanwhile. A plugin whose
calls take microseconds and never block (``Capabilities.calls_on_loop``: the echo and scripted
plugins) is called directly on the loop: a thread hop (submit, wake the worker, wake the loop
through its self-pipe) would cost more than the call itself, once per step.

A plugin's model thread is its own, for its whole life (``model_thread_of``): the thread that loads
it (``on_model_thread(plugin, plugin.load)``, as ``duplex serve`` does) is the thread every engine
then steps it on. GPU libraries keep per-thread state: PyTorch's cuDNN execution plans are cached per
thread, cuBLAS handles and workspaces are per thread. A warm-up at load (every batch shape run once)
warms only the thread that ran it; on a fresh model thread each shape paid its first-call cost again
mid-serving (sd-turbo on an H200 through the server: a lone image took 750 ms against 156 ms).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["ModelThread", "model_thread_of", "on_model_thread"]

T = TypeVar("T")


class _Thread(concurrent.futures.Executor):
    """One daemon thread running the calls submitted to it in order.

    A daemon, unlike ``ThreadPoolExecutor``'s workers: Ctrl-C during a model load that takes
    minutes ends the process instead of waiting for the load (the engine waits for a step in flight
    itself, ``ModelThread.shutdown``)."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[concurrent.futures.Future, Callable[..., Any], tuple] | None]
        self._calls = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="duplex-model", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        if self._closed:
            raise RuntimeError("the model thread is shut down")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._calls.put((future, functools.partial(fn, **kwargs) if kwargs else fn, args))
        return future

    def is_current(self) -> bool:
        """Whether the caller runs on this thread."""
        return self._thread is threading.current_thread()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if not self._closed:
            self._closed = True
            self._calls.put(None)
        if wait and not self.is_current():
            self._thread.join()

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            self._call(*call)
            del call  # holds no call while idle: a plugin no one else holds can be collected

    @staticmethod
    def _call(future: concurrent.futures.Future, fn: Callable[..., Any], args: tuple) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the caller, as an executor does
            future.set_exception(exc)
        else:
            future.set_result(result)


_THREADS: dict[int, _Thread] = {}  # id(plugin) -> its thread, dropped when the plugin is collected
_THREADS_LOCK = threading.Lock()


def _forget(key: int) -> None:
    thread = _THREADS.pop(key, None)
    if thread is not None:
        thread.shutdown(wait=False)


def model_thread_of(plugin: object) -> concurrent.futures.Executor:
    """The single thread that runs ``plugin``'s calls, made on first use; it lives as long as the
    plugin (the module docstring says why it is one thread for loading and stepping). Keyed by
    identity, so a plugin need not be hashable; one that cannot be weakly referenced keeps its
    thread until the process ends."""
    with _THREADS_LOCK:
        executor = _THREADS.get(id(plugin))
        if executor is None:
            executor = _THREADS[id(plugin)] = _Thread()
            with contextlib.suppress(TypeError):  # not weakly referenceable: it stays
                weakref.finalize(plugin, _forget, id(plugin))  # the thread ends with its plugin
        return executor


def on_model_thread(plugin: object, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on ``plugin``'s model thread, blocking until it returns, and raising what it
    raised (loading, benchmarks: from a thread without a running loop). Called on that thread
    itself, it calls ``fn`` directly instead of waiting for itself."""
    executor = model_thread_of(plugin)
    assert isinstance(executor, _Thread)
    if executor.is_current():
        return fn(*args)
    return executor.submit(fn, *args).result()


class ModelThread:
    """Runs plugin calls in order, on one worker thread or (``on_loop``) on the caller's loop."""

    def __init__(self, *, on_loop: bool, plugin: object | None = None) -> None:
        """``plugin``: run on that plugin's own thread (``model_thread_of``), which outlives this
        object; without one, on a thread of this object's own."""
        self.on_loop = on_loop
        self._owned = plugin is None
        self._executor: concurrent.futures.Executor | None = None
        if not on_loop:
            self._executor = _Thread() if plugin is None else model_thread_of(plugin)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the model thread; its exception propagates to the caller."""
        if self._executor is None:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def shutdown(self) -> None:
        """Wait for the calls in flight; then stop the thread unless it is the plugin's (no-op on
        the loop)."""
        if self._executor is None:
            return
        if self._owned:
            self._executor.shutdown(wait=True)
        else:
            self._executor.submit(lambda: None).result()  # after every call submitted before it
