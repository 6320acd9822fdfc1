import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.envs.core import DiscreteActions, EnvSpec, MultiAgentEnv, Step
from jaxil.envs.policies import as_policy, epsilon_mixture, random_policy
from jaxil.envs.smax import heuristic_policy
from helpers.fast_compile import fast_call

EPISODES = 256  # per policy; one compiled program per policy for the module


@functools.lru_cache(maxsize=None)
def _smax_3m():
    return envs.make("smax:3m")


@functools.lru_cache(maxsize=None)
def _episodes(kind: str, seed: int = 0):
    """``EPISODES`` SMAX 3m episodes of the heuristic, the random policy or
    their ε = 0.5 mixture, from ``PRNGKey(seed)`` (compiled once per kind, at
    XLA's level 0: fast_compile.py)."""
    env = _smax_3m()
    pol = {"heuristic": lambda: heuristic_policy(env),
           "random": lambda: random_policy(env.spec),
           "half": lambda: epsilon_mixture(heuristic_policy(env), env.spec, 0.5)}[kind]()
    return fast_call(lambda k: envs.run_episodes(env, pol, None, k, EPISODES),
                     jax.random.PRNGKey(seed))


@pytest.mark.slow  # default-suite time (about 29 s of compile); run with -m slow
def test_smax_heuristic_beats_random_on_3m():
    heur, rand = _episodes("heuristic"), _episodes("random")
    h_ret, r_ret = float(heur.episode_return.mean()), float(rand.episode_return.mean())
    h_win, r_win = float(heur.won.mean()), float(rand.won.mean())
    # a wide margin: several standard errors apart, and the heuristic wins games
    se = np.sqrt(np.var(heur.episode_return) / EPISODES + np.var(rand.episode_return) / EPISODES)
    assert h_ret - r_ret > 10 * se, (h_ret, r_ret, se)
    assert h_ret > 3 * r_ret
    assert h_win > 0.3 and h_win > r_win + 0.25


def test_random_policy_respects_avail_and_box():
    env = envs.make("smax:3m")
    pol = random_policy(env.spec)
    avail = jnp.zeros((3, env.spec.num_actions), bool).at[:, 4].set(True).at[0, 6].set(True)
    a = jax.vmap(lambda k: pol(None, None, avail, k))(jax.random.split(jax.random.PRNGKey(0), 200))
    assert set(np.unique(a[:, 1]).tolist()) == {4}
    assert set(np.unique(a[:, 0]).tolist()) == {4, 6}
    cenv = envs.make("mpe:simple_spread_continuous")
    cp = random_policy(cenv.spec)
    ca = cp(None, None, None, jax.random.PRNGKey(1))
    assert ca.shape == (3, 5) and (ca >= 0).all() and (ca <= 1).all()


def test_epsilon_mixture_rates():
    env = envs.make("smax:3m")
    spec = env.spec
    expert = lambda p, o, av, k: jnp.full((spec.num_agents,), 4, jnp.int32)
    avail = jnp.ones((3, spec.num_actions), bool)
    for eps, lo, hi in [(0.0, 1.0, 1.0), (1.0, 0.05, 0.25), (0.5, 0.5, 0.65)]:
        pol = epsilon_mixture(expert, spec, eps)
        keys = jax.random.split(jax.random.PRNGKey(0), 2000)
        a, _ = jax.vmap(lambda k: pol.act(None, None, avail, k, pol.init(k, 3)))(keys)
        frac_expert = float((a == 4).mean())
        # random picks 4 with prob 1/8 too
        assert lo <= frac_expert <= hi, (eps, frac_expert)
    import pytest

    with pytest.raises(ValueError, match="epsilon"):
        epsilon_mixture(expert, spec, 1.5)


@pytest.mark.slow  # three SMAX rollout compiles; test_epsilon_mixture_rates covers the mixing by default
def test_epsilon_mixture_of_heuristic_interpolates():
    """Half-noised heuristic lies strictly between random and the heuristic
    (same episode keys for all three)."""
    full, half, rand = (float(_episodes(k).episode_return.mean())
                        for k in ("heuristic", "half", "random"))
    assert rand < half < full


def test_as_policy_rejects_non_callables():
    import pytest

    with pytest.raises(TypeError, match="policy must be"):
        as_policy(3)


