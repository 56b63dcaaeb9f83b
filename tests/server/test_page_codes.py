"""The live page has a sentence for every safe code a run can end with, so a person never
meets the generic fallback for a cause the server names (the page's own Chromium tests check
how each is shown)."""

from __future__ import annotations

import re
from pathlib import Path

from rillet._core._codes import RUN_CODES

PAGE = Path(__file__).resolve().parent.parent.parent / "transports" / "static" / "index.html"


def test_every_run_code_has_a_sentence_on_the_page() -> None:
    text = PAGE.read_text("utf-8")
    table = text.split("const SENTENCES = {", 1)[1].split("};", 1)[0]
    worded = set(re.findall(r"^\s*([a-z_]+):", table, flags=re.M))
    missing = sorted(set(RUN_CODES) - {"completed"} - worded)
    assert missing == []
