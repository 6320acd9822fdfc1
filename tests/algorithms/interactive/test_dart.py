"""DART collection: :class:`envs.ActionNoise` and the ``-dart<σ>`` recipes.

The wrapper is checked on an echo environment whose observation is the action
it last executed, so the executed noise is read off exactly; the recipe on a
tiny MPE spread build (as ``test_recipes.py``: 4 expert + 8 poor episodes of
10 steps, scripted expert).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.envs.core import ContinuousActions, DiscreteActions, EnvSpec, MultiAgentEnv, Step
from jaxil.envs.policies import as_policy
from jaxil.cli.main import main
from jaxil.collect import recipes as rc
from jaxil.collect.zoo import make_zoo

from helpers.fast_compile import fast_call

ENV_ID = "mpe:simple_spread_continuous"
ENV_KW = {"max_steps": 10}
TINY = dict(counts={"expert": 4, "poor": 8}, env_kwargs=ENV_KW, discover_teachers=False,
            chunk_size=8, progress=False, measure_episodes=8)


class Echo(MultiAgentEnv):
    """Two agents, a box ``[-2, 2]^3``; the observation is the executed action."""

    stochastic_step = False

    def __init__(self, low=-2.0, high=2.0):
        self.spec = EnvSpec("test:echo", 2, 3, 6, ContinuousActions(3, low, high), 5)

    def _reset(self, key):
        z = jnp.zeros((2, 3))
        return Step(jnp.zeros(()), z, z.reshape(-1), jnp.zeros((2, 0), bool))

    def _step(self, key, inner, actions):
        return Step(inner + 1, actions, actions.reshape(-1), jnp.zeros((2, 0), bool))


def _executed(env, action, n=4096):
    """What ``env`` executes for ``action``, over ``n`` independent steps
    (jitted, at XLA's level 0: fast_compile.py)."""
    def one(k):
        s, _ = env.reset(k)
        return env.step(s, action)[1].obs
    return np.asarray(fast_call(jax.vmap(one), jax.random.split(jax.random.PRNGKey(0), n)))


def test_action_noise_scale_is_sigma_times_the_box_width_and_stays_in_the_box():
    """Executed − intended has mean 0 and std σ·(high − low) away from the
    bounds, and is clipped at them. Kills: noise not scaled by the box width
    (std 0.1 instead of 0.4 here), σ ignored, a biased noise, no clip, and a
    wrapper that noises nothing (std 0)."""
    base = Echo()
    centre = jnp.zeros((2, 3))
    got = _executed(envs.ActionNoise(base, 0.1), centre) - 0.0
    assert abs(got.mean()) < 0.01
    np.testing.assert_allclose(got.std(), 0.1 * 4.0, rtol=0.03)
    np.testing.assert_array_equal(_executed(envs.ActionNoise(base, 0.0), centre), 0.0)
    edge = jnp.full((2, 3), 2.0)
    hi = _executed(envs.ActionNoise(base, 0.5), edge)
    assert hi.max() <= 2.0 and hi.min() >= -2.0
    assert 0.45 < (hi == 2.0).mean() < 0.55  # half the mass clipped onto the bound


def test_action_noise_is_jittable_with_the_state_types_of_reset_and_records_the_intent():
    """A rollout records the caller's action (DART), and the step keeps the
    state's structure and dtypes. Kills: recording the executed (noisy)
    action, and a key of another shape or type in the state (a second
    compile of every jitted step loop)."""
    env = envs.ActionNoise(Echo(), 0.3)
    s0, _ = jax.eval_shape(env.reset, jax.random.PRNGKey(0))
    s1, _ = jax.eval_shape(env.step, s0, jnp.zeros((2, 3)))
    assert jax.tree.map(lambda a: (a.shape, a.dtype), s0) == \
        jax.tree.map(lambda a: (a.shape, a.dtype), s1)
    const = as_policy(lambda params, obs, avail, key: jnp.full((2, 3), 0.5))
    ep = fast_call(lambda k: envs.run_episodes(env, const, None, k, 3), jax.random.PRNGKey(1))
    np.testing.assert_array_equal(ep.actions, 0.5)
    executed = np.asarray(ep.obs[:, 1:])  # Echo observes what ran
    assert np.abs(executed - 0.5).mean() > 0.1


def test_action_noise_refuses_discrete_actions_and_bad_sigmas():
    """One clear error each, instead of noise on action indices or a silent NaN."""
    disc = Echo()
    disc.spec = EnvSpec("test:disc", 2, 3, 6, DiscreteActions(4), 5)
    with pytest.raises(ValueError, match="box action space"):
        envs.ActionNoise(disc, 0.5)
    for bad in (-0.1, float("nan"), float("inf"), True, "0.5"):
        with pytest.raises(ValueError, match="sigma must be a finite number >= 0"):
            envs.ActionNoise(Echo(), bad)


@pytest.fixture(scope="module")
def dart_and_plain():
    name = "mpe-simple_spread_continuous/misodice-200e-1000p"
    return rc.build(f"{name}-dart0.8", 0, **TINY), rc.build(name, 0, **TINY)


@pytest.mark.slow  # default-suite time (builds two recipes, ~25 s); run with -m slow
def test_dart_recipe_records_the_clean_expert_action_on_pushed_states(dart_and_plain):
    """Every recorded expert action is the scripted expert's clean action at
    the recorded observation, while the states are those of a pushed rollout
    (they differ from the plain build of the same episode seeds). Kills:
    recording the executed action; the suffix parsed but no noise applied
    (identical states)."""
    dart, plain = dart_and_plain
    zoo = make_zoo(ENV_ID, env_kwargs=ENV_KW, discover=False)
    pol = as_policy(zoo["expert"].policy)
    idx = np.flatnonzero(dart.expert)
    obs = jnp.asarray(dart.obs[idx, :-1])
    clean = jax.jit(jax.vmap(jax.vmap(lambda o: pol.act(zoo["expert"].params, o, None,
                                                         jax.random.PRNGKey(0), None)[0])))(obs)
    np.testing.assert_allclose(np.asarray(clean), dart.actions[idx], atol=1e-6)
    same = {int(s): i for i, s in enumerate(plain.seed)}
    j = [same[int(s)] for s in dart.seed[idx]]
    assert np.abs(dart.obs[idx] - plain.obs[j]).mean() > 1e-2
    assert dart.episode_return[idx].mean() < plain.episode_return[j].mean()  # pushes cost reward


@pytest.mark.slow  # default-suite time; run with -m slow
def test_dart_recipe_measures_tiers_without_noise_and_records_sigma(dart_and_plain):
    """The tier returns that normalise every score are those of the
    noise-free environment the learners are evaluated in, identical to the
    plain build's; the creation args name σ, and a plain build has no such key
    (so plain datasets stay byte-identical to earlier builds). Kills: tiers
    measured through the noise, and a lost or always-present record."""
    dart, plain = dart_and_plain
    assert dart.info.creation_args["tier_measurements"] == plain.info.creation_args["tier_measurements"]
    assert dart.info.creation_args["action_noise"]["sigma"] == 0.8
    assert "action_noise" not in plain.info.creation_args
    assert dart.info.recipe.endswith("-dart0.8")
    assert rc.get_recipe(dart.info.recipe).default_path() != rc.get_recipe(plain.info.recipe).default_path()


def test_dart_suffix_is_refused_on_discrete_envs_and_without_noise(capsys):
    """One line each, exit 1, nothing built: a discrete environment, and a
    zero noise level (which would silently be the plain recipe under
    another name)."""
    with pytest.raises(KeyError, match="noise level > 0"):
        rc.get_recipe("mpe-simple_spread_continuous/expert-dart0")
    assert main(["data", "build", "mpe-simple_spread/mix-2e-dart0.5", "--no-teacher",
                 "--quiet", "--measure-episodes", "0"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "discrete actions" in err and "Traceback" not in err
