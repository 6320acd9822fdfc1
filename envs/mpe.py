"""JaxMARL MPE `simple_spread` adapter, with discrete or continuous actions.

Ids: `mpe:simple_spread` (5 discrete actions; 0 = no-op) and
`mpe:simple_spread_continuous` (a 5-d box `[0, 1]^5`: no-op, -x, +x, -y,
+y forces). Keyword overrides go to JaxMARL (`num_agents`,
`num_landmarks`, `local_ratio`, `max_steps` and the physics of `KEYWORDS`);
a keyword JaxMARL would ignore is a `TypeError`.

- team reward: the mean over agents of JaxMARL's per-agent reward (which is
  already half shared coverage reward, half own collision penalty).
- global state: all entity positions `[(N + L) * 2]` followed by the agents'
  velocities `[N * 2]` (MPE has no world-state feature of its own).
- done is never set: episodes end by the time limit (truncated).
- no win condition.
- the step is deterministic given the state unless `u_noise`/`c_noise` are
  set, so it gets no key of its own then (`stochastic_step`).

[`spread_expert`][jaxil.envs.mpe.spread_expert] is a scripted expert for both
ids (landmark assignment and dead-beat velocity control).
"""

from __future__ import annotations

import itertools
import math
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ._jaxmarl import import_jaxmarl
from .core import ContinuousActions, DiscreteActions, EnvSpec, MultiAgentEnv, Step
from .registry import register

try:
    import_jaxmarl("mpe.default_params", "mpe.simple_spread")
    from jaxmarl.environments.mpe.default_params import CONTINUOUS_ACT, DISCRETE_ACT
    from jaxmarl.environments.mpe.simple_spread import SimpleSpreadMPE
except ImportError as e:  # pragma: no cover - jaxmarl is a core dependency
    raise ImportError("the MPE adapter needs jaxmarl: pip install jaxmarl") from e


#: The keywords JaxMARL's `SimpleSpreadMPE` reads: its own, and those its base
#: class takes by name or picks out of `**kwargs` (`rad` and `collide` it sets
#: itself). It ignores any other silently, so the adapter refuses them.
KEYWORDS = ("num_agents", "num_landmarks", "local_ratio", "max_steps", "dt", "moveable", "silent",
            "mass", "accel", "max_speed", "u_noise", "c_noise", "damping", "contact_force",
            "contact_margin")


class SpreadEnv(MultiAgentEnv):
    all_actions_available = True  # MPE has no illegal actions

    def __init__(self, continuous: bool = False, **kwargs):
        unknown = sorted(set(kwargs) - set(KEYWORDS))
        if unknown:
            name = "mpe:simple_spread" + ("_continuous" if continuous else "")
            raise TypeError(f"{name} got unexpected keyword argument(s) "
                            f"{', '.join(map(repr, unknown))}; accepted: {', '.join(KEYWORDS)}")
        self.raw = SimpleSpreadMPE(
            action_type=CONTINUOUS_ACT if continuous else DISCRETE_ACT, **kwargs
        )
        n, lm = self.raw.num_agents, self.raw.num_landmarks
        # The step draws action and communication noise, scaled by u_noise /
        # c_noise (0 by default): with both zero it does not depend on its key,
        # and `step` skips the per-step key split (visible on this cheap env).
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


