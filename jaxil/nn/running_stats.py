"""Running mean and variance of observations, and the normalisation by them.

PPO on MuJoCo-style robots (PureJaxRL's brax runs, brax's own trainer,
CleanRL, Stable-Baselines3's `VecNormalize`) standardises each observation
feature by its running mean and variance over every observation seen in
training, then clips to `±clip`. The statistics are a pytree of arrays
(`RunningStats`) so that they live inside a policy's parameters: a saved
teacher then acts on raw observations like any other policy.

The merge is Chan et al.'s parallel variance update (the batch's mean and
population variance folded into the running ones), as in Gym's
`RunningMeanStd`, which starts from mean 0, variance 1 and a count of 1e-4
so that the first batch sets the statistics almost exactly:

    δ = μ_B − μ,  n' = n + n_B,  μ' = μ + δ n_B / n',
    σ'² = (σ² n + σ_B² n_B + δ² n n_B / n') / n'.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

#: The starting count (Gym's `RunningMeanStd(epsilon=1e-4)`).
INIT_COUNT = 1e-4
#: Added to the variance under the square root.
VAR_EPS = 1e-8


class RunningStats(NamedTuple):
    """Per-feature running statistics of a vector input."""

    mean: jax.Array  # [D]
    var: jax.Array  # [D], population variance
    count: jax.Array  # [] float32, observations merged (plus INIT_COUNT)


def init(dim: int) -> RunningStats:
    """Statistics that leave inputs unchanged until the first update."""
    return RunningStats(jnp.zeros((dim,), jnp.float32), jnp.ones((dim,), jnp.float32),
                        jnp.asarray(INIT_COUNT, jnp.float32))


def update(stats: RunningStats, x: jax.Array, weight: jax.Array | None = None) -> RunningStats:
    """Fold the rows of `x [..., D]` (every leading axis is a batch axis)
    into `stats`. `weight [...]` (optional, ≥ 0) counts each row that many
    times; rows of weight 0 (padding) leave no trace, and a batch of total
    weight 0 leaves `stats` as they are."""
    chex.assert_rank(stats.mean, 1)
    if x.shape[-1] != stats.mean.shape[0]:
        raise ValueError(f"running_stats.update: x has {x.shape[-1]} features, the statistics "
                         f"{stats.mean.shape[0]}")
    rows = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
    if weight is None:
        w = jnp.ones((rows.shape[0],), jnp.float32)
    else:
        if weight.shape != x.shape[:-1]:
            raise ValueError(f"running_stats.update: weight has shape {weight.shape}, "
                             f"expected x's leading shape {x.shape[:-1]}")
        w = weight.reshape(-1).astype(jnp.float32)
    n_b = w.sum()
    safe = jnp.maximum(n_b, 1e-12)
    mean_b = (w[:, None] * rows).sum(0) / safe
    var_b = (w[:, None] * (rows - mean_b) ** 2).sum(0) / safe
    delta = mean_b - stats.mean
    total = stats.count + n_b
    mean = stats.mean + delta * n_b / total
    m2 = stats.var * stats.count + var_b * n_b + delta ** 2 * stats.count * n_b / total
    return RunningStats(mean, m2 / total, total)


def normalize(stats: RunningStats, x: jax.Array, clip: float = 10.0) -> jax.Array:
    """`clip((x − μ) / √(σ² + 1e-8), −clip, clip)` per feature of `x [..., D]`.
    No gradient reaches the statistics: they are estimated, not trained."""
    s = jax.lax.stop_gradient(stats)
    chex.assert_shape(s.mean, (x.shape[-1],))
    return jnp.clip((x - s.mean) / jnp.sqrt(s.var + VAR_EPS), -clip, clip)
