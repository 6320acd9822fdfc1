"""The installed package: ``jaxil.envs`` from the repository's ``envs/``
folder, nothing named ``envs`` at the top level, and the lazy public API.

Plausible bugs these catch: ``envs`` still listed as a top-level package (the
wheel would shadow PyPI's ``envs``, or be shadowed by it); a new sub-package
left out of pyproject.toml's ``packages`` (the wheel would lack it while the
editable install hides the gap); a public name that points at a moved module;
``import jaxil`` importing JAX before the ``jaxil`` command can set up host
memory and multi-process runs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_installed_jaxil_envs_comes_from_the_envs_folder_and_envs_is_not_installed(tmp_path):
    """From a directory other than the checkout (so the repository root is not
    on ``sys.path``): ``jaxil.envs`` is the repository's ``envs/`` folder
    through the install, and ``import envs`` fails."""
    r = _run("import jaxil.envs, jaxil.envs.core; print(jaxil.envs.__file__)", tmp_path)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).resolve() == (ROOT / "envs" / "__init__.py").resolve()
    r = _run("import envs", tmp_path)
    assert r.returncode != 0 and "No module named 'envs'" in r.stderr


def test_the_wheel_holds_jaxil_envs_and_every_package_and_no_top_level_envs(tmp_path):
    """A wheel built from the checkout: its only top-level package is
    ``jaxil``; it holds ``jaxil/envs/`` and every package folder of the
    source tree (with its ``__init__.py``) and the shipped teachers."""
    pytest.importorskip("setuptools")
    src = tmp_path / "src"  # a copy: building writes build/ and egg-info beside the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("jaxil", "envs"):
        shutil.copytree(ROOT / name, src / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(tmp_path), str(src)], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0 and "No module named 'wheel'" in r.stderr + r.stdout:
        pytest.skip("building a wheel needs the `wheel` package")
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = tmp_path.glob("jaxil-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"jaxil"}
    want = {"jaxil/envs/__init__.py", "jaxil/envs/core.py", "jaxil/envs/smax.py"}
    for init in (ROOT / "jaxil").rglob("__init__.py"):
        want.add(init.relative_to(ROOT).as_posix())
    assert want <= set(names), sorted(want - set(names))
    assert any(n.startswith("jaxil/teachers/shipped/") and n.endswith("teacher.json")
               for n in names)


def test_import_jaxil_is_lazy_and_every_public_name_resolves(tmp_path):
    """``import jaxil`` imports neither JAX nor any sub-package; each name in
    ``jaxil.__all__`` then resolves (one subprocess, the import order as a
    user's). Importing the JaxMARL adapters then prints nothing on stdout
    (JaxMARL's import banner would come before the count) and imports none
    of JaxMARL's other environments; a later ``import jaxmarl`` of the
    user's still gets the whole package, with the classes the adapters use
    (bare stand-in packages left in ``sys.modules`` would break it)."""
    code = ("import sys, jaxil\n"
            "assert 'jax' not in sys.modules, 'import jaxil started JAX'\n"
            "assert not [m for m in sys.modules if m.startswith('jaxil.')], sorted(sys.modules)\n"
            "missing = [n for n in jaxil.__all__ if getattr(jaxil, n, None) is None]\n"
            "assert not missing, missing\n"
            "assert jaxil.make_env is jaxil.envs.make\n"
            "import jaxil.envs.smax, jaxil.envs.mpe\n"
            "assert 'jaxmarl.environments.storm' not in sys.modules, 'all of JaxMARL imported'\n"
            "print(len(jaxil.__all__), flush=True)\n"
            "import jaxmarl, jaxmarl.environments.smax as smax\n"
            "from jaxmarl.environments import SMAX, SimpleSpreadMPE\n"
            "from jaxil.envs.mpe import SimpleSpreadMPE as ours\n"
            "assert callable(jaxmarl.make) and SMAX is smax.SMAX and ours is SimpleSpreadMPE\n"
            "print('jaxmarl ok')\n")
    r = _run(code, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    count, _, rest = r.stdout.partition("\n")
    assert count.isdigit() and int(count) > 20, repr(r.stdout[:300])
    assert rest.endswith("jaxmarl ok\n"), repr(rest[-300:])
    r = _run("import jaxil; jaxil.no_such_thing", tmp_path)
    assert "module 'jaxil' has no attribute 'no_such_thing'" in r.stderr
