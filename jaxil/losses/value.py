"""Extreme-value (Gumbel) regression of local values, as in O-MAPL.

O-MAPL (ICML 2025; github.com/vietbt/OMAPL, ``trainers/omarl.py``) fits each
local V_i to the target local Q̄_i through the target mixer weights w̄_i with
Gumbel regression (XQL, Garg et al. 2023): with

    z_i = clip(w̄_i·(Q̄_i − V_i)/β, −c, c),

jaxil minimises ``E[exp(z) − z − 1]`` (the Gumbel / linex loss, ≥ 0 and 0 at
z = 0). The authors write the same objective as

    E[exp(z − m) + exp(−m)·w̄_i·V_i/β],   m = max(sg(max z), −1),

i.e. ``exp(−m)·E[exp(z) + w̄·V/β]``: inside the clip range the two differ only
by terms constant in V (``−w̄·Q̄/β − 1``) and the positive detached scale
``exp(−m)``, so their gradients in V are parallel, ``∇_V L_authors =
exp(−m)·∇_V L``. Outside the clip range, ``exp(z) − z − 1`` is flat (zero
gradient) while the authors' linear term keeps pushing V down by w̄/β.
The authors' scale keeps their loss O(1); jaxil's form is already O(1) near
the optimum and bounded by ``exp(c)`` because z is clipped, and it is
evaluated as ``expm1(z) − z`` to avoid cancellation near z = 0.
"""

from __future__ import annotations

from typing import Optional, Union

import chex
import jax
import jax.numpy as jnp

Scalar = Union[float, jax.Array]


def _gumbel_z(q_target, v, w_target, beta, clip):
    q_target, v, w_target = jnp.asarray(q_target), jnp.asarray(v), jnp.asarray(w_target)
    chex.assert_rank([q_target, v, w_target], 2)
    chex.assert_equal_shape([q_target, v, w_target])
    chex.assert_type([q_target, v, w_target], float)
    q_target = jax.lax.stop_gradient(q_target)
    w_target = jax.lax.stop_gradient(w_target)
    return jnp.clip(w_target * (q_target - v) / beta, -clip, clip)


def gumbel_value_loss(
    q_target: jax.Array,
    v: jax.Array,
    w_target: jax.Array,
    beta: Scalar,
    clip: Scalar = 10.0,
    mask: Optional[jax.Array] = None,
) -> jax.Array:
    """O-MAPL local value loss (Gumbel regression through the mixer weights).

        z_bi = clip(w̄_bi·(Q̄_bi − V_bi)/β, −clip, clip)
        L    = Σ_b m_b·mean_i[exp(z_bi) − z_bi − 1] / max(Σ_b m_b, 1)

    Equal, up to terms constant in V and a positive detached scale, to the
    authors' ``mean[exp(z − max z) + exp(−max z)·w̄·V/β]`` inside the clip
    range (see the module docstring). ``Q̄`` and ``w̄`` come from target
    networks and are wrapped in ``stop_gradient``; only ``V`` is trained.
    Unclipped, the minimiser satisfies ``E[w̄·(exp(z) − 1) | o_i] = 0``; for a
    fixed w̄ that is ``V = (β/w̄)·log E[exp(w̄·Q̄/β)]``, a soft maximum of Q̄
    (temperature β/w̄), not its mean.

    Args:
      q_target: ``[B, N]`` target local Q-values Q̄_i(o_i, a_i) of the data
        actions.
      v: ``[B, N]`` local values V_i(o_i).
      w_target: ``[B, N]`` target mixer weights w̄_i(s) ≥ 0.
      beta: temperature β > 0 (``alpha`` = 10 in the O-MAPL code; traced OK).
      clip: bound on |z|.
      mask: optional ``[B]`` validity mask (padding steps of a segment);
        ``None`` = all valid.

    Returns:
      Scalar loss (≥ 0).
    """
    z = _gumbel_z(q_target, v, w_target, beta, clip)
    per_sample = jnp.mean(jnp.expm1(z) - z, axis=-1)
    if mask is None:
        return jnp.mean(per_sample)
    chex.assert_shape(mask, per_sample.shape)
    m = jnp.asarray(mask).astype(per_sample.dtype)
    return jnp.sum(m * per_sample) / jnp.maximum(jnp.sum(m), 1.0)


def gumbel_weights(
    q_target: jax.Array,
    v: jax.Array,
    w_target: jax.Array,
    beta: Scalar,
    clip: Scalar = 10.0,
) -> jax.Array:
    """O-MAPL actor weights ``exp(z)``, constants for autodiff.

        ω_bi = exp(clip(w̄_bi·(Q̄_bi − V_bi)/β, −clip, clip))

    Used with ``agent_weighted_bc_loss`` (O-MAPL actor:
    ``−mean[exp(z)·log π_i(a_i|o_i)]``). Bounded by ``exp(clip)``.

    Args:
      q_target: ``[B, N]`` target local Q-values.
      v: ``[B, N]`` local values.
      w_target: ``[B, N]`` target mixer weights.
      beta: temperature β > 0 (traced OK).
      clip: bound on |z|.

    Returns:
      ``[B, N]`` non-negative weights under ``stop_gradient``.
    """
    z = _gumbel_z(q_target, v, w_target, beta, clip)
    return jax.lax.stop_gradient(jnp.exp(z))
