"""Docstrings stay wrapped, in the library and in the repository's
experiments, benchmarks and tests.

A docstring line may pass 88 columns only when it is one word after its
indentation and list marker (a cross-reference link longer than the width),
a Markdown table row, or code (fenced, or indented by four more columns after
a blank line), where line breaks belong to the code. The bug this catches: a
sweeping edit (turning names into `[name][jaxil.path]` links, a rename) that
lengthens lines without reflowing their paragraph, so that the source reads as
a ragged mix of 79- and 140-column lines.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 88
MARKER = re.compile(r"^\s*(?:[-*+]|\d+\.)?\s*")


def overflowing_lines(source: str) -> list[tuple[int, str]]:
    """`(line number, line)` of every docstring line over `LIMIT` columns that
    holds more than one word and is not code."""
    lines = source.split("\n")
    out = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            continue
        fence = code = False
        for k in range(node.lineno - 1, node.end_lineno):
            line = lines[k]
            text = line.strip()
            if text.startswith("```"):
                fence = not fence
                continue
            indented = len(line) - len(line.lstrip()) >= node.col_offset + 4
            code = bool(text) and indented and (code or lines[k - 1].strip() == "")
            if fence or code or text.startswith("|") or len(line) <= LIMIT:
                continue
            if len(MARKER.sub("", line.replace('"""', "")).split()) > 1:
                out.append((k + 1, line))
    return out


def test_overflow_check_flags_a_long_paragraph_line_only():
    """The check itself: a paragraph line over the limit is reported; a lone
    long link, a table row, a fenced line and an indented example are not (a check that
    reported nothing, or everything, would fail here)."""
    link = "[`x`][jaxil." + "a" * 90 + "]"
    source = '\n'.join([
        'def f():',
        '    """Summary.',
        '',
        '    ' + "word " * 20 + "end.",
        '    ' + link,
        '    - ' + link,
        '    | ' + "cell | " * 20,
        '',
        '        jaxil train ' + "--flag value " * 8,
        '',
        '    ```bash',
        '    ' + "code " * 25,
        '    ```',
        '    """',
    ])
    assert [n for n, _ in overflowing_lines(source)] == [4]


def test_docstrings_are_wrapped():
    bad = []
    for folder in ("jaxil", "envs", "experiments", "benchmarks", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for n, line in overflowing_lines(path.read_text()):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:70]}…")
    assert not bad, ("docstring lines over %d columns; reflow their paragraphs:\n" % LIMIT
                     + "\n".join(bad))
