"""``GET /v1/realtime?mode=audio|video&model=...`` in the MAP Realtime dialect (OpenBMB's realtime SDK).

The same connection as the OpenAI dialect's (``duplex.server.realtime``: one session, its journal,
limits and metrics; a reader and a writer; slow readers and stalls handled alike), with the MAP
codec at the edge (``duplex.protocol.map``) and the dialect's way to open:

1. *Admission*: the client waits for ``session.queue_done`` before it says anything. A free slot is
   reserved at once; when every slot is taken the socket waits in the engine's queue with
   ``session.queued{position, estimated_wait_s, queue_length}`` updates (``wait_for_slot``), and is
   refused with ``error{resource_exhausted}`` (close 1013) past the queue's length or wait limit.
   A ``session.init`` sent early is kept; ``session.close`` leaves the queue and is answered with
   ``session.closed{reason}``.
2. *Open*: ``session.queue_done``, then ``session.init`` (within ``first_message_timeout_s``)
   opens the session with the slot reserved for it: ``session.created{session_id, mode}``. A
   ``mode=video`` session on a model that takes no camera frames is refused
   (``invalid_input_modality``).
3. *Run*: ``input.append`` and ``session.close`` become the engine's commands
   (``engine_command``); the engine's events are rendered by ``MapRenderer`` (the ones the dialect
   has no word for are not sent). The dialect cannot resume, so the session is opened
   ``resumable=False``: it closes as soon as its socket goes.

Errors are sent as ``error{error{code, message}}``. OpenBMB's SDK ends the session on any of them,
which is the client's choice; the server keeps the session as it does for every client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from starlette.websockets import WebSocket

from duplex.engine import QueueStatus
from duplex.protocol import Mode, ProtocolError, new_event_id
from duplex.protocol.map import (
    InputAppend,
    MapCommand,
    MapEvent,
    MapRenderer,
    MapSessionClose,
    SessionInit,
    SessionQueued,
    SessionQueueDone,
    decode,
    encode,
    engine_command,
    session_update,
)
from duplex.protocol.map.events import MapSessionClosed
from duplex.protocol.wire import Command
from duplex.server.close_codes import CloseCode, CloseReason
from duplex.server.connection import Connection, Outgoing
from duplex.server.handshake import HandshakePlan
from duplex.server.models import Wants
from duplex.server.queueing import wait_for_slot
from duplex.server.state import AppState

__all__ = ["MapConnection"]

log = logging.getLogger("duplex.server.map_realtime")


class MapConnection(Connection):
    """One socket in the MAP dialect (see the module docstring); ``map_mode``: ``audio`` / ``video``."""

    def __init__(
        self, websocket: WebSocket, state: AppState, map_mode: str, api_key_id: bytes | None = None
    ) -> None:
        super().__init__(websocket, state, Mode.GA, api_key_id)
        self.map_mode = map_mode
        self._renderer = MapRenderer(map_mode)
        self._init: SessionInit | None = None  # a session.init that came while the socket waited
        self._close_reason: str | None = None  # a session.close before the session opened

    # -- the codec at the edge ---------------------------------------------------------------

    def _payloads(self, events: Sequence[Outgoing]) -> list[bytes]:
        render, out = self._renderer.render, []
        for event in events:
            message = event if isinstance(event, MapEvent) else render(event)
            if message is not None:
                out.append(encode(message))
        return out

    def _decode_map(self, data: str | bytes) -> MapCommand:
        """One client frame in the dialect's own words; raises ``ProtocolError``."""
        return decode(data, max_bytes=self.cfg.max_message_bytes)

    def _decode(self, data: str | bytes) -> Command:
        """A MAP message of the running session in the engine's words (``engine_command``); a
        second ``session.init`` is refused. Raises ``ProtocolError``, answered as the base's are."""
        message = self._decode_map(data)
        if isinstance(message, SessionInit):
            raise ProtocolError("bad_event", "session.init is sent once, before the session opens")
        return engine_command(message)

    # -- admission and open ------------------------------------------------------------------

    async def run(self, plan: HandshakePlan) -> None:
        try:
            pick = self.state.models.pick(plan.model, Wants.CONVERSATION)
            engine = pick.model.engine
            async with contextlib.AsyncExitStack() as stack:
                admission = await wait_for_slot(
                    self,
                    engine,
                    stack,
                    status_event=_queued,
                    on_message=self._while_queued,
                    send_timeout_s=self.cfg.send_timeout_s,
                )
                if admission is None:
                    await self._closed_before_open()
                    return
                await self._write([SessionQueueDone()])
                init = self._init or await self._wait_for_init()
                if init is None:
                    await self._closed_before_open()
                    return
                caps = engine.capabilities
                if self.map_mode == "video" and not caps.supports_video_input:
                    raise ProtocolError(
                        "invalid_input_modality", "this model takes no camera frames: connect with mode=audio"
                    )
                update = session_update(init, text_only="audio" not in caps.output_modalities)
                att = await engine.open(
                    model=plan.model,
                    update=update,
                    api_key_id=self.api_key_id,
                    admission=admission,
                    resumable=False,
                    notices=pick.notices(),  # journaled; the dialect has no message for them
                )
        except Exception as exc:
            await self.open_failed(exc, log, "opening a MAP session failed")
            return
        self.metrics.sessions_opened.bump("session.init")
        await self._serve(att, None)

    async def _while_queued(self, data: str | bytes) -> bool:
        """A message while the socket waits for a slot: ``session.init`` is kept for the open,
        ``session.close`` ends the wait, anything else is refused. True: keep waiting."""
        try:
            cmd = self._decode_map(data)
        except ProtocolError as err:
            await self._write([err.to_event(new_event_id())])
            return True
        if isinstance(cmd, MapSessionClose):
            self._close_reason = cmd.reason or CloseReason.CLIENT_CLOSE
            return False
        if isinstance(cmd, SessionInit):
            self._init = self._init or cmd
            return True
        busy = ProtocolError(
            "input_backpressure",
            "the session is waiting for a slot (session.queued): send input after session.created",
        )
        await self._write([busy.to_event(new_event_id())])
        return True

    async def _wait_for_init(self) -> SessionInit | None:
        """``session.init`` after ``session.queue_done``. None: the client closed or left. Raises
        ``ProtocolError("config_timeout")`` when it does not come within ``first_message_timeout_s``."""
        try:
            async with asyncio.timeout(self.cfg.first_message_timeout_s):
                while True:
                    data = await self._receive()
                    if data is None:
                        return None
                    try:
                        cmd = self._decode_map(data)
                    except ProtocolError as err:
                        await self._write([err.to_event(new_event_id())])
                        continue
                    if isinstance(cmd, SessionInit):
                        return cmd
                    if isinstance(cmd, MapSessionClose):
                        self._close_reason = cmd.reason or CloseReason.CLIENT_CLOSE
                        return None
                    assert isinstance(cmd, InputAppend)
                    first = ProtocolError("bad_event", "send session.init before input.append")
                    await self._write([first.to_event(new_event_id())])
        except TimeoutError:
            raise ProtocolError("config_timeout", "Timeout waiting for session.init") from None

    async def _closed_before_open(self) -> None:
        """The client closed (answered with ``session.closed``) or left before its session opened."""
        if self._close_reason is not None:
            with contextlib.suppress(Exception):  # the peer may be gone already
                await self._write([MapSessionClosed(reason=self._close_reason)])
            await self._close(CloseCode.NORMAL, CloseReason.CLIENT_CLOSE)


def _queued(status: QueueStatus) -> SessionQueued:
    return SessionQueued(
        position=status.position, estimated_wait_s=status.estimated_wait_s, queue_length=status.queue_length
    )
