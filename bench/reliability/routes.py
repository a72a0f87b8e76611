"""The second round of attacks: the routes beside ``/v1/realtime``, each against a fresh server.

The HTTP batch routes (``/v1/audio/speech``, ``/v1/images/generations``), the speech socket, both
video routes, the MAP dialect and its waiting room, and a model worker, attacked the ways a hostile
client was seen to (the second reliability issue):

* ``waiting_room_cut``: two sessions hold both slots, twelve MAP clients wait, and their connections
  are cut while the holders close; both slots must come back (four runs);
* ``speech_text_flood``: 9,900 ``input.text`` messages of 10 characters on one speech socket, paced
  under its rate limit, and one message of 20,000 dots on another;
* ``speech_refused_units``: sockets that leave after a unit the model refused (an unknown voice, a
  text over the model's bound) must leave no session behind;
* ``speech_stream_unread``: 16 streamed speech requests whose clients never read must free the
  model's 16 slots once it has spoken;
* ``abandoned_images``, ``abandoned_speech``: requests whose clients leave early must be cancelled
  and their slots freed within a second;
* ``nested_json``: a value 5,000 levels deep on every route, before and after its first message;
* ``hung_worker``: a model worker stopped with SIGSTOP must be reported (``/health`` ``degraded``)
  and fail its sessions with ``model_worker_failed`` within its step deadline;
* ``refusal_param``: a model's refusal of ``n``, ``size`` or ``steps`` names the field;
* ``small_answers``: ``Retry-After`` on a 429, ``/health`` counting HTTP sessions, the MAP
  dialect's close reason and messages for a bad ``mode`` and ``1e999``, and a video
  ``session.playback`` with ``1e999``.

Every server serves the in-process ``echo`` model as its default, which the bystander (its own
process) talks to, and the attacked models beside it under their names, so the bystander never
takes a slot the attack counts.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import websockets

from bench.reliability.attacks import Attack
from bench.reliability.harness import ServerProcess, connect, http_get, recv_json

__all__ = ["ATTACKS"]

DEEP = "[" * 5000 + "]" * 5000  # deeper than any JSON decoder goes
WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "


# --------------------------------------------------------------------------- servers


def _models(*entries: str, server: str = "") -> str:
    """A serve configuration: pings off, ``server`` settings, and ``entries`` as ``models:``."""
    text = "server:\n  ws_ping_interval_s: null\n" + server
    if entries:
        text += "models:\n" + "".join(entries)
    return text


def _model(name: str, plugin: str, *, path: str | None = None, worker: bool = False, **options: Any) -> str:
    """One ``models:`` entry; ``max_sessions`` (when given) bounds its engine as well."""
    lines = [f"  - name: {name}", f"    plugin: {plugin}"]
    if path is not None:
        lines.append(f"    model_path: {path}")
    if worker:
        lines.append("    worker: true")
    if options:
        lines.append("    plugin_options:")
        lines += [f"      {k}: {json.dumps(v)}" for k, v in options.items()]
    if "max_sessions" in options:
        lines += ["    engine:", f"      max_sessions: {options['max_sessions']}"]
    return "\n".join(lines) + "\n"


_CHECKPOINTS: dict[str, Path] = {}
_CHECKPOINT_DIR: tempfile.TemporaryDirectory[str] | None = None


def _checkpoint(name: str) -> Path:
    """A tiny checkpoint of ``sd`` (Stable Diffusion) or ``helios`` (video), written once per run."""
    global _CHECKPOINT_DIR
    if name not in _CHECKPOINTS:
        if _CHECKPOINT_DIR is None:
            _CHECKPOINT_DIR = tempfile.TemporaryDirectory(prefix="duplex-reliability-ckpt-")
        root = Path(_CHECKPOINT_DIR.name) / name
        if name == "sd":
            from batch_models.diffusion.testing import write_checkpoint
        else:
            from batch_models.video.testing import write_checkpoint  # type: ignore[no-redef]
        _CHECKPOINTS[name] = write_checkpoint(root, preset="tiny", seed=1)
    return _CHECKPOINTS[name]


def _piper(name: str = "piper", **options: Any) -> str:
    return _model(name, "piper_tts", noise_scale=0.0, noise_w_scale=0.0, threads=1, **options)


def _sd(**options: Any) -> str:
    return _model("sd", "sd_turbo", path=str(_checkpoint("sd")), **options)


def _helios() -> str:
    return _model("helios", "helios", path=str(_checkpoint("helios")))


# A chunk of the tiny video model takes seconds on a busy 2-core machine: no stall cut-off meanwhile.
SLOW_VIDEO = "  realtime_video:\n    stall_timeout_s: 600\n"


# --------------------------------------------------------------------------- HTTP on loopback


async def http(
    port: int, method: str, path: str, body: Any = None, *, raw: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request (``Connection: close``): ``(status, headers, body)``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_request(port, method, path, body, raw))
        data = await reader.read(-1)
    finally:
        writer.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        payload = _unchunk(payload)
    return int(lines[0].split()[1]), headers, payload


def _request(port: int, method: str, path: str, body: Any = None, raw: bytes | None = None) -> bytes:
    data = raw if raw is not None else b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
    head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    return head.encode() + data


def _unchunk(data: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        end = data.find(b"\r\n", pos)
        if end < 0:
            return bytes(out)
        size = int(data[pos:end].split(b";")[0] or b"0", 16)
        if size == 0:
            return bytes(out)
        out += data[end + 2 : end + 2 + size]
        pos = end + 4 + size


def _sessions(port: int) -> int:
    return json.loads(http_get(port, "/health")[1])["sessions"]


async def _until_sessions(port: int, at_most: int, timeout_s: float) -> float | None:
    """Seconds until ``/health`` counts at most ``at_most`` sessions (``None``: not within
    ``timeout_s``). Polled every 20 ms: a bench measures time, a test waits for events."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if await asyncio.to_thread(_sessions, port) <= at_most:
            return round(time.monotonic() - t0, 3)
        await asyncio.sleep(0.02)
    return None


