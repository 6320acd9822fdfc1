"""Preference (Bradley–Terry) loss on learned trajectory returns (O-MAPL).

O-MAPL (ICML 2025; github.com/vietbt/OMAPL, `trainers/omarl.py`) learns an
implicit per-step reward `r_t = Q_tot(s_t, a_t) − γ(1 − d_t)·V̄_tot(s_{t+1})`
and fits it to pairwise preferences with a logistic loss on the difference of
the summed rewards, plus an L2 penalty on the rewards.
"""

from __future__ import annotations

from typing import Optional, Union

import chex
import jax
import jax.numpy as jnp

Scalar = Union[float, jax.Array]


def preference_loss(
    return_x: jax.Array,
    return_y: jax.Array,
    label: jax.Array,
    rewards: jax.Array,
    reg_coef: Scalar = 0.5,
    reward_mask: Optional[jax.Array] = None,
) -> jax.Array:
    """Bradley–Terry cross-entropy plus a reward L2 penalty.

        ℓ_b = R_x,b − R_y,b,   P(x ≻ y) = σ(ℓ_b)
        L   = mean_b BCE(ℓ_b, y_b) + c·mean_{valid}(r²)
        BCE(ℓ, y) = −y·log σ(ℓ) − (1−y)·log(1−σ(ℓ)) = y·softplus(−ℓ) + (1−y)·softplus(ℓ)

    with `R = Σ_t r_t` the learned returns and `c = reg_coef` (0.5 in
    O-MAPL, whose code uses `binary_cross_entropy_with_logits` and
    `0.5 * rewards.pow(2).mean()` over the rewards of both trajectories).
    Soft labels are allowed (e.g. 0.5 for ties).

    Args:
      return_x: `[B]` learned returns of the first trajectories.
      return_y: `[B]` learned returns of the second trajectories.
      label: `[B]` probability that `x` is preferred, in `[0, 1]`.
      rewards: any shape, the per-step rewards entering the penalty.
      reg_coef: weight of the penalty (traced OK).
      reward_mask: optional mask, same shape as `rewards`: the penalty
        averages over the valid (padding-free) steps only.

    Returns:
      Scalar loss.
    """
    return_x, return_y, label, rewards = (jnp.asarray(x) for x in (return_x, return_y, label, rewards))
    chex.assert_rank([return_x, return_y, label], 1)
    chex.assert_equal_shape([return_x, return_y, label])
    chex.assert_type([return_x, return_y, rewards], float)
    logits = return_x - return_y
    y = jnp.asarray(label).astype(logits.dtype)
    bce = y * jax.nn.softplus(-logits) + (1.0 - y) * jax.nn.softplus(logits)
    if reward_mask is None:
        penalty = jnp.mean(jnp.square(rewards))
    else:
        chex.assert_equal_shape([rewards, reward_mask])
        m = jnp.asarray(reward_mask).astype(rewards.dtype)
        penalty = jnp.sum(m * jnp.square(rewards)) / jnp.maximum(jnp.sum(m), 1.0)
    return jnp.mean(bce) + reg_coef * penalty
