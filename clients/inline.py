"""InlineDuplexClient: the client API over an in-process engine (no socket, no codec).

Commands go straight to the session's ``Attachment`` and events come straight from it, as typed
structs, so a Python program (a test, a benchmark, a notebook) gets the same behaviour as over the
WebSocket without its cost. What the server does on the wire is mirrored here: a command the engine
refuses before its mailbox (``SessionError``: backpressure, session closed) becomes an ``error``
event in the stream, exactly as the server would send it, and ``session.event_ack`` acks the
journal. The engine must be running (``async with engine:``) while the client is open.

The engine is imported lazily (``duplex.engine`` pulls in the scheduler and the plugin machinery,
which a WebSocket client never needs).
"""

from __future__ import annotations

from typing import Any

from clients.base import ClientError, DuplexClientBase
from duplex.protocol import DuplexSessionUpdate, ProtocolError, SessionEventAck, new_event_id

__all__ = ["InlineDuplexClient"]


class InlineDuplexClient(DuplexClientBase):
    """``InlineDuplexClient(engine, session=..., model=...)``; same methods as ``DuplexClient``."""

    def __init__(self, engine: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.engine = engine
        self._att: Any = None

    async def _open_transport(self) -> None:
        from duplex.engine import SessionError

        update = DuplexSessionUpdate(session=self.session_config) if self.session_config is not None else None
        try:
            self._att = await self.engine.open(model=self.model, update=update)
        except SessionError as exc:
            raise ClientError(exc.code, exc.message) from exc
        # As over the socket: open() returns once session.created has been processed.
        await self._dispatch(await self._att.next_event())

    async def resume(self) -> None:
        """Re-attach to the session as a new transport would (the old attachment is replaced)."""
        from duplex.engine import SessionError

        if self.session_id is None or self.resume_token is None:
            raise ClientError("invalid_session_resume", "nothing to resume")
        try:
            self._att = await self.engine.resume(self.session_id, self.resume_token, self.last_seq)
        except SessionError as exc:
            raise ClientError(exc.code, exc.message) from exc
        await self._dispatch(await self._att.next_event())

    async def _send_command(self, cmd: Any, *, wait: bool = True) -> None:
        from duplex.engine import SessionError

        att = self._att
        if att is None or self.ended:
            raise ConnectionError("the session has ended")
        try:
            if isinstance(cmd, SessionEventAck):
                att.ack(cmd.server_event_seq)
            else:
                att.submit(cmd)
        except (SessionError, ProtocolError) as exc:
            err = ProtocolError(
                exc.code,
                exc.message,
                param=getattr(exc, "param", None),
                event_id=getattr(cmd, "event_id", None),
            )
            await self._dispatch(err.to_event(new_event_id()))

    async def _recv_event(self) -> Any | None:
        from duplex.engine import Detached

        att = self._att
        if att is None:
            return None
        try:
            return await att.next_event()
        except Detached:
            return None

    async def _close_transport(self) -> None:
        att, self._att = self._att, None
        if att is not None:
            await att.detach()
