"""The import graph of ``envs`` and ``jaxil``: no cycles, and ``envs`` stands alone.

The graph is read from the source with :mod:`ast`, never by importing, so it
sees every ``import`` statement, including those inside functions (a
function-level import hides a cycle at import time but not the tangle:
``render`` importing ``oracles`` inside a function while ``oracles`` imports
``render`` at the top is still a cycle). Edges:

* ``import a.b.c`` -> ``a.b.c``;
* ``from a.b import c`` -> ``a.b.c`` when ``c`` is a module, else ``a.b``
  (a package's ``__init__``); relative imports are resolved against the
  importing module's package;
* a package's ``__init__`` imports count like any module's.

Parents are not added implicitly (importing ``a.b.c`` runs ``a/__init__``,
but every submodule would then be in a cycle with a package ``__init__`` that
re-exports it). Imports under ``if TYPE_CHECKING:`` are not run and are
skipped; ``importlib.import_module`` calls (the env registry's lazy plugin
load) are not seen.

These tests fail when someone
* adds an import that closes a cycle, e.g. moves a helper back into
  ``jaxil.phase1.oracles`` and has ``jaxil.phase1.render`` import it from there,
  or has ``envs.policies`` import an adapter that imports ``envs.policies``;
* makes ``envs`` depend on ``jaxil``, e.g. a scripted expert in ``envs/``
  raising ``jaxil.data.zoo.ExpertUnavailable`` (``envs`` must work without
  ``jaxil``).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("envs", "jaxil")


def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """``{dotted module name: file}`` of every ``.py`` under the packages."""
    out = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every Import / ImportFrom node, at any depth, except under ``if TYPE_CHECKING``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _from_base(package: str, node: ast.ImportFrom) -> str:
    """The absolute module of ``from <base> import ...`` (relative ones resolved)."""
    base = node.module or ""
    if node.level:
        anchor = package.split(".") if package else []
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    return base


def imported_names(name: str, file: Path) -> list[tuple[str, int]]:
    """``(dotted name, line)`` of everything module ``name`` imports:
    ``import a.b`` gives ``a.b``; ``from a import b`` gives ``a.b``."""
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in _import_nodes(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            out.extend((a.name, node.lineno) for a in node.names)
        else:
            base = _from_base(package, node)
            out.extend((f"{base}.{a.name}" if base else a.name, node.lineno) for a in node.names)
    return out


def _internal(name: str, files) -> Optional[str]:
    """The longest prefix of ``name`` that is one of our modules."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in files:
            return ".".join(parts[:k])
    return None


def import_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, dict[str, int]]:
    """``{module: {module of ours it imports: first line}}``."""
    files = module_files(root, packages)
    graph: dict[str, dict[str, int]] = {m: {} for m in files}
    for mod, f in files.items():
        # ``from X import Y`` names X.Y when Y is a module, else X (``_internal``
        # drops the non-module tail); ``import X.Y`` names X.Y.
        for target, line in imported_names(mod, f):
            dep = _internal(target, files)
            if dep is not None:
                graph[mod][dep] = min(line, graph[mod].get(dep, line))
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> Optional[list[str]]:
    """One import cycle ``[a, b, ..., a]``, or None (iterative DFS)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, iters = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while path:
            nxt = next(iters[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                iters.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                iters.append(iter(sorted(graph[nxt])))
    return None


def _describe(cycle: list[str], graph, files) -> str:
    hops = [f"{a} -> {b} ({files[a].relative_to(ROOT)}:{graph[a][b]})"
            for a, b in zip(cycle, cycle[1:])]
    return "import cycle:\n  " + "\n  ".join(hops)


def test_no_import_cycle():
    graph = import_graph()
    assert {"envs", "envs.core", "jaxil", "jaxil.data.zoo"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, _describe(cycle, graph, module_files(ROOT))


def test_envs_does_not_import_jaxil():
    files = module_files(ROOT)
    bad = [f"{files[m].relative_to(ROOT)}:{line} imports {t}"
           for m in files if m.split(".")[0] == "envs"
           for t, line in imported_names(m, files[m])
           if t == "jaxil" or t.startswith("jaxil.")]
    assert not bad, "envs must not depend on jaxil:\n  " + "\n  ".join(sorted(set(bad)))


def test_the_graph_sees_function_level_and_submodule_imports(tmp_path):
    """The checker itself: a cycle closed by a function-level
    ``from pkg import sub`` and one through a package ``__init__``."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg.b import thing\n")
    (pkg / "a.py").write_text("import os\n\ndef f():\n    from pkg import b\n    return b\n")
    (pkg / "b.py").write_text("from . import a\nthing = 1\n")
    (pkg / "c.py").write_text("from pkg import thing\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    import pkg.c\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.a"] == {"pkg.b": 4}
    assert graph["pkg.b"] == {"pkg.a": 1}
    assert graph["pkg.c"] == {"pkg": 1} and graph["pkg"] == {"pkg.b": 1}
    assert graph["pkg.d"] == {}
    assert find_cycle(graph) == ["pkg.b", "pkg.a", "pkg.b"]
    (pkg / "a.py").write_text("")
    (pkg / "b.py").write_text("import pkg.c\nthing = 1\n")
    assert find_cycle(import_graph(tmp_path, ("pkg",))) == ["pkg", "pkg.b", "pkg.c", "pkg"]
