"""The reply strategies of the default plugin, without the speech models.

``ChatStub`` is a small OpenAI-compatible chat server on 127.0.0.1:0 that streams
a scripted reply token by token; the plugin and end-to-end tests use it too. The
``vllm`` strategy is tested against a scripted stand-in for the vllm package,
which is not installed here (it needs a GPU). ``DeltaPump`` is tested on plain
generators.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib
import importlib.util
import json
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from duplex.plugins.base import PluginError
from duplex.plugins.default.plugin import DefaultPlugin
from duplex.plugins.default.pump import DeltaPump
from duplex.plugins.default.reply import (
    EchoReply,
    OpenAIChatReply,
    ReplyPrompt,
    VLLMReply,
    chat_messages,
    token_cap,
    without_controls,
    without_thinking,
)

# --- a tiny OpenAI-compatible chat server ---


class ChatStub:
    """Serves ``/v1/models`` and streaming ``/v1/chat/completions`` with a scripted reply.

    ``reply`` is streamed one word (with its leading space) per server-sent event;
    ``replies``, when set, gives request ``i`` its own reply (the last one repeats).
    The first request may be shaped, like a model that is still talking: from
    event ``slow_after`` on, events are ``token_interval_s`` apart, and before
    event ``hold_after`` the stream waits for ``release``, so a test knows the
    reply cannot end before it says so. ``aborted`` is set when the client
    closed a stream before its end (the writes after it fail). With ``error_after``
    the stream ends with an error event after that many tokens (as vLLM reports a
    failure mid-stream).
    """

    def __init__(self) -> None:
        self.reply = "Paris is one hour ahead. It is noon there."
        self.replies: list[str] | None = None
        self.status = 200
        self.hold_after: int | None = None
        self.error_after: int | None = None
        self.slow_after: int | None = None
        self.token_interval_s = 0.1
        self.release = threading.Event()
        self.aborted = threading.Event()
        self._closing = threading.Event()
        self.requests: list[dict] = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                body = json.dumps({"object": "list", "data": [{"id": "stub-model", "object": "model"}]})
                self._send(200, "application/json", body.encode())

            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                request = json.loads(self.rfile.read(length))
                request["_authorization"] = self.headers.get("Authorization")
                stub.requests.append(request)
                if stub.status != 200:
                    self._send(stub.status, "application/json", b'{"error": {"message": "overloaded"}}')
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                n = len(stub.requests)
                reply = stub.replies[min(n, len(stub.replies)) - 1] if stub.replies else stub.reply
                tokens = re.findall(r"\s*\S+", reply)
                shaped = n == 1
                hold_after = stub.hold_after if shaped else None
                slow_after = stub.slow_after if shaped else None
                try:
                    for i, token in enumerate(tokens):
                        if stub.error_after is not None and i == stub.error_after:
                            error = {"error": {"message": "engine died", "code": 500}}
                            self.wfile.write(f"data: {json.dumps(error)}\n\n".encode())
                            self.wfile.flush()
                            return
                        if hold_after is not None and i == hold_after:
                            stub.release.wait(30)
                        elif slow_after is not None and i >= slow_after:
                            stub._closing.wait(stub.token_interval_s)  # the model's pace
                        chunk = {
                            "choices": [{"index": 0, "delta": {"content": token}, "finish_reason": None}]
                        }
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                    for _ in range(50):  # keep writing until a closed peer shows as a broken pipe
                        if hold_after is None and slow_after is None:
                            break
                        if slow_after is not None:
                            stub._closing.wait(stub.token_interval_s)
                        self.wfile.write(b": keep-alive\n\n")
                        self.wfile.flush()
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except OSError:
                    stub.aborted.set()

            def _send(self, status: int, ctype: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closing.set()
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()


# --- echo and messages (the ``chat`` fixture is in conftest.py) ---


def test_echo_repeats_the_words_in_one_sentence_a_word_a_token() -> None:
    assert list(EchoReply().reply(ReplyPrompt(user_text="hello there"))) == [
        "You ",
        "said: ",
        "hello ",
        "there.",
    ]
    assert "".join(EchoReply().reply(ReplyPrompt(user_text="Is it?"))) == "You said: Is it?"


def test_echo_stops_at_the_prompts_token_limit() -> None:
    assert list(EchoReply().reply(ReplyPrompt(user_text="hello there", max_tokens=2))) == ["You ", "said:"]


@pytest.mark.parametrize(
    ("own", "asked", "cap"), [(None, None, None), (96, None, 96), (None, 5, 5), (96, 5, 5), (4, 5, 4)]
)
def test_a_reply_is_capped_by_the_smaller_of_the_strategys_limit_and_the_prompts(own, asked, cap) -> None:
    assert token_cap(own, asked) == cap


def test_chat_messages_put_instructions_first_and_skip_empty_or_unknown_roles() -> None:
    prompt = ReplyPrompt(
        user_text="now", instructions="Be brief.", history=(("user", "a"), ("tool", "x"), ("assistant", ""))
    )
    assert chat_messages(prompt) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "a"},
        {"role": "user", "content": "now"},
    ]


# --- thoughts are not spoken ---


@pytest.mark.parametrize(
    ("deltas", "spoken"),
    [
        (["<think>hmm</think>\n\nHello."], ["Hello."]),
        (["<th", "ink>let me", " see</th", "ink>", "  ", "It is noon."], ["It is noon."]),
        (["Sure. <think>x</think>Done."], ["Sure. ", "Done."]),
        (["a < b, and <thin", "g>"], ["a < b, and ", "<thin", "g>"]),
        (["<think>never closed"], []),
    ],
)
def test_thinking_spans_are_dropped_from_the_stream(deltas: list[str], spoken: list[str]) -> None:
    assert "".join(without_thinking(deltas)) == "".join(spoken)


def test_text_without_thinking_passes_through_as_it_comes() -> None:
    stream = without_thinking(iter(["Hello", " there. ", "<", "b>"]))
    assert next(stream) == "Hello" and next(stream) == " there. "


# --- control characters are not spoken ---


def test_control_characters_are_dropped_from_the_stream_but_tabs_and_line_breaks_stay() -> None:
    deltas = ["Hello\x00 there.", "\x07", "\x1b[31mRed\x7f\x85.\r\n", "\tBye."]
    assert list(without_controls(deltas)) == ["Hello there.", "[31mRed.\r\n", "\tBye."]


def test_closing_the_stream_without_controls_closes_its_source() -> None:
    closed = []

    def source() -> Iterator[str]:
        try:
            yield from ("a", "b", "c")
        finally:
            closed.append(True)

    stream = without_controls(source())
    assert next(stream) == "a"
    stream.close()
    assert closed == [True]


# --- the openai strategy ---


def test_openai_url_accepts_root_base_and_full_endpoint() -> None:
    for url in (
        "http://h:8000",
        "http://h:8000/v1",
        "http://h:8000/v1/",
        "http://h:8000/v1/chat/completions",
    ):
        assert OpenAIChatReply(url).url == "http://h:8000/v1/chat/completions"


def test_openai_strategy_sends_model_and_key_from_the_named_variable(
    chat: ChatStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUPLEX_TEST_CHAT_KEY", "sk-test")
    strategy = OpenAIChatReply(chat.url, model="m1", api_key_env="DUPLEX_TEST_CHAT_KEY")
    strategy.load()
    assert "".join(strategy.reply(ReplyPrompt(user_text="hi"))) == chat.reply
    assert chat.requests[0]["model"] == "m1"
    assert chat.requests[0]["_authorization"] == "Bearer sk-test"


def test_openai_strategy_with_unset_key_variable_refuses_to_load(chat: ChatStub) -> None:
    strategy = OpenAIChatReply(chat.url, api_key_env="DUPLEX_TEST_UNSET_VARIABLE")
    with pytest.raises(PluginError) as exc:
        strategy.load()
    assert exc.value.code == "invalid_plugin_config"


def test_openai_endpoint_error_becomes_response_error(chat: ChatStub) -> None:
    chat.status = 503
    strategy = OpenAIChatReply(chat.url, model="m1")
    with pytest.raises(PluginError) as exc:
        list(strategy.reply(ReplyPrompt(user_text="hi")))
    assert exc.value.code == "response_error" and "503" in exc.value.message


def test_an_error_event_in_the_stream_becomes_response_error(chat: ChatStub) -> None:
    chat.error_after = 2
    stream = OpenAIChatReply(chat.url, model="m1").reply(ReplyPrompt(user_text="hi"))
    assert next(stream) + next(stream) == "Paris is"
    with pytest.raises(PluginError) as exc:
        next(stream)
    assert exc.value.code == "response_error" and "engine died" in exc.value.message


def test_openai_unreachable_endpoint_becomes_response_error(chat: ChatStub) -> None:
    url = chat.url
    chat.close()
    strategy = OpenAIChatReply(url, model="m1", timeout_s=5)
    with pytest.raises(PluginError) as exc:
        list(strategy.reply(ReplyPrompt(user_text="hi")))
    assert exc.value.code == "response_error"


# --- the vllm strategy, against a stand-in for the vllm package (not installed here) ---

_FAKE_VLLM = '''
"""A stand-in for the parts of vllm that VLLMReply uses: a scripted engine."""
REPLY = "First sentence here. Second one follows. Third is last."
EVENTS = []


class EngineArgs:
    def __init__(self, model, gpu_memory_utilization):
        self.model = model


class SamplingParams:
    def __init__(self, max_tokens, temperature):
        self.max_tokens, self.temperature = max_tokens, temperature


class _Tokenizer:
    def apply_chat_template(self, messages, tokenize, add_generation_prompt, **template_kwargs):
        EVENTS.append(("template", template_kwargs))
        return "|".join(m["role"] + ":" + m["content"] for m in messages)


class _Completion:
    def __init__(self, text):
        self.text = text


class _Output:
    def __init__(self, request_id, text, finished):
        self.request_id, self.outputs, self.finished = request_id, [_Completion(text)], finished


class LLMEngine:
    def __init__(self):
        self.requests = {}

    @classmethod
    def from_engine_args(cls, args):
        EVENTS.append(("load", args.model))
        return cls()

    def get_tokenizer(self):
        return _Tokenizer()

    def add_request(self, request_id, prompt, params):
        EVENTS.append(("add", request_id, prompt))
        self.requests[request_id] = 0

    def has_unfinished_requests(self):
        return bool(self.requests)

    def step(self):
        outputs = []
        for request_id in list(self.requests):
            self.requests[request_id] += 7
            n = self.requests[request_id]
            finished = n >= len(REPLY)
            outputs.append(_Output(request_id, REPLY[:n], finished))
            if finished:
                del self.requests[request_id]
        return outputs

    def abort_request(self, request_ids):
        EVENTS.append(("abort", *request_ids))
        for request_id in request_ids:
            self.requests.pop(request_id, None)
'''


@contextlib.contextmanager
def installed_fake_vllm(directory: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """Make ``import vllm`` give the scripted stand-in (written into ``directory``) while in use."""
    package = directory / "vllm"
    package.mkdir()
    (package / "__init__.py").write_text(_FAKE_VLLM)
    monkeypatch.syspath_prepend(str(directory))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    importlib.invalidate_caches()
    try:
        yield importlib.import_module("vllm")
    finally:
        sys.modules.pop("vllm", None)


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    with installed_fake_vllm(tmp_path, monkeypatch) as module:
        yield module


def test_vllm_strategy_streams_engine_steps_as_deltas(fake_vllm: ModuleType, tmp_path: Path) -> None:
    strategy = VLLMReply(str(tmp_path))
    strategy.load()
    prompt = ReplyPrompt(user_text="hello", instructions="Be kind.", history=(("user", "hi"),))
    deltas = list(strategy.reply(prompt))
    assert "".join(deltas) == fake_vllm.REPLY and len(deltas) > 1
    assert fake_vllm.EVENTS[0] == ("load", str(tmp_path))
    assert fake_vllm.EVENTS[1] == ("template", {"enable_thinking": False})
    assert fake_vllm.EVENTS[2][2] == "system:Be kind.|user:hi|user:hello"
    assert not any(event[0] == "abort" for event in fake_vllm.EVENTS)


def test_interleaved_vllm_replies_each_get_their_whole_text(fake_vllm: ModuleType, tmp_path: Path) -> None:
    strategy = VLLMReply(str(tmp_path))
    strategy.load()
    first = strategy.reply(ReplyPrompt(user_text="one"))
    second = strategy.reply(ReplyPrompt(user_text="two"))
    texts = ["", ""]
    streams = [first, second]
    while streams:
        for stream in list(streams):
            delta = next(stream, None)
            if delta is None:
                streams.remove(stream)
            else:
                texts[0 if stream is first else 1] += delta
    assert texts == [fake_vllm.REPLY, fake_vllm.REPLY]


def test_closing_a_vllm_reply_aborts_its_request(fake_vllm: ModuleType, tmp_path: Path) -> None:
    strategy = VLLMReply(str(tmp_path))
    strategy.load()
    stream = strategy.reply(ReplyPrompt(user_text="hello"))
    next(stream)
    stream.close()
    request_id = fake_vllm.EVENTS[2][1]
    assert fake_vllm.EVENTS[-1] == ("abort", request_id)


def test_vllm_strategy_without_vllm_installed_says_so_clearly() -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(PluginError) as exc:
        DefaultPlugin.from_options("/models/llm", reply="vllm")
    assert exc.value.code == "invalid_plugin_config"
    assert "pip install vllm" in exc.value.message


# --- the pump that reads a blocking reply on its own thread ---


def test_pump_yields_none_while_the_source_waits_then_its_deltas() -> None:
    gate = threading.Event()

    def source() -> Iterator[str]:
        yield "a"
        gate.wait(10)
        yield "b"

    stream = DeltaPump(source(), poll_s=0.01).deltas()
    assert next(stream) == "a"
    assert next(stream) is None  # nothing new: the consumer gets control back
    gate.set()
    assert [d for d in stream if d is not None] == ["b"]


def test_pump_raises_the_source_error_from_the_consumer_side() -> None:
    def source() -> Iterator[str]:
        yield "a"
        raise PluginError("response_error", "backend gone")

    with pytest.raises(PluginError) as exc:
        list(DeltaPump(source(), poll_s=0.01).deltas())
    assert exc.value.code == "response_error"


def test_closing_the_pump_closes_its_source_on_the_next_delta() -> None:
    gate, closed = threading.Event(), threading.Event()

    def source() -> Iterator[str]:
        try:
            yield "a"
            gate.wait(10)
            yield "b"
            yield "never read"
        finally:
            closed.set()

    stream = DeltaPump(source(), poll_s=0.01).deltas()
    assert next(stream) == "a"
    stream.close()
    gate.set()
    assert closed.wait(10)
