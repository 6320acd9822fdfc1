"""The one scan over updates: K updates of any training state in one `lax.scan`.

Every learner, reward model and interactive student fuses its updates through
[`scan_updates`][jaxil.runs.updates.scan_updates]: each update gets a fresh key
split from the state's `key` (the state keeps the other half), so the sequence
of keys, and with it every batch, depends only on the state.
[`fused_updates`][jaxil.runs.updates.fused_updates] adds what the run engine
needs after a chunk: the last update's metrics and the chunk's
[`jaxil.runs.guard.Health`][jaxil.runs.guard.Health].
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import jax

from jaxil.runs.guard import Health, health

S = TypeVar("S")


def scan_updates(update: Callable[[S, jax.Array], tuple[S, dict]], state: S,
                 k: int) -> tuple[S, dict]:
    """`update(state, key) -> (state, metrics)` applied `k` times in one
    `lax.scan`; returns the new state and every update's metrics `[k]`.

    `state` has a `key` field and a `replace` method (a flax struct);
    before each update `key, sub = split(state.key)`, the state carries
    `key` on and `update` gets `sub` (to sample its batch).
    """
    if k < 1:
        raise ValueError(f"k (updates per call) must be >= 1, got {k}")

    def body(s, _):
        key, sub = jax.random.split(s.key)
        return update(s.replace(key=key), sub)

    return jax.lax.scan(body, state, None, length=k)


def fused_updates(update: Callable[[S, jax.Array], tuple[S, dict]], state: S, k: int,
                  params: Callable[[S], Any] = lambda s: s.params
                  ) -> tuple[S, dict, Health]:
    """[`scan_updates`][jaxil.runs.updates.scan_updates] plus
    `(last update's metrics, Health)`: the first update with a non-finite
    metric and whether `params(state)` is finite after the chunk (the means
    over K would hide divergence)."""
    state, metrics = scan_updates(update, state, k)
    return state, jax.tree.map(lambda m: m[-1], metrics), health(metrics, params(state))
