"""The import graph of ``jaxil``: no cycles, one direction between layers,
no hidden function-local imports, and ``jaxil.envs`` stands alone.

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
  ``jaxil.algorithms.labelling.oracles`` and has
  ``jaxil.algorithms.labelling.render`` import it from there, or has
  ``envs.policies`` import an adapter that imports ``envs.policies``;
* makes ``envs`` depend on ``jaxil``, e.g. a scripted expert in ``envs/``
  raising ``jaxil.collect.zoo.ExpertUnavailable`` (``envs`` must work without
  ``jaxil``).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
# folder -> the package it is installed as (pyproject.toml's package-dir).
PACKAGES = {"envs": "jaxil.envs", "jaxil": "jaxil"}

# The layers, lowest first: a module may import its own layer and the layers
# before it, never one after it. ``jaxil`` itself (the public API) is above all.
LAYERS = (
    "jaxil.envs",                    # environments; imports nothing else of jaxil
    "jaxil.losses",                  # pure maths
    "jaxil.pretrained",              # checkpoint I/O: configs, parameter tables, tokenizers (numpy)
    "jaxil.nn",                      # networks, distributions, the policy, mixing
    "jaxil.lm",                      # a pretrained language model in one call (jaxil.lm.load)
    "jaxil.runs",                    # the engine: run directories, guard, checkpoints, loggers
    "jaxil.data",                    # the dataset format, sampling, preferences, interchange
    "jaxil.algorithms.offline",      # BC, INDD, MisoDICE, O-MAPL learners (programs)
    "jaxil.algorithms.rl",           # PPO
    "jaxil.algorithms.labelling",    # Phase 1
    "jaxil.algorithms.interactive",  # DAgger, OEC, on-policy rejection sampling
    "jaxil.algorithms.irl",          # reward models, best-of-N, GAIL/AIRL, PPO on a learned reward
    "jaxil.algorithms.lm",           # SFT of transformer policies on token episodes
    "jaxil.algorithms",              # the package itself, above its sub-packages
    "jaxil.teachers",                # shipped teachers, presets, the teacher driver
    "jaxil.collect",                 # source policies and dataset recipes
    "jaxil.cli",                     # the command line
)

# Function-local imports of jaxil modules outside the CLI, each with the
# reason it must stay lazy: ``module -> {imported module: reason}``.
LAZY_IMPORTS: dict[str, dict[str, str]] = {}


def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """``{dotted module name: file}`` of every ``.py`` under the packages
    (named as installed: ``envs/core.py`` is ``jaxil.envs.core``)."""
    if not isinstance(packages, dict):
        packages = {p: p for p in packages}
    out = {}
    for folder, pkg in packages.items():
        for f in sorted((root / folder).rglob("*.py")):
            parts = list(f.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([pkg] + parts)] = f
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every Import / ImportFrom node, at any depth, except under
    ``if TYPE_CHECKING``."""
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
    assert {"jaxil.envs", "jaxil.envs.core", "jaxil", "jaxil.collect.zoo"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, _describe(cycle, graph, module_files(ROOT))


def test_envs_does_not_import_jaxil():
    files = module_files(ROOT)
    bad = [f"{files[m].relative_to(ROOT)}:{line} imports {t}"
           for m in files if _layer(m) == 0
           for t, line in imported_names(m, files[m])
           if (t == "jaxil" or t.startswith("jaxil.")) and _layer(t) != 0]
    assert not bad, "jaxil.envs must not depend on the rest of jaxil:\n  " + "\n  ".join(
        sorted(set(bad)))


def _layer(module: str) -> int:
    """The index of ``module``'s layer in :data:`LAYERS` (``jaxil`` itself: the top)."""
    best = None
    for i, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(LAYERS[best]):
                best = i
    if best is None:
        assert module == "jaxil", f"{module} belongs to no layer: add its package to LAYERS"
        return len(LAYERS)
    return best


def upward_imports(graph: dict[str, dict[str, int]], files, root: Path = ROOT) -> list[str]:
    """``file:line module -> module`` for every import of a higher layer."""
    return [f"{files[m].relative_to(root)}:{line} {m} -> {dep}"
            for m, deps in graph.items() for dep, line in deps.items()
            if _layer(dep) > _layer(m)]


def test_every_module_is_in_a_layer_and_no_import_points_up():
    """Fails when a lower layer reaches up, e.g. ``jaxil.data`` importing the
    dataset recipes of ``jaxil.collect`` or an algorithm importing the CLI's
    flag parsers; and when a new package is added without a place in LAYERS."""
    graph = import_graph()
    files = module_files(ROOT)
    for m in graph:
        _layer(m)
    bad = upward_imports(graph, files)
    assert not bad, "imports that point up the layers:\n  " + "\n  ".join(sorted(bad))


def local_imports(files) -> list[tuple[str, str, int]]:
    """``(module, imported jaxil module, line)`` for each import inside a
    function body."""
    out = []
    for mod, f in files.items():
        package = mod if f.name == "__init__.py" else mod.rpartition(".")[0]
        tree = ast.parse(f.read_text(), str(f))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = _from_base(package, node)
                    names = [f"{base}.{a.name}" for a in node.names]
                else:
                    continue
                for n in names:
                    dep = _internal(n, files)
                    if dep is not None:
                        out.append((mod, dep, node.lineno))
    return sorted(set(out))


def test_no_function_local_import_outside_the_cli():
    """Fails when a module hides a dependency in a function body (how the
    upward and circular imports of the flat package were hidden); the CLI may
    import lazily for its start-up time, and :data:`LAZY_IMPORTS` lists the
    others with their reason."""
    files = module_files(ROOT)
    bad = [f"{files[m].relative_to(ROOT)}:{line} imports {dep} inside a function"
           for m, dep, line in local_imports(files)
           if _layer(m) != LAYERS.index("jaxil.cli") and dep not in LAZY_IMPORTS.get(m, {})]
    assert not bad, "function-local jaxil imports:\n  " + "\n  ".join(bad)


def test_the_layer_checks_catch_an_upward_and_a_local_import(tmp_path):
    """The checkers themselves, on a small tree: ``data`` importing ``cli`` at
    the top and ``runs`` importing ``nn`` inside a function."""
    root = tmp_path / "jaxil"
    for sub in ("data", "cli", "nn", "runs"):
        (root / sub).mkdir(parents=True)
        (root / sub / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "cli" / "args.py").write_text("x = 1\n")
    (root / "runs" / "guard.py").write_text("def f():\n    from jaxil.nn import net\n")
    (root / "data" / "fmt.py").write_text("from jaxil.cli.args import x\n")
    (root / "nn" / "net.py").write_text("y = 1\n")
    files = module_files(tmp_path, {"jaxil": "jaxil"})
    graph = import_graph(tmp_path, {"jaxil": "jaxil"})
    assert upward_imports(graph, files, tmp_path) == [
        "jaxil/data/fmt.py:1 jaxil.data.fmt -> jaxil.cli.args"]
    assert local_imports(files) == [("jaxil.runs.guard", "jaxil.nn.net", 2)]


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
    graph = import_graph(tmp_path, {"pkg": "pkg"})
    assert graph["pkg.a"] == {"pkg.b": 4}
    assert graph["pkg.b"] == {"pkg.a": 1}
    assert graph["pkg.c"] == {"pkg": 1} and graph["pkg"] == {"pkg.b": 1}
    assert graph["pkg.d"] == {}
    assert find_cycle(graph) == ["pkg.b", "pkg.a", "pkg.b"]
    (pkg / "a.py").write_text("")
    (pkg / "b.py").write_text("import pkg.c\nthing = 1\n")
    assert find_cycle(import_graph(tmp_path, {"pkg": "pkg"})) == ["pkg", "pkg.b", "pkg.c", "pkg"]


# ----------------------------------------------------------------------- tests
TESTS = ROOT / "tests"
# Test folders that are not a package of the library.
TEST_ONLY = {"helpers", "benchmarks", "experiments"}


def _test_folder_package(folder: Path) -> Optional[str]:
    """The library package a test folder mirrors (``tests/algorithms/irl``
    -> ``jaxil.algorithms.irl``, ``tests/envs`` -> ``jaxil.envs``), or None."""
    parts = folder.relative_to(TESTS).parts
    name = "jaxil." + ".".join(parts)
    source = ROOT / "envs" if parts[0] == "envs" else ROOT / "jaxil" / Path(*parts)
    return name if (source / "__init__.py").exists() else None


def _imported_top_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_test_tree_mirrors_the_package_and_no_test_imports_another():
    """Every test module sits in the folder of the package it tests (or at
    the top for package-wide checks, or under ``benchmarks``/``experiments``
    for the scripts), and imports shared code only from ``helpers``. Fails
    when a test lands in a folder that names no package, or imports another
    test module (``from test_teachers import ...``) for its data or its side
    effects."""
    local = {p.stem for p in TESTS.rglob("*.py")} - {"conftest"}
    for path in TESTS.rglob("test_*.py"):
        folder = path.parent
        if folder != TESTS and folder.relative_to(TESTS).parts[0] not in TEST_ONLY:
            assert _test_folder_package(folder), f"{path}: no package {folder.name} to mirror"
        for name in _imported_top_names(path):
            top = name.split(".")[0]
            assert not (top in local and top != "helpers"), (
                f"{path.relative_to(ROOT)} imports the test module {name}; move what it "
                "shares into tests/helpers/")
