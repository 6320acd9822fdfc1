"""Trajectory scores from per-step quantities: discounted sums over valid steps.

A reward model scores a trajectory τ by the discounted sum of its step rewards;
the analytic reward of two policies is the log-likelihood ratio of the actions
taken, summed over steps and agents. Both are pure functions of padded,
batch-major `[B, T, ...]` arrays with a `[B, T]` mask of valid steps
([`envs.rollout.Episodes`][jaxil.envs.rollout.Episodes],
[`jaxil.data.Dataset`][jaxil.data.format.Dataset]).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def discounted_score(values: jax.Array, mask: jax.Array, gamma) -> jax.Array:
    """Masked discounted sum over time.

        S_b = Σ_t γ^t · m_{b,t} · v_{b,t}

    with t the step index from 0 (valid steps are a prefix of each row, so t
    is the step's time in its episode); masked steps contribute 0 even where
    they hold non-finite padding.

    Args:
      values: `[B, T, ...]` per-step values (team `[B, T]` or per agent
        `[B, T, N]`), float.
      mask: `[B, T]` valid steps (bool or 0/1).
      gamma: discount in [0, 1] (a float or a traced scalar).

    Returns:
      `[B, ...]` scores.
    """
    values, mask = jnp.asarray(values), jnp.asarray(mask)
    chex.assert_rank(mask, 2)
    chex.assert_type(values, float)
    chex.assert_equal_shape_prefix([values, mask], 2)
    t = jnp.arange(values.shape[1], dtype=values.dtype)
    disc = jnp.asarray(gamma, values.dtype) ** t  # [T]
    w = disc[None, :] * mask.astype(values.dtype)  # [B, T]
    w = w.reshape(w.shape + (1,) * (values.ndim - 2))
    return jnp.sum(jnp.where(w != 0, values * w, 0.0), axis=1)


def log_ratio_score(logp_num: jax.Array, logp_den: jax.Array, mask: jax.Array) -> jax.Array:
    """Log-likelihood ratio of a trajectory's actions under two policies.

        r_c(τ) = Σ_t Σ_i m_{t,i} [log π_num(a_{t,i}|h_{t,i}) − log π_den(a_{t,i}|h_{t,i})]
               = log π_num(τ) − log π_den(τ)

    (the transition probabilities cancel; AfD's analytic Init–SFT reward with
    `num = π_SFT`, `den = π_0`: Sun & van der Schaar, arXiv 2405.15624).
    A step mask `m_t` counts every agent of a valid step; a per-agent mask
    `m_{t,i}` selects tokens (a token episode's agent-token loss mask,
    [`jaxil.losses.sequence.agent_token_mask`][jaxil.losses.sequence.agent_token_mask]).

    Args:
      logp_num: `[B, T, N]` per-agent log-probabilities under π_num.
      logp_den: `[B, T, N]` under π_den.
      mask: `[B, T]` valid steps, or `[B, T, N]` the agent actions to count.

    Returns:
      `[B]` log-ratios.
    """
    logp_num, logp_den, mask = map(jnp.asarray, (logp_num, logp_den, mask))
    chex.assert_rank([logp_num, logp_den], 3)
    chex.assert_equal_shape([logp_num, logp_den])
    chex.assert_type([logp_num, logp_den], float)
    if mask.ndim == 2:
        chex.assert_equal_shape_prefix([logp_num, mask], 2)
        mask = mask[..., None]
    else:
        chex.assert_equal_shape([logp_num, mask])
    # where, not multiply: padding steps may hold -inf log-probabilities
    diff = jnp.where(jnp.broadcast_to(mask.astype(bool), logp_num.shape), logp_num - logp_den, 0.0)
    return jnp.sum(diff, axis=(1, 2))
