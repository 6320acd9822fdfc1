"""The non-finite guard of every training loop.

A diverging learner (α ≤ −1, a learning rate too high, a NaN in the data)
turns its losses and then its parameters into NaN or inf. Evaluation of such
a policy still "works" (argmax of NaN logits is action 0), so without a
guard a run reports a plausible return and exits 0. The loops check after
every fused chunk of updates:

- [`health`][jaxil.runs.guard.health] (inside jit) from the chunk's stacked
  metrics `[K]` and the new parameters: the index of the first update with a
  non-finite metric, the metrics at that update, and whether the parameters are
  finite;
- [`check`][jaxil.runs.guard.check] (on the host, per run) raises
  [`NonFiniteError`][jaxil.runs.guard.NonFiniteError] naming the learner, the
  run, the update and the quantities. The loop raises before it writes the
  chunk's metrics or checkpoint, so the last good checkpoint is what a run
  directory keeps.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np


class NonFiniteError(ValueError):
    """A loss or parameter became NaN or inf; training stopped."""


class Health(NamedTuple):
    """Per chunk (leaves gain a leading runs axis under `vmap`)."""

    first_bad: jax.Array  # int32: first update (0-based, in the chunk) with a non-finite metric; K if none
    at_bad: dict  # the metrics at that update (at the last one if none)
    params_finite: jax.Array  # bool: every parameter finite after the chunk


def all_finite(tree: Any) -> jax.Array:
    """Whether every leaf of `tree` is finite (a bool scalar)."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
              if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def health(stacked: dict, params: Any) -> Health:
    """`stacked`: metrics of K updates, each `[K]`."""
    ok = jnp.stack([jnp.isfinite(v) for v in jax.tree.leaves(stacked)]).all(axis=0)  # [K]
    k = ok.shape[0]
    first = jnp.where(ok.all(), k, jnp.argmin(ok)).astype(jnp.int32)
    at = jax.tree.map(lambda v: v[jnp.minimum(first, k - 1)], stacked)
    return Health(first, at, all_finite(params))


def check(h: Health, *, learner: str, run_labels: Sequence[str], first_step: int,
          chunk_len: int, step_name: str = "update", kept: str = "") -> None:
    """Raise [`NonFiniteError`][jaxil.runs.guard.NonFiniteError] for the first
    run `h` reports bad.

    `h` holds numpy arrays with a leading runs axis; `run_labels[i]`
    names run `i` (e.g. `"run 3 (seed 1, alpha=-2)"`); `first_step` is
    the number of the chunk's first update (`chunk_len` of them); `kept`
    says what survives (e.g. the last good checkpoint).
    """
    first, params_ok = np.asarray(h.first_bad), np.asarray(h.params_finite)
    for i, label in enumerate(run_labels):
        at = {name: float(np.asarray(v)[i]) for name, v in h.at_bad.items()}
        bad = sorted((n, v) for n, v in at.items() if not np.isfinite(v))
        if bad and first[i] < chunk_len:
            what = ", ".join(f"{n} = {v}" for n, v in bad)
            where = f"{step_name} {first_step + int(first[i])}"
        elif not params_ok[i]:
            what = "the parameters became non-finite"
            where = f"{step_name}s {first_step}-{first_step + chunk_len - 1}"
        else:
            continue
        raise NonFiniteError(
            f"{learner} diverged in {label}: {what} at {where}; training stopped"
            + (f", {kept}" if kept else "")
            + ". Lower the learning rate, or check the hyper-parameters and the data")
