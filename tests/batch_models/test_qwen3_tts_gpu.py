"""``qwen3_tts`` on a CUDA device: the captured decode step is the eager step, token for token.

Run on the GPU machine with ``pytest -m gpu tests/batch_models/test_qwen3_tts_gpu.py``. The same
requests, joining at different steps in different slots, run once with ``cuda_graphs`` (the step
and the prefill replayed as CUDA graphs) and once eagerly; every request's codes and audio must be
bit-identical. At full size (0.6B, random bfloat16 weights, seeded alike) and on the tiny
checkpoint; and in graph mode a request is the same alone as batched.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from batch_models.qwen3_tts.plugin import Qwen3TTSPlugin  # noqa: E402
from batch_models.qwen3_tts.testing import write_checkpoint  # noqa: E402
from duplex.plugins.base import BatchRequest, SlotOptions  # noqa: E402
from tests.batch_models.driver import drive  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

JOINS = {
    0: [BatchRequest(slot=1, epoch=1, text="Another voice speaks first.", options={"seed": 2})],
    2: [BatchRequest(slot=3, epoch=1, text="Hello there, how are you today?", options={"seed": 11})],
    3: [BatchRequest(slot=0, epoch=1, text="A third one, with a style.", options={"seed": 9,
                                                                              "instructions": "Calm."})],
}  # fmt: skip


Result = dict[int, tuple[np.ndarray, np.ndarray]]  # slot -> (codes [G, frames], audio)


def _run(root: Path, joins: dict, *, graphs: bool, **options: object) -> Result:
    torch.manual_seed(0)  # random weights (when asked for) are drawn alike for both runs
    options.update(device="cuda", max_sessions=4, cuda_graphs=graphs)
    plugin = Qwen3TTSPlugin.from_options(str(root), **options)
    plugin.load()
    for slot in range(4):
        plugin.open_slot(slot, SlotOptions())
    traces = drive(plugin, joins)
    out = {}
    for slot, trace in traces.items():
        pcm = np.concatenate([o.pcm for o in trace.outputs if o.pcm is not None])
        frames = sum(o.pcm.size for o in trace.outputs if o.pcm is not None) // 1920
        out[slot] = (plugin.generator.codes[slot, :, :frames].cpu().numpy(), pcm)
    assert plugin.generator._step.captured is graphs
    plugin.close()
    return out


def _assert_same(a: Result, b: Result) -> None:
    assert sorted(a) == sorted(b)
    for slot in a:
        np.testing.assert_array_equal(a[slot][0], b[slot][0], err_msg=f"codes of slot {slot}")
        np.testing.assert_array_equal(a[slot][1], b[slot][1], err_msg=f"audio of slot {slot}")


def test_the_graphed_step_gives_the_eager_tokens_on_the_tiny_checkpoint(tts_checkpoint: Path) -> None:
    graphed = _run(tts_checkpoint, JOINS, graphs=True, max_audio_s=3.0)
    _assert_same(graphed, _run(tts_checkpoint, JOINS, graphs=False, max_audio_s=3.0))
    alone = _run(tts_checkpoint, {0: [JOINS[2][0]]}, graphs=True, max_audio_s=3.0)
    np.testing.assert_array_equal(alone[3][0], graphed[3][0])
    np.testing.assert_array_equal(alone[3][1], graphed[3][1])


def test_the_graphed_step_gives_the_eager_tokens_at_full_size(tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path / "full", size="0.6b", weights=False)
    options = {"random_weights": True, "max_audio_s": 1.2}
    _assert_same(_run(root, JOINS, graphs=True, **options), _run(root, JOINS, graphs=False, **options))
