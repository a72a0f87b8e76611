"""Playback truth from the client side: what the listener has actually heard, reported as ``playback.ack``.

The server knows what it generated and sent; only the client knows what was played. Two sources:

* ``SimulatedPlayback``: a virtual speaker. A response's audio starts playing when its first delta
  arrives and plays in real time, never ahead of what was received; a gap in the stream pauses it.
  Benchmarks and tests use it to behave like a real listener without a sound card.
* ``DevicePlayback``: a real speaker reports its position through a callable (milliseconds of the
  current response played), e.g. from a ``sounddevice`` stream callback.

Both are sans-IO: ``on_event(event, now)`` feeds server events, ``acks_due(now)`` returns the
``PlaybackAck`` commands to send (at most one per ``interval_ms`` per response, plus a final one when
a response's audio has been fully played). ``interrupt(now)`` stops playback at once (a barge-in on
the client side) and returns the truncating ack. ``PlaybackReporter`` is the small asyncio driver
that sends what they return through a client.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clients.collector import event_type
from duplex.protocol import AudioFormat, PlaybackAck, parse_format

__all__ = ["DevicePlayback", "PlaybackReporter", "SimulatedPlayback"]


@dataclass
class _Track:
    response_id: str
    item_id: str
    received_ms: float = 0.0
    played_ms: float = 0.0
    acked_ms: float = -1.0
    playing_since: float | None = None  # clock time when playback (re)started
    played_at_start: float = 0.0
    last_ack_t: float = float("-inf")
    done: bool = False  # response.done seen: no more audio will come


def _delta_ms(event: Any, fallback: AudioFormat | None) -> float:
    fmt = fallback
    spec = getattr(event, "format", None)
    if spec is not None:
        with contextlib.suppress(Exception):
            fmt = parse_format(spec, getattr(event, "sample_rate_hz", None))
    if fmt is None or fmt.bytes_per_sample == 0:
        return 0.0
    return len(event.delta) / fmt.bytes_per_sample / fmt.rate * 1000.0


@dataclass
class SimulatedPlayback:
    """A virtual real-time speaker; times are seconds on the caller's clock, durations in ms."""

    interval_ms: float = 200.0
    output_format: AudioFormat | None = None
    tracks: dict[str, _Track] = field(default_factory=dict)
    current: str | None = None

    def on_event(self, event: Any, now: float) -> None:
        kind = event_type(event)
        if kind == "response.output_audio.delta":
            track = self.tracks.get(event.response_id)
            if track is None:
                track = self.tracks[event.response_id] = _Track(event.response_id, event.item_id)
                self.current = event.response_id
            self._advance(track, now)
            track.received_ms += _delta_ms(event, self.output_format)
            if track.playing_since is None:
                track.playing_since, track.played_at_start = now, track.played_ms
        elif kind == "response.done":
            track = self.tracks.get(event.response.id)
            if track is not None:
                track.done = True

    def _advance(self, track: _Track, now: float) -> None:
        if track.playing_since is None:
            return
        played = track.played_at_start + (now - track.playing_since) * 1000.0
        if played >= track.received_ms:  # ran dry: pause until more audio arrives
            track.played_ms = track.received_ms
            track.playing_since = None
        else:
            track.played_ms = played

    def played_ms(self, response_id: str, now: float) -> float:
        track = self.tracks[response_id]
        self._advance(track, now)
        return track.played_ms

    def acks_due(self, now: float) -> list[PlaybackAck]:
        """Acks to send now: one per response whose played position moved (rate-limited)."""
        out: list[PlaybackAck] = []
        for rid, track in list(self.tracks.items()):
            self._advance(track, now)
            finished = track.done and track.played_ms >= track.received_ms
            due = (now - track.last_ack_t) * 1000.0 >= self.interval_ms or finished
            if due and track.played_ms > track.acked_ms:
                out.append(
                    PlaybackAck(response_id=rid, item_id=track.item_id, played_ms=round(track.played_ms))
                )
                track.acked_ms, track.last_ack_t = track.played_ms, now
            if finished:
                del self.tracks[rid]
        return out

    def interrupt(self, now: float) -> list[PlaybackAck]:
        """Stop all playback now (client-side barge-in): truncating acks at what was heard."""
        out = []
        for rid, track in self.tracks.items():
            self._advance(track, now)
            out.append(
                PlaybackAck(
                    response_id=rid, item_id=track.item_id, played_ms=round(track.played_ms), truncate=True
                )
            )
        self.tracks.clear()
        return out


@dataclass
class DevicePlayback:
    """A real speaker: ``position_ms(response_id)`` says how much of that response has been played."""

    position_ms: Callable[[str], float]
    interval_ms: float = 200.0
    items: dict[str, str] = field(default_factory=dict)
    acked: dict[str, float] = field(default_factory=dict)
    last_ack_t: float = float("-inf")

    def on_event(self, event: Any, now: float) -> None:
        if event_type(event) == "response.output_audio.delta" and event.response_id not in self.items:
            self.items[event.response_id] = event.item_id

    def acks_due(self, now: float) -> list[PlaybackAck]:
        if (now - self.last_ack_t) * 1000.0 < self.interval_ms:
            return []
        self.last_ack_t = now
        out = []
        for rid, item_id in self.items.items():
            played = self.position_ms(rid)
            if played > self.acked.get(rid, -1.0):
                self.acked[rid] = played
                out.append(PlaybackAck(response_id=rid, item_id=item_id, played_ms=round(played)))
        return out

    def interrupt(self, now: float) -> list[PlaybackAck]:
        out = [
            PlaybackAck(response_id=rid, item_id=item, played_ms=round(self.position_ms(rid)), truncate=True)
            for rid, item in self.items.items()
        ]
        self.items.clear()
        return out


class PlaybackReporter:
    """Drives a playback model: listens to a client's events and sends the acks it asks for.

    Use as ``async with PlaybackReporter(client, SimulatedPlayback()):``. The ack loop wakes every
    ``poll_s``; it is owned by the context manager and cancelled on exit.
    """

    def __init__(
        self, client: Any, model: SimulatedPlayback | DevicePlayback, *, poll_s: float = 0.05
    ) -> None:
        self.client = client
        self.model = model
        self.poll_s = poll_s
        self._task: asyncio.Task[None] | None = None

    def _on_event(self, event: Any) -> None:
        self.model.on_event(event, self.client.clock())

    async def _loop(self) -> None:
        while True:
            for ack in self.model.acks_due(self.client.clock()):
                await self.client.send(ack)
            await asyncio.sleep(self.poll_s)

    async def interrupt(self) -> None:
        """Stop playback now and send the truncating acks."""
        for ack in self.model.interrupt(self.client.clock()):
            await self.client.send(ack)

    async def __aenter__(self) -> PlaybackReporter:
        self.client.add_listener(self._on_event)
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.client.remove_listener(self._on_event)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
