"""Reply strategies of the default plugin: what to say to what the user said.

A strategy turns a ``ReplyPrompt`` (the user's words, the conversation as far as
the listener heard it, the session's instructions) into a stream of text
deltas. The plugin cuts that stream into sentences and speaks each one as soon
as it is complete, so a strategy should yield as early as it can.

Cancellation: the plugin closes the delta generator when the response is
cancelled (barge-in, ``response.cancel``). Every strategy releases what the
reply holds in a ``finally`` block (the HTTP stream, the vLLM request), so a
cancelled reply stops generating at once.

Strategies (``strategies.make_strategy`` builds one from serve-time options; the ``lm``
strategy, a small language model in process, lives in ``lm.py``):

``echo``    repeats the user's words in a sentence; needs nothing, so the whole
            loop (listen, understand, answer, speak, interrupt) is testable.
``openai``  any OpenAI-compatible ``/v1/chat/completions`` endpoint (a vLLM
            server, for example), streamed with ``stream: true`` over plain
            HTTP from the standard library.
``vllm``    vLLM in-process from a local model directory (GPU); the ``vllm``
            package is an optional extra, imported only when this strategy loads.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import msgspec

from duplex.plugins.base import PluginError

__all__ = [
    "EchoReply",
    "OpenAIChatReply",
    "ReplyPrompt",
    "ReplyStrategy",
    "VLLMReply",
    "chat_messages",
    "echo_text",
    "without_controls",
    "without_thinking",
]


class ReplyPrompt(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a strategy may use to answer one user turn.

    ``history`` holds ``(role, text)`` pairs, oldest first, ending before this
    turn (roles ``user``/``assistant``/``system``; others are ignored).
    ``instructions`` is the session's system prompt. ``max_tokens``: the most tokens the reply
    may have (the response's ``max_output_tokens``); None leaves the strategy's own cap.
    """

    user_text: str
    history: tuple[tuple[str, str], ...] = ()
    instructions: str = ""
    temperature: float | None = None
    max_tokens: int | None = None


def token_cap(own: int | None, asked: int | None) -> int | None:
    """The ``max_tokens`` a reply is generated with: the smaller of the strategy's own cap and the
    prompt's (``ReplyPrompt.max_tokens``), either of which may be None (no cap)."""
    if own is None or asked is None:
        return asked if own is None else own
    return min(own, asked)


def chat_messages(prompt: ReplyPrompt) -> list[dict[str, str]]:
    """The prompt as OpenAI chat messages: system (the instructions), the history, the user turn."""
    messages: list[dict[str, str]] = []
    if prompt.instructions.strip():
        messages.append({"role": "system", "content": prompt.instructions})
    for role, text in prompt.history:
        if role in ("user", "assistant", "system") and text:
            messages.append({"role": role, "content": text})
    messages.append({"role": "user", "content": prompt.user_text})
    return messages


class ReplyStrategy(ABC):
    """Answers one user turn as a stream of text deltas.

    ``load()`` is called once before the first reply and ``close()`` once at
    shutdown. ``reply`` is called from one thread at a time; the caller may
    close its generator early (cancel), which must release the request.
    Failures are raised as ``PluginError`` (code ``response_error`` for a reply
    backend that failed mid-session).
    """

    name: ClassVar[str]
    blocking: ClassVar[bool] = True
    """True when ``reply`` waits on I/O or another process (read on a thread of its own)."""

    def load(self) -> None:  # noqa: B027 - optional hook
        """Acquire what the strategy needs (model, connection checks)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release everything ``load`` acquired."""

    @abstractmethod
    def reply(self, prompt: ReplyPrompt) -> Iterator[str]:
        """Yield the reply to ``prompt`` as text deltas; joined, they are the whole reply."""


def echo_text(user_text: str) -> str:
    """The echo strategy's reply to ``user_text``: one sentence that repeats it."""
    words = user_text.strip()
    if words and words[-1] not in ".!?":
        words += "."
    return f"You said: {words}"


