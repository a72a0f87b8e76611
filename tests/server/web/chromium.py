"""Headless Chromium, driven over the Chrome DevTools Protocol (CDP), for the browser UI's tests.

No browser-automation package: Chromium is started with ``--remote-debugging-port=0``, the port it
picked is read from ``DevToolsActivePort`` in its profile directory, and CDP's JSON messages go over
the ``websockets`` client. One ``Browser`` per test (its fake microphone plays one WAV file);
``Browser.new_page()`` attaches to a new tab (flat sessions), whose console errors, uncaught
exceptions and failed loads are collected in ``Page.console_errors``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import websockets

__all__ = ["Browser", "DevToolsError", "Page", "chromium_path"]

STARTUP_TIMEOUT_S = 20.0
CALL_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 5.0
_POLL_S = 0.05  # how often to look for DevToolsActivePort while Chromium starts


def chromium_path() -> str | None:
    """The Chromium binary: ``chromium`` on PATH, else ``/usr/bin/chromium``; None when absent."""
    found = shutil.which("chromium")
    if found:
        return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None


class DevToolsError(Exception):
    """A CDP command failed, or a page's script threw; the message is the browser's."""


class Page:
    """One tab, attached as a flat CDP session."""

    def __init__(self, browser: Browser, session_id: str) -> None:
        self.browser = browser
        self.session_id = session_id
        self.console_errors: list[str] = []
        self._loaded = asyncio.Event()

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.browser.call(method, params, session_id=self.session_id)

    async def navigate(self, url: str) -> None:
        """Load ``url`` and wait for its load event."""
        self._loaded.clear()
        result = await self.call("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise DevToolsError(f"navigating to {url}: {result['errorText']}")
        async with asyncio.timeout(CALL_TIMEOUT_S):
            await self._loaded.wait()

    async def evaluate(self, expression: str, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        """The value of ``expression`` (awaited when it is a promise), as JSON data.

        Raises ``DevToolsError`` with the page's message when the expression throws or rejects.
        """
        result = await self.browser.call(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            session_id=self.session_id,
            timeout_s=timeout_s,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            message = details.get("exception", {}).get("description") or details.get("text")
            raise DevToolsError(f"{expression[:80]!r} threw: {message}")
        return result["result"].get("value")

    async def set_viewport(self, width: int, height: int) -> None:
        """Lay the page out as in a ``width`` x ``height`` CSS-pixel window (scale 1)."""
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        await self.call("Emulation.setDeviceMetricsOverride", metrics)

    async def screenshot(self) -> bytes:
        """A PNG of the whole page (all of its height, not only the window's)."""
        layout = await self.call("Page.getLayoutMetrics")
        size = layout["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = await self.call(
            "Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True}
        )
        return base64.b64decode(shot["data"])

    def on_event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Page.loadEventFired":
            self._loaded.set()
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = params.get("args", [])
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in args)
            self.console_errors.append(f"console.{params['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text")
            self.console_errors.append(f"uncaught: {text}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            self.console_errors.append(
                f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}".strip()
            )


class Browser:
    """A running headless Chromium and its CDP connection. Use ``Browser.launch``."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._pages: dict[str, Page] = {}

    @classmethod
    @contextlib.asynccontextmanager
    async def launch(cls, profile: Path, fake_microphone: Path | None = None) -> AsyncIterator[Browser]:
        """Start Chromium with a fresh profile in ``profile``; the fake microphone plays
        ``fake_microphone`` (a WAV file) once, then silence. Chromium is stopped on exit."""
        binary = chromium_path()
        if binary is None:
            raise FileNotFoundError("chromium is not installed")
        args = [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--no-default-browser-check",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "--autoplay-policy=no-user-gesture-required",
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
        ]
        if fake_microphone is not None:
            args.append(f"--use-file-for-fake-audio-capture={fake_microphone}%noloop")
        args.append("about:blank")
        log = (profile / "chromium.log").open("wb")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            url = await _devtools_url(profile, proc)
            async with websockets.connect(url, max_size=None, proxy=None) as ws:
                browser = cls(ws)
                reader = asyncio.create_task(browser._read())
                try:
                    yield browser
                finally:
                    with contextlib.suppress(Exception):
                        await browser.call("Browser.close", timeout_s=CLOSE_TIMEOUT_S)
                    reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await reader
        finally:
            try:
                await asyncio.to_thread(proc.wait, CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)
            log.close()

    async def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session_id: str | None = None,
        timeout_s: float = CALL_TIMEOUT_S,
    ) -> dict[str, Any]:
        """Send one command and return its result; raises ``DevToolsError`` on a CDP error."""
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session_id is not None:
            message["sessionId"] = session_id
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        try:
            await self.ws.send(json.dumps(message))
            async with asyncio.timeout(timeout_s):
                return await future
        finally:
            self._pending.pop(ident, None)

    async def new_page(self) -> Page:
        """A new tab on ``about:blank`` with Page, Runtime and Log events enabled."""
        target = await self.call("Target.createTarget", {"url": "about:blank"})
        attached = await self.call("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        page = Page(self, attached["sessionId"])
        self._pages[page.session_id] = page
        for domain in ("Page", "Runtime", "Log"):
            await page.call(f"{domain}.enable")
        return page

    async def _read(self) -> None:
        async for raw in self.ws:
            message = json.loads(raw)
            if "id" in message:
                future = self._pending.get(message["id"])
                if future is None or future.done():
                    continue
                if "error" in message:
                    future.set_exception(DevToolsError(f"{message['error'].get('message')}"))
                else:
                    future.set_result(message.get("result", {}))
            elif (page := self._pages.get(message.get("sessionId", ""))) is not None:
                page.on_event(message["method"], message.get("params", {}))


async def _devtools_url(profile: Path, proc: subprocess.Popen[bytes]) -> str:
    """The browser's CDP WebSocket URL, from the ``DevToolsActivePort`` file Chromium writes
    (line 1: port, line 2: path) once it listens."""
    port_file = profile / "DevToolsActivePort"
    async with asyncio.timeout(STARTUP_TIMEOUT_S):
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {proc.returncode}; see {profile / 'chromium.log'}")
            lines = port_file.read_text().splitlines() if port_file.is_file() else []
            if len(lines) >= 2:
                return f"ws://127.0.0.1:{lines[0].strip()}{lines[1].strip()}"
            await asyncio.sleep(_POLL_S)
