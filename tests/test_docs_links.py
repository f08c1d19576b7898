"""Every relative link and image in README.md and docs/*.md resolves.

A link to a file must name a file or directory that exists; a link with an
``#anchor`` into a Markdown page must name one of that page's headings, by
GitHub's slug rules. Links with a scheme (https:, mailto:) are not followed.
No database, no network: the pages are read from the working tree.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Fenced code blocks (``` or ~~~, possibly indented) hold no links or headings.
FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,}).*?^[ \t]*\1[ \t]*$", re.MULTILINE | re.DOTALL)
# A code span, on one line or across lines of one paragraph.
CODE_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
# [text](target "title") and ![alt](target); the text may hold one level of [].
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)"
)
# [label]: target, a reference definition.
REFERENCE = re.compile(r"^[ ]{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.MULTILINE)
HTML_TARGET = re.compile(r"<(?:a|img)\b[^>]*?\s(?:href|src)=\"([^\"]+)\"", re.IGNORECASE)
HTML_ANCHOR = re.compile(r"<a\b[^>]*?\s(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
HEADING = re.compile(r"^[ ]{0,3}#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$", re.MULTILINE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def without_code(text: str) -> str:
    """The page with its fenced blocks removed and its code spans emptied
    (a span keeps its place, so a link whose text is code still matches)."""
    text = FENCE.sub("", text)
    return CODE_SPAN.sub(lambda match: "code", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text as rendered (code spans and
    link texts kept, markup dropped), lower-cased, every character but
    letters, digits, spaces, hyphens and underscores dropped, each space
    turned into a hyphen."""
    text = CODE_SPAN.sub(lambda match: match.group(2).strip(), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.lower()
    text = "".join(char for char in text if char.isalnum() or char in " -_")
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a page offers: its headings' slugs (a repeated one gets
    -1, -2, … as on GitHub) and any HTML name or id."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    seen: Counter[str] = Counter()
    found = set()
    for match in HEADING.finditer(text):
        base = slug(match.group(1))
        found.add(f"{base}-{seen[base]}" if seen[base] else base)
        seen[base] += 1
    found.update(HTML_ANCHOR.findall(text))
    return found


def targets(page: Path) -> list[str]:
    """Every link target written on the page, in order."""
    text = without_code(page.read_text(encoding="utf-8"))
    found = [match.group(1) for match in INLINE_LINK.finditer(text)]
    found += REFERENCE.findall(text)
    found += HTML_TARGET.findall(text)
    return [target.strip("<>") for target in found]


def broken_links(page: Path) -> list[str]:
    """What is wrong with the page's relative links, one line per link."""
    problems = []
    for target in targets(page):
        if SCHEME.match(target) or target.startswith("//"):
            continue
        path_part, _, anchor = target.partition("#")
        path_part = unquote(path_part.split("?", 1)[0])
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            problems.append(f"{page.name}: {target}: no such file {linked}")
            continue
        if anchor and linked.suffix == ".md" and unquote(anchor) not in anchors(linked):
            problems.append(f"{page.name}: {target}: no heading '#{anchor}' in {linked.name}")
    return problems


def test_the_readme_and_the_docs_pages_are_found() -> None:
    assert (ROOT / "README.md") in PAGES
    assert len(PAGES) > 1


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    problems = broken_links(page)
    assert not problems, "\n".join(problems)


def test_a_slug_follows_githubs_rules() -> None:
    assert slug("What `make run` starts") == "what-make-run-starts"
    assert slug("`console/`: what an operator touches") == "console-what-an-operator-touches"
    assert slug("Topics, subscriptions and max messages") == "topics-subscriptions-and-max-messages"
    assert slug("Where messages live: the hot table") == "where-messages-live-the-hot-table"
    assert slug("The [REST API](api.md) — in short") == "the-rest-api--in-short"


def test_it_reports_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[fine](other.md#a-section), [the repeat](other.md#a-section-1), [here](#page),\n"
        "![missing image](img/none.png), [missing heading](other.md#no-such-section),\n"
        "[off site](https://example.com/x.md) and `[in code](nowhere.md)`.\n\n"
        "```\n[in a block](nowhere.md)\n```\n"
    )
    assert broken_links(page) == [
        f"page.md: img/none.png: no such file {tmp_path / 'img' / 'none.png'}",
        "page.md: other.md#no-such-section: no heading '#no-such-section' in other.md",
    ]
