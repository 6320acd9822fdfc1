"""Weighted behaviour cloning over a batch of joint actions.

Plain BC (`weights = 1`) is per-agent maximum likelihood; DICE methods
(DemoDICE, Kim et al. 2022; MisoDICE, Bui et al. 2025) and O-MAPL weight each
sample by an importance weight computed elsewhere (`dice_weights`,
`gumbel_weights`). Weights are constants of the policy loss: they are wrapped
in `stop_gradient` here.
"""

from __future__ import annotations

from typing import Optional

import chex
import jax
import jax.numpy as jnp


def _mask_and_count(mask: Optional[jax.Array], batch: int, dtype) -> tuple[jax.Array, jax.Array]:
    if mask is None:
        return jnp.ones((batch,), dtype), jnp.asarray(batch, dtype)
    chex.assert_shape(mask, (batch,))
    m = jnp.asarray(mask).astype(dtype)
    return m, jnp.maximum(jnp.sum(m), 1.0)


def weighted_bc_loss(
    log_probs: jax.Array,
    weights: jax.Array,
    mask: Optional[jax.Array] = None,
) -> jax.Array:
    """Sample-weighted multi-agent BC loss.

        L = − Σ_b m_b · w_b · Σ_i log π_i(a_bi | o_bi) / max(Σ_b m_b, 1)

    (the MisoDICE policy step
    `L_π = −E_{D_U}[ω(s,a)·Σ_i log π_i(a_i|o_i)]`). Plain BC is
    `weights = ones`. Agents are summed, samples averaged over the valid
    (unmasked) ones.

    Args:
      log_probs: `[B, N]` log-probabilities of the data actions per agent.
      weights: `[B]` per-sample weights (treated as constants).
      mask: optional `[B]` validity mask (bool or 0/1); `None` = all valid.

    Returns:
      Scalar loss.
    """
    log_probs, weights = jnp.asarray(log_probs), jnp.asarray(weights)
    chex.assert_rank([log_probs, weights], [2, 1])
    chex.assert_type(log_probs, float)
    chex.assert_equal_shape_prefix([log_probs, weights], 1)
    batch = log_probs.shape[0]
    m, count = _mask_and_count(mask, batch, log_probs.dtype)
    w = jax.lax.stop_gradient(weights).astype(log_probs.dtype)
    return -jnp.sum(m * w * jnp.sum(log_probs, axis=-1)) / count


def agent_weighted_bc_loss(
    log_probs: jax.Array,
    weights: jax.Array,
    mask: Optional[jax.Array] = None,
) -> jax.Array:
    """Agent-weighted multi-agent BC loss (INDD, O-MAPL actor).

        L = − Σ_b m_b · Σ_i w_bi · log π_i(a_bi | o_bi) / max(Σ_b m_b, 1)

    Each agent has its own weight, e.g. its own DemoDICE weight in INDD or
    `exp(z_i)` in the O-MAPL actor loss (whose code takes the mean over
    agents as well; this sums them, matching `weighted_bc_loss` so that
    equal per-agent weights give the same loss). A per-agent mask can be
    folded into `weights`.

    Args:
      log_probs: `[B, N]` log-probabilities of the data actions per agent.
      weights: `[B, N]` per-sample, per-agent weights (treated as constants).
      mask: optional `[B]` validity mask; `None` = all valid.

    Returns:
      Scalar loss.
    """
    log_probs, weights = jnp.asarray(log_probs), jnp.asarray(weights)
    chex.assert_rank([log_probs, weights], 2)
    chex.assert_type(log_probs, float)
    chex.assert_equal_shape([log_probs, weights])
    batch = log_probs.shape[0]
    m, count = _mask_and_count(mask, batch, log_probs.dtype)
    w = jax.lax.stop_gradient(weights).astype(log_probs.dtype)
    return -jnp.sum(m * jnp.sum(w * log_probs, axis=-1)) / count
