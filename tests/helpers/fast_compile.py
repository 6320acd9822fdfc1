"""Compile test programs with XLA's backend optimisation level 0.

Compilation dominates most tests on a 2-core CPU; level 0 roughly halves it
and the programs run somewhat slower, which does not matter at test sizes.
Use it where a test's claim does not depend on how XLA optimises (shapes,
determinism, equalities within one program, learning at small sizes); the
numbers differ from the default level in the last bits, not more.
(test_teachers.py passes FAST_COMPILE to the teacher driver too.)
"""

from __future__ import annotations

import jax

FAST_COMPILE = {"xla_backend_optimization_level": 0}


def fast_compile(fn, *args, **jit_kwargs):
    """``jax.jit(fn, **jit_kwargs)`` lowered for ``args`` and compiled with
    FAST_COMPILE; call the result with arguments of the same shapes."""
    return jax.jit(fn, **jit_kwargs).lower(*args).compile(FAST_COMPILE)


def fast_call(fn, *args):
    """``jax.jit(fn)(*args)``, compiled with FAST_COMPILE."""
    return fast_compile(fn, *args)(*args)
