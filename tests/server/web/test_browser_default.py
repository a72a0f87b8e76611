"""The browser UI in headless Chromium against the default model (Silero VAD, Whisper tiny.en, the
echo reply, Piper) on a real server on loopback.

The fake microphone speaks with the default plugin's own Piper voice, so Whisper hears the exact
words. The page must show what the user said and what the assistant says, and play the reply; when
the user speaks again while the reply is still playing, the page must stop playback at once and
tell the server how much of the reply was heard (``conversation.item.truncate``).
"""

from __future__ import annotations

import pytest
import soundfile

from duplex.engine import EngineConfig
from duplex.plugins.default.plugin import DefaultPlugin, DefaultPluginConfig
from duplex.plugins.default.reply import echo_text
from tests.server.harness import running_server
from tests.server.web.conftest import needs_chromium

pytestmark = needs_chromium

QUESTION = "What time is it in Paris?"
INTERRUPTION = "Stop, tell me about London instead."


def default_server(models):
    asr, tts = models
    plugin = DefaultPlugin(DefaultPluginConfig(reply="echo", max_sessions=2, warm_up=False), asr=asr, tts=tts)
    return running_server(plugin=plugin, engine_config=EngineConfig(max_sessions=2), model_name="default")


def conversation(snapshot):
    return [(t["role"], t["text"], t["interrupted"]) for t in snapshot["conversation"]]


@pytest.mark.slow_on_uvloop
async def test_the_page_shows_the_spoken_question_plays_the_spoken_reply_and_times_its_first_audio(
    models, open_page, spoken_wav, screenshot
):
    async with (
        default_server(models) as srv,
        open_page(srv.http + "/", microphone=spoken_wav((QUESTION, 1.5))) as page,
    ):
        await page.evaluate("document.querySelector('#start').click()")
        # The whole reply was played: its item was drained by the player and acknowledged.
        heard = await page.evaluate(
            "duplexUI.waitFor(s => s.stats && s.stats.eventCounts['response.done'] === 1"
            " && s.stats.bytesPlayed === s.stats.bytesReceived && s.stats.acksSent > 0"
            " && s.stats.eventCounts['playback.acknowledged'] === s.stats.acksSent, 15000)"
        )
        shown = await page.evaluate(
            "Array.from(document.querySelectorAll('#conversation li'),"
            " li => [li.className, li.querySelector('.text').textContent])"
        )
        readout = await page.evaluate("document.querySelector('#latency').textContent")
        await page.evaluate("document.querySelector('#details').open = true")
        await screenshot(page, "conversation")
        await page.evaluate("duplexUI.stop()")
        console = page.console_errors

    assert conversation(heard) == [("user", QUESTION, False), ("assistant", echo_text(QUESTION), False)]
    assert shown == [["user", QUESTION], ["assistant", echo_text(QUESTION)]]
    # The first audio is timed from the end of speech (server VAD), which includes the VAD's share.
    (turn,) = heard["latency"]["turns"]
    assert turn["from"] == "speech" and turn["ms"] > turn["vadMs"] > 0
    assert heard["conversation"][1]["latency"] == turn
    assert readout == f"first audio: {turn['ms']} ms (median {turn['ms']} ms of 1 turn)"
    stats = heard["stats"]
    assert stats["bytesReceived"] > 24000 * 2  # more than a second of speech
    assert stats["bargeIns"] == 0  # (underruns depend on how fast the reply is spoken: not checked)
    assert heard["errors"] == []
    assert console == []


@pytest.mark.slow_on_uvloop
async def test_speaking_over_the_reply_stops_playback_and_truncates_it_where_it_was_heard(
    models, open_page, spoken_wav
):
    # The interruption starts 2 s after the question ends: while the 2.3 s reply is playing.
    wav = spoken_wav((QUESTION, 2.0), (INTERRUPTION, 1.5))
    async with default_server(models) as srv, open_page(srv.http + "/", microphone=wav) as page:
        await page.evaluate("document.querySelector('#start').click()")
        cut = await page.evaluate(
            "duplexUI.waitFor(s => s.stats && s.stats.eventCounts['conversation.item.truncated'] === 1"
            " && s.conversation.length === 4 && s.conversation[3].final, 20000)"
        )
        await page.evaluate("duplexUI.stop()")
        console = page.console_errors

    stats = cut["stats"]
    assert stats["bargeIns"] == 1
    (heard_ms,) = stats["truncates"]
    _, tts = models
    reply_ms = 1000 * len(tts.speak(echo_text(QUESTION))) / tts.sample_rate
    assert 0 < heard_ms < reply_ms - 100  # some of the reply was played, not all of it
    assert cut["conversation"][1]["heardMs"] == heard_ms  # conversation.item.truncated agrees
    assert stats["sentTypes"].count("conversation.item.truncate") == 1
    (user1, said1, _), (role, first_reply, interrupted), *rest = conversation(cut)
    assert (user1, said1, role, interrupted) == ("user", QUESTION, "assistant", True)
    # All of the reply, or (on a slow machine, where the interruption came while it was still
    # being spoken) the part that had been generated when the server cancelled it.
    assert first_reply and echo_text(QUESTION).startswith(first_reply)
    assert rest == [("user", INTERRUPTION, False), ("assistant", echo_text(INTERRUPTION), False)]
    assert [e for e in cut["errors"] if not e["soft"]] == []
    assert console == []


@pytest.mark.slow_on_uvloop
async def test_with_manual_turns_the_reply_button_ends_the_turn(models, open_page, spoken_wav):
    wav = spoken_wav((QUESTION, 1.0))
    said_bytes = 2 * soundfile.info(wav).frames  # the whole WAV, as 24 kHz pcm16
    async with default_server(models) as srv, open_page(srv.http + "/", microphone=wav) as page:
        await page.evaluate("duplexUI.settings()")
        await page.evaluate("document.querySelector('#turns').value = 'none'")
        await page.evaluate("document.querySelector('#start').click()")
        await page.evaluate(f"duplexUI.waitFor(s => s.stats && s.stats.bytesSent >= {said_bytes}, 15000)")
        assert await page.evaluate("document.querySelector('#reply').hidden") is False
        await page.evaluate("document.querySelector('#reply').click()")
        answered = await page.evaluate(
            "duplexUI.waitFor(s => s.stats.eventCounts['response.done'] === 1"
            " && s.stats.bytesPlayed === s.stats.bytesReceived, 15000)"
        )
        await page.evaluate("duplexUI.stop()")
        console = page.console_errors

    assert answered["turnMode"] == "manual"
    sent = [t for t in answered["stats"]["sentTypes"] if t != "input_audio_buffer.append"]
    assert [t for t in sent if t not in ("playback.ack", "session.event_ack")] == [
        "session.update",
        "input_audio_buffer.commit",
        "response.create",
    ]
    assert "input_audio_buffer.speech_started" not in answered["stats"]["eventTypes"]  # no server VAD
    assert conversation(answered) == [("user", QUESTION, False), ("assistant", echo_text(QUESTION), False)]
    assert answered["stats"]["micChunksDropped"] == 0
    assert answered["errors"] == []
    assert console == []
