"""Best-of-N selection by a learned reward, from identical start states.

For M start states, K rollouts of π_SFT start from the SAME state (one reset
key per start state; the environment's later randomness and the policy's draws
differ per rollout):
[`same_start_episodes`][jaxil.algorithms.irl.best_of_n.same_start_episodes]
runs all M × K of them in one vmapped program. A reward scores every rollout;
best-of-N picks, among N of the K rollouts of a start state, the one with the
highest score.

Curves over N come from the one set of K rollouts per start state as the
EXACT expectation over all N-subsets drawn without replacement (no Monte
Carlo): with the K rollouts sorted by score, descending, rollout j (0-based)
is the pick of a uniformly random N-subset with probability

    P_j(N) = C(K−1−j, N−1) / C(K, N)

(it is in the subset and none of the j better-scored ones is), so
`E[true return of the pick] = Σ_j P_j(N)·R_j`
([`best_of_n_curve`][jaxil.algorithms.irl.best_of_n.best_of_n_curve]). Ties in
the score are broken by rollout index (the rollouts are exchangeable, so this
is a random tie-break). The oracle best-of-N is the same curve with the true
return as the score. At N = K every rollout is in the subset.

[`spearman_per_state`][jaxil.algorithms.irl.best_of_n.spearman_per_state] is
the learned-vs-true rank correlation within each start state (the quantity that
decides best-of-N), averaged over the states where the true return varies.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from scipy.special import gammaln
from scipy.stats import spearmanr

from jaxil import envs
from jaxil.envs.core import MultiAgentEnv


class SameStart:
    """`env` whose every reset returns the start state of `reset_key`.

    `reset(key)` builds the state from `reset_key` (the same for every
    call) and then carries `key` as the state's PRNG key, so the start state
    is identical while the environment's stochastic steps differ per
    rollout. Everything else is `env`'s.
    """

    def __init__(self, env: MultiAgentEnv, reset_key: jax.Array):
        self.env, self.reset_key, self.spec = env, reset_key, env.spec

    def reset(self, key: jax.Array):
        state, ts = self.env.reset(self.reset_key)
        return state.replace(key=key), ts

    def step(self, state, actions):
        return self.env.step(state, actions)

    def legalize(self, actions, avail_actions):
        return self.env.legalize(actions, avail_actions)


def same_start_episodes(env: MultiAgentEnv, policy: Any, params: Any, reset_keys: jax.Array,
                        key: jax.Array, num_rollouts: int) -> Any:
    """`Episodes [M, K, ...]`: `num_rollouts` = K episodes of `policy` from
    each of the M start states of `reset_keys [M, 2]`. Jit-able (one program: a
    vmap over start states of
    [`envs.run_episodes`][jaxil.envs.rollout.run_episodes] over K)."""

    def one(reset_key, k):
        return envs.run_episodes(SameStart(env, reset_key), policy, params, k, num_rollouts)

    keys = jax.random.split(key, reset_keys.shape[0])
    return jax.vmap(one)(reset_keys, keys)


def subset_pick_probs(k: int, n: int) -> np.ndarray:
    """`[K]`: P_j(N) = C(K−1−j, N−1)/C(K, N), the probability that the j-th
    best-scored of K items is the best of a uniformly random N-subset."""
    if not 1 <= n <= k:
        raise ValueError(f"best-of-N needs 1 <= N <= K={k}, got N={n}")
    j = np.arange(k)
    m = k - 1 - j  # items scored below j
    ok = m >= n - 1
    logc = lambda a, b: gammaln(a + 1) - gammaln(b + 1) - gammaln(a - b + 1)  # noqa: E731
    out = np.zeros(k)
    out[ok] = np.exp(logc(m[ok], n - 1) - logc(k, n))
    return out


def best_of_n_curve(scores: np.ndarray, true: np.ndarray, ns: Sequence[int]) -> np.ndarray:
    """`[len(ns), M]`: per start state, the expected true return of the
    rollout picked by `scores` among a random N of its K rollouts
    (`scores`/`true` `[M, K]`; see the module docstring)."""
    scores, true = np.asarray(scores, np.float64), np.asarray(true, np.float64)
    if scores.shape != true.shape or scores.ndim != 2:
        raise ValueError(f"scores and true returns must both be [M, K], got {scores.shape} "
                         f"and {true.shape}")
    if not np.isfinite(scores).all():
        raise ValueError("best-of-N scores contain NaN or inf; check the reward model")
    order = np.argsort(-scores, axis=1, kind="stable")
    sorted_true = np.take_along_axis(true, order, axis=1)  # [M, K] by score, descending
    k = scores.shape[1]
    return np.stack([sorted_true @ subset_pick_probs(k, int(n)) for n in ns])


def spearman_per_state(scores: np.ndarray, true: np.ndarray) -> tuple[float, int]:
    """`(mean Spearman ρ over start states, states used)`: ρ between
    `scores` and `true` `[M, K]` within each start state, over the
    states whose true returns are not all equal (NaN if none)."""
    rhos = []
    for s, t in zip(np.asarray(scores), np.asarray(true)):
        if np.ptp(t) > 0 and np.ptp(s) > 0:
            rhos.append(spearmanr(s, t).statistic)
    return (float(np.mean(rhos)) if rhos else float("nan")), len(rhos)


def powers_of_two(k: int) -> list[int]:
    """1, 2, 4, … up to K (and K itself if it is not a power of two)."""
    out, n = [], 1
    while n <= k:
        out.append(n)
        n *= 2
    if out[-1] != k:
        out.append(k)
    return out


def report(scores: dict[str, np.ndarray], true: np.ndarray, ns: Sequence[int]) -> dict:
    """Best-of-N curves (mean over start states) of every reward in
    `scores` (name -> `[M, K]`), the oracle's, π_SFT's mean return, and
    each reward's Spearman ρ (per start state, and pooled over all M × K)."""
    true = np.asarray(true, np.float64)
    out = dict(ns=[int(n) for n in ns], sft_mean=float(true.mean()),
               oracle=best_of_n_curve(true, true, ns).mean(1).tolist(), rewards={})
    for name, s in scores.items():
        rho, used = spearman_per_state(s, true)
        pooled = spearmanr(np.asarray(s).ravel(), true.ravel()).statistic if np.ptp(true) > 0 \
            else float("nan")
        out["rewards"][name] = dict(curve=best_of_n_curve(s, true, ns).mean(1).tolist(),
                                    spearman=rho, spearman_states=used,
                                    spearman_pooled=float(pooled))
    return out
