"""Best-of-N over token episodes (jaxil.algorithms.lm.best_of_n.token_best_of_n):
its grouping of the prompt-major episodes into prompts, on hand-made
episodes (no environment, nothing compiled)."""

import jax.numpy as jnp
import numpy as np

from jaxil.algorithms.lm.best_of_n import token_best_of_n
from jaxil.algorithms.lm.sft import TokenEpisodes

M, K, T = 2, 4, 3


def _episodes(returns, lengths):
    e = len(returns)
    return TokenEpisodes(
        obs=jnp.zeros((e, T, 1, 2)), avail=jnp.ones((e, T, 1, 3), bool),
        actions=jnp.zeros((e, T, 1), jnp.int32),
        mask=jnp.asarray(np.arange(T)[None] < np.asarray(lengths)[:, None]),
        won=jnp.asarray(np.asarray(returns) >= 10, jnp.float32),
        episode_return=jnp.asarray(returns, jnp.float32), env_id="tokens:hand")


def test_best_of_n_groups_the_episodes_of_each_prompt():
    """Episodes ``m·K … m·K+K−1`` are prompt m's rollouts: with returns
    (0, 1, 2, 3) on prompt 0 and 10 on every rollout of prompt 1, the
    oracle's best of all K is (3 + 10) / 2 = 6.5 and the best of one the
    mean, 5.75; a reward equal to the return is the oracle, its negation
    picks the worst (0 and 10); the length diagnostic ranks within each
    prompt. Kills a rollout-major grouping (``reshape(K, M).T``: groups
    (0, 2, 10, 10) and (1, 3, 10, 10), best of all 10), which the
    environment test (scores and returns grouped alike) cannot see."""
    returns = [0.0, 1.0, 2.0, 3.0, 10.0, 10.0, 10.0, 10.0]
    lengths = [1, 2, 3, 3, 3, 2, 1, 1]
    eps = _episodes(returns, lengths)
    rep = token_best_of_n(eps, M, {"truth": lambda e: e.episode_return,
                                   "negated": lambda e: -e.episode_return,
                                   "steps": lambda e: np.asarray(e.mask).sum(1)}, ns=[1, K])
    score = rep["score"]
    np.testing.assert_allclose(score["oracle"], [5.75, 6.5])
    np.testing.assert_allclose(score["rewards"]["truth"]["curve"], [5.75, 6.5])
    np.testing.assert_allclose(score["rewards"]["negated"]["curve"], [5.75, 5.0])
    np.testing.assert_allclose(rep["success"]["oracle"], [0.5, 0.5])
    assert rep["length_spearman"]["steps"] == 1.0 and rep["rollouts"] == K


def test_best_of_n_budgets_default_to_the_rollouts_of_one_prompt():
    """Without `ns` the curves run over N = 1, 2, 4, … up to K, the
    rollouts of ONE prompt (K = 4 here, M = 2 prompts): the oracle's best
    of 2 is the mean over prompts of the expected best of a random pair,
    ((1 + 2 + 3 + 2 + 3 + 3) / 6 + 10) / 2. Kills budgets counted from the
    number of prompts (N up to M = 2: the best of all K never reported) or
    from all M·K episodes (N = 8 > K)."""
    eps = _episodes([0.0, 1.0, 2.0, 3.0, 10.0, 10.0, 10.0, 10.0], [1, 2, 3, 3, 3, 2, 1, 1])
    rep = token_best_of_n(eps, M, {"truth": lambda e: e.episode_return})
    assert rep["score"]["ns"] == rep["success"]["ns"] == [1, 2, 4]
    np.testing.assert_allclose(rep["score"]["oracle"], [5.75, (14 / 6 + 10) / 2, 6.5])
