"""Tests of the IPPO/MAPPO teachers (jaxil.teachers).

Fast tests run on two tiny environments (a masked discrete one and a
continuous one, defined and registered in helpers_teachers.py) so that
compilation stays short; the SMAX smoke test is marked slow.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.envs.core import DiscreteActions, EnvSpec
from jaxil.nn import distributions as D
from jaxil.runs.checkpoint import restore_tree
from jaxil.teachers import (
    PPOConfig,
    load_teacher,
    make_actor,
    make_policy,
    make_train,
    train_teacher,
)
from jaxil.teachers.train import _program, checkpoint_chunks
from jaxil.teachers.presets import preset

from helpers.fast_compile import FAST_COMPILE, fast_call
from helpers.teachers import TINY  # registers toy:masked and toy:continuous


# Compilation dominates these tests on a CPU: XLA level 0 (fast_compile.py).


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
    carry = jnp.zeros((), jnp.int32)

    def acts(policy):
        return jax.vmap(lambda p, o, av, k: policy.act(p, o, av, k, carry)[0],
                        in_axes=(None, 0, 0, 0))

    stoch, greedy = acts(make_policy(spec, cfg, False)), acts(make_policy(spec, cfg, True))

    def run(key):  # one compiled program keeps the test fast
        params = actor.init(key)
        # Blow the weights up so that logits are large and varied.
        params = jax.tree.map(lambda x: x * 300.0, params)
        keys = jax.random.split(key, (5, B))
        sampled = jax.vmap(lambda k: stoch(params, obs, avail, k))(keys)
        probs = jnp.exp(D.categorical_log_probs(actor.head(params, obs), avail))
        return probs, sampled, greedy(params, obs, avail, keys[0])

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
        f = lambda l: (D.categorical_log_prob(l, av, jnp.array([1, 0])),
                       D.categorical_entropy(l, av))
        g = jax.grad(lambda l: sum(x.sum() for x in f(l)))(logits)
        return f(logits), g, jax.nn.softmax(D.masked_logits(logits, av))

    (logp, ent), g, probs = fast_call(stats, jnp.array([[1e4, -3.0, 2.0], [0.0, 0.0, 0.0]]))
    for x in (logp, ent, g, probs):
        assert np.isfinite(np.asarray(x)).all()
    assert np.asarray(probs)[0, 0] == 0.0


# --------------------------------------------------------------------------
# Pure training program
# --------------------------------------------------------------------------
@pytest.mark.slow  # default-suite time (about 15 s; the train_teacher run test stays); run with -m slow
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


@pytest.mark.slow  # default-suite time (shares the learning test's program); run with -m slow
def test_train_descends_the_value_loss():
    """The critic's clipped value loss stays at its starting level while the
    policy improves (here about 1.0-1.5 over the 12 chunks); ascended, it
    grows every chunk (to about 50). Kills 'value-loss sign flipped in the
    PPO update' (``pg − c_ent·H − c_v·L_V``), which the learning test above
    survives: with normalised advantages a diverging critic still leaves the
    policy a usable baseline. The program is that test's (same
    configuration and keys), so in the suite its compilation is cached."""
    cfg = TINY.replace(total_timesteps=12 * 2 * 16 * 8, lr=1e-2)
    train = make_train(envs.make("toy:masked"), cfg)
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    _, metrics = jax.jit(jax.vmap(train)).lower(keys).compile(FAST_COMPILE)(keys)
    vl = np.asarray(metrics["value_loss"])
    assert np.isfinite(vl).all() and vl.max() < 4.0, vl
    assert (vl[:, -3:].mean(1) < 1.5 * vl[:, :2].mean(1)).all(), vl


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
        a, _ = make_policy(env.spec, cfg, det).act(params, obs, None, jax.random.PRNGKey(2), 0)
        a = np.asarray(a)
        assert a.shape == (2, 2) and (a >= 0).all() and (a <= 1).all()


def test_continuous_actor_acts_inside_the_box_and_scores_raw_draws():
    """A teacher's box policy keeps its actions in the box (a squash onto the
    wrong interval fails) and scores the pre-squash draw it sampled with the
    Gaussian density of its state-independent log-std (scoring the squashed
    action, or clipping the log-std, fails the reference)."""
    spec = envs.make("toy:continuous").spec
    actor = make_actor(spec, TINY)

    def act(key):
        params = actor.init(key)
        params = dict(params, log_std=jnp.array([0.3, -0.7]))
        obs = jax.random.normal(key, (2, 3)) * 100
        out = [make_policy(spec, TINY, d).act(params, obs, None, key, 0)[0] for d in (False, True)]
        raw, logp = actor.sample_raw(params, obs, None, key)
        mean, _ = actor.head(params, obs)
        lp, ent = actor.raw_log_prob_entropy(params, obs, None, raw)
        return out, raw, logp, mean, lp, ent

    out, raw, logp, mean, lp, ent = fast_call(act, jax.random.PRNGKey(0))
    for a in out:
        a = np.asarray(a)
        assert a.shape == (2, 2) and (a >= 0).all() and (a <= 1).all()
    sd = np.exp(np.array([0.3, -0.7]))
    ref = (-0.5 * ((np.asarray(raw, np.float64) - np.asarray(mean)) / sd) ** 2 - np.log(sd)
           - 0.5 * np.log(2 * np.pi)).sum(-1)
    np.testing.assert_allclose(np.asarray(logp), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(lp), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), np.full(2, (np.log(sd) + 0.5 * np.log(2 * np.pi * np.e)).sum()), rtol=1e-6)


def test_normalize_obs_folds_each_rollout_into_the_statistics_the_actor_acts_on():
    """`normalize_obs=True`: after one chunk (2 updates of 16 envs x 8 steps,
    2 agents) the actor's and the critic's statistics have counted exactly
    the 512 agent-observations of the rollouts, and their moments are those
    of toy:continuous's observations (targets U(0, 1): mean 0.5, variance
    1/12; the time feature t/8 over t = 0..7: mean 0.4375). The actor's
    head is its network on the standardised observation. Fails if the
    statistics are never folded (count 1e-4), folded per minibatch or epoch
    (count x 2 or x 4), moved by Adam, or ignored by the head."""
    env = envs.make("toy:continuous")
    cfg = TINY.replace(normalize_obs=True)
    from jaxil.algorithms.rl.ppo import make_ppo
    from jaxil.nn import running_stats

    ppo = make_ppo(env, cfg)
    obs = jax.random.normal(jax.random.PRNGKey(5), (4, 2, 3)) * 3 + 1

    def run(key):
        runner, _ = ppo.update_chunk(ppo.init(key))
        p = runner.actor.params
        mean, _ = ppo.actor.head(p, obs)
        plain = ppo.actor.net.apply(p["net"], running_stats.normalize(p["obs_stats"], obs))
        return p["obs_stats"], runner.critic.params["in_stats"], mean, plain

    a, c, mean, plain = fast_call(run, jax.random.PRNGKey(0))
    n = cfg.updates_per_chunk * cfg.num_envs * cfg.num_steps * 2
    np.testing.assert_allclose(float(a.count), n + 1e-4, rtol=1e-6)
    np.testing.assert_allclose(float(c.count), n + 1e-4, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(a.mean), [0.5, 0.5, 0.4375], atol=0.05)
    np.testing.assert_allclose(np.asarray(a.var[:2]), [1 / 12] * 2, rtol=0.2)
    np.testing.assert_allclose(np.asarray(c.mean), [0.5] * 4, atol=0.05)
    np.testing.assert_allclose(np.asarray(mean), np.asarray(plain), rtol=1e-5, atol=1e-6)


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
    tree = restore_tree(os.path.join(out_dir, "checkpoints", str(step), "runner"), like)
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
    # Every checkpoint keeps the full runner state (a lost newest one leaves
    # the run resumable).
    for step in steps:
        assert os.path.isdir(os.path.join(out, "checkpoints", str(step), "runner"))


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
        probs = jnp.exp(D.categorical_log_probs(actor.head(p_first, obs), avail))
        g = jax.vmap(lambda o, a: greedy.act(p_first, o, a, key, 0)[0])(obs, avail)
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


# --------------------------------------------------------------------------
# Run directories of earlier versions, shipped teachers, discovery
# --------------------------------------------------------------------------
def _write_legacy_run(root, rng):
    """A run directory as jaxil wrote it before the shared policy layer: the
    flax ``Actor`` layout (``_Torso_0/Dense_i``, ``Dense_0``), no
    ``actor_format`` in teacher.json."""
    from jaxil.runs.checkpoint import save_tree

    spec = envs.make("toy:masked").spec
    widths = [spec.obs_dim + spec.num_agents, *TINY.hidden_sizes, spec.num_actions]
    layers = [dict(kernel=rng.normal(size=(a, b)).astype(np.float32),
                   bias=rng.normal(size=(b,)).astype(np.float32))
              for a, b in zip(widths[:-1], widths[1:])]
    old = {"params": {"_Torso_0": {f"Dense_{i}": l for i, l in enumerate(layers[:-1])},
                      "Dense_0": layers[-1]}}
    step = 1024
    save_tree(root / "checkpoints" / str(step) / "actor", old)
    ev = dict(episodes=8, return_mean=1.0, return_std=0.0, length_mean=8.0, win_rate=0.5)
    info = dict(step=step, eval_stochastic=ev, eval_deterministic=ev)
    (root / "checkpoints" / str(step) / "checkpoint.json").write_text(json.dumps(info))
    doc = dict(env_id="toy:masked", env_kwargs={}, algo="mappo", seed=0, config=TINY.to_dict(),
               spec=spec.to_dict(), checkpoints=[info], complete=True,
               random_baseline=dict(ev, return_mean=0.1))
    (root / "teacher.json").write_text(json.dumps(doc))
    return spec, layers, step


def _numpy_actor_logits(layers, obs, n):
    x = np.concatenate([obs, np.broadcast_to(np.eye(n), obs.shape[:-2] + (n, n))], -1)
    x = x.astype(np.float64)
    for layer in layers[:-1]:
        x = np.maximum(x @ layer["kernel"] + layer["bias"], 0.0)
    return x @ layers[-1]["kernel"] + layers[-1]["bias"]


def test_runs_of_earlier_versions_load_as_the_same_policy(tmp_path):
    """An old run directory is converted on load into the same function: the
    greedy action equals the argmax of the old network's masked logits (a
    swapped layer, a missing agent id or a transposed kernel fails), and
    resuming it is refused with a message instead of an orbax error."""
    rng = np.random.default_rng(0)
    run = tmp_path / "legacy"
    spec, layers, step = _write_legacy_run(run, rng)
    policy, params, got_spec = load_teacher(str(run), deterministic=True)
    assert got_spec == spec
    obs = rng.normal(size=(32, spec.num_agents, spec.obs_dim)).astype(np.float32)
    avail = rng.uniform(size=(32, spec.num_agents, spec.num_actions)) < 0.6
    avail[..., 0] = True
    acts = jax.vmap(lambda o, a: policy.act(params, o, a, jax.random.PRNGKey(0), 0)[0])(obs, avail)
    logits = np.where(avail, _numpy_actor_logits(layers, obs, spec.num_agents), -np.inf)
    np.testing.assert_array_equal(np.asarray(acts), logits.argmax(-1))
    with pytest.raises(ValueError, match="earlier jaxil"):
        train_teacher("toy:masked", TINY, seed=0, out_dir=str(run), resume=True, progress=False)


def test_ship_teacher_keeps_policy_params_only_and_verifies_them(uninterrupted, tmp_path):
    """A shipped teacher holds every checkpoint's actor and no runner state,
    loads to the same parameters as the run, and a damaged file (its recorded
    SHA-256 no longer matching) is refused on load rather than used."""
    from jaxil.teachers import ship_teacher

    run, doc = uninterrupted
    dest = ship_teacher(run, dest=tmp_path / "shipped" / "toy_masked")
    shipped = json.loads((dest / "teacher.json").read_text())
    assert shipped["actor_format"] == 2 and shipped["complete"]
    steps = [c["step"] for c in doc["checkpoints"]]
    assert sorted(int(s) for s in shipped["params_sha256"]) == steps
    assert not list(dest.rglob("runner")) and not (dest / "metrics.jsonl").exists()
    for step in steps:
        _, a, _ = load_teacher(run, step=step)
        _, b, _ = load_teacher(str(dest), step=step)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    shipped["params_sha256"][str(steps[0])] = "0" * 64
    (dest / "teacher.json").write_text(json.dumps(shipped))
    with pytest.raises(ValueError, match="damaged"):
        load_teacher(str(dest), step=steps[0])
    # An older run ships in the current format, as the same function.
    legacy = tmp_path / "legacy"
    _write_legacy_run(legacy, np.random.default_rng(1))
    converted = ship_teacher(legacy, dest=tmp_path / "shipped" / "legacy")
    assert json.loads((converted / "teacher.json").read_text())["shipped_from"]["actor_format"] == 1
    _, a, _ = load_teacher(str(legacy))
    _, b, _ = load_teacher(str(converted))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_shipped_teachers_are_found_without_runs_and_a_local_run_overrides(tmp_path, monkeypatch):
    """On a fresh clone (no runs/ anywhere) the zoo takes SMAX 3m's and 2s3z's
    tiers from the MAPPO teachers shipped in the package, recorded under a
    machine-independent name; a complete local run wins over the shipped one
    and says so (a lookup that ignored the package, or silently preferred it,
    fails)."""
    import shutil

    from jaxil.collect import zoo as Z
    from jaxil.teachers import shipped_teachers

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(Z.TEACHERS_ENV_VAR, raising=False)
    monkeypatch.setattr(Z, "teacher_roots", lambda: [tmp_path / "runs" / "teachers"])
    shipped = shipped_teachers()
    assert {"smax:3m", "smax:2s3z"} <= set(shipped)
    for env_id in ("smax:3m", "smax:2s3z"):
        assert Z.find_teacher(env_id) == shipped[env_id]
        zoo = Z.make_zoo(env_id, cache=False)
        expert = zoo["expert"]
        assert expert.source.startswith(f"teacher:{shipped[env_id].name}@")
        assert expert.details["teacher_dir"] == f"jaxil/teachers/shipped/{shipped[env_id].name}"
        assert expert.details["teacher_eval_win_rate"] >= 0.8
    local = tmp_path / "runs" / "teachers" / "smax_3m"
    shutil.copytree(shipped["smax:3m"], local)
    assert Z.find_teacher("smax:3m") == local
    with pytest.warns(UserWarning, match="not the one shipped"):
        zoo = Z.make_zoo("smax:3m", cache=False)
    assert zoo["expert"].details["teacher_dir"] == str(local)


def test_teach_resume_after_a_cut_metrics_line(uninterrupted, tmp_path, capsys):
    """A crash that cut the last line of a teacher's metrics.jsonl: --resume
    drops the cut row, says so, and finishes with every complete row. Bug
    caught: a JSON parse error that blocks the resume for good."""
    import shutil

    full, doc = uninterrupted
    out = tmp_path / "teacher"
    shutil.copytree(full, out)
    rows = (out / "metrics.jsonl").read_text()
    (out / "metrics.jsonl").write_text(rows + '{"chunk": 5, "upd')
    got = train_teacher("toy:masked", TINY, seed=3, out_dir=str(out), num_checkpoints=2,
                        eval_episodes=64, resume=True, progress=False,
                        compiler_options=FAST_COMPILE)
    assert got["complete"] and got["checkpoints"] == doc["checkpoints"]
    assert (out / "metrics.jsonl").read_text() == rows
    assert "dropped 1 unreadable line(s)" in capsys.readouterr().err


def test_teach_refuses_an_environment_keyword_the_environment_does_not_take(tmp_path, capsys,
                                                                          monkeypatch):
    """`jaxil teach --env-kwarg` with a keyword the environment's constructor
    does not take: a one-line error naming it, exit status 1, nothing
    written. Bug caught: the constructor's TypeError escaping as a
    traceback (it is a programming error type, so the command line's
    handler does not catch it by itself)."""
    from jaxil.cli.main import main
    from jaxil.teachers import presets

    monkeypatch.setitem(presets.PRESETS, "toy:masked", TINY)
    out = tmp_path / "t"
    code = main(["teach", "--env", "toy:masked", "--env-kwarg", "bogus=1", "--out", str(out),
                 "--no-progress"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--env-kwarg" in err[0] and "bogus" in err[0], err
    assert not (out / "teacher.json").exists()


def test_every_shipped_checkpoint_loads_and_matches_its_digest():
    """Every checkpoint of every teacher in the package loads with its
    SHA-256 verified, and the MaMuJoCo teachers record the solver settings
    they were trained under. Kills a checkpoint re-shipped without its
    teacher.json (the digests would no longer match), a checkpoint missing
    from the package data, and a MaMuJoCo teacher shipped without its
    `env_kwargs`, whose tiers the zoo would then measure under other
    physics."""
    from jaxil.teachers import shipped_teachers

    shipped = shipped_teachers()
    assert {"smax:3m", "smax:2s3z", "mamujoco:hopper_3x1", "mamujoco:halfcheetah_6x1"} <= set(shipped)
    for env_id, d in shipped.items():
        doc = json.loads((d / "teacher.json").read_text())
        steps = sorted(int(s) for s in doc["params_sha256"])
        assert steps == sorted(c["step"] for c in doc["checkpoints"]), env_id
        for step in steps:
            _, params, spec = load_teacher(str(d), step=step)
            assert spec.env_id == env_id
            assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))
        if env_id.startswith("mamujoco:"):
            assert doc["env_kwargs"] == {"iterations": 4, "ls_iterations": 8}, env_id


def test_data_is_collected_under_the_teachers_own_environment_keywords(uninterrupted, tmp_path):
    """A teacher trained with environment keywords (a MaMuJoCo teacher
    records its solver settings) gives its data under the same keywords
    unless the caller names others: `jaxil.load_dataset` on a fresh clone
    then builds the recipe's committed data, not data of another physics.
    Kills a zoo or a build that drops the teacher's keywords when none are
    given (the time limit below would be the default 8, not 5), and one
    that overrides keywords the caller gave, even `{}`."""
    import shutil

    from jaxil.collect.recipes import Recipe, build
    from jaxil.collect.zoo import make_zoo

    run, _ = uninterrupted
    teacher = tmp_path / "teacher"
    shutil.copytree(run, teacher)
    doc = json.loads((teacher / "teacher.json").read_text())
    doc["env_kwargs"] = {"max_steps": 5}
    (teacher / "teacher.json").write_text(json.dumps(doc))

    zoo = make_zoo("toy:masked", teacher_dir=teacher, cache=False)
    assert zoo.env_kwargs == {"max_steps": 5} and zoo.env.spec.max_steps == 5
    zoo = make_zoo("toy:masked", env_kwargs={}, teacher_dir=teacher, cache=False)
    assert zoo.env_kwargs == {} and zoo.env.spec.max_steps == 8
    zoo = make_zoo("toy:masked", env_kwargs={"max_steps": 6}, teacher_dir=teacher, cache=False)
    assert zoo.env.spec.max_steps == 6

    recipe = Recipe("toy:masked", "tiny", (("expert", 2), ("poor", 2)))
    ds = build(recipe, teacher_dir=teacher, progress=False, measure_episodes=0, chunk_size=2)
    assert ds.info.env_kwargs == {"max_steps": 5} and ds.spec.max_steps == 5
    assert int(np.asarray(ds.length).max()) <= 5
