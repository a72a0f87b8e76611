"""Pipecat's ``OpenAIRealtimeLLMService`` (pipecat-ai 1.14, its own venv) drives ``duplex serve``.

The service is used as Pipecat ships it: ``base_url`` is our bare ``/v1/realtime`` (Pipecat
appends ``?model=``), it answers ``session.created`` with its ``session.update``, waits for
``session.updated``, sends the context kick-off as ``response.create``, then streams the user's
audio; every server event goes through its pydantic models, and any ``error`` event but two
ends its receive loop. See ``pipecat_client.py`` for the program and its summary. Against the
real model plugins (tiny checkpoints, served in the test's process) the service is configured as a
Pipecat user configures it, and the test checks what the model's slot opened with.
"""

from __future__ import annotations

import json
import re

import pytest

from duplex.plugins.default.reply import echo_text
from tests.server.model_servers import MODELS, STOCK_INSTRUCTIONS, STOCK_TOOLS, expected_options, model_server
from tests.thirdparty.harness import QUESTION, run_client, run_client_async

pytestmark = pytest.mark.slow

PROGRAM = "pipecat_client.py"
ECHO_TRANSCRIPT = re.compile(r"(w\d+ )+")  # the echo model's token per word-length of audio


def assert_clean(summary: dict) -> None:
    """No error frame, no event Pipecat's models refused, and the run ended before its bound."""
    assert summary["errors"] == []
    assert summary["parse_failures"] == []
    assert summary["timed_out"] is False
    assert summary["server_events"][:2] == ["session.created", "session.updated"]
    assert summary["output_format"] == {"type": "audio/pcm", "rate": 24000}


def test_pipecat_kickoff_response_is_filled_by_the_echoed_speech(pipecat_python, echo_server, speech):
    summary = run_client(
        pipecat_python, PROGRAM, "--url", echo_server.ws_url, "--speech", str(speech),
        "--speak-after", "response.created", "--replies", "1",
    )  # fmt: skip
    assert_clean(summary)
    # One session.update answers session.created, the other comes with the kick-off.
    assert summary["client_events"] == ["session.update", "session.update", "response.create"]
    assert summary["appends"] > 0
    # The kick-off's response is opened at once and the echo of the user's speech fills it.
    events = summary["server_events"]
    assert events.count("response.created") == 1
    assert events.index("response.created") < events.index("response.output_audio.delta")
    [done] = summary["responses"]
    assert (done["status"], done["reason"]) == ("completed", None)
    [reply] = summary["replies"]
    assert reply["audio_bytes"] > 0 and reply["audio_bytes"] % 3840 == 0  # whole 80 ms frames
    assert ECHO_TRANSCRIPT.fullmatch(reply["transcript"]), reply
    assert reply["audio_rates"] == [24000] and reply["tts"] == ["started", "stopped"]


def test_pipecat_gets_spoken_replies_on_default(pipecat_python, default_server, speech):
    summary = run_client(
        pipecat_python, PROGRAM, "--url", default_server.ws_url, "--speech", str(speech),
        "--kickoff-text", "Say hello.", "--speak-after", "response.done", "--replies", "2",
    )  # fmt: skip
    assert_clean(summary)
    assert summary["client_events"][:4] == [
        "session.update",
        "conversation.item.create",  # the kick-off context's user message
        "session.update",
        "response.create",
    ]
    kickoff, answer = summary["replies"]
    assert kickoff["transcript"] == echo_text("Say hello.") and kickoff["audio_bytes"] > 0
    assert answer["transcript"] == echo_text(QUESTION) and answer["audio_bytes"] > 0
    assert [(r["status"], r["reason"]) for r in summary["responses"]] == [("completed", None)] * 2


#: The voice a Pipecat user picks per model: the model's own (not its default) where it has named
#: voices, else one of OpenAI's.
PIPECAT_VOICES = {"personaplex": "VARM0", "nemotron_voicechat": "Bruno", "minicpmo_4_5": "alloy"}


@pytest.mark.parametrize("model", MODELS)
async def test_pipecat_configures_the_real_model_before_its_first_input(
    model, pipecat_python, tiny_checkpoint, speech
):
    """Pipecat's usual setup (instructions, a voice, two tools in its context) reaches the model:
    its slot is the session's from the kick-off's ``response.create`` on, with exactly those
    settings."""
    voice = PIPECAT_VOICES[model]
    async with model_server(model, tiny_checkpoint(model)) as served:
        summary = await run_client_async(
            pipecat_python, PROGRAM, "--url", served.url, "--model", model, "--speech", str(speech),
            "--speak-after", "response.created", "--replies", "0", "--voice", voice,
            "--instructions", STOCK_INSTRUCTIONS, "--tools-json", json.dumps(STOCK_TOOLS),
        )  # fmt: skip
    assert_clean(summary)
    assert summary["client_events"][:3] == ["session.update", "session.update", "response.create"]
    assert summary["appends"] > 0
    # The slot may open ahead of the first input once the setup is in (the engine's default); it
    # is the session's with exactly that setup.
    assert served.log.opened[-1] == expected_options(served.caps, voice=voice)
