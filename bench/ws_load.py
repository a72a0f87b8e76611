"""The load generator of ``bench.server``: N real-time WebSocket clients in one thread, on raw sockets.

Why not a WebSocket library's client: the benchmark measures a server on a small machine, and its
load generator shares that machine. With asyncio clients (``websockets``) the two generator
processes took 82 % of a core at 500 sessions (about 130 µs of CPU per frame sent and its delta
received) and preempted the very server they were measuring, so the capacity knee was set by
scheduling noise rather than by the server. This generator takes 34 % for the same load (about
55 µs per frame, the socket calls included), because it does the least a client must:

* every append is framed (header and RFC 6455 mask) once, before the run, and sent as one
  ``send`` call on a non-blocking socket;
* received frames are split by their headers; only the first bytes of a payload are looked at (is
  it an audio delta?), and only every ``ack_every``-th event is decoded (msgspec, that one field) for its
  ``server_event_seq`` to acknowledge it;
* one selector waits for readable sockets and for the next send on the shared absolute schedule.

It speaks enough of the protocol to stay a correct client: masked frames, a pong for every ping,
a close frame noted as a lost session, fragmented messages joined. Server frames are never
masked; a masked one is a protocol error and ends that client.

``run_clients`` is all a caller needs; ``client_frame`` and ``FrameReader`` are exposed for tests.
"""

from __future__ import annotations

import base64
import contextlib
import os
import selectors
import socket
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from heapq import heapify, heapreplace

import msgspec

__all__ = [
    "OP_BINARY",
    "OP_CLOSE",
    "OP_PING",
    "OP_PONG",
    "OP_TEXT",
    "ClientStats",
    "FrameReader",
    "client_frame",
    "handshake_request",
    "run_clients",
]

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
DELTA_TYPE = b"response.output_audio.delta"


