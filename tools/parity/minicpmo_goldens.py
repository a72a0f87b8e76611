"""Regenerate the MiniCPM-o 4.5 parity goldens: the official duplex loop on our tiny checkpoint.

Run with the project's environment; it calls ``minicpmo_reference.py`` in the parity environment
(``python3 -m venv .venv-parity-minicpmo``, then ``pip install torch==2.13.0`` and
``pip install transformers==4.51.0 accelerate==1.12.0 safetensors soundfile pillow tqdm numpy`` and
``pip install --no-deps minicpmo-utils==1.0.7 einops==0.8.1``)::

    .venv/bin/python tools/parity/minicpmo_goldens.py \\
        --reference-python .venv-parity-minicpmo/bin/python --reference PATH/TO/MiniCPM-o-Demo

``PATH/TO/MiniCPM-o-Demo`` is a checkout of OpenBMB/MiniCPM-o-Demo at the commit
``minicpmo_reference.PINNED_COMMIT``. The script writes the tiny checkpoint (``duplex tiny-checkpoint
minicpmo_4_5``, seed 0), the scenario (four seconds of speech-like audio, a camera frame a second;
42 seconds of audio alone; a 2.5 s reference voice), runs the reference on them (the duplex loop; then
minicpmo-utils' flow on the first two units' speech codes, streamed as the duplex loop's code buffer
streams them, given the plugin's DiT noise table), then the four-unit session again on the
checkpoint's ``ENDINGS`` variants (a turn that ends, the speech head's end code drawn: keys
``{name}_*``, the flow on every chunk the loop's code buffer ran) and writes
``tests/parity/minicpmo/goldens.npz`` (the scenario and what the reference computed) and
``goldens.json`` (the checkpoints' SHA-256, the reference's commit and package versions). Regenerate
them whenever the checkpoint writer changes: the test compares the checkpoints' digests first.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from duplex.plugins.minicpmo.loading import find_checkpoint
from duplex.plugins.minicpmo.testing import ending_checkpoint, make_tiny_checkpoint
from duplex.plugins.minicpmo.token2wav import load_code_to_wave

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent.parent / "tests" / "parity" / "minicpmo"
REFERENCE = HERE / "minicpmo_reference.py"
UNITS = 4
LONG_UNITS = 32  # past the 30 s buffer's slide and the encoder cache's restart (both at unit 29)
SEED = 0
# The session again on variants of the checkpoint that end a turn and draw the speech head's end code
# (``testing.ending_checkpoint``; keys ``{name}_*``): ``<|turn_eos|>`` leads where token 321 would, the
# end code where code 2566 would, 6.25 % above it. ``end``: ``<|turn_eos|>`` is the third unit's 19th
# token (then the forced ``<|chunk_eos|>``); the turn's first unit ends after 7 codes, the second runs
# its 25, the third (the turn's end) ends after 15, the fourth (a new turn's first) runs 25.
# ``reopen``: ``<|turn_eos|>`` is the second unit's 9th token and text follows it in the unit, which
# upstream's loop reports as no end of the turn (the turn goes on).
ENDINGS = {
    "end": {"turn_end": (321, 1.125), "code_end": (2566, 1.0625)},
    "reopen": {"turn_end": (321, 1.1875), "code_end": (2566, 1.0625)},
}


def digest(root: Path) -> str:
    """SHA-256 over a folder's files: relative paths and bytes, in sorted order."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def speech_like(seconds: int, seed: int) -> np.ndarray:
    """16 kHz audio with a voice's shape: a gliding pitch with harmonics under syllable envelopes,
    a little noise, and a pause in the third second."""
    rng = np.random.default_rng(seed)
    t = np.arange(seconds * 16000) / 16000
    pitch = 140 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / 16000
    voice = sum(np.sin(k * phase) / k for k in range(1, 8))
    syllables = np.clip(np.sin(2 * np.pi * 3.2 * t), 0, None) ** 0.5
    pause = (t < 2.1) | (t > 2.8)
    pcm = 0.25 * voice * syllables * pause + 0.01 * rng.standard_normal(t.size)
    return pcm.astype(np.float32).reshape(seconds, 16000)


