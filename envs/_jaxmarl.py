"""Import JaxMARL without the banner it prints on stdout.

`jaxmarl/environments/__init__.py` (0.2.x) `print`s "Importing submoduled
environments..." and then "...imported successfully." or "...not found.
Skipping import." on every import, with no flag or environment variable to
turn it off. That lands in the stdout of every jaxil command (and in
`--json` output piped to another program).

Capturing `sys.stdout` alone is not enough: on the way, JaxMARL's
`mabrax_env` sets `sys.stdout, sys.stderr = sys.__stdout__,
sys.__stderr__`, so the banner goes to file descriptor 1 whatever
`sys.stdout` was. `import_jaxmarl` therefore captures both
`sys.stdout` and descriptor 1 during the import, writes back every line
except the banner's three, and puts `sys.stdout`/`sys.stderr` back to what
they were. Nothing is done to stderr output: warnings and errors still show.

Importing `jaxmarl` also imports every JaxMARL environment, and some of
them (STORM, JaxNav, Overcooked) build JAX arrays at import time: dozens of
eager compiles, several seconds per process on a CPU, in every `jaxil`
command and every worker that only needs SMAX or MPE.
`import_jaxmarl` therefore loads only the environment packages asked
for (`import_jaxmarl("smax")`; `"mpe.simple_spread"` skips the MPE
package's `__init__`, which imports matplotlib's pyplot for its
visualiser): it stands in for the packages above them with bare package
modules during that import and removes them afterwards, so a later
`import jaxmarl` runs JaxMARL's own `__init__` as usual (reusing the
packages already loaded). If a JaxMARL
release makes a package depend on those `__init__` files, the whole of
`jaxmarl` is imported instead.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import io
import os
import sys
import tempfile
import types

BANNER = frozenset({
    "Importing submoduled environments...",
    "Submoduled environments imported successfully.",
    "Submoduled environments not found. Skipping import.",
})


def _without_banner(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True)
                   if line.rstrip("\r\n") not in BANNER)


@contextlib.contextmanager
def _fd1_captured(sink: list[bytes]):
    """Point descriptor 1 at a temporary file; append what was written to `sink`."""
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1 (a daemon): nothing can reach it anyway
        yield
        return
    with tempfile.TemporaryFile() as f:
        for stream in (sys.stdout, sys.__stdout__):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(f.fileno(), 1)
        try:
            yield
        finally:
            for stream in (sys.stdout, sys.__stdout__):
                with contextlib.suppress(Exception):
                    stream.flush()
            os.dup2(saved, 1)
            os.close(saved)
            f.seek(0)
            sink.append(f.read())


def _bare_package(name: str, path: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [path]
    module.__package__ = name
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__spec__.submodule_search_locations = [path]
    return module


def _import_alone(modules: tuple[str, ...]) -> None:
    """Import `jaxmarl.environments.<m>` for each `m` in `modules`
    without running the `__init__.py` of `jaxmarl`, of
    `jaxmarl.environments` or of any package above an `m`."""
    spec = importlib.util.find_spec("jaxmarl")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'jaxmarl'", name="jaxmarl")
    path = {"jaxmarl": list(spec.submodule_search_locations)[0]}
    bare = {}
    for m in modules:
        parts = ("jaxmarl", "environments", *m.split(".")[:-1])
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if i > 1:
                path[name] = os.path.join(path[".".join(parts[:i - 1])], parts[i - 1])
            if name not in sys.modules and name not in bare:
                bare[name] = _bare_package(name, path[name])
    before = set(sys.modules)
    sys.modules.update(bare)
    try:
        for m in modules:
            importlib.import_module(f"jaxmarl.environments.{m}")
    except BaseException:
        for name in set(sys.modules) - before:  # nothing half-loaded stays behind
            if name.startswith("jaxmarl"):
                del sys.modules[name]
        raise
    finally:
        for name, module in bare.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]


def import_jaxmarl(*packages: str) -> None:
    """Import the JaxMARL modules `packages` (`"smax"`, `"mabrax"`,
    `"mpe.simple_spread"`: `jaxmarl.environments.<name>`, imported by
    their full names afterwards) without the banner and without JaxMARL's
    other environments or the packages above them; with no names, the whole
    of `jaxmarl`.

    Call it before the first `from jaxmarl... import`; later calls are free.
    ImportError (JaxMARL or one of a package's dependencies missing)
    propagates unchanged.
    """
    wanted = tuple(p for p in packages if f"jaxmarl.environments.{p}" not in sys.modules)
    if packages and not wanted or "jaxmarl.environments" in sys.modules:
        return
    text, raw = io.StringIO(), []
    stderr = sys.stderr
    try:
        with _fd1_captured(raw), contextlib.redirect_stdout(text):
            if not wanted:
                importlib.import_module("jaxmarl")
            else:
                try:
                    _import_alone(wanted)
                except ModuleNotFoundError as e:
                    if e.name is not None and e.name.startswith("jaxmarl"):
                        importlib.import_module("jaxmarl")  # a layout this loader does not know
                    else:
                        raise
    finally:
        sys.stderr = stderr  # mabrax_env resets it to sys.__stderr__
        rest = _without_banner(text.getvalue())
        if rest:
            sys.stdout.write(rest)
        rest_raw = _without_banner(b"".join(raw).decode("utf-8", "replace"))
        if rest_raw:
            sys.stdout.flush()
            os.write(1, rest_raw.encode("utf-8"))
