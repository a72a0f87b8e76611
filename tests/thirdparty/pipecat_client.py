"""Drive a duplex server with Pipecat's ``OpenAIRealtimeLLMService`` and print what came back.

Runs inside the Pipecat venv (``make thirdparty-envs``), never in the server's: it imports
nothing of ours. ``tests/thirdparty/test_pipecat.py`` starts it as a subprocess and asserts on
the one JSON line it prints last.

The pipeline is the smallest one Pipecat allows: the realtime service and a recorder behind it,
no transport. The service is configured as a Pipecat user does: ``--instructions`` as its
``system_instruction``, ``--voice`` in its ``session_properties`` and ``--tools-json`` (OpenAI
function tools, as JSON) as the ``FunctionSchema`` s of its context. The program

1. queues an ``LLMContextFrame`` (the context kick-off: Pipecat answers ``session.created`` with
   its ``session.update``, waits for ``session.updated``, then sends ``response.create``);
2. once the server has sent ``response.created`` (``--speak-after response.created``) or the
   kick-off's ``response.done`` (``--speak-after response.done``), streams ``--speech`` (raw
   24 kHz mono pcm16) as ``InputAudioRawFrame`` s of 40 ms on a real-time schedule, like a
   microphone;
3. ends once ``--replies`` replies with audio are complete (``LLMFullResponseEndFrame``), at the
   first error or refused event, or at ``--timeout-s``.

Summary keys: ``versions``; ``client_events`` (wire types in order, as Pipecat sent them, the
appends only counted in ``appends``); ``server_events`` (wire types in order, as Pipecat read
them); ``responses`` (per ``response.done``: id, status, reason, metadata); ``output_format`` (of
the last ``session.updated``); ``parse_failures`` (server events Pipecat's pydantic models
refused: its receive loop ends there); ``errors`` (every ``ErrorFrame``, fatal or not);
``replies`` (per response Pipecat saw: audio bytes, their rates, transcript, the TTS start and
stop frames);
``timed_out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime import events as rt_events
from pipecat.services.openai.realtime.events import AudioConfiguration, AudioOutput, SessionProperties
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

RATE = 24000
CHUNK_BYTES = RATE * 2 * 40 // 1000  # 40 ms of pcm16
INSTRUCTIONS = "You are a helpful voice assistant."


class Summary:
    """What the run saw; ``changed`` wakes the waits in ``run``."""

    def __init__(self) -> None:
        self.client_events: list[str] = []
        self.appends = 0
        self.server_events: list[str] = []
        self.responses: list[dict[str, Any]] = []
        self.output_format: dict[str, Any] | None = None
        self.parse_failures: list[str] = []
        self.errors: list[str] = []
        self.replies: list[dict[str, Any]] = []
        self.open_reply: dict[str, Any] | None = None
        self.changed = asyncio.Event()

    def note(self) -> None:
        self.changed.set()

    async def until(self, ready: Any) -> None:
        while not ready():
            self.changed.clear()
            await self.changed.wait()

    def failed(self) -> bool:
        """Pipecat stops reading after an error event or an event its models refuse."""
        return bool(self.errors or self.parse_failures)

    def complete_audio_replies(self) -> int:
        return sum(1 for r in self.replies if r["audio_bytes"] > 0)

    def as_json(self, timed_out: bool) -> dict[str, Any]:
        keys = ("client_events", "appends", "server_events", "responses", "output_format")
        return {
            "versions": {p: version(p) for p in ("pipecat-ai", "websockets", "pydantic")},
            **{k: getattr(self, k) for k in keys},
            "parse_failures": self.parse_failures,
            "errors": self.errors,
            "replies": self.replies,
            "timed_out": timed_out,
        }


def recording_parse(parse: Any, summary: Summary) -> Any:
    """Pipecat's ``parse_server_event``, noting each wire type, every refusal and what the summary
    keeps of ``session.updated`` and ``response.done``."""

    def parse_server_event(message: str) -> Any:
        event = json.loads(message)
        kind = event.get("type", "?")
        summary.server_events.append(kind)
        if kind == "session.updated":
            summary.output_format = event["session"]["audio"]["output"]["format"]
        elif kind == "response.done":
            summary.responses.append(response_summary(event["response"]))
        summary.note()
        try:
            return parse(message)
        except Exception as exc:
            summary.parse_failures.append(f"{kind}: {str(exc).splitlines()[0]}")
            summary.note()
            raise

    return parse_server_event


def response_summary(response: dict[str, Any]) -> dict[str, Any]:
    """A ``response.done``'s response: id, status, the reason in its details, metadata."""
    details = response.get("status_details") or {}
    return {
        "id": response.get("id"),
        "status": response.get("status"),
        "reason": details.get("reason") or (details.get("error") or {}).get("code"),
        "metadata": response.get("metadata"),
    }


