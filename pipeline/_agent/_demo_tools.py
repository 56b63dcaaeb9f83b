"""The demo tools (`rillet run --tools demo`, `rillet serve --tools demo`, `rillet demo`).

Three small tools that show the agent loop without touching anything: `get_weather` and
`get_time` answer deterministically (the same city or zone always gives the same answer, so a
run can be checked), and `delete_file` needs the user's approval and then only pretends.
"""

from __future__ import annotations

import datetime
import hashlib
import zoneinfo

from ._tools import Tool, tool

__all__ = ["DEMO_TOOLS", "TOOLSETS", "demo_tools", "toolset"]

_SKIES = ("sunny", "cloudy", "light rain", "windy", "foggy", "clear")
_KNOWN = {"paris": (18, "light rain"), "tokyo": (24, "clear"), "london": (14, "cloudy")}
_CLOCK = datetime.datetime(2026, 6, 1, 12, 0, tzinfo=datetime.UTC)  # the demo's fixed "now"


def _weather(city: str) -> tuple[int, str]:
    key = " ".join(city.split()).lower()
    if key in _KNOWN:
        return _KNOWN[key]
    digest = hashlib.sha256(key.encode()).digest()
    return 5 + digest[0] % 25, _SKIES[digest[1] % len(_SKIES)]


async def get_weather(city: str) -> str:
    """Current weather for a city (a demo: the same city always gives the same answer).

    Args:
        city: the city's name, e.g. "Paris".
    """
    if not city.strip():
        raise ValueError("city is empty")
    celsius, sky = _weather(city)
    return f"{celsius} °C, {sky} in {city.strip()}"


async def get_time(timezone: str = "UTC") -> str:
    """The local time in an IANA time zone (a demo: the clock is fixed at 2026-06-01 12:00 UTC).

    Args:
        timezone: an IANA zone name, e.g. "Europe/Paris".
    """
    try:
        zone = zoneinfo.ZoneInfo(timezone.strip() or "UTC")
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {timezone!r}") from None
    local = _CLOCK.astimezone(zone)
    return f"{local:%Y-%m-%d %H:%M} ({timezone.strip() or 'UTC'}, UTC{local:%z})"


async def delete_file(path: str) -> str:
    """Delete a file (a demo: nothing is deleted; it needs the user's approval first).

    Args:
        path: the file's path.
    """
    return f"pretended to delete {path} (the demo deletes nothing)"


def demo_tools() -> list[Tool]:
    """The demo tools, freshly made: two that answer at once, one that needs approval."""
    return [
        tool(get_weather, timeout=5.0),
        tool(get_time, timeout=5.0),
        tool(delete_file, needs_approval=True, timeout=5.0),
    ]


DEMO_TOOLS = tuple(t.name for t in demo_tools())
"""The demo tools' names."""

TOOLSETS = ("demo",)
"""The named tool sets the command line and the server offer."""


def toolset(name: str) -> list[Tool]:
    """The tools of a named set; `ValueError` for a name not in `TOOLSETS`."""
    if name == "demo":
        return demo_tools()
    raise ValueError(f"unknown tool set {name!r} (known: {', '.join(TOOLSETS)})")
