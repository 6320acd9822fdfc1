"""Tests of envs/mamujoco.py: MaMuJoCo's partitions on MJX, against
Gymnasium's v5 environments on MuJoCo's C library (float64) as the
reference. The comparisons with Gymnasium run with -m slow (each compiles
its own MJX step); the partitions are checked by default."""

import xml.etree.ElementTree as ET

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("mujoco.mjx", reason="MaMuJoCo environments need mujoco-mjx")

from jaxil import envs  # noqa: E402
from jaxil.envs import mamujoco as mm  # noqa: E402

_GYM = {"hopper_3x1": ("Hopper-v5", {}),
        "ant_2x4": ("Ant-v5", {"include_cfrc_ext_in_observation": False,
                               "contact_cost_weight": 0.0}),
        "ant_4x2": ("Ant-v5", {"include_cfrc_ext_in_observation": False,
                               "contact_cost_weight": 0.0}),
        "halfcheetah_6x1": ("HalfCheetah-v5", {})}
_ANT_PYRAMIDAL = pytest.mark.xfail(
    strict=True, reason="MJX 3.17's pyramidal friction cones give the ant other contact forces "
    "than MuJoCo's C library (see the module docstring); elliptic cones agree")
# Every comparison with Gymnasium compiles its own MJX step (the half-cheetah's
# was 20 s of the default suite): all run with -m slow; the conformance suite
# steps the half-cheetah by default.
SCENARIOS = [pytest.param(s, "pyramidal", marks=[pytest.mark.slow] + (
                 [_ANT_PYRAMIDAL] if s.startswith("ant") else [])) for s in mm.SCENARIOS] + \
    [pytest.param("ant_4x2", "elliptic", marks=pytest.mark.slow)]
_envs = {}


def _env(scenario, **kw):
    key = (scenario, tuple(sorted(kw.items())))
    if key not in _envs:
        env = envs.make(f"mamujoco:{scenario}", **kw)
        _envs[key] = (env, jax.jit(env.reset), jax.jit(env.step))
    return _envs[key]


@pytest.mark.parametrize("scenario", mm.SCENARIOS)
def test_each_agent_drives_the_actuators_of_its_own_joints(scenario):
    """Agent i's action entry j reaches the motor of joint `JOINTS[i][j]`,
    read from the model file's own `<motor joint=...>` order. Fails if the
    actions are laid out in the file's actuator order, which for the ant
    starts with leg 4 (the fault in JaxMARL's ant_4x2 tables)."""
    env = envs.make(f"mamujoco:{scenario}")
    motors = [m.get("joint") for m in ET.parse(mm.model_path(env.robot_name)).iter("motor")
              if m.get("joint")]
    n, k = env.spec.num_agents, env.spec.action.dim
    for i, joints in enumerate(env.agent_joints):
        for j, joint in enumerate(joints):
            (actuator,) = np.flatnonzero(env.actuator_source == i * k + j)
            assert motors[actuator] == joint, (i, j, motors)
    assert n == len(mm.JOINTS[scenario][1])


def _gym(scenario, cone):
    gymnasium = pytest.importorskip("gymnasium")
    name, kw = _GYM[scenario]
    gym = gymnasium.make(name, **kw).unwrapped
    if cone == "elliptic":
        import mujoco

        gym.model.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    return gym


@pytest.mark.parametrize("scenario,cone", SCENARIOS)
def test_steps_match_gymnasium_v5_on_mujoco_c(scenario, cone):
    """From the same states (reset, then 30 random-action steps, each
    restarted from the MJX state, through the first contacts with the
    floor) the MJX step gives Gymnasium v5's next observation, reward and
    termination (MuJoCo's C library, float64) to float32 tolerance, and
    every agent sees that observation. Fails if the frame skip, dt, an
    actuator's placement, the reward's sign or a cost weight, the
    observation's slices, the healthy rule or the contact model differ."""
    env, reset, step = _env(scenario, friction_cone=cone)
    gym = _gym(scenario, cone)
    gym.reset(seed=0)
    state, ts = reset(jax.random.key(3))
    rng = np.random.default_rng(0)
    n, k = env.spec.num_agents, env.spec.action.dim
    for t in range(30):
        actions = rng.uniform(-1, 1, size=(n, k)).astype(np.float32)
        qpos = np.asarray(state.inner.data.qpos, np.float64)
        qvel = np.asarray(state.inner.data.qvel, np.float64)
        gym.set_state(qpos, qvel)
        ctrl = np.zeros(env.model.nu)
        ctrl[:] = np.concatenate([actions.reshape(-1), [0.0]])[env.actuator_source]
        obs, reward, terminated, _, _ = gym.step(ctrl)
        state, ts = step(state, jnp.asarray(actions))
        np.testing.assert_allclose(ts.global_state, obs, rtol=2e-3, atol=2e-3, err_msg=f"t={t}")
        np.testing.assert_allclose(ts.obs, np.broadcast_to(obs, (n, obs.size)), rtol=2e-3,
                                   atol=2e-3)
        assert abs(float(ts.reward) - reward) < 2e-2 * max(1.0, abs(reward)), (t, ts.reward,
                                                                              reward)
        assert bool(ts.done) == bool(terminated), t
        if terminated:
            break


