"""The arrays the PPO program (jaxil.algorithms.rl.ppo.make_ppo) really
passes into its losses, checked at the call sites.

The unit tests of jaxil.losses.ppo check the arithmetic on arrays of any
shape; these check what the program hands it: a MAPPO update on the tiny
team-reward environment ``toy:masked`` (2 agents), with each loss function
wrapped so that a ``jax.debug.callback`` records its arguments inside the
compiled update. One program (init and one update of one epoch, without
the entropy bonus, so that only the clipped losses move the networks) is
compiled for the whole module.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.algorithms.rl import ppo as ppo_mod

from helpers.fast_compile import fast_call
from helpers.teachers import TINY  # registers toy:masked

CFG = TINY.replace(updates_per_chunk=1, update_epochs=1, ent_coef=0.0)


def _recording(monkeypatch, name, calls):
    real = getattr(ppo_mod, name)

    def wrapper(*args, **kwargs):
        out = real(*args, **kwargs)
        jax.debug.callback(lambda a, o: calls.append((a, o)), args, out)
        return out

    monkeypatch.setattr(ppo_mod, name, wrapper)


@pytest.fixture(scope="module")
def recorded():
    """``{name: [(args, output), ...]}`` of one MAPPO update, and
    ``"runners"``: the runner state before and after it."""
    calls = {k: [] for k in ("normalize_advantages", "gae", "clipped_surrogate_loss")}
    with pytest.MonkeyPatch.context() as mp:
        for name, c in calls.items():
            _recording(mp, name, c)
        ppo = ppo_mod.make_ppo(envs.make("toy:masked"), CFG)
        runners = fast_call(lambda k: (lambda r: (r, ppo.update_chunk(r)[0]))(ppo.init(k)),
                            jax.random.PRNGKey(0))
        runners = jax.device_get(runners)
    out = {k: [jax.tree.map(np.asarray, x) for x in v] for k, v in calls.items()}
    return dict(out, runners=runners)


def test_mappo_normalises_advantages_over_the_whole_minibatch_of_agent_steps(recorded):
    """Each minibatch's advantages ``[B, N]`` are normalised over all B·N
    agent-steps at once. Kills normalising over the agent axis only
    (``(A − A.mean(-1)) / A.std(-1)``): under MAPPO with a team reward the
    agents' advantages differ only by their values, so that leaves a sign
    per row (±1 with two agents) that carries no return and zeroes the
    expected policy gradient. The unit test's 1-D array cannot tell."""
    calls = recorded["normalize_advantages"]
    mb = CFG.num_steps * CFG.num_envs // CFG.num_minibatches
    assert len(calls) == CFG.num_minibatches * CFG.update_epochs
    for (adv, *_), z in calls:
        assert adv.shape == (mb, 2)
        a = adv.astype(np.float64)
        np.testing.assert_allclose(z, (a - a.mean()) / (a.std() + 1e-8), rtol=1e-4, atol=1e-5)
        # What it keeps: the ordering of the agent-steps by their advantage.
        assert np.corrcoef(z.mean(-1), a.mean(-1))[0, 1] > 0.99


def test_mappo_gives_gae_the_team_reward_on_every_agent_and_the_step_ends(recorded):
    """GAE gets ``[T, E, N]`` rewards: the team reward repeated on each
    agent, with the episode ends repeated likewise. Kills summing the team
    reward over a fabricated agent axis (N times the reward), giving one
    agent the reward and the others 0, and dropping or shifting the
    ``last`` flags (the environment truncates every ``max_steps`` = 8
    steps, so with T = 8 each environment ends exactly once, at the last
    step)."""
    ((reward, value, last, last_value, gamma, lam), _), = recorded["gae"]
    T, E = CFG.num_steps, CFG.num_envs
    assert reward.shape == value.shape == last.shape == (T, E, 2)
    assert last_value.shape == (E, 2)
    np.testing.assert_array_equal(reward[..., 0], reward[..., 1])
    # toy:masked's reward is the fraction of agents on target: 0, 1/2 or 1.
    assert set(np.unique(reward * 2).tolist()) <= {0.0, 1.0, 2.0}
    assert reward[:-1].any()
    np.testing.assert_array_equal(last[..., 0], last[..., 1])
    assert last.sum(0).tolist() == [[1, 1]] * E and last[-1].all()
    np.testing.assert_allclose([gamma, lam], [CFG.gamma, CFG.gae_lambda])


