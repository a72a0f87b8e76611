"""``FloodBatchPlugin``: a batch model that makes audio (and images) far faster than anyone reads it.

Each step gives every active request ``chunk_s`` seconds of audio at 24 kHz; a request ends after
``steps`` steps (never, with ``steps=None``), its last step giving a tiny image as well. ``began``
is set (on the model thread) when a request has begun, so a test can wait for the model to have
it before its client does something. Text in, audio or an image out: the speech and image routes
both take it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from duplex.plugins.base import (
    BatchPlugin,
    BatchRequest,
    Capabilities,
    PluginKind,
    SlotOptions,
    SlotOutput,
)

__all__ = ["FloodBatchPlugin"]

RATE = 24000


class FloodBatchPlugin(BatchPlugin):
    name = "flood-batch"

    def __init__(self, *, steps: int | None, chunk_s: float = 5.0, max_sessions: int = 2) -> None:
        self.steps = steps
        self.max_sessions = max_sessions
        self._chunk = (0.1 * np.sin(np.arange(int(chunk_s * RATE)) / 10)).astype(np.float32)
        self._requests: dict[int, tuple[int, int]] = {}  # slot -> (epoch, steps done)
        self.began = threading.Event()

    @classmethod
    def from_options(cls, model_path: str | None = None, **options: object) -> FloodBatchPlugin:
        return cls(**options)  # type: ignore[arg-type]

    def capabilities(self) -> Capabilities:
        return Capabilities(
            kind=PluginKind.BATCH,
            max_sessions=self.max_sessions,
            output_sample_rate=RATE,
            supports_text_input=True,
            output_modalities=("audio", "image"),
        )

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        self._check_slot_index(slot, self.max_sessions)

    def cancel_slot(self, slot: int, epoch: int) -> None:
        self._requests.pop(slot, None)

    def close_slot(self, slot: int) -> None:
        self._requests.pop(slot, None)

    def begin(self, request: BatchRequest) -> None:
        self._requests[request.slot] = (request.epoch, 0)
        self.began.set()

    def advance(self, slots: Sequence[int]) -> Sequence[SlotOutput]:
        outputs = []
        for slot in slots:
            epoch, done = self._requests[slot]
            done += 1
            last = self.steps is not None and done >= self.steps
            if last:
                del self._requests[slot]
            else:
                self._requests[slot] = (epoch, done)
            image = np.full((2, 2, 3), 7, np.uint8) if last else None
            outputs.append(
                SlotOutput(
                    slot=slot, epoch=epoch, pcm=self._chunk, sample_rate=RATE, image=image, end_of_turn=last
                )
            )
        return outputs
