"""Fixtures of the browser UI's tests: a page in headless Chromium, and spoken WAV files for its
fake microphone.

The voice is the default plugin's Piper voice with its randomness off (the same words always
sound the same), as in ``tests/plugins/test_default_e2e.py``; the WAVs are written once per run.
Chromium is driven by ``tests/server/web/chromium.py``; tests that need it skip when it is absent.

The pictures of the page in ``docs/images`` are taken by these tests (the ``screenshot`` fixture):
``DUPLEX_UPDATE_SCREENSHOTS=1 python -m pytest tests/server/web -k screenshot`` writes them there;
without the variable each is written to the test's temporary folder, so a run leaves the
repository as it was.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from tests.server.web.chromium import Browser, Page, chromium_path

if TYPE_CHECKING:
    from duplex.plugins.default.asr import WhisperTranscriber
    from duplex.plugins.default.tts import PiperSpeaker

WAV_RATE = 24000
SCREENSHOTS = Path(__file__).resolve().parents[3] / "docs" / "images"
SCREENSHOT_SIZE = (960, 720)  # the window the pictures are taken in, CSS pixels
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

needs_chromium = pytest.mark.skipif(
    chromium_path() is None,
    reason="chromium is not installed (Debian: apt-get install -y chromium); the browser UI's "
    "end-to-end tests drive it headless",
)


@pytest.fixture(scope="session")
def speaker() -> PiperSpeaker:
    """Piper with the default plugin's voice, randomness off."""
    from duplex.plugins.default.tts import PiperSpeaker

    tts = PiperSpeaker(noise_scale=0.0, noise_w_scale=0.0)
    tts.load()
    return tts


@pytest.fixture(scope="session")
def models(speaker: PiperSpeaker) -> tuple[WhisperTranscriber, PiperSpeaker]:
    """The default plugin's models, loaded once per run (Whisper tiny.en and the Piper voice)."""
    from duplex.plugins.default.asr import WhisperTranscriber

    asr = WhisperTranscriber()
    asr.load()
    return asr, speaker


@pytest.fixture(scope="session")
def spoken_wav(speaker: PiperSpeaker, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``spoken_wav(("text", pause_s), ...)``: a 24 kHz mono PCM16 WAV that opens with 300 ms of
    silence, then says each text followed by its pause. Cached per argument list."""
    import soundfile
    import soxr

    folder = tmp_path_factory.mktemp("voice")
    made: dict[tuple[tuple[str, float], ...], Path] = {}

    def make(*parts: tuple[str, float]) -> Path:
        if parts not in made:
            pieces = [np.zeros(int(0.3 * WAV_RATE), np.float32)]
            for text, pause_s in parts:
                pieces.append(
                    soxr.resample(speaker.speak(text), speaker.sample_rate, WAV_RATE).astype(np.float32)
                )
                pieces.append(np.zeros(int(pause_s * WAV_RATE), np.float32))
            path = folder / f"speech{len(made)}.wav"
            soundfile.write(path, np.concatenate(pieces), WAV_RATE, subtype="PCM_16")
            made[parts] = path
        return made[parts]

    return make


@pytest.fixture
def open_page(tmp_path: Path) -> Callable[..., contextlib.AbstractAsyncContextManager[Page]]:
    """``async with open_page(url, microphone=wav) as page``: a fresh headless Chromium whose fake
    microphone plays ``wav`` once (then silence), on one tab that has loaded ``url``."""

    @contextlib.asynccontextmanager
    async def page_at(url: str, microphone: Path | None = None) -> AsyncIterator[Page]:
        profile = tmp_path / f"profile{len(list(tmp_path.glob('profile*')))}"
        profile.mkdir()
        async with Browser.launch(profile, microphone) as browser:
            page = await browser.new_page()
            await page.navigate(url)
            yield page

    return page_at


@pytest.fixture
def screenshot(tmp_path: Path) -> Callable[[Page, str], Awaitable[Path]]:
    """``await screenshot(page, "name")``: a PNG of the whole page laid out in a
    ``SCREENSHOT_SIZE`` window, as ``name.png`` in ``docs/images`` when
    ``DUPLEX_UPDATE_SCREENSHOTS=1``, else in the test's temporary folder; returns its path."""
    folder = SCREENSHOTS if os.environ.get("DUPLEX_UPDATE_SCREENSHOTS") == "1" else tmp_path

    async def take(page: Page, name: str) -> Path:
        await page.set_viewport(*SCREENSHOT_SIZE)
        await page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        png = await page.screenshot()
        assert png.startswith(PNG_SIGNATURE)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.png"
        path.write_bytes(png)
        return path

    return take
