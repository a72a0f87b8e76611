"""Fairness of the embedded default model: one session's long typed reply against another's short turns.

The default plugin runs every session's work on one model thread, first come first served, so
what one session asks for must not stall the others. Each scenario runs against a fresh server
in a child process (``duplex serve``'s plugin path: the default plugin, echo reply, models warmed
up), driven by two ``DuplexClient`` sessions over loopback. A turn is typed: a user text item,
then ``response.create``; the echo reply speaks "You said: <text>." back.

* ``alone``: the short turn ("Good morning") with nothing else running, ``--turns`` times.
  *first audio*: from sending ``response.create`` to the turn's first
  ``response.output_audio.delta`` at the client; *answered*: to its ``response.done``.
* ``fairness``: session A types ``--fair-chars`` characters without punctuation (the attack: the
  splitter used to make it one Piper call); ``--start-after-s`` after A's first audio, session
  B takes ``--turns`` short turns one after the other. Reports B's first audio and answered
  times, A's first audio (from its ``response.create``), and whether A was still speaking when
  B's last turn ended.
* ``cancel``: A types ``--cancel-chars`` characters; ``--cancel-after-s`` after A's
  ``response.created`` it sends ``response.cancel``. Reports the cancel to
  ``response.done{cancelled}`` time, then B's first audio and answered times on a short turn
  sent right after.
* ``memory``: A's ``--cancel-chars`` reply spoken to its end. Reports how long it took.

For every scenario the server's resident memory is read from ``/proc`` (Linux): after warm-up
(``rss_start_mb``), its peak over the scenario (``VmHWM``, ``rss_peak_mb``) and at the end
(``rss_end_mb``). The servers accept typed messages up to ``--max-input-text-chars`` (above the
longest text sent; the plugin's own default is 4,000).

Run: ``python -m bench.default_fairness [--scenarios alone fairness cancel memory] [--turns 5]
[--out PATH]``. Prints a table and writes JSON (default ``bench/results/default_fairness.json``).
The goal (the issue's target): B's first audio under 3 s while A speaks 3,000 characters, and a
cancel that frees the model thread at the next piece. The machine's load average is recorded:
on a shared machine other work slows every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from bench.default_latency import summary
from bench.loopback import child_server, free_port, serve_engine
from bench.report import Column, print_table, write_json

__all__ = ["main"]

SHORT = "Good morning"
WORDS = "many blue cars drive home slowly after the long day "
DEFAULT_OUT = Path(__file__).parent / "results" / "default_fairness.json"
SCENARIOS = ("alone", "fairness", "cancel", "memory")
TIMEOUT_S = 600.0  # the longest wait for one event (the old build spoke 6,000 characters in one call)


def paragraph(chars: int) -> str:
    """``chars`` characters of words without punctuation."""
    return (WORDS * (chars // len(WORDS) + 1))[:chars]


class Watch:
    """Reads every event of one client on a task of its own and keeps the times that matter.

    Per response (in order of ``response.created``): when it was created, its first audio delta
    and its ``response.done`` (with its status). ``changed`` wakes a waiter on each of them.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self.created: list[float] = []
        self.first_audio: dict[str, float] = {}
        self.done: dict[str, tuple[float, str]] = {}
        self.ids: list[str] = []
        self.changed = asyncio.Event()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        from clients.base import ClientClosed
        from clients.collector import event_type

        try:
            while True:
                event = await self.client.recv()
                now = time.perf_counter()
                kind = event_type(event)
                if kind == "response.created":
                    self.ids.append(event.response.id)
                    self.created.append(now)
                elif kind == "response.output_audio.delta":
                    self.first_audio.setdefault(event.response_id, now)
                elif kind == "response.done":
                    self.done[event.response.id] = (now, event.response.status)
                else:
                    continue
                self.changed.set()
        except ClientClosed:
            return

    async def until(self, condition: Any, timeout: float) -> None:
        """Wait until ``condition()`` holds (checked at each event that matters)."""
        async with asyncio.timeout(timeout):
            while not condition():
                self.changed.clear()
                await self.changed.wait()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def _typed(client: Any, text: str) -> float:
    """Send a typed message and ``response.create``; the time the create was sent."""
    from duplex.protocol import ConversationItemCreate, InputTextPart, MessageItem, ResponseCreate

    message = MessageItem(role="user", content=[InputTextPart(text=text)])
    await client.send(ConversationItemCreate(item=message))
    sent = time.perf_counter()
    await client.send(ResponseCreate())
    return sent