@pytest.mark.slow  # default-suite time (about 25 s of compile); run with -m slow
def test_quickstart_cli_flags(capsys):
    """`jaxil quickstart` accepts its own flags (the policy table only here)."""
    from jaxil.cli.main import main

    assert main(["quickstart", "--skip-learning", "--envs", "smax:3m", "--episodes", "4"]) == 0
    out = capsys.readouterr().out
    assert "heuristic" in out and "random" in out and "SMAX 3m dataset" not in out


class _EndsEarly(MultiAgentEnv):
    """Two agents; the episode ends (``done``) once agent 0 picks action 0 of
    8, so random episodes have varied lengths, most below ``max_steps``; the
    observation carries the step counter and a per-step random draw (a key
    handed to the wrong step or episode changes it)."""

    def __init__(self):
        self.spec = EnvSpec("test:ends_early", num_agents=2, obs_dim=3, state_dim=3,
                            action=DiscreteActions(8, noop_action=None), max_steps=24)

    def _draw(self, key, t, reward=0.0, done=False):
        u = jax.random.uniform(key, (2,))
        obs = jnp.stack([jnp.full((2,), t / 24.0), u, 1.0 - u], axis=-1)
        return Step(inner=jnp.int32(t), obs=obs, global_state=obs[0],
                    avail_actions=jnp.ones((2, 8), bool), reward=reward, done=done,
                    truncated=t >= 24)

    def _reset(self, key):
        return self._draw(key, 0)

    def _step(self, key, t, actions):
        return self._draw(key, t + 1, jnp.sum(actions).astype(jnp.float32),
                          actions[0] == 0)


