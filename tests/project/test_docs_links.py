"""The README stays a README, and no link in it or in docs/ points nowhere.

The README is the front page (what kvsim is, the quick start, the two questions, the
commands); the manual lives in docs/*.md. A page that is moved or renamed, or a heading that
is retitled, must not leave a dead link behind.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import ROOT

MAX_README_LINES = 250
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks (their brackets are code, not links)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#+ (.+)$", _prose(page.read_text(encoding="utf-8")), flags=re.M)
    return {_slug(h) for h in headings}


def _relative_links(page: Path) -> list[str]:
    targets = LINK.findall(_prose(page.read_text(encoding="utf-8")))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # no http:, mailto:


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < MAX_README_LINES, f"README.md has {len(lines)} lines"


def test_the_docs_pages_exist_and_the_readme_links_each():
    readme_links = set(_relative_links(ROOT / "README.md"))
    pages = {p.name for p in PAGES[1:]}
    assert {"architecture.md", "cache-mode.md", "policies.md", "timed-mode.md"} <= pages
    assert {f"docs/{name}" for name in pages} <= {t.split("#")[0] for t in readme_links}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_an_existing_file_and_heading(page):
    links = _relative_links(page)
    dead = []
    for target in links:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        headed = bool(anchor) and file.suffix == ".md"
        if not file.exists() or (headed and anchor not in _anchors(file)):
            dead.append(target)
    assert dead == [], f"{page.relative_to(ROOT)}: dead links {dead}"


def test_the_link_check_sees_dead_links_and_anchors(tmp_path):
    (tmp_path / "a.md").write_text("# A\n## Two words: `code`\n", encoding="utf-8")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#two-words-code) [gone](c.md) [bad](a.md#three) ![img](x.png)\n"
        "```\n[in code](nowhere.md)\n```\n[web](https://example.org)\n",
        encoding="utf-8",
    )
    assert _relative_links(page) == ["a.md#two-words-code", "c.md", "a.md#three", "x.png"]
    assert "two-words-code" in _anchors(tmp_path / "a.md")
