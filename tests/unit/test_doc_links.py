"""Every relative link in the README and the docs points at a file or folder that exists (issue
25: the README linked `libs/games/…/prompts.py`, which does not)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "deploy").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code blocks hold no links
    return [t.split("#", 1)[0] for t in LINK.findall(text)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#") and t.split("#", 1)[0]]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_exists(doc):
    missing = [t for t in relative_links(doc) if not (doc.parent / t).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} links files that do not exist: {missing}"
