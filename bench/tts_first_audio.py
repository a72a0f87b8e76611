"""Where Qwen3-TTS's first audio goes: each part of a join and of the first step, timed apart.

N requests join at once (as ``bench.batch_models``' closed loop starts them) and the parts of
their first audio are timed one after another, each ended by a device sync: ``begin`` (tokenizer,
prompt embeddings, the prefill), per request and in total; the decode step (``BatchedTalker.step``);
the step's one read-back (end-of-speech per row); the codec decode of each row's first chunk, one
row at a time and all rows in one call (``decode_opening``, what ``advance`` does); and,
for comparison, the whole ``advance`` that does the last three. Repeated ``--repeats`` times after
a warm-up (graph capture happens there); medians are printed in ms and written as JSON.

Run::

    python -m bench.tts_first_audio --qwen-size 0.6b --device cuda --concurrency 1,16
    python -m bench.tts_first_audio --qwen-size tiny --concurrency 1,4
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import machine, print_table, write_json

__all__ = ["main"]

DEFAULT_OUT = Path(__file__).parent / "results" / "tts_first_audio.json"
TEXT = "The quick brown fox jumps over the lazy dog. It was a bright, cold day in April."
COLUMNS = [
    ("concurrency", "N"),
    ("cuda_graphs", "graphs"),
    ("begin_each_ms", "begin each"),
    ("begin_all_ms", "begin all"),
    ("step_ms", "step"),
    ("readback_ms", "read-back"),
    ("codec_each_ms", "codec each"),
    ("codec_all_ms", "codec all"),
    ("codec_opening_ms", "codec opening"),
    ("advance_ms", "advance"),
    ("first_audio_ms", "first audio"),
]


def _median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000.0, 2)


def _measure(plugin: Any, n: int, repeats: int, sync: Any) -> dict:
    from duplex.plugins.base import BatchRequest, SlotOptions

    gen = plugin.generator
    eos_id = gen.cfg.talker.codec_eos_token_id
    names = ("each", "all", "step", "read", "codec1", "codec", "open", "adv")
    parts: dict[str, list[float]] = {k: [] for k in names}
    for r in range(repeats + 1):
        for slot in range(n):
            plugin.open_slot(slot, SlotOptions())
        t0 = time.perf_counter()
        for slot in range(n):
            t = time.perf_counter()
            plugin.begin(BatchRequest(slot=slot, epoch=0, text=TEXT, options={"seed": 100 * r + slot}))
            sync()
            parts["each"].append(time.perf_counter() - t)
        parts["all"].append(time.perf_counter() - t0)
        # The first step's parts, on a copy of the state a plain advance would see.
        plugin._exec_host.zero_()
        plugin._exec_host[:n] = True
        t = time.perf_counter()
        codes = gen.step(plugin._exec_host)
        sync()
        parts["step"].append(time.perf_counter() - t)
        t = time.perf_counter()
        (codes[:, 0] == eos_id).cpu().tolist()
        parts["read"].append(time.perf_counter() - t)
        t = time.perf_counter()
        for slot in range(n):
            t1 = time.perf_counter()
            gen.decode(slot, 0, 1, plugin._left_context)
            parts["codec1"].append(time.perf_counter() - t1)
        parts["codec"].append(time.perf_counter() - t)
        t = time.perf_counter()
        gen.decode_opening(1)
        parts["open"].append(time.perf_counter() - t)
        for slot in range(n):  # the same joins again, then one real advance
            plugin.cancel_slot(slot, epoch=0)
            plugin.begin(BatchRequest(slot=slot, epoch=0, text=TEXT, options={"seed": 100 * r + slot}))
        sync()
        t = time.perf_counter()
        plugin.advance(list(range(n)))
        sync()
        parts["adv"].append(time.perf_counter() - t)
        for slot in range(n):
            plugin.close_slot(slot)
        if r == 0:  # the warm-up round (graph capture) is not counted
            parts = {k: [] for k in parts}
    row = {
        "concurrency": n,
        "begin_each_ms": _median_ms(parts["each"]),
        "begin_all_ms": _median_ms(parts["all"]),
        "step_ms": _median_ms(parts["step"]),
        "readback_ms": _median_ms(parts["read"]),
        "codec_each_ms": _median_ms(parts["codec1"]),
        "codec_all_ms": _median_ms(parts["codec"]),
        "codec_opening_ms": _median_ms(parts["open"]),
        "advance_ms": _median_ms(parts["adv"]),
    }
    row["first_audio_ms"] = round(row["begin_all_ms"] + row["advance_ms"], 2)
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qwen-size", default="tiny", help="tiny, 0.6b, 1.7b")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--json", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    import torch

    from batch_models.qwen3_tts.plugin import Qwen3TTSPlugin
    from batch_models.qwen3_tts.testing import write_checkpoint

    levels = sorted({int(n) for n in args.concurrency.split(",") if n.strip()})
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tiny = args.qwen_size == "tiny"
        root = write_checkpoint(Path(tmp) / "ckpt", size=args.qwen_size, weights=tiny)
        plugin = Qwen3TTSPlugin(
            str(root),
            max_sessions=max(levels),
            device=args.device,
            dtype=args.dtype,
            random_weights=not tiny,
            max_audio_s=6.0,
            cuda_graphs=args.cuda_graphs,
        )
        plugin.load()
        for n in levels:
            rows.append({**_measure(plugin, n, args.repeats, sync), "cuda_graphs": args.cuda_graphs and cuda})
    result = {
        "machine": machine(),
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(0) if cuda else args.device,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rows": rows,
    }
    print_table(rows, COLUMNS, title=f"Qwen3-TTS {args.qwen_size}: first audio by part (ms, medians)")
    write_json(args.json, result)
    print(f"\nwrote {args.json}")
    return result


if __name__ == "__main__":
    main()
