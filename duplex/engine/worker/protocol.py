"""The worker protocol: the control messages between the server and a plugin's worker process.

Theory of operation
-------------------
The server (the *parent*) and the worker (the *child*) talk over one connected local stream
socket, one call at a time: the parent sends a ``Request``, the child answers with exactly one
``Reply``. Every message is a ``msgspec.Struct`` with ``array_like=True`` and a small integer tag,
so it goes onto the socket as a compact msgpack array whose first element says which message it
is (as vLLM v1's engine-core messages do); each side builds one encoder and one decoder for the
whole connection (``Channel``). Nothing is pickled.

Samples do not travel in these messages: they travel through shared memory (``duplex.plugins.
worker.shm``). An ``ArrayRef`` says where an array lies in the sender's area (byte offset, dtype,
shape); only an array that does not fit the area travels inside the message (``offset == -1``,
the bytes in ``data``).

The call sequence:

1. ``Init`` -> ``Ready`` (the child built and loaded the plugin; its capabilities and pid) or
   ``Failure``. The parent sizes the shared memory from those capabilities, then
2. ``Attach`` -> ``Done`` (the child mapped it);
3. the plugin's calls, each one request: ``OpenSlotMsg``, ``CancelSlotMsg``, ``CloseSlotMsg`` -> ``Done``;
   ``Step`` (the whole batch of a tick) and ``Advance`` -> ``Outputs``; ``Respond`` -> ``Done``,
   then ``Next`` -> ``Chunk`` once per chunk of the reply (``output`` None: the reply ended), and
   ``CloseStream`` -> ``Done``; ``Begin`` -> ``Done``.

Any call may be answered with ``Failure``: ``code`` set for a ``PluginError`` (the parent raises the
same ``PluginError(code, message)``), ``None`` for any other exception (the parent raises
``WorkerCallError``; the engine fails the sessions of that call as it does in-process).

``Step`` carries the batch column by column (slots, epochs, padded); the frames themselves are the
rows ``0 .. n-1`` of the input area, in batch order. What only some inputs have (video frames,
tool results, a frame whose dtype or shape is not the area's) is in ``extras``, by batch index.
"""

from __future__ import annotations

from typing import Any

import msgspec

from duplex.plugins.base import (
    BatchRequest,
    Capabilities,
    InteractionProgress,
    SlotOptions,
    TokenUsage,
    ToolCall,
    ToolResult,
)

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Advance",
    "ArrayRef",
    "Attach",
    "Begin",
    "CancelSlotMsg",
    "Chunk",
    "CloseSlotMsg",
    "CloseStream",
    "Done",
    "Failure",
    "Init",
    "InputExtra",
    "Next",
    "OpenSlotMsg",
    "OutputMsg",
    "Outputs",
    "Ready",
    "Reply",
    "Request",
    "Respond",
    "Step",
    "TurnRequestMsg",
    "call_name",
]


#: The largest control message either side accepts (a corrupt length is refused, not allocated).
MAX_MESSAGE_BYTES = 1 << 30


class _Msg(msgspec.Struct, array_like=True, frozen=True):
    """Base of the wire messages: msgpack arrays of their fields, in declaration order."""


# ---------------------------------------------------------------------------- shared pieces


class ArrayRef(_Msg, gc=False):
    """An array in the sender's shared-memory area at byte ``offset``; ``offset == -1``: inline in
    ``data`` (an array too large for the area). ``dtype`` is numpy's ``dtype.str`` (``"<i2"``)."""

    dtype: str
    shape: tuple[int, ...]
    offset: int
    data: bytes = b""


class InputExtra(_Msg):
    """What one input of a ``Step`` has beyond its frame row: ``index`` in the batch; ``pcm`` when
    its frame is not in row ``index`` (another dtype or shape than the area's)."""

    index: int
    pcm: ArrayRef | None = None
    video_frames: tuple[bytes, ...] = ()
    tool_results: tuple[ToolResult, ...] = ()
    text: tuple[str, ...] = ()


