"""Multi-agent MuJoCo on MJX: Hopper, Ant and HalfCheetah split among agents by joints.

Ids: `mamujoco:hopper_3x1` (thigh, leg, foot), `mamujoco:ant_2x4` (front
legs 1 and 2, back legs 3 and 4), `mamujoco:ant_4x2` (one leg each) and
`mamujoco:halfcheetah_6x1` (back thigh, shin, foot, front thigh, shin,
foot): MaMuJoCo's partitions, each agent driving the actuators of its
joints. The physics is MuJoCo's own, through MJX (`mujoco-mjx`, the
optional extra `pip install 'jaxil[mamujoco]'`), on Gymnasium's v5 model
files (shipped with `gymnasium`), so a step is jittable and vmappable like
every jaxil environment. The ids are always registered; `envs.make` raises
an `ImportError` naming the extra when `mujoco-mjx` is missing.

Dynamics, rewards and ends follow Gymnasium's v5 environments:

| robot | frame skip (dt) | reward | ends (`done`) | reset noise |
|---|---|---|---|---|
| hopper | 4 (0.008 s) | x velocity + 1 while healthy − 0.001 Σa² | unhealthy: z ≤ 0.7, \\|pitch\\| ≥ 0.2, or any of qpos[2:], qvel outside ±100 | qpos, qvel ± U(0.005) |
| ant | 5 (0.05 s) | torso x velocity + 1 while healthy − 0.5 Σa² | unhealthy: torso z outside [0.2, 1], or a non-finite state | qpos ± U(0.1), qvel + 0.1 N(0, 1) |
| halfcheetah | 5 (0.05 s) | x velocity − 0.1 Σa² | never (time limit only) | qpos ± U(0.1), qvel + 0.1 N(0, 1) |

- obs `[N, obs_dim]`: every agent sees the whole single-agent observation,
  as in the OMIGA / O-MAPL / MisoDICE MaMuJoCo data (learners append the
  agent id): hopper qpos[1:] and qvel clipped to ±10 (11), ant qpos[2:]
  and qvel (27), halfcheetah qpos[1:] and qvel (17). MaMuJoCo's local
  `agent_obsk` views are not offered.
- global state: the same single-agent observation (Farama's MaMuJoCo
  v1 global state).
- actions `[N, k]` in `[-1, 1]`: agent i's torques for its joints, in the
  order the partition lists them (`JOINTS`); the adapter places each at its
  actuator, whatever order the model file lists them in (Gymnasium's ant
  lists leg 4 first).
- team reward: the single-agent reward above, shared.
- truncated at `max_steps` (default 1000).

Against the datasets' Gym v2 environments (mujoco-py, MuJoCo 2.0): the v2
ant observation had 111 entries, 84 of them external contact forces that
MuJoCo ≥ 2.0 leaves at zero unless `mj_rnePostConstraint` is called, so its contact
cost was zero too; here the ant observes the 27 that carried information
and pays no contact cost. v5's healthy bonus is paid only while healthy
(v2 paid it on the terminal step as well), and MJX computes in float32
where MuJoCo's C library uses float64.

Friction cones: the model files use MuJoCo's pyramidal cones. Under them
MJX (3.17) and MuJoCo's C library give the ant different contact forces:
from the same state, one 0.01 s substep with a foot touching the floor
differs by up to 0.37 in a joint velocity (in float64 too), so an ant
episode drifts away from Gymnasium's within steps of the first contact.
With `friction_cone="elliptic"` the two agree to 1e-4. The hopper's
frictionless contacts and the half-cheetah's agree under the files' own
setting. The tests step every scenario beside Gymnasium.

Solver cost: MJX runs MuJoCo's full constraint solver (Newton, up to the
file's 100 iterations with up to 50 line-search steps each) and, for the
hopper and the ant, RK4's four evaluations per substep. `iterations`,
`ls_iterations` and `integrator` override the file's settings, for a
cheaper step at a physics that differs from the C library's; every
override is part of the environment's config, so data and teachers made
under one setting are not mixed with another's.

Keyword overrides: `max_steps` (alias `episode_length`),
`terminate_when_unhealthy` (hopper, ant), `reset_noise_scale`,
`friction_cone` (`"pyramidal"`, the files', or `"elliptic"`),
`iterations` and `ls_iterations` (positive integers), `integrator`
(`"euler"`, `"rk4"` or `"implicitfast"`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .core import ContinuousActions, EnvSpec, MultiAgentEnv, Step
from .registry import register

MISSING_MJX = "MaMuJoCo environments need MuJoCo's MJX: pip install 'jaxil[mamujoco]'"


@dataclasses.dataclass(frozen=True)
class Robot:
    """One single-agent Gymnasium v5 robot: its model file and constants."""

    xml: str
    frame_skip: int
    reset_noise_scale: float
    #: "uniform": qpos and qvel ± U(scale); "normal_qvel": qpos ± U(scale),
    #: qvel + scale · N(0, 1).
    reset_noise: str
    ctrl_cost_weight: float
    healthy_reward: float
    can_fall: bool


ROBOTS = {
    "hopper": Robot("hopper.xml", 4, 5e-3, "uniform", 1e-3, 1.0, True),
    "ant": Robot("ant.xml", 5, 0.1, "normal_qvel", 0.5, 1.0, True),
    "halfcheetah": Robot("half_cheetah.xml", 5, 0.1, "normal_qvel", 0.1, 0.0, False),
}

#: Each scenario's robot and its agents' joints (MaMuJoCo's partitions).
JOINTS = {
    "hopper_3x1": ("hopper", (("thigh_joint",), ("leg_joint",), ("foot_joint",))),
    "ant_2x4": ("ant", (("hip_1", "ankle_1", "hip_2", "ankle_2"),
                        ("hip_3", "ankle_3", "hip_4", "ankle_4"))),
    "ant_4x2": ("ant", (("hip_1", "ankle_1"), ("hip_2", "ankle_2"), ("hip_3", "ankle_3"),
                        ("hip_4", "ankle_4"))),
    "halfcheetah_6x1": ("halfcheetah", (("bthigh",), ("bshin",), ("bfoot",), ("fthigh",),
                                        ("fshin",), ("ffoot",))),
}
SCENARIOS = tuple(JOINTS)
#: The MuJoCo solver settings an environment can override (module docstring).
SOLVER_OPTIONS = ("iterations", "ls_iterations", "integrator")
INTEGRATORS = {"euler": "mjINT_EULER", "rk4": "mjINT_RK4", "implicitfast": "mjINT_IMPLICITFAST"}


def model_path(robot: str) -> Path:
    """Gymnasium's v5 model file of `robot`."""
    import gymnasium

    return Path(gymnasium.__file__).parent / "envs" / "mujoco" / "assets" / ROBOTS[robot].xml


