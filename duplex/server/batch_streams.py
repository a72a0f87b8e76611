"""Batch models behind HTTP: each request is one ``BatchStream`` on the chosen model's engine.

The speech and image routes (``speech.py``, ``images.py``, ``speech_stream.py``) reach a batch model
through ``Engine.open_stream`` (``duplex.engine.batch_stream``) rather than through a conversation: no
session, journal, response events or close pipeline stand between a request and the model, and
nothing is lost by that, since nobody resumes a download. What a session would give them the stream
gives as well:

* **admission**: ``request_stream`` takes one slot of the model under the same limits as a session,
  counted with them (``sessions_opened``, ``/health``'s ``sessions``): a full model answers
  ``resource_exhausted``, which the routes send as HTTP 429 (503 while draining), a lost model its
  own code. Leaving the block gives the slot back (the plugin's ``close_slot``), at once and the
  same way whether the request ended, failed, or was cancelled by a client that went away (its
  request is stopped first: ``BatchStream.stop``, the plugin's ``cancel_slot``);
* **batching**: the request joins the model's driver like a session's, so it is stepped with every
  other request of the model, realtime sessions' included;
* **backpressure**: a route that stops taking outputs (its client stopped reading, and its buffer
  is full) pauses its request instead of growing a queue.

``request_outputs`` starts one request on the stream (the text, and the options as the plugin
reads them: ``BatchRequest.options``, what a session's ``response.extra_body`` and voice became)
and yields its outputs to the last one; ``audio_chunks`` turns them into the audio a session would
have sent (pcm16 at the route's rate, resampled with the session's own encoder, ``WireAudio``).
A request the model refuses or fails raises its ``DuplexError`` (the model's code, e.g.
``voice_not_found``); a step that failed with another exception, or an engine that shuts down,
``ProtocolError("server_error")``.

The routes choose the served model with ``ServedModels.pick`` (``duplex.server.models``): what a
model makes is read from its capabilities, a ``batch`` model with text input and the output among
its ``output_modalities``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from duplex.engine import Detached
from duplex.engine.batch_stream import BatchStream
from duplex.engine.output_stream import WireAudio
from duplex.plugins.base import PluginError, SlotOptions, SlotOutput
from duplex.protocol.errors import DuplexError, ProtocolError
from duplex.protocol.formats import AudioFormat

__all__ = ["audio_chunks", "request_outputs", "request_stream"]

log = logging.getLogger("duplex.server.batch")


@contextlib.asynccontextmanager
async def request_stream(engine: Any) -> AsyncIterator[BatchStream]:
    """One slot of ``engine``'s model for a request (see the module docstring), opened with the
    model's default voice, as a session's slot is. Raises the engine's ``SessionError`` when it
    cannot be had (``resource_exhausted`` ...)."""
    stream = await engine.open_stream(SlotOptions(voice=engine.capabilities.default_voice))
    async with stream:
        yield stream


async def request_outputs(
    engine: Any, stream: BatchStream, text: str, options: Mapping[str, object]
) -> AsyncIterator[SlotOutput]:
    """Start one request on ``stream`` and yield its outputs, the last one (``end_of_turn``)
    included. Raises as the module docstring says; ``engine`` counts a failed step
    (``session_failures``, as a session's would be)."""
    stream.start(text, dict(options))
    while True:
        try:
            output = await stream.next_output()
        except DuplexError as err:
            if isinstance(err, PluginError) and err.fatal:
                engine.metrics.session_failures.inc()
            raise
        except Detached as detached:
            raise ProtocolError("server_error", f"the request ended ({detached.reason})") from None
        except Exception as exc:  # a failed step (the driver logged it)
            engine.metrics.session_failures.inc()
            log.debug("batch request failed: %r", exc)
            raise ProtocolError("server_error", "the model failed") from None
        yield output
        if output.end_of_turn:
            return


async def audio_chunks(outputs: AsyncIterator[SlotOutput], rate: int) -> AsyncIterator[bytes]:
    """The audio of ``outputs`` as pcm16 at ``rate``, one chunk per output that has audio (possibly
    empty while the resampler fills), then the resampler's tail once the request completed: the
    bytes a session's ``response.output_audio.delta`` events carried, unpaced."""
    wire = WireAudio()
    fmt = AudioFormat("pcm16", rate)
    async for output in outputs:
        pcm = output.pcm
        if pcm is not None and len(pcm):
            yield wire.encode(pcm, output.sample_rate, fmt)
    tail = wire.flush(fmt, keep=True)
    if tail:
        yield tail