@pytest.mark.slow  # two hopper compilations (about 50 s); the conformance suite checks the
# time limit on the half-cheetah by default
def test_the_hopper_falls_and_ends_the_episode_and_the_limit_truncates():
    """A hopper started lying low (z 0.5 < 0.7) is unhealthy: its first step
    is `done` (not truncated) and pays no healthy bonus; with
    `terminate_when_unhealthy=False` it runs on until `max_steps`, where it
    is truncated. Fails if done and truncated are swapped, or the limit
    counts from 0 to max_steps inclusive."""
    env, reset, step = _env("hopper_3x1", max_steps=3)
    state, _ = reset(jax.random.key(0))
    low = state.inner.data.replace(qpos=state.inner.data.qpos.at[1].set(0.5))
    state = state.replace(inner=state.inner.replace(data=low))
    zero = jnp.zeros((3, 1))
    _, ts = step(state, zero)
    assert bool(ts.done) and not bool(ts.truncated)
    env2, reset2, step2 = _env("hopper_3x1", max_steps=3, terminate_when_unhealthy=False)
    state, _ = reset2(jax.random.key(0))
    ends = []
    for _ in range(3):
        state, ts = step2(state, zero)
        ends.append((bool(ts.done), bool(ts.truncated)))
    assert ends == [(False, False), (False, False), (False, True)]


def test_bad_arguments_are_refused_in_one_line():
    """Unknown keywords, a non-positive limit and a negative noise scale are
    refused naming what is accepted; the half-cheetah, which cannot fall,
    has no `terminate_when_unhealthy`."""
    with pytest.raises(TypeError, match="accepted: max_steps"):
        envs.make("mamujoco:hopper_3x1", frame_skip=2)
    with pytest.raises(ValueError, match="max_steps must be a positive integer"):
        envs.make("mamujoco:hopper_3x1", max_steps=0)
    with pytest.raises(ValueError, match="reset_noise_scale"):
        envs.make("mamujoco:hopper_3x1", reset_noise_scale=-1.0)
    with pytest.raises(TypeError, match="terminate_when_unhealthy"):
        envs.make("mamujoco:halfcheetah_6x1", terminate_when_unhealthy=False)
    with pytest.raises(ValueError, match="friction_cone must be"):
        envs.make("mamujoco:hopper_3x1", friction_cone="square")
    with pytest.raises(KeyError, match="hopper_3x1"):
        mm.MaMuJoCoEnv("hopper_2x2")
    with pytest.raises(ValueError, match="iterations must be a positive integer"):
        envs.make("mamujoco:hopper_3x1", iterations=0)
    with pytest.raises(ValueError, match="ls_iterations must be a positive integer"):
        envs.make("mamujoco:hopper_3x1", ls_iterations=2.5)
    with pytest.raises(ValueError, match="integrator must be one of euler"):
        envs.make("mamujoco:hopper_3x1", integrator="verlet")


def test_solver_overrides_reach_the_physics_and_the_config():
    """`iterations`, `ls_iterations` and `integrator` set MuJoCo's options on
    both the C model and its MJX copy, and are recorded in the config (so a
    dataset or teacher of cheaper physics is told apart); without them the
    file's settings stay (the hopper's RK4, 100 and 50). Catches an
    override set on the C model after the MJX copy was made, and a config
    that hides it."""
    import mujoco

    plain = envs.make("mamujoco:hopper_3x1")
    assert (plain.model.opt.iterations, plain.model.opt.ls_iterations) == (100, 50)
    assert plain.model.opt.integrator == mujoco.mjtIntegrator.mjINT_RK4
    assert "iterations" not in plain.config
    fast = envs.make("mamujoco:hopper_3x1", iterations=4, ls_iterations=8, integrator="euler")
    for opt in (fast.model.opt, fast.mjx_model.opt):
        assert int(opt.iterations) == 4 and int(opt.ls_iterations) == 8
        assert int(opt.integrator) == int(mujoco.mjtIntegrator.mjINT_EULER)
    assert fast.config["iterations"] == 4 and fast.config["integrator"] == "euler"


def test_a_missing_mjx_names_the_extra(monkeypatch):
    """Without mujoco-mjx, making an id raises an ImportError that names the
    extra to install."""
    import builtins

    real = builtins.__import__

    def no_mujoco(name, *a, **kw):
        if name == "mujoco" or name.startswith("mujoco."):
            raise ImportError("No module named 'mujoco'")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_mujoco)
    with pytest.raises(ImportError, match=r"jaxil\[mamujoco\]"):
        mm.MaMuJoCoEnv("hopper_3x1")