def spread_expert(env: MultiAgentEnv, horizon: float = 2.0) -> Callable:
    """Scripted expert for MPE `simple_spread` (continuous or discrete).

    Every agent rebuilds the whole layout from its OWN observation
    `[vel (2), pos (2), landmarks - pos (2L), others - pos (2(N-1)), comm]`
    (other agents in index order), solves the same agent→landmark assignment
    (minimum total distance, exhaustively over all injective maps when there
    are at most 40 320 of them, greedily otherwise) and steers to its landmark
    with a dead-beat velocity controller: MPE integrates `p += 0.1 v` then
    `v = 0.75 v + 0.5 u` (`u` the net force in `[-1, 1]^2`), so it asks for
    the velocity that closes the remaining gap in `horizon` steps and applies
    the force that gets there, clipped. Continuous actions encode `u` as
    `(0, u_x^-, u_x^+, u_y^-, u_y^+)`; discrete ones take the dominant axis
    (no-op when the force is small). Agents without a landmark (N > L) hold
    still. Collisions are not planned around.
    """
    raw = getattr(env, "raw", None)
    if raw is None or not hasattr(raw, "num_landmarks") or not env.spec.env_id.startswith(
        "mpe:simple_spread"
    ):
        raise TypeError(f"spread_expert needs an mpe:simple_spread environment, got {env!r}")
    N, L = int(raw.num_agents), int(raw.num_landmarks)
    damping, dt = float(raw.damping), float(raw.dt)
    accel = float(np.asarray(raw.accel)[0])
    gain = accel * dt  # velocity change per unit force per step
    spec = env.spec
    small, large = (N, L) if N <= L else (L, N)
    exhaustive = math.perm(large, small) <= 40_320
    if exhaustive:
        maps = jnp.array(list(itertools.permutations(range(large), small)), jnp.int32)

    def assignment(cost):  # cost [N, L] -> landmark of each agent (-1: none)
        if exhaustive:
            if N <= L:
                total = cost[jnp.arange(N)[None], maps].sum(-1)  # maps: agent -> landmark
                return maps[jnp.argmin(total)]
            total = cost[maps, jnp.arange(L)[None]].sum(-1)  # maps: landmark -> agent
            best = maps[jnp.argmin(total)]
            return jnp.full((N,), -1, jnp.int32).at[best].set(jnp.arange(L, dtype=jnp.int32))
        out = jnp.full((N,), -1, jnp.int32)
        c = cost
        for _ in range(small):  # globally nearest free pair first
            k = jnp.argmin(c)
            a, l = k // L, k % L
            out = out.at[a].set(l)
            c = c.at[a, :].set(jnp.inf).at[:, l].set(jnp.inf)
        return out

    def agent_force(i, o):
        vel, pos = o[0:2], o[2:4]
        lm = pos + o[4:4 + 2 * L].reshape(L, 2)
        others = pos + o[4 + 2 * L:4 + 2 * L + 2 * (N - 1)].reshape(N - 1, 2)
        j = jnp.arange(N)
        agents = jnp.where(
            (j == i)[:, None], pos, others[jnp.clip(j - (j > i), 0, N - 2)]
        ) if N > 1 else pos[None]
        cost = jnp.linalg.norm(agents[:, None, :] - lm[None, :, :], axis=-1)
        target = assignment(cost)[i]
        gap = lm[jnp.maximum(target, 0)] - (pos + dt * vel)
        v_star = gap / (dt * horizon)
        u = jnp.clip((v_star - (1.0 - damping) * vel) / gain, -1.0, 1.0)
        return jnp.where(target >= 0, u, jnp.clip(-(1.0 - damping) * vel / gain, -1.0, 1.0))

    def act(params, obs, avail, key):
        u = jax.vmap(agent_force)(jnp.arange(N), obs)  # [N, 2]
        if spec.discrete:
            ax = jnp.argmax(jnp.abs(u), axis=-1)
            val = jnp.take_along_axis(u, ax[:, None], -1)[:, 0]
            a = 1 + 2 * ax + (val > 0)  # 1: -x, 2: +x, 3: -y, 4: +y
            return jnp.where(jnp.abs(val) < 0.05, 0, a).astype(jnp.int32)
        zero = jnp.zeros((N, 1), jnp.float32)
        pos_u, neg_u = jnp.maximum(u, 0.0), jnp.maximum(-u, 0.0)
        out = jnp.concatenate(
            [zero, neg_u[:, :1], pos_u[:, :1], neg_u[:, 1:], pos_u[:, 1:]], axis=-1
        )
        return jnp.clip(out, spec.action.low, spec.action.high)

    return act


register("mpe:simple_spread", partial(SpreadEnv, False))
register("mpe:simple_spread_continuous", partial(SpreadEnv, True))
