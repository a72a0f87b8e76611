"""The three real model plugins on tiny checkpoints behind a real server, and what each slot opened with.

``write_checkpoint(name, root)`` writes a model's tiny random-weight checkpoint (what ``duplex
tiny-checkpoint NAME DIR`` writes); the session-scoped fixture ``tiny_checkpoint`` (imported by the
conftest of each test directory that uses it) writes each once per run.
``model_server(name, checkpoint)`` serves the real plugin loaded from it (one torch thread) on
loopback, as a ``Recording`` subclass: each ``open_slot`` / ``close_slot`` the engine makes is
noted in its ``SlotLog`` after the plugin did it, and a test awaits those calls instead of
guessing when they happened.

``STOCK_*`` is the setup a stock client sends right after ``session.created``: instructions, a
voice and two function tools. ``expected_options`` is what the plugin must receive for it: the
instructions; the voice mapped onto the model's own (an OpenAI voice name becomes the model's
default, none for a model without named voices); the tools only for a model that calls tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from duplex.engine import EngineConfig
from duplex.plugins.base import Capabilities, FramePlugin, SlotOptions, ToolSpec
from tests.server.harness import Running, running_server

__all__ = [
    "MODELS",
    "STOCK_INSTRUCTIONS",
    "STOCK_TOOLS",
    "Served",
    "SlotLog",
    "expected_options",
    "model_server",
    "tiny_checkpoint",
    "write_checkpoint",
]

#: The model plugins whose settings a stock client configures, by their served names.
MODELS = ("personaplex", "nemotron_voicechat", "minicpmo_4_5")

STOCK_INSTRUCTIONS = "You are Ada, a cheerful assistant. Answer in one short sentence."
STOCK_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
    {
        "type": "function",
        "name": "get_time",
        "description": "The local time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "description": "An IANA zone"}},
            "required": ["zone"],
        },
    },
]


def write_checkpoint(name: str, root: Path) -> Path:
    """The model's tiny random-weight checkpoint in ``root`` (a fixed seed)."""
    if name == "personaplex":
        from duplex.plugins.personaplex.testing import make_tiny_checkpoint
    elif name == "nemotron_voicechat":
        from duplex.plugins.nemotron.testing import make_tiny_checkpoint
    else:
        from duplex.plugins.minicpmo.testing import make_tiny_checkpoint
    return make_tiny_checkpoint(root, seed=5)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """A model's tiny checkpoint by the plugin's name: written on first use, then only read."""
    written: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in written:
            pytest.importorskip("torch")
            written[name] = write_checkpoint(name, tmp_path_factory.mktemp(name))
        return written[name]

    return get


def plugin_class(name: str) -> type[FramePlugin]:
    if name == "personaplex":
        from duplex.plugins.personaplex.plugin import PersonaPlexPlugin

        return PersonaPlexPlugin
    if name == "nemotron_voicechat":
        from duplex.plugins.nemotron.plugin import NemotronVoiceChatPlugin

        return NemotronVoiceChatPlugin
    from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin

    return MiniCPMOPlugin


class SlotLog:
    """The slot calls a ``Recording`` plugin made, in order: ``("open", slot, options)`` and
    ``("close", slot, None)``. Written on the model thread, read by the test."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, SlotOptions | None]] = []
        self._changed = threading.Condition()

    def note(self, call: str, slot: int, options: SlotOptions | None) -> None:
        with self._changed:
            self.calls.append((call, slot, options))
            self._changed.notify_all()

    @property
    def opened(self) -> list[SlotOptions]:
        return [options for call, _, options in self.calls if call == "open" and options is not None]

    async def wait(self, n: int, timeout_s: float = 30.0) -> list[tuple[str, int, SlotOptions | None]]:
        """The calls once there are at least ``n`` (``TimeoutError`` after ``timeout_s``)."""

        def wait() -> bool:
            with self._changed:
                return self._changed.wait_for(lambda: len(self.calls) >= n, timeout_s)

        if not await asyncio.to_thread(wait):
            raise TimeoutError(f"{n} slot calls expected, {timeout_s} s gave {self.calls}")
        return list(self.calls)


def recording(cls: type[FramePlugin]) -> type[FramePlugin]:
    """``cls`` noting each slot it opens and closes in its ``slot_log`` (after doing it)."""

    class Recording(cls):  # type: ignore[valid-type, misc]
        slot_log: SlotLog

        def open_slot(self, slot: int, options: SlotOptions) -> None:
            super().open_slot(slot, options)
            self.slot_log.note("open", slot, options)

        def close_slot(self, slot: int) -> None:
            super().close_slot(slot)
            self.slot_log.note("close", slot, None)

    Recording.__name__ = f"Recording{cls.__name__}"
    return Recording


@dataclass
class Served:
    """A model server on loopback: the running server, the plugin's capabilities and its slot log."""

    running: Running
    name: str
    caps: Capabilities
    log: SlotLog

    @property
    def url(self) -> str:
        return self.running.url

    @property
    def port(self) -> int:
        return self.running.port


#: ``model_server``'s default ``prefill_delay_ms``: the engine's own.
ENGINE_DEFAULT = EngineConfig().slot_prefill_delay_ms


@contextlib.asynccontextmanager
async def model_server(
    name: str, checkpoint: Path, *, max_sessions: int = 2, prefill_delay_ms: float | None = ENGINE_DEFAULT
) -> AsyncIterator[Served]:
    """Serve the plugin ``name`` loaded from ``checkpoint`` (one torch thread), recording its slots.
    ``prefill_delay_ms``: ``EngineConfig.slot_prefill_delay_ms`` (``None``: a slot opens at its
    session's first input, never ahead)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    plugin = recording(plugin_class(name)).from_options(str(checkpoint), max_sessions=max_sessions)
    plugin.slot_log = SlotLog()
    try:
        config = EngineConfig(
            max_sessions=max_sessions, reaper_interval_s=3600, slot_prefill_delay_ms=prefill_delay_ms
        )
        async with running_server(plugin=plugin, engine_config=config, model_name=name) as running:
            yield Served(running, name, plugin.capabilities(), plugin.slot_log)
    finally:
        torch.set_num_threads(threads)


def expected_options(caps: Capabilities, *, voice: str | None) -> SlotOptions:
    """What a model must open its slot with for the stock setup with ``voice``."""
    if voice is not None and voice not in caps.voices:  # an OpenAI voice: the model's own default
        voice = caps.default_voice or None
    tools = ()
    if caps.supports_tools:
        tools = tuple(
            ToolSpec(
                name=t["name"],
                description=t["description"],
                parameters=json.dumps(t["parameters"], separators=(",", ":")),
            )
            for t in STOCK_TOOLS
        )
    return SlotOptions(instructions=STOCK_INSTRUCTIONS, voice=voice, tools=tools)
