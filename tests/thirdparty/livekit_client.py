"""Drive a duplex server with LiveKit Agents' OpenAI realtime model and print what came back.

Runs inside the LiveKit venv (``make thirdparty-envs``), never in the server's: it imports
nothing of ours. ``tests/thirdparty/test_livekit.py`` starts it as a subprocess and asserts on
the one JSON line it prints last.

No LiveKit room is needed: ``livekit.plugins.openai.realtime.RealtimeModel(base_url=...)``
gives a ``RealtimeSession`` that takes ``rtc.AudioFrame`` s through ``push_audio`` and hands out
each response as a ``generation_created`` event. ``--steps`` is the script, comma separated:

* ``reply``: ``generate_reply()`` and wait for the future it returns (LiveKit fails it with
  "generate_reply timed out." when no ``response.created`` whose ``metadata.client_event_id``
  echoes its ``response.create`` arrives within 10 s);
* ``speak``: ``--speech`` (raw 24 kHz mono pcm16) as 40 ms frames on a real-time schedule;
* ``commit``: ``commit_audio()`` (a manual turn);
* ``wait``: wait until every generation so far is done.

``--turns server`` keeps the plugin's default session (``semantic_vad``, responses created by
the server); ``--turns manual`` opens the session with turn detection off, as LiveKit's manual
turn mode does. ``--instructions`` and ``--tools-json`` (OpenAI function tools, as JSON) are set
before the script as an agent sets its own when its session starts: ``update_instructions`` and
``update_tools`` (raw-schema function tools). The program ends once the script has run and
``--replies`` generations with audio are done, or at ``--timeout-s``.

Summary keys: ``versions``; ``client_events`` (wire types in order, the appends only counted in
``appends``); ``server_events`` (wire types in order); ``output_format`` and ``turn_detection`` (of
the last ``session.updated``); ``responses`` (per ``response.done``: id, status, reason, metadata);
``generate_reply`` (per ``reply`` step: ``"ok"`` or the exception); ``generations`` (per
response: id, user_initiated, audio bytes, transcript, done); ``errors`` (the session's
``error`` events); ``timed_out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import aiohttp
from livekit import rtc
from livekit.agents import llm
from livekit.plugins import openai

RATE = 24000
CHUNK_SAMPLES = RATE * 40 // 1000  # 40 ms


class Run:
    """One session and what it saw; ``changed`` wakes the waits."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.client_events: list[str] = []
        self.appends = 0
        self.server_events: list[str] = []
        self.output_format: dict[str, Any] | None = None
        self.turn_detection: dict[str, Any] | None = None
        self.responses: list[dict[str, Any]] = []
        self.generate_reply: list[str] = []
        self.generations: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.changed = asyncio.Event()
        self.readers: list[asyncio.Task[None]] = []
        session.on("openai_client_event_queued", self._on_client_event)
        session.on("openai_server_event_received", self._on_server_event)
        session.on("error", lambda ev: self._note(self.errors, f"{ev.error!r} recoverable={ev.recoverable}"))
        session.on("generation_created", self._on_generation)

    def _note(self, into: list[str], value: str) -> None:
        into.append(value)
        self.changed.set()

    def _on_client_event(self, ev: dict[str, Any]) -> None:
        if ev["type"] == "input_audio_buffer.append":
            self.appends += 1
        else:
            self._note(self.client_events, ev["type"])

    def _on_server_event(self, ev: dict[str, Any]) -> None:
        if ev["type"] == "response.done":
            self.responses.append(response_summary(ev["response"]))
        elif ev["type"] == "session.updated":
            self.output_format = ev["session"]["audio"]["output"]["format"]
            self.turn_detection = ev["session"]["audio"]["input"].get("turn_detection")
        self._note(self.server_events, ev["type"])

    async def until(self, ready: Any) -> None:
        while not ready():
            self.changed.clear()
            await self.changed.wait()

    def _on_generation(self, ev: llm.GenerationCreatedEvent) -> None:
        record = {
            "response_id": ev.response_id,
            "user_initiated": ev.user_initiated,
            "audio_bytes": 0,
            "audio_rates": [],
            "transcript": "",
            "done": False,
        }
        self.generations.append(record)
        self.readers.append(asyncio.create_task(self._read(ev, record)))
        self.changed.set()

    async def _read(self, ev: llm.GenerationCreatedEvent, record: dict[str, Any]) -> None:
        async def audio(msg: llm.MessageGeneration) -> None:
            async for frame in msg.audio_stream:
                record["audio_bytes"] += len(frame.data.tobytes())
                if frame.sample_rate not in record["audio_rates"]:
                    record["audio_rates"].append(frame.sample_rate)

        async def text(msg: llm.MessageGeneration) -> None:
            async for delta in msg.text_stream:
                record["transcript"] += str(delta)

        async with asyncio.TaskGroup() as tg:
            async for msg in ev.message_stream:
                tg.create_task(audio(msg))
                tg.create_task(text(msg))
        record["done"] = True
        self.changed.set()

    def audio_replies_done(self) -> int:
        return sum(1 for g in self.generations if g["done"] and g["audio_bytes"] > 0)


