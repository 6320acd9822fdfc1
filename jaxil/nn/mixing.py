"""Linear value decomposition: combine per-agent local values into a team value.

`x_tot(s, ·) = Σ_i w_i(s)·x_i + b(s)` with non-negative weights (from
`jaxil.nn.nets.HyperMixer`). Linear mixing keeps the DICE ν-loss convex in the
local values, and non-negative weights keep the team value monotone in every
local value (MisoDICE, Bui et al. 2025; O-MAPL, ICML 2025). `vdn_mix` is the
special case `w = 1, b = 0` (VDN, Sunehag et al. 2018).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def mix(local: jax.Array, weights: jax.Array, bias: jax.Array) -> jax.Array:
    """Linear mixing `x_tot = Σ_i w_i·x_i + b`.

    Args:
      local: `[..., N]` local values (one per agent).
      weights: `[..., N]` mixing weights (non-negative for monotonicity;
        not enforced here, the mixer network produces them).
      bias: `[...]` state-dependent bias.

    Returns:
      `[...]` team values.
    """
    local, weights, bias = jnp.asarray(local), jnp.asarray(weights), jnp.asarray(bias)
    chex.assert_equal_shape([local, weights])
    chex.assert_rank(local, bias.ndim + 1)
    chex.assert_equal_shape_prefix([local, bias], bias.ndim)
    return jnp.sum(weights * local, axis=-1) + bias


def vdn_mix(local: jax.Array) -> jax.Array:
    """Sum mixing `x_tot = Σ_i x_i` (VDN; MisoDICE-VDN).

    Args:
      local: `[..., N]` local values.

    Returns:
      `[...]` team values.
    """
    local = jnp.asarray(local)
    if local.ndim < 1:
        raise ValueError(f"vdn_mix expects local values [..., N], got a scalar of shape {local.shape}")
    return jnp.sum(local, axis=-1)
