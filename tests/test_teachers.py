"""Tests of the IPPO/MAPPO teachers (jaxil.teachers).

Fast tests run on two tiny environments defined here (a masked discrete one
and a continuous one) so that compilation stays short; the SMAX smoke test is
marked slow.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.core import ContinuousActions, DiscreteActions, EnvSpec, MultiAgentEnv, Step
from jaxil.teachers import (
    Actor,
    PPOConfig,
    action_probs,
    gae,
    load_teacher,
    make_actor,
    make_policy,
    make_train,
    masked_logits,
    train_teacher,
)
from jaxil.teachers.ppo import (
    _program,
    _restore_tree,
    categorical_log_prob_entropy,
    checkpoint_chunks,
    gaussian_log_prob_entropy,
    squash,
)
from jaxil.teachers.zoo import preset


# --------------------------------------------------------------------------
# Tiny environments
# --------------------------------------------------------------------------
class MaskedToy(MultiAgentEnv):
    """N agents each see a one-hot target; reward = fraction of agents that
    pick their target. A random subset of the other actions is unavailable."""

    def __init__(self, num_agents=2, num_actions=4, max_steps=8):
        self.n, self.a, self.T = num_agents, num_actions, max_steps
        self.spec = EnvSpec(
            env_id="toy:masked",
            num_agents=num_agents,
            obs_dim=num_actions + 1,
            state_dim=num_agents * num_actions,
            action=DiscreteActions(num_actions, noop_action=None),
            max_steps=max_steps,
            has_win=True,
        )

    def _draw(self, key, t, reward=0.0, correct=False):
        k1, k2 = jax.random.split(key)
        target = jax.random.randint(k1, (self.n,), 0, self.a)
        onehot = jax.nn.one_hot(target, self.a)
        avail = (jax.random.uniform(k2, (self.n, self.a)) < 0.5) | (onehot > 0)
        obs = jnp.concatenate([onehot, jnp.full((self.n, 1), t / self.T)], axis=-1)
        end = t >= self.T
        return Step(
            inner=dict(t=jnp.int32(t), target=target),
            obs=obs,
            global_state=onehot.reshape(-1),
            avail_actions=avail,
            reward=reward,
            truncated=end,
            won=end & correct,
        )

    def _reset(self, key):
        return self._draw(key, 0)

    def _step(self, key, inner, actions):
        hit = (actions == inner["target"]).astype(jnp.float32)
        return self._draw(key, inner["t"] + 1, hit.mean(), hit.min() > 0)


class ContinuousToy(MultiAgentEnv):
    """Reward = −mean |a − target| on the box [0, 1]^2 (target in the obs)."""

    def __init__(self, num_agents=2, max_steps=8):
        self.n, self.T = num_agents, max_steps
        self.spec = EnvSpec(
            env_id="toy:continuous",
            num_agents=num_agents,
            obs_dim=3,
            state_dim=2 * num_agents,
            action=ContinuousActions(dim=2, low=0.0, high=1.0),
            max_steps=max_steps,
        )

    def _draw(self, key, t, reward=0.0):
        target = jax.random.uniform(key, (self.n, 2))
        obs = jnp.concatenate([target, jnp.full((self.n, 1), t / self.T)], axis=-1)
        return Step(
            inner=dict(t=jnp.int32(t), target=target),
            obs=obs,
            global_state=target.reshape(-1),
            avail_actions=jnp.zeros((self.n, 0), jnp.bool_),
            reward=reward,
            truncated=t >= self.T,
        )

    def _reset(self, key):
        return self._draw(key, 0)

    def _step(self, key, inner, actions):
        r = -jnp.abs(actions - inner["target"]).mean()
        return self._draw(key, inner["t"] + 1, r)


envs.register("toy:masked", MaskedToy)
envs.register("toy:continuous", ContinuousToy)

# Compilation dominates these tests on a CPU; XLA's optimisation level 0
# halves it (the programs run slower, which does not matter at this size).
FAST_COMPILE = {"xla_backend_optimization_level": 0}



def fast_call(fn, *args):
    """``jax.jit(fn)(*args)`` compiled with FAST_COMPILE."""
    return jax.jit(fn).lower(*args).compile(FAST_COMPILE)(*args)


TINY = PPOConfig(
    algo="mappo",
    total_timesteps=4 * 2 * 16 * 8,  # 4 chunks x 2 updates x (16 envs x 8 steps)
    num_envs=16,
    num_steps=8,
    update_epochs=2,
    num_minibatches=2,
    lr=3e-3,
    hidden_sizes=(16,),
    updates_per_chunk=2,
)


# --------------------------------------------------------------------------
# The masked actor
# --------------------------------------------------------------------------
def test_masked_actor_gives_unavailable_actions_zero_probability():
    n, a, B = 3, 6, 64
    spec = EnvSpec("toy:x", n, 5, 0, DiscreteActions(a), 10)
    cfg = TINY.replace(hidden_sizes=(32,))
    actor = make_actor(spec, cfg)
    obs = jax.random.normal(jax.random.PRNGKey(1), (B, n, 5)) * 10
    avail = jax.random.uniform(jax.random.PRNGKey(2), (B, n, a)) < 0.3
    avail = avail.at[:, :, 0].set(avail[:, :, 0] | ~avail.any(-1))  # >= 1 legal
    avail = avail.at[0, 0].set(jnp.zeros(a, bool).at[a - 1].set(True))  # exactly one
    stoch = jax.vmap(make_policy(spec, cfg, False), in_axes=(None, 0, 0, 0))
    greedy = jax.vmap(make_policy(spec, cfg, True), in_axes=(None, 0, 0, 0))

    def run(key):  # one compiled program keeps the test fast
        params = actor.init(key, obs[0])
        # Blow the weights up so that logits are large and varied.
        params = jax.tree.map(lambda x: x * 300.0, params)
        keys = jax.random.split(key, (5, B))
        sampled = jax.vmap(lambda k: stoch(params, obs, avail, k))(keys)
        return action_probs(actor, params, obs, avail), sampled, greedy(params, obs, avail, keys[0])

    p, sampled, det = (np.asarray(x) for x in fast_call(run, jax.random.PRNGKey(0)))
    av = np.asarray(avail)
    assert np.isfinite(p).all()
    assert (p[~av] == 0.0).all()
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)
    assert p[0, 0, a - 1] == 1.0
    for acts in (*sampled, det):
        assert np.take_along_axis(av, acts[..., None], -1).all()

    # Log-prob, entropy and their gradients stay finite, even for a row with
    # nothing available.
    def stats(logits):
        av = jnp.array([[False, True, True], [False, False, False]])
        f = lambda l: categorical_log_prob_entropy(l, av, jnp.array([1, 0]))
        g = jax.grad(lambda l: sum(x.sum() for x in f(l)))(logits)
        return f(logits), g, jax.nn.softmax(masked_logits(logits, av))

    (logp, ent), g, probs = fast_call(stats, jnp.array([[1e4, -3.0, 2.0], [0.0, 0.0, 0.0]]))
    for x in (logp, ent, g, probs):
        assert np.isfinite(np.asarray(x)).all()
    assert np.asarray(probs)[0, 0] == 0.0


def test_gae_matches_numpy_reference():
    rng = np.random.default_rng(0)
    T, E, N = 7, 3, 2
    r = rng.normal(size=(T, E, N)).astype(np.float32)
    v = rng.normal(size=(T, E, N)).astype(np.float32)
    last = rng.uniform(size=(T, E, N)) < 0.3
    lv = rng.normal(size=(E, N)).astype(np.float32)
    gamma, lam = 0.9, 0.8
    adv, tgt = jax.jit(gae, static_argnums=(4, 5))(r, v, last, lv, gamma, lam)
    ref = np.zeros((T, E, N))
    next_adv, next_v = np.zeros((E, N)), lv.astype(np.float64)
    for t in reversed(range(T)):
        nt = 1.0 - last[t]
        delta = r[t] + gamma * next_v * nt - v[t]
        next_adv = delta + gamma * lam * nt * next_adv
        ref[t], next_v = next_adv, v[t]
    np.testing.assert_allclose(np.asarray(adv), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(tgt), ref + v, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------
# Pure training program
# --------------------------------------------------------------------------
def test_train_runs_under_jit_and_vmap_over_seeds_and_learns():
    cfg = TINY.replace(total_timesteps=12 * 2 * 16 * 8, lr=1e-2)
    train = make_train(envs.make("toy:masked"), cfg)
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    runner, metrics = jax.jit(jax.vmap(train)).lower(keys).compile(FAST_COMPILE)(keys)
    assert runner.update.tolist() == [cfg.num_updates] * 2
    for k in ("actor_loss", "value_loss", "entropy", "approx_kl", "clip_frac", "return_mean",
              "win_rate", "lr"):
        assert metrics[k].shape == (2, cfg.num_chunks), k
        assert np.isfinite(np.asarray(metrics[k])).all(), k
    assert (np.asarray(metrics["episodes"]) > 0).all()
    np.testing.assert_allclose(np.asarray(metrics["env_steps"][:, -1]), cfg.env_steps)
    # Different seeds train different parameters.
    leaf = jax.tree.leaves(runner.actor.params)[0]
    assert not np.array_equal(np.asarray(leaf[0]), np.asarray(leaf[1]))
    # Random play picks the target ~47% of the time (return ~3.8 of 8).
    ret = np.asarray(metrics["return_mean"])
    assert (ret[:, -3:].mean(1) > ret[:, :2].mean(1) + 1.0).all(), ret


@pytest.mark.slow  # ~1 min of compilation on a shared 2-core CPU
def test_continuous_ippo_trains_under_jit_and_vmap():
    cfg = TINY.replace(algo="ippo", total_timesteps=2 * 2 * 16 * 8)
    env = envs.make("toy:continuous")
    runner, metrics = jax.jit(jax.vmap(make_train(env, cfg)))(
        jax.random.split(jax.random.PRNGKey(0), 2)
    )
    assert "win_rate" not in metrics
    for k in ("actor_loss", "value_loss", "entropy", "return_mean"):
        assert np.isfinite(np.asarray(metrics[k])).all(), k
    # The policy acts inside the box, stochastic or not.
    params = jax.tree.map(lambda x: x[0], runner.actor.params)
    obs = jax.random.normal(jax.random.PRNGKey(1), (2, 3)) * 100
    for det in (False, True):
        a = np.asarray(make_policy(env.spec, cfg, det)(params, obs, None, jax.random.PRNGKey(2)))
        assert a.shape == (2, 2) and (a >= 0).all() and (a <= 1).all()


def test_gaussian_head_log_prob_matches_numpy():
    rng = np.random.default_rng(1)
    mean, u = rng.normal(size=(2, 4, 3)).astype(np.float32)
    log_std = rng.normal(size=(3,)).astype(np.float32) * 0.3
    logp, ent = gaussian_log_prob_entropy(mean, log_std, u)
    sd = np.exp(log_std.astype(np.float64))
    ref = (-0.5 * ((u - mean) / sd) ** 2 - np.log(sd) - 0.5 * np.log(2 * np.pi)).sum(-1)
    np.testing.assert_allclose(np.asarray(logp), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), np.full(4, (np.log(sd) + 0.5 * np.log(2 * np.pi * np.e)).sum()), rtol=1e-5)
    box = np.asarray(squash(jnp.array([-1e3, 0.0, 1e3]), 0.0, 1.0))
    np.testing.assert_allclose(box, [0.0, 0.5, 1.0])
    # A continuous policy acts inside the box, stochastic or not.
    spec = envs.make("toy:continuous").spec
    actor = make_actor(spec, TINY)

    def act(key):
        params = actor.init(key, jnp.zeros((2, 3)))
        obs = jax.random.normal(key, (2, 3)) * 100
        return [make_policy(spec, TINY, d)(params, obs, None, key) for d in (False, True)]

    for a in fast_call(act, jax.random.PRNGKey(0)):
        a = np.asarray(a)
        assert a.shape == (2, 2) and (a >= 0).all() and (a <= 1).all()


# --------------------------------------------------------------------------
# Driver: checkpoints, resume, loading
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("teacher_full"))
    doc = train_teacher("toy:masked", TINY, seed=3, out_dir=out, num_checkpoints=2,
                        eval_episodes=64, progress=False, compiler_options=FAST_COMPILE)
    return out, doc


def _runner_leaves(out_dir, step):
    like = jax.eval_shape(_program("toy:masked", (), TINY, ()).ppo.init, jax.random.PRNGKey(0))
    tree = _restore_tree(os.path.join(out_dir, "checkpoints", str(step), "runner"), like)
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_train_teacher_writes_metrics_checkpoints_and_teacher_json(uninterrupted):
    out, doc = uninterrupted
    assert doc["complete"] and doc["algo"] == "mappo" and doc["env_id"] == "toy:masked"
    steps = [c["step"] for c in doc["checkpoints"]]
    assert steps == [2 * 2 * 128, 4 * 2 * 128]  # chunks 2 and 4
    for c in doc["checkpoints"]:
        for mode in ("eval_stochastic", "eval_deterministic"):
            assert c[mode]["episodes"] == 64
            assert 0.0 <= c[mode]["win_rate"] <= 1.0
    assert doc["random_baseline"]["episodes"] == 64
    with open(os.path.join(out, "metrics.jsonl")) as f:
        lines = [json.loads(x) for x in f]
    assert [x["chunk"] for x in lines] == [1, 2, 3, 4]
    for k in ("return_mean", "win_rate", "env_steps_per_s", "actor_loss", "value_loss"):
        assert all(np.isfinite(x[k]) for x in lines), k
    # Only the latest checkpoint keeps the full runner state.
    assert not os.path.isdir(os.path.join(out, "checkpoints", str(steps[0]), "runner"))
    assert os.path.isdir(os.path.join(out, "checkpoints", str(steps[1]), "runner"))


def test_resume_is_bit_identical_to_an_uninterrupted_run(uninterrupted, tmp_path):
    full, full_doc = uninterrupted
    out = str(tmp_path / "teacher_resumed")
    kw = dict(seed=3, out_dir=out, num_checkpoints=2, eval_episodes=64, progress=False,
              compiler_options=FAST_COMPILE)
    # "Killed" after chunk 3: the last checkpoint (chunk 2) holds the runner state.
    part = train_teacher("toy:masked", TINY, stop_after_chunks=3, **kw)
    assert not part["complete"] and len(part["checkpoints"]) == 1
    with pytest.raises(FileExistsError, match="resume"):
        train_teacher("toy:masked", TINY, **kw)
    with pytest.raises(ValueError, match="config"):
        train_teacher("toy:masked", TINY.replace(lr=1e-3), resume=True, **kw)
    doc = train_teacher("toy:masked", TINY, resume=True, **kw)
    assert doc["complete"]
    last = doc["checkpoints"][-1]["step"]
    for a, b in zip(_runner_leaves(full, last), _runner_leaves(out, last)):
        np.testing.assert_array_equal(a, b)
    _, p_full, _ = load_teacher(full)
    _, p_res, _ = load_teacher(out)
    for a, b in zip(jax.tree.leaves(p_full), jax.tree.leaves(p_res)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    evals = lambda d: [(c["step"], c["eval_stochastic"], c["eval_deterministic"])
                       for c in d["checkpoints"]]
    assert evals(doc) == evals(full_doc)
    strip = lambda r: {k: v for k, v in r.items() if "time" not in k and not k.endswith("_s")}
    with open(os.path.join(full, "metrics.jsonl")) as f1, open(os.path.join(out, "metrics.jsonl")) as f2:
        m1 = [strip(json.loads(x)) for x in f1]
        m2 = [strip(json.loads(x)) for x in f2]
    assert m1 == m2


def test_load_teacher_gives_a_policy_for_run_episodes(uninterrupted):
    out, doc = uninterrupted
    env = envs.make("toy:masked")
    policy, params, spec = load_teacher(out)
    assert spec == env.spec
    first = doc["checkpoints"][0]["step"]
    greedy, p_first, _ = load_teacher(out, step=first, deterministic=True)
    actor = make_actor(spec, TINY)

    def run(params, p_first, key):
        eps = envs.run_episodes(env, policy, params, key, 8)
        obs, avail = eps.obs[:, 0], eps.avail_actions[:, 0]
        probs = jax.vmap(lambda o, a: action_probs(actor, p_first, o, a))(obs, avail)
        g = jax.vmap(lambda o, a: greedy(p_first, o, a, key))(obs, avail)
        return eps, g, jnp.argmax(probs, -1)

    eps, g, argmax = fast_call(run, params, p_first, jax.random.PRNGKey(0))
    assert eps.actions.shape == (8, spec.max_steps, spec.num_agents)
    acts = np.asarray(eps.actions)[..., None]
    assert np.take_along_axis(np.asarray(eps.avail_actions)[:, :-1], acts, -1).all()
    # deterministic=True is the greedy policy of the chosen checkpoint.
    np.testing.assert_array_equal(np.asarray(g), np.asarray(argmax))
    assert not all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(p_first))
    )
    with pytest.raises(ValueError, match="available"):
        load_teacher(out, step=12345)
    with pytest.raises(FileNotFoundError):
        load_teacher(os.path.join(out, "nope"))


# --------------------------------------------------------------------------
# Configuration errors
# --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(algo="qmix"), "algo"),
        (dict(num_envs=0), "num_envs"),
        (dict(num_steps=2.5), "num_steps"),
        (dict(update_epochs=True), "update_epochs"),
        (dict(lr=-1.0), "lr"),
        (dict(lr=float("nan")), "lr"),
        (dict(gamma=1.5), "gamma"),
        (dict(gae_lambda=-0.1), "gae_lambda"),
        (dict(clip_eps=0.0), "clip_eps"),
        (dict(ent_coef=-0.01), "ent_coef"),
        (dict(hidden_sizes=()), "hidden_sizes"),
        (dict(hidden_sizes=(64, 0)), "hidden_sizes"),
        (dict(activation="gelu"), "activation"),
        (dict(anneal_lr="yes"), "anneal_lr"),
        (dict(num_envs=3, num_steps=5, num_minibatches=2), "num_minibatches"),
        (dict(total_timesteps=100), "total_timesteps"),
    ],
)
def test_bad_config_values_raise_clear_errors(kw, match):
    with pytest.raises(ValueError, match=f"PPOConfig.{match}"):
        TINY.replace(**kw)


def test_config_round_trip_and_helpers():
    cfg = TINY.replace(hidden_sizes=[8, 8])
    assert cfg.hidden_sizes == (8, 8)
    assert PPOConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match="unknown"):
        PPOConfig.from_dict(dict(cfg.to_dict(), learning_rate=1.0))
    assert checkpoint_chunks(10, 5) == [2, 4, 6, 8, 10]
    assert checkpoint_chunks(3, 5) == [1, 2, 3]
    assert checkpoint_chunks(7, 1) == [7]
    with pytest.raises(ValueError):
        checkpoint_chunks(7, 0)
    assert preset("smax:3m").algo == "mappo"
    with pytest.raises(KeyError, match="preset"):
        preset("toy:masked")


# --------------------------------------------------------------------------
# Slow: real environment smoke test
# --------------------------------------------------------------------------
@pytest.mark.slow
def test_smax_3m_short_training_improves_return(tmp_path):
    cfg = preset("smax:3m", total_timesteps=8 * 5 * 64 * 128)
    doc = train_teacher("smax:3m", cfg, seed=0, out_dir=str(tmp_path), num_checkpoints=2,
                        eval_episodes=64, progress=False)
    final = doc["checkpoints"][-1]["eval_stochastic"]["return_mean"]
    assert final > doc["random_baseline"]["return_mean"] + 0.3
    policy, params, spec = load_teacher(str(tmp_path))
    eps = envs.run_episodes(envs.make("smax:3m"), policy, params, jax.random.PRNGKey(1), 4)
    assert np.isfinite(np.asarray(eps.episode_return)).all()
