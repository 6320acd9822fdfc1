"""One conformance suite over every registered environment."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.envs.policies import random_policy
from helpers.fast_compile import fast_call, fast_compile
import helpers.teachers  # noqa: F401  (registers toy:continuous)




# The other SMAX maps are the same adapter at other sizes: they run with -m slow.
FAST_SMAX = {"smax:3m"}  # 2s3z and smacv2_5_units share the adapter; -m slow runs them
# MABrax (1000-step episodes of rigid-body physics) is an optional extra: slow too.
# MaMuJoCo (MJX) runs its half-cheetah by default, the hopper and the ants with -m slow.


# The Jumanji tasks share one adapter too: LevelBasedForaging, the benchmark
# task, runs by default; RobotWarehouse, Connector and Cleaner with -m slow
# (they were a minute of the default suite's compile time).
FAST_JUMANJI = {"jumanji:LevelBasedForaging-v0"}


def _is_fast(eid):
    if eid.startswith("smax:"):
        return eid in FAST_SMAX
    if eid.startswith("jumanji:"):
        return eid in FAST_JUMANJI
    if eid.startswith("tokens:"):  # one shared base class; the others under -m slow
        return eid == "tokens:repair"
    # MPE's continuous variant is the discrete adapter with a box: -m slow runs it (its
    # probe was 28 s of the default suite); toy:continuous covers the box by default.
    if eid.startswith("mamujoco:"):  # one MJX adapter: the half-cheetah compiles fastest
        # (the hopper's RK4 steps make its probe compile about three times as long)
        return eid == "mamujoco:halfcheetah_6x1"
    return not eid.startswith("mabrax:") and eid != "mpe:simple_spread_continuous"


# MaMuJoCo episodes are cut at 10 steps here (1000 by default): the probe's
# rollouts then cross several time limits in seconds of MJX physics instead
# of minutes (at 30 steps the half-cheetah's probe was a minute of the
# default suite), and the limit's handling is the same at any length.
_KWARGS = {"mamujoco": {"max_steps": 10}}


# The library's environments: the toy ones that test helpers register (in
# whichever modules pytest collects first) are checked by their own tests,
# except toy:continuous (tests/helpers/teachers.py), a box-action environment
# that keeps the base class's continuous checks (legalisation of out-of-box
# and NaN actions) in the default run at a fraction of MPE's compile time.
IDS = [e if _is_fast(e) else pytest.param(e, marks=pytest.mark.slow)
       for e in envs.list() if not e.startswith("toy:")] + ["toy:continuous"]

_cache = {}

ROLLOUT_ENVS = 4


def _rollout_steps(env):
    """Past the first episode end; past the second where AutoReset observes
    only the kept state (test_auto_reset_observing_... reuses the rollout)."""
    return 2 * env.spec.max_steps + 3 if env.observes_state else env.spec.max_steps + 5


def _env(eid):
    if eid not in _cache:
        try:
            _cache[eid] = (envs.make(eid, **_KWARGS.get(eid.split(":")[0], {})), None)
        except ImportError as e:  # an optional extra (MABrax needs brax, MaMuJoCo mujoco-mjx)
            pytest.skip(str(e))
    return _cache[eid][0]


def _random_actions(spec, key, avail, legal=True):
    if spec.discrete:
        if legal:
            logits = jnp.where(avail, 0.0, -jnp.inf)
            return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
        return jax.random.randint(key, (spec.num_agents,), -2, spec.num_actions + 2)
    lo, hi = spec.action.low, spec.action.high
    span = (hi - lo) if legal else 3 * (hi - lo)
    return lo + span * jax.random.uniform(key, (spec.num_agents, spec.action.dim)) - (0 if legal else span / 3)


def _probe_fn(env):
    """Everything the suite checks, as ONE compiled program per environment
    (compiled once, at XLA's level 0: see fast_compile.py)."""
    spec = env.spec
    pol = random_policy(spec)
    auto = envs.AutoReset(env)
    steps = _rollout_steps(env)

    def probe(key):
        k0, k2, k3, k4 = jax.random.split(key, 4)
        start = env.reset(k0)

        def illegal_body(carry, xs):
            state, ts = carry
            key, i = xs
            bad = _random_actions(spec, key, ts.avail_actions, legal=False)
            if not spec.discrete:  # every other step all NaN, which legalize maps to the box's centre
                bad = jnp.where(i % 2 == 0, jnp.nan, bad)
            legal = env.legalize(bad, ts.avail_actions)
            s_bad, ts_bad = env.step(state, bad)
            s_leg, ts_leg = env.step(state, legal)
            # (a tolerance, not ==: XLA may fuse the two identical physics steps differently)
            same = jnp.all(jnp.stack([
                jnp.allclose(a.astype(jnp.float32), b.astype(jnp.float32), rtol=1e-5, atol=1e-5)
                for a, b in zip(jax.tree.leaves(ts_bad), jax.tree.leaves(ts_leg))
            ]))
            if spec.discrete:
                ok = ts.avail_actions[jnp.arange(spec.num_agents), legal].all()
            else:
                ok = jnp.all((legal >= spec.action.low) & (legal <= spec.action.high))
            # ended episodes restart from the first state, so the scan keeps
            # exercising live states without tracing another reset
            s_next, ts_next = jax.lax.cond(ts_bad.last(), lambda: start, lambda: (s_bad, ts_bad))
            return (s_next, ts_next), (same, ok, ts_bad.obs, ts_bad.reward, ts_leg)

        eps = envs.run_episodes(env, pol, None, k2, 8)
        _, (same, ok, obs, rew, ts_leg) = jax.lax.scan(
            illegal_body, start, (jax.random.split(k3, 20), jnp.arange(20)))
        traj = envs.rollout(auto, pol, None, k4, ROLLOUT_ENVS, steps)
        # The scan's first legal step (from the reset state) is the step that
        # test_spec_shapes_and_dtypes checks: each env.step the probe traces
        # is compiled anew (seconds for MJX's physics), so it traces four.
        ts1 = jax.tree.map(lambda x: x[0], ts_leg)
        return dict(ts0=start[1], ts1=ts1, eps=eps, ill=(same, ok, obs, rew), traj=traj, traj_key=k4)

    return fast_compile(probe, jax.random.PRNGKey(0))  # called with other keys too


_probes = {}


def _probe(eid, seed=0):
    if (eid, seed) not in _probes:
        _env(eid)  # made once, with the suite's overrides (skips a missing optional extra)
        env, fn = _cache[eid]
        if fn is None:
            fn = _probe_fn(env)
            _cache[eid] = (env, fn)
        _probes[(eid, seed)] = jax.tree.map(np.asarray, fn(jax.random.PRNGKey(seed)))
    return _cache[eid][0], _probes[(eid, seed)]


@pytest.mark.parametrize("eid", IDS)
def test_spec_shapes_and_dtypes(eid):
    env, p = _probe(eid)
    spec = env.spec
    ts, ts1 = p["ts0"], p["ts1"]
    n = spec.num_agents
    assert ts.obs.shape == (n, spec.obs_dim) and ts.obs.dtype == np.float32
    assert ts.global_state.shape == (spec.state_dim,) and ts.global_state.dtype == np.float32
    assert ts.avail_actions.shape == (n, spec.num_actions) and ts.avail_actions.dtype == np.bool_
    for f in ("reward", "episode_return"):
        assert getattr(ts, f).shape == () and getattr(ts, f).dtype == np.float32
    for f in ("done", "truncated", "won"):
        assert getattr(ts, f).shape == () and getattr(ts, f).dtype == np.bool_
    assert spec.max_steps > 0
    if spec.discrete:
        assert ts.avail_actions.any(axis=-1).all(), "every agent needs a legal action"
    assert jax.tree.map(lambda x: (x.shape, x.dtype), ts1) == jax.tree.map(
        lambda x: (x.shape, x.dtype), ts
    )
    assert ts1.episode_length == 1 and ts.episode_length == 0
    assert np.isfinite(ts1.obs).all() and np.isfinite(ts1.reward)
    assert np.isfinite(ts1.global_state).all()


@pytest.mark.parametrize("eid", IDS)
def test_determinism_and_episode_stats(eid):
    env, p1 = _probe(eid)  # the other tests' run (one run of the probe fewer)
    _, p2 = _probe(eid, 1000)  # another key
    _probes.pop((eid, 0))
    _, p1b = _probe(eid)  # recomputed with the same key
    ep1, ep2, ep1b = p1["eps"], p2["eps"], p1b["eps"]
    for a, b in zip(jax.tree.leaves(ep1), jax.tree.leaves(ep1b)):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(ep1.obs, ep2.obs)
    np.testing.assert_allclose(ep1.reward.sum(1), ep1.episode_return, rtol=1e-4, atol=1e-4)
    length = ep1.length
    assert (length >= 1).all() and (length <= env.spec.max_steps).all()
    assert (ep1.mask.sum(1) == length).all()
    last = ep1.done | ep1.truncated
    assert (last.sum(1) == 1).all(), "exactly one ending flag per episode"
    assert last[np.arange(len(length)), length - 1].all(), "the flag is on the last valid step"
    assert not (ep1.done & ep1.truncated).any()
    if not env.spec.has_win:
        assert not ep1.won.any()
    assert np.isfinite(ep1.obs).all()
    # padding after the final observation is zero
    T = env.spec.max_steps
    pad = np.arange(T + 1)[None, :] > length[:, None]
    assert (ep1.obs[pad] == 0).all()


@pytest.mark.parametrize("eid", IDS)
def test_illegal_actions_are_mapped_never_nan(eid):
    env, p = _probe(eid)
    same, ok, obs, rew = p["ill"]
    assert same.all(), "stepping with an illegal action differs from its documented legal mapping"
    assert ok.all(), "legalize produced an action outside avail_actions / the box"
    assert np.isfinite(obs).all() and np.isfinite(rew).all()
    if not env.spec.discrete:  # every other step was all NaN
        assert np.isfinite(obs[::2]).all()


@pytest.mark.parametrize("eid", IDS)
def test_auto_reset(eid):
    env, p = _probe(eid)
    spec = env.spec
    traj = p["traj"]
    last = traj.done | traj.truncated  # [T, E]
    assert last[: spec.max_steps + 5].any(), "no episode ended within max_steps + 5 steps"
    ep_len = traj.episode_length
    # after an episode ends the next step starts a new episode at length 1
    t, e = np.nonzero(last[:-1])
    assert (ep_len[t + 1, e] == 1).all()
    cont = ~last[:-1]
    assert (ep_len[1:][cont] == ep_len[:-1][cont] + 1).all()
    ret, rew = traj.episode_return, traj.reward
    np.testing.assert_allclose(ret[1:][cont], ret[:-1][cont] + rew[1:][cont], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret[t + 1, e], rew[t + 1, e], rtol=1e-5, atol=1e-5)
    assert (ep_len <= spec.max_steps).all()
    # the policy acts on a fresh episode right after the reset: step count restarts
    assert np.isfinite(traj.obs).all()


def test_unknown_id_lists_close_matches():
    with pytest.raises(KeyError, match="smax:3m"):
        envs.make("smax:3mm")
    with pytest.raises(KeyError, match="envs.list"):
        envs.make("nope:nothing")


def test_registry_has_required_envs():
    ids = envs.list()
    for eid in ["smax:3m", "smax:2s3z", "smax:5m_vs_6m", "smax:6h_vs_8z", "smax:smacv2_5_units",
                "smax:smacv2_10_units", "smax:smacv2_20_units", "mpe:simple_spread",
                "mpe:simple_spread_continuous"]:
        assert eid in ids


def test_check_actions_errors():
    spec = _env("smax:3m").spec
    with pytest.raises(ValueError, match="3 agents"):
        envs.check_actions(spec, np.zeros((4, 5), np.int32))
    with pytest.raises(ValueError, match="outside"):
        envs.check_actions(spec, np.full((4, 3), 99, np.int32))
    avail = np.zeros((4, 3, spec.num_actions), bool)
    avail[..., 4] = True
    with pytest.raises(ValueError, match="not allowed"):
        envs.check_actions(spec, np.zeros((4, 3), np.int32), avail)
    envs.check_actions(spec, np.full((4, 3), 4, np.int32), avail)


def test_mpe_step_key_only_when_noise_is_set():
    """MPE's step uses its key only for u/c noise: without noise the adapter
    skips the per-step split and the trajectory does not depend on the key."""
    quiet = envs.make("mpe:simple_spread_continuous")
    noisy = envs.make("mpe:simple_spread_continuous", u_noise=jnp.full((3,), 0.1))
    assert not quiet.stochastic_step and noisy.stochastic_step
    key, a = jax.random.PRNGKey(0), jnp.full((3, 5), 0.7)
    state, _ = fast_call(quiet.reset, key)  # jitted: one compile instead of op-by-op
    step = fast_compile(quiet.step, state, a)
    s1, t1 = step(state, a)
    s2, t2 = step(state.replace(key=jax.random.PRNGKey(9)), a)
    np.testing.assert_array_equal(t1.obs, t2.obs)
    state, _ = fast_call(noisy.reset, key)
    step = fast_compile(noisy.step, state, a)
    _, n1 = step(state, a)
    _, n2 = step(state.replace(key=jax.random.PRNGKey(9)), a)
    assert not np.array_equal(n1.obs, n2.obs)  # the noise comes from the key


@pytest.mark.parametrize("eid", ["mpe:simple_spread", pytest.param(
    "mpe:simple_spread_continuous", marks=pytest.mark.slow)])
def test_auto_reset_observing_the_kept_state_matches_picking(eid):
    """With ``observes_state`` AutoReset observes only the state it keeps; the
    trajectory (across episode ends) equals the generic observe-both-and-pick."""
    env, p = _probe(eid)  # its rollout (AutoReset(env), random policy) is the first side
    generic = envs.make(eid)
    generic.observes_state = False
    assert env.observes_state
    pol = random_policy(env.spec)
    steps = _rollout_steps(env)
    a, key = p["traj"], p["traj_key"]
    b = fast_call(lambda k: envs.rollout(envs.AutoReset(generic), pol, None, k, ROLLOUT_ENVS, steps), key)
    assert np.asarray(a.truncated).sum() >= 8  # episode ends were crossed
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        if np.issubdtype(x.dtype, np.floating):  # XLA may fuse the obs maths differently
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("eid", IDS)
def test_step_keeps_the_state_types_of_reset(eid):
    """``step``'s output state has the shapes, dtypes and weak types of
    ``reset``'s, so ``jax.jit(env.step)`` in a Python loop compiles once. SMAX's
    reset handed on a weakly typed int (JaxMARL's enemy-policy state) that
    step returned strongly typed: the second call compiled the step again
    (3.7 s on 3m). Traced only (``eval_shape``), nothing is compiled."""
    env = _env(eid)
    key = jax.random.PRNGKey(0)
    state, ts = jax.eval_shape(env.reset, key)
    actions = jax.eval_shape(lambda ts: _random_actions(env.spec, key, ts.avail_actions), ts)
    after = jax.eval_shape(env.step, state, actions)
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path((state, ts))[0],
                            jax.tree.leaves(after)):
        assert (x.shape, x.dtype, x.weak_type) == (y.shape, y.dtype, y.weak_type), (
            jax.tree_util.keystr(path), x, y)
