"""Import JaxMARL without the banner it prints on stdout.

``jaxmarl/environments/__init__.py`` (0.2.x) ``print``s "Importing submoduled
environments..." and then "...imported successfully." or "...not found.
Skipping import." on every import, with no flag or environment variable to
turn it off. That lands in the stdout of every jaxil command (and in
``--json`` output piped to another program).

Capturing ``sys.stdout`` alone is not enough: on the way, JaxMARL's
``mabrax_env`` sets ``sys.stdout, sys.stderr = sys.__stdout__,
sys.__stderr__``, so the banner goes to file descriptor 1 whatever
``sys.stdout`` was. :func:`import_jaxmarl` therefore captures both
``sys.stdout`` and descriptor 1 during the import, writes back every line
except the banner's three, and puts ``sys.stdout``/``sys.stderr`` back to what
they were. Nothing is done to stderr output: warnings and errors still show.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
import tempfile

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
    """Point descriptor 1 at a temporary file; append what was written to ``sink``."""
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


def import_jaxmarl() -> None:
    """Import ``jaxmarl`` (and so ``jaxmarl.environments``) without its banner.

    Call it before the first ``from jaxmarl... import``; later calls are free.
    ImportError propagates unchanged.
    """
    if "jaxmarl.environments" in sys.modules:
        return
    text, raw = io.StringIO(), []
    stderr = sys.stderr
    try:
        with _fd1_captured(raw), contextlib.redirect_stdout(text):
            importlib.import_module("jaxmarl")
    finally:
        sys.stderr = stderr  # mabrax_env resets it to sys.__stderr__
        rest = _without_banner(text.getvalue())
        if rest:
            sys.stdout.write(rest)
        rest_raw = _without_banner(b"".join(raw).decode("utf-8", "replace"))
        if rest_raw:
            sys.stdout.flush()
            os.write(1, rest_raw.encode("utf-8"))
