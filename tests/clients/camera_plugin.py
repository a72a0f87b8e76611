"""A tiny real frame plugin with camera input, for the client tests: it says which images it saw.

Each 80 ms step that carries images answers with their tags as transcript text (an image is a JPEG
header followed by a one-letter tag) and ends its turn; steps without images listen.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from duplex.plugins.base import Capabilities, FramePlugin, PluginKind, SlotInput, SlotOptions, SlotOutput

JPEG_MAGIC = b"\xff\xd8\xff\xe0"


def image(tag: str) -> bytes:
    return JPEG_MAGIC + tag.encode()


class CameraTagPlugin(FramePlugin):
    name = "camera-tag"

    def capabilities(self) -> Capabilities:
        return Capabilities(
            kind=PluginKind.FRAME,
            chunk_period_ms=80,
            max_sessions=8,
            model_native_turns=True,
            supports_video_input=True,
        )

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        pass

    def cancel_slot(self, slot: int, epoch: int) -> None:
        pass

    def close_slot(self, slot: int) -> None:
        pass

    def step(self, batch: Sequence[SlotInput]) -> Sequence[SlotOutput]:
        out = []
        for item in batch:
            if item.video_frames:
                tags = "".join(f[len(JPEG_MAGIC) :].decode() for f in item.video_frames)
                out.append(
                    SlotOutput(
                        slot=item.slot,
                        epoch=item.epoch,
                        pcm=np.full(1920, 0.1, np.float32),
                        text=tags,
                        decision="speak",
                        end_of_turn=True,
                    )
                )
            else:
                out.append(SlotOutput(slot=item.slot, epoch=item.epoch))
        return out
