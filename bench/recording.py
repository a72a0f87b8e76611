"""RecordingClient: a ``DuplexClient`` that timestamps and strictly validates every raw server frame.

The load driver must judge what the *wire* carried, including frames our decoder would refuse: a
delta with broken base64 or no ``response_id`` never becomes an event, and the plain client ends
the session on it. This subclass records each raw frame in a ``FrameRecorder`` with its receipt
time (the client's public ``received_frame`` hook, called before decoding), and the client then
decodes it as usual, except that an undecodable frame is counted (``invalid_frames``) and skipped
instead of ending the session (the ``undecodable_frame`` hook), so one bad packet is reported and
the rest of the stream is still measured. No private attribute of the client is used.

``FrameRecorder`` is sans-IO: ``observe(frame, t)`` takes the raw frame (JSON text or msgpack
bytes) and a time; it keeps the audio packets (``bench.load_metrics.Packet``), the text-delta
times, the response ids announced and finished, and the server ``error`` events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from bench.load_metrics import Packet
from clients import ClientError, DuplexClient
from duplex.protocol import Mode, ProtocolError
from duplex.protocol.audio import b64decode_strict

__all__ = ["AUDIO_DELTA_TYPES", "TEXT_DELTA_TYPES", "FrameRecorder", "RecordingClient"]

AUDIO_DELTA_TYPES = frozenset({"response.output_audio.delta", "response.audio.delta"})
TEXT_DELTA_TYPES = frozenset({
    "response.output_audio_transcript.delta",
    "response.output_text.delta",
    "response.audio_transcript.delta",
    "response.text.delta",
})
_JSON = msgspec.json.Decoder()
_MSGPACK = msgspec.msgpack.Decoder()


@dataclass
class FrameRecorder:
    """What one session's server sent, frame by frame (see the module docstring).

    ``output_rate`` and ``bytes_per_sample`` describe the audio the session promised (set them from
    ``session.created`` before streaming); a packet whose ``sample_rate_hz`` differs is invalid.
    """

    output_rate: int = 24000
    bytes_per_sample: int = 2
    binary: bool = False
    frames: int = 0
    packets: list[Packet] = field(default_factory=list)
    text_times: list[float] = field(default_factory=list)
    created: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)
    errors: list[dict[str, Any]] = field(default_factory=list)
    invalid_frames: list[dict[str, Any]] = field(default_factory=list)
    types: dict[str, int] = field(default_factory=dict)
    event_times: list[tuple[float, str]] = field(default_factory=list)
    max_event_times: int = 100_000

    def observe(self, frame: str | bytes, t: float) -> bool:
        """Record one raw frame received at ``t``; True when it was flagged invalid here."""
        index = self.frames
        self.frames += 1
        try:
            obj = (_MSGPACK if self.binary else _JSON).decode(frame)
        except msgspec.DecodeError:
            self.invalid_frames.append({"event_index": index, "t": t, "code": "invalid_json"})
            return True
        kind = obj.get("type") if isinstance(obj, dict) else None
        if not isinstance(kind, str):
            self.invalid_frames.append({"event_index": index, "t": t, "code": "bad_event"})
            return True
        self.types[kind] = self.types.get(kind, 0) + 1
        if len(self.event_times) < self.max_event_times:
            self.event_times.append((t, kind))
        if kind in AUDIO_DELTA_TYPES:
            packet = self._packet(obj, t, index)
            self.packets.append(packet)
            return packet.code is not None
        elif kind in TEXT_DELTA_TYPES:
            delta = obj.get("delta")
            if isinstance(delta, str) and delta.strip():
                self.text_times.append(t)
        elif kind == "response.created":
            rid = (obj.get("response") or {}).get("id")
            if isinstance(rid, str):
                self.created.add(rid)
        elif kind == "response.done":
            rid = (obj.get("response") or {}).get("id")
            if isinstance(rid, str):
                self.done.add(rid)
        elif kind == "error":
            err = obj.get("error") if isinstance(obj.get("error"), dict) else {}
            self.errors.append({"t": t, "code": err.get("code"), "message": err.get("message")})
        return False

    def undecodable(self, t: float, code: str) -> None:
        """The last observed frame did not decode as a typed event (``code`` from the codec)."""
        self.invalid_frames.append({"event_index": self.frames - 1, "t": t, "code": code})

    def _packet(self, obj: dict[str, Any], t: float, index: int) -> Packet:
        rid = obj.get("response_id")
        rid = rid if isinstance(rid, str) and rid else None

        def bad(code: str) -> Packet:
            return Packet(t, rid, 0, code, index)

        delta = obj.get("delta")
        if self.binary:
            if not isinstance(delta, bytes | bytearray):
                return bad("missing_audio_delta")
            raw = bytes(delta)
        else:
            if not isinstance(delta, str):
                return bad("missing_audio_delta")
            try:
                raw = b64decode_strict(delta)
            except (ProtocolError, ValueError, TypeError):
                return bad("invalid_audio_base64")
        if rid is None:
            return bad("missing_audio_response_id")
        rate = obj.get("sample_rate_hz")
        if rate is not None and rate != self.output_rate:
            return bad("invalid_audio_sample_rate")
        if len(raw) % self.bytes_per_sample:
            return bad("unaligned_pcm16_packet" if self.bytes_per_sample == 2 else "unaligned_audio_packet")
        if rid not in self.created:
            return bad("unknown_audio_response_id")
        if rid in self.done:
            return bad("audio_after_response_done")
        return Packet(t, rid, len(raw) // self.bytes_per_sample, None, index)


class RecordingClient(DuplexClient):
    """``DuplexClient`` whose every received frame first goes through ``recorder`` (module docstring).

    Built on the client's public raw-frame hooks: ``received_frame`` records each frame,
    ``undecodable_frame`` reports a frame the decoder refuses and skips it.
    """

    def __init__(self, url: str, *, recorder: FrameRecorder | None = None, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.recorder = recorder or FrameRecorder(binary=self.mode is Mode.MSGPACK)
        self._flagged = False  # the recorder already reported the last frame as invalid

    def received_frame(self, frame: str | bytes, t: float) -> None:
        self._flagged = self.recorder.observe(frame, t)
        super().received_frame(frame, t)

    def undecodable_frame(self, frame: str | bytes, t: float, error: ClientError) -> None:
        # Keep measuring the stream: the frame is reported (once), not fatal.
        if not self._flagged:
            self.recorder.undecodable(t, error.code)
