"""The browser UI's files as the server serves them: the page, every asset it loads, nothing external.

Assets are found the way the browser finds them: ``<script src>`` and ``<link href>`` in the page,
``import ... from "..."`` in modules, and ``new URL("...", import.meta.url)`` (the worklet module)
in scripts, each resolved against the URL of the file that names it.
"""

from __future__ import annotations

import re
from urllib.parse import urljoin, urlparse

import httpx

from duplex.server.webui import PAGE_HEADERS, STATIC_DIR

JS_TYPES = ("text/javascript", "application/javascript")
CSS_TYPES = ("text/css",)

_HTML_REFS = re.compile(r"<(?:script|link)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", re.IGNORECASE)
_JS_REFS = re.compile(
    r"""(?:\bimport\b[^"';]*?\bfrom\s*|\bimport\s*)["']([^"']+)["']"""
    r"""|new\s+URL\(\s*["']([^"']+)["']\s*,\s*import\.meta\.url\s*\)"""
)
_CSS_REFS = re.compile(r"""url\(\s*["']?([^"')]+)""")
_EXTERNAL = re.compile(r"\b(?:https?|wss?)://|(?:src|href)=\"//", re.IGNORECASE)


def without_comments(text: str, kind: str) -> str:
    """``text`` without its comments: ``<!-- -->`` in HTML; ``/* */`` and ``//`` to the end of the
    line in JS (a ``//`` right after a ``:``, as in a URL, is not a comment); ``/* */`` in CSS."""
    if kind == "html":
        return re.sub(r"<!--.*?-->", "", text, flags=re.DOTALL)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
    if kind == "js":
        text = re.sub(r"(^|[^:\\])//.*$", r"\1", text, flags=re.MULTILINE)
    return text


def references(url: str, kind: str, text: str) -> list[str]:
    code = without_comments(text, kind)
    if kind == "html":
        found = _HTML_REFS.findall(code)
    elif kind == "js":
        found = [a or b for a, b in _JS_REFS.findall(code)]
    else:
        found = _CSS_REFS.findall(code)
    return [urljoin(url, ref) for ref in found if not ref.startswith("data:")]


def kind_of(content_type: str) -> str:
    media = content_type.split(";")[0].strip().lower()
    if media in JS_TYPES:
        return "js"
    if media in CSS_TYPES:
        return "css"
    return "html" if media == "text/html" else media


async def crawl(http: httpx.AsyncClient, root: str) -> dict[str, tuple[int, str, str]]:
    """Every URL the page loads, from ``root``: url -> (status, kind, body)."""
    seen: dict[str, tuple[int, str, str]] = {}
    todo = [root]
    while todo:
        url = todo.pop()
        if url in seen:
            continue
        res = await http.get(url)
        kind = kind_of(res.headers.get("content-type", ""))
        seen[url] = (res.status_code, kind, res.text)
        if res.status_code == 200 and kind in ("html", "js", "css"):
            todo.extend(references(url, kind, res.text))
    return seen


async def test_the_page_is_served_at_the_root_as_html(srv):
    async with httpx.AsyncClient() as http:
        res = await http.get(srv.http + "/")
    assert res.status_code == 200
    assert res.headers["content-type"] == "text/html; charset=utf-8"
    assert '<script type="module" src="static/app.js">' in res.text
    assert res.headers["content-security-policy"] == PAGE_HEADERS["Content-Security-Policy"]
    assert res.headers["x-content-type-options"] == "nosniff"


async def test_every_asset_the_page_loads_is_served_as_javascript_or_css(srv):
    async with httpx.AsyncClient() as http:
        loaded = await crawl(http, srv.http + "/")
    assets = {urlparse(u).path: (status, kind) for u, (status, kind, _) in loaded.items()}
    assert assets == {
        "/": (200, "html"),
        "/static/style.css": (200, "css"),
        "/static/app.js": (200, "js"),
        "/static/call.js": (200, "js"),
        "/static/camera.js": (200, "js"),
        "/static/conversation.js": (200, "js"),
        "/static/eventlog.js": (200, "js"),
        "/static/latency.js": (200, "js"),
        "/static/settings.js": (200, "js"),
        "/static/playback.js": (200, "js"),
        "/static/audio.js": (200, "js"),
        "/static/wire.js": (200, "js"),
        "/static/audio-worklet.js": (200, "js"),
        "/static/video.css": (200, "css"),
        "/static/video.js": (200, "js"),
    }


async def test_the_page_needs_no_other_origin(srv):
    async with httpx.AsyncClient() as http:
        loaded = await crawl(http, srv.http + "/")
    assert all(urlparse(u).netloc == urlparse(srv.http).netloc for u in loaded)
    for url, (_, kind, body) in loaded.items():
        assert _EXTERNAL.findall(without_comments(body, kind)) == [], url


async def test_every_file_in_the_static_folder_is_loaded_by_the_page_and_none_is_in_a_subfolder(srv):
    # The package ships ``server/static/*`` (no subfolders), and a file nobody loads is dead weight.
    async with httpx.AsyncClient() as http:
        loaded = await crawl(http, srv.http + "/")
    served = {urlparse(u).path.removeprefix("/static/") for u in loaded} - {"/"}
    on_disk = {p.name for p in STATIC_DIR.iterdir()}
    assert all(p.is_file() for p in STATIC_DIR.iterdir())
    assert on_disk == served | {"index.html"}


def test_comments_are_stripped_but_urls_in_code_are_kept():
    js = 'const a = "http://x"; // see https://y\n/* https://z */ f("wss://w")'
    assert _EXTERNAL.findall(without_comments(js, "js")) == ["http://", "wss://"]
    assert without_comments("<!-- https://a --><p>b</p>", "html") == "<p>b</p>"
