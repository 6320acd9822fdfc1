"""Wrappers that keep the interface: auto-reset, actuator noise, fixed
observation standardisation."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from .core import EnvState, MultiAgentEnv, TimeStep


class AutoReset(MultiAgentEnv):
    """Resets an environment as soon as an episode ends.

    The timestep returned by the ending `step` carries the final transition's
    `reward`, `done`, `truncated`, `won` and episode statistics, but the
    observation, global state and legal actions of the *new* episode's first
    step, which is what the policy acts on next (PureJaxRL/JaxMARL convention).
    Collect with [`envs.run_episodes`][jaxil.envs.rollout.run_episodes] when
    the final observation itself is needed.
    """

    def __init__(self, env: MultiAgentEnv):
        self.env = env
        self.spec = env.spec

    def __repr__(self) -> str:
        return f"AutoReset({self.env!r})"

    def reset(self, key: jax.Array) -> tuple[EnvState, TimeStep]:
        return self.env.reset(key)

    def legalize(self, actions, avail_actions):
        return self.env.legalize(actions, avail_actions)

    def step(self, state: EnvState, actions: jax.Array) -> tuple[EnvState, TimeStep]:
        state, ts = self.env.step(state, actions)
        # `reset` splits the key it is given, so hand it the state's key
        # directly: when the episode goes on, the reset is discarded (the next
        # step's split of the same key is the only draw that is used); when it
        # ends, the old key is dropped with the old state. One split per step
        # fewer, which is visible on cheap envs (MPE).
        reset_state, reset_ts = self.env.reset(state.key)
        last = ts.last()

        def pick(a, b):
            return jnp.where(last, a, b)

        state = jax.tree.map(pick, reset_state, state)
        if self.env.observes_state:
            # Observe only the state kept: the stepped and the reset
            # observations are then dead code that XLA removes.
            obs, global_state, avail = self.env.observation(*self.env._observe(state.inner))
            state = state.replace(avail_actions=self.env._kept_avail(avail))
            return state, ts.replace(obs=obs, global_state=global_state, avail_actions=avail)
        ts = ts.replace(
            obs=pick(reset_ts.obs, ts.obs),
            global_state=pick(reset_ts.global_state, ts.global_state),
            # always all-True when every action is legal: no select needed
            avail_actions=ts.avail_actions
            if self.env.all_actions_available
            else pick(reset_ts.avail_actions, ts.avail_actions),
        )
        return state, ts


class ActionNoise(MultiAgentEnv):
    """Noisy actuators on a box action space: every action component the
    environment executes is the one handed to `step` plus Gaussian noise of
    standard deviation `sigma × (high − low)`, clipped to the box.

    The caller's (intended) action is what a rollout records, so data
    collected through this wrapper are DART demonstrations (Laskey et al.,
    2017: noise injected into the executed actions, the demonstrator's
    clean action at every state it visited). They are exact samples of the
    noisy-actuator MDP, whose transition from `(s, a)` is the original
    one from `(s, clip(a + noise))`; the original environment is the case
    `sigma = 0`. The noise key is split from the state's key, so the state
    keeps its structure and types (`EnvState` of the wrapped env).
    """

    def __init__(self, env: MultiAgentEnv, sigma: float):
        if env.spec.discrete:
            raise ValueError(f"action noise needs a box action space; {env.spec.env_id} has "
                             f"{env.spec.action.num_actions} discrete actions")
        if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) \
                or not math.isfinite(sigma) or sigma < 0:
            raise ValueError(f"action noise sigma must be a finite number >= 0, got {sigma!r}")
        self.env = env
        self.spec = env.spec
        self.sigma = float(sigma)
        self.observes_state = env.observes_state

    def __repr__(self) -> str:
        return f"ActionNoise({self.env!r}, sigma={self.sigma:g})"

    def reset(self, key: jax.Array) -> tuple[EnvState, TimeStep]:
        return self.env.reset(key)

    def legalize(self, actions, avail_actions):
        return self.env.legalize(actions, avail_actions)

    def _observe(self, inner):
        return self.env._observe(inner)

    def observation(self, obs, global_state, avail_actions):
        return self.env.observation(obs, global_state, avail_actions)

    def _kept_avail(self, avail):
        return self.env._kept_avail(avail)

    def step(self, state: EnvState, actions: jax.Array) -> tuple[EnvState, TimeStep]:
        actions = self.env.legalize(actions, state.avail_actions)
        key, noise_key = jax.random.split(state.key)
        scale = self.sigma * (self.spec.action.high - self.spec.action.low)
        noisy = actions + scale * jax.random.normal(noise_key, actions.shape, jnp.float32)
        return self.env.step(state.replace(key=key), noisy)  # the inner step clips to the box


class StandardizeObservations(MultiAgentEnv):
    """Observations and global states standardised by fixed statistics:
    `(obs − obs_mean) / obs_std` per feature, and likewise the state.

    The offline recipe of D4RL-style learners (TD3+BC, IQL in CORL): a learner
    trained on a dataset standardised by its own statistics
    ([`jaxil.data.standardize`][jaxil.data.standardize]) acts in the
    environment through this wrapper with the same statistics. Rewards, ends
    and actions are the wrapped environment's; the statistics are constants,
    not running estimates.
    """

    def __init__(self, env: MultiAgentEnv, obs_mean, obs_std, state_mean, state_std):
        spec = env.spec
        shapes = dict(obs_mean=(spec.obs_dim,), obs_std=(spec.obs_dim,),
                      state_mean=(spec.state_dim,), state_std=(spec.state_dim,))
        values = dict(obs_mean=obs_mean, obs_std=obs_std, state_mean=state_mean, state_std=state_std)
        stats = {}
        for name, shape in shapes.items():
            x = jnp.asarray(values[name], jnp.float32)
            if x.shape != shape:
                raise ValueError(f"StandardizeObservations: {name} has shape {x.shape}, the "
                                 f"environment's {'observation' if 'obs' in name else 'state'} "
                                 f"needs {shape}")
            if not bool(jnp.all(jnp.isfinite(x))) or ("std" in name and not bool(jnp.all(x > 0))):
                raise ValueError(f"StandardizeObservations: {name} must be finite"
                                 f"{' and > 0' if 'std' in name else ''}")
            stats[name] = x
        self.env = env
        self.spec = spec
        self.observes_state = env.observes_state
        self.stats = stats

    def __repr__(self) -> str:
        return f"StandardizeObservations({self.env!r})"

    def _standardize(self, ts: TimeStep) -> TimeStep:
        s = self.stats
        return ts.replace(obs=(ts.obs - s["obs_mean"]) / s["obs_std"],
                          global_state=(ts.global_state - s["state_mean"]) / s["state_std"])

    def reset(self, key: jax.Array) -> tuple[EnvState, TimeStep]:
        state, ts = self.env.reset(key)
        return state, self._standardize(ts)

    def step(self, state: EnvState, actions: jax.Array) -> tuple[EnvState, TimeStep]:
        state, ts = self.env.step(state, actions)
        return state, self._standardize(ts)

    def legalize(self, actions, avail_actions):
        return self.env.legalize(actions, avail_actions)

    def _kept_avail(self, avail):
        return self.env._kept_avail(avail)

    def _observe(self, inner):
        obs, gs, avail = self.env._observe(inner)
        s = self.stats
        return (obs - s["obs_mean"]) / s["obs_std"], (gs - s["state_mean"]) / s["state_std"], avail

    def observation(self, obs, global_state, avail_actions):
        return self.env.observation(obs, global_state, avail_actions)
