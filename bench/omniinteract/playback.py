"""A serialized playback clock: where each response's audio would play for one listener.

Sans-IO (times are seconds on the caller's clock). Every audio delta is queued behind what is
already queued: ``segment_start = max(receipt time, end of the previous segment)``, so responses
never overlap and a gap in the stream leaves silence. ``clear(response_id, t)``
(``output_audio_buffer.cleared``, a barge-in) cuts that response's audio not yet played at ``t``
and marks it ``truncated``; the clock then continues from ``t``.

Acks (``acks_due(t)``): a response's first ack goes out as soon as its audio arrives, whatever was
played (it checkpoints the history position on the server); later ones only after at least
``ack_step_ms`` more was played; once the response is done and the clock passed its end, one
final ack states the exact total. Each ack is ``(response_id, item_id, played_ms)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Segment", "SerialPlayback"]


@dataclass
class Segment:
    """One delta on the playback clock: ``start``/``end`` seconds and the raw audio it carries."""

    response_id: str
    start: float
    end: float
    audio: bytes
    rate: int
    bytes_per_sample: int = 2


@dataclass
class _Track:
    item_id: str
    segments: list[Segment] = field(default_factory=list)
    done: bool = False
    truncated: bool = False
    acked_ms: float | None = None
    final_sent: bool = False


@dataclass
class SerialPlayback:
    ack_step_ms: float = 200.0
    clock_end: float = float("-inf")
    tracks: dict[str, _Track] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)

    def add(self, response_id: str, item_id: str, audio: bytes, rate: int, t: float,
            bytes_per_sample: int = 2) -> Segment:
        """Queue one delta received at ``t``; returns its segment."""
        track = self.tracks.get(response_id)
        if track is None:
            track = self.tracks[response_id] = _Track(item_id)
            self.order.append(response_id)
        dur = len(audio) / bytes_per_sample / rate
        start = max(t, self.clock_end)
        seg = Segment(response_id, start, start + dur, audio, rate, bytes_per_sample)
        track.segments.append(seg)
        self.clock_end = seg.end
        return seg

    def done(self, response_id: str) -> None:
        if response_id in self.tracks:
            self.tracks[response_id].done = True

    def clear(self, response_id: str, t: float) -> None:
        """Cut ``response_id``'s audio not played by ``t`` (a barge-in)."""
        track = self.tracks.get(response_id)
        if track is None:
            return
        kept: list[Segment] = []
        for seg in track.segments:
            if seg.start >= t:
                track.truncated = True
                continue
            if seg.end > t:
                keep = int((t - seg.start) * seg.rate) * seg.bytes_per_sample
                seg.audio, seg.end = seg.audio[:keep], t
                track.truncated = True
            kept.append(seg)
        track.segments = kept
        if self.clock_end > t:
            self.clock_end = t

    def played_ms(self, response_id: str, t: float) -> float:
        track = self.tracks[response_id]
        return sum(max(0.0, min(t, s.end) - s.start) for s in track.segments) * 1000.0

    def total_ms(self, response_id: str) -> float:
        return sum(s.end - s.start for s in self.tracks[response_id].segments) * 1000.0

    def truncated(self, response_id: str) -> bool:
        return response_id in self.tracks and self.tracks[response_id].truncated

    def acks_due(self, t: float) -> list[tuple[str, str, float]]:
        out = []
        for rid in self.order:
            track = self.tracks[rid]
            if track.final_sent or not track.segments:
                continue
            played = self.played_ms(rid, t)
            end = track.segments[-1].end
            if track.done and t >= end:
                out.append((rid, track.item_id, round(self.total_ms(rid), 3)))
                track.final_sent = True
            elif track.acked_ms is None or played - track.acked_ms >= self.ack_step_ms:
                out.append((rid, track.item_id, round(played, 3)))
            else:
                continue
            track.acked_ms = played
        return out

    def settled(self, t: float) -> bool:
        """Every finished response had its final ack (nothing left to play and report)."""
        return all(tr.final_sent or not tr.segments for tr in self.tracks.values() if tr.done)
