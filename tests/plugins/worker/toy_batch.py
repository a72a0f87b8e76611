"""``toy-batch``: a tiny ``batch`` plugin for the worker tests (no batch model is built in yet).

A request's text sets its length: each ``advance`` gives every active slot one chunk of audio
(float32, as many samples as the text has characters, times ten) and its progress; the last step
gives an image (4 x 6 x 3 uint8 of the text's bytes) and ends the request. Each step is also a chunk
of a video-like request (its index, its steps, an interaction shown by the first), so every field of
an output crosses the worker.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from duplex.plugins.base import (
    BatchPlugin,
    BatchRequest,
    Capabilities,
    InteractionProgress,
    PluginError,
    PluginKind,
    SlotOptions,
    SlotOutput,
)

__all__ = ["ToyBatchPlugin"]

STEPS = 3


class ToyBatchPlugin(BatchPlugin):
    name = "toy-batch"

    def __init__(self, max_sessions: int = 4) -> None:
        self.max_sessions = max_sessions
        self._requests: dict[int, tuple[BatchRequest, int]] = {}

    @classmethod
    def from_options(cls, model_path: str | None = None, **options: object) -> ToyBatchPlugin:
        return cls(**options)  # type: ignore[arg-type]

    def capabilities(self) -> Capabilities:
        return Capabilities(
            kind=PluginKind.BATCH, max_sessions=self.max_sessions, output_modalities=("audio", "image")
        )

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        self._check_slot_index(slot, self.max_sessions)

    def cancel_slot(self, slot: int, epoch: int) -> None:
        self._requests.pop(slot, None)

    def close_slot(self, slot: int) -> None:
        self._requests.pop(slot, None)

    def begin(self, request: BatchRequest) -> None:
        if not request.text:
            raise PluginError("invalid_request", "toy-batch: empty text", param="input")
        self._requests[request.slot] = (request, 0)

    def advance(self, slots: Sequence[int]) -> Sequence[SlotOutput]:
        outputs = []
        for slot in slots:
            request, done = self._requests[slot]
            done += 1
            last = done == STEPS
            n = 10 * len(request.text)
            pcm = (np.arange(n, dtype=np.float32) * (done + slot) / n).astype(np.float32)
            image = None
            if last:
                raw = (request.text.encode() * 72)[:72]
                image = np.frombuffer(raw, np.uint8).reshape(4, 6, 3).copy()
                del self._requests[slot]
            else:
                self._requests[slot] = (request, done)
            outputs.append(
                SlotOutput(
                    slot=slot,
                    epoch=request.epoch,
                    pcm=pcm,
                    sample_rate=16000,
                    image=image,
                    progress=done / STEPS,
                    end_of_turn=last,
                    chunk_index=done - 1,
                    interactions=InteractionProgress(started=("e1",), active=("e1",)) if done == 1 else None,
                    chunk_steps=(done, STEPS),
                )
            )
        return outputs