def _mask(payload: bytes, key: bytes) -> bytes:
    """XOR ``payload`` with the repeated 4-byte ``key`` (RFC 6455 §5.3), a whole int at a time."""
    if not payload:
        return b""
    n = len(payload)
    reps = key * (n // 4 + 1)
    return (int.from_bytes(payload, "big") ^ int.from_bytes(reps[:n], "big")).to_bytes(n, "big")


def client_frame(payload: bytes, opcode: int, key: bytes) -> bytes:
    """One final client-to-server frame of ``opcode`` carrying ``payload``, masked with ``key``."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    return head + key + _mask(payload, key)


def handshake_request(path: str, port: int, subprotocol: str | None) -> bytes:
    """The HTTP/1.1 upgrade request of a client, with a fresh ``Sec-WebSocket-Key``."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    if subprotocol:
        lines.append(f"Sec-WebSocket-Protocol: {subprotocol}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class FrameReader:
    """Splits a server's byte stream into messages: ``feed(data)`` yields ``(opcode, payload)``.

    Payloads are ``memoryview`` slices of the received bytes when a frame arrived whole in one
    read (no copy), or ``bytes`` when it had to be assembled. A fragmented message is yielded once,
    joined, with its first frame's opcode; control frames may come between its fragments.
    Raises ``ValueError`` on a masked server frame."""

    __slots__ = ("_buf", "_frag", "_frag_op")

    def __init__(self) -> None:
        self._buf = b""
        self._frag: list[bytes] = []
        self._frag_op = 0

    def feed(self, data: bytes) -> Iterator[tuple[int, memoryview | bytes]]:
        if self._buf:
            data = self._buf + data
            self._buf = b""
        view = memoryview(data)
        n = len(data)
        pos = 0
        while n - pos >= 2:
            b0 = data[pos]
            b1 = data[pos + 1]
            if b1 & 0x80:
                raise ValueError("the server sent a masked frame")
            length = b1
            start = pos + 2
            if length == 126:
                if n - pos < 4:
                    break
                (length,) = struct.unpack_from("!H", data, pos + 2)
                start = pos + 4
            elif length == 127:
                if n - pos < 10:
                    break
                (length,) = struct.unpack_from("!Q", data, pos + 2)
                start = pos + 10
            end = start + length
            if end > n:
                break
            pos = end
            opcode = b0 & 0x0F
            if (b0 & 0x80 and opcode != OP_CONT) or opcode >= OP_CLOSE:  # whole, or a control frame
                yield opcode, view[start:end]
            else:
                if opcode != OP_CONT:
                    self._frag_op = opcode
                self._frag.append(data[start:end])
                if b0 & 0x80:
                    whole = b"".join(self._frag)
                    self._frag = []
                    yield self._frag_op, whole
        if pos < n:
            self._buf = data[pos:]


@dataclass
class ClientStats:
    """What one client measured: monotonic send and delta times, latencies of the measured window,
    and how late each send of that window left against its schedule (``late_ms``: the generator's
    own lag, which shows when the load, not the server, was the bottleneck)."""

    sends: list[float] = field(default_factory=list)
    late_ms: list[float] = field(default_factory=list)
    deltas: int = 0
    delta_times: list[float] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    ok: bool = True
    error: str | None = None


class _Conn:
    __slots__ = ("frame_index", "open", "out", "reader", "since_ack", "sock", "stats")

    def __init__(self, sock: socket.socket, stats: ClientStats) -> None:
        self.sock = sock
        self.reader = FrameReader()
        self.stats = stats
        self.out = bytearray()  # what a full socket buffer did not take yet
        self.since_ack = 0
        self.frame_index = 0
        self.open = True


def _connect_all(
    port: int, path: str, subprotocol: str | None, first: Sequence[bytes], n: int, batch: int = 64
) -> list[_Conn]:
    """Open ``n`` WebSocket connections, ``batch`` handshakes in flight at a time (a server's
    accept backlog can be about 100), and send each one's ``first`` frames."""
    conns: list[_Conn] = []
    request = handshake_request(path, port, subprotocol)
    while len(conns) < n:
        pending = []
        for _ in range(min(batch, n - len(conns))):
            sock = socket.create_connection(("127.0.0.1", port), timeout=60)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(request)
            pending.append(sock)
        for sock in pending:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("the server closed the connection during the handshake")
                head += chunk
            status, _, rest = head.partition(b"\r\n\r\n")
            if not status.startswith(b"HTTP/1.1 101"):
                raise ConnectionError(f"handshake refused: {status.splitlines()[0].decode(errors='replace')}")
            conn = _Conn(sock, ClientStats())
            if rest:
                conn.reader._buf = rest
            for frame in first:
                sock.sendall(frame)
            sock.setblocking(False)
            conns.append(conn)
    return conns


def run_clients(
    *,
    port: int,
    path: str,
    subprotocol: str | None,
    appends: Sequence[bytes],
    first: Sequence[bytes],
    ack_frame: Callable[[int], bytes] | None,
    delta_offset: int,
    starts: Sequence[float],
    period_s: float,
    stop_at: float,
    measure_from: float,
    ack_every: int = 25,
    linger_s: float = 0.3,
) -> list[ClientStats]:
    """Run ``len(starts)`` clients until ``stop_at`` (monotonic clock) and return their stats.

    Client ``k`` sends ``appends`` (already framed, cycled) at ``starts[k] + i * period_s`` on an
    absolute schedule, after ``first`` (framed, e.g. a ``session.update``) right after its
    handshake. The ``j``-th audio delta is taken as produced by the step of append
    ``j + delta_offset`` (the model's frames of delay: the echo plugin answers append ``i``'s audio
    when append ``i + 1`` completes a frame), and its latency from that append is recorded when the
    append was sent at or after ``measure_from``. Every ``ack_every`` events that carry a
    ``server_event_seq``, ``ack_frame(seq)`` is sent (when given). After ``stop_at`` the clients
    read for ``linger_s`` more, then send a close frame and close. A client that lost its
    connection, or got fewer deltas than it should have (3 frames of slack), is not ``ok``."""
    conns = _connect_all(port, path, subprotocol, first, len(starts))
    sel = selectors.DefaultSelector()
    for conn in conns:
        sel.register(conn.sock, selectors.EVENT_READ, conn)
    schedule = [(start, k) for k, start in enumerate(starts)]
    heapify(schedule)
    n_appends = len(appends)
    monotonic = time.monotonic
    end = stop_at + linger_s

    def lose(conn: _Conn, why: str) -> None:
        if conn.open:
            conn.open = False
            conn.stats.ok = False
            conn.stats.error = conn.stats.error or why
            sel.unregister(conn.sock)

    def send(conn: _Conn, frame: bytes) -> None:
        if conn.out:
            conn.out += frame
            return
        try:
            sent = conn.sock.send(frame)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            lose(conn, f"{type(exc).__name__}: {exc}")
            return
        if sent < len(frame):
            conn.out += frame[sent:]
            sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)

    def flush(conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            return
        except OSError as exc:
            lose(conn, f"{type(exc).__name__}: {exc}")
            return
        del conn.out[:sent]
        if not conn.out:
            sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def receive(conn: _Conn, now: float) -> None:
        try:
            data = conn.sock.recv(262144)
        except BlockingIOError:
            return
        except OSError as exc:
            lose(conn, f"{type(exc).__name__}: {exc}")
            return
        if not data:
            lose(conn, "ConnectionClosed: the server closed the connection")
            return
        stats = conn.stats
        try:
            for opcode, payload in conn.reader.feed(data):
                if opcode in (OP_TEXT, OP_BINARY):
                    head = bytes(payload[:64])
                    if DELTA_TYPE in head:
                        k = stats.deltas + delta_offset
                        stats.deltas += 1
                        stats.delta_times.append(now)
                        if 0 <= k < len(stats.sends) and stats.sends[k] >= measure_from:
                            stats.latencies_ms.append((now - stats.sends[k]) * 1000.0)
                    if ack_frame is not None:
                        conn.since_ack += 1
                        if conn.since_ack >= ack_every:
                            seq = _event_seq(opcode, payload)
                            if seq is not None:
                                conn.since_ack = 0
                                send(conn, ack_frame(seq))
                elif opcode == OP_PING:
                    send(conn, client_frame(bytes(payload), OP_PONG, os.urandom(4)))
                elif opcode == OP_CLOSE:
                    lose(conn, "ConnectionClosed: the server sent a close frame")
                    return
        except ValueError as exc:
            lose(conn, f"ProtocolError: {exc}")

    while True:
        now = monotonic()
        while schedule and schedule[0][0] <= now:
            due, k = schedule[0]
            conn = conns[k]
            if due >= stop_at or not conn.open:
                heapreplace(schedule, (float("inf"), k))
                continue
            sent_at = monotonic()
            conn.stats.sends.append(sent_at)
            if due >= measure_from:
                conn.stats.late_ms.append((sent_at - due) * 1000.0)
            send(conn, appends[conn.frame_index % n_appends])
            conn.frame_index += 1
            # from the start, not by adding periods: a sum of 0.08s drifts and gains a frame
            heapreplace(schedule, (starts[k] + conn.frame_index * period_s, k))
        if now >= end:
            break
        wake = min(schedule[0][0] if schedule else end, end)
        events = sel.select(max(0.0, wake - monotonic()))
        now = monotonic()
        for key, mask in events:
            conn = key.data
            if mask & selectors.EVENT_WRITE and conn.open:
                flush(conn)
            if mask & selectors.EVENT_READ and conn.open:
                receive(conn, now)
    sel.close()
    goodbye = client_frame(struct.pack("!H", 1000), OP_CLOSE, os.urandom(4))
    for conn in conns:
        if conn.open and not conn.out:
            with contextlib.suppress(OSError):  # a clean close (1000), best effort
                conn.sock.send(goodbye)
        conn.sock.close()
        sent, got = len(conn.stats.sends), conn.stats.deltas
        if got < max(1, sent - delta_offset - 3):
            conn.stats.ok = False
    return [conn.stats for conn in conns]


class _Seq(msgspec.Struct):
    """The one field of a server event that an ack needs (every other field is skipped)."""

    server_event_seq: int | None = None


_SEQ_DECODERS = {OP_TEXT: msgspec.json.Decoder(_Seq), OP_BINARY: msgspec.msgpack.Decoder(_Seq)}


def _event_seq(opcode: int, payload: memoryview | bytes) -> int | None:
    """The ``server_event_seq`` of a JSON (text) or msgpack (binary) event; None when it has none
    or does not decode."""
    try:
        return _SEQ_DECODERS[opcode].decode(payload).server_event_seq
    except msgspec.DecodeError:
        return None
