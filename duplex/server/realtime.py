"""``GET /v1/realtime``: one WebSocket carrying one duplex session.

Theory of operation
-------------------
1. *Admission* (before accepting): draining -> 503, API key -> 401, browser origin -> 403. Then
   ``plan_handshake`` reads the query and headers (wire mode, how the session opens).
2. *Open and run*: ``duplex.server.connection`` (``Connection``; the MAP Realtime dialect's
   ``MapConnection`` in ``duplex.server.map_realtime``).
"""

from __future__ import annotations

from starlette.websockets import WebSocket

from duplex.protocol import ProtocolError
from duplex.server.close_codes import CloseCode
from duplex.server.connection import Connection, serve_websocket
from duplex.server.handshake import HandshakeRefusal, plan_handshake
from duplex.server.map_realtime import MapConnection
from duplex.server.state import AppState

__all__ = ["realtime_endpoint"]


async def realtime_endpoint(websocket: WebSocket) -> None:
    """The WebSocket route. Cancel-safe: cancellation detaches the session and re-raises."""
    state: AppState = websocket.app.state.duplex
    plan = plan_handshake(
        websocket.query_params, websocket.headers, websocket.scope.get("subprotocols") or ()
    )

    async def serve(key_id: bytes | None) -> None:
        if plan.map_mode is not None:
            conn: Connection = MapConnection(websocket, state, plan.map_mode, key_id)
        else:
            conn = Connection(websocket, state, plan.mode, key_id)
        if isinstance(plan, HandshakeRefusal):
            await conn.fail(ProtocolError(plan.code, plan.message), CloseCode(plan.close_code))
            return
        await conn.run(plan)

    await serve_websocket(websocket, state, serve, plan.subprotocol)