class RecordingService(OpenAIRealtimeLLMService):
    """The stock service; every client event it sends is noted by type."""

    def __init__(self, summary: Summary, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.summary = summary

    async def send_client_event(self, event: Any) -> None:
        if event.type == "input_audio_buffer.append":
            self.summary.appends += 1
        else:
            self.summary.client_events.append(event.type)
        await super().send_client_event(event)


class Recorder(FrameProcessor):
    """Collects the replies the service pushes downstream (a reply runs from
    ``LLMFullResponseStartFrame`` to ``LLMFullResponseEndFrame``)."""

    def __init__(self, summary: Summary) -> None:
        super().__init__()
        self.summary = summary

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        s = self.summary
        reply = s.open_reply
        if isinstance(frame, LLMFullResponseStartFrame):
            s.open_reply = {"audio_bytes": 0, "audio_rates": [], "transcript": "", "tts": []}
        elif reply is not None and isinstance(frame, TTSAudioRawFrame):
            reply["audio_bytes"] += len(frame.audio)
            if frame.sample_rate not in reply["audio_rates"]:
                reply["audio_rates"].append(frame.sample_rate)
        elif reply is not None and isinstance(frame, TTSTextFrame):
            reply["transcript"] += frame.text
        elif reply is not None and isinstance(frame, (TTSStartedFrame, TTSStoppedFrame)):
            reply["tts"].append("started" if isinstance(frame, TTSStartedFrame) else "stopped")
        elif reply is not None and isinstance(frame, LLMFullResponseEndFrame):
            s.replies.append(reply)
            s.open_reply = None
        elif isinstance(frame, ErrorFrame):
            s.errors.append(frame.error)
        s.note()
        await self.push_frame(frame, direction)


async def speak(worker: PipelineWorker, pcm: bytes) -> None:
    """``pcm`` as 40 ms microphone frames on an absolute real-time schedule."""
    start = time.monotonic()
    for n, i in enumerate(range(0, len(pcm), CHUNK_BYTES)):
        await worker.queue_frame(
            InputAudioRawFrame(audio=pcm[i : i + CHUNK_BYTES], sample_rate=RATE, num_channels=1)
        )
        await asyncio.sleep(max(0.0, start + (n + 1) * 0.04 - time.monotonic()))


def tools_schema(tools_json: str) -> ToolsSchema | None:
    """OpenAI function tools (``[{"type": "function", "name", "description", "parameters"}]``) as
    Pipecat's ``FunctionSchema`` s; None for none."""
    tools = [
        FunctionSchema(
            name=t["name"],
            description=t["description"],
            properties=t["parameters"]["properties"],
            required=t["parameters"].get("required", []),
        )
        for t in json.loads(tools_json)
    ]
    return ToolsSchema(standard_tools=tools) if tools else None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    summary = Summary()
    rt_events.parse_server_event = recording_parse(rt_events.parse_server_event, summary)
    extra: dict[str, Any] = {}
    if args.voice:
        output = AudioOutput(voice=args.voice)
        extra["session_properties"] = SessionProperties(audio=AudioConfiguration(output=output))
    settings = OpenAIRealtimeLLMService.Settings(
        model=args.model, system_instruction=args.instructions, **extra
    )
    llm = RecordingService(summary, api_key="sk-local", base_url=args.url, settings=settings)
    worker = PipelineWorker(
        Pipeline([llm, Recorder(summary)]),
        params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE),
        enable_rtvi=False,
        idle_timeout_secs=None,
    )

    @worker.event_handler("on_pipeline_error")
    async def on_pipeline_error(_worker: Any, frame: ErrorFrame) -> None:
        summary.errors.append(frame.error)
        summary.note()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    pcm = Path(args.speech).read_bytes()
    messages = [{"role": "user", "content": args.kickoff_text}] if args.kickoff_text else []
    tools = tools_schema(args.tools_json)
    context = LLMContext(messages, tools=tools) if tools is not None else LLMContext(messages)
    try:
        async with asyncio.timeout(args.timeout_s):
            await worker.queue_frame(LLMContextFrame(context))
            await summary.until(lambda: args.speak_after in summary.server_events or summary.failed())
            if not summary.failed():
                await speak(worker, pcm)
            await summary.until(lambda: summary.complete_audio_replies() >= args.replies or summary.failed())
        timed_out = False
    except TimeoutError:
        timed_out = True
    await worker.cancel()
    await running
    return summary.as_json(timed_out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="ws://HOST:PORT/v1/realtime (Pipecat adds ?model=)")
    parser.add_argument("--model", default="local-duplex")
    parser.add_argument("--speech", required=True, help="raw 24 kHz mono pcm16")
    parser.add_argument("--speak-after", default="response.created")
    parser.add_argument("--kickoff-text", default="", help="a user message in the kick-off context")
    parser.add_argument("--replies", type=int, default=1, help="replies with audio to wait for")
    parser.add_argument("--instructions", default=INSTRUCTIONS)
    parser.add_argument("--voice", default="", help="a voice for session_properties (none: the server's)")
    parser.add_argument("--tools-json", default="[]", help="OpenAI function tools for the context")
    parser.add_argument("--timeout-s", type=float, default=60.0)
    print(json.dumps(asyncio.run(run(parser.parse_args()))), flush=True)


if __name__ == "__main__":
    main()
