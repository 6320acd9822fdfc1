"""Distillation losses between a student's and an expert's token
distributions over the legal tokens: the generalized Jensen–Shannon
divergence of GKD and the masked token loss of on-policy distillation.

On-policy distillation (OPD; Agarwal et al. 2024, "On-Policy Distillation
of Language Models: Learning from Self-Generated Mistakes", GKD with
`λ = 1`): the student samples its own episodes, an expert LM scores every
one of its tokens teacher-forced on the same context, and the student is
trained to match the expert's next-token distribution at each agent token,

    L(θ) = Σ_t m_t · D_β(π_e(·|c_t) ‖ π_θ(·|c_t)) / max(Σ_t m_t, 1),

with the loss mask `m` over the agent tokens (environment tokens and
padding are masked) and `D_β` the generalized JSD
([`generalized_jsd`][jaxil.losses.distill.generalized_jsd]); `β = 1` is
the per-token reverse KL `KL(π_θ ‖ π_e)`, the mode-seeking objective of
on-policy distillation.

Both distributions come in as log-probabilities normalised over the legal
tokens (the masked categoricals of
[`jaxil.nn.distributions.categorical_log_probs`][jaxil.nn.distributions.categorical_log_probs],
as the other losses take log-probabilities, not logits): an illegal token has
probability 0 under both and contributes nothing (the convention
`0 · log 0 = 0`, taken by selecting, not multiplying, so it carries no gradient
either).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def _beta(beta) -> float:
    """`beta` as a Python float in [0, 1] (one-line errors otherwise)."""
    try:
        b = float(beta)
    except jax.errors.ConcretizationTypeError:
        raise TypeError("beta must be a Python float (it selects the GKD endpoint), got a traced "
                        "array; pass it as a static argument") from None
    except (TypeError, ValueError):
        raise TypeError(f"beta must be a float in [0, 1], got {beta!r}") from None
    if not 0.0 <= b <= 1.0:
        raise ValueError(f"beta must be in [0, 1] (0: forward KL, 1: reverse KL), got {b}")
    return b


def _legal_kl(log_p: jax.Array, log_q: jax.Array, legal: jax.Array) -> jax.Array:
    """`KL(p ‖ q) = Σ_{legal a} p(a) (log p(a) − log q(a))`, `[...]`."""
    term = jnp.exp(log_p) * (log_p - log_q)
    return jnp.sum(jnp.where(legal, term, jnp.zeros_like(term)), axis=-1)


def generalized_jsd(student_log_probs: jax.Array, expert_log_probs: jax.Array,
                    avail: jax.Array, beta: float = 1.0) -> jax.Array:
    """Per-token generalized Jensen–Shannon divergence of GKD over the legal tokens.

        JSD_β(π_e ‖ π_s) = β · KL(π_e ‖ M) + (1 − β) · KL(π_s ‖ M),
        M = β · π_e + (1 − β) · π_s,                        0 < β < 1,

    and at the endpoints the two KLs (the GKD convention, as TRL's
    `GKDTrainer.generalized_jsd_loss` implements it):

        β = 0:  KL(π_e ‖ π_s)  (forward KL, mass-covering),
        β = 1:  KL(π_s ‖ π_e)  (reverse KL, mode-seeking).

    (Agarwal et al. 2024, "On-Policy Distillation of Language Models:
    Learning from Self-Generated Mistakes", eq. 1.) The interior does not
    tend to the endpoints: `JSD_β → 0` as `β → 0` or `1`; it behaves like
    `β · KL(π_e ‖ π_s)` near 0 and `(1 − β) · KL(π_s ‖ π_e)` near 1.

    `π_s` and `π_e` are normalised over the legal tokens `avail`; `log M`
    is computed in log space,
    `logsumexp(log β + log π_e, log(1 − β) + log π_s)`. Illegal tokens
    contribute exactly 0 (and no gradient). Differentiable in both
    arguments; [`distillation_loss`][jaxil.losses.distill.distillation_loss]
    stops the expert's gradient.

    Args:
      student_log_probs: `[..., V]` float log-probabilities of the
        student, normalised over `avail` (e.g.
        `categorical_log_probs(logits, avail)`; finite on illegal tokens).
      expert_log_probs: `[..., V]` the expert's, same shape and
        normalisation.
      avail: `[..., V]` bool legal-token masks, same shape.
      beta: a Python float in `[0, 1]`.

    Returns:
      `[...]` the divergence of each token (≥ 0).

    Raises:
      ValueError: `beta` outside `[0, 1]`.
      TypeError: `beta` traced (pass it as a static argument).
    """
    b = _beta(beta)
    log_s, log_e, avail = map(jnp.asarray, (student_log_probs, expert_log_probs, avail))
    if log_s.ndim < 1:
        raise ValueError("log-probabilities must be [..., V], got a scalar")
    chex.assert_equal_shape([log_s, log_e, avail])
    chex.assert_type([log_s, log_e, avail], [float, float, bool])
    if b == 0.0:
        return _legal_kl(log_e, log_s, avail)
    if b == 1.0:
        return _legal_kl(log_s, log_e, avail)
    log_m = jnp.logaddexp(jnp.log(b) + log_e, jnp.log1p(-b) + log_s)
    return b * _legal_kl(log_e, log_m, avail) + (1.0 - b) * _legal_kl(log_s, log_m, avail)


def distillation_loss(student_log_probs: jax.Array, expert_log_probs: jax.Array,
                      avail: jax.Array, mask: jax.Array, beta: float = 1.0) -> jax.Array:
    """The on-policy distillation loss: the mean per-token divergence to a
    fixed expert over the masked tokens.

        L = Σ_t m_t · JSD_β(sg[π_e](·|c_t) ‖ π_s(·|c_t)) / max(Σ_t m_t, 1)

    with [`generalized_jsd`][jaxil.losses.distill.generalized_jsd]; the
    default `β = 1` is the per-token reverse KL `KL(π_s ‖ π_e)` of
    on-policy distillation (Agarwal et al. 2024, GKD). The expert's
    log-probabilities are a target (`stop_gradient`): the gradient reaches
    the student's only. Every masked token weighs the same, so a batch of episodes
    is averaged over all its tokens, not per episode (as
    [`masked_sequence_nll`][jaxil.losses.sequence.masked_sequence_nll]).

    Args:
      student_log_probs: `[..., T, V]` float log-probabilities of the
        student at each step, normalised over `avail` (any leading batch
        axes, e.g. `[E, T, N, V]`).
      expert_log_probs: the same shape: the expert's at the SAME steps
        (both scored teacher-forced on the same context).
      avail: the same shape, bool: the legal tokens of each step.
      mask: `[..., T]` (their shape without `V`), bool or 0/1: the
        tokens the loss counts (the agent tokens; environment tokens and
        padding off).
      beta: a Python float in `[0, 1]` (0: forward KL, 1: reverse KL).

    Returns:
      Scalar loss (0 when the mask is empty).

    Raises:
      ValueError: `beta` outside `[0, 1]`.
      TypeError: `beta` traced (pass it as a static argument).
    """
    log_s, log_e, avail, mask = map(jnp.asarray, (student_log_probs, expert_log_probs, avail, mask))
    if log_s.ndim < 2:
        raise ValueError(f"log-probabilities must be [..., T, V], got shape {log_s.shape}")
    chex.assert_shape(mask, log_s.shape[:-1])
    per_token = generalized_jsd(log_s, jax.lax.stop_gradient(log_e), avail, beta)
    m = mask.astype(bool)
    picked = jnp.where(m, per_token, jnp.zeros_like(per_token))
    return jnp.sum(picked) / jnp.maximum(jnp.sum(m.astype(per_token.dtype)), 1.0)
