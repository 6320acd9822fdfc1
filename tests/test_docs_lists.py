"""Nested lists on the docs pages and the README render nested.

Python-Markdown (the site's renderer) nests a list item only when it is
indented by four spaces per level; an item indented by two or three spaces
joins its parent's paragraph, so a page's sub-items run together into one
line of text while ``mkdocs build --strict`` stays silent. Two checks:

- every list item in the source, and every paragraph after a blank line
  (a list item's second paragraph), is indented by a multiple of four
  spaces (fenced code blocks are skipped);
- each page rendered with the site's own markdown extensions (read from
  ``mkdocs.yml``) has as many list items as its source, as many nested
  inside another item as its source has indented items, and no display
  formula left half-parsed as ``$\\(…\\)$`` (what a ``$$`` formula inside
  a paragraph becomes).
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
ITEM = re.compile(r"^( *)(?:[-*+]|\d+[.)]) +\S")
FENCE = re.compile(r"^ *(`{3,}|~{3,})")
# a `$$…$$` display formula inside a paragraph renders as `$` + inline maths + `$`
HALF_FORMULA = re.compile(r'\$\s*<span class="arithmatex">|</span>\s*\$')


def prose_lines(text: str):
    """``(line number, line)`` of every line outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
            fence = None
        elif fence is None:
            yield n, line


def list_items(text: str) -> list[tuple[int, int]]:
    """``(line number, indentation)`` of every list item outside code.

    A line that looks like an item but continues a paragraph outside a list
    (a wrapped line that starts with ``1200.``) is text: Python-Markdown
    starts a list only after a blank line."""
    items, in_list, prev_blank = [], False, True
    for n, line in prose_lines(text):
        m = ITEM.match(line)
        if m and (prev_blank or in_list):
            items.append((n, len(m.group(1))))
            in_list = True
        elif line.strip() and prev_blank and not line.startswith(" "):
            in_list = False
        prev_blank = not line.strip()
    return items


def misindented(text: str) -> list[str]:
    """Lines whose indentation the site's renderer misreads: a list item
    indented by other than a multiple of four spaces, and a paragraph after
    a blank line (a list item's second paragraph) likewise."""
    bad, blank = [], True
    for n, line in prose_lines(text):
        d = len(line) - len(line.lstrip(" "))
        if line.strip() and d % 4 and (ITEM.match(line) or blank):
            bad.append(f"{n}: {'list item' if ITEM.match(line) else 'paragraph'} indented {d}")
        blank = not line.strip()
    return bad


class _Depth(HTMLParser):
    """Counts ``<li>`` elements, and those that sit inside another ``<li>``."""

    def __init__(self):
        super().__init__()
        self.depth = 0
        self.items = 0
        self.nested = 0

    def handle_starttag(self, tag, attrs):
        if tag == "li":
            self.items += 1
            self.nested += self.depth > 0
            self.depth += 1

    def handle_endtag(self, tag):
        if tag == "li":
            self.depth -= 1


def render(text: str) -> str:
    """The page as the site renders it (its markdown extensions and their
    settings from ``mkdocs.yml``)."""
    import markdown
    from mkdocs.config import load_config

    cfg = load_config(str(ROOT / "mkdocs.yml"))
    return markdown.markdown(text, extensions=cfg["markdown_extensions"],
                             extension_configs=cfg["mdx_configs"])


def _name(p: Path) -> str:
    return str(p.relative_to(ROOT))


def test_the_checker_sees_a_two_space_sub_item():
    """The checks themselves: a 2-space sub-item is found by the source
    check and renders flat (no nested ``<li>``), a 4-space one renders
    nested. Bug caught: a checker that skips every item (a wrong regular
    expression, code-fence tracking that never closes) passes every page."""
    bad = "1. first\n   - sub one\n   - sub two\n2. second\n"
    good = bad.replace("   - ", "    - ")
    assert [d for _, d in list_items(bad)] == [0, 3, 3, 0]
    assert misindented(bad) == ["2: list item indented 3", "3: list item indented 3"]
    assert misindented(good) == []
    assert misindented("- item\n  wrapped\n\n  second paragraph\n") == [
        "4: paragraph indented 2"]
    assert [d for _, d in list_items("```\n  - code\n```\n- a\n")] == [0]
    assert list_items("text wrapped at\n1200. More text\n") == []
    flat, nested = _Depth(), _Depth()
    flat.feed(render(bad))
    nested.feed(render(good))
    assert (flat.nested, nested.nested) == (0, 2)
    joined = _Depth()
    joined.feed(render("1. one\n\n    more of one\n2. two\n"))
    assert joined.items == 1  # what the item count catches
    assert HALF_FORMULA.search(render("- the loss\n  $$x = 1$$\n  for all x\n"))
    assert not HALF_FORMULA.search(render("- the loss\n\n    $$x = 1$$\n\n    for all x\n"))


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_nested_items_are_indented_by_four(page):
    """Bug caught: a sub-item indented by two or three spaces (the
    CommonMark habit), which the site renders as part of its parent's
    paragraph, and an item's second paragraph indented by two, which ends
    the list."""
    bad = [f"{_name(page)}:{b}" for b in misindented(page.read_text())]
    assert not bad, "indent nested list content by multiples of 4 spaces:\n" + "\n".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_the_rendered_page_nests_what_the_source_nests(page):
    """Bugs caught: an indented sub-item that the renderer does not nest;
    items that run together into one paragraph (an item that follows an
    item's second paragraph with no blank line); a display formula
    rendered as ``$\\(…\\)$``."""
    text = page.read_text()
    html = render(text)
    depth = _Depth()
    depth.feed(html)
    items = list_items(text)
    indented = sum(d > 0 for _, d in items)
    assert depth.items == len(items), (
        f"{_name(page)}: {len(items)} list items in the source, {depth.items} rendered "
        f"(an item right after an item's second paragraph, with no blank line, joins it)")
    assert depth.nested == indented, (
        f"{_name(page)}: {indented} indented list items in the source, "
        f"{depth.nested} rendered nested")
    assert not HALF_FORMULA.search(html), f"{_name(page)}: a $$ formula inside a paragraph"
