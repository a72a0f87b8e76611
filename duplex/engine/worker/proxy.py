"""``WorkerPlugin``: a plugin whose every method is a call into its worker process.

The engine sees a ``Plugin`` of the worker's kind (``FrameWorkerPlugin``, ``TurnWorkerPlugin``,
``BatchWorkerPlugin``: the kind's contract from ``duplex.plugins.base``), built by
``start_worker`` once the child has loaded the real plugin and reported its capabilities. Each
method is one request and its reply (``protocol``): ``step(batch)`` is one call for the whole
batch of a tick; ``respond(request)`` is one call and returns a stream whose every ``next()`` is
one call; ``open_slot``, ``cancel_slot``, ``close_slot``, ``begin`` and ``advance`` likewise.
``capabilities()`` is what the child reported when it became ready (constant after ``load``, by
the contract), with ``calls_on_loop`` off: a call waits for another process, never on the event
loop. ``close()`` stops the worker.

Errors: the plugin's ``PluginError`` comes back as the same ``PluginError(code, message)``; any
other exception of the plugin as ``WorkerCallError`` (the engine fails that call's sessions, as
in-process); a worker that is gone (died, killed as hung after ``call_timeout_s``, restarting) as
``WorkerFailed`` (``model_worker_failed``, fatal for the sessions concerned).

Slots and generations: a slot's model state lives in the child that opened it. When a new child
has taken over (a restart), every slot opened in an earlier one is *stale*: its state is gone.
Its ``cancel_slot`` and ``respond`` raise ``WorkerFailed``; its ``close_slot`` succeeds at once
(there is nothing left to close); a ``step`` or ``advance`` leaves it out and steps the others
(the stale sessions are being ended with ``model_worker_failed`` by the engine, which hears of the
death from the supervisor). ``close_slot`` of a slot whose worker has just died also succeeds:
the slot is free either way.

Per tick (``FrameWorkerPlugin.step``) the parent builds three columns of the batch, writes every
frame into the shared input rows with one ``numpy.concatenate``, sends one small message, copies
the used part of the shared output area once, and turns each output back into a ``SlotOutput``
whose audio is a view of that copy. Per slot that is a few small Python objects and no copy of
its own; nothing is allocated in shared memory and nothing is pickled.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import msgspec
import numpy as np

from duplex.engine.worker.channel import ChannelClosed
from duplex.engine.worker.config import WorkerConfig
from duplex.engine.worker.errors import WorkerCallError, WorkerFailed, worker_died
from duplex.engine.worker.protocol import (
    Advance,
    Begin,
    CancelSlotMsg,
    Chunk,
    CloseSlotMsg,
    CloseStream,
    Failure,
    InputExtra,
    Next,
    OpenSlotMsg,
    OutputMsg,
    Outputs,
    Ready,
    Respond,
    Step,
    TurnRequestMsg,
    call_name,
)
from duplex.engine.worker.shm import AreaWriter, inline_array, view_array
from duplex.engine.worker.supervisor import Connection, Observer, Supervisor
from duplex.plugins.base import (
    BatchPlugin,
    BatchRequest,
    Capabilities,
    FramePlugin,
    Plugin,
    PluginError,
    PluginKind,
    SlotInput,
    SlotOptions,
    SlotOutput,
    TurnPlugin,
    TurnRequest,
)

__all__ = ["BatchWorkerPlugin", "FrameWorkerPlugin", "TurnWorkerPlugin", "WorkerPlugin", "start_worker"]

#: The fields of a ``TurnRequest`` that travel as they are (its audio goes through the input area).
_TURN_FIELDS = tuple(name for name in TurnRequestMsg.__struct_fields__ if name != "pcm")


def start_worker(
    plugin: str,
    model_path: str | None = None,
    options: Mapping[str, Any] | None = None,
    config: WorkerConfig | None = None,
    *,
    observer: Observer | None = None,
) -> WorkerPlugin:
    """Start ``plugin`` in a supervised worker process and return its proxy, loaded.

    Blocks while the child loads the model. Raises what ``Supervisor.start`` raises (the plugin's
    ``PluginError`` with its own code when it cannot be built or loaded). ``proxy.close()`` (or
    leaving ``with proxy:``) stops the worker; ``proxy.supervisor`` gives its status.
    """
    supervisor = Supervisor(plugin, model_path, options, config, observer=observer)
    ready = supervisor.start()
    cls = _PROXIES[ready.capabilities.kind]
    return cls(supervisor, ready)


class WorkerPlugin(Plugin):
    """What the three kinds' proxies share (see the module docstring)."""

    name: ClassVar[str] = "worker"

    def __init__(self, supervisor: Supervisor, ready: Ready) -> None:
        self.name = ready.name  # type: ignore[misc]  # the served plugin's name, per instance
        self.supervisor = supervisor
        self._caps = msgspec.structs.replace(ready.capabilities, calls_on_loop=False)
        self._conn: Connection | None = None  # the child the fields below belong to
        self._writer: AreaWriter | None = None
        self._rows: np.ndarray | None = None
        self._open: dict[int, int] = {}  # open slot -> generation of the child that opened it
        self._stale: set[int] = set()  # open slots whose child has died (see the module docstring)
        self.stale_inputs_dropped = 0  # inputs of stale slots left out of a step (their sessions end)
        self._closed = False

    @classmethod
    def from_options(cls, model_path: str | None = None, **options: object) -> Plugin:
        raise PluginError(
            "invalid_plugin", "a worker plugin is started with start_worker(), not from_options"
        )

    def capabilities(self) -> Capabilities:
        return self._caps

    def load(self) -> None:
        """The worker was loaded by ``start_worker``; raises ``plugin_closed`` after ``close``."""
        if self._closed:
            raise PluginError("plugin_closed", f"{self.name}: the worker was stopped")

    def close(self) -> None:
        """Stop the worker (SIGTERM, then SIGKILL after ``stop_timeout_s``). Idempotent."""
        self._closed = True
        self.supervisor.stop()
        self._conn = self._rows = self._writer = None

    # ------------------------------------------------------------------ calls

    def _bind(self) -> Connection:
        """The ready child's connection; a new child (a restart) makes every slot of the old
        ones stale and maps the new shared memory. Raises ``WorkerFailed`` while none is ready."""
        if self._closed:
            raise PluginError("plugin_closed", f"{self.name}: the worker was stopped")
        conn = self.supervisor.connection()
        if conn is not self._conn:
            generation = conn.generation
            self._stale.update(slot for slot, gen in self._open.items() if gen != generation)
            self._conn = conn
            self._writer = AreaWriter(conn.areas.input)
            caps = self._caps
            self._rows = (
                conn.areas.input_rows(caps.input_dtype, caps.chunk_samples) if caps.chunk_samples else None
            )
        return conn

    def _exchange(self, conn: Connection, request: Any) -> Any:
        """One request and its reply, the caller holding ``conn.lock``; a per-step call within
        ``step_timeout_s``, any other within ``call_timeout_s`` (``WorkerConfig``), or the child is
        killed as hung and ``WorkerFailed`` raised."""
        if conn.dead:
            raise self._gone(conn)
        config = self.supervisor.config
        per_step = type(request) in _PER_STEP
        timeout = config.step_timeout_s if per_step else config.call_timeout_s
        try:
            reply = conn.channel.call(request, timeout)
        except ChannelClosed:
            raise self._gone(conn) from None
        except TimeoutError:
            name, bound = call_name(request), "step_timeout_s" if per_step else "call_timeout_s"
            self.supervisor.kill(conn, f"no answer to {name} within {timeout:g} s ({bound})")
            raise WorkerFailed(
                f"the model worker of {self.name!r} (pid {conn.pid}) did not answer {name} within "
                f"{timeout:g} s ({bound}) and was killed; reconnect to continue"
            ) from None
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.supervisor.kill(conn, f"unreadable reply: {exc}")
            raise WorkerFailed(f"the model worker (pid {conn.pid}) sent an unreadable reply") from None
        if type(reply) is Failure:
            if reply.code is not None:
                raise PluginError(reply.code, reply.message, param=reply.param)
            raise WorkerCallError(reply.error_type, reply.message, reply.traceback)
        return reply

    def _gone(self, conn: Connection) -> WorkerFailed:
        return worker_died(self.name, conn.pid)

    @staticmethod
    def _output(block: np.ndarray, o: OutputMsg) -> SlotOutput:
        """``o`` as a ``SlotOutput``, its arrays views of ``block`` (this call's copy of the area)."""
        pcm, image, video = o.pcm, o.image, o.video
        return SlotOutput(
            slot=o.slot,
            epoch=o.epoch,
            pcm=None if pcm is None else view_array(block, pcm),
            sample_rate=o.sample_rate,
            text=o.text,
            decision=o.decision,
            end_of_turn=o.end_of_turn,
            tool_call=o.tool_call,
            user_transcript=o.user_transcript,
            image=None if image is None else view_array(block, image),
            video=None if video is None else view_array(block, video),
            progress=o.progress,
            usage=o.usage,
            chunk_index=o.chunk_index,
            interactions=o.interactions,
            chunk_steps=o.chunk_steps,
        )

    def _outputs(self, conn: Connection, reply: Outputs) -> list[SlotOutput]:
        """The outputs of a step: the used part of the output area copied once, each output's
        arrays views of that copy (the next call may overwrite the area)."""
        block = conn.areas.output[: reply.area_bytes].copy()
        output = self._output
        return [output(block, o) for o in reply.outputs]

    # ------------------------------------------------------------------ slots

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        conn = self._bind()
        with conn.lock:
            self._exchange(conn, OpenSlotMsg(slot, options))
        self._open[slot] = conn.generation
        self._stale.discard(slot)

    def cancel_slot(self, slot: int, epoch: int) -> None:
        conn = self._bind()
        if slot in self._stale:
            raise self._slot_gone(slot)
        with conn.lock:
            self._exchange(conn, CancelSlotMsg(slot, epoch))

    def close_slot(self, slot: int) -> None:
        generation = self._open.pop(slot, None)
        self._stale.discard(slot)
        conn = self.supervisor.live_connection()
        if generation is not None and (conn is None or conn.generation != generation):
            return  # its worker died, and the slot's state with it: nothing left to close
        conn = self._bind()
        with conn.lock:
            try:
                self._exchange(conn, CloseSlotMsg(slot))
            except WorkerFailed:
                if generation is None:
                    raise
                # died during the call: the slot is free either way

    def _slot_gone(self, slot: int) -> WorkerFailed:
        return WorkerFailed(f"slot {slot}'s model state was lost with its worker process")


