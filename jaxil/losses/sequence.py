"""Sequence losses over token episodes: the masked negative log-likelihood
of supervised fine-tuning (SFT, behaviour cloning on token tasks) and the
loss masks it is weighed by.

A token episode is `T` steps of `N` agents, one token per agent and step; a
learner scores it teacher-forced (e.g.
`jaxil.nn.transformer.TransformerPolicy.episode_scores`) into
`log π(a_t) [T, N]` and averages it over the tokens a loss mask `m [T, N]`
selects: the episode's valid steps
([`agent_token_mask`][jaxil.losses.sequence.agent_token_mask]), and for
learning from a takeover (OEC-style) only the steps from the switch on
([`after_switch`][jaxil.losses.sequence.after_switch]).
"""

from __future__ import annotations

from typing import Optional

import chex
import jax
import jax.numpy as jnp


def masked_sequence_nll(log_probs: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean negative log-likelihood over the masked agent tokens.

        L = − Σ_{t,i} m_ti · log π(a_ti | context_ti) / max(Σ_{t,i} m_ti, 1)

    (maximum likelihood / SFT: the token-level cross-entropy of the data's
    tokens under teacher forcing). Every masked token weighs the same, so a
    batch `[E, T, N]` of episodes is averaged over all its tokens, not per
    episode: long episodes count as much as their tokens.

    Args:
      log_probs: `[T, N]` (or `[E, T, N]`) float log-probabilities of
        the recorded tokens.
      mask: the same shape, bool or 0/1: which tokens the loss counts.

    Returns:
      Scalar loss (0 when the mask is empty).
    """
    log_probs, mask = jnp.asarray(log_probs), jnp.asarray(mask)
    chex.assert_type(log_probs, float)
    if log_probs.ndim not in (2, 3):
        raise ValueError(f"log_probs must be [T, N] or [E, T, N], got shape {log_probs.shape}")
    chex.assert_equal_shape([log_probs, mask])
    m = mask.astype(log_probs.dtype)
    # A masked-out token may hold -inf (an illegal padding action): select, not multiply.
    picked = jnp.where(mask.astype(bool), log_probs, jnp.zeros_like(log_probs))
    return -jnp.sum(picked) / jnp.maximum(jnp.sum(m), 1.0)


def agent_token_mask(valid: jax.Array, num_agents: int,
                     avail: Optional[jax.Array] = None) -> jax.Array:
    """The loss mask `[T, N]` of one episode's agent tokens.

        m_ti = valid_t  ∧  (Σ_a avail_tia > 1   if `avail` is given)

    Steps at and after the episode's end are padding (`valid` False).
    With `avail`, tokens the grammar forces (one legal token, e.g.
    `<wait>` off turn or `<eot>` after a full command) are left out:
    their log-probability is 0 whatever the parameters, so they would only
    dilute the mean.

    Args:
      valid: `[T]` bool, the episode's valid steps (`Episodes.mask`).
      num_agents: N.
      avail: optional `[T, N, V]` legal-token mask of each step.

    Returns:
      `[T, N]` bool.
    """
    valid = jnp.asarray(valid)
    chex.assert_rank(valid, 1)
    m = jnp.broadcast_to(valid.astype(bool)[:, None], (valid.shape[0], num_agents))
    if avail is not None:
        avail = jnp.asarray(avail)
        chex.assert_shape(avail, (valid.shape[0], num_agents, None))
        m = m & (jnp.sum(avail.astype(jnp.int32), axis=-1) > 1)
    return m


def after_switch(t: jax.Array, switch: jax.Array) -> jax.Array:
    """The OEC-style segment mask: the steps from the switch on.

        m_t = [t ≥ s]

    When an expert takes over an episode at step `s` (the student acted
    before), only the expert's tokens `t ≥ s` are labels; `s = 0` is a
    whole expert episode, `s ≥ T` none of it.

    Args:
      t: `[T]` integer step indices (`jnp.arange(T)`).
      switch: `[]` the switch step, or `[N]` one per agent.

    Returns:
      `[T]` bool, or `[T, N]` for a per-agent `switch`.
    """
    t, switch = jnp.asarray(t), jnp.asarray(switch)
    chex.assert_rank(t, 1)
    chex.assert_type([t, switch], [int, int])
    if switch.ndim == 0:
        return t >= switch
    chex.assert_rank(switch, 1)
    return t[:, None] >= switch[None, :]


def leave_one_out_advantages(returns: jax.Array) -> jax.Array:
    """REINFORCE advantages with a leave-one-out baseline (RLOO).

        A_mk = R_mk − (Σ_j R_mj − R_mk) / (K − 1)

    for K ≥ 2 rollouts of each of M prompts (the same start state): each
    rollout's baseline is the mean return of the prompt's other rollouts,
    which does not depend on its own tokens, so the policy gradient stays
    unbiased while the prompt's difficulty cancels (Kool et al., "Buy 4
    REINFORCE samples, get a baseline for free!", 2019; Ahmadian et al.,
    "Back to basics", arXiv 2402.14740).

    Args:
      returns: `[M, K]` float episode returns, K ≥ 2.

    Returns:
      `[M, K]` advantages (they sum to 0 over each prompt's K rollouts).
    """
    returns = jnp.asarray(returns)
    chex.assert_rank(returns, 2)
    chex.assert_type(returns, float)
    k = returns.shape[1]
    if k < 2:
        raise ValueError(f"a leave-one-out baseline needs >= 2 rollouts per prompt, got {k}")
    others = (jnp.sum(returns, axis=1, keepdims=True) - returns) / (k - 1)
    return returns - others


def reinforce_loss(log_probs: jax.Array, mask: jax.Array, advantages: jax.Array) -> jax.Array:
    """The REINFORCE surrogate of whole token episodes.

        L(θ) = − mean_e  A_e · Σ_{t,i} m_eti · log π_θ(a_eti | context_eti)

    Its gradient is the score-function estimate of `−∇ E[R]` when `A_e` is the
    episode's return minus a baseline that does not depend on the episode's own
    tokens
    ([`leave_one_out_advantages`][jaxil.losses.sequence.leave_one_out_advantages]);
    the advantages are constants (gradients are stopped through them).

    Args:
      log_probs: `[E, T, N]` float teacher-forced log-probabilities of the
        emitted tokens under the parameters being trained (anything, even
        −inf, where the mask is off).
      mask: `[E, T, N]` bool or 0/1: the tokens the policy chose
        ([`agent_token_mask`][jaxil.losses.sequence.agent_token_mask] with the
        legal masks).
      advantages: `[E]` float.

    Returns:
      Scalar loss.
    """
    log_probs, mask, advantages = map(jnp.asarray, (log_probs, mask, advantages))
    chex.assert_rank([log_probs, mask, advantages], [3, 3, 1])
    chex.assert_equal_shape([log_probs, mask])
    chex.assert_shape(advantages, log_probs.shape[:1])
    chex.assert_type([log_probs, advantages], float)
    picked = jnp.where(mask.astype(bool), log_probs, jnp.zeros_like(log_probs))
    return -jnp.mean(jax.lax.stop_gradient(advantages) * jnp.sum(picked, axis=(1, 2)))