class EchoReply(ReplyStrategy):
    """Repeats what it heard: ``"You said: <words>"``, a word (its token) a delta, at most
    ``prompt.max_tokens`` of them."""

    name = "echo"
    blocking = False

    def reply(self, prompt: ReplyPrompt) -> Iterator[str]:
        words = echo_text(prompt.user_text).split(" ")
        if prompt.max_tokens is not None:
            words = words[: prompt.max_tokens]
        for i, word in enumerate(words):
            yield word if i == len(words) - 1 else word + " "


class _ChatDelta(msgspec.Struct):
    content: str | None = None


class _ChatChoice(msgspec.Struct):
    delta: _ChatDelta = msgspec.field(default_factory=_ChatDelta)
    finish_reason: str | None = None


class _ChatChunk(msgspec.Struct):
    choices: list[_ChatChoice] = []
    error: dict[str, Any] | None = None  # vLLM reports a failure mid-stream this way


class _ModelEntry(msgspec.Struct):
    id: str


class _ModelList(msgspec.Struct):
    data: list[_ModelEntry] = []


def _chat_completions_url(url: str) -> str:
    """Accept a server root, a ``/v1`` base or the full endpoint; return the full endpoint."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise PluginError("invalid_plugin_config", f"reply_url must be an http(s) URL, got {url!r}")
    path = parsed.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path = path + "/chat/completions" if path.endswith("/v1") else path + "/v1/chat/completions"
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path, parsed.query, ""))


class OpenAIChatReply(ReplyStrategy):
    """Streams a reply from an OpenAI-compatible chat endpoint.

    ``url`` is the server root, its ``/v1`` base or the full
    ``/v1/chat/completions`` URL. ``model`` is sent as the request's model; when
    it is None the first model that ``GET /v1/models`` lists is used (vLLM
    serves one). ``api_key_env`` names an environment variable whose value is
    sent as a bearer token (the key itself never appears in options or logs).
    ``timeout_s`` bounds the connection and each read of the stream.

    Each ``reply`` is one ``POST`` with ``stream: true``; server-sent events are
    read line by line and every ``choices[0].delta.content`` is yielded as it
    arrives. Closing the generator closes the connection, which makes a vLLM
    server abort the generation.
    """

    name = "openai"

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        api_key_env: str | None = None,
        timeout_s: float = 30.0,
        max_tokens: int | None = 256,
    ) -> None:
        self._url = _chat_completions_url(url)
        self._model = model
        self._api_key_env = api_key_env
        self._timeout_s = timeout_s
        self._max_tokens = max_tokens
        self._chunk_decoder = msgspec.json.Decoder(_ChatChunk)

    @property
    def url(self) -> str:
        """The chat-completions endpoint requests go to."""
        return self._url

    @property
    def max_tokens(self) -> int | None:
        """The ``max_tokens`` each request sends (None: none, the endpoint's own limit)."""
        return self._max_tokens

    def load(self) -> None:
        if self._api_key_env is not None and not os.environ.get(self._api_key_env):
            raise PluginError(
                "invalid_plugin_config",
                f"reply_api_key_env names {self._api_key_env!r}, which is not set in the environment",
            )

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self._api_key_env is not None:
            headers["Authorization"] = f"Bearer {os.environ.get(self._api_key_env, '')}"
        return headers

    def _resolve_model(self) -> str:
        """The model to ask for: the configured one, else the first the server lists."""
        if self._model is not None:
            return self._model
        models_url = self._url[: -len("/chat/completions")] + "/models"
        request = urllib.request.Request(models_url, headers=self._headers(), method="GET")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                listing = msgspec.json.decode(response.read(), type=_ModelList)
        except (OSError, msgspec.DecodeError) as exc:
            raise PluginError("response_error", f"cannot list models at {models_url}: {exc}") from exc
        if not listing.data:
            raise PluginError("response_error", f"{models_url} lists no model; set reply_model")
        self._model = listing.data[0].id
        return self._model

    def reply(self, prompt: ReplyPrompt) -> Iterator[str]:
        body: dict[str, object] = {
            "model": self._resolve_model(),
            "messages": chat_messages(prompt),
            "stream": True,
        }
        max_tokens = token_cap(self._max_tokens, prompt.max_tokens)
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if prompt.temperature is not None:
            body["temperature"] = prompt.temperature
        request = urllib.request.Request(
            self._url, data=msgspec.json.encode(body), headers=self._headers(), method="POST"
        )
        try:
            response = urllib.request.urlopen(request, timeout=self._timeout_s)
        except urllib.error.HTTPError as exc:
            detail = exc.read(300).decode("utf-8", "replace")
            raise PluginError("response_error", f"reply endpoint answered {exc.code}: {detail}") from exc
        except OSError as exc:
            raise PluginError("response_error", f"reply endpoint {self._url} unreachable: {exc}") from exc
        try:
            yield from self._read_stream(response)
        finally:
            response.close()

    def _read_stream(self, response: object) -> Iterator[str]:
        """Yield content deltas from a server-sent-event stream until ``[DONE]`` or end of stream."""
        try:
            for raw in response:  # type: ignore[attr-defined]
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments, "event:" lines
                data = line[len(b"data:") :].strip()
                if data == b"[DONE]":
                    return
                chunk = self._chunk_decoder.decode(data)
                if chunk.error is not None:
                    message = chunk.error.get("message", chunk.error)
                    raise PluginError("response_error", f"reply endpoint failed mid-stream: {message}")
                for choice in chunk.choices[:1]:
                    if choice.delta.content:
                        yield choice.delta.content
        except msgspec.DecodeError as exc:
            raise PluginError("response_error", f"reply endpoint sent a malformed event: {exc}") from exc
        except OSError as exc:
            raise PluginError("response_error", f"reply stream from {self._url} failed: {exc}") from exc


class VLLMReply(ReplyStrategy):
    """Generates the reply with vLLM in-process, from a local model directory (GPU).

    The engine is built in ``load()`` (``vllm.LLMEngine``) and stepped inside
    ``reply``; each step's new text is yielded at once. Several replies (one per
    session) may be read at the same time from different threads: one lock
    serialises ``step()``, and each step's outputs are kept per request until
    their reply reads them, since one step advances every request. Outputs are
    cumulative, so a reply that reads late loses nothing. Closing the generator
    aborts its request. ``gpu_memory_utilization`` is the share of the GPU vLLM
    may take (the speech models run on the CPU).
    """

    name = "vllm"
    _ids = itertools.count()

    def __init__(
        self,
        model_dir: str,
        *,
        max_tokens: int = 256,
        temperature: float = 0.7,
        gpu_memory_utilization: float = 0.5,
    ) -> None:
        require_vllm()
        self._model_dir = model_dir
        self._max_tokens = max_tokens
        self._temperature = temperature
        self._gpu_memory_utilization = gpu_memory_utilization
        self._engine: Any = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[str, bool]] = {}  # request id -> (text so far, finished)

    def load(self) -> None:
        require_vllm()
        if not os.path.isdir(self._model_dir):
            raise PluginError("model_path_unavailable", f"no model directory at {self._model_dir}")
        from vllm import EngineArgs, LLMEngine

        args = EngineArgs(model=self._model_dir, gpu_memory_utilization=self._gpu_memory_utilization)
        engine = LLMEngine.from_engine_args(args)
        self._engine = engine
        self._tokenizer = engine.get_tokenizer()

    def close(self) -> None:
        self._engine = None
        self._tokenizer = None

    def reply(self, prompt: ReplyPrompt) -> Iterator[str]:
        if self._engine is None or self._tokenizer is None:
            raise PluginError("internal_error", "VLLMReply.reply called before load()")
        from vllm import SamplingParams

        engine = self._engine
        # enable_thinking=False: templates with a thinking switch (Qwen3) answer directly; others ignore it.
        text_prompt = self._tokenizer.apply_chat_template(
            chat_messages(prompt), tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
        temperature = prompt.temperature if prompt.temperature is not None else self._temperature
        max_tokens = token_cap(self._max_tokens, prompt.max_tokens)
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
        request_id = f"duplex-default-{next(self._ids)}"
        with self._lock:
            engine.add_request(request_id, text_prompt, params)
        finished = False
        sent = 0
        try:
            while not finished:
                with self._lock:
                    latest = self._latest.pop(request_id, None)
                    if latest is None:
                        if not engine.has_unfinished_requests():
                            return  # aborted by someone else: nothing more will come
                        for output in engine.step():
                            self._latest[output.request_id] = (output.outputs[0].text, bool(output.finished))
                        latest = self._latest.pop(request_id, None)
                if latest is None:
                    continue
                text, finished = latest
                if len(text) > sent:
                    yield text[sent:]
                    sent = len(text)
        finally:
            with self._lock:
                self._latest.pop(request_id, None)
                if not finished:
                    engine.abort_request([request_id])


def require_vllm() -> None:
    """Raise a clear ``PluginError`` when the optional ``vllm`` package is missing."""
    if importlib.util.find_spec("vllm") is None:
        raise PluginError(
            "invalid_plugin_config",
            "reply='vllm' needs the optional vllm package (GPU only): pip install vllm; "
            "or use reply='openai' with reply_url pointing at a vLLM server",
        )


_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that begins ``tag`` (a tag split across deltas)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def without_thinking(deltas: Iterable[str]) -> Iterator[str]:
    """Drop ``<think>...</think>`` spans from a delta stream, tags split across deltas included.

    Reasoning models (Qwen3 and others served by vLLM without a reasoning parser)
    put their thoughts in the content; a voice must not read them aloud. The
    whitespace right after a thought is dropped too. Text outside the spans passes
    through unchanged and as early as possible (only a possible partial tag waits).
    Closing this generator closes ``deltas`` (so a cancelled reply stops at once).
    """
    try:
        yield from _filter_thinking(deltas)
    finally:
        close = getattr(deltas, "close", None)
        if close is not None:
            close()


def _filter_thinking(deltas: Iterable[str]) -> Iterator[str]:
    buffer = ""
    thinking = False
    skip_space = False
    for delta in deltas:
        buffer += delta
        while buffer:
            if thinking:
                end = buffer.find(_THINK_CLOSE)
                if end < 0:
                    buffer = buffer[len(buffer) - _partial_tag(buffer, _THINK_CLOSE) :]
                    break
                buffer = buffer[end + len(_THINK_CLOSE) :]
                thinking, skip_space = False, True
                continue
            if skip_space:
                buffer = buffer.lstrip()
                if not buffer:
                    break
                skip_space = False
            start = buffer.find(_THINK_OPEN)
            if start >= 0:
                if start:
                    yield buffer[:start]
                buffer = buffer[start + len(_THINK_OPEN) :]
                thinking = True
                continue
            keep = _partial_tag(buffer, _THINK_OPEN)
            if len(buffer) > keep:
                yield buffer[: len(buffer) - keep]
            buffer = buffer[len(buffer) - keep :]
            break
    if buffer and not thinking:
        yield buffer


_CONTROLS = dict.fromkeys(c for c in (*range(0x20), *range(0x7F, 0xA0)) if chr(c) not in "\t\n\r")
"""C0 and C1 control characters other than tab and line breaks, for ``str.translate`` (dropped)."""


def without_controls(deltas: Iterable[str]) -> Iterator[str]:
    """Drop control characters (NUL and the rest of C0 and C1, but not tabs and line breaks) from a
    delta stream.

    A model may write them (or repeat them from the conversation); they mean nothing to a
    listener, and a NUL made the voice's phonemiser (espeak-ng) raise. A delta left empty is
    skipped. Closing this generator closes ``deltas``.
    """
    try:
        for delta in deltas:
            clean = delta.translate(_CONTROLS)
            if clean:
                yield clean
    finally:
        close = getattr(deltas, "close", None)
        if close is not None:
            close()
