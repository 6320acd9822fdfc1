"""On-policy distillation (OPD) of a transformer student from an expert LM,
over whole multi-turn token episodes.

The student samples every turn of its own episodes; an expert LM (a
[`TransformerPolicy`][jaxil.nn.transformer.TransformerPolicy], e.g. one
trained by SFT on the task's demonstrations) scores the same episodes
teacher-forced, on the same context as the student and nothing else; the
student is trained to match the expert's next-token distribution at every
agent token (Agarwal et al. 2024, "On-Policy Distillation of Language
Models: Learning from Self-Generated Mistakes", GKD with `λ = 1`):

    L(θ) = Σ_{e,t,i} m_eti · JSD_β(sg[π_e](·|c_eti) ‖ π_θ(·|c_eti)) / Σ m_eti,

with [`jaxil.losses.distill.distillation_loss`][jaxil.losses.distill.distillation_loss]
(`β = 1`: the per-token reverse KL `KL(π_θ ‖ π_e)`), both distributions over
the step's legal tokens, and the loss mask `m` the SFT one
([`jaxil.algorithms.lm.sft`][jaxil.algorithms.lm.sft]: the episode's valid
agent tokens with more than one legal token; environment tokens, `<wait>`
and padding are masked).

- [`check_expert_lm`][jaxil.algorithms.lm.distill.check_expert_lm] — a
  one-line refusal of an expert that is not an LM (a scripted expert
  gives actions, not a distribution).
- [`opd_loss`][jaxil.algorithms.lm.distill.opd_loss] — the loss of a batch
  of episodes from the student's and the expert's parameters.
- [`expert_log_probs`][jaxil.algorithms.lm.distill.expert_log_probs] /
  [`opd_loss_from_scores`][jaxil.algorithms.lm.distill.opd_loss_from_scores] —
  the same loss in two steps: the expert scores a batch once, and the student
  takes several updates against those fixed scores (the interactive program's
  `opd` round,
  [`jaxil.algorithms.lm.interactive`][jaxil.algorithms.lm.interactive]).
- [`expert_tokens_scored`][jaxil.algorithms.lm.distill.expert_tokens_scored]
  — what a batch costs the budget: the expert tokens scored, counted as
  DAgger counts labelling every visited state (every speaking agent token),
  so that equal budgets compare.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp

from jaxil.algorithms.lm.corrections import expert_tokens
from jaxil.algorithms.lm.sft import TokenEpisodes, _token_mask
from jaxil.losses.distill import distillation_loss
from jaxil.nn import distributions as D
from jaxil.nn.transformer import TransformerPolicy


def check_expert_lm(student: TransformerPolicy, expert: Any) -> TransformerPolicy:
    """`expert`, after checking it is an expert LM the student can be
    distilled from (one-line `ValueError` otherwise).

    Args:
      student: the transformer being trained.
      expert: the expert; OPD needs a
        [`TransformerPolicy`][jaxil.nn.transformer.TransformerPolicy] (a
        distribution over the tokens), with the student's vocabulary and
        token width.

    Raises:
      ValueError: a scripted (or any non-LM) expert, or an LM over other tokens.
    """
    if not isinstance(expert, TransformerPolicy):
        raise ValueError(
            f"on-policy distillation needs an expert LM (a distribution over the tokens, e.g. "
            f"--expert SFT_DIR), got {type(expert).__name__}, which only acts; use DAgger or OEC "
            "with a scripted expert")
    s, e = student.config, expert.config
    if (s.vocab_size, s.token_width) != (e.vocab_size, e.token_width):
        raise ValueError(
            f"the expert LM reads token_width={e.token_width} over a vocabulary of {e.vocab_size} "
            f"but the student reads {s.token_width} over {s.vocab_size}; train the expert on the "
            "same task and settings")
    return expert


def expert_log_probs(expert: TransformerPolicy, expert_params: Any,
                     batch: TokenEpisodes) -> jax.Array:
    """`[E, T, N, V]` the expert LM's teacher-forced log-probabilities of
    every step of `batch`, normalised over the step's legal tokens (the
    distribution it would have acted from there; finite on illegal tokens).

    Args:
      expert: the expert LM
        ([`check_expert_lm`][jaxil.algorithms.lm.distill.check_expert_lm]).
      expert_params: its parameters.
      batch: `[E]` token episodes.
    """
    logits = jax.vmap(expert.chunk_logits, in_axes=(None, 0))(expert_params, batch.obs)
    return D.categorical_log_probs(logits, batch.avail)


def opd_loss_from_scores(student: TransformerPolicy, params: Any, expert_scores: jax.Array,
                         batch: TokenEpisodes, beta: float = 1.0,
                         forced_tokens: bool = False) -> jax.Array:
    """The OPD loss of a batch of episodes against the expert's
    log-probabilities on it
    ([`expert_log_probs`][jaxil.algorithms.lm.distill.expert_log_probs] of the
    same `batch`), so that one scoring of the expert serves several student
    updates; [`opd_loss`][jaxil.algorithms.lm.distill.opd_loss] scores and
    calls it.

    Args:
      student: the transformer being trained.
      params: its parameters (differentiated).
      expert_scores: `[E, T, N, V]` the expert's log-probabilities on `batch`
        (a fixed target: no gradient flows into them).
      batch: `[E]` token episodes.
      beta: GKD's β in `[0, 1]` (1: reverse KL, 0: forward KL), a Python float.
      forced_tokens: also count the tokens the grammar forces.

    Returns:
      Scalar loss.
    """
    chex.assert_shape(expert_scores, batch.avail.shape)
    student_logits = jax.vmap(student.chunk_logits, in_axes=(None, 0))(params, batch.obs)
    return distillation_loss(D.categorical_log_probs(student_logits, batch.avail), expert_scores,
                             batch.avail, _token_mask(batch, forced_tokens), beta)


def opd_loss(student: TransformerPolicy, params: Any, expert: TransformerPolicy,
             expert_params: Any, batch: TokenEpisodes, beta: float = 1.0,
             forced_tokens: bool = False) -> jax.Array:
    """The OPD loss of a batch of episodes (see the module docstring).

    Both networks score every episode teacher-forced with
    [`TransformerPolicy.chunk_logits`][jaxil.nn.transformer.TransformerPolicy.chunk_logits]
    on the same observations, so the expert's distribution at step `t` is the
    one it would have acted from at `t`; the expert's side is a fixed target
    (no gradient reaches `expert_params`).

    Args:
      student: the transformer being trained.
      params: its parameters (differentiated).
      expert: the expert LM
        ([`check_expert_lm`][jaxil.algorithms.lm.distill.check_expert_lm]).
      expert_params: its parameters.
      batch: `[E]` token episodes (the student's own, for on-policy distillation).
      beta: GKD's β in `[0, 1]` (1: reverse KL, 0: forward KL), a Python float.
      forced_tokens: also count the tokens the grammar forces (one legal
        token; their divergence is 0) in the mean.

    Returns:
      Scalar loss.
    """
    return opd_loss_from_scores(student, params, expert_log_probs(expert, expert_params, batch),
                                batch, beta, forced_tokens)


def expert_tokens_scored(batch: TokenEpisodes) -> jax.Array:
    """`[E]` int32: the expert tokens each episode costs under OPD, every
    speaking agent token of its valid steps (the expert's distribution is read
    at each; the count DAgger pays for labelling every visited state,
    [`jaxil.algorithms.lm.corrections.expert_tokens`][jaxil.algorithms.lm.corrections.expert_tokens])."""
    never = jnp.zeros(batch.mask.shape, bool)
    return jax.vmap(lambda v, a, x: expert_tokens(v, a, x, True, wait=batch.wait))(
        batch.mask, batch.avail, never)
