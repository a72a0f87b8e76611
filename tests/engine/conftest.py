"""Factories for engine tests: sans-IO sessions on the built-in plugins' capabilities."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from duplex.engine.actions import OpenSlot
from duplex.engine.input import DecodedAppend
from duplex.engine.session import Session
from duplex.engine.settings import SessionSettings
from duplex.plugins.base import Capabilities
from duplex.plugins.builtin.echo import EchoPlugin
from duplex.plugins.builtin.scripted import ScriptedTurnPlugin, ScriptedUnitPlugin
from duplex.protocol.realtime.commands import InputAudioBufferAppend

CAPS: dict[str, Capabilities] = {
    "echo": EchoPlugin(max_sessions=8).capabilities(),
    "unit": ScriptedUnitPlugin().capabilities(),
    "turn": ScriptedTurnPlugin().capabilities(),
    # The echo model as one with named voices would describe itself (``calm`` by default).
    "voiced": msgspec.structs.replace(
        EchoPlugin(max_sessions=8).capabilities(), voices=("calm", "narrator"), default_voice="calm"
    ),
}


def make_session(kind: str = "echo", **settings: object) -> Session:
    caps = CAPS[kind]
    base = SessionSettings.defaults("test-model", caps)
    return Session(
        "sess_test",
        0,
        caps,
        msgspec.structs.replace(base, **settings) if settings else base,
        journal_max_age_s=60.0,
        journal_max_bytes=1 << 24,
    )


def decoded(
    ms: float = 80, *, rate: int = 24000, level: float = 0.2, vad=(), in_speech=False
) -> DecodedAppend:
    n = int(rate * ms / 1000)
    return DecodedAppend(
        pcm=np.full(n, level, np.float32),
        duration_ms=ms,
        rms=abs(level),
        vad_events=tuple(vad),
        vad_in_speech=in_speech,
    )


def append() -> InputAudioBufferAppend:
    return InputAudioBufferAppend(audio=b"")


def open_model(s: Session, now: float = 0.0) -> OpenSlot:
    """Open the model of ``s`` (one that hears the stream) as a client does, with its first input:
    one silent frame appended at ``now``. Returns the ``OpenSlot`` it asked for first; the other
    actions (the frame's ``FeedAudio``) are taken with it."""
    assert s.caps.hears_stream and not s.slot_open
    s.handle(append(), now, decoded(level=0.0))
    opened, *_ = s.take_actions()
    assert isinstance(opened, OpenSlot) and s.slot_open
    return opened


def types(events) -> list[str]:
    return [type(e).__struct_config__.tag for e in events]


@pytest.fixture
def echo_session() -> Session:
    return make_session("echo")


async def until(att, tag: str) -> list:
    """An attachment's events up to and including the first ``tag``."""
    seen = []
    while True:
        event = await att.next_event()
        seen.append(event)
        if type(event).__struct_config__.tag == tag:
            return seen


async def drain(att) -> tuple[list, str]:
    """Every event an attachment still gives, and the reason its stream ended."""
    from duplex.engine import Detached

    events = []
    try:
        while True:
            events.append(await att.next_event())
    except Detached as d:
        return events, d.reason