def response_summary(response: dict[str, Any]) -> dict[str, Any]:
    """A ``response.done``'s response: id, status, the reason in its details, metadata."""
    details = response.get("status_details") or {}
    return {
        "id": response.get("id"),
        "status": response.get("status"),
        "reason": details.get("reason") or (details.get("error") or {}).get("code"),
        "metadata": response.get("metadata"),
    }


async def speak(session: Any, pcm: bytes) -> None:
    """``pcm`` as 40 ms ``rtc.AudioFrame`` s on an absolute real-time schedule."""
    start = time.monotonic()
    step = CHUNK_SAMPLES * 2
    for n, i in enumerate(range(0, len(pcm), step)):
        chunk = pcm[i : i + step]
        session.push_audio(rtc.AudioFrame(chunk, RATE, 1, len(chunk) // 2))
        await asyncio.sleep(max(0.0, start + (n + 1) * 0.04 - time.monotonic()))


async def script(run: Run, steps: list[str], pcm: bytes) -> None:
    session = run.session
    for step in steps:
        if step == "reply":
            try:
                await session.generate_reply()
                run.generate_reply.append("ok")
            except Exception as exc:
                run.generate_reply.append(f"{type(exc).__name__}: {exc}")
        elif step == "speak":
            await speak(session, pcm)
        elif step == "commit":
            session.commit_audio()
        elif step == "wait":
            await run.until(lambda: all(g["done"] for g in run.generations))
        else:
            raise SystemExit(f"unknown step {step!r}")


def raw_tools(tools_json: str) -> list[Any]:
    """OpenAI function tools as LiveKit raw-schema tools (what they send is the schema as given)."""

    async def handler(raw_arguments: dict[str, object]) -> str:
        return "{}"

    return [
        llm.function_tool(handler, raw_schema={k: v for k, v in t.items() if k != "type"})
        for t in json.loads(tools_json)
    ]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    pcm = Path(args.speech).read_bytes()
    async with aiohttp.ClientSession() as http:
        options: dict[str, Any] = {"turn_detection": None} if args.turns == "manual" else {}
        if args.voice:
            options["voice"] = args.voice
        model = openai.realtime.RealtimeModel(
            model=args.model, base_url=args.base_url, api_key="sk-local", http_session=http, **options
        )
        session = model.session()
        run = Run(session)
        try:
            async with asyncio.timeout(args.timeout_s):
                if args.instructions:
                    await session.update_instructions(args.instructions)
                tools = raw_tools(args.tools_json)
                if tools:
                    await session.update_tools(tools)
                await script(run, args.steps.split(","), pcm)
                await run.until(lambda: run.audio_replies_done() >= args.replies)
            timed_out = False
        except TimeoutError:
            timed_out = True
        await session.aclose()
        for reader in run.readers:
            reader.cancel()
        await asyncio.gather(*run.readers, return_exceptions=True)
    return {
        "versions": {
            p: version(p) for p in ("livekit-agents", "livekit-plugins-openai", "livekit", "aiohttp")
        },
        "client_events": run.client_events,
        "appends": run.appends,
        "server_events": run.server_events,
        "output_format": run.output_format,
        "turn_detection": run.turn_detection,
        "responses": run.responses,
        "generate_reply": run.generate_reply,
        "generations": run.generations,
        "errors": run.errors,
        "timed_out": timed_out,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base-url", required=True, help="http://HOST:PORT/v1 (LiveKit adds /realtime?model=)"
    )
    parser.add_argument("--model", default="local-duplex")
    parser.add_argument("--speech", required=True, help="raw 24 kHz mono pcm16")
    parser.add_argument("--turns", choices=("server", "manual"), default="server")
    parser.add_argument("--voice", default="", help="a voice instead of LiveKit's default (marin)")
    parser.add_argument("--steps", default="reply,speak")
    parser.add_argument("--replies", type=int, default=1, help="generations with audio to wait for")
    parser.add_argument("--instructions", default="", help="the agent's instructions (none: not set)")
    parser.add_argument("--tools-json", default="[]", help="OpenAI function tools for the agent")
    parser.add_argument("--timeout-s", type=float, default=60.0)
    print(json.dumps(asyncio.run(main_async(parser.parse_args()))), flush=True)


if __name__ == "__main__":
    main()
