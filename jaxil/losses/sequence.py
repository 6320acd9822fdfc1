"""Sequence losses over token episodes: the masked negative log-likelihood
of supervised fine-tuning (SFT, behaviour cloning on token tasks) and the
loss masks it is weighed by.

A token episode is ``T`` steps of ``N`` agents, one token per agent and
step; a learner scores it teacher-forced (e.g.
``jaxil.nn.transformer.TransformerPolicy.episode_scores``) into ``log π(a_t)
[T, N]`` and averages it over the tokens a loss mask ``m [T, N]`` selects:
the episode's valid steps (:func:`agent_token_mask`), and for learning from
a takeover (OEC-style) only the steps from the switch on
(:func:`after_switch`).
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
    batch ``[E, T, N]`` of episodes is averaged over all its tokens, not per
    episode: long episodes count as much as their tokens.

    Args:
      log_probs: ``[T, N]`` (or ``[E, T, N]``) float log-probabilities of
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
    """The loss mask ``[T, N]`` of one episode's agent tokens.

        m_ti = valid_t  ∧  (Σ_a avail_tia > 1   if ``avail`` is given)

    Steps at and after the episode's end are padding (``valid`` False).
    With ``avail``, tokens the grammar forces (one legal token, e.g.
    ``<wait>`` off turn or ``<eot>`` after a full command) are left out:
    their log-probability is 0 whatever the parameters, so they would only
    dilute the mean.

    Args:
      valid: ``[T]`` bool, the episode's valid steps (``Episodes.mask``).
      num_agents: N.
      avail: optional ``[T, N, V]`` legal-token mask of each step.

    Returns:
      ``[T, N]`` bool.
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

    When an expert takes over an episode at step ``s`` (the student acted
    before), only the expert's tokens ``t ≥ s`` are labels; ``s = 0`` is a
    whole expert episode, ``s ≥ T`` none of it.

    Args:
      t: ``[T]`` integer step indices (``jnp.arange(T)``).
      switch: ``[]`` the switch step, or ``[N]`` one per agent.

    Returns:
      ``[T]`` bool, or ``[T, N]`` for a per-agent ``switch``.
    """
    t, switch = jnp.asarray(t), jnp.asarray(switch)
    chex.assert_rank(t, 1)
    chex.assert_type([t, switch], [int, int])
    if switch.ndim == 0:
        return t >= switch
    chex.assert_rank(switch, 1)
    return t[:, None] >= switch[None, :]
