"""The browser UI's routes: ``GET /`` serves ``static/index.html``; ``/static/*`` its assets.

The page talks to ``/v1/realtime`` like any other client (GA JSON events over the same origin),
so it needs nothing from the server beyond these files. The files ship inside the package
(``tool.setuptools.package-data``: ``server/static/*``, so the folder has no subfolders); when they
are missing, ``/`` answers 404. Every URL in the page is relative to it, so it also works behind a
proxy that serves the whole app under a path prefix (open the page with its trailing slash).

The files (plain ES modules, no build step, nothing from another origin):

* ``index.html``, ``style.css``: the page;
* ``app.js``: buttons and views, the camera preview before a call, and ``window.duplexUI`` (state
  snapshots for tests);
* ``settings.js``: the settings panel: the served models (``/v1/models``), the chosen model's
  voices and turn detection, instructions, tools (JSON, checked as typed);
* ``call.js``: one call: socket, events, typed text, turns, resume, stop;
* ``conversation.js``: the conversation as shown (transcripts, typed text, interruptions);
* ``latency.js``: each turn's first audio after the end of the user's turn, and their median;
* ``eventlog.js``: the event log (both directions, repeats folded, each line opens to its JSON);
* ``playback.js``: what the listener heard: the player, playback acks, barge-in truncates;
* ``audio.js``: the AudioContext, the microphone and the player (AudioWorklet nodes);
* ``camera.js``: the camera, its preview, and its picture as a JPEG sized for the model;
* ``audio-worklet.js``: the processors: capture (resample to 24 kHz pcm16 chunks) and playback
  (a jitter buffer that counts what was played per item);
* ``wire.js``: URLs, base64 and every command the page sends;
* ``video.js``, ``video.css``: the generated-video player (``/v1/realtime/video`` into a
  MediaSource), with a progress indicator until the first chunk; Generate is enabled only when the
  server lists a model that makes video.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

__all__ = ["PAGE_HEADERS", "STATIC_DIR", "web_routes"]

STATIC_DIR = Path(__file__).resolve().parent / "static"

# The page loads only its own files and talks only to its own origin; the browser enforces it, so
# an injected script or a stray external URL fails loudly instead of running. ``ws:``/``wss:`` are
# listed because older browsers do not count the origin's WebSocket scheme as 'self'. The empty
# favicon is a ``data:`` image; the generated-video player plays a MediaSource, a ``blob:`` URL.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "media-src 'self' blob:; connect-src 'self' ws: wss:; object-src 'none'; base-uri 'self'; "
        "form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


async def _index(request: Request) -> Response:
    page = STATIC_DIR / "index.html"
    if not page.is_file():
        return PlainTextResponse("no browser UI in this installation", status_code=404)
    return FileResponse(page, media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)


def web_routes() -> list[BaseRoute]:
    """``/`` and ``/static``: add them to the app's routes."""
    return [
        Route("/", _index),
        Mount("/static", app=StaticFiles(directory=STATIC_DIR, check_dir=False), name="static"),
    ]
