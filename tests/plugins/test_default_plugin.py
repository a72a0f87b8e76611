"""The default plugin against the plugin contract, with the real models (Whisper tiny.en, Piper joe).

Models are loaded once for the module and shared by the echo and openai plugins.
The openai strategy talks to a small OpenAI-compatible chat server started here
on 127.0.0.1:0, which streams its scripted reply token by token.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import soxr

from duplex.plugins.base import PluginError, PluginKind, SlotOptions, SlotOutput, TurnRequest
from duplex.plugins.default.asr import WhisperTranscriber
from duplex.plugins.default.plugin import DefaultPlugin, DefaultPluginConfig
from duplex.plugins.default.reply import OpenAIChatReply, ReplyPrompt, VLLMReply, echo_text
from duplex.plugins.default.tts import PiperSpeaker

QUESTION = "What time is it in Paris?"


def words(text: str) -> list[str]:
    """Lower-case words without punctuation: how two transcripts are compared."""
    return re.findall(r"[a-z0-9']+", text.lower())


def to_16k(pcm: np.ndarray) -> np.ndarray:
    return soxr.resample(pcm, 22050, 16000).astype(np.float32)


# --- a tiny OpenAI-compatible chat server ---


class ChatStub:
    """Serves ``/v1/models`` and streaming ``/v1/chat/completions`` with a scripted reply.

    ``reply`` is streamed one word (with its leading space) per server-sent event.
    After ``hold_after`` events the stream waits for ``release`` before sending the
    rest, so a test can cut the connection at a known point; ``aborted`` is set
    when the client closed the stream before the end.
    """

    def __init__(self) -> None:
        self.reply = "Paris is one hour ahead. It is noon there."
        self.status = 200
        self.hold_after: int | None = None
        self.release = threading.Event()
        self.aborted = threading.Event()
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
                tokens = re.findall(r"\s*\S+", stub.reply)
                try:
                    for i, token in enumerate(tokens):
                        if stub.hold_after is not None and i == stub.hold_after:
                            stub.release.wait(10)
                        chunk = {
                            "choices": [{"index": 0, "delta": {"content": token}, "finish_reason": None}]
                        }
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                    for _ in range(50):  # keep writing until a closed peer shows as a broken pipe
                        if stub.hold_after is None:
                            break
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
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()


# --- fixtures ---


@pytest.fixture(scope="module")
def models() -> tuple[WhisperTranscriber, PiperSpeaker]:
    asr, tts = WhisperTranscriber(), PiperSpeaker(noise_scale=0.0, noise_w_scale=0.0)  # repeatable speech
    asr.load()
    tts.load()
    return asr, tts


@pytest.fixture(scope="module")
def plugin(models: tuple[WhisperTranscriber, PiperSpeaker]) -> Iterator[DefaultPlugin]:
    asr, tts = models
    with DefaultPlugin(DefaultPluginConfig(max_sessions=2), asr=asr, tts=tts) as p:
        yield p


@pytest.fixture
def chat() -> Iterator[ChatStub]:
    stub = ChatStub()
    yield stub
    stub.close()


@pytest.fixture
def openai_plugin(models: tuple[WhisperTranscriber, PiperSpeaker], chat: ChatStub) -> Iterator[DefaultPlugin]:
    asr, tts = models
    config = DefaultPluginConfig(reply="openai", reply_url=chat.url, warm_up=False)
    with DefaultPlugin(config, asr=asr, tts=tts) as p:
        p.open_slot(0, SlotOptions(instructions="You are a terse travel assistant."))
        yield p


@pytest.fixture(scope="module")
def question(models: tuple[WhisperTranscriber, PiperSpeaker]) -> np.ndarray:
    """The question spoken by Piper, at 16 kHz, with a little silence around it."""
    _, tts = models
    pad = np.zeros(4000, dtype=np.float32)
    return np.concatenate([pad, to_16k(tts.speak(QUESTION)), pad])


@pytest.fixture
def slot(plugin: DefaultPlugin) -> Iterator[int]:
    plugin.open_slot(0, SlotOptions(instructions="Be brief."))
    yield 0
    plugin.close_slot(0)


# --- capabilities and options ---


def test_capabilities_state_rates_lanes_and_voice(plugin: DefaultPlugin) -> None:
    caps = plugin.capabilities()
    assert caps.kind is PluginKind.TURN
    assert (caps.input_sample_rate, caps.output_sample_rate) == (16000, 22050)
    assert caps.supports_server_vad and caps.supports_barge_in and caps.supports_client_commit
    assert caps.voices == ("joe",) and caps.default_voice == "joe"
    assert caps.max_sessions == 2


def test_from_options_converts_strings_and_refuses_unknown_options() -> None:
    plugin = DefaultPlugin.from_options(max_sessions="3", reply="echo", warm_up="false")
    assert plugin.config.max_sessions == 3 and plugin.config.warm_up is False
    with pytest.raises(PluginError) as exc:
        DefaultPlugin.from_options(colour="blue")
    assert exc.value.code == "invalid_plugin_config" and "colour" in exc.value.message


@pytest.mark.parametrize(
    ("options", "model_path", "needle"),
    [
        ({"reply": "openai"}, None, "reply_url"),
        ({"reply": "poetry"}, None, "unknown reply strategy"),
        ({"reply": "openai", "reply_url": "ftp://x"}, None, "http(s) URL"),
        ({}, "/models/llm", "model path only with reply='vllm'"),
        ({"max_sessions": "many"}, None, "max_sessions"),
    ],
)
def test_bad_options_are_refused_with_invalid_plugin_config(
    options: dict[str, object], model_path: str | None, needle: str
) -> None:
    with pytest.raises(PluginError) as exc:
        DefaultPlugin.from_options(model_path, **options)
    assert exc.value.code == "invalid_plugin_config"
    assert needle in exc.value.message


def test_vllm_strategy_without_vllm_installed_says_so_clearly() -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(PluginError) as exc:
        DefaultPlugin.from_options("/models/llm", reply="vllm")
    assert exc.value.code == "invalid_plugin_config"
    assert "pip install vllm" in exc.value.message


def test_openai_url_accepts_root_base_and_full_endpoint() -> None:
    for url in (
        "http://h:8000",
        "http://h:8000/v1",
        "http://h:8000/v1/",
        "http://h:8000/v1/chat/completions",
    ):
        assert OpenAIChatReply(url).url == "http://h:8000/v1/chat/completions"


# --- understanding and speaking ---


def test_piper_spoken_question_transcribes_exactly(
    models: tuple[WhisperTranscriber, PiperSpeaker], question: np.ndarray
) -> None:
    asr, _ = models
    assert asr.transcribe(question) == QUESTION


def test_echo_turn_streams_transcript_then_audio_with_its_text_then_end_of_turn(
    plugin: DefaultPlugin, slot: int, question: np.ndarray, models: tuple[WhisperTranscriber, PiperSpeaker]
) -> None:
    outputs = list(plugin.respond(TurnRequest(slot=slot, epoch=3, pcm=question)))

    first, audio, last = outputs[0], outputs[1:-1], outputs[-1]
    assert first.user_transcript == QUESTION and first.pcm is None and not first.end_of_turn
    assert audio and all(o.pcm is not None and o.sample_rate == 22050 and o.text for o in audio)
    assert last.end_of_turn and last.pcm is None and last.text == ""
    assert {o.epoch for o in outputs} == {3} and {o.slot for o in outputs} == {slot}
    expected = echo_text(QUESTION)
    assert [o.text for o in audio] == ["You said: ", QUESTION]  # the first clause is spoken first
    asr, _ = models
    spoken = np.concatenate([o.pcm for o in audio if o.pcm is not None])
    assert words(asr.transcribe(to_16k(spoken))) == words(expected)


def test_text_turn_is_answered_without_a_transcript_chunk(plugin: DefaultPlugin, slot: int) -> None:
    outputs = list(plugin.respond(TurnRequest(slot=slot, epoch=0, text="Good morning")))
    assert all(o.user_transcript is None for o in outputs)
    assert "".join(o.text for o in outputs) == "You said: Good morning."
    assert outputs[-1].end_of_turn


@pytest.mark.parametrize("kind", ["silence", "white noise", "hum"])
def test_turn_without_speech_gives_empty_transcript_and_no_reply(
    plugin: DefaultPlugin, slot: int, kind: str
) -> None:
    rng = np.random.default_rng(7)
    t = np.arange(24000) / 16000
    pcm = {
        "silence": np.zeros(24000),
        "white noise": rng.normal(0.0, 0.1, 24000),
        "hum": 0.3 * np.sin(2 * np.pi * 120 * t) + rng.normal(0.0, 0.01, 24000),
    }[kind].astype(np.float32)
    outputs = list(plugin.respond(TurnRequest(slot=slot, epoch=1, pcm=pcm)))
    assert outputs == [SlotOutput(slot=slot, epoch=1, user_transcript="", end_of_turn=True)]


# --- cancellation ---


def test_cancelled_epoch_yields_nothing_more(plugin: DefaultPlugin, slot: int, question: np.ndarray) -> None:
    stream = plugin.respond(TurnRequest(slot=slot, epoch=5, pcm=question))
    assert next(stream).user_transcript == QUESTION
    plugin.cancel_slot(slot, 6)
    assert list(stream) == []
    assert list(plugin.respond(TurnRequest(slot=slot, epoch=5, pcm=question))) == []


def test_closing_the_response_mid_reply_closes_the_reply_stream(
    openai_plugin: DefaultPlugin, chat: ChatStub
) -> None:
    chat.hold_after = 6  # "Paris is one hour ahead. It" then wait
    stream = openai_plugin.respond(TurnRequest(slot=0, epoch=1, text="Time in Paris?"))
    first = next(stream)
    assert first.text == "Paris is one hour ahead. " and first.pcm is not None
    stream.close()
    chat.release.set()
    assert chat.aborted.wait(10)


# --- the openai strategy ---


def test_openai_reply_is_spoken_sentence_by_sentence(
    openai_plugin: DefaultPlugin, chat: ChatStub, question: np.ndarray
) -> None:
    history = (("user", "Hi."), ("assistant", "Hello, how can"))
    outputs = list(openai_plugin.respond(TurnRequest(slot=0, epoch=2, pcm=question, history=history)))

    assert outputs[0].user_transcript == QUESTION
    spoken = [o for o in outputs if o.pcm is not None]
    assert [o.text for o in spoken] == ["Paris is one hour ahead. ", "It is noon there."]
    assert outputs[-1].end_of_turn
    (request,) = chat.requests
    assert request["stream"] is True and request["model"] == "stub-model"
    assert request["messages"] == [
        {"role": "system", "content": "You are a terse travel assistant."},
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello, how can"},
        {"role": "user", "content": QUESTION},
    ]


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
    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
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


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    package = tmp_path / "vllm"
    package.mkdir()
    (package / "__init__.py").write_text(_FAKE_VLLM)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    importlib.invalidate_caches()
    import vllm

    yield vllm
    sys.modules.pop("vllm", None)


def test_vllm_strategy_streams_engine_steps_as_deltas(fake_vllm: ModuleType, tmp_path: Path) -> None:
    strategy = VLLMReply(str(tmp_path))
    strategy.load()
    prompt = ReplyPrompt(user_text="hello", instructions="Be kind.", history=(("user", "hi"),))
    deltas = list(strategy.reply(prompt))
    assert "".join(deltas) == fake_vllm.REPLY and len(deltas) > 1
    assert fake_vllm.EVENTS[0] == ("load", str(tmp_path))
    assert fake_vllm.EVENTS[1][2] == "system:Be kind.|user:hi|user:hello"
    assert not any(event[0] == "abort" for event in fake_vllm.EVENTS)


def test_closing_a_vllm_reply_aborts_its_request(fake_vllm: ModuleType, tmp_path: Path) -> None:
    strategy = VLLMReply(str(tmp_path))
    strategy.load()
    stream = strategy.reply(ReplyPrompt(user_text="hello"))
    next(stream)
    stream.close()
    request_id = fake_vllm.EVENTS[1][1]
    assert fake_vllm.EVENTS[-1] == ("abort", request_id)


def test_vllm_plugin_speaks_the_generated_sentences(
    fake_vllm: ModuleType, tmp_path: Path, models: tuple[WhisperTranscriber, PiperSpeaker]
) -> None:
    asr, tts = models
    plugin = DefaultPlugin.from_options(str(tmp_path), reply="vllm", warm_up=False)
    plugin.asr, plugin.tts = asr, tts
    with plugin:
        plugin.open_slot(0, SlotOptions())
        outputs = list(plugin.respond(TurnRequest(slot=0, epoch=0, text="hello")))
    texts = [o.text for o in outputs if o.pcm is not None]
    assert texts == ["First sentence here. ", "Second one follows. ", "Third is last."]