def long_speech(seconds: int, seed: int) -> np.ndarray:
    """``speech_like`` under a slow swell of loudness, with two silent seconds (so each unit's own peak
    and its buffer's differ), as 16-bit PCM (half the bytes of float32 in the goldens)."""
    gain = 0.15 + np.abs(np.sin(2 * np.pi * np.arange(seconds) / 17.0))
    gain[[7, 20]] = 0.0
    return np.round(speech_like(seconds, seed) * gain[:, None] * 32767).astype(np.int16)


def frame(unit: int) -> bytes:
    """A 160x120 camera frame: a coloured background and a shape that moves with the unit."""
    img = Image.new("RGB", (160, 120), (30 + 50 * unit, 90, 200 - 40 * unit))
    draw = ImageDraw.Draw(img)
    x = 20 + 30 * unit
    draw.ellipse((x, 30, x + 50, 90), fill=(240, 220 - 30 * unit, 40))
    draw.rectangle((10, 95, 150, 110), fill=(10 * unit, 10, 10))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def scenario() -> dict[str, np.ndarray]:
    data = {"audio": speech_like(UNITS, SEED), "instructions": np.asarray("Streaming Omni Conversation.")}
    data["long_audio"] = long_speech(LONG_UNITS, SEED + 1)
    data["ref_audio"] = speech_like(3, SEED + 2).reshape(-1)[:40000]  # 2.5 s: not whole seconds
    for unit in range(UNITS):
        data[f"frame{unit}"] = np.frombuffer(frame(unit), dtype=np.uint8)
    return data


def flow_noise(ckpt: Path) -> np.ndarray:
    """The plugin's DiT noise table (the reference's flow is given it in place of its random buffer)."""
    files = find_checkpoint(ckpt)
    stage = load_code_to_wave(files.root, files.config.token2wav, 1, torch.device("cpu"))
    return stage.flow.noise.float().numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference-python", required=True, help="the parity environment's python")
    parser.add_argument("--reference", required=True, help="a checkout of OpenBMB/MiniCPM-o-Demo")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_tiny_checkpoint(Path(tmp) / "ckpt", seed=SEED)
        inputs = Path(tmp) / "inputs.npz"
        np.savez(inputs, **scenario(), flow_noise=flow_noise(ckpt))
        runs = [(ckpt, Path(tmp) / "reference.npz", [])]
        for name, ending in ENDINGS.items():
            root = Path(tmp) / name
            shutil.copytree(ckpt, root)
            ending_checkpoint(root, **ending)
            runs.append((root, Path(tmp) / f"{name}.npz", ["--session-only", "--prefix", f"{name}_"]))
        for root, out_file, extra in runs:
            subprocess.run(
                [
                    args.reference_python,
                    str(REFERENCE),
                    "--reference",
                    args.reference,
                    "--checkpoint",
                    str(root),
                    "--inputs",
                    str(inputs),
                    "--out",
                    str(out_file),
                    *extra,
                ],
                check=True,
            )
        versions = subprocess.run(
            [
                args.reference_python,
                "-c",
                "import torch, transformers; print(torch.__version__, transformers.__version__)",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        goldens = dict(scenario())
        for _root, out_file, _extra in runs:
            goldens.update(np.load(out_file))
        np.savez_compressed(out / "goldens.npz", **goldens)
        meta = {
            "checkpoint_seed": SEED,
            "checkpoint_sha256": digest(ckpt),
            "reference_commit": _pinned(),
            "reference_torch": versions[0],
            "reference_transformers": versions[1],
            "units": UNITS,
            "endings": {
                name: {**{k: list(v) for k, v in ending.items()}, "sha256": digest(Path(tmp) / name)}
                for name, ending in ENDINGS.items()
            },
        }
        (out / "goldens.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {out / 'goldens.npz'} and goldens.json", file=sys.stderr)


def _pinned() -> str:
    for line in REFERENCE.read_text().splitlines():
        if line.startswith("PINNED_COMMIT"):
            return line.split('"')[1]
    raise RuntimeError("minicpmo_reference.py has no PINNED_COMMIT")


if __name__ == "__main__":
    main()
