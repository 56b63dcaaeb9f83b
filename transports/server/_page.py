"""The live page (`GET /`), served with a Content-Security-Policy that allows its own inline
script and style, by hash, and nothing else."""

from __future__ import annotations

import hashlib
import re
from base64 import b64encode
from importlib import resources
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from .._http11 import HttpConnection, Request

__all__ = ["Page", "load_page"]


def load_page() -> tuple[bytes, str]:
    """The page, and a Content-Security-Policy that allows its own inline script and style
    (by hash) and nothing else."""
    page = resources.files("rillet.transports").joinpath("static/index.html").read_bytes()
    text = page.decode("utf-8")
    hashes: dict[str, list[str]] = {"script": [], "style": []}
    for tag in hashes:
        for block in re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL):
            digest = b64encode(hashlib.sha256(block.encode("utf-8")).digest()).decode()
            hashes[tag].append(f"'sha256-{digest}'")
    csp = (
        "default-src 'none'; "
        f"script-src {' '.join(hashes['script']) or chr(39) + 'none' + chr(39)}; "
        f"style-src {' '.join(hashes['style']) or chr(39) + 'none' + chr(39)}; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )
    return page, csp


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
