"""Codec throughput: events per second on one core, JSON + base64 vs msgpack with raw bytes.

Two messages, the ones a duplex session sends most:

* ``append``: ``input_audio_buffer.append`` with 80 ms of 24 kHz PCM16 (3,840 bytes), which a client
  encodes and the server decodes;
* ``delta``: ``response.output_audio.delta`` with the same 80 ms, which the server encodes and a
  client decodes.

Each is encoded and decoded in the GA JSON rendering (base64 audio) and in msgpack (raw audio),
through the public ``duplex.protocol.encode`` / ``decode`` / ``decode_event``, in one thread (pinned
to one CPU where the OS allows it, unless ``--no-pin``). Each cell runs for ``--seconds``.

Run: ``python -m bench.codec [--seconds S] [--json PATH] [--no-pin]``. Prints a table and writes JSON (default
``bench/results/codec.json``).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duplex.protocol as p
from bench.report import machine, print_table, write_json

__all__ = ["main", "measure"]

DEFAULT_JSON = Path(__file__).parent / "results" / "codec.json"
FRAME_MS = 80
RATE = 24_000
PCM = os.urandom(RATE * FRAME_MS // 1000 * 2)
BATCH = 200


def measure(fn: Callable[[], Any], seconds: float) -> float:
    """Calls per second of ``fn``, run in batches for about ``seconds`` (after a short warm-up)."""
    for _ in range(BATCH):
        fn()
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(BATCH):
            fn()
        calls += BATCH
        now = time.perf_counter()
        if now >= deadline:
            return calls / (now - start)


def _cases() -> list[tuple[str, str, str, Callable[[], Any], int]]:
    append = p.DuplexInputAudioBufferAppend(event_id="evt_1", audio=PCM)
    delta = p.DuplexResponseOutputAudioDelta(
        event_id=p.new_event_id(),
        response_id=p.new_response_id(),
        item_id=p.new_item_id(),
        output_index=0,
        content_index=0,
        delta=PCM,
        server_event_seq=1234,
    )
    cases = []
    for rendering, mode in (("json+base64", p.Mode.GA), ("msgpack", p.Mode.MSGPACK)):
        a_wire = p.encode(append, mode)
        d_wire = p.encode(delta, mode)
        a_size = len(a_wire.encode() if isinstance(a_wire, str) else a_wire)
        d_size = len(d_wire.encode() if isinstance(d_wire, str) else d_wire)
        cases += [
            ("append", rendering, "encode", lambda m=mode: p.encode(append, m), a_size),
            ("append", rendering, "decode", lambda w=a_wire, m=mode: p.decode(w, m), a_size),
            ("delta", rendering, "encode", lambda m=mode: p.encode(delta, m), d_size),
            ("delta", rendering, "decode", lambda w=d_wire, m=mode: p.decode_event(w, m), d_size),
        ]
    return cases


def _pin_to_one_cpu() -> int | None:
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement (default 1.0)")
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help=f"output JSON (default {DEFAULT_JSON})"
    )
    parser.add_argument("--no-pin", action="store_true", help="do not pin the process to one CPU")
    args = parser.parse_args(argv)
    cpu = None if args.no_pin else _pin_to_one_cpu()
    rows = []
    for message, rendering, op, fn, size in _cases():
        rate = measure(fn, args.seconds)
        rows.append(
            {
                "message": message,
                "rendering": rendering,
                "op": op,
                "events_per_s": round(rate, 1),
                "us_per_event": round(1e6 / rate, 3),
                "frame_bytes": size,
                "realtime_streams": int(rate * FRAME_MS / 1000),
            }
        )
    print_table(
        rows,
        [
            "message",
            "rendering",
            "op",
            ("events_per_s", "events/s"),
            ("us_per_event", "µs/event"),
            ("frame_bytes", "bytes"),
            ("realtime_streams", "80 ms streams/core"),
        ],
        title=f"Codec, one {FRAME_MS} ms frame of {RATE // 1000} kHz PCM16, one thread (cpu {cpu})",
    )
    payload = {
        "benchmark": "codec",
        "frame_ms": FRAME_MS,
        "rate_hz": RATE,
        "seconds_per_cell": args.seconds,
        "pinned_cpu": cpu,
        "machine": machine(),
        "rows": rows,
    }
    path = write_json(args.json, payload)
    print(f"\nwrote {path}")
    return payload


if __name__ == "__main__":
    main()
