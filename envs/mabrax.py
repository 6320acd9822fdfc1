"""JaxMARL MABrax adapter: multi-agent MuJoCo-style control (continuous actions).

Ids: `mabrax:hopper_3x1` (3 agents, one joint each), `mabrax:ant_4x2` (4 legs,
two joints each), `mabrax:halfcheetah_6x1` and `mabrax:walker2d_2x3`: a brax
robot whose joints are split among agents by JaxMARL's mappings. brax is an
optional extra: the ids are always registered, and `envs.make` raises an
`ImportError` telling how to install it (`pip install 'jaxil[mabrax]'`).

Keyword overrides: `episode_length` (alias `max_steps`, default 1000),
`action_repeat` (1), `backend` (`"positional"`, JaxMARL's default), and
any keyword of the brax environment class (`ctrl_cost_weight`,
`terminate_when_unhealthy`, ...).

- obs `[N, obs_dim]`: each agent's slice of the brax observation as JaxMARL
  maps it (its own joints, its neighbours', the torso), zero-padded to the
  largest agent's size; no agent id (learners append one).
- global state: the full brax observation vector (for `halfcheetah` without
  the leading x position, see below).
- actions `[N, act_dim]` in `[-1, 1]`: agent i's torques for its own joints;
  entries beyond an agent's joint count (none for these four robots) are
  ignored.
- team reward: brax's scalar reward (forward progress, health bonus, control
  cost), which JaxMARL gives every agent.
- done: the robot became unhealthy (brax termination); truncated: the episode
  length was reached (brax's `info["truncation"]`). No win condition.
- `max_steps = ceil(episode_length / action_repeat)`.

Upstream notes. JaxMARL's `halfcheetah_6x1` observation mapping indexes an
18-dim observation that includes the x position (index 17 is the front-foot
velocity), while brax's default drops x and gives 17 dims, which shifts every
agent's view by one and clamps index 17. The adapter therefore builds the
half-cheetah with `exclude_current_positions_from_observation=False` (the
mapping never shows x to an agent; the global state drops it too).
JaxMARL's `ant_4x2` tables pair each agent with the wrong leg: brax's ant
lists its actuators from leg 4 (hip_4, ankle_4, hip_1, ...) while the
action table assumes leg 1 first, so agent 0 observes leg 1's joints and
drives leg 4's, agent 1 observes leg 2 and drives leg 1, and so on (a
one-hot action on each actuator, checked against brax 0.14.2). The adapter
keeps JaxMARL's tables as they are; `experiments/misodice_table/MAMUJOCO.md`
has the check and the plan for MaMuJoCo environments on MJX.
JaxMARL's `humanoid_9|8` mapping indexes a 376-dim observation but brax's
humanoid has 244, so it is not registered. JaxMARL marks MABrax as
deprecated and brax says it is no longer actively maintained (MJX replaces
it); both warnings are silenced here.
"""

from __future__ import annotations

import inspect
import math
import warnings
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._jaxmarl import import_jaxmarl
from .core import ContinuousActions, EnvSpec, MultiAgentEnv, Step
from .registry import register

SCENARIOS = ("hopper_3x1", "ant_4x2", "halfcheetah_6x1", "walker2d_2x3")
MISSING_BRAX = "MABrax needs brax: pip install 'jaxil[mabrax]'"

# brax kwargs the adapter sets per scenario so that JaxMARL's mapping lines up.
_SCENARIO_DEFAULTS = {"halfcheetah_6x1": {"exclude_current_positions_from_observation": False}}
# Leading observation entries left out of the global state (the x position).
_STATE_START = {"halfcheetah_6x1": 1}


def _import_mabrax() -> tuple[Any, Any]:
    """Import brax and JaxMARL's MABrax lazily, with a clear error if brax is
    missing."""
    try:
        import brax  # noqa: F401
        from brax import envs as brax_envs

        import_jaxmarl("mabrax")
        from jaxmarl.environments.mabrax import MABraxEnv
    except ImportError as e:
        raise ImportError(MISSING_BRAX) from e
    return MABraxEnv, brax_envs


