"""Nemotron VoiceChat capacity: how many real-time sessions one accelerator carries.

The model is the full Nemotron VoiceChat architecture (Nemotron-Nano-9B-v2
thinker, 24-layer streaming encoder, Gemma3 talker with its codec;
``duplex.plugins.nemotron.config.full_config``) with random weights built on the
device (bfloat16 thinker on a GPU), or the tiny one with ``--tiny``. Nothing is
downloaded: the folder the plugin reads holds the two configs and a small
tokenizer trained on the spot. The modes are PersonaPlex's (``bench.personaplex``),
run on this model through its ``ServedModel``:

* ``--mode server`` (default): the whole server in a child process
  (``duplex.engine.Engine`` + ``duplex.server.create_app`` on loopback) and N
  WebSocket clients streaming 80 ms appends of 24 kHz PCM16 at real-time pacing for
  ``--seconds``; tick times come from the engine's frame scheduler,
  ``first_audio_ms`` is a client's first append to its first audio delta (median).
* ``--mode step``: the raw batched plugin step, N sessions every tick.

Every row has ``sessions, tick_p50_ms, tick_p99_ms, missed_deadlines`` (ticks over
the 80 ms frame period), ``first_audio_ms`` and ``gpu_mem_gib`` (peak allocated).
It prints a table, writes JSON (``--json``) and, with ``--plot``, a PNG beside it.
The goal on one H200: 32 sessions at tick p99 under 80 ms, first audio under 300 ms.

Run: ``python -m bench.nemotron_capacity --sessions 1,8,16,32 --json
bench/results/nemotron_capacity_h200.json --plot``; on a CPU, ``--tiny --sessions 1,2``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.personaplex.common import FRAME_MS, ServedModel, device_name

__all__ = ["NEMOTRON", "main", "write_assets"]

DEFAULT_JSON = Path(__file__).parent / "results" / "nemotron_capacity_h200.json"
PERSONA = "You are a friendly voice assistant. Answer questions about the weather in a few words."


def write_assets(root: Path, tiny: bool) -> Path:
    """A model folder without weights: the NeMo config, the backbone's config and a tokenizer."""
    from duplex.plugins.nemotron.loading import CONFIG_FILE, LLM_DIR
    from duplex.plugins.nemotron.presets import full_config, tiny_config
    from duplex.plugins.nemotron.testing import train_tokenizer
    from duplex.plugins.nemotron.tokens import TextTokenizer

    nemo, llm = tiny_config() if tiny else full_config()
    (root / LLM_DIR).mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(root / LLM_DIR / "tokenizer.json")
    if tiny:
        llm["vocab_size"] = TextTokenizer(tok, "<s>", "</s>", "<SPECIAL_12>").size
    (root / LLM_DIR / CONFIG_FILE).write_text(json.dumps(llm))
    (root / CONFIG_FILE).write_text(json.dumps(nemo))
    return root


def make_plugin(assets: Path, n: int, args: argparse.Namespace) -> Any:
    """The plugin with random weights of the folder's architecture and ``n`` slots (not loaded)."""
    from duplex.plugins.nemotron.plugin import NemotronVoiceChatPlugin

    options: dict[str, Any] = {
        "random_weights": True,
        "max_sessions": n,
        "device": args.device,
        "cuda_graphs": not args.no_cuda_graphs,
        "talker_dtype": args.talker_dtype,
    }
    if args.guidance != "checkpoint":
        options["guidance"] = args.guidance == "on"
    return NemotronVoiceChatPlugin(assets, **options)


def _child_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--tiny"] * args.tiny + ["--no-cuda-graphs"] * args.no_cuda_graphs
    flags += ["--guidance", args.guidance, "--talker-dtype", args.talker_dtype]
    return flags + (["--tick-ms", str(args.tick_ms)] if args.tick_ms is not None else [])


NEMOTRON = ServedModel(
    module="bench.nemotron_capacity",
    name="nemotron_voicechat",
    persona=PERSONA,
    frame_samples=1280,
    make_plugin=make_plugin,
    child_flags=_child_flags,
)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["server", "step", "both"], default="server")
    ap.add_argument("--sessions", default="1,8,16,32", help="comma-separated session counts")
    ap.add_argument("--tiny", action="store_true", help="the tiny architecture (CPU smoke run)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--warmup", type=int, default=20, help="frames (ticks) before the measured window")
    ap.add_argument("--ticks", type=int, default=100, help="step mode: measured ticks")
    ap.add_argument("--seconds", type=float, default=10.0, help="server mode: measured streaming time per N")
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument("--guidance", choices=["checkpoint", "on", "off"], default="checkpoint")
    ap.add_argument("--talker-dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--tick-ms", type=float, default=None, help="server mode: scheduler tick")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where the result JSON goes")
    ap.add_argument("--plot", action="store_true", help="also draw tick time against sessions (PNG)")
    ap.add_argument("--merge", action="store_true", help="keep the other modes already in --json")
    ap.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--assets", default=None, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark as the command line says; returns the result dict that was written."""
    args = _parser().parse_args(argv)
    if args.serve:
        from bench.personaplex import serve

        args.device = args.device or "cpu"
        args.sessions_one = int(args.sessions)
        serve(args, NEMOTRON)
        return {}
    import torch

    from bench.personaplex import plot, run_server, run_step, table

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    sessions = [int(s) for s in args.sessions.split(",") if s]
    result: dict[str, Any] = {}
    if args.merge and args.json.is_file():
        result = json.loads(args.json.read_text())
    result.update(
        model="tiny (random weights)" if args.tiny else "full size, random weights",
        device=args.device,
        device_name=device_name(args.device),
        torch=torch.__version__,
        cuda_graphs=not args.no_cuda_graphs and args.device != "cpu",
        guidance=args.guidance,
        talker_dtype=args.talker_dtype,
        frame_ms=FRAME_MS,
    )
    progress = None if args.quiet else sys.stderr
    modes = result.setdefault("modes", {})
    with tempfile.TemporaryDirectory() as tmp:
        assets = write_assets(Path(tmp), args.tiny)
        for mode in ("step", "server"):
            if args.mode not in (mode, "both"):
                continue
            rows = []
            for n in sessions:
                if mode == "step":
                    row = run_step(assets, n, args, NEMOTRON)
                else:
                    row = run_server(assets, n, args, NEMOTRON, progress=progress)
                print(table([row]).splitlines()[-1], *(row.get("errors") or []), flush=True)
                rows.append(row)
            modes[mode] = rows
    result["rows"] = modes.get("server") or modes.get("step") or []
    result["rows_mode"] = "server" if modes.get("server") else "step"
    for mode, rows in modes.items():
        print(f"\n[{mode}]")
        print(table(rows))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    if args.plot:
        print(f"wrote {plot(result, args.json.with_suffix('.png'), title='Nemotron VoiceChat')}")
    return result


if __name__ == "__main__":
    main()
