"""``helios`` at full size on a CUDA device, random bfloat16 weights: the architecture runs batched,
with the one-stage sampler and with the distilled pyramid.

Run on the GPU machine with ``pytest -m gpu tests/batch_models/test_helios_gpu.py``. The full-size
configs (the 14B transformer, the Wan 2.1 VAE, umT5-XXL) are written without weights and served
with ``random_weights``; two requests at different chunks share each step, and every chunk has its
frames at the served size. The cadence is ``bench.video_stream``'s to measure.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from batch_models.video.plugin import HeliosVideoPlugin  # noqa: E402
from batch_models.video.testing import write_checkpoint  # noqa: E402
from duplex.plugins.base import BatchInteraction, BatchRequest, SlotOptions  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

STEPS = 2


@pytest.mark.parametrize("preset", ["helios", "helios-distilled"])
def test_two_requests_at_different_chunks_share_steps_at_full_size(tmp_path: Path, preset: str) -> None:
    root = write_checkpoint(tmp_path / preset, preset=preset, weights=False)
    per_chunk = STEPS * (3 if preset.endswith("distilled") else 1)  # the pyramid: three stages
    options = {"device": "cuda", "random_weights": True, "max_sessions": 2, "default_guidance": 1.0}
    plugin = HeliosVideoPlugin.from_options(str(root), default_steps=STEPS, **options)
    plugin.load()
    try:
        for slot in (0, 1):
            plugin.open_slot(slot, SlotOptions())
        endless = {"num_frames": 0, "seed": 1}
        plugin.begin(BatchRequest(slot=0, epoch=1, text="a fox in the snow", options=endless))
        chunks: dict[int, list[np.ndarray]] = {0: [], 1: []}
        active = [0]
        for step in range(4 * per_chunk):
            if step == per_chunk + 1:  # joins in the middle of the first request's second chunk
                two_chunks = {"num_frames": 66, "seed": 2}
                plugin.begin(BatchRequest(slot=1, epoch=1, text="waves", options=two_chunks))
                plugin.interact(BatchInteraction(slot=0, epoch=1, event_id="e", prompt="a red car"))
                active.append(1)
            for out in plugin.advance(list(active)):
                if out.video is not None:
                    chunks[out.slot].append(out.video)
                if out.end_of_turn:
                    active.remove(out.slot)
        assert all(c.shape == (33, 384, 640, 3) and c.dtype == np.uint8 for c in chunks[0] + chunks[1])
        assert (len(chunks[0]), len(chunks[1])) == (4, 2)
        peak_gb = torch.cuda.max_memory_allocated() / 1e9
        assert peak_gb < 130, f"peak CUDA memory {peak_gb:.1f} GB"
    finally:
        plugin.close()