def _count(codes: dict[str, int], code: str) -> None:
    codes[code] = codes.get(code, 0) + 1


# --------------------------------------------------------------------------- 1. the waiting room


async def _open(url: str, **kwargs: Any) -> Any:
    """A client socket the attack closes (or cuts) itself."""
    return await websockets.connect(url, max_size=None, ping_interval=None, open_timeout=30, **kwargs)


async def _map(srv: ServerProcess, model: str) -> Any:
    url = f"ws://127.0.0.1:{srv.port}/v1/realtime?mode=audio&model={model}"
    return await _open(url, subprotocols=["map.realtime"])


async def waiting_room_cut(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """Per run: two MAP sessions hold both slots of ``unit``, 12 MAP clients queue, and their TCP
    connections are cut while the holders close; then two fresh clients must both be admitted."""
    admitted_per_run = []
    for _ in range(opts.get("runs", 4)):
        holders = [await _map(srv, "unit") for _ in range(2)]
        try:
            for ws in holders:
                await recv_json(ws, "session.queue_done", timeout_s=10)
                await ws.send(json.dumps({"type": "session.init", "payload": {}}))
                await recv_json(ws, "session.created", timeout_s=10)
        except TimeoutError:  # the slots were lost by an earlier run
            admitted_per_run.append(0)
            for ws in holders:
                await ws.close()
            continue
        waiters = [await _map(srv, "unit") for _ in range(opts.get("waiters", 12))]
        for ws in waiters:
            await recv_json(ws, "session.queued")
        for ws in holders:  # the holders close while the waiters' connections are cut
            await ws.send(json.dumps({"type": "session.close"}))
        for ws in waiters:
            ws.transport.abort()
        for ws in holders:
            with contextlib.suppress(Exception):
                await recv_json(ws, "session.closed", timeout_s=30)
            await ws.close()
        fresh = [await _map(srv, "unit") for _ in range(2)]
        admitted = 0
        for ws in fresh:
            with contextlib.suppress(TimeoutError):
                first = await recv_json(ws, timeout_s=10)
                admitted += first["type"] == "session.queue_done"
        for ws in fresh:
            await ws.close()
        admitted_per_run.append(admitted)
        await _until_sessions(srv.port, 1, 10)  # the bystander's alone
    return {"admitted_per_run": admitted_per_run, "ok": all(n == 2 for n in admitted_per_run)}


# --------------------------------------------------------------------------- 2-4. the speech socket


def _speech_url(srv: ServerProcess) -> str:
    return f"ws://127.0.0.1:{srv.port}/v1/audio/speech/stream"


async def _drain(ws: Any, codes: dict[str, int], until: str | None = None) -> None:
    """Read the socket until a message of type ``until`` (or its close), counting error codes."""
    with contextlib.suppress(Exception):
        while True:
            message = await ws.recv()
            if isinstance(message, bytes):
                continue
            event = json.loads(message)
            if event["type"] == "error":
                _count(codes, event["code"])
            if event["type"] == until:
                return


SENTENCES = {"type": "session.config", "model": "piper", "split_granularity": "sentence"}
HI = {"model": "piper", "input": "Hi."}


async def speech_text_flood(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """9,900 ``input.text`` of 10 characters (no sentence end) at 450 a second, under the socket's
    rate limit, then ``input.done``; and one message of 20,000 dots on a second socket."""
    count, rate = opts.get("messages", 9900), opts.get("messages_per_s", 450.0)
    codes: dict[str, int] = {}
    async with connect(_speech_url(srv)) as ws:
        await ws.send(json.dumps(SENTENCES))
        reader = asyncio.create_task(_drain(ws, codes, "session.done"))
        t0 = time.monotonic()
        for i in range(count):
            await ws.send(json.dumps({"type": "input.text", "text": "abcdefghi "}))
            ahead = (i + 1) / rate - (time.monotonic() - t0)
            if ahead > 0:
                await asyncio.sleep(ahead)
        sent_s = time.monotonic() - t0
        await ws.send(json.dumps({"type": "input.done"}))  # 99,000 characters: over the model's bound
        await asyncio.wait_for(reader, 120)
    async with connect(_speech_url(srv)) as ws:
        await ws.send(json.dumps(SENTENCES))
        t1 = time.monotonic()
        await ws.send(json.dumps({"type": "input.text", "text": "." * opts.get("dots", 20_000)}))
        await ws.send(json.dumps({"type": "session.close"}))
        await _drain(ws, codes)
        dots_s = time.monotonic() - t1
    return {"messages": count, "sent_in_s": round(sent_s, 2), "dots_answered_in_s": round(dots_s, 3),
            "codes": codes, "ok": codes.get("input_backpressure", 0) == 0}  # fmt: skip


async def speech_refused_units(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """Sockets that leave right after a unit the model refused; no session may stay open."""
    codes: dict[str, int] = {}
    refusals = [("nobody", "Hello."), ("joe", "x" * 4097)] * opts.get("sockets", 4)
    for voice, text in refusals:
        ws = await _open(_speech_url(srv))
        await ws.send(json.dumps({"type": "session.config", "model": "piper", "voice": voice}))
        await ws.send(json.dumps({"type": "input.text", "text": text}))
        await ws.send(json.dumps({"type": "input.done"}))
        await _drain(ws, codes, "audio.done")
        ws.transport.abort()  # leave without a close
    left_open_after_s = await _until_sessions(srv.port, 1, 10)
    status, _, _ = await http(srv.port, "POST", "/v1/audio/speech", HI)
    ok = left_open_after_s is not None and status == 200
    return {"sockets": len(refusals), "codes": codes, "sessions_gone_after_s": left_open_after_s,
            "fresh_request_status": status, "ok": ok}  # fmt: skip


async def speech_stream_unread(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """16 streamed speech requests (half ``audio``, half ``sse``) whose clients never read: once the
    model has spoken them all, its slots must be free while the connections are still open."""
    n, text = opts.get("unread_clients", 16), (WORDS * 20)[: opts.get("unread_chars", 1000)]
    writers = []
    for i in range(n):
        body = {"model": "piper", "input": text, "response_format": "pcm",
                "stream_format": "audio" if i % 2 else "sse"}  # fmt: skip
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a window of a few kilobytes
        sock.connect(("127.0.0.1", srv.port))
        _, writer = await asyncio.open_connection(sock=sock)
        writer.write(_request(srv.port, "POST", "/v1/audio/speech", body))
        writers.append(writer)
    t0 = time.monotonic()
    freed = await _until_sessions(srv.port, 1, 120.0)
    status, _, _ = await http(srv.port, "POST", "/v1/audio/speech", HI)
    after = time.monotonic() - t0
    for writer in writers:
        writer.transport.abort()
    return {"clients": n, "slots_free_after_s": freed, "fresh_request_status": status,
            "fresh_request_after_s": round(after, 2), "ok": freed is not None and status == 200}  # fmt: skip


# --------------------------------------------------------------------------- 5. abandoned requests


async def _abandon(
    srv: ServerProcess, path: str, bodies: list[dict[str, Any]], after_s: float
) -> dict[str, Any]:
    """Send every request, leave after ``after_s``; how long until the model's slots are free."""
    writers = []
    for body in bodies:
        _, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(_request(srv.port, "POST", path, body))
        writers.append(writer)
    await asyncio.sleep(after_s)
    busy = await asyncio.to_thread(_sessions, srv.port)
    for writer in writers:
        writer.close()
    freed = await _until_sessions(srv.port, 1, 120)
    return {"requests": len(bodies), "sessions_when_left": busy, "freed_after_s": freed}


async def abandoned_images(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """32 image requests (``n`` 4, ``steps`` 50) whose clients leave after 1.5 s."""
    body = {"model": "sd", "prompt": "a fox in the snow", "n": 4, "steps": 50, "size": "32x32"}
    bodies = [body] * opts.get("requests", 32)
    row = await _abandon(srv, "/v1/images/generations", bodies, opts.get("after_s", 1.5))
    t0 = time.monotonic()
    status, _, _ = await http(srv.port, "POST", "/v1/images/generations", {"model": "sd", "prompt": "a cat"})
    row |= {"fresh_request_status": status, "fresh_request_s": round(time.monotonic() - t0, 2)}
    row["ok"] = status == 200 and row["freed_after_s"] is not None and row["freed_after_s"] < 1.0
    return row


async def abandoned_speech(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """Three speech requests of 4,000 characters whose clients leave after 1.5 s: their slots must be
    free within a second. Piper speaks one piece of up to 200 characters per request and step, and
    a stopped request's piece in flight is interrupted, so the step need not end first; it is timed
    first all the same (three requests of one such piece each), to show what the bound saves."""
    one_piece = HI | {"input": (WORDS * 4)[:200]}
    t0 = time.monotonic()
    await asyncio.gather(*(http(srv.port, "POST", "/v1/audio/speech", one_piece) for _ in range(3)))
    step_s = round(time.monotonic() - t0, 3)
    body = {"model": "piper", "input": (WORDS * 60)[: opts.get("long_chars", 4000)], "response_format": "wav"}
    row = await _abandon(srv, "/v1/audio/speech", [body] * 3, opts.get("after_s", 1.5))
    status, _, _ = await http(srv.port, "POST", "/v1/audio/speech", HI)
    freed = row["freed_after_s"]
    row |= {"one_step_s": step_s, "fresh_request_status": status}
    row["ok"] = status == 200 and freed is not None and freed < 1.0
    return row


# --------------------------------------------------------------------------- 6. nested JSON


async def _first_answer(url: str, messages: list[str], **kwargs: Any) -> tuple[str, int | None, str]:
    """Send ``messages``; the first ``error`` that answers (its code; ``closed`` when the socket
    closed without one), the close code that followed it (``None``: still open) and its message."""
    async with connect(url, **kwargs) as ws:
        for message in messages:
            await ws.send(message)
        try:
            event = await recv_json(ws, "error", timeout_s=30)
        except Exception:  # closed without an answer
            return "closed", ws.close_code, ""
        close = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                await ws.wait_closed()
            close = ws.close_code
        error = event.get("error", event)  # the OpenAI envelope, or the seeds' flat error
        return error.get("code", "?"), close, error.get("message", "")


async def _video_after_start(srv: ServerProcess, bad: str) -> tuple[str, str, bool]:
    """A generation's control socket gets ``bad``: its error, then whether ping and stop still work."""
    async with connect(f"ws://127.0.0.1:{srv.port}/v1/realtime/video") as ws:
        start = {"type": "session.start", "model": "helios", "prompt": "a river", "num_frames": 0, "seed": 1}
        await ws.send(json.dumps(start))
        while True:  # the first chunk: the generation runs
            message = await ws.recv()
            if isinstance(message, bytes):
                break
        await ws.send(bad)
        error = await recv_json(ws, "error", timeout_s=60)
        await ws.send(json.dumps({"type": "session.ping"}))
        await recv_json(ws, "session.pong", timeout_s=60)
        await ws.send(json.dumps({"type": "session.stop"}))
        done = await recv_json(ws, "session.done", timeout_s=60)
        return error["code"], error["message"], bool(done["stopped"])


async def nested_json(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """A value 5,000 levels deep on every route, before and after its first message."""
    base = f"ws://127.0.0.1:{srv.port}"
    deep_field = '{"x": ' + DEEP + "}"
    answers: dict[str, Any] = {}
    for path, body in (
        ("/v1/audio/speech", '{"model": "piper", "input": "Hi.", "x": ' + DEEP + "}"),
        ("/v1/images/generations", '{"model": "sd", "prompt": "a fox", "x": ' + DEEP + "}"),
    ):
        status, headers, data = await http(srv.port, "POST", path, raw=body.encode())
        code = json.loads(data)["error"]["code"] if headers.get("content-type") == "application/json" else "?"
        answers[f"POST {path}"] = [status, code]
    config = {"type": "session.config", "model": "piper"}
    answers["speech socket, first"] = await _first_answer(
        f"{base}/v1/audio/speech/stream", ['{"type": "session.config", "x": ' + DEEP + "}"]
    )
    answers["speech socket, later"] = await _first_answer(
        f"{base}/v1/audio/speech/stream",
        [json.dumps(config), '{"type": "input.text", "text": "a", "x": ' + DEEP + "}"],
    )
    answers["realtime video, start"] = await _first_answer(
        f"{base}/v1/realtime/video", ['{"type": "session.start", "prompt": "x", "x": ' + DEEP + "}"]
    )
    running = '{"type": "session.ping", "x": ' + DEEP + "}"
    answers["realtime video, running"] = await _video_after_start(srv, running)
    answers["video chat, first"] = await _first_answer(
        f"{base}/v1/video/chat/stream", ['{"type": "session.config", "x": ' + DEEP + "}"]
    )
    answers["realtime"] = await _first_answer(
        f"{base}/v1/realtime?model=echo", ['{"type": "session.update", "session": ' + deep_field + "}"]
    )
    answers["MAP session.init"] = await _first_answer(
        f"{base}/v1/realtime?mode=audio&model=echo",
        ['{"type": "session.init", "x": ' + DEEP + "}"],
        subprotocols=["map.realtime"],
    )
    expected = {
        "POST /v1/audio/speech": [400, "invalid_value"],  # OpenAI's code for our bad_event
        "POST /v1/images/generations": [400, "invalid_value"],
        "speech socket, first": ("bad_event", 1008),
        "speech socket, later": ("bad_event", None),
        "realtime video, start": ("bad_event", 1008),
        "realtime video, running": ("bad_event", "the message is nested too deeply", True),
        "video chat, first": ("invalid_json", 1008),
        "realtime": ("bad_event", None),
        "MAP session.init": ("bad_event", None),
    }
    wrong = [k for k, want in expected.items() if tuple(answers[k][: len(want)]) != tuple(want)]
    return {"answers": answers, "wrong": wrong, "ok": not wrong}


# --------------------------------------------------------------------------- 7. a hung worker


def _worker_pid(port: int) -> int:
    """The pid of the server's one model worker (``/health`` names it by its plugin)."""
    (worker,) = json.loads(http_get(port, "/health")[1])["workers"]
    return worker["pid"]


async def _talking(srv: ServerProcess, model: str, failed: dict[str, float], t0: list[float]) -> None:
    """A session that streams audio until its model fails it; when that came (after ``t0[0]``)."""
    pcm = base64.b64encode((np.sin(np.arange(2400) / 7) * 8000).astype("<i2").tobytes()).decode()
    async with connect(f"ws://127.0.0.1:{srv.port}/v1/realtime?model={model}") as ws:
        await recv_json(ws, "session.created")
        while True:
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": pcm}))
            with contextlib.suppress(TimeoutError):
                event = await recv_json(ws, timeout_s=0.1)
                if event["type"] == "error" and event["error"]["code"] == "model_worker_failed":
                    failed[str(len(failed))] = time.monotonic() - t0[0]
                    return


async def hung_worker(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """Two sessions talk to a model in a worker; the worker is stopped (SIGSTOP): how long until
    ``/health`` says ``degraded`` and until the sessions get ``model_worker_failed``."""
    failed: dict[str, float] = {}
    t0 = [float("inf")]
    talkers = [asyncio.create_task(_talking(srv, "worker", failed, t0)) for _ in range(2)]
    await asyncio.sleep(1.0)  # both talking
    pid = await asyncio.to_thread(_worker_pid, srv.port)
    t0[0] = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    degraded = None
    while time.monotonic() - t0[0] < 90.0 and degraded is None:
        health = json.loads((await asyncio.to_thread(http_get, srv.port, "/health"))[1])
        if health["status"] == "degraded":
            degraded = round(time.monotonic() - t0[0], 2)
        await asyncio.sleep(0.1)
    _, pending = await asyncio.wait(talkers, timeout=90.0)
    for task in pending:
        task.cancel()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)  # killed by then; never leave a stopped process behind
    bound = 30.0 + 5.0  # step_timeout_s, and the restart's and the answers' time
    failed_s = sorted(round(v, 2) for v in failed.values())
    ok = degraded is not None and degraded < bound and len(failed_s) == 2 and max(failed_s) < bound
    return {"step_timeout_s": 30.0, "degraded_after_s": degraded, "sessions_failed_after_s": failed_s,
            "ok": ok}  # fmt: skip


# --------------------------------------------------------------------------- 8. small answers


async def small_answers(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    base = f"ws://127.0.0.1:{srv.port}"
    got: dict[str, Any] = {}
    baseline = await asyncio.to_thread(_sessions, srv.port)  # the bystander's
    async with connect(f"{base}/v1/audio/speech/stream") as held:  # one of piper's two slots
        await held.send(json.dumps({"type": "session.config", "model": "piper"}))
        long_body = {"model": "piper", "input": (WORDS * 60)[:4000], "response_format": "wav"}
        in_flight = asyncio.create_task(http(srv.port, "POST", "/v1/audio/speech", long_body))
        await asyncio.sleep(1.0)
        got["health_sessions_with_2_more"] = await asyncio.to_thread(_sessions, srv.port) - baseline
        status, headers, _ = await http(srv.port, "POST", "/v1/audio/speech", HI)
        got["429_retry_after"] = [status, headers.get("retry-after")]
        in_flight.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await in_flight
    async with connect(f"{base}/v1/realtime?mode=bogus&model=echo", subprotocols=["map.realtime"]) as ws:
        error = await recv_json(ws)
        with contextlib.suppress(Exception):
            await ws.wait_closed()
        got["MAP mode=bogus"] = [error["error"]["code"], ws.close_code, ws.close_reason]
    got["MAP 1e999"] = (await _first_answer(
        f"{base}/v1/realtime?mode=audio&model=echo",
        ['{"type": "session.init", "payload": {"config": {"temperature": 1e999}}}'],
        subprotocols=["map.realtime"],
    ))[2]  # fmt: skip
    playback = '{"type": "session.playback", "position_seconds": 1e999}'
    _, message, _ = await _video_after_start(srv, playback)
    got["video playback 1e999"] = message
    expected = {
        "health_sessions_with_2_more": 2,
        "429_retry_after": [429, "1"],
        "MAP mode=bogus": ["invalid_request", 1008, "invalid_request"],
        "MAP 1e999": "Invalid session.init at payload.config.temperature: Number out of range",
        "video playback 1e999": "invalid session.playback at position_seconds: Number out of range",
    }
    wrong = [k for k, want in expected.items() if got[k] != want]
    return {"answers": got, "wrong": wrong, "ok": not wrong}


async def refusal_param(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """The image model refuses ``steps``, ``size`` and ``n`` past its own bounds: each answer names
    the field (``param``), as the route's own refusals do."""
    got: dict[str, Any] = {}
    for field, value in (("steps", 51), ("size", "1024x1024"), ("n", 5)):
        body = {"model": "sd", "prompt": "a fox", field: value}
        status, _, data = await http(srv.port, "POST", "/v1/images/generations", body)
        error = json.loads(data)["error"]
        got[field] = [status, error["code"], error.get("param")]
    wrong = [field for field, answer in got.items() if answer != [400, "invalid_value", field]]
    return {"answers": got, "wrong": wrong, "ok": not wrong}


# --------------------------------------------------------------------------- the table

BYSTANDER = ("heartbeat", "health")

ATTACKS: dict[str, Attack] = {
    a.name: a
    for a in (
        Attack(
            "waiting_room_cut", "echo", waiting_room_cut,
            _models(_model("unit", "scripted-unit", max_sessions=2)), settle_s=1.0,
            targets=("outcome", *BYSTANDER),
        ),
        Attack(
            "speech_text_flood", "echo", speech_text_flood, _models(_piper()), settle_s=1.0,
            targets=("outcome", *BYSTANDER),
        ),
        Attack(
            "speech_refused_units", "echo", speech_refused_units, _models(_piper()), settle_s=1.0,
            targets=("outcome", *BYSTANDER),
        ),
        Attack(
            "speech_stream_unread", "echo", speech_stream_unread, _models(_piper()), settle_s=1.0,
            targets=("outcome", *BYSTANDER),
        ),
        Attack(
            "abandoned_images", "echo", abandoned_images, lambda: _models(_sd()), settle_s=1.0,
            targets=("outcome", *BYSTANDER),
        ),
        Attack(
            "abandoned_speech", "echo", abandoned_speech, _models(_piper()), settle_s=1.0,
            targets=("outcome", *BYSTANDER),
        ),
        Attack(
            "nested_json", "echo", nested_json,
            lambda: _models(_piper(), _sd(), _helios(), server=SLOW_VIDEO), settle_s=1.0,
            targets=("outcome", *BYSTANDER),
        ),
        Attack(
            "hung_worker", "echo", hung_worker, _models(_model("worker", "echo", worker=True)),
            settle_s=1.0, targets=("outcome", *BYSTANDER),
        ),
        Attack(
            "refusal_param", "echo", refusal_param, lambda: _models(_sd(max_images=4)), settle_s=1.0,
            targets=("outcome", *BYSTANDER),
        ),
        Attack(
            "small_answers", "echo", small_answers,
            lambda: _models(_piper(max_sessions=2), _helios(), server=SLOW_VIDEO), settle_s=1.0,
            targets=("outcome", *BYSTANDER),
        ),
    )
}  # fmt: skip