def _import_mjx() -> tuple[Any, Any]:
    try:
        import mujoco

        # MJX prints "Failed to import warp" to stdout when its optional GPU
        # backend (warp) is absent; jaxil only uses the JAX backend.
        with contextlib.redirect_stdout(io.StringIO()):
            from mujoco import mjx
    except ImportError as e:
        raise ImportError(MISSING_MJX) from e
    return mujoco, mjx


@struct.dataclass
class Inner:
    """The simulator's data and the steps taken."""

    data: Any
    t: jax.Array


class MaMuJoCoEnv(MultiAgentEnv):
    """One MaMuJoCo scenario on MJX (see the module docstring). `model` is
    the MuJoCo model, `mjx_model` its device copy."""

    stochastic_step = False

    def __init__(self, scenario: str, **kwargs):
        if scenario not in JOINTS:
            raise KeyError(f"unknown MaMuJoCo scenario {scenario!r}; known: {list(SCENARIOS)}")
        env_id = f"mamujoco:{scenario}"
        robot_name, parts = JOINTS[scenario]
        robot = ROBOTS[robot_name]
        kwargs = dict(kwargs)
        if "episode_length" in kwargs:
            if "max_steps" in kwargs:
                raise TypeError(f"{env_id}: give max_steps or its alias episode_length, not both")
            kwargs["max_steps"] = kwargs.pop("episode_length")
        accepted = ["max_steps", "episode_length", "reset_noise_scale", "friction_cone",
                    *SOLVER_OPTIONS] + \
            (["terminate_when_unhealthy"] if robot.can_fall else [])
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown:
            raise TypeError(f"{env_id} got unexpected keyword argument(s) "
                            f"{', '.join(map(repr, unknown))}; accepted: {', '.join(accepted)}")
        max_steps = kwargs.get("max_steps", 1000)
        if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) \
                or max_steps < 1:
            raise ValueError(f"{env_id}: max_steps must be a positive integer, got {max_steps!r}")
        noise = kwargs.get("reset_noise_scale", robot.reset_noise_scale)
        if not (isinstance(noise, (int, float)) and np.isfinite(noise) and noise >= 0):
            raise ValueError(f"{env_id}: reset_noise_scale must be a finite number >= 0, "
                             f"got {noise!r}")
        cone = kwargs.get("friction_cone", "pyramidal")
        if cone not in ("pyramidal", "elliptic"):
            raise ValueError(f"{env_id}: friction_cone must be 'pyramidal' (the model file's) or "
                             f"'elliptic', got {cone!r}")
        solver = {k: kwargs[k] for k in SOLVER_OPTIONS if k in kwargs}
        for k in ("iterations", "ls_iterations"):
            v = solver.get(k, 1)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{env_id}: {k} must be a positive integer, got {v!r}")
        if solver.get("integrator", "euler") not in INTEGRATORS:
            raise ValueError(f"{env_id}: integrator must be one of {', '.join(INTEGRATORS)}, "
                             f"got {solver['integrator']!r}")
        self.terminate_when_unhealthy = bool(kwargs.get("terminate_when_unhealthy",
                                                        robot.can_fall))
        self.robot_name, self.robot = robot_name, robot
        self.reset_noise_scale = float(noise)
        self.config = dict(max_steps=int(max_steps), reset_noise_scale=float(noise),
                           terminate_when_unhealthy=self.terminate_when_unhealthy,
                           friction_cone=cone, **solver)

        mujoco, mjx = _import_mjx()
        self._mjx = mjx
        self.model = mujoco.MjModel.from_xml_path(str(model_path(robot_name)))
        if cone == "elliptic":
            self.model.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
        for k in ("iterations", "ls_iterations"):
            if k in solver:
                setattr(self.model.opt, k, int(solver[k]))
        if "integrator" in solver:
            self.model.opt.integrator = getattr(mujoco.mjtIntegrator,
                                                INTEGRATORS[solver["integrator"]])
        self.mjx_model = mjx.put_model(self.model)
        self.dt = float(self.model.opt.timestep) * robot.frame_skip

        # Each actuator's joint, and for each actuator the flat position in
        # the [N * k] action array that drives it.
        joint_of = {self.model.joint(int(self.model.actuator_trnid[a, 0])).name: a
                    for a in range(self.model.nu)}
        n, k = len(parts), max(len(p) for p in parts)
        src = np.full((self.model.nu,), n * k, np.int32)
        for i, joints in enumerate(parts):
            for j, name in enumerate(joints):
                if name not in joint_of:
                    raise ValueError(f"{env_id}: {model_path(robot_name).name} has no actuated "
                                     f"joint {name!r} (actuated: {sorted(joint_of)})")
                src[joint_of[name]] = i * k + j
        undriven = [name for name, a in joint_of.items() if src[a] == n * k]
        if undriven:
            raise ValueError(f"{env_id}: no agent drives {undriven}")
        self.actuator_source = src
        self.agent_joints = parts

        obs_dim = int(self._observe_single(self.model.qpos0.astype(np.float32),
                                           np.zeros(self.model.nv, np.float32)).shape[0])
        self.spec = EnvSpec(env_id=env_id, num_agents=n, obs_dim=obs_dim, state_dim=obs_dim,
                            action=ContinuousActions(dim=k, low=-1.0, high=1.0),
                            max_steps=int(max_steps), has_win=False)

    # -- the single-agent task ------------------------------------------------------------

    def _observe_single(self, qpos, qvel):
        """The single-agent observation of a state (numpy or jax arrays)."""
        xp = jnp if isinstance(qpos, jax.Array) else np
        if self.robot_name == "hopper":
            return xp.concatenate([qpos[1:], xp.clip(qvel, -10.0, 10.0)])
        if self.robot_name == "ant":
            return xp.concatenate([qpos[2:], qvel])
        return xp.concatenate([qpos[1:], qvel])

    def healthy(self, qpos: jax.Array, qvel: jax.Array) -> jax.Array:
        """Gymnasium v5's `is_healthy` (always True for the half-cheetah)."""
        if self.robot_name == "hopper":
            z, angle = qpos[1], qpos[2]
            state = jnp.concatenate([qpos[2:], qvel])
            return jnp.all((state > -100.0) & (state < 100.0)) & (z > 0.7) \
                & (angle > -0.2) & (angle < 0.2)
        if self.robot_name == "ant":
            finite = jnp.all(jnp.isfinite(qpos)) & jnp.all(jnp.isfinite(qvel))
            return finite & (qpos[2] >= 0.2) & (qpos[2] <= 1.0)
        return jnp.bool_(True)

    def forward_position(self, data: Any) -> jax.Array:
        """The x coordinate whose change over a step is the forward reward:
        the root's slide joint, or for the ant its torso body."""
        return data.xpos[1, 0] if self.robot_name == "ant" else data.qpos[0]

    def _out(self, inner: Inner, reward=0.0, done=False, truncated=False) -> Step:
        obs = self._observe_single(inner.data.qpos, inner.data.qvel)
        n = self.spec.num_agents
        return Step(inner=inner, obs=jnp.broadcast_to(obs, (n, obs.shape[0])), global_state=obs,
                    avail_actions=jnp.zeros((n, 0), jnp.bool_), reward=reward, done=done,
                    truncated=truncated)

    # -- the interface ----------------------------------------------------------------------

    def _reset(self, key: jax.Array) -> Step:
        m, s = self.model, self.reset_noise_scale
        k1, k2 = jax.random.split(key)
        qpos = jnp.asarray(m.qpos0, jnp.float32) + jax.random.uniform(k1, (m.nq,), jnp.float32,
                                                                      -s, s)
        if self.robot.reset_noise == "uniform":
            qvel = jax.random.uniform(k2, (m.nv,), jnp.float32, -s, s)
        else:
            qvel = s * jax.random.normal(k2, (m.nv,), jnp.float32)
        data = self._mjx.make_data(self.mjx_model).replace(qpos=qpos, qvel=qvel)
        data = self._mjx.forward(self.mjx_model, data)
        return self._out(Inner(data, jnp.int32(0)))

    def _step(self, key: jax.Array, inner: Inner, actions: jax.Array) -> Step:
        flat = jnp.concatenate([actions.reshape(-1), jnp.zeros((1,), actions.dtype)])
        ctrl = flat[self.actuator_source]
        x0 = self.forward_position(inner.data)
        data = inner.data.replace(ctrl=ctrl)
        data = jax.lax.fori_loop(0, self.robot.frame_skip,
                                 lambda _, d: self._mjx.step(self.mjx_model, d), data)
        healthy = self.healthy(data.qpos, data.qvel)
        reward = (self.forward_position(data) - x0) / self.dt \
            + self.robot.healthy_reward * healthy \
            - self.robot.ctrl_cost_weight * jnp.sum(jnp.square(ctrl))
        t = inner.t + 1
        done = ~healthy if self.terminate_when_unhealthy else jnp.bool_(False)
        return self._out(Inner(data, t), reward, done, t >= self.spec.max_steps)


for _name in SCENARIOS:
    register(f"mamujoco:{_name}", partial(MaMuJoCoEnv, _name))