class FrameWorkerPlugin(WorkerPlugin, FramePlugin):
    """A ``frame`` or ``unit`` plugin in a worker process."""

    def step(self, batch: Sequence[SlotInput]) -> Sequence[SlotOutput]:
        """One call for the whole batch (see the module docstring)."""
        if not batch:
            return []
        conn = self._bind()
        if self._stale:
            kept = [item for item in batch if item.slot not in self._stale]
            self.stale_inputs_dropped += len(batch) - len(kept)
            batch = kept
            if not batch:
                return []
        slots = [item.slot for item in batch]
        epochs = [item.epoch for item in batch]
        padded = [item.padded for item in batch]
        caps = self._caps
        with conn.lock:
            if conn.dead:
                raise self._gone(conn)
            extras = self._write_frames(batch)
            if caps.supports_video_input or caps.supports_tools:
                extras = _add_extras(batch, extras)
            reply = self._exchange(conn, Step(slots, epochs, padded, extras))
            return self._outputs(conn, reply)

    def _write_frames(self, batch: Sequence[SlotInput]) -> list[InputExtra]:
        """The batch's frames into rows ``0 .. n-1`` of the input area: one ``numpy.concatenate``
        when every frame has the area's dtype and shape (the engine's always do); otherwise frame
        by frame, and a frame that does not fit a row goes inline (``InputExtra.pcm``)."""
        rows = self._rows
        assert rows is not None
        n = len(batch)
        shape, dtype = rows.shape[1:], rows.dtype
        if n <= len(rows):
            pcms = [item.pcm for item in batch]
            try:
                if all(pcm.shape == shape for pcm in pcms):
                    np.concatenate(pcms, out=rows[:n].reshape(-1), casting="no")
                    return []
            except (AttributeError, TypeError, ValueError):
                pass  # a frame of another dtype or type: one by one below
        extras = []
        for i, item in enumerate(batch):
            pcm = np.asarray(item.pcm)
            if i < len(rows) and pcm.shape == shape and pcm.dtype == dtype:
                rows[i] = pcm
            else:  # the rows are the whole input area: such a frame travels in the message
                extras.append(InputExtra(i, inline_array(pcm)))
        return extras


