"""The live page as the server sends it: `static/index.html` with its vendored scripts inlined,
a Content-Security-Policy that allows exactly those scripts and styles (by hash), and the icon.

The page names each vendored library as `<script src="vendor/NAME.js"></script>`; the library
is inlined in its place (its source-map comment dropped), so the page needs no second request,
works offline, and the policy can stay `script-src` by hash with nothing loaded from anywhere.
The libraries, their versions and licences are listed in docs/decisions.md ("The page's
markdown").
"""

from __future__ import annotations

import hashlib
import re
from base64 import b64encode
from importlib import resources
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from ._http11 import HttpConnection, Request

__all__ = ["FAVICON", "Page", "load_page"]

_VENDORED = re.compile(r'<script src="vendor/([A-Za-z0-9_.-]+\.js)"></script>')
_SOURCE_MAP = re.compile(r"^//# sourceMappingURL=.*$", flags=re.MULTILINE)

FAVICON = (
    b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">'
    b'<rect width="32" height="32" rx="7" fill="#2a7"/>'
    b'<path d="M5 12c4-4 7 4 11 0s7 4 11 0M5 20c4-4 7 4 11 0s7 4 11 0" fill="none" '
    b'stroke="#fff" stroke-width="3" stroke-linecap="round"/></svg>'
)
"""The page's icon (SVG: a rill on green), served at `/favicon.ico`."""


def _inline(match: re.Match[str]) -> str:
    static = resources.files("rillet.transports").joinpath("static")
    code = static.joinpath("vendor", match.group(1)).read_text(encoding="utf-8")
    code = _SOURCE_MAP.sub("", code).rstrip()
    if "</script" in code.lower() or "<script" in code.lower():
        raise ValueError(f"vendor/{match.group(1)} cannot be inlined: it holds a script tag")
    return f"<script>{code}</script>"


def load_page() -> tuple[bytes, str]:
    """The page, and a Content-Security-Policy that allows its own inline scripts and styles
    (by hash) and nothing else."""
    static = resources.files("rillet.transports").joinpath("static")
    text = _VENDORED.sub(_inline, static.joinpath("index.html").read_text(encoding="utf-8"))
    hashes: dict[str, list[str]] = {"script": [], "style": []}
    for tag in hashes:
        for block in re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL):
            digest = b64encode(hashlib.sha256(block.encode("utf-8")).digest()).decode()
            hashes[tag].append(f"'sha256-{digest}'")
    none = "'none'"
    csp = (
        "default-src 'none'; "
        f"script-src {' '.join(hashes['script']) or none}; "
        f"style-src {' '.join(hashes['style']) or none}; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )
    return text.encode("utf-8"), csp


@attrs.define(eq=False)
class Page:
    """The page's route."""

    _page: tuple[bytes, str] = attrs.field(factory=lambda: load_page())

    async def serve(self, http: HttpConnection, request: Request, _: str) -> None:
        """`GET /` (and `/index.html`)."""
        body, csp = self._page
        headers = [
            ("cache-control", "no-cache"),
            ("content-security-policy", csp),
            ("x-content-type-options", "nosniff"),
            ("referrer-policy", "no-referrer"),
        ]
        await http.respond(
            200,
            body,
            headers,
            content_type="text/html; charset=utf-8",
            head_only=request.method == "HEAD",
        )

    async def favicon(self, http: HttpConnection, request: Request, _: str) -> None:
        """`GET /favicon.ico`: the page's icon."""
        await http.respond(
            200,
            FAVICON,
            [("cache-control", "max-age=86400"), ("x-content-type-options", "nosniff")],
            content_type="image/svg+xml",
            head_only=request.method == "HEAD",
        )
