"""The worker process: one plugin, answering the server over the worker protocol.

The supervisor runs ``python -m duplex.engine.worker.child --fd N --parent PID --log-level L``
(with the interpreter of ``WorkerConfig.python``), with one end of a connected socket pair as
descriptor ``N``; it logs to the server's standard error at the server's level. The child
builds the plugin exactly as the server would in-process
(``registry.load_class(name).from_options(model_path, **options)``, then ``load()``), reports its
capabilities, maps the shared memory the parent sized from them, and then answers one request at
a time (``WorkerServer.run``) until the parent goes away.

Lifetime: the child ends when its parent's connection closes (end of stream), on SIGTERM (the
supervisor's stop: the plugin is closed, then the process exits 0), and, on Linux, when its parent
process dies by any means (``PR_SET_PDEATHSIG``: the kernel kills it), so it never outlives the
server. It ignores SIGINT: a Ctrl-C in the server's terminal is the server's to handle (it drains
its sessions, then stops the worker).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from duplex.engine.worker.channel import Channel, ChannelClosed
from duplex.engine.worker.protocol import (
    MAX_MESSAGE_BYTES,
    Advance,
    ArrayRef,
    Attach,
    Begin,
    CancelSlotMsg,
    Chunk,
    CloseSlotMsg,
    CloseStream,
    Done,
    Failure,
    Init,
    Next,
    OpenSlotMsg,
    OutputMsg,
    Outputs,
    Ready,
    Request,
    Respond,
    Step,
    TurnRequestMsg,
    call_name,
)
from duplex.engine.worker.shm import AreaWriter, SharedAreas, view_array
from duplex.plugins import registry
from duplex.plugins.base import Plugin, PluginError, SlotInput, SlotOutput, TurnRequest

__all__ = ["WorkerServer", "main"]

log = logging.getLogger("duplex.engine.worker.child")

_PR_SET_PDEATHSIG = 1
_DONE = Done()


class _Terminated(BaseException):
    """SIGTERM: leave the request loop wherever it is (not an ``Exception``, so a plugin call
    interrupted by it is not answered as a failure)."""


def _terminate(signum: int, frame: Any) -> None:
    raise _Terminated


class WorkerServer:
    """Answers the parent's requests with one plugin (see the module docstring)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.plugin: Any = None
        self.areas: SharedAreas | None = None
        self._rows: np.ndarray | None = None
        self._writer: AreaWriter | None = None
        self._streams: dict[int, tuple[int, Iterator[SlotOutput]]] = {}  # id -> (slot, reply)
        self._handlers: dict[type, Callable[[Any], Any]] = {
            Init: self._init,
            Attach: self._attach,
            OpenSlotMsg: self._open_slot,
            CancelSlotMsg: self._cancel_slot,
            CloseSlotMsg: self._close_slot,
            Step: self._step,
            Respond: self._respond,
            Next: self._next,
            CloseStream: self._close_stream,
            Begin: self._begin,
            Advance: self._advance,
        }

    def run(self) -> None:
        """Answer requests until the parent closes the connection."""
        channel = self.channel
        handlers = self._handlers
        while True:
            try:
                request = channel.recv()
            except ChannelClosed:
                return
            try:
                reply = handlers[type(request)](request)
            except PluginError as exc:
                reply = Failure(exc.code, exc.message, type(exc).__name__, param=exc.param)
            except Exception as exc:  # the call failed; the worker goes on (the parent decides)
                log.exception("%s failed in the worker", call_name(request))
                reply = Failure(None, str(exc), type(exc).__name__, traceback.format_exc())
            try:
                channel.send(reply)
            except ChannelClosed:
                return

    def close(self) -> None:
        """Close the reply streams and the plugin, unmap the shared memory."""
        for _, reply in self._streams.values():
            _close_iterator(reply)
        self._streams.clear()
        if self.plugin is not None:
            plugin, self.plugin = self.plugin, None
            plugin.close()
        self._rows = None
        self._writer = None
        if self.areas is not None:
            self.areas.close()

    # ------------------------------------------------------------------ lifetime

    def _init(self, request: Init) -> Ready:
        if self.plugin is not None:
            raise PluginError("invalid_plugin", "the worker's plugin is already loaded")
        plugin: Plugin = registry.load_class(request.plugin).from_options(
            request.model_path, **request.options
        )
        plugin.load()
        self.plugin = plugin
        # What the load left lives as long as the worker: kept out of every later collection's scan
        # (the reason is in duplex/engine/gc_settings.py, freeze_loaded; the plugin layer does not
        # import the engine).
        gc.collect()
        gc.freeze()
        return Ready(name=plugin.name, capabilities=plugin.capabilities(), pid=os.getpid())

    def _attach(self, request: Attach) -> Done:
        if self.plugin is None:
            raise PluginError("plugin_not_loaded", "Attach before Init")
        self.areas = SharedAreas.attach(request)
        caps = self.plugin.capabilities()
        if caps.chunk_samples:
            self._rows = self.areas.input_rows(caps.input_dtype, caps.chunk_samples)
        self._writer = AreaWriter(self.areas.output)
        return _DONE

    # ------------------------------------------------------------------ slots

    def _open_slot(self, request: OpenSlotMsg) -> Done:
        self.plugin.open_slot(request.slot, request.options)
        return _DONE

    def _cancel_slot(self, request: CancelSlotMsg) -> Done:
        self.plugin.cancel_slot(request.slot, request.epoch)
        return _DONE

    def _close_slot(self, request: CloseSlotMsg) -> Done:
        self.plugin.close_slot(request.slot)
        return _DONE

    # ------------------------------------------------------------------ frame and unit

    def _step(self, request: Step) -> Outputs:
        """Rows ``0 .. n-1`` of the input area are the batch's frames: copied out in one block (the
        plugin owns its inputs and may keep them), then each input gets its row."""
        slots = request.slots
        n = len(slots)
        rows = self._rows
        if rows is None:
            raise PluginError("plugin_not_loaded", "step before the shared memory was attached")
        pcms: list[Any] = list(rows[: min(n, len(rows))].copy())
        if n > len(pcms):
            pcms += [None] * (n - len(pcms))  # frames past the rows came inline (``extras``)
        inputs = [
            SlotInput(slot=s, epoch=e, pcm=p, padded=d)
            for s, e, p, d in zip(slots, request.epochs, pcms, request.padded, strict=True)
        ]
        if request.extras:
            for extra in request.extras:
                item = inputs[extra.index]
                if extra.pcm is not None:
                    item.pcm = self._read(extra.pcm)
                item.video_frames = extra.video_frames
                item.tool_results = extra.tool_results
                item.text = extra.text
        return self._outputs(list(self.plugin.step(inputs)))

    def _read(self, ref: ArrayRef) -> np.ndarray:
        """A private copy of an array the parent wrote into the input area (or inline)."""
        assert self.areas is not None
        return view_array(self.areas.input, ref).copy()

    def _outputs(self, outputs: Sequence[SlotOutput]) -> Outputs:
        """The outputs' audio into the output area (back to back, one copy), then their messages."""
        writer = self._writer
        assert writer is not None
        writer.reset()
        pcms = writer.put_many([o.pcm for o in outputs])
        message = self._message
        return Outputs([message(o, pcm) for o, pcm in zip(outputs, pcms, strict=True)], writer.cursor)

    def _message(self, o: SlotOutput, pcm: ArrayRef | None) -> OutputMsg:
        put = self._writer.put  # type: ignore[union-attr]
        return OutputMsg(
            o.slot,
            o.epoch,
            pcm,
            o.sample_rate,
            o.text,
            o.decision,
            o.end_of_turn,
            o.tool_call,
            o.user_transcript,
            None if o.image is None else put(o.image),
            None if o.video is None else put(o.video),
            o.progress,
            o.usage,
            o.chunk_index,
            o.interactions,
            o.chunk_steps,
        )

    # ------------------------------------------------------------------ turn

    def _respond(self, request: Respond) -> Done:
        """Start a reply stream. One reply per slot at a time: an older stream of the same slot
        still open is closed first (the engine closes a reply before it starts the next)."""
        msg = request.request
        for stream, (slot, reply) in list(self._streams.items()):
            if slot == msg.slot:
                del self._streams[stream]
                _close_iterator(reply)
        pcm = None if msg.pcm is None else self._read(msg.pcm)
        fields = {name: getattr(msg, name) for name in TurnRequestMsg.__struct_fields__ if name != "pcm"}
        turn = TurnRequest(**fields, pcm=pcm)
        self._streams[request.stream] = (msg.slot, iter(self.plugin.respond(turn)))
        return _DONE

    def _next(self, request: Next) -> Chunk:
        entry = self._streams.get(request.stream)
        if entry is None:
            return Chunk(None)  # closed, or superseded by a newer reply of its slot: it has ended
        try:
            output = next(entry[1], None)
        except BaseException:
            self._streams.pop(request.stream, None)
            raise
        if output is None:
            del self._streams[request.stream]
            return Chunk(None)
        writer = self._writer
        assert writer is not None
        writer.reset()
        pcm = None if output.pcm is None else writer.put(output.pcm)
        return Chunk(self._message(output, pcm), writer.cursor)

    def _close_stream(self, request: CloseStream) -> Done:
        entry = self._streams.pop(request.stream, None)
        if entry is not None:
            _close_iterator(entry[1])
        return _DONE

    # ------------------------------------------------------------------ batch

    def _begin(self, request: Begin) -> Done:
        self.plugin.begin(request.request)
        return _DONE

    def _advance(self, request: Advance) -> Outputs:
        return self._outputs(list(self.plugin.advance(request.slots)))


def _close_iterator(reply: Iterator[SlotOutput]) -> None:
    close = getattr(reply, "close", None)
    if close is not None:
        close()


def _die_with_parent(parent_pid: int) -> None:
    """Make the kernel kill this process when its parent dies (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="duplex.engine.worker.child")
    parser.add_argument("--fd", type=int, required=True, help="descriptor of the connected socket")
    parser.add_argument("--parent", type=int, required=True, help="the supervising process's pid")
    parser.add_argument("--log-level", default="INFO", help="the server's log level")
    args = parser.parse_args(argv)
    _die_with_parent(args.parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _terminate)
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s %(levelname)s worker[{os.getpid()}] %(name)s: %(message)s",
    )
    sock = socket.socket(fileno=args.fd)
    server = WorkerServer(Channel(sock, Request, max_message_bytes=MAX_MESSAGE_BYTES))
    try:
        server.run()
    except _Terminated:
        log.info("stopping (SIGTERM)")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cleanup below runs to its end
        try:
            server.close()
        finally:
            server.channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
