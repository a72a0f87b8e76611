"""``POST /v1/audio/speech``: OpenAI's text-to-speech route, served by a batch TTS model.

One request is one ``BatchStream`` on the model's engine (``batch_streams``; the model chosen by
``ServedModels.pick``): the text is the request's text, its parameters its options (``speed``,
``language``, ``instructions``, ``seed``, and the voice as a session would choose it,
``speech_options``: OpenAI's voice names stand for the model's default voice), and the model's
audio (as pcm16 at 24 kHz, ``batch_streams.audio_chunks``) comes back as the file
``response_format`` asks for (``audio_files``; encoded off the event loop), as the model makes it:

* no ``stream_format``, or ``"audio"``: the file's bytes as they are made (chunked transfer), as
  OpenAI answers: a long text's file starts with its first spoken piece instead of after the whole
  text (a ``wav`` states its sizes as ``0xFFFFFFFF``, "to the end", since they are not known when
  its header goes out);
* ``stream_format: "sse"``: ``speech.audio.delta`` events carrying those bytes (base64), then
  ``speech.audio.done``; a failure after the stream started is an ``error`` event.

Every answer names the model that speaks (``X-Duplex-Model``) and the voice it speaks in
(``X-Duplex-Voice``: the one asked for, or the model's default standing in for one of OpenAI's
names or for none; no header for a model without named voices).

A refused request gets OpenAI's error body (``http_errors``): the route's own checks (the body,
an empty text, a model that is not a TTS model, a format it cannot write) before a slot is taken;
the model's refusals (``voice_not_found``, ``event_too_large`` for a text over its bound,
``invalid_session_config`` for an option it does not take) as they come. The answer waits for its
first audio before its status goes out, so those refusals keep their status too; a failure after
the first audio ends the body early (the file: the connection is cut, so the client sees an
incomplete transfer rather than a short file).

A client that goes away (``http.disconnect``) before its answer cancels it at once: the stream
is closed, its request stopped and its slot freed (``http_requests.until_departed``). The answer is
read ahead of its client (``http_streams.BufferedStream``, at most ``http_stream_buffer_bytes``),
so the slot is freed when the model is done even if the client never reads; a client whose write
stays blocked for ``send_timeout_s`` is dropped (its request stopped, if the model was not done).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from duplex.engine.settings import voice_for
from duplex.plugins.base import Capabilities
from duplex.protocol.errors import DuplexError, ProtocolError
from duplex.protocol.speech import SpeechAudioDelta, SpeechAudioDone, SpeechError, SpeechRequest, SpeechUsage
from duplex.server.audio_files import CONTENT_TYPES, AudioFileEncoder
from duplex.server.batch_streams import audio_chunks, request_outputs, request_stream
from duplex.server.http_errors import error_response
from duplex.server.http_requests import Departed, admit, read_json, until_departed
from duplex.server.http_streams import BufferedStream
from duplex.server.models import MODEL_HEADER, ServedModel, Wants

__all__ = ["SPEECH_RATE", "VOICE_HEADER", "speech_endpoint", "speech_options"]

log = logging.getLogger("duplex.server.speech")

#: The rate of the speech route's audio: OpenAI's ``pcm`` is 24 kHz, and so is every format here.
SPEECH_RATE: Final = 24000
#: The response header that names the voice the answer speaks in.
VOICE_HEADER: Final = "X-Duplex-Voice"
_SSE: Final = "text/event-stream"
_PYAV_FORMATS: Final = frozenset({"mp3", "opus", "aac", "flac"})


def speech_options(
    caps: Capabilities,
    *,
    voice: str | None,
    speed: float | None = None,
    language: str | None = None,
    instructions: str | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """The model's options for one text to speak: the parameters given, and the voice as a
    session chooses it (``voice_for``: one of OpenAI's names stands for the model's default voice;
    a model without named voices gets none, and speaks in its own)."""
    options: dict[str, Any] = {
        k: v
        for k, v in (("speed", speed), ("language", language), ("instructions", instructions), ("seed", seed))
        if v is not None
    }
    used = voice_for(voice, caps) if voice is not None else None
    if used is not None:
        options["voice"] = used
    return options


async def speech_endpoint(request: Request) -> Response:
    """The route (see the module docstring)."""
    state = request.app.state.duplex
    try:
        admit(request)  # the API key, when the server asks for one
        body = await read_json(request, SpeechRequest, state.config.max_http_body_bytes)
        if not body.input.strip():
            raise ProtocolError("response_create_without_input", "input is empty", param="input")
        model = state.models.pick(body.model, Wants.SPEECH).model
        encoder = AudioFileEncoder(body.response_format, SPEECH_RATE)  # refuses a format it cannot write
    except DuplexError as err:
        return _refused(request, err)
    options = speech_options(
        model.engine.capabilities,
        voice=body.voice,
        speed=body.speed,
        language=body.language,
        instructions=body.instructions,
        seed=body.seed,
    )
    headers = _answer_headers(model, body.voice)
    return await _stream(
        request, model.engine, body.input, options, encoder, sse=body.stream_format == "sse", headers=headers
    )


def _answer_headers(model: ServedModel, voice: str | None) -> dict[str, str]:
    """``X-Duplex-Model`` and ``X-Duplex-Voice`` (see the module docstring): the voice as the
    session chooses it (``voice_for``; without one, the session's voice: the model's default)."""
    caps = model.engine.capabilities
    used = voice_for(voice, caps) if voice is not None else caps.default_voice
    headers = {MODEL_HEADER: model.name}
    if used is not None:
        headers[VOICE_HEADER] = used
    return headers


def _refused(request: Request, err: DuplexError) -> Response:
    state = request.app.state.duplex
    state.metrics.errors.bump(err.code)
    status = 503 if err.code == "resource_exhausted" and (state.draining or not state.ready) else None
    return error_response(err, status=status)


def _departed(request: Request) -> Response:
    """The client left before its answer: its stream was closed (nobody reads this response)."""
    request.app.state.duplex.metrics.detached.bump("client_gone")
    return Response(status_code=204)


async def _stream(
    request: Request,
    engine: Any,
    text: str,
    options: dict[str, Any],
    encoder: AudioFileEncoder,
    *,
    sse: bool,
    headers: Mapping[str, str],
) -> Response:
    """Take a slot, start the request and wait for its first audio (or the end, or a refusal)
    before answering; the rest goes out through a ``BufferedStream`` (the stream closes when the
    model is done, however slowly the client reads)."""
    state = request.app.state.duplex
    stack = contextlib.AsyncExitStack()
    try:
        stream = await stack.enter_async_context(request_stream(engine))
        chunks = audio_chunks(request_outputs(engine, stream, text, options), SPEECH_RATE)
        stack.push_async_callback(chunks.aclose)
        first, ended = await until_departed(request, _first_audio(chunks))
    except BaseException as exc:
        await stack.aclose()  # the request stops, its slot is freed
        if isinstance(exc, DuplexError):
            return _refused(request, exc)
        if isinstance(exc, Departed):
            return _departed(request)
        raise

    async def close(exc: BaseException | None) -> None:
        await stack.aclose()  # done or not (a failure, a client gone): the request stops, its slot is freed

    return BufferedStream(
        _body(chunks, first, ended, encoder, sse=sse),
        close,
        media_type=_SSE if sse else CONTENT_TYPES[encoder.format],
        max_buffered_bytes=state.config.http_stream_buffer_bytes,
        send_timeout_s=state.config.send_timeout_s,
        on_slow_reader=lambda: state.metrics.detached.bump("slow_reader"),
        on_departed=lambda: state.metrics.detached.bump("client_gone"),
        headers=headers,
    )


async def _first_audio(chunks: AsyncIterator[bytes]) -> tuple[bytes, bool]:
    """The first chunk of audio (``b""`` and True when the request ended without audio)."""
    async for chunk in chunks:
        return chunk, False
    return b"", True


async def _encode(encoder: AudioFileEncoder, pcm: bytes) -> bytes:
    if encoder.format in _PYAV_FORMATS:
        return await asyncio.to_thread(encoder.feed, pcm)
    return encoder.feed(pcm)


async def _finish(encoder: AudioFileEncoder) -> bytes:
    if encoder.format in _PYAV_FORMATS:
        return await asyncio.to_thread(encoder.finish)
    return encoder.finish()


async def _body(
    chunks: AsyncIterator[bytes],
    first: bytes,
    ended: bool,
    encoder: AudioFileEncoder,
    *,
    sse: bool,
) -> AsyncIterator[bytes]:
    """The response body, from the first audio to the end. A failure after the first audio is an
    SSE ``error`` event, or (``stream_format: "audio"``) raised, which cuts the connection."""

    def frame(chunk: bytes) -> bytes:
        return b"data: " + msgspec.json.encode(SpeechAudioDelta(audio=chunk)) + b"\n\n" if sse else chunk

    chunk = await _encode(encoder, first)
    if chunk:
        yield frame(chunk)
    if not ended:
        try:
            async for pcm in chunks:
                chunk = await _encode(encoder, pcm)
                if chunk:
                    yield frame(chunk)
        except DuplexError as err:
            if not sse:
                raise  # the connection is cut: the client sees an incomplete transfer
            log.warning("speech stream failed after its first audio: %s", err)
            yield b"data: " + msgspec.json.encode(SpeechError(error=err.to_detail())) + b"\n\n"
            return
    tail = await _finish(encoder)
    if tail:
        yield frame(tail)
    if sse:
        yield b"data: " + msgspec.json.encode(SpeechAudioDone(usage=SpeechUsage())) + b"\n\n"
