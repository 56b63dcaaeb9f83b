"""An httpx transport that reports each request's answer: how a host counts its provider
requests by status (the server's metrics) without giving up the short way to the pool
(`PoolPath` sees through it and reports the same way)."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import httpx

__all__ = ["ObservedTransport"]


@attrs.define(eq=False)
class ObservedTransport(httpx.AsyncBaseTransport):
    """Sends through `inner` and calls `observe(url, status)` for each request once its
    answer's head came (`status` None when none did: the request failed).

    Args:
        inner: the transport that sends (an `httpx.AsyncHTTPTransport` keeps the short way).
        observe: called on the request's task; keep it quick.
    """

    inner: httpx.AsyncBaseTransport
    observe: Callable[[str, int | None], object]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request` through the inner transport and report it."""
        try:
            response = await self.inner.handle_async_request(request)
        except BaseException:
            self.observe(str(request.url), None)
            raise
        self.observe(str(request.url), response.status_code)
        return response

    async def aclose(self) -> None:
        """Close the inner transport."""
        await self.inner.aclose()