def _add_extras(batch: Sequence[SlotInput], extras: list[InputExtra]) -> list[InputExtra]:
    """Add the video frames, tool results and typed text of the inputs that have any (by batch
    index)."""
    by_index = {extra.index: extra for extra in extras}
    for i, item in enumerate(batch):
        if item.video_frames or item.tool_results or item.text:
            extra = by_index.get(i)
            by_index[i] = InputExtra(
                i,
                extra.pcm if extra is not None else None,
                tuple(item.video_frames),
                tuple(item.tool_results),
                tuple(item.text),
            )
    return [by_index[i] for i in sorted(by_index)]


class TurnWorkerPlugin(WorkerPlugin, TurnPlugin):
    """A ``turn`` plugin in a worker process."""

    _stream_ids = itertools.count(1)

    def respond(self, request: TurnRequest) -> Iterator[SlotOutput]:
        """Start the reply in the worker (one call); each ``next()`` of the returned stream is one
        more call, ``close()`` one last one."""
        conn = self._bind()
        if request.slot in self._stale:
            raise self._slot_gone(request.slot)
        stream = next(self._stream_ids)
        with conn.lock:
            writer = self._writer
            assert writer is not None
            writer.reset()
            pcm = None if request.pcm is None else writer.put(np.asarray(request.pcm))
            fields = {name: getattr(request, name) for name in _TURN_FIELDS}
            message = TurnRequestMsg(**fields, pcm=pcm)
            self._exchange(conn, Respond(stream, message))
        return _RemoteReply(self, conn, stream)


