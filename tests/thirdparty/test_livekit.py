"""LiveKit Agents' OpenAI realtime model (livekit-agents and livekit-plugins-openai 1.8.9, their own
venv) drives ``duplex serve``.

``RealtimeModel(base_url="http://HOST:PORT/v1")`` is used as LiveKit ships it, without a room:
its session sends LiveKit's default ``session.update`` (voice ``marin``, ``semantic_vad``, pcm
at 24 kHz both ways) unless a test says otherwise, and ``generate_reply()`` sends
``response.create`` with ``metadata.client_event_id`` and fails with "generate_reply timed out."
when no ``response.created`` echoing that id arrives within 10 s. See ``livekit_client.py``.
Against the real model plugins (tiny checkpoints, served in the test's process) an agent's
instructions and tools are set as an agent sets them, and the test checks what the model's slot
opened with.
"""

from __future__ import annotations

import json
import re

import pytest

from duplex.plugins.default.reply import echo_text
from tests.server.model_servers import MODELS, STOCK_INSTRUCTIONS, STOCK_TOOLS, expected_options, model_server
from tests.thirdparty.harness import QUESTION, run_client, run_client_async

pytestmark = pytest.mark.slow

PROGRAM = "livekit_client.py"
ECHO_TRANSCRIPT = re.compile(r"(w\d+ )+")  # the echo model's token per word-length of audio


def run(python, served, speech, *, turns: str, steps: str, voice: str = "") -> dict:
    """``livekit_client.py`` against ``served``; ``voice`` empty keeps LiveKit's default voice."""
    args = ["--base-url", served.http_base_url, "--speech", str(speech), "--turns", turns, "--steps", steps]
    return run_client(python, PROGRAM, *args, *(("--voice", voice) if voice else ()))


def assert_clean(summary: dict) -> None:
    """Every reply asked for was created, no error event came, the run ended before its bound,
    and the session plays pcm at 24 kHz (the rate LiveKit decodes every delta at)."""
    assert summary["errors"] == []
    assert all(r == "ok" for r in summary["generate_reply"]), summary["generate_reply"]
    assert summary["timed_out"] is False
    assert summary["server_events"][:2] == ["session.created", "session.updated"]
    assert summary["output_format"] == {"type": "audio/pcm", "rate": 24000}


def with_audio(summary: dict) -> list[dict]:
    return [g for g in summary["generations"] if g["audio_bytes"] > 0]


def test_livekit_generate_reply_on_echo_is_filled_by_the_echoed_speech(livekit_python, echo_server, speech):
    """Manual turns (turn detection off): ``generate_reply()`` returns once the response is
    created, and the echo of the speech that follows fills that same response."""
    summary = run(livekit_python, echo_server, speech, turns="manual", steps="reply,speak")
    assert_clean(summary)
    assert summary["generate_reply"] == ["ok"]
    assert summary["client_events"] == ["session.update", "response.create"]
    [done] = summary["responses"]
    assert (done["status"], done["reason"]) == ("completed", None)
    assert done["metadata"]["client_event_id"].startswith("response_create_")
    [generation] = summary["generations"]
    assert generation["response_id"] == done["id"] and generation["user_initiated"] is True
    assert generation["audio_rates"] == [24000]
    assert generation["audio_bytes"] > 0 and generation["audio_bytes"] % 3840 == 0  # whole 80 ms frames
    assert ECHO_TRANSCRIPT.fullmatch(generation["transcript"]), generation


def test_livekit_default_session_on_echo_barges_into_the_requested_reply(livekit_python, echo_server, speech):
    """LiveKit's own session (``semantic_vad`` with ``interrupt_response``): ``generate_reply()``
    returns; the user's speech start cancels the response it opened (``turn_detected``, as OpenAI's
    ``interrupt_response`` does) and the echo arrives as the next, server-initiated response."""
    summary = run(livekit_python, echo_server, speech, turns="server", steps="reply,speak")
    assert_clean(summary)
    assert summary["generate_reply"] == ["ok"]
    requested, echoed = summary["responses"]
    assert (requested["status"], requested["reason"]) == ("cancelled", "turn_detected")
    assert requested["metadata"]["client_event_id"].startswith("response_create_")
    assert (echoed["status"], echoed["metadata"]) == ("completed", None)
    events = summary["server_events"]
    assert events.index("input_audio_buffer.speech_started") < events.index("response.output_audio.delta")
    first, second = summary["generations"]
    assert (first["response_id"], first["user_initiated"], first["audio_bytes"]) == (requested["id"], True, 0)
    assert (second["response_id"], second["user_initiated"]) == (echoed["id"], False)
    assert second["audio_bytes"] > 0 and ECHO_TRANSCRIPT.fullmatch(second["transcript"]), second


