"""What a DICE learner's weights do on transitions whose truth is known.

A DICE learner (INDD, MisoDICE-VDN, MisoDICE) trains its policy by BC weighted
with ω = exp(e/(1+α)) normalised over the batch. Whether it beats BC(D_U)
depends on where those weights go. On fixed batches of union transitions with
known expert flags,
[`dice_diagnostics`][jaxil.algorithms.offline.diagnostics.dice_diagnostics]
reports per run:

- `weight_max`: the median over batches of the largest weight;
- `ess`: the effective sample size (Σω)²/(B·Σω²), 1 for uniform weights
  and 1/B when one sample holds them all;
- `expert_share`: the share of weight on true expert samples, beside
  `expert_fraction`, the share uniform weights would give;
- `disc_auc`: the discriminator's AUC for expert vs other transitions, and
  `logit_gap`, the gap of its mean logits.

The weights are the learner's own (`weigh` of a
[`Learner`][jaxil.algorithms.offline.base.Learner]), so they cannot drift from
what its update uses.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxil.algorithms.offline.base import Learner, LearnerData


def diagnostic_batches(data: LearnerData, truth: np.ndarray, groups: int, batch: int,
                       seed: int = 0) -> tuple[Any, np.ndarray]:
    """`groups` fixed batches of `batch` union transitions (uniform, as
    the learners draw them) `[G, B, ...]` and their expert flags
    `[G, B]` (`truth`: one flag per union transition)."""
    k = int(data.union.reward.shape[0])
    if np.shape(truth) != (k,):
        raise ValueError(f"truth needs one flag per union transition ({k}), got shape "
                         f"{np.shape(truth)}")
    idx = np.random.default_rng([seed, 0x64696167]).integers(0, k, (groups, batch))
    b = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)[idx]), data.union)
    return b, np.asarray(truth, bool)[idx]


def auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Probability that a positive outranks a negative (ties count ½): the
    Mann–Whitney statistic over average ranks. NaN without both classes."""
    scores, positive = np.asarray(scores, np.float64).ravel(), np.asarray(positive, bool).ravel()
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        return float("nan")
    _, inv, counts = np.unique(scores, return_inverse=True, return_counts=True)
    r = (np.cumsum(counts) - (counts - 1) / 2)[inv]  # 1-based average ranks
    return float((r[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def weight_stats(w: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """`weight_max`, `ess`, `expert_share` and `expert_fraction` (see
    the module) of normalised weights `w [G, B]`, averaged over batches;
    `w [G, B, N]` (one set per agent, INDD) is averaged over agents too."""
    w = np.asarray(w, np.float64)
    if w.ndim == 3:
        per = [weight_stats(w[..., i], truth) for i in range(w.shape[-1])]
        return {k: float(np.mean([p[k] for p in per])) for k in per[0]}
    B = w.shape[1]
    s = w.sum(1)
    ess = s ** 2 / (B * np.maximum((w ** 2).sum(1), 1e-300))
    share = (w * truth).sum(1) / np.maximum(s, 1e-300)
    return dict(weight_max=float(np.median(w.max(1))), ess=float(ess.mean()),
                expert_share=float(share.mean()), expert_fraction=float(np.mean(truth)))


@functools.lru_cache(maxsize=64)
def _weigh_runs(learner: Learner):
    """`(params [R], hparams [R], batches [G, B]) -> (logit, weights)`
    `[R, G, B(, N)]`, compiled once per learner."""
    if learner.weigh is None:
        raise ValueError(f"{learner.name} has no DICE weights to diagnose")
    per_group = jax.vmap(learner.weigh, in_axes=(None, None, 0))
    return jax.jit(jax.vmap(per_group, in_axes=(0, 0, None)))


def dice_diagnostics(learner: Learner, params: Any, hparams: Any, batches: Any,
                     truth: np.ndarray) -> dict[str, np.ndarray]:
    """Per run (the leading axis of `params`/`hparams`): the weight statistics,
    `disc_auc` and `logit_gap` (see the module) on `batches` with expert flags
    `truth`
    ([`diagnostic_batches`][jaxil.algorithms.offline.diagnostics.diagnostic_batches]).
    Returns `{name: [R]}`."""
    logit, w = jax.device_get(_weigh_runs(learner)(params, hparams, batches))
    truth = np.asarray(truth, bool)
    rows = []
    for r in range(np.shape(w)[0]):
        lg = np.asarray(logit[r])
        lg = lg.mean(-1) if lg.ndim == 3 else lg  # INDD: the mean over agents
        d = weight_stats(w[r], truth)
        d["disc_auc"] = auc(lg, truth)
        d["logit_gap"] = (float(lg[truth].mean() - lg[~truth].mean())
                          if truth.any() and (~truth).any() else float("nan"))
        rows.append(d)
    return {k: np.array([d[k] for d in rows]) for k in rows[0]}
