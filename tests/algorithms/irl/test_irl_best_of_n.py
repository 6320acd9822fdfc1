"""Best-of-N (jaxil.algorithms.irl.best_of_n): the exact subset expectation
against brute force, same-start rollouts, and the rank correlation."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

from jaxil import envs
from jaxil.envs.policies import random_policy
from jaxil.algorithms.irl.best_of_n import (
    best_of_n_curve,
    powers_of_two,
    report,
    same_start_episodes,
    spearman_per_state,
    subset_pick_probs,
)


def _brute_force(scores, true, n):
    """Mean over every N-subset of the true return of its best-scored item
    (first index wins ties)."""
    vals = []
    for sub in itertools.combinations(range(len(scores)), n):
        best = max(sub, key=lambda j: (scores[j], -j))
        vals.append(true[best])
    return float(np.mean(vals))


def test_curve_matches_enumeration_of_subsets():
    """The hypergeometric pick probabilities equal an enumeration of all
    N-subsets, ties included: fails on an off-by-one in C(K−1−j, N−1), on
    sampling with replacement (other weights), or on picking the lowest score."""
    rng = np.random.default_rng(0)
    k = 7
    scores = rng.normal(size=(3, k))
    scores[2] = np.round(scores[2])  # ties
    true = rng.normal(size=(3, k))
    ns = [1, 2, 3, 5, 7]
    got = best_of_n_curve(scores, true, ns)
    want = np.array([[_brute_force(scores[m], true[m], n) for m in range(3)] for n in ns])
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    for n in ns:
        np.testing.assert_allclose(subset_pick_probs(k, n).sum(), 1.0, rtol=1e-12)
    # N = 1 is the mean, N = K the true return of the top-scored rollout
    np.testing.assert_allclose(got[0], true.mean(1), rtol=1e-12)


def test_oracle_curve_is_monotone_and_reaches_the_max():
    """The oracle (score = true return) rises with N to the best rollout:
    fails if the expectation ran over the wrong axis."""
    rng = np.random.default_rng(1)
    true = rng.normal(size=(4, 16))
    curve = best_of_n_curve(true, true, powers_of_two(16))
    assert np.all(np.diff(curve, axis=0) >= -1e-12)
    np.testing.assert_allclose(curve[-1], true.max(1))


def test_bad_inputs_are_refused():
    """NaN scores, mismatched shapes and N > K get one-line errors."""
    with pytest.raises(ValueError, match="NaN"):
        best_of_n_curve(np.full((1, 3), np.nan), np.zeros((1, 3)), [1])
    with pytest.raises(ValueError, match=r"\[M, K\]"):
        best_of_n_curve(np.zeros((1, 3)), np.zeros((1, 4)), [1])
    with pytest.raises(ValueError, match="N <= K"):
        subset_pick_probs(4, 5)
    assert powers_of_two(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert powers_of_two(6) == [1, 2, 4, 6]


def test_spearman_per_state_and_report():
    """A reward equal to a monotone transform of the true return has ρ = 1, its
    negation −1, and best-of-N with it is the oracle: fails if ρ is pooled
    instead of per state, or states with constant returns enter as NaN."""
    rng = np.random.default_rng(2)
    true = rng.normal(size=(5, 8))
    true[4] = 1.0  # constant: skipped
    rho, used = spearman_per_state(np.exp(true), true)
    assert used == 4 and rho == pytest.approx(1.0)
    assert spearman_per_state(-true, true)[0] == pytest.approx(-1.0)
    out = report({"good": np.exp(true), "bad": -true}, true, [1, 4, 8])
    np.testing.assert_allclose(out["rewards"]["good"]["curve"], out["oracle"])
    assert out["rewards"]["bad"]["curve"][-1] < out["sft_mean"] < out["oracle"][-1]
    assert out["sft_mean"] == pytest.approx(true.mean())


@pytest.mark.slow  # compiles a vmapped run_episodes (about a minute on a busy 2-core CPU)
def test_same_start_episodes_share_the_start_state_only():
    """Rollouts of one start state begin from the same state and then differ;
    other start states differ: fails if the reset key is not shared (start
    states differ) or the action keys are (all rollouts identical)."""
    env = envs.make("mpe:simple_spread")
    pol = random_policy(env.spec)
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    ep = jax.jit(lambda k: same_start_episodes(env, pol, None, keys, k, 3))(jax.random.PRNGKey(1))
    assert ep.obs.shape[:2] == (2, 3)
    s0 = np.asarray(ep.global_state[:, :, 0])
    np.testing.assert_array_equal(s0[0, 0], s0[0, 1])
    np.testing.assert_array_equal(s0[1, 0], s0[1, 2])
    assert np.abs(s0[0, 0] - s0[1, 0]).max() > 1e-3
    acts = np.asarray(ep.actions)
    assert not np.array_equal(acts[0, 0], acts[0, 1])
    assert np.abs(np.asarray(ep.episode_return[0, 0]) - np.asarray(ep.episode_return[0, 1])) > 0
