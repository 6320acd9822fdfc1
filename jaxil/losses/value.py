"""Extreme-value (Gumbel) regression of local values, as in O-MAPL.

O-MAPL (ICML 2025; github.com/vietbt/OMAPL, `trainers/omarl.py`) fits each
local V_i to the target local Q̄_i through the target mixer weights w̄_i with
Gumbel regression (XQL, Garg et al. 2023). With

    ẑ_i = w̄_i·(Q̄_i − V_i)/β,   z_i = clip(ẑ_i, −c, c),

jaxil minimises `E[exp(z) − ẑ − 1]`. The authors write the same objective as

    E[exp(z − m) + exp(−m)·w̄_i·V_i/β],   m = max(sg(max z), −1),

i.e. `exp(−m)·E[exp(z) + w̄·V/β]`: the two differ only by terms constant in
V (`−w̄·Q̄/β − 1`) and the positive detached scale `exp(−m)`, so their
gradients in V are parallel everywhere, `∇_V L_authors = exp(−m)·∇_V L`.
Note where the clip sits in their code: `torch.clamp` acts on z, which
enters the exponential only; the linear term `w̄·V/β` is unclipped. So
outside the clip range the gradient is the linear term's, `w̄/β`, which
pulls a V that overshoots (ẑ < −c, V > Q̄ + c·β/w̄) back down, where a
clipped linear term (`exp(z) − z − 1`, XQL's form) is flat and leaves V
there. (Its mirror image: for ẑ > c, V < Q̄ − c·β/w̄, the same constant w̄/β
pushes V further down where the unclipped loss would pull it up hard; the
clip buys a bounded gradient at that price. With the authors' β = 10 and
c = 10 this needs w̄·(Q̄ − V) > 100.) `clip_linear=True` keeps the flat
form. jaxil's form is O(1) near the optimum, and it is
evaluated as `expm1(z) − ẑ` to avoid cancellation near z = 0.
"""

from __future__ import annotations

from typing import Optional, Union

import chex
import jax
import jax.numpy as jnp

Scalar = Union[float, jax.Array]


def _gumbel_z_raw(q_target, v, w_target, beta):
    q_target, v, w_target = jnp.asarray(q_target), jnp.asarray(v), jnp.asarray(w_target)
    chex.assert_rank([q_target, v, w_target], 2)
    chex.assert_equal_shape([q_target, v, w_target])
    chex.assert_type([q_target, v, w_target], float)
    q_target = jax.lax.stop_gradient(q_target)
    w_target = jax.lax.stop_gradient(w_target)
    return w_target * (q_target - v) / beta


def _gumbel_z(q_target, v, w_target, beta, clip):
    return jnp.clip(_gumbel_z_raw(q_target, v, w_target, beta), -clip, clip)


def gumbel_value_loss(
    q_target: jax.Array,
    v: jax.Array,
    w_target: jax.Array,
    beta: Scalar,
    clip: Scalar = 10.0,
    mask: Optional[jax.Array] = None,
    clip_linear: bool = False,
) -> jax.Array:
    """O-MAPL local value loss (Gumbel regression through the mixer weights).

        ẑ_bi = w̄_bi·(Q̄_bi − V_bi)/β,   z_bi = clip(ẑ_bi, −clip, clip)
        L    = Σ_b m_b·mean_i[exp(z_bi) − ẑ_bi − 1] / max(Σ_b m_b, 1)

    Equal, up to terms constant in V and a positive detached scale, to the
    authors' `mean[exp(z − max z) + exp(−max z)·w̄·V/β]` (see the module
    docstring), so `∂L/∂V_bi ∝ (w̄/β)·(1 − exp(ẑ))` inside the clip range
    and `w̄/β` outside it. `clip_linear=True` clips the linear term too
    (`exp(z) − z − 1`: ≥ 0, but zero gradient outside the clip range).
    `Q̄` and `w̄` come from target networks and are wrapped in
    `stop_gradient`; only `V` is trained.
    Unclipped, the minimiser satisfies `E[w̄·(exp(z) − 1) | o_i] = 0`; for a
    fixed w̄ that is `V = (β/w̄)·log E[exp(w̄·Q̄/β)]`, a soft maximum of Q̄
    (temperature β/w̄), not its mean.

    Args:
      q_target: `[B, N]` target local Q-values Q̄_i(o_i, a_i) of the data
        actions.
      v: `[B, N]` local values V_i(o_i).
      w_target: `[B, N]` target mixer weights w̄_i(s) ≥ 0.
      beta: temperature β > 0 (`alpha` = 10 in the O-MAPL code; traced OK).
      clip: bound on |z|.
      mask: optional `[B]` validity mask (padding steps of a segment);
        `None` = all valid.
      clip_linear: clip the linear term as well (a static Python bool).

    Returns:
      Scalar loss (≥ 0 wherever ẑ ≤ clip; past the upper end each term is
      `exp(clip) − 1 − ẑ`, negative once ẑ > exp(clip) − 1).
    """
    z_raw = _gumbel_z_raw(q_target, v, w_target, beta)
    z = jnp.clip(z_raw, -clip, clip)
    per_sample = jnp.mean(jnp.expm1(z) - (z if clip_linear else z_raw), axis=-1)
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
    """O-MAPL actor weights `exp(z)`, constants for autodiff.

        ω_bi = exp(clip(w̄_bi·(Q̄_bi − V_bi)/β, −clip, clip))

    Used with `agent_weighted_bc_loss` (O-MAPL actor:
    `−mean[exp(z)·log π_i(a_i|o_i)]`). Bounded by `exp(clip)`.

    Args:
      q_target: `[B, N]` target local Q-values.
      v: `[B, N]` local values.
      w_target: `[B, N]` target mixer weights.
      beta: temperature β > 0 (traced OK).
      clip: bound on |z|.

    Returns:
      `[B, N]` non-negative weights under `stop_gradient`.
    """
    z = _gumbel_z(q_target, v, w_target, beta, clip)
    return jax.lax.stop_gradient(jnp.exp(z))
