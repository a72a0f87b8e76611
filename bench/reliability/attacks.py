"""The attacks of the reliability suite, each against a fresh ``duplex serve`` process.

Every attack is an ``Attack``: the plugin and limits its server runs with, and an async function
that attacks it while a ``HealthProbe`` bystander runs, returning what it saw (``outcome``) and the
figures its target is judged on. ``run_attack`` wraps it: RSS before, peak and ``settle_s`` after,
the bystander's latencies, and whether the server is still alive. The attacks are the ones a
hostile client was seen to use (the reliability issue): huge and deeply wrong frames, big items
and instructions, a client that never reads, half-sent frames, open/close churn, client text in
metric labels, partial HTTP headers, secrets in the log, a session resumed with another key,
NaN/NUL/absurd values, and one session's long typed reply starving the others.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from bench.reliability.harness import (
    MIB,
    HealthProbe,
    ServerProcess,
    connect,
    http_get,
    raw_socket,
    recv_json,
)
from bench.ws_load import client_frame, handshake_request

__all__ = ["ATTACKS", "Attack", "run_attack"]

MSGPACK = "duplex.msgpack.v1"


@dataclass(frozen=True)
class Attack:
    name: str
    plugin: str
    run: Callable[[ServerProcess, dict[str, Any]], Awaitable[dict[str, Any]]]
    config: str | Callable[[], str] = ""  # YAML for ``--config``, or what builds it when the attack runs
    extra: tuple[str, ...] = ()
    settle_s: float = 10.0  # how long after the attack the "after" RSS is read
    targets: tuple[str, ...] = ()  # the figures this attack is judged on (``judge``)
    probe_query: str = "autostart=1"  # the bystander's handshake query: the default model
    # Run before "RSS before" is read: a model that allocates on its first use (the default plugin's
    # ONNX arenas) is warmed first, so what the attack adds is not mistaken for a leak.
    warm_up: Callable[[ServerProcess], Awaitable[Any]] | None = None


async def run_attack(attack: Attack, opts: dict[str, Any]) -> dict[str, Any]:
    """Run one attack on a fresh server; the row of the report."""
    config = attack.config() if callable(attack.config) else attack.config
    with ServerProcess(attack.plugin, config=config, extra=attack.extra) as srv:
        if attack.warm_up is not None:
            await attack.warm_up(srv)
        rss_before = srv.rss()
        t0 = srv.now()
        async with HealthProbe(srv, query=attack.probe_query) as probe:
            outcome = await attack.run(srv, opts)
            attack_end = srv.now()
        peak = srv.peak_since(t0)
        await asyncio.sleep(min(attack.settle_s, opts.get("settle_s", attack.settle_s)))
        row = {
            "attack": attack.name,
            "plugin": attack.plugin,
            "seconds": round(attack_end - t0, 2),
            "rss_before_mb": rss_before / MIB,
            "rss_peak_mb": peak / MIB,
            "rss_after_mb": srv.rss() / MIB,
            "server_alive": srv.alive,
            **probe.summary(),
            **outcome,
        }
        row["rss_timeline"] = [(round(t - t0, 2), rss // MIB) for t, rss in srv.samples if t >= t0]
    row["verdict"] = judge(row, attack.targets)
    return row


def judge(row: dict[str, Any], targets: tuple[str, ...]) -> str:
    """``pass`` when every target of the attack holds (and the server lived), else what failed."""
    failed = [] if row["server_alive"] else ["server died"]
    checks = {
        "heartbeat": lambda: (row.get("heartbeat_p99_ms") or 1e9) < 250,
        "health": lambda: (row.get("health_p99_ms") or 1e9) < 500 and not row.get("health_failures"),
        "rss_back": lambda: row["rss_after_mb"] - row["rss_before_mb"] < 200,
        "outcome": lambda: bool(row.get("ok")),
        "first_audio": lambda: (row.get("bystander_first_audio_s") or 1e9) < 3.0,
        "journal_overflow": lambda: row.get("replay_from_0") == "session.resync_required{journal_overflow}",
    }
    failed += [name for name in targets if not checks[name]()]
    return "pass" if not failed else "FAIL: " + ", ".join(failed)


def _text_item(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


# --------------------------------------------------------------------------- hostile frames


def _hostile_update(keys: int, binary: bool) -> bytes | str:
    """A ``session.update`` whose metadata has ``keys`` keys and whose instructions are mistyped."""
    metadata = {f"k{i:07d}": "v" for i in range(keys)}
    event = {"type": "session.update", "session": {"instructions": 12345, "metadata": metadata}}
    return msgspec.msgpack.encode(event) if binary else msgspec.json.encode(event).decode()


async def _frame_flood(srv: ServerProcess, opts: dict[str, Any], binary: bool) -> dict[str, Any]:
    frame = _hostile_update(opts.get("metadata_keys", 900_000), binary)
    seconds = opts.get("seconds", 20.0)
    codes: dict[str, int] = {}
    sent = 0
    kwargs = {"subprotocols": [MSGPACK]} if binary else {}
    async with connect(srv.url(), **kwargs) as ws:
        await recv_json(ws, "session.created")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await ws.send(frame)
            sent += 1
            event = await recv_json(ws, "error", timeout_s=120)
            code = event["error"]["code"]
            codes[code] = codes.get(code, 0) + 1
    return {"frame_mb": len(frame) / MIB, "frames_sent": sent, "codes": codes, "ok": sent > 0}


async def frame_json(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    return await _frame_flood(srv, opts, binary=False)


async def frame_msgpack(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    return await _frame_flood(srv, opts, binary=True)


# --------------------------------------------------------------------------- memory


async def _many_commands(
    srv: ServerProcess, make: Callable[[int], dict[str, Any]], count: int
) -> dict[str, Any]:
    """Send ``count`` commands (never acking an event), then try to replay the whole journal from a
    second socket: with more bytes sent than ``journal_max_bytes`` the replay must be refused as a
    gap (``session.resync_required{journal_overflow}``), which shows the journal kept no more."""
    codes: dict[str, int] = {}
    async with connect(srv.url()) as ws:
        created = await recv_json(ws, "session.created")
        for i in range(count):
            await ws.send(json.dumps(make(i)))
            await ws.send(json.dumps({"type": "session.heartbeat"}))
            while True:  # the command's answer, then the heartbeat's
                event = await recv_json(ws, timeout_s=120)
                if event["type"] == "error":
                    codes[event["error"]["code"]] = codes.get(event["error"]["code"], 0) + 1
                if event["type"] == "session.heartbeat_ack":
                    break
        sid, token = created["session"]["id"], created["resume_token"]
        query = f"session_id={sid}&resume_token={token}&last_event_seq=0"
        async with connect(srv.url(query)) as replay:
            first = await recv_json(replay, timeout_s=60)
            journal = f"{first['type']}{{{first.get('reason', '')}}}"
            owner = replay if first["type"] == "session.resumed" else ws  # a resume replaced ``ws``
            await owner.send(json.dumps({"type": "session.close"}))
            with contextlib.suppress(Exception):
                await recv_json(owner, "session.closed")
    return {"commands": count, "codes": codes, "replay_from_0": journal, "ok": True}


async def big_items(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """60 user text items of 10 MB each in one session, then close."""
    item = _text_item("x" * opts.get("item_bytes", 10 * MIB))
    return await _many_commands(
        srv, lambda i: {"type": "conversation.item.create", "item": item}, opts.get("count", 60)
    )


async def items_at_the_limit(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """200 user text items just under the per-message text limit (24 MB in all): the conversation's
    byte bound (16 MiB) must evict the oldest, so the server's memory stays bounded."""
    item = _text_item("x" * opts.get("limit_item_bytes", 120_000))
    return await _many_commands(
        srv, lambda i: {"type": "conversation.item.create", "item": item}, opts.get("limit_count", 200)
    )


