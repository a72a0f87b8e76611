"""``Channel``: length-prefixed msgpack messages over a connected local stream socket.

Each message is a 4-byte big-endian length and that many bytes of msgpack (one ``protocol``
struct). The channel owns one encoder, one decoder and one buffer per direction for its whole
life: a message is encoded into the reused send buffer (``encode_into``) and decoded straight
from the receive buffer, so a call allocates nothing of its own per message. Reads take whatever
the socket has (usually a whole message in one ``recv_into``).

Written here rather than taken from ``multiprocessing.connection``, whose ``recv_bytes``
allocates per message and whose blocking read on a raw descriptor cannot be woken from another
thread: ``close()`` shuts the socket down, which makes a read blocked in another thread return at
once (``ChannelClosed``). That is how the supervisor fails a call pending on a worker it has
found dead or hung.

Errors: ``ChannelClosed`` when the peer is gone (end of stream, reset, or ``close()``);
``TimeoutError`` when no whole message came within the socket's timeout (the caller decides
what a silent peer means); ``msgspec.DecodeError``/``ValidationError`` for a message that is not
of the decoder's type. After any of them the channel must not be used again (the stream's
framing is lost).
"""

from __future__ import annotations

import contextlib
import socket
import struct
from typing import Any

import msgspec

__all__ = ["Channel", "ChannelClosed"]

_HEADER = struct.Struct("!I")
_INITIAL_BUFFER_BYTES = 64 * 1024


class ChannelClosed(ConnectionError):
    """The peer closed the stream, or the channel was closed."""


class Channel:
    """One end of a worker connection (see the module docstring). Not thread-safe, except that
    ``close()`` may be called from another thread to wake a blocked ``recv``."""

    def __init__(self, sock: socket.socket, decode_type: Any, *, max_message_bytes: int) -> None:
        self.sock = sock
        self.max_message_bytes = max_message_bytes
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(decode_type)
        self._out = bytearray(_INITIAL_BUFFER_BYTES)
        self._in = bytearray(_INITIAL_BUFFER_BYTES)
        self._start = 0  # the unread bytes of ``_in`` are ``_start:_end``
        self._end = 0
        self._timeout_s = sock.gettimeout()
        self.closed = False

    def send(self, message: Any) -> None:
        """Encode and write one message (blocking; raises ``ChannelClosed`` if the peer is gone)."""
        out = self._out
        self._encoder.encode_into(message, out, _HEADER.size)
        _HEADER.pack_into(out, 0, len(out) - _HEADER.size)
        try:
            self.sock.sendall(out)
        except TimeoutError:
            raise
        except OSError as exc:  # a broken pipe, a reset, or closed by ``close()``
            raise ChannelClosed(f"worker connection lost while sending: {exc}") from None

    def recv(self) -> Any:
        """Read and decode the next message (blocking, within the socket's timeout)."""
        buf = self._in
        while True:
            avail = self._end - self._start
            need = _HEADER.size
            if avail >= need:
                (size,) = _HEADER.unpack_from(buf, self._start)
                if size > self.max_message_bytes:
                    raise ChannelClosed(f"message of {size} bytes exceeds {self.max_message_bytes}")
                need += size
                if avail >= need:
                    begin = self._start + _HEADER.size
                    with memoryview(buf) as view:
                        message = self._decoder.decode(view[begin : begin + size])
                    self._start += need
                    if self._start == self._end:
                        self._start = self._end = 0
                    return message
            self._make_room(need)
            try:
                with memoryview(self._in) as view:
                    got = self.sock.recv_into(view[self._end :])
            except TimeoutError:
                raise
            except OSError as exc:
                raise ChannelClosed(f"worker connection lost: {exc}") from None
            if got == 0:
                raise ChannelClosed("worker connection closed")
            self._end += got
            buf = self._in

    def _make_room(self, need: int) -> None:
        """Ensure ``need`` bytes fit from ``_start``: move the unread bytes to the front, grow."""
        if self._start + need <= len(self._in) and self._end < len(self._in):
            return
        unread = self._in[self._start : self._end]
        if need > len(self._in):
            self._in = bytearray(max(need, 2 * len(self._in)))
        self._in[: len(unread)] = unread
        self._start, self._end = 0, len(unread)

    def call(self, message: Any, timeout_s: float | None = None) -> Any:
        """``send`` then ``recv``: one request and its reply; ``timeout_s`` (when given) becomes the
        socket's timeout from this call on (``TimeoutError`` when a read waits longer). A channel
        that ``close()`` shut, even from another thread mid-call, raises ``ChannelClosed``."""
        if timeout_s is not None and timeout_s != self._timeout_s:
            try:
                self.sock.settimeout(timeout_s)
            except OSError as exc:  # closed by ``close()`` from another thread since the caller looked
                raise ChannelClosed(f"worker connection lost: {exc}") from None
            self._timeout_s = timeout_s
        self.send(message)
        return self.recv()

    def close(self) -> None:
        """Shut the socket down (a ``recv`` blocked in another thread returns) and close it."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(OSError):  # already disconnected
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