def test_the_clipped_losses_move_the_actor_and_the_critic(recorded):
    """With no entropy bonus, one update changes every parameter array of
    the actor and of the critic. Kills the current and the behaviour
    log-probabilities swapped at the call of clipped_surrogate_loss (the
    gradient then flows into the rollout's stored log-probabilities, a
    constant: the actor would not move) and the current and stored values
    swapped at the call of clipped_value_loss (likewise for the critic)."""
    before, after = recorded["runners"]
    for net in ("actor", "critic"):
        old, new = (jax.tree.leaves(getattr(r, net).params) for r in (before, after))
        assert all(not np.array_equal(a, b) for a, b in zip(old, new)), net
        assert all(np.isfinite(b).all() for b in new), net


def test_the_kl_penalty_subtracts_the_reference_from_the_policy(monkeypatch):
    """With a reward hook and a KL penalty, the learned reward, the current
    policy's log-probabilities and the hook's reference log-probabilities
    (π_SFT) reach ``kl_penalized_reward`` in that order, with the hook's
    coefficient (checked on the traced program, nothing compiled). Kills
    the policy and the reference swapped (a KL bonus: the penalty would
    push the policy away from π_SFT) and the reference replaced by the
    policy itself (no penalty)."""
    seen, made = [], {}
    real = ppo_mod.kl_penalized_reward

    def kl(r, logp, ref, coef):
        seen.append((r, logp, ref, coef))
        return real(r, logp, ref, coef)

    def reward(state, actor_params, batch):
        made["reward"] = batch.env_reward + state
        return made["reward"]

    def ref_log_prob(state, obs, avail, actions):
        made["ref"] = jnp.full(actions.shape, -1.5) + state
        return made["ref"]

    monkeypatch.setattr(ppo_mod, "kl_penalized_reward", kl)
    hook = ppo_mod.RewardHook(reward=reward, kl_coef=0.25, ref_log_prob=ref_log_prob)
    ppo = ppo_mod.make_ppo(envs.make("toy:masked"), CFG, hook)
    runner = jax.eval_shape(ppo.init, jax.random.PRNGKey(0), jnp.float32(0.0))
    jax.eval_shape(ppo.update_chunk, runner)
    ((r, logp, ref, coef),) = seen
    assert r is made["reward"] and ref is made["ref"] and coef == 0.25
    assert logp is not made["ref"] and logp.shape == ref.shape


def test_the_first_minibatch_rescores_the_rollouts_own_actions(recorded):
    """Before its first gradient step the update scores each minibatch's
    actions under the very policy that sampled them: the current and the
    stored log-probabilities passed to clipped_surrogate_loss agree (ratio
    1), on legal actions of a masked environment. Kills the minibatch
    rescored without its legal-action masks (``avail`` dropped or
    all-legal: another softmax), or with observations, masks and actions
    drawn from different permutations."""
    (log_prob, old_log_prob, adv, clip_eps), _ = recorded["clipped_surrogate_loss"][0]
    assert log_prob.shape == old_log_prob.shape == adv.shape
    np.testing.assert_allclose(log_prob, old_log_prob, rtol=1e-5, atol=1e-5)
    assert np.isfinite(log_prob).all() and (log_prob <= 0).all()
    # an untrained policy is near uniform over the LEGAL actions (1 to 4 of 4)
    assert (log_prob > -np.log(4) + 0.1).mean() > 0.5
