"""JaxMARL MPE ``simple_spread`` adapter, with discrete or continuous actions.

Ids: ``mpe:simple_spread`` (5 discrete actions; 0 = no-op) and
``mpe:simple_spread_continuous`` (a 5-d box ``[0, 1]^5``: no-op, -x, +x, -y,
+y forces). Keyword overrides go to JaxMARL (``num_agents``,
``num_landmarks``, ``local_ratio``, ``max_steps``).

- team reward: the mean over agents of JaxMARL's per-agent reward (which is
  already half shared coverage reward, half own collision penalty).
- global state: all entity positions ``[(N + L) * 2]`` followed by the agents'
  velocities ``[N * 2]`` (MPE has no world-state feature of its own).
- done is never set: episodes end by the time limit (truncated).
- no win condition.
- the step is deterministic given the state unless ``u_noise``/``c_noise`` are
  set, so it gets no key of its own then (``stochastic_step``).
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
import numpy as np

from envs.core import ContinuousActions, DiscreteActions, EnvSpec, MultiAgentEnv, Step
from envs.registry import register

try:
    from jaxmarl.environments.mpe.default_params import CONTINUOUS_ACT, DISCRETE_ACT
    from jaxmarl.environments.mpe.simple_spread import SimpleSpreadMPE
except ImportError as e:  # pragma: no cover - jaxmarl is a core dependency
    raise ImportError("the MPE adapter needs jaxmarl: pip install jaxmarl") from e


class SpreadEnv(MultiAgentEnv):
    all_actions_available = True  # MPE has no illegal actions

    def __init__(self, continuous: bool = False, **kwargs):
        self.raw = SimpleSpreadMPE(
            action_type=CONTINUOUS_ACT if continuous else DISCRETE_ACT, **kwargs
        )
        n, lm = self.raw.num_agents, self.raw.num_landmarks
        # The step draws action and communication noise, scaled by u_noise /
        # c_noise (0 by default): with both zero it does not depend on its key,
        # and ``step`` skips the per-step key split (visible on this cheap env).
        self.stochastic_step = bool(
            np.any(np.asarray(self.raw.u_noise) != 0) or np.any(np.asarray(self.raw.c_noise) != 0)
        )
        a0 = self.raw.agents[0]
        if continuous:
            space = ContinuousActions(dim=5, low=0.0, high=1.0)
            name = "mpe:simple_spread_continuous"
        else:
            space = DiscreteActions(5, noop_action=0)
            name = "mpe:simple_spread"
        self.spec = EnvSpec(
            env_id=name,
            num_agents=n,
            obs_dim=int(self.raw.observation_spaces[a0].shape[0]),
            state_dim=2 * (n + lm) + 2 * n,
            action=space,
            # JaxMARL ends the episode on the step taken at step == max_steps.
            max_steps=int(self.raw.max_steps) + 1,
            has_win=False,
        )

    observes_state = True  # JaxMARL's reset/step_env return get_obs(state)

    def _observe(self, inner):
        n = self.spec.num_agents
        obs = self.raw.get_obs(inner)
        gs = jnp.concatenate([inner.p_pos.reshape(-1), inner.p_vel[:n].reshape(-1)])
        return jnp.stack([obs[a] for a in self.raw.agents]), gs, jnp.ones((n, 5), jnp.bool_)

    def _out(self, inner, reward=0.0, done=False) -> Step:
        obs, gs, avail = self._observe(inner)
        return Step(inner, obs, gs, avail, reward=reward, done=False, truncated=done)

    def _reset(self, key):
        _, inner = self.raw.reset(key)
        return self._out(inner)

    def _step(self, key, inner, actions):
        act = {a: actions[i] for i, a in enumerate(self.raw.agents)}
        _, inner, rewards, dones, _ = self.raw.step_env(key, inner, act)
        reward = jnp.mean(jnp.stack([rewards[a] for a in self.raw.agents]))
        return self._out(inner, reward, dones["__all__"])


register("mpe:simple_spread", partial(SpreadEnv, False))
register("mpe:simple_spread_continuous", partial(SpreadEnv, True))