class OutputMsg(_Msg):
    """One ``SlotOutput``, its arrays in the child's output area (see ``SlotOutput``)."""

    slot: int
    epoch: int
    pcm: ArrayRef | None = None
    sample_rate: int = 24000
    text: str = ""
    decision: str | None = None
    end_of_turn: bool = False
    tool_call: ToolCall | None = None
    user_transcript: str | None = None
    image: ArrayRef | None = None
    video: ArrayRef | None = None
    progress: float | None = None
    usage: TokenUsage | None = None
    chunk_index: int | None = None
    interactions: InteractionProgress | None = None
    chunk_steps: tuple[int, int] | None = None


class TurnRequestMsg(_Msg):
    """One ``TurnRequest``, its audio in the parent's input area (see ``TurnRequest``): the same
    fields in the same order, converted by name both ways, so none is left behind."""

    slot: int
    epoch: int
    pcm: ArrayRef | None = None
    text: str | None = None
    history: tuple[tuple[str, str], ...] = ()
    instructions: str = ""
    options: dict[str, Any] = {}
    max_output_tokens: int | None = None


# ---------------------------------------------------------------------------- requests


class Init(_Msg, tag=1):
    """Build the plugin with ``from_options(model_path, **options)`` and load it."""

    plugin: str
    model_path: str | None = None
    options: dict[str, Any] = {}


class Attach(_Msg, tag=2):
    """Map the shared memory segment ``name``: the input area at byte 0 (``input_bytes``), the
    output area at ``output_offset`` (``output_bytes``)."""

    name: str
    input_bytes: int
    output_offset: int
    output_bytes: int


class OpenSlotMsg(_Msg, tag=3):
    slot: int
    options: SlotOptions


class CancelSlotMsg(_Msg, tag=4):
    slot: int
    epoch: int


class CloseSlotMsg(_Msg, tag=5):
    slot: int


class Step(_Msg, tag=6):
    """``step(batch)`` for the whole batch of a tick (see the module docstring)."""

    slots: list[int]
    epochs: list[int]
    padded: list[bool]
    extras: list[InputExtra] = []


class Respond(_Msg, tag=7):
    """Start ``respond(request)`` as reply stream ``stream`` (chunks come with ``Next``)."""

    stream: int
    request: TurnRequestMsg


class Next(_Msg, tag=8):
    stream: int


class CloseStream(_Msg, tag=9):
    stream: int


class Begin(_Msg, tag=10):
    request: BatchRequest


class Advance(_Msg, tag=11):
    slots: list[int]


Request = (
    Init
    | Attach
    | OpenSlotMsg
    | CancelSlotMsg
    | CloseSlotMsg
    | Step
    | Respond
    | Next
    | CloseStream
    | Begin
    | Advance
)

# ---------------------------------------------------------------------------- replies


class Done(_Msg, tag=64):
    """A call that returns nothing succeeded."""


class Outputs(_Msg, tag=65):
    """A step's outputs; their arrays use the first ``area_bytes`` of the output area."""

    outputs: list[OutputMsg]
    area_bytes: int = 0


class Chunk(_Msg, tag=66):
    """The next chunk of a reply stream (``None``: the stream ended); its arrays use the first
    ``area_bytes`` of the output area."""

    output: OutputMsg | None = None
    area_bytes: int = 0


class Failure(_Msg, tag=67):
    """The call raised: ``code`` (and ``param``) of a ``PluginError``, or ``None`` and the
    exception's type name."""

    code: str | None
    message: str
    error_type: str = ""
    traceback: str = ""
    param: str | None = None


class Ready(_Msg, tag=68):
    """``Init`` succeeded: the loaded plugin's name and capabilities, the child's pid."""

    name: str
    capabilities: Capabilities
    pid: int


Reply = Done | Outputs | Chunk | Failure | Ready


def call_name(request: Request) -> str:
    """What a request is called in messages for people: the plugin call it carries (``OpenSlot``
    for ``OpenSlotMsg``), else its type's name."""
    return type(request).__name__.removesuffix("Msg")
