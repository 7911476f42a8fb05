"""The README and every page under docs/ link only to files and headings that exist.

Relative links and images must resolve to a file of the repository; a `#fragment` must
name a heading of the target page by GitHub's slug rule. Code blocks are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```.*?```", flags=re.S)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def heading_slugs(page: Path) -> set[str]:
    """GitHub's anchors: lower case, punctuation dropped, spaces to dashes, -1, -2 for repeats."""
    slugs: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"#{1,6}\s+(.*)", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        slugs.add(slug if count == 0 else f"{slug}-{count}")
    return slugs


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{page.relative_to(ROOT)}: missing {target}")
        elif fragment and dest.suffix == ".md" and fragment not in heading_slugs(dest):
            broken.append(f"{page.relative_to(ROOT)}: no heading #{fragment} in {path or page.name}")
    return broken


def test_every_relative_link_resolves() -> None:
    assert len(pages()) > 5
    assert [b for page in pages() for b in broken_links(page)] == []


def test_the_readme_opens_with_the_two_commands_and_stays_short() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    opening = text.split("```", 2)[1]
    assert "make serve" in opening and "make test" in opening
    assert len(text.splitlines()) <= 200
