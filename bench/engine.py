"""Session-layer capacity: N in-process sessions on the ``echo`` frame plugin at real time.

What it measures, per session count N (default 100, 500, 1000):

* every session is a client that appends one 80 ms PCM16 frame (24 kHz) every 80 ms of
  wall time, with client phases spread evenly over the period: 2.4 s of a voiced tone
  (the echo answers it with audio, one frame late) then 0.8 s of silence (the echo's
  response ends), again and again; it reads every event it is sent and acks the journal
  every ``ack_every`` events;
* ``tick``: the frame scheduler's batched step (plan, ``plugin.step`` on the model
  thread, nothing else), p50/p99;
* ``append_to_step``: from ``Attachment.submit`` of the append that completed a frame
  to the start of the step that consumed it, p50/p99 (the engine's own histogram);
* ``realtime``: frames stepped / frames sent (1.0 = kept up), padded frames, and how
  late the clients' own 80 ms loop ran (the event loop's headroom);
* ``first_audio``: ``--probes`` extra sessions (default 8) open during the measurement window
  and each streams a voiced tone from a random phase until its first audio delta arrives:
  p50 / max of stream start to first ``response.output_audio.delta`` under the load of N
  sessions (the echo answers one frame late, so its floor is one frame period, 80 ms, plus
  the tick wait; ``bench.first_audio`` measures the same over WebSocket and for PersonaPlex);
* the machine's load average at the start and end of each run (other work on the box);
* CPU (process, % of one core) and RSS, each run in its own interpreter; for the soak
  run, RSS sampled every 5 s and the slope of a least-squares line through the second
  half (MB per minute). The soak caps each session's conversation at
  ``--soak-conversation-items`` (default 64) items: a session's history is the one
  thing that grows with its length, up to ``EngineConfig.max_conversation_items``
  (1024; at this benchmark's one reply per 3.2 s that bound is reached after ~55 min).

Run: ``python -m bench.engine [--sessions 100 500 1000] [--seconds 20] [--tick-ms 0]
[--soak-seconds 600 --soak-sessions 500] [--out bench/results/engine.json]``. ``--tick-ms`` sets
``EngineConfig.tick_ms`` (default: 0, the engine's own default: a frame is stepped as soon as it
is complete; ``5`` = a fixed 5 ms tick, ``80`` = one tick per frame period). Prints a table and
writes JSON.
The goal on a 2-core CPU: 1000 sessions at real time with p99 append-to-step < 10 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

import numpy as np

from bench.report import percentile, print_table, write_json

__all__ = ["main", "run_once"]

FRAME_S = 0.08
RATE = 24000


#: A client talks in turns: this many frames of voiced tone, then this many of silence, so the echo's
#: responses end and the per-response state is released (as in a conversation).
TALK_FRAMES, PAUSE_FRAMES = 30, 10

#: The printed table: one row per run (the JSON has every field).
COLUMNS = [
    ("sessions", "N"),
    ("tick_p50_ms", "tick p50 ms"),
    ("tick_p99_ms", "tick p99 ms"),
    ("append_to_step_p50_ms", "append->step p50 ms"),
    ("append_to_step_p99_ms", "append->step p99 ms"),
    ("realtime_ratio", "realtime", ".4f"),
    ("frames_padded", "padded"),
    ("first_audio_ms", "first audio p50 ms"),
    ("first_audio_max_ms", "first audio max ms"),
    ("client_loop_late_p99_ms", "client late p99 ms"),
    ("cpu_percent", "CPU %", ".1f"),
    ("rss_mb", "RSS MB", ".1f"),
    ("load_average_start", "load at start", lambda load: " ".join(f"{x:.2f}" for x in load)),
]


def _frames() -> tuple[bytes, bytes]:
    from duplex.protocol.audio import pcm16_encode

    t = np.arange(int(RATE * FRAME_S), dtype=np.float32) / RATE
    tone = pcm16_encode((0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32))
    return tone, bytes(len(tone))


async def _client_group(
    atts: list[Any], phase_s: float, stop_at: float, stats: dict[str, Any], ack_every: int
) -> None:
    from duplex.engine import Detached
    from duplex.protocol.realtime.commands import InputAudioBufferAppend

    loop = asyncio.get_running_loop()
    tone, silence = (InputAudioBufferAppend(audio=a) for a in _frames())
    start = stats["t0"] + phase_s
    k = 0
    counts = [0] * len(atts)
    while True:
        due = start + k * FRAME_S
        if due >= stop_at:
            return
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            stats["client_late_s"].append(-delay)
        frame = tone if k % (TALK_FRAMES + PAUSE_FRAMES) < TALK_FRAMES else silence
        for i, att in enumerate(atts):
            att.submit(frame)
            stats["sent"] += 1
            try:
                while att.pending():
                    event = await att.next_event()
                    counts[i] += 1
                    if counts[i] % ack_every == 0 and event.server_event_seq is not None:
                        att.ack(event.server_event_seq)
            except Detached:
                stats["detached"] += 1
        k += 1


async def run_once(
    n: int,
    seconds: float,
    tick_ms: float | None,
    *,
    warmup_s: float = 2.0,
    groups: int = 16,
    ack_every: int = 32,
    rss_every_s: float | None = None,
    conversation_items: int | None = None,
    probes: int = 8,
) -> dict[str, Any]:
    import psutil

    from bench.first_audio import probe_engine, summary
    from duplex.engine import Engine, EngineConfig
    from duplex.plugins.builtin.echo import EchoPlugin

    proc = psutil.Process()
    load_start = os.getloadavg()
    plugin = EchoPlugin(max_sessions=n + probes)
    plugin.load()
    config = EngineConfig(
        max_sessions=n + probes,
        tick_ms=tick_ms,
        reaper_interval_s=5.0,
        max_conversation_items=conversation_items or EngineConfig().max_conversation_items,
    )
    loop = asyncio.get_running_loop()
    async with Engine(plugin, config) as engine:
        atts = [await engine.open() for _ in range(n)]
        for att in atts:
            await att.next_event()
        stats: dict[str, Any] = {"sent": 0, "detached": 0, "client_late_s": [], "t0": loop.time() + 0.05}
        stop_at = stats["t0"] + warmup_s + seconds
        size = (n + groups - 1) // groups
        tasks = [
            asyncio.create_task(
                _client_group(
                    atts[g * size : (g + 1) * size], g * FRAME_S / groups, stop_at, stats, ack_every
                )
            )
            for g in range(groups)
            if atts[g * size : (g + 1) * size]
        ]
        await asyncio.sleep(max(0.0, stats["t0"] + warmup_s - loop.time()))
        m = engine.metrics
        for h in (m.tick_duration_s, m.append_to_step_s, m.lateness_s, m.batch_size):
            h.reset_recent()
        stats["client_late_s"].clear()
        sent0, stepped0, padded0 = stats["sent"], m.frames_stepped.value, m.frames_padded.value
        cpu0, wall0 = proc.cpu_times(), time.perf_counter()
        probe_task = asyncio.create_task(probe_engine(engine, probes, seed=n)) if probes else None
        rss: list[tuple[float, float]] = []
        if rss_every_s:
            while loop.time() < stop_at - rss_every_s:
                rss.append((loop.time() - stats["t0"], proc.memory_info().rss / 2**20))
                await asyncio.sleep(rss_every_s)
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - wall0
        cpu1 = proc.cpu_times()
        first_audio = await probe_task if probe_task is not None else []
        sent = stats["sent"] - sent0
        stepped = m.frames_stepped.value - stepped0
        result: dict[str, Any] = {
            "sessions": n,
            "seconds": round(wall, 2),
            "tick_ms": tick_ms,
            "tick_p50_ms": _ms(m.tick_duration_s.percentile(0.5)),
            "tick_p99_ms": _ms(m.tick_duration_s.percentile(0.99)),
            "batch_p50": m.batch_size.percentile(0.5),
            "append_to_step_p50_ms": _ms(m.append_to_step_s.percentile(0.5)),
            "append_to_step_p99_ms": _ms(m.append_to_step_s.percentile(0.99)),
            "lateness_p99_ms": _ms(m.lateness_s.percentile(0.99)),
            "first_audio_ms": summary(first_audio)["p50_ms"],
            "first_audio_max_ms": summary(first_audio)["max_ms"],
            "first_audio_probes": len(first_audio),
            "frames_sent": sent,
            "frames_stepped": stepped,
            "realtime_ratio": round(stepped / sent, 4) if sent else None,
            "frames_padded": m.frames_padded.value - padded0,
            "client_loop_late_p99_ms": _ms(percentile(stats["client_late_s"], 99)),
            "slow_reader_detaches": m.slow_reader_detaches.value,
            "cpu_percent": round(100 * ((cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)) / wall, 1),
            "rss_mb": round(proc.memory_info().rss / 2**20, 1),
            "max_conversation_items": config.max_conversation_items,
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
        }
        if rss:
            result["rss_samples_mb"] = [(round(t, 1), round(v, 1)) for t, v in rss]
            half = rss[len(rss) // 2 :]
            if len(half) >= 2:
                xs = np.array([t for t, _ in half]) / 60
                ys = np.array([v for _, v in half])
                result["rss_slope_mb_per_min"] = round(float(np.polyfit(xs, ys, 1)[0]), 3)
    plugin.close()
    return result


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 3)


def _run_in_child(n: int, seconds: float, tick: float | None, **kw: Any) -> dict[str, Any]:
    """One run in a fresh interpreter, so its RSS and CPU are its own."""
    spec = json.dumps({"n": n, "seconds": seconds, "tick": tick, **kw})
    out = subprocess.run(
        [sys.executable, "-m", "bench.engine", "--one", spec], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[100, 500, 1000])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--tick-ms", type=float, default=0.0, help="scheduler tick (0: step as soon as a frame is ready)"
    )
    parser.add_argument("--soak-seconds", type=float, default=0.0, help="RSS soak length (0: none)")
    parser.add_argument("--soak-sessions", type=int, default=0, help="soak sessions (default: largest N)")
    parser.add_argument(
        "--soak-conversation-items", type=int, default=64, help="conversation bound in the soak"
    )
    parser.add_argument("--probes", type=int, default=8, help="first-audio probe sessions per run")
    parser.add_argument("--out", default="bench/results/engine.json")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: one run, JSON on stdout
    args = parser.parse_args(argv)
    if args.one:
        spec = json.loads(args.one)
        result = asyncio.run(
            run_once(
                spec["n"],
                spec["seconds"],
                spec["tick"],
                rss_every_s=spec.get("rss_every_s"),
                conversation_items=spec.get("conversation_items"),
                probes=spec.get("probes", 8),
            )
        )
        print(json.dumps(result))
        return
    tick = args.tick_ms
    runs = []
    for n in args.sessions:
        result = _run_in_child(n, args.seconds, tick, probes=args.probes)
        runs.append(result)
        print_table([result], COLUMNS, file=sys.stderr)  # progress: each run as it ends
    print_table(runs, COLUMNS, title=f"Engine on echo, {args.seconds:g} s a run, tick_ms {tick:g}")
    soak = None
    if args.soak_seconds:
        soak_n = args.soak_sessions or max(args.sessions)
        soak = _run_in_child(
            soak_n,
            args.soak_seconds,
            tick,
            rss_every_s=5.0,
            conversation_items=args.soak_conversation_items,
            probes=args.probes,
        )
        print_table([soak], COLUMNS, title=f"Soak, {args.soak_seconds:g} s")
        print(f"soak: RSS slope over the second half {soak.get('rss_slope_mb_per_min')} MB/min")
    out = {
        "benchmark": "engine",
        "plugin": "echo",
        "frame_ms": 80,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "command": "python -m bench.engine " + " ".join(argv if argv is not None else sys.argv[1:]),
        "runs": runs,
        "soak": soak,
    }
    print(f"wrote {write_json(args.out, out)}")


if __name__ == "__main__":
    main()