class _RemoteReply(Iterator[SlotOutput]):
    """A reply streaming from the worker: ``next()`` asks for one chunk, ``close()`` drops it.

    A reply whose worker died raises ``WorkerFailed`` on ``next()``; its ``close()`` is a no-op."""

    def __init__(self, proxy: WorkerPlugin, conn: Connection, stream: int) -> None:
        self._proxy = proxy
        self._conn = conn
        self._stream = stream
        self._done = False

    def __next__(self) -> SlotOutput:
        if self._done:
            raise StopIteration
        proxy, conn = self._proxy, self._conn
        try:
            if proxy._bind() is not conn:
                raise proxy._gone(conn)
            with conn.lock:
                reply: Chunk = proxy._exchange(conn, Next(self._stream))
                if reply.output is None:
                    self._done = True
                    raise StopIteration
                return proxy._output(conn.areas.output[: reply.area_bytes].copy(), reply.output)
        except BaseException:
            self._done = True  # a reply that raised has ended
            raise

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        conn = self._conn
        if conn.dead or self._proxy._closed:
            return
        with conn.lock, contextlib.suppress(WorkerFailed):  # the worker died: the reply died with it
            self._proxy._exchange(conn, CloseStream(self._stream))


class BatchWorkerPlugin(WorkerPlugin, BatchPlugin):
    """A ``batch`` plugin in a worker process."""

    def begin(self, request: BatchRequest) -> None:
        conn = self._bind()
        if request.slot in self._stale:
            raise self._slot_gone(request.slot)
        with conn.lock:
            self._exchange(conn, Begin(request))

    def advance(self, slots: Sequence[int]) -> Sequence[SlotOutput]:
        conn = self._bind()
        if self._stale:
            kept = [slot for slot in slots if slot not in self._stale]
            self.stale_inputs_dropped += len(slots) - len(kept)
            slots = kept
        if not slots:
            return []
        with conn.lock:
            reply = self._exchange(conn, Advance(list(slots)))
            return self._outputs(conn, reply)


#: The calls a model makes every frame, unit or step (``WorkerConfig.step_timeout_s``).
_PER_STEP: frozenset[type] = frozenset({Step, Advance, Begin, Next, CancelSlotMsg, CloseStream})

_PROXIES: dict[PluginKind, type[WorkerPlugin]] = {
    PluginKind.FRAME: FrameWorkerPlugin,
    PluginKind.UNIT: FrameWorkerPlugin,
    PluginKind.TURN: TurnWorkerPlugin,
    PluginKind.BATCH: BatchWorkerPlugin,
}
