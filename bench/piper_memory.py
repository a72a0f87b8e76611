"""``python -m bench.piper_memory``: the Piper plugin's memory across syntheses, and what bounding it
costs in synthesis time.

Memory: each configuration (the plugin options in ``CONFIGS``) runs in a fresh process, ``rounds``
rounds of two requests side by side (``workers=2``, ``threads=1``), each of 250 to 1,000 characters
with no sentence mark (so pieces of up to 200 characters, as the reliability suite sends), the same
texts for every configuration; the process's RSS is read after every round. A leak grows without
bound; an arena grows to a plateau.

Time: the configurations' plugins are loaded side by side in one process and take turns (each turn
``pieces`` requests of 50 to 200 characters, one at a time, ``threads=1``), and the CPU time of the
thread that calls the model is summed per configuration. Interleaved turns and thread CPU time keep
other work on the machine out of the comparison as far as possible.

Examples::

    python -m bench.piper_memory                      # 16 rounds, 3 turns of 12 requests each
    python -m bench.piper_memory --rounds 24 --turns 5
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import sys
import time
from typing import Any

from bench.report import machine, print_table, write_json

#: The plugin options compared; the first is the baseline of the time column.
CONFIGS: dict[str, dict[str, Any]] = {
    "memory_pattern (before)": {"memory_pattern": True},
    "default": {},
    "arena_shrinkage": {"arena_shrinkage": True},
}

WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
MIB = 1024 * 1024


def _plugin(options: dict[str, Any], workers: int, slots: int) -> Any:
    from batch_models.piper.plugin import PiperTTSPlugin
    from duplex.plugins.base import SlotOptions

    plugin = PiperTTSPlugin(
        noise_scale=0.0, noise_w_scale=0.0, threads=1, workers=workers, max_sessions=slots, **options
    )
    plugin.load()
    for slot in range(slots):
        plugin.open_slot(slot, SlotOptions())
    return plugin


def _speak(plugin: Any, texts: list[str], epoch: int) -> None:
    """``texts`` as requests on slots 0, 1, ... stepped together until every one has ended."""
    from duplex.plugins.base import BatchRequest

    for slot, text in enumerate(texts):
        plugin.begin(BatchRequest(slot=slot, epoch=epoch, text=text, options={}))
    active = list(range(len(texts)))
    while active:
        active = [o.slot for o in plugin.advance(active) if not o.end_of_turn]


def _rss_rounds(options: dict[str, Any], rounds: int) -> list[float]:
    """In a fresh process: the RSS (MB) after each round of two requests side by side."""
    import psutil

    plugin = _plugin(options, workers=2, slots=2)
    rng = random.Random(0)
    rss = []
    for i in range(rounds):
        texts = []
        for _ in range(2):
            start, length = rng.randint(0, 50), rng.randint(250, 1000)
            texts.append((WORDS * 20)[start : start + length])
        _speak(plugin, texts, epoch=i)
        rss.append(round(psutil.Process().memory_info().rss / MIB, 1))
    return rss


def _cpu_turns(turns: int, pieces: int) -> dict[str, float]:
    """Thread CPU seconds of each configuration's synthesis, the configurations taking turns."""
    plugins = {name: _plugin(options, workers=1, slots=1) for name, options in CONFIGS.items()}
    rng = random.Random(1)
    texts = [
        (WORDS * 4)[s : s + n] for s, n in ((rng.randint(0, 60), rng.randint(50, 200)) for _ in range(pieces))
    ]
    names = list(CONFIGS)
    spent = dict.fromkeys(names, 0.0)
    for turn in range(turns):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:  # a different first each turn
            t0 = time.thread_time()
            for i, text in enumerate(texts):
                _speak(plugins[name], [text], epoch=i)
            spent[name] += time.thread_time() - t0
        print(
            f"turn {turn + 1}/{turns}: " + ", ".join(f"{n} {s:.1f} s" for n, s in spent.items()),
            file=sys.stderr,
        )
    return spent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.piper_memory", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=16, help="rounds of two requests per configuration")
    p.add_argument("--turns", type=int, default=3, help="turns of each configuration in the time comparison")
    p.add_argument("--pieces", type=int, default=12, help="requests per turn")
    p.add_argument("--json", default="bench/results/piper_memory.json", help="where to write the results")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spawn = multiprocessing.get_context("spawn")
    rows = []
    for name, options in CONFIGS.items():
        print(f"{name}: {args.rounds} rounds ...", file=sys.stderr, flush=True)
        with spawn.Pool(1) as pool:
            rss = pool.apply(_rss_rounds, (options, args.rounds))
        rows.append({"config": name, "options": options, "rss_mb": rss})
    spent = _cpu_turns(args.turns, args.pieces)
    base = spent[next(iter(CONFIGS))]
    for row in rows:
        rss = row["rss_mb"]
        half = len(rss) // 2
        row |= {
            "rss_first_mb": rss[0],
            "rss_last_mb": rss[-1],
            "rss_max_mb": max(rss),
            "growth_second_half_mb": round(rss[-1] - rss[half - 1], 1) if half else None,
            "synthesis_cpu_s": round(spent[row["config"]], 2),
            "time_vs_before": round(spent[row["config"]] / base, 3),
        }
    columns = [
        "config",
        ("rss_first_mb", "RSS round 1 MB"),
        ("rss_last_mb", f"round {args.rounds} MB"),
        ("rss_max_mb", "max MB"),
        ("growth_second_half_mb", "2nd half growth MB"),
        ("synthesis_cpu_s", "synthesis CPU s"),
        ("time_vs_before", "x before", ".3f"),
    ]
    print_table(rows, columns, title="Piper: RSS after each round of two requests, and synthesis time")
    report = {
        "machine": machine(),
        "rounds": args.rounds,
        "turns": args.turns,
        "pieces": args.pieces,
        "rows": rows,
    }
    print(f"json: {write_json(args.json, report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
