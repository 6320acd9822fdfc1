"""Generalised advantage estimation (Schulman et al., 2016) over a
time-major batch, as a reverse `lax.scan`."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def gae(
    reward: jax.Array,
    value: jax.Array,
    last: jax.Array,
    last_value: jax.Array,
    gamma: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:
    """Advantages and value targets of a time-major batch.

        δ_t = r_t + γ (1 − last_t) V_{t+1} − V_t,
        A_t = δ_t + γ λ (1 − last_t) A_{t+1},

    with `V_T = last_value`. `last_t` marks that step t ended an episode:
    the next value belongs to a new episode and is not bootstrapped (time
    limits are treated as terminal, as in PureJaxRL and JaxMARL).

    Args:
      reward: `[T, ...]` reward of the transition taken at t.
      value: `[T, ...]` V(s_t).
      last: `[T, ...]` bool (or 0/1), the episode ended with step t.
      last_value: `[...]` value of the observation after step T−1.
      gamma: discount γ (a float or a traced scalar).
      lam: GAE λ.

    Returns:
      `(advantages, value_targets)`, both `[T, ...]`; targets = A + V.
    """
    reward, value, last = jnp.asarray(reward), jnp.asarray(value), jnp.asarray(last)
    last_value = jnp.asarray(last_value)
    chex.assert_equal_shape([reward, value, last])
    chex.assert_equal_shape([value[0], last_value])
    chex.assert_type([reward, value, last_value], float)
    nonterminal = 1.0 - last.astype(value.dtype)

    def body(carry, x):
        next_adv, next_value = carry
        r, nt, v = x
        delta = r + gamma * next_value * nt - v
        adv = delta + gamma * lam * nt * next_adv
        return (adv, v), adv

    _, adv = jax.lax.scan(
        body, (jnp.zeros_like(last_value), last_value), (reward, nonterminal, value), reverse=True
    )
    return adv, adv + value
