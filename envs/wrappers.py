"""Wrappers that keep the interface: auto-reset."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from envs.core import EnvState, MultiAgentEnv, TimeStep


class AutoReset(MultiAgentEnv):
    """Resets an environment as soon as an episode ends.

    The timestep returned by the ending ``step`` carries the final transition's
    ``reward``, ``done``, ``truncated``, ``won`` and episode statistics, but the
    observation, global state and legal actions of the *new* episode's first
    step, which is what the policy acts on next (PureJaxRL/JaxMARL
    convention). Collect with :func:`envs.run_episodes` when the final
    observation itself is needed.
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
        # ``reset`` splits the key it is given, so hand it the state's key
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
