"""Regenerate the Nemotron VoiceChat parity goldens: NVIDIA's reference run on our tiny checkpoint.

Run with the project's environment; it calls ``nemotron_reference.py`` in the parity
environment, a virtualenv of its own (4.7 GB; the install took 4 to 10 minutes on a 2-core
machine), and reads vLLM-Omni's wheel without installing it (nor vLLM)::

    python3 -m venv .venv-parity-nemo
    .venv-parity-nemo/bin/pip install torch==2.13.0            # first: the CPU build, pinned
    .venv-parity-nemo/bin/pip install "nemo-toolkit[speechlm2]==3.0.0"
    .venv-parity-nemo/bin/pip download --no-deps vllm-omni==0.30.0 -d .venv-parity-nemo/wheels
    .venv/bin/python tools/parity/nemotron_goldens.py \\
        --reference-python .venv-parity-nemo/bin/python \\
        --vllm-omni-wheel .venv-parity-nemo/wheels/vllm_omni-0.30.0-py3-none-any.whl

A run takes about 10 minutes (two reference runs; NeMo 3.0.0 recomputes the whole history of
a Nemotron backbone at every frame).

It writes the checkpoint ``duplex tiny-checkpoint`` writes (seed and talker settings from
``tests/parity/nemotron/scenario.json``), the scenario's audio, runs the reference twice
(float32, as NeMo runs on a CPU, and float64, the same code in double precision), checks that
the two agree on every token and code, and writes ``tests/parity/nemotron/goldens.npz`` (the
float64 run) and ``goldens.json`` (the checkpoint's and the audio's SHA-256, the reference's
package versions, and for each compared quantity how far the float32 run is from the float64
one and, for each choice, the float64 run's margin between its best and second-best
candidate). The test derives its tolerances from those.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from duplex.plugins.nemotron.loading import LLM_DIR
from duplex.plugins.nemotron.testing import folder_digest, make_tiny_checkpoint, speech_like
from duplex.plugins.nemotron.tokens import TextTokenizer

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent.parent / "tests" / "parity" / "nemotron"
REFERENCE = HERE / "nemotron_reference.py"


def write_checkpoint(root: Path, scenario: dict) -> Path:
    """The tiny checkpoint of the scenario's seed, its talker set to greedy choices."""
    return make_tiny_checkpoint(root, seed=int(scenario["checkpoint_seed"]), talker=scenario["greedy_talker"])


def audio_digest(audio: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(audio, dtype=np.float32).tobytes()).hexdigest()


def script_ids(tokenizer: TextTokenizer, script: list[dict]) -> list[int]:
    """The talker script's text token per frame: PAD runs, BOS, a sentence's tokens, EOS."""
    special = tokenizer.special
    ids: list[int] = []
    for part in script:
        if "pad" in part:
            ids += [special.pad] * int(part["pad"])
        elif "bos" in part:
            ids.append(special.bos)
        elif "eos" in part:
            ids.append(special.eos)
        else:
            ids += tokenizer.encode(part["text"])
    return ids


def margins(scores: np.ndarray, smallest: bool = False) -> np.ndarray:
    """Per row, the gap between the best and the second-best score (largest, or smallest)."""
    ordered = np.sort(-scores if smallest else scores, axis=-1)
    return ordered[..., -1] - ordered[..., -2]


def forced_frames(scenario: dict, tokenizer: TextTokenizer) -> list[int]:
    """Frames whose function token is a tool result's (their text is held at PAD)."""
    from duplex.plugins.nemotron.tools import tool_response_text

    frames = []
    for item in scenario["tool_results"]:
        count = len(tokenizer.encode(tool_response_text(item["output"])))
        frames += range(item["frame"], item["frame"] + count)
    return frames