def test_run_episodes_matches_a_step_by_step_reference_and_stops_early():
    """``run_episodes`` (a while loop that stops when every episode has ended)
    against a plain Python loop over ``env.step`` with the same keys, for
    episode ``i`` of the batch (a key handed to the wrong episode, an
    off-by-one at the end or garbage in the padding fails). The environment
    is a small one whose random episodes end early: the rollout is generic,
    and SMAX's own ``run_episodes`` is checked by the conformance suite."""
    env = _EndsEarly()
    pol = random_policy(env.spec)
    i, n = 3, 16
    key = jax.random.PRNGKey(0)
    eps = jax.tree.map(lambda x: x[i:i + 1],
                       jax.jit(lambda k: envs.run_episodes(env, pol, None, k, n))(key))
    reset_key, _, run_key = jax.random.split(key, 3)
    state, ts = env.reset(jax.random.split(reset_key, n)[i])

    @jax.jit
    def act_and_step(state, ts, k):
        a = pol(None, ts.obs, ts.avail_actions, jax.random.split(k, n)[i])
        return a, *env.step(state, a)

    obs, actions, rewards = [ts.obs], [], []
    for k in jax.random.split(run_key, env.spec.max_steps):
        a, state, ts = act_and_step(state, ts, k)
        obs.append(ts.obs), actions.append(a), rewards.append(ts.reward)
        if ts.last():
            break
    length = len(actions)
    assert 1 < length < env.spec.max_steps // 2  # random episodes end early
    assert int(eps.length[0]) == length
    np.testing.assert_array_equal(eps.actions[0, :length], np.stack(actions))
    np.testing.assert_allclose(eps.reward[0, :length], np.array(rewards), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(eps.obs[0, : length + 1], np.stack(obs), rtol=1e-6, atol=1e-6)
    # padding after the end: zeros, masked out
    assert not eps.mask[0, length:].any() and not np.asarray(eps.actions[0, length:]).any()
    assert not np.asarray(eps.obs[0, length + 1:]).any()


# ------------------------------------------------ box heads of jaxil.nn.policy.PolicyNet


def _box_spec(low=0.0, high=1.0, dim=2):
    from jaxil.envs.core import ContinuousActions, EnvSpec

    return EnvSpec("test:box", num_agents=3, obs_dim=4, state_dim=4,
                   action=ContinuousActions(dim=dim, low=low, high=high), max_steps=10)


def test_policy_box_head_defaults_and_bad_choices():
    """Learners' policies (log-std from the network) default to the censored
    Gaussian; PPO teachers (log-std parameter) keep the tanh-Gaussian their
    shipped checkpoints were trained with (a default flipped for teachers
    would make every shipped MPE/MABrax teacher act differently); unknown or
    impossible heads are refused with the fix named."""
    from jaxil.algorithms.offline import make_learner
    from jaxil.nn.policy import PolicyNet
    from jaxil.teachers import PPOConfig, make_actor

    spec = _box_spec()
    assert PolicyNet(spec, (8,)).box == "censored_gaussian"
    assert PolicyNet(spec, (8,), log_std="param").box == "tanh_gaussian"
    assert make_actor(spec, PPOConfig(hidden_sizes=(8,))).box == "tanh_gaussian"
    assert PolicyNet(envs.make("smax:3m").spec, (8,), box="beta").box is None  # discrete: no box head
    with pytest.raises(ValueError, match="box must be one of"):
        PolicyNet(spec, (8,), box="gaussian")
    with pytest.raises(ValueError, match='log_std="state"'):
        PolicyNet(spec, (8,), box="beta", log_std="param")
    # BC's student on a box environment acts under the censored head: its
    # deterministic action is the clipped mean, not the squashed one.
    learner = make_learner("bc_expert", spec, hidden=(8,))
    params = jax.tree.map(lambda x: 20.0 * x, learner.init(jax.random.PRNGKey(0)).params)
    obs = jnp.asarray(np.random.default_rng(0).normal(size=(3, 4)), jnp.float32)
    a = np.asarray(learner.act(params, obs, None, jax.random.PRNGKey(1), True))
    assert np.any(a == 0.0) or np.any(a == 1.0), a  # a tanh would never reach a bound exactly


@pytest.mark.parametrize("box", ["censored_gaussian", "tanh_gaussian",
                                 pytest.param("beta", marks=pytest.mark.slow)])  # beta: ~15 s compiling its gamma sampler
def test_policy_box_heads_score_what_they_sample(box):
    """For every box head, ``log_prob`` is the law ``act`` samples from (a
    head sampled one way and scored another, or a density on the wrong
    interval, fails): a histogram of the sampled actions matches the density
    integrated over each bin, and the censored head puts probability
    exp(log_prob(bound)) on each bound; the raw log-probability PPO would use
    for the censored head is the pre-clip Gaussian's of the draw."""
    from jaxil.nn import distributions as D
    from jaxil.nn.policy import PolicyNet

    low, high = -1.0, 2.0
    spec = _box_spec(low, high, dim=1)
    obs = jnp.asarray(np.random.default_rng(1).normal(size=(3, 4)), jnp.float32)
    keys = jax.random.split(jax.random.PRNGKey(2), 10_000)
    edges = np.linspace(low, high, 16)
    fine = np.linspace(low + 1e-4, high - 1e-4, 3001)
    net = PolicyNet(spec, (16,), box=box)
    params = jax.tree.map(lambda x: 2.0 * x, fast_call(net.init, jax.random.PRNGKey(3)))
    acts = np.asarray(jax.jit(jax.vmap(lambda k: net.act(params, obs, None, k)))(keys))[..., 0]
    assert np.all(acts >= low) and np.all(acts <= high), box
    # the density on a fine grid, then at the two bounds (one jitted program)
    grid = jnp.broadcast_to(jnp.asarray(np.r_[fine, low, high], jnp.float32)[:, None, None],
                            (fine.size + 2, 3, 1))
    dens = np.exp(np.asarray(jax.jit(jax.vmap(lambda a: net.log_prob(params, obs, None, a)))(grid),
                             np.float64))
    dens, at_bound = dens[:-2], dens[-2:]
    for i in range(3):
        cdf = np.concatenate([[0.0], np.cumsum((dens[1:, i] + dens[:-1, i]) / 2 * np.diff(fine))])
        p_bins = np.diff(np.interp(edges, fine, cdf))
        interior = (acts[:, i] > low) & (acts[:, i] < high)
        freq = np.histogram(acts[interior, i], edges)[0] / len(keys)
        se = np.sqrt(p_bins * (1 - p_bins) / len(keys))
        # (the two end bins left out: the Beta's density may be singular at a
        # bound, beyond what the trapezoid integrates)
        ok = np.abs(freq - p_bins) < 5 * se + 3e-3
        assert np.all(ok[1:-1]), (box, i, freq, p_bins)
    if box == "censored_gaussian":
        for bound, p in zip((low, high), at_bound):
            freq = (acts == bound).mean(0)
            assert np.all(np.abs(freq - p) < 5 * np.sqrt(p * (1 - p) / len(keys)) + 2e-3), (bound, freq, p)
        raw, lp = net.sample_raw(params, obs, None, keys[0])
        mean, log_std = net.head(params, obs)
        np.testing.assert_allclose(np.asarray(lp), np.asarray(D.gaussian_log_prob(mean, log_std, raw)),
                                   rtol=1e-6)
        np.testing.assert_allclose(np.asarray(net.to_env_action(raw)), np.clip(np.asarray(raw), low, high))