class MABraxEnvAdapter(MultiAgentEnv):
    """One JaxMARL MABrax scenario; `raw` is JaxMARL's `MABraxEnv` (no auto-reset)."""

    def __init__(self, scenario: str, **kwargs):
        if scenario not in SCENARIOS:
            raise KeyError(f"unknown MABrax scenario {scenario!r}; known: {list(SCENARIOS)}")
        env_id = f"mabrax:{scenario}"
        MABraxEnv, brax_envs = _import_mabrax()

        kwargs = dict(kwargs)
        if "max_steps" in kwargs:
            if "episode_length" in kwargs:
                raise TypeError(f"{env_id}: give episode_length or its alias max_steps, not both")
            kwargs["episode_length"] = kwargs.pop("max_steps")
        episode_length = kwargs.pop("episode_length", 1000)
        action_repeat = kwargs.pop("action_repeat", 1)
        backend = kwargs.pop("backend", "positional")
        for name, v in (("episode_length", episode_length), ("action_repeat", action_repeat)):
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{env_id}: {name} must be a positive integer, got {v!r}")

        robot = scenario.split("_")[0]
        robot_cls = brax_envs._envs[robot]  # brax's registry of environment classes
        params = inspect.signature(robot_cls.__init__).parameters
        brax_names = sorted(p for p in params if p not in ("self", "kwargs", "backend"))
        unknown = sorted(set(kwargs) - set(brax_names))
        if unknown:
            names = ", ".join(["action_repeat", "backend", "episode_length", "max_steps"])
            raise TypeError(
                f"{env_id} got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
                f"accepted keywords: {names}, and brax {robot_cls.__name__}'s: "
                f"{', '.join(brax_names)}"
            )
        brax_kwargs = {**_SCENARIO_DEFAULTS.get(scenario, {}), **kwargs}

        with warnings.catch_warnings():
            # JaxMARL's deprecation notice and brax's "not actively maintained"
            # notice: both said once in the module docstring instead.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", message=".*not actively being maintained.*")
            self.raw = MABraxEnv(
                scenario,
                episode_length=episode_length,
                action_repeat=action_repeat,
                auto_reset=False,
                backend=backend,
                **brax_kwargs,
            )
        self.brax = self.raw.env  # brax EpisodeWrapper: sets done and info["truncation"]
        self.config = dict(
            episode_length=episode_length, action_repeat=action_repeat, backend=backend,
            **brax_kwargs,
        )

        agents = list(self.raw.agents)
        n = len(agents)
        obs_size = int(self.brax.observation_size)
        act_size = int(self.brax.action_size)
        obs_maps = [np.asarray(self.raw.agent_obs_mapping[a], np.int32) for a in agents]
        act_maps = [np.asarray(self.raw.agent_action_mapping[a], np.int32) for a in agents]
        top = max(int(m.max()) for m in obs_maps)
        if top >= obs_size:
            raise ValueError(
                f"{env_id}: JaxMARL's observation mapping reads entry {top} but brax's "
                f"{robot} observation has {obs_size} entries with {brax_kwargs}"
            )
        obs_dim = max(m.size for m in obs_maps)
        act_dim = max(m.size for m in act_maps)

        # Static gather tables: padded per-agent observation indices, and for each
        # brax joint the flat position in the [N * act_dim] action array driving it
        # (N * act_dim, a zero slot, for joints no agent drives).
        self._obs_idx = np.zeros((n, obs_dim), np.int32)
        self._obs_mask = np.zeros((n, obs_dim), bool)
        joint_src = np.full((act_size,), n * act_dim, np.int32)
        for i, (om, am) in enumerate(zip(obs_maps, act_maps)):
            self._obs_idx[i, : om.size] = om
            self._obs_mask[i, : om.size] = True
            joint_src[am] = i * act_dim + np.arange(am.size)
        self._joint_src = joint_src
        self._state_start = _STATE_START.get(scenario, 0)

        self.spec = EnvSpec(
            env_id=env_id,
            num_agents=n,
            obs_dim=obs_dim,
            state_dim=obs_size - self._state_start,
            action=ContinuousActions(dim=act_dim, low=-1.0, high=1.0),
            max_steps=math.ceil(episode_length / action_repeat),
            has_win=False,
        )

    def _out(self, inner: Any, first: bool) -> Step:
        o = inner.obs
        obs = jnp.where(self._obs_mask, o[self._obs_idx], 0.0)
        gs = o[self._state_start :]
        n = self.spec.num_agents
        avail = jnp.zeros((n, 0), jnp.bool_)
        if first:
            return Step(inner, obs, gs, avail)
        truncated = inner.info["truncation"] > 0
        return Step(
            inner=inner,
            obs=obs,
            global_state=gs,
            avail_actions=avail,
            reward=inner.reward,
            done=(inner.done > 0) & ~truncated,
            truncated=truncated,
        )

    def _reset(self, key: jax.Array) -> Step:
        return self._out(self.brax.reset(key), first=True)

    def _step(self, key: jax.Array, inner: Any, actions: jax.Array) -> Step:
        flat = jnp.concatenate([actions.reshape(-1), jnp.zeros((1,), actions.dtype)])
        return self._out(self.brax.step(inner, flat[self._joint_src]), first=False)


for _name in SCENARIOS:
    register(f"mabrax:{_name}", partial(MABraxEnvAdapter, _name))
