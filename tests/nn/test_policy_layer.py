"""One policy protocol: a scripted expert, a PPO teacher and a learner's
student are interchangeable wherever a policy is taken, and the neural ones
score their own actions (jaxil.nn.policy, envs.policies)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.envs.mpe import spread_expert
from jaxil.envs.policies import Policy, as_policy
from jaxil.algorithms.offline import make_learner
from jaxil.nn.policy import PolicyNet
from jaxil.teachers import PPOConfig, make_actor, make_policy


@pytest.mark.slow  # default-suite time (~14 s); run with -m slow
def test_expert_teacher_and_student_run_through_one_rollout_function():
    """The same rollout code takes all three kinds of policy (a kind that
    needed its own adapter, or a neural policy without log_prob/entropy,
    fails), and every action it records is legal."""
    env = envs.make("mpe:simple_spread")
    spec = env.spec
    cfg = PPOConfig(hidden_sizes=(16,), num_envs=4, num_steps=4, num_minibatches=1,
                    total_timesteps=160, updates_per_chunk=10)
    learner = make_learner("bc_union", spec, hidden=(16,))
    policies = {
        "scripted": (as_policy(spread_expert(env)), None),
        "teacher": (make_policy(spec, cfg), make_actor(spec, cfg).init(jax.random.PRNGKey(1))),
        "student": (learner.policy(), learner.init(jax.random.PRNGKey(2)).params),
    }
    for name, (pol, _) in policies.items():
        assert isinstance(pol, Policy), name
        assert (pol.log_prob is None) == (name == "scripted"), name
        assert (pol.entropy is None) == (name == "scripted"), name

    @jax.jit
    def collect(all_params, key):
        return {k: envs.run_episodes(env, policies[k][0], p, key, 3)
                for k, p in all_params.items()}

    out = collect({k: p for k, (_, p) in policies.items()}, jax.random.PRNGKey(0))
    for name, eps in out.items():
        acts = np.asarray(eps.actions)
        assert acts.shape == (3, spec.max_steps, spec.num_agents), name
        assert ((acts >= 0) & (acts < spec.num_actions)).all(), name
    # The scripted expert beats the untrained networks by far.
    ret = {k: float(np.asarray(e.episode_return).mean()) for k, e in out.items()}
    assert ret["scripted"] > max(ret["teacher"], ret["student"]) + 5.0, ret


def test_policy_log_prob_and_entropy_describe_what_act_samples():
    """``log_prob`` is the log-frequency of what ``act`` draws (a mask applied
    in one but not the other, or scores of another agent's logits, fails)
    and ``entropy`` is −Σ p log p of the same distribution."""
    spec = envs.make("smax:3m").spec
    net = PolicyNet(spec, (32,), shared=True)
    params = jax.tree.map(lambda x: 3.0 * x, net.init(jax.random.PRNGKey(0)))
    pol = net.policy()
    rng = np.random.default_rng(0)
    obs = jnp.asarray(rng.normal(size=(spec.num_agents, spec.obs_dim)), jnp.float32)
    avail = jnp.asarray(rng.uniform(size=(spec.num_agents, spec.num_actions)) < 0.6).at[:, 1].set(True)
    keys = jax.random.split(jax.random.PRNGKey(1), 8000)
    acts = np.asarray(jax.jit(jax.vmap(lambda k: pol.act(params, obs, avail, k, 0)[0]))(keys))
    all_a = jnp.broadcast_to(jnp.arange(spec.num_actions)[:, None], (spec.num_actions, spec.num_agents))
    lp = np.asarray(jax.vmap(lambda a: pol.log_prob(params, obs, avail, a))(all_a)).T  # [N, A]
    p = np.exp(lp.astype(np.float64))
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)
    assert (p[~np.asarray(avail)] == 0).all()
    for i in range(spec.num_agents):
        freq = np.bincount(acts[:, i], minlength=spec.num_actions) / len(keys)
        se = np.sqrt(p[i] * (1 - p[i]) / len(keys)) + 1e-3
        assert (np.abs(freq - p[i]) < 5 * se).all(), (i, freq, p[i])
    ent = np.asarray(pol.entropy(params, obs, avail))
    want = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), -1)
    np.testing.assert_allclose(ent, want, rtol=1e-5, atol=1e-6)