async def instructions_at_the_limit(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """100 ``session.update`` with instructions just under the text limit (12 MB of events never
    acked): the journal keeps at most ``journal_max_bytes`` (8 MiB), so a replay from seq 0 must be
    refused as a gap (``journal_overflow``)."""
    base = "i" * opts.get("limit_item_bytes", 120_000)
    return await _many_commands(
        srv,
        lambda i: {"type": "session.update", "session": {"instructions": f"{base}{i}"}},
        opts.get("limit_count", 100),
    )


async def big_instructions(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """60 ``session.update`` with 10 MB instructions each, then close."""
    base = "i" * opts.get("item_bytes", 10 * MIB)
    return await _many_commands(
        srv,
        lambda i: {"type": "session.update", "session": {"instructions": f"{base}{i}"}},
        opts.get("count", 60),
    )


async def never_reads(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """A client streams audio for ``seconds`` and never reads a byte of the echo it causes."""
    seconds = opts.get("seconds", 20.0)
    s = raw_socket(srv.port)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(handshake_request("/v1/realtime?model=echo", srv.port, None))
    chunk = base64.b64encode(os.urandom(2 * 24000 // 2)).decode()  # 0.5 s of pcm16 at 24 kHz
    append = json.dumps({"type": "input_audio_buffer.append", "audio": chunk}).encode()
    frame = client_frame(append, 1, os.urandom(4))
    sent = 0
    deadline = time.monotonic() + seconds
    s.settimeout(1.0)
    closed_by_server = False
    try:
        while time.monotonic() < deadline:
            try:
                s.sendall(frame)
                sent += 1
            except (TimeoutError, OSError):
                closed_by_server = True
                break
            await asyncio.sleep(0.05)  # 10x real time
    finally:
        s.close()
    return {"appends_sent": sent, "detached_or_blocked": closed_by_server or sent > 0, "ok": True}


async def unfinished_frames(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """``count`` connections each send all but one byte of a 30 MiB frame, hold it, then leave."""
    count, size = opts.get("count", 20), opts.get("frame_bytes", 30 * MIB)
    payload = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (size - 64)}).encode()
    frame = client_frame(payload, 1, os.urandom(4))[:-1]
    socks, refused = [], 0
    for _ in range(count):
        s = raw_socket(srv.port)
        s.sendall(handshake_request("/v1/realtime?model=echo", srv.port, None))
        try:
            s.settimeout(10)
            s.sendall(frame)
        except OSError:
            refused += 1
        socks.append(s)
    await asyncio.sleep(opts.get("hold_s", 5.0))
    peak = srv.peak_since(0)
    for s in socks:
        s.close()
    return {"connections": count, "send_failed": refused, "held_peak_mb": peak / MIB, "ok": True}


async def open_close_rounds(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """Rounds of sessions that each fill their history with big items, then close; RSS per round."""
    rounds, sessions, items = opts.get("rounds", 4), opts.get("sessions", 10), opts.get("items", 6)
    item = _text_item("x" * opts.get("item_bytes", 2 * MIB))
    after_round = []

    async def one() -> None:
        async with connect(srv.url()) as ws:
            await recv_json(ws, "session.created")
            for _ in range(items):
                await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
            await ws.send(json.dumps({"type": "session.close"}))
            await recv_json(ws, "session.closed", timeout_s=120)

    for _ in range(rounds):
        await asyncio.gather(*(one() for _ in range(sessions)))
        await asyncio.sleep(1.0)
        after_round.append(round(srv.rss() / MIB))
    return {"rss_after_each_round_mb": after_round, "ok": True}


# --------------------------------------------------------------------------- labels, sockets, secrets


async def metric_labels(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """20 sessions close with a 5 MB reason each; /metrics must not grow with them."""
    before = len(http_get(srv.port, "/metrics")[1])
    reason = "r" * opts.get("reason_bytes", 5 * MIB)
    codes: dict[str, int] = {}
    for _ in range(opts.get("count", 20)):
        async with connect(srv.url()) as ws:
            await recv_json(ws, "session.created")
            await ws.send(json.dumps({"type": "session.close", "reason": reason}))
            with contextlib.suppress(Exception):
                event = await recv_json(ws, timeout_s=30)
                if event["type"] == "error":
                    codes[event["error"]["code"]] = codes.get(event["error"]["code"], 0) + 1
    after = len(http_get(srv.port, "/metrics")[1])
    return {"metrics_bytes_before": before, "metrics_bytes_after": after, "codes": codes,
            "ok": after < before + 64 * 1024}  # fmt: skip


async def slowloris(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """``count`` sockets each send a partial HTTP request and wait; how many are still open later."""
    count, wait_s = opts.get("count", 3000), opts.get("wait_s", 35.0)
    socks = []
    for _ in range(count):
        try:
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            s.sendall(b"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            s.setblocking(False)
            socks.append(s)
        except OSError:
            break
    opened = len(socks)
    await asyncio.sleep(wait_s)
    still_open = sum(1 for s in socks if _held_open(s))
    for s in socks:
        s.close()
    return {"sockets_opened": opened, "still_open_after_s": wait_s, "still_open": still_open,
            "ok": still_open == 0}  # fmt: skip


def _held_open(sock: socket.socket) -> bool:
    """Whether the server still holds ``sock`` open: reads what it sent (a 408, say) until its end
    (closed) or until nothing more is there (still open)."""
    try:
        while True:
            if sock.recv(65536) == b"":
                return False
    except BlockingIOError:
        return True
    except OSError:  # reset: closed
        return False


KEYS = ("sk-reliability-a", "sk-reliability-b")


async def secrets_and_keys(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """Keys and tokens in query strings must not reach the log; key B cannot resume key A's session."""
    a, b = KEYS
    async with connect(srv.url(f"autostart=1&api_key={a}")) as ws:
        created = await recv_json(ws, "session.created")
    session_id, token = created["session"]["id"], created["resume_token"]
    query = f"session_id={session_id}&resume_token={token}&last_event_seq=0"
    cross = "refused"
    try:
        async with connect(srv.url(query), additional_headers={"Authorization": f"Bearer {b}"}) as ws:
            event = await recv_json(ws, timeout_s=10)
            cross = event["error"]["code"] if event["type"] == "error" else event["type"]
    except Exception as exc:  # a refused handshake
        cross = type(exc).__name__
    async with connect(srv.url(query + f"&api_key={a}")) as ws:
        own = (await recv_json(ws, timeout_s=10))["type"]
    await asyncio.sleep(0.5)
    log = srv.log_text()
    leaked = [name for name, secret in (("api_key", a), ("resume_token", token)) if secret in log]
    ok = not leaked and cross != "session.resumed" and own == "session.resumed"
    return {"leaked_in_log": leaked, "resume_with_other_key": cross, "resume_with_own_key": own, "ok": ok}


# --------------------------------------------------------------------------- bad values


#: Each probe, whether it goes over msgpack, and the error codes that answer it rightly.
BAD_VALUES: dict[str, tuple[dict[str, Any], bool, tuple[str, ...]]] = {
    "playback.ack NaN (msgpack)": ({"type": "playback.ack", "played_ms": float("nan")}, True, ("bad_event",)),
    "playback.ack inf (msgpack)": ({"type": "playback.ack", "played_ms": float("inf")}, True, ("bad_event",)),
    "playback.ack -1 ms": ({"type": "playback.ack", "played_ms": -1}, False, ("bad_event",)),
    "truncate audio_end_ms -5": (
        {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": -5},
        False,
        ("bad_event",),
    ),
    "NUL in input_text": (
        {"type": "conversation.item.create", "item": _text_item("a\x00b")},
        False,
        ("bad_event",),
    ),
    "NUL in instructions": (
        {"type": "session.update", "session": {"instructions": "x\x00y"}},
        False,
        ("bad_event", "invalid_session_config"),
    ),
    "barge_in without a response": ({"type": "barge_in"}, False, ("response_cancel_not_active",)),
    "temperature 1e308": (
        {"type": "session.update", "session": {"temperature": 1e308}},
        False,
        ("bad_event", "invalid_session_config"),
    ),
}


async def bad_values(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """NaN/inf, NUL and absurd values each get an error with the right code, and the session lives on."""
    answers: dict[str, str] = {}
    wrong: list[str] = []
    for name, (event, binary, codes) in BAD_VALUES.items():
        encode = msgspec.msgpack.encode if binary else msgspec.json.encode
        async with connect(srv.url(), **({"subprotocols": [MSGPACK]} if binary else {})) as ws:
            await recv_json(ws, "session.created")
            await ws.send(encode(event) if binary else encode(event).decode())
            heartbeat = encode({"type": "session.heartbeat"})
            await ws.send(heartbeat if binary else heartbeat.decode())
            first = await recv_json(ws, timeout_s=10)
            answer = first["error"]["code"] if first["type"] == "error" else first["type"]
            if first["type"] != "session.heartbeat_ack":
                await recv_json(ws, "session.heartbeat_ack", timeout_s=10)  # the session lives on
        answers[name] = answer
        if answer not in codes:
            wrong.append(name)
    return {"answers": answers, "wrong": wrong, "ok": not wrong}


# --------------------------------------------------------------------------- the default plugin


async def _first_audio_s(srv: ServerProcess, text: str) -> float:
    async with connect(srv.url("model=default")) as ws:
        await recv_json(ws, "session.created")
        await ws.send(json.dumps({"type": "conversation.item.create", "item": _text_item(text)}))
        t0 = time.monotonic()
        await ws.send(json.dumps({"type": "response.create"}))
        await recv_json(ws, "response.output_audio.delta", timeout_s=180)
        return time.monotonic() - t0


async def _warm_default(srv: ServerProcess) -> None:
    """One short typed turn: the default plugin's models allocate their buffers on first use."""
    await _first_audio_s(srv, "Hello there.")


async def long_typed_reply(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """One session types 3,000 characters without punctuation; another asks something short."""
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
    long_text = (words * 100)[: opts.get("chars", 3000)]
    codes: dict[str, int] = {}

    measured = asyncio.Event()

    async def attacker() -> None:
        async with connect(srv.url("model=default")) as ws:
            await recv_json(ws, "session.created")
            await ws.send(json.dumps({"type": "conversation.item.create", "item": _text_item(long_text)}))
            await ws.send(json.dumps({"type": "response.create"}))
            await measured.wait()  # its reply plays at real time for minutes: stop it once measured
            await ws.send(json.dumps({"type": "response.cancel"}))
            with contextlib.suppress(TimeoutError):
                while True:
                    event = await recv_json(ws, timeout_s=60)
                    if event["type"] == "error":
                        codes[event["error"]["code"]] = codes.get(event["error"]["code"], 0) + 1
                    if event["type"] == "response.done":
                        return

    task = asyncio.create_task(attacker())
    await asyncio.sleep(0.5)
    try:
        first_audio = await _first_audio_s(srv, "What is the capital of France?")
    finally:
        measured.set()
    await task
    return {"typed_chars": len(long_text), "bystander_first_audio_s": round(first_audio, 2),
            "attacker_codes": codes, "ok": True}  # fmt: skip


async def cancelled_long_reply(srv: ServerProcess, opts: dict[str, Any]) -> dict[str, Any]:
    """One session types 6,000 characters and cancels after 1 s; another asks something short."""
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
    long_text = (words * 200)[: opts.get("chars", 6000)]
    async with connect(srv.url("model=default")) as ws:
        await recv_json(ws, "session.created")
        await ws.send(json.dumps({"type": "conversation.item.create", "item": _text_item(long_text)}))
        await ws.send(json.dumps({"type": "response.create"}))
        await asyncio.sleep(1.0)
        await ws.send(json.dumps({"type": "response.cancel"}))
        first_audio = await _first_audio_s(srv, "What is the capital of France?")
    return {"typed_chars": len(long_text), "bystander_first_audio_s": round(first_audio, 2), "ok": True}


FRAME_LIMITS = "server:\n  ws_ping_interval_s: null\n"
MEMORY = ("rss_back", "heartbeat")
# The long-reply attacks need a reply as long as what was typed: the echo reply, not the default's model.
ECHO_REPLY = ("--plugin-option", "reply=echo")
KEYED = "server:\n  ws_ping_interval_s: null\n  api_keys: [" + ", ".join(KEYS) + "]\n"

ATTACKS: dict[str, Attack] = {
    a.name: a
    for a in (
        Attack("frame_json", "echo", frame_json, FRAME_LIMITS, targets=("heartbeat", "outcome")),
        Attack("frame_msgpack", "echo", frame_msgpack, FRAME_LIMITS, targets=("heartbeat", "outcome")),
        Attack("big_items", "echo", big_items, FRAME_LIMITS, targets=MEMORY),
        Attack("big_instructions", "echo", big_instructions, FRAME_LIMITS, targets=MEMORY),
        Attack("items_at_the_limit", "echo", items_at_the_limit, FRAME_LIMITS, targets=MEMORY),
        Attack(
            "instructions_at_the_limit",
            "echo",
            instructions_at_the_limit,
            FRAME_LIMITS,
            targets=(*MEMORY, "journal_overflow"),
        ),
        Attack("never_reads", "echo", never_reads, FRAME_LIMITS, targets=MEMORY),
        Attack("unfinished_frames", "echo", unfinished_frames, FRAME_LIMITS, targets=MEMORY),
        Attack("open_close_rounds", "echo", open_close_rounds, FRAME_LIMITS, targets=("rss_back",)),
        Attack("metric_labels", "echo", metric_labels, FRAME_LIMITS, targets=("outcome",)),
        Attack("slowloris", "echo", slowloris, FRAME_LIMITS, settle_s=1.0, targets=("outcome", "heartbeat")),
        Attack(
            "secrets_and_keys",
            "echo",
            secrets_and_keys,
            KEYED,
            settle_s=0.0,
            targets=("outcome",),
            probe_query=f"autostart=1&api_key={KEYS[0]}",
        ),
        Attack("bad_values", "echo", bad_values, FRAME_LIMITS, settle_s=0.0, targets=("outcome",)),
        Attack(
            "long_typed_reply",
            "default",
            long_typed_reply,
            extra=ECHO_REPLY,
            settle_s=1.0,
            targets=("first_audio",),
            warm_up=_warm_default,
        ),
        Attack(
            "cancelled_long_reply",
            "default",
            cancelled_long_reply,
            extra=ECHO_REPLY,
            targets=("first_audio", "rss_back"),
            warm_up=_warm_default,
        ),
    )
}
