"""Every relative link in the README and the docs points at a file or folder that exists (issue
25: the README linked `libs/games/…/prompts.py`, which does not), and every `#anchor` into a
Markdown file names one of its headings (issue 28: the README's sections moved under docs/, and
the links into them carry anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "deploy").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCED = re.compile(r"^```.*?^```", flags=re.S | re.M)


def relative_targets(path: Path) -> list[str]:
    text = FENCED.sub("", path.read_text())  # code blocks hold no links
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def relative_links(path: Path) -> list[str]:
    return [t.split("#", 1)[0] for t in relative_targets(path) if t.split("#", 1)[0]]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a Markdown file; a repeated one gets -1, -2 … as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCED.sub("", path.read_text()).splitlines():
        if m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_exists(doc):
    missing = [t for t in relative_links(doc) if not (doc.parent / t).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} links files that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_anchor_names_a_heading(doc):
    broken = []
    for target in relative_targets(doc):
        file, _, anchor = target.partition("#")
        into = (doc.parent / file) if file else doc
        if anchor and into.suffix == ".md" and into.is_file() and anchor not in anchors(into):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)} links anchors that name no heading: {broken}"


def test_slug_follows_github():
    assert slug("What is recorded (DuckDB)") == "what-is-recorded-duckdb"
    assert slug("Benchmark: the paper's dummy benchmark, through the whole pipeline") == (
        "benchmark-the-papers-dummy-benchmark-through-the-whole-pipeline")
    assert slug("The demo's model, and a real one (`--model local`)") == "the-demos-model-and-a-real-one---model-local"
