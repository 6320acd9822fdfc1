"""Two tiny environments and a tiny PPO configuration shared by the teacher
tests (a helper, not a test module).

Importing this module registers ``toy:masked`` (``MaskedToy``: a masked
discrete environment) and ``toy:continuous`` (``ContinuousToy``) in
``jaxil.envs``; registering an id again only rebinds it to the same class,
so any number of test modules may import it. ``TINY`` is the small
``PPOConfig`` those tests start from, so that compilation stays short.
Used by test_teachers.py and test_irl_adversarial.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxil import envs
from jaxil.envs.core import ContinuousActions, DiscreteActions, EnvSpec, MultiAgentEnv, Step
from jaxil.teachers import PPOConfig


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
