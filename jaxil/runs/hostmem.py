"""Keep freed host memory for the next call of a compiled program (CPU, glibc).

Why. On the CPU backend every call of a compiled program allocates one
temporary buffer for its intermediate values and frees it when the call
returns. For one O-MAPL update at the paper shapes (8 pairs × 70 steps, N = 5,
256-256 networks) that buffer is 90 MB. glibc's `malloc` serves an allocation
that large with a fresh `mmap` (always above 32 MB, and on the worker threads
XLA runs on, above the 64 MB of a thread arena's heap) and `free` hands it back
with `munmap`. So every call starts with about 22,000 page faults: the kernel
maps and zeroes 90 MB before the update can compute. A fused
[`jaxil.algorithms.offline.update_n`][jaxil.algorithms.offline.base.update_n]
pays this once per K updates; a loop that calls one update at a time pays it on
every update (`benchmarks/single_update.py` measures it).

[`retain`][jaxil.runs.hostmem.retain] tells glibc to serve such buffers from
the one main heap and keep what is freed there (`mallopt`: one arena, no
`mmap`, no trimming). The second call then reuses the pages the first one
faulted in. The cost is that the process's resident memory stays at its peak
instead of shrinking after each call.

Call it before JAX's first computation. A thread that has already allocated
keeps its own arena, so a later call cannot reach XLA's running worker threads.
Importing jaxil does not call it (a library should not change its host
process's allocator behind its back); the `jaxil` command calls it at start-up
([`retain_at_startup`][jaxil.runs.hostmem.retain_at_startup]), which
`JAXIL_RETAIN_HOST_MEMORY=0` turns off. Elsewhere than on glibc (macOS, musl)
it does nothing and returns False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import warnings

# mallopt parameters (glibc malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_INT_MAX = 2**31 - 1

ENV = "JAXIL_RETAIN_HOST_MEMORY"

_done = False


def _backends_started() -> bool:
    if "jax" not in sys.modules:  # importing jax here would start jaxlib's threads first
        return False
    try:
        from jax._src import xla_bridge
    except ImportError:  # jax not installed, or moved: nothing to warn about
        return False
    started = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(started()) if started else False


def retain() -> bool:
    """Keep freed host memory in the process (see the module docstring).

    Returns True when glibc took the settings (also on a repeated call),
    False where there is no glibc `mallopt`. Warns when JAX has already
    started, since XLA's worker threads then keep their own arenas.
    """
    global _done
    if _done:
        return True
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "")
        except OSError:
            return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    # Before anything else, jax's import included: a thread that allocates
    # before M_ARENA_MAX is set gets an arena of its own, and XLA may run on it.
    # One arena first, so new threads share the main heap.
    ok = all(mallopt(p, v) == 1 for p, v in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0),
                                               (_M_TRIM_THRESHOLD, _INT_MAX)))
    _done = ok
    if _backends_started():
        warnings.warn("jaxil.runs.hostmem.retain() was called after JAX started: XLA's worker "
                      "threads keep their own arenas; call it before the first computation",
                      stacklevel=2)
    return ok


def retain_at_startup() -> bool:
    """[`retain`][jaxil.runs.hostmem.retain] for a program's entry point:
    skipped (False) where `JAXIL_RETAIN_HOST_MEMORY=0` or jax is already
    imported (a host program, e.g. `jaxil.cli.main.main` called from Python or
    a test runner, keeps its allocator as it is), without a warning."""
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if "jax" in sys.modules:
        return False
    return retain()