def summarize(ref32: dict, ref64: dict, scenario: dict, tokenizer: TextTokenizer) -> dict:
    """Deviations (float32 run vs float64 run) and the float64 run's margins; refuses a disagreement."""
    for key in ("prompt_ids", "text", "function", "codes", "script_codes"):
        if not np.array_equal(ref32[key], ref64[key]):
            raise SystemExit(f"the reference's float32 and float64 runs disagree on {key}: change scenario")
    dev = {
        key: float(np.abs(ref32[key] - ref64[key]).max())
        for key in ("perception", "text_logits", "function_logits", "pcm")
    }
    for key in ("mog_logits", "rvq_scores"):
        both = np.concatenate([ref32[key], ref32["script_" + key]]) - np.concatenate(
            [ref64[key], ref64["script_" + key]]
        )
        dev[key] = float(np.abs(both).max())
    free = np.setdiff1d(np.arange(len(ref64["text"])), forced_frames(scenario, tokenizer))
    margin = {
        "text_logits": float(margins(ref64["text_logits"][free]).min()),
        "function_logits": float(margins(ref64["function_logits"][free]).min()),
        "mog_logits": float(
            min(margins(ref64["mog_logits"]).min(), margins(ref64["script_mog_logits"]).min())
        ),
        "rvq_scores": float(
            min(
                margins(ref64["rvq_scores"], smallest=True).min(),
                margins(ref64["script_rvq_scores"], smallest=True).min(),
            )
        ),
    }
    return {"dev": dev, "margin": margin}


def run_reference(python: str, wheel: Path, checkpoint: Path, run: Path, audio: Path, dtype: str, out: Path):
    command = [
        python,
        str(REFERENCE),
        "--checkpoint",
        str(checkpoint),
        "--scenario",
        str(run),
        "--audio",
        str(audio),
        "--vllm-omni-wheel",
        str(wheel),
        "--dtype",
        dtype,
        "--out",
        str(out),
    ]
    subprocess.run(command, check=True)
    with np.load(out) as data:
        return {k: data[k] for k in data.files}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference-python", required=True, help="the parity environment's python")
    parser.add_argument("--vllm-omni-wheel", type=Path, required=True)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    scenario = json.loads((args.out_dir / "scenario.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        checkpoint = write_checkpoint(work / "checkpoint", scenario)
        tokenizer = TextTokenizer(checkpoint / LLM_DIR / "tokenizer.json", "<s>", "</s>", "<SPECIAL_12>")
        audio = speech_like(int(scenario["frames"]), seed=int(scenario["audio_seed"]))
        np.save(work / "audio.npy", audio)
        run = dict(scenario, talker_script=script_ids(tokenizer, scenario["talker_script"]))
        (work / "run.json").write_text(json.dumps(run))
        refs = {
            dtype: run_reference(
                args.reference_python,
                args.vllm_omni_wheel,
                checkpoint,
                work / "run.json",
                work / "audio.npy",
                dtype,
                work / f"{dtype}.npz",
            )
            for dtype in ("float32", "float64")
        }
        summary = summarize(refs["float32"], refs["float64"], scenario, tokenizer)
        ref = refs["float64"]
        pcm_samples = int(scenario["pcm_frames"]) * (len(ref["pcm"]) // int(scenario["frames"]))
        goldens = {
            "script_text": np.array(run["talker_script"], dtype=np.int32),
            "pcm": ref["pcm"][:pcm_samples].astype(np.float32),
        }
        for key, value in ref.items():
            if key.startswith("prompt_") or key in ("text", "function", "codes", "script_codes"):
                goldens[key] = value.astype(np.int32)
            elif key in ("perception", "text_logits", "function_logits"):
                goldens[key] = value.astype(np.float32)
        meta = {
            "about": "NVIDIA's reference on the tiny checkpoint; see tools/parity/nemotron_goldens.py",
            "checkpoint_sha256": folder_digest(checkpoint),
            "audio_sha256": audio_digest(audio),
            "reference": {**json.loads(str(ref["versions"])), "prompt renderers": args.vllm_omni_wheel.name},
            **summary,
        }
    np.savez_compressed(args.out_dir / "goldens.npz", **goldens)
    (args.out_dir / "goldens.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta, indent=1), file=sys.stderr)


if __name__ == "__main__":
    main()
