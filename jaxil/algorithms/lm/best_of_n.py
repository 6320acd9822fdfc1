"""Best-of-N on token tasks: N completions of one policy from the same
prompt, picked by a sequence reward.

A *prompt* is a task instance: the start state of one reset key (the hidden
program, the arithmetic problem, the two halves of the exchange task).
[`same_start_token_episodes`][jaxil.algorithms.lm.best_of_n.same_start_token_episodes]
rolls a transformer policy out K times from each of M prompts in one vmapped
program
([`jaxil.algorithms.irl.best_of_n.same_start_episodes`][jaxil.algorithms.irl.best_of_n.same_start_episodes]:
the start state is identical, the policy's draws differ), as
[`TokenEpisodes`][jaxil.algorithms.lm.sft.TokenEpisodes] ordered prompt-major
(episode `m·K + k` is rollout k of prompt m).

[`token_best_of_n`][jaxil.algorithms.lm.best_of_n.token_best_of_n] scores them
with each reward (a learned
[`jaxil.algorithms.lm.reward.SequenceRewardModel`][jaxil.algorithms.lm.reward.SequenceRewardModel],
the analytic r_c, anything mapping episodes to `[E]` scores) and reports, for
the true graded score (the episode return) and for success (the verifier), the
exact expected best-of-N curves over N-subsets, the oracle's, the policy's own
mean and each reward's Spearman ρ
([`jaxil.algorithms.irl.best_of_n.report`][jaxil.algorithms.irl.best_of_n.report]).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

from jaxil import envs
from jaxil.algorithms.irl import best_of_n as bon
from jaxil.algorithms.lm.sft import TokenEpisodes, _check_token_env, from_episodes


def same_start_token_episodes(env: envs.MultiAgentEnv, policy: Any, params: Any,
                              reset_keys: jax.Array, key: jax.Array,
                              num_rollouts: int) -> TokenEpisodes:
    """`[M·K]` token episodes: `num_rollouts` = K rollouts of `policy`
    from each of the M prompts of `reset_keys [M, 2]`, prompt-major.
    Jit-able: one program."""
    _check_token_env(env, "best-of-N compares token episodes of one prompt")
    if int(num_rollouts) < 1:
        raise ValueError(f"num_rollouts must be >= 1, got {num_rollouts}")
    eps = bon.same_start_episodes(env, policy, params, reset_keys, key, int(num_rollouts))
    flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), eps)
    return from_episodes(env, flat)


def token_best_of_n(episodes: TokenEpisodes, num_prompts: int,
                    rewards: dict[str, Callable[[TokenEpisodes], jax.Array]],
                    ns: Sequence[int] | None = None) -> dict:
    """Best-of-N of the prompt-major `episodes` (`num_prompts` × K, from
    [`same_start_token_episodes`][jaxil.algorithms.lm.best_of_n.same_start_token_episodes])
    under each reward in `rewards` (name → `episodes -> [E]` scores).

    Returns `{"score": report, "success": report, "length_spearman",
    "num_prompts", "rollouts"}` with
    [`jaxil.algorithms.irl.best_of_n.report`][jaxil.algorithms.irl.best_of_n.report]
    against the episode return (`score`) and against success (`success`):
    curves over `ns` (default 1, 2, 4, … K), the oracle's, the policy's mean
    and each reward's Spearman ρ; `length_spearman` is each reward's
    within-prompt ρ with the episode's length in steps (a reward summed over
    tokens favours long episodes; on tasks where failing episodes run to the
    turn limit that ranks failures first).
    """
    e = episodes.num_episodes
    if num_prompts < 1 or e % num_prompts:
        raise ValueError(f"{e} episodes are not {num_prompts} prompts × K rollouts")
    k = e // num_prompts
    ns = bon.powers_of_two(k) if ns is None else [int(n) for n in ns]
    grid = lambda x: np.asarray(x, np.float64).reshape(num_prompts, k)  # noqa: E731
    scores = {}
    for name, fn in rewards.items():
        s = grid(fn(episodes))
        if not np.isfinite(s).all():
            raise ValueError(f"the reward {name!r} gave NaN or inf scores; check its parameters")
        scores[name] = s
    length = grid(np.asarray(episodes.mask).sum(axis=1))
    return dict(num_prompts=int(num_prompts), rollouts=int(k),
                score=bon.report(scores, grid(episodes.episode_return), ns),
                success=bon.report(scores, grid(episodes.won), ns),
                length_spearman={name: bon.spearman_per_state(sc, length)[0]
                                 for name, sc in scores.items()})
