"""PPO's clipped objectives (Schulman et al., 2017), as pure functions.

The trainer ([`jaxil.algorithms.rl.ppo`][jaxil.algorithms.rl.ppo]) computes
log-probabilities, values, advantages and targets; these functions only do the
arithmetic, averaged over every element of their inputs (a minibatch of
`[B, N]` agent-steps, or any other shape).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp


class SurrogateStats(NamedTuple):
    """Diagnostics of
    [`clipped_surrogate_loss`][jaxil.losses.ppo.clipped_surrogate_loss]
    (scalars)."""

    approx_kl: jax.Array  # E[(ρ − 1) − log ρ], the k3 estimator of KL(old ‖ new)
    clip_frac: jax.Array  # fraction of elements with |ρ − 1| > ε


def normalize_advantages(advantages: jax.Array, eps: float = 1e-8) -> jax.Array:
    """`(A − mean A) / (std A + eps)` over all elements (per minibatch)."""
    advantages = jnp.asarray(advantages)
    chex.assert_type(advantages, float)
    return (advantages - advantages.mean()) / (advantages.std() + eps)


def clipped_surrogate_loss(
    log_prob: jax.Array,
    old_log_prob: jax.Array,
    advantages: jax.Array,
    clip_eps: float,
) -> tuple[jax.Array, SurrogateStats]:
    """PPO's clipped policy loss.

        ρ = exp(log π(a|o) − log π_old(a|o)),
        L = −E[min(ρ·A, clip(ρ, 1 − ε, 1 + ε)·A)].

    `old_log_prob` and `advantages` are treated as constants (stop-gradient).

    Args:
      log_prob: `[...]` log-probabilities under the current policy.
      old_log_prob: `[...]` log-probabilities under the behaviour policy.
      advantages: `[...]` advantage estimates (already normalised if wanted).
      clip_eps: ε > 0.

    Returns:
      `(loss, SurrogateStats)`.
    """
    log_prob, old_log_prob = jnp.asarray(log_prob), jnp.asarray(old_log_prob)
    advantages = jnp.asarray(advantages)
    chex.assert_equal_shape([log_prob, old_log_prob, advantages])
    chex.assert_type([log_prob, old_log_prob, advantages], float)
    old_log_prob = jax.lax.stop_gradient(old_log_prob)
    advantages = jax.lax.stop_gradient(advantages)
    log_ratio = log_prob - old_log_prob
    ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    loss = -jnp.mean(jnp.minimum(ratio * advantages, clipped * advantages))
    stats = SurrogateStats(
        approx_kl=jnp.mean((ratio - 1.0) - log_ratio),
        clip_frac=jnp.mean((jnp.abs(ratio - 1.0) > clip_eps).astype(log_prob.dtype)),
    )
    return loss, stats


def clipped_value_loss(
    value: jax.Array,
    old_value: jax.Array,
    target: jax.Array,
    clip_eps: float,
) -> jax.Array:
    """PPO's clipped value loss (as in PureJaxRL / the OpenAI baselines).

        V_clip = V_old + clip(V − V_old, −ε, ε),
        L = ½·E[max((V − G)², (V_clip − G)²)].

    `old_value` and `target` are constants (stop-gradient).

    Args:
      value: `[...]` current value predictions.
      old_value: `[...]` predictions when the data was collected.
      target: `[...]` value targets G (GAE returns).
      clip_eps: ε > 0.

    Returns:
      Scalar loss.
    """
    value, old_value, target = jnp.asarray(value), jnp.asarray(old_value), jnp.asarray(target)
    chex.assert_equal_shape([value, old_value, target])
    chex.assert_type([value, old_value, target], float)
    old_value = jax.lax.stop_gradient(old_value)
    target = jax.lax.stop_gradient(target)
    v_clipped = old_value + jnp.clip(value - old_value, -clip_eps, clip_eps)
    return 0.5 * jnp.mean(jnp.maximum(jnp.square(value - target), jnp.square(v_clipped - target)))