async def _short_turn(watch: Watch) -> tuple[float, float, str]:
    """One short typed turn to its ``response.done``: (first audio in s, answered in s, status)."""
    n = len(watch.ids)
    sent = await _typed(watch.client, SHORT)
    await watch.until(lambda: len(watch.ids) > n and watch.ids[n] in watch.done, TIMEOUT_S)
    response_id = watch.ids[n]
    done_at, status = watch.done[response_id]
    return watch.first_audio[response_id] - sent, done_at - sent, status


async def _sleep_until(t: float) -> None:
    """Sleep until ``time.perf_counter()`` reaches ``t``."""
    await asyncio.sleep(max(0.0, t - time.perf_counter()))


def _turns_summary(turns: list[tuple[float, float, str]]) -> dict[str, Any]:
    return {
        "b_first_audio_s": summary([first for first, _, _ in turns]),
        "b_answered_s": summary([answered for _, answered, _ in turns]),
        "b_first_audio_each_s": [round(first, 3) for first, _, _ in turns],
        "b_statuses": sorted({status for _, _, status in turns}),
    }


def _memory_mb(pid: int) -> dict[str, float]:
    """The process's resident set and its peak, in MB (``/proc/PID/status``)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = round(int(value.split()[0]) / 1024, 1)
    return {"rss_mb": fields["VmRSS"], "peak_mb": fields["VmHWM"]}


async def _scenario(name: str, url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    from clients.websocket import DuplexClient
    from duplex.protocol import ResponseCancel

    result: dict[str, Any] = {"scenario": name, "rss_start_mb": _memory_mb(pid)["rss_mb"]}
    async with DuplexClient(url, model="default") as a, DuplexClient(url, model="default") as b:
        talker, other = Watch(a), Watch(b)
        try:
            if name == "alone":
                result.update(_turns_summary([await _short_turn(other) for _ in range(args.turns)]))
            elif name == "fairness":
                sent = await _typed(a, paragraph(args.fair_chars))
                await talker.until(lambda: talker.ids and talker.ids[0] in talker.first_audio, TIMEOUT_S)
                long_id = talker.ids[0]
                await _sleep_until(talker.first_audio[long_id] + args.start_after_s)
                turns = [await _short_turn(other) for _ in range(args.turns)]
                result["a_chars"] = args.fair_chars
                result.update(_turns_summary(turns))
                result["a_still_speaking_after_b"] = long_id not in talker.done
                result["a_first_audio_s"] = round(talker.first_audio[long_id] - sent, 3)
                await a.send(ResponseCancel())
                await talker.until(lambda: long_id in talker.done, TIMEOUT_S)
            elif name == "cancel":
                await _typed(a, paragraph(args.cancel_chars))
                await talker.until(lambda: talker.ids, TIMEOUT_S)
                long_id = talker.ids[0]
                await _sleep_until(talker.created[0] + args.cancel_after_s)
                cancelled = time.perf_counter()
                await a.send(ResponseCancel())
                await talker.until(lambda: long_id in talker.done, TIMEOUT_S)
                done_at, status = talker.done[long_id]
                first, answered, b_status = await _short_turn(other)
                result["a_chars"] = args.cancel_chars
                result["cancel_after_s"] = args.cancel_after_s
                result["a_status"] = status
                result["cancel_to_done_s"] = round(done_at - cancelled, 3)
                result["b_first_audio_after_cancel_s"] = round(first, 3)
                result["b_answered_after_cancel_s"] = round(answered, 3)
                result["b_statuses"] = [b_status]
            elif name == "memory":
                sent = await _typed(a, paragraph(args.cancel_chars))
                await talker.until(lambda: talker.ids and talker.ids[0] in talker.done, TIMEOUT_S)
                done_at, status = talker.done[talker.ids[0]]
                result["a_chars"] = args.cancel_chars
                result["a_status"] = status
                result["a_reply_s"] = round(done_at - sent, 3)
        finally:
            await talker.close()
            await other.close()
    memory = _memory_mb(pid)
    result["rss_peak_mb"], result["rss_end_mb"] = memory["peak_mb"], memory["rss_mb"]
    return result


def _run_scenario(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """``name`` against a fresh server child (its memory figures are its own)."""
    port = free_port()
    spec = json.dumps({"port": port, "max_input_text_chars": args.max_input_text_chars})
    command = [sys.executable, "-m", "bench.default_fairness", "--serve", spec]
    with child_server(command, port, start_timeout_s=180) as proc:
        return asyncio.run(_scenario(name, f"ws://127.0.0.1:{port}/v1/realtime", proc.pid, args))


def _serve(spec: dict[str, Any]) -> None:
    """The child: the default plugin as ``duplex serve`` builds it, on ``spec["port"]``."""
    from duplex.engine import Engine, EngineConfig
    from duplex.server.serve import build_plugin

    options = {"reply": "echo", "max_sessions": 2, "max_input_text_chars": spec["max_input_text_chars"]}
    plugin, name = build_plugin("default", None, options)
    serve_engine(Engine(plugin, EngineConfig(max_sessions=2), model_name=name), spec["port"], name)


def _p50_max(stats: dict[str, float]) -> str:
    return f"{stats['p50']:.2f} / {stats['max']:.2f}"


def _rss(row: dict[str, Any]) -> str:
    return f"{row['rss_start_mb']:.0f} / {row['rss_peak_mb']:.0f} / {row['rss_end_mb']:.0f}"


#: The printed table, one row per scenario (``b_after_cancel`` and ``rss`` are built for it).
COLUMNS: list[Column] = [
    "scenario",
    ("a_chars", "A chars"),
    ("b_first_audio_s", "B first audio p50/max s", _p50_max),
    ("b_answered_s", "B answered p50/max s", _p50_max),
    ("a_first_audio_s", "A first audio s"),
    ("cancel_to_done_s", "cancel->done s"),
    ("b_after_cancel", "B after cancel s"),
    ("rss", "RSS start/peak/end MB"),
]


def _print_table(rows: list[dict[str, Any]]) -> None:
    shown = []
    for row in rows:
        after_cancel = None
        if "b_first_audio_after_cancel_s" in row:
            first, answered = row["b_first_audio_after_cancel_s"], row["b_answered_after_cancel_s"]
            after_cancel = f"{first:.2f} / {answered:.2f}"
        shown.append({**row, "b_after_cancel": after_cancel, "rss": _rss(row)})
    print_table(shown, COLUMNS)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--turns", type=int, default=5, help="short turns of session B per scenario")
    parser.add_argument("--fair-chars", type=int, default=3000)
    parser.add_argument("--start-after-s", type=float, default=1.0, help="B's start after A's first audio")
    parser.add_argument("--cancel-chars", type=int, default=6000)
    parser.add_argument("--cancel-after-s", type=float, default=1.0)
    parser.add_argument("--max-input-text-chars", type=int, default=8000)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # the server child's spec (JSON)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(json.loads(args.serve))
        return None

    results: dict[str, Any] = {
        "benchmark": "default_fairness",
        "host": {
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "load_average_1m_at_start": round(os.getloadavg()[0], 2),
        },
        "goal": "B's first audio under 3 s while A speaks 3,000 characters; a cancel frees the thread",
        "scenarios": [],
    }
    for name in args.scenarios:
        t0 = time.perf_counter()
        row = _run_scenario(name, args)
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        results["scenarios"].append(row)
        print(json.dumps(row), flush=True)
    results["host"]["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    _print_table(results["scenarios"])
    print(f"wrote {write_json(args.out, results)}")
    return results


if __name__ == "__main__":
    main()
