"""DICE objectives in DemoDICE's KL form (Kim et al., ICLR 2022), as used by
MisoDICE on mixed team values (Bui et al., NeurIPS 2025).

With reward R = log d_E/d_U (the discriminator logit), the dual of
`min KL(d ‖ d_E) + α·KL(d ‖ d_U)` is

    min_ν (1−γ)·E_{s0}[ν(s0)] + (1+α)·log E_{D_U}[exp(e_ν(s,a,s') / (1+α))],
    e_ν = R + γ(1−done)·ν(s') − ν(s),

and the optimal occupancy ratio d*/d_U ∝ exp(e_ν/(1+α)) weights the BC
policy step. In MisoDICE ν is the mixed team value ν_tot. `alpha` and
`gamma` may be traced scalars (hyper-parameter sweeps vmap over them); they
never enter Python control flow here.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import chex
import jax
import jax.numpy as jnp
import numpy as np

Scalar = Union[float, jax.Array]

# DemoDICE's `EPS` (float32 machine epsilon), added to the input gradient.
_GRAD_EPS = float(np.finfo(np.float32).eps)


def dice_advantage(
    reward: jax.Array,
    nu: jax.Array,
    nu_next: jax.Array,
    done: jax.Array,
    gamma: Scalar,
) -> jax.Array:
    """DICE advantage `e = r + γ·(1 − done)·ν(s') − ν(s)`.

    Args:
      reward: `[B]` rewards (for DemoDICE/MisoDICE the discriminator logit,
        held fixed by the caller).
      nu: `[B]` values ν(s).
      nu_next: `[B]` values ν(s').
      done: `[B]` terminal flags (bool or 0/1); a terminal transition does
        not bootstrap.
      gamma: discount, Python float or traced scalar.

    Returns:
      `[B]` advantages.
    """
    reward, nu, nu_next, done = (jnp.asarray(x) for x in (reward, nu, nu_next, done))
    chex.assert_rank([reward, nu, nu_next, done], 1)
    chex.assert_equal_shape([reward, nu, nu_next, done])
    chex.assert_type([reward, nu, nu_next], float)
    not_done = 1.0 - jnp.asarray(done).astype(nu.dtype)
    return reward + gamma * not_done * nu_next - nu


def _masked_scaled(adv: jax.Array, alpha: Scalar, mask: Optional[jax.Array]):
    x = adv / (1.0 + alpha)
    if mask is None:
        return x, None, jnp.asarray(adv.shape[0], adv.dtype)
    chex.assert_equal_shape([adv, mask])
    m = jnp.asarray(mask).astype(bool)
    count = jnp.sum(m).astype(adv.dtype)
    return x, m, count


def dice_nu_loss(
    nu_init: jax.Array,
    adv: jax.Array,
    alpha: Scalar,
    gamma: Scalar,
    mask: Optional[jax.Array] = None,
) -> jax.Array:
    """DemoDICE / MisoDICE ν-loss with a stable log-mean-exp.

        L_ν = (1−γ)·mean_{s0}[ν(s0)] + (1+α)·(logsumexp_b(e_b/(1+α)) − log B)

    i.e. `(1−γ)·E[ν(s0)] + (1+α)·log E_{D_U}[exp(e/(1+α))]`
    (Kim et al. 2022 and their `demodice.py`; Bui et al. 2025). With a
    `mask`, the log-mean-exp runs over the valid samples only
    (`B` → number of valid samples; an all-invalid batch leaves only the
    linear term).

    Args:
      nu_init: `[B0]` values at initial states ν(s0).
      adv: `[B]` advantages from `dice_advantage` (differentiable in ν).
      alpha: α ≥ 0, weight of the KL to the union occupancy (traced OK).
      gamma: discount (traced OK).
      mask: optional `[B]` validity mask for `adv`.

    Returns:
      Scalar loss.
    """
    nu_init, adv = jnp.asarray(nu_init), jnp.asarray(adv)
    chex.assert_rank([nu_init, adv], 1)
    chex.assert_type([nu_init, adv], float)
    x, m, count = _masked_scaled(adv, alpha, mask)
    if m is None:
        log_mean_exp = jax.nn.logsumexp(x) - jnp.log(count)
    else:
        x = jnp.where(m, x, jnp.asarray(-1e9, x.dtype))
        log_mean_exp = jax.nn.logsumexp(x) - jnp.log(jnp.maximum(count, 1.0))
        log_mean_exp = jnp.where(count > 0, log_mean_exp, 0.0)
    return (1.0 - gamma) * jnp.mean(nu_init) + (1.0 + alpha) * log_mean_exp


def dice_weights(
    adv: jax.Array,
    alpha: Scalar,
    mask: Optional[jax.Array] = None,
    log_ratio: Optional[jax.Array] = None,
) -> jax.Array:
    """Policy weights `ω_b = exp(e_b/(1+α))` normalised to mean 1.

        ω_b = B' · softmax_b(e/(1+α)) = exp(e_b/(1+α)) / mean_{b'} exp(e_{b'}/(1+α))

    over the valid samples (`B'` of them); invalid samples get weight 0, so
    `Σ_b m_b ω_b / Σ_b m_b = 1`. Computed as a softmax (max subtracted), the
    same as DemoDICE's `exp((e − max e)/(1+α)) / mean(·)`, under
    `stop_gradient`. All zeros for an all-invalid batch.

    With `log_ratio` (`log ρ_b = log d_U(x_b)/q(x_b)` for a batch drawn
    from a proposal q instead of D_U), the weights are the self-normalised
    importance weights `ρ_b·exp(e_b/(1+α)) / mean_{b'}(ρ_{b'}·exp(e_{b'}/(1+α)))`:
    `mean_b ω_b·f_b` then estimates the same `E_U[exp(e/(1+α))·f] /
    E_U[exp(e/(1+α))]` as the plain weights on a D_U batch.

    Args:
      adv: `[B]` advantages.
      alpha: α (traced OK).
      mask: optional `[B]` validity mask.
      log_ratio: optional `[B]` log importance ratios (finite).

    Returns:
      `[B]` non-negative weights, constant for autodiff.
    """
    adv = jnp.asarray(adv)
    chex.assert_rank(adv, 1)
    chex.assert_type(adv, float)
    x, m, count = _masked_scaled(jax.lax.stop_gradient(adv), alpha, mask)
    if log_ratio is not None:
        log_ratio = jnp.asarray(log_ratio)
        chex.assert_equal_shape([adv, log_ratio])
        x = x + jax.lax.stop_gradient(log_ratio).astype(x.dtype)
    if m is None:
        weights = count * jax.nn.softmax(x)
    else:
        x = jnp.where(m, x, jnp.asarray(-1e9, x.dtype))
        weights = jnp.where(m, count * jax.nn.softmax(x), 0.0)
    return jax.lax.stop_gradient(weights)


def _leading(tree: Any, name: str) -> int:
    leaves = jax.tree_util.tree_leaves(tree)
    sizes = {leaf.shape[0] if leaf.ndim else None for leaf in leaves}
    if not leaves or len(sizes) != 1 or None in sizes:
        raise ValueError(f"nu_gradient_penalty: every array of `{name}` needs the same leading "
                         f"batch axis, got shapes {[leaf.shape for leaf in leaves]}")
    return sizes.pop()


def nu_penalty_points(
    key: jax.Array, union: Any, expert: Any, union_next: Any, expert_next: Any
) -> Any:
    """DemoDICE's points for the ν gradient penalty, stacked `[3B, ...]`:
    the union states, `u·s_E + (1−u)·s_U` and `u·s'_E + (1−u)·s'_U`
    (one `u ~ U(0,1)` per sample, shared by a state and its successor and
    by every leaf of a pytree input)."""
    b = _leading(union, "union")
    for name, tree in (("expert", expert), ("union_next", union_next), ("expert_next", expert_next)):
        if _leading(tree, name) != b:
            raise ValueError(f"nu_gradient_penalty: `{name}` has batch {_leading(tree, name)}, "
                             f"union has {b}; DemoDICE pairs sample b of each")
    u = jax.random.uniform(key, (b,))

    def lerp(e, un):
        uu = u.reshape((b,) + (1,) * (e.ndim - 1)).astype(e.dtype)
        return uu * e + (1.0 - uu) * un

    inter = jax.tree_util.tree_map(lerp, expert, union)
    inter_next = jax.tree_util.tree_map(lerp, expert_next, union_next)
    return jax.tree_util.tree_map(lambda *x: jnp.concatenate(x, 0), union, inter, inter_next)


def nu_gradient_penalty(
    value_fn: Callable[[Any], jax.Array],
    union: Any,
    expert: Any,
    union_next: Any,
    expert_next: Any,
    key: jax.Array,
    agent_axis: bool = False,
) -> jax.Array:
    """DemoDICE's gradient penalty on ν (the authors' `demodice.py`,
    `grad_reg_coeffs[1]` = 1e-4 there; the coefficient is the caller's):

        x ∈ {s_U} ∪ {u·s_E + (1−u)·s_U} ∪ {u·s'_E + (1−u)·s'_U}
        GP_ν = mean_x ‖∇_x ν(x) + ε_32‖²₂

    (one-sided: it pulls the input gradient towards 0, a smoothness prior on
    ν, unlike the discriminator's two-sided (‖g‖ − 1)²). Inputs may be
    pytrees (e.g. `(obs [B, N, O], state [B, S])` for a mixed ν_tot); the
    norm runs over every leaf of a sample jointly.

    With `agent_axis` (INDD: one ν_i(o_i) per agent), every leaf is
    `[B, N, ...]`, `value_fn` returns `[M, N]` with `[m, i]`
    depending on `x[m, i]` alone, the norm is taken per agent, and the
    per-agent penalties are summed: `Σ_i mean_x ‖∇_{x_i} ν_i + ε‖²`.

    Args:
      value_fn: pytree of `[M, ...]` inputs -> `[M]` values (`[M, N]`
        with `agent_axis`); per sample, no batch statistics.
      union, expert, union_next, expert_next: pytrees of `[B, ...]` inputs
        (states and next states of the union and expert batches, same B).
      key: PRNG key for the interpolation coefficients.
      agent_axis: per-agent values and norms (see above).

    Returns:
      Scalar penalty.
    """
    points = nu_penalty_points(key, union, expert, union_next, expert_next)
    m = _leading(points, "points")

    def total(x):
        v = value_fn(x)
        chex.assert_shape(v, (m, jax.tree_util.tree_leaves(x)[0].shape[1]) if agent_axis else (m,))
        return jnp.sum(v)

    grads = jax.grad(total)(points)
    keep = 2 if agent_axis else 1
    sq = sum(jnp.sum(jnp.reshape((g + _GRAD_EPS) ** 2, g.shape[:keep] + (-1,)), axis=-1)
             for g in jax.tree_util.tree_leaves(grads))
    return jnp.sum(jnp.mean(sq, axis=0))