def test_livekit_generate_reply_answers_a_manual_turn_on_default(livekit_python, default_server, speech):
    """LiveKit's manual turn (``commit_audio()`` then ``generate_reply()``) on the default model,
    with its voice ``joe`` chosen: the reply to the committed question comes in that response."""
    summary = run(
        livekit_python, default_server, speech, turns="manual", voice="joe", steps="speak,commit,reply"
    )
    assert_clean(summary)
    assert summary["client_events"] == ["session.update", "input_audio_buffer.commit", "response.create"]
    [done] = summary["responses"]
    assert (done["status"], done["metadata"]["client_event_id"][:16]) == ("completed", "response_create_")
    [generation] = summary["generations"]
    assert (generation["response_id"], generation["user_initiated"]) == (done["id"], True)
    assert generation["transcript"] == echo_text(QUESTION)
    assert generation["audio_bytes"] > 0 and generation["audio_rates"] == [24000]


def test_livekit_default_session_on_default_greets_then_answers_the_turn(
    livekit_python, default_server, speech
):
    """LiveKit's own turn detection (``semantic_vad``) with the voice ``joe``: a ``generate_reply()``
    before anyone spoke ends empty at once (nothing to answer), then the server VAD finds the
    question and the model answers it in a server-initiated response."""
    summary = run(
        livekit_python, default_server, speech, turns="server", voice="joe", steps="reply,wait,speak"
    )
    assert_clean(summary)
    assert summary["generate_reply"] == ["ok"]
    greeting, answer = summary["responses"]
    assert (greeting["status"], greeting["reason"]) == ("completed", None)
    assert greeting["metadata"]["client_event_id"].startswith("response_create_")
    assert (answer["status"], answer["metadata"]) == ("completed", None)
    first, second = summary["generations"]
    assert (first["user_initiated"], first["audio_bytes"], first["transcript"]) == (True, 0, "")
    assert (second["response_id"], second["user_initiated"]) == (answer["id"], False)
    assert second["transcript"] == echo_text(QUESTION) and second["audio_bytes"] > 0


def test_livekit_with_its_default_voice_gets_the_manual_turn_reply_on_default(
    livekit_python, default_server, speech
):
    summary = run(livekit_python, default_server, speech, turns="manual", steps="speak,commit,reply")
    assert_clean(summary)
    [generation] = with_audio(summary)
    assert generation["user_initiated"] is True and generation["transcript"] == echo_text(QUESTION)


@pytest.mark.parametrize("model", MODELS)
async def test_livekit_configures_the_real_model_before_its_first_input(
    model, livekit_python, tiny_checkpoint, speech
):
    """An agent's usual setup on LiveKit's default session (its first ``session.update`` asks for
    ``semantic_vad``; then the agent's instructions and two tools, LiveKit's default voice ``marin``)
    reaches the model: its slot is the session's from ``generate_reply()``'s ``response.create`` on,
    with exactly those settings, the voice mapped onto the model's own. These models take the turns
    themselves: the first update applies whole, ``session.updated`` says ``turn_detection: null``
    and a ``session.warning`` says why; no error comes."""
    async with model_server(model, tiny_checkpoint(model)) as served:
        summary = await run_client_async(
            livekit_python, PROGRAM, "--base-url", f"http://127.0.0.1:{served.port}/v1", "--model", model,
            "--speech", str(speech), "--turns", "server", "--steps", "reply,speak", "--replies", "0",
            "--instructions", STOCK_INSTRUCTIONS, "--tools-json", json.dumps(STOCK_TOOLS),
        )  # fmt: skip
    assert_clean(summary)
    events = summary["client_events"]
    assert events.count("session.update") == 3 and events[-1] == "response.create", events
    server = summary["server_events"]
    assert server[:3] == ["session.created", "session.updated", "session.warning"], server
    assert server.count("session.updated") == 3 and summary["turn_detection"] is None
    assert summary["appends"] > 0
    # The slot may open ahead of the first input once the setup is in (the engine's default); it
    # is the session's with exactly that setup.
    assert served.log.opened[-1] == expected_options(served.caps, voice="marin")
