"""DICE objectives in DemoDICE's KL form (Kim et al., ICLR 2022), as used by
MisoDICE on mixed team values (Bui et al., NeurIPS 2025).

With reward R = log d_E/d_U (the discriminator logit), the dual of
``min KL(d ‖ d_E) + α·KL(d ‖ d_U)`` is

    min_ν (1−γ)·E_{s0}[ν(s0)] + (1+α)·log E_{D_U}[exp(e_ν(s,a,s') / (1+α))],
    e_ν = R + γ(1−done)·ν(s') − ν(s),

and the optimal occupancy ratio d*/d_U ∝ exp(e_ν/(1+α)) weights the BC
policy step. In MisoDICE ν is the mixed team value ν_tot. ``alpha`` and
``gamma`` may be traced scalars (hyper-parameter sweeps vmap over them); they
never enter Python control flow here.
"""

from __future__ import annotations

from typing import Optional, Union

import chex
import jax
import jax.numpy as jnp

Scalar = Union[float, jax.Array]


def dice_advantage(
    reward: jax.Array,
    nu: jax.Array,
    nu_next: jax.Array,
    done: jax.Array,
    gamma: Scalar,
) -> jax.Array:
    """DICE advantage ``e = r + γ·(1 − done)·ν(s') − ν(s)``.

    Args:
      reward: ``[B]`` rewards (for DemoDICE/MisoDICE the discriminator logit,
        held fixed by the caller).
      nu: ``[B]`` values ν(s).
      nu_next: ``[B]`` values ν(s').
      done: ``[B]`` terminal flags (bool or 0/1); a terminal transition does
        not bootstrap.
      gamma: discount, Python float or traced scalar.

    Returns:
      ``[B]`` advantages.
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

    i.e. ``(1−γ)·E[ν(s0)] + (1+α)·log E_{D_U}[exp(e/(1+α))]``
    (Kim et al. 2022 and their ``demodice.py``; Bui et al. 2025). With a
    ``mask``, the log-mean-exp runs over the valid samples only
    (``B`` → number of valid samples; an all-invalid batch leaves only the
    linear term).

    Args:
      nu_init: ``[B0]`` values at initial states ν(s0).
      adv: ``[B]`` advantages from ``dice_advantage`` (differentiable in ν).
      alpha: α ≥ 0, weight of the KL to the union occupancy (traced OK).
      gamma: discount (traced OK).
      mask: optional ``[B]`` validity mask for ``adv``.

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
) -> jax.Array:
    """Policy weights ``ω_b = exp(e_b/(1+α))`` normalised to mean 1.

        ω_b = B' · softmax_b(e/(1+α)) = exp(e_b/(1+α)) / mean_{b'} exp(e_{b'}/(1+α))

    over the valid samples (``B'`` of them); invalid samples get weight 0, so
    ``Σ_b m_b ω_b / Σ_b m_b = 1``. Computed as a softmax (max subtracted), the
    same as DemoDICE's ``exp((e − max e)/(1+α)) / mean(·)``, under
    ``stop_gradient``. All zeros for an all-invalid batch.

    Args:
      adv: ``[B]`` advantages.
      alpha: α (traced OK).
      mask: optional ``[B]`` validity mask.

    Returns:
      ``[B]`` non-negative weights, constant for autodiff.
    """
    adv = jnp.asarray(adv)
    chex.assert_rank(adv, 1)
    chex.assert_type(adv, float)
    x, m, count = _masked_scaled(jax.lax.stop_gradient(adv), alpha, mask)
    if m is None:
        weights = count * jax.nn.softmax(x)
    else:
        x = jnp.where(m, x, jnp.asarray(-1e9, x.dtype))
        weights = jnp.where(m, count * jax.nn.softmax(x), 0.0)
    return jax.lax.stop_gradient(weights)
