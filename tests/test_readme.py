"""The README's Python example runs, as printed.

The example is the README's first ``python`` code block. It runs verbatim in
a fresh working directory: it builds its recipe under ``runs/data/`` and
trains MisoDICE for 2 alphas x 4 seeds, several minutes on a CPU, so the
test is marked slow. A fast test checks that the block is there, at most 20
lines, and names only what the public API exports. Bugs caught: an example
that calls a renamed function or passes a removed keyword (the README would
then teach code that fails), or one that grows past a screen.
"""

from __future__ import annotations

import ast
import os
import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "README.md has no python example"
    return blocks[0]


def test_the_example_is_short_and_uses_the_public_api():
    import jaxil

    code = readme_example()
    assert len(code.strip().splitlines()) <= 20
    names = {node.attr for node in ast.walk(ast.parse(code))
             if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
             and node.value.id == "jaxil"}
    assert names and all(hasattr(jaxil, n) for n in names), names


@pytest.mark.slow
def test_the_example_runs(tmp_path, capsys):
    """Runs the block verbatim; its table has one row per alpha and the
    evaluation of run 0 prints a finite return."""
    script = tmp_path / "example.py"
    script.write_text(readme_example())
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("misodice") for line in out) == 2
    assert float(out[-1]) == float(out[-1])  # finite, not NaN
    assert (tmp_path / "runs" / "example" / "results.json").exists()
