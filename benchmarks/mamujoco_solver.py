"""What MJX's cheaper solver settings buy on the MaMuJoCo scenarios, and what
they cost in physics.

For each scenario and each solver setting (`iterations`, `ls_iterations`,
`integrator` overrides of the model file's; `SETTINGS`) this measures

- **speed**: env-steps/s of `envs.AutoReset(envs.make(id, **setting))`,
  `vmap`-ed over `--num-envs` and stepped in a `lax.scan` with uniformly
  random actions (`env_throughput.adapter_runner`), the median of
  `--repeats` timed calls after a warm-up, by wall clock and by this
  process's CPU time (the steadier of the two on a shared machine);
- **physics error**: from the MJX states along `--episodes` random-action
  episodes (at most `--horizon` steps each; with `--teacher DIR`, episodes
  of that trained teacher's sampled actions instead), the next observation and
  reward of one MJX step against Gymnasium's v5 environment on MuJoCo's C
  library (float64) from the same state, under the file's settings: the
  median, 99th percentile and maximum of the largest absolute observation
  difference per step, how many steps it exceeds 0.01 and 0.1 on, the
  largest reward difference, and how often the two disagree on the
  episode's end.

The file's own setting is the reference row: its error is MJX's float32
against the C library's float64. The ant is compared under elliptic friction
cones on both sides (under the file's pyramidal cones MJX and the C library
differ already; `envs/mamujoco.py`).

    python benchmarks/mamujoco_solver.py                 # hopper, half-cheetah, ant 4x2
    python benchmarks/mamujoco_solver.py --quick         # hopper only, fewer steps
    python benchmarks/mamujoco_solver.py --scenarios hopper_3x1 --settings file iter4-ls8 \
        --teacher runs/teachers/mamujoco_hopper_3x1 --horizon 1000 --no-speed

Writes `benchmarks/results/mamujoco_solver-<host>-<date>.json` and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env_throughput import RESULTS, _timed, _version, adapter_runner  # noqa: E402

from jaxil import envs  # noqa: E402

SETTINGS = {
    "file": {},
    "iter4-ls8": dict(iterations=4, ls_iterations=8),
    "iter1-ls4": dict(iterations=1, ls_iterations=4),
    "euler": dict(integrator="euler"),
    "euler-iter4-ls8": dict(integrator="euler", iterations=4, ls_iterations=8),
}
# Gymnasium's single-agent v5 environment of each scenario, with the options
# under which its observation and reward are the scenario's (envs/mamujoco.py).
GYM = {"hopper_3x1": ("Hopper-v5", {}),
       "halfcheetah_6x1": ("HalfCheetah-v5", {}),
       "ant_4x2": ("Ant-v5", {"include_cfrc_ext_in_observation": False,
                              "contact_cost_weight": 0.0})}
EXTRA = {"ant_4x2": dict(friction_cone="elliptic")}


def physics_error(scenario: str, setting: dict, episodes: int, horizon: int,
                  teacher: Path | None = None) -> dict:
    """One-step errors of `setting` against the C library (module docstring)."""
    import gymnasium
    import mujoco

    env = envs.make(f"mamujoco:{scenario}", **EXTRA.get(scenario, {}), **setting)
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    if teacher is not None:
        from jaxil.teachers import load_teacher

        policy, params, spec = load_teacher(teacher)
        if spec.env_id != env.spec.env_id:
            raise SystemExit(f"--teacher {teacher} acts in {spec.env_id}, not {env.spec.env_id}")
        carry = policy.init(jax.random.key(0), spec.num_agents)
        act = jax.jit(lambda o, k: policy.act(params, o, None, k, carry)[0])
    name, kw = GYM[scenario]
    gym = gymnasium.make(name, **kw).unwrapped
    if "friction_cone" in EXTRA.get(scenario, {}):
        gym.model.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    gym.reset(seed=0)
    n, k = env.spec.num_agents, env.spec.action.dim
    obs_err, rew_err, end_differs = [], [], 0
    for ep in range(episodes):
        state, ts = reset(jax.random.key(ep))
        rng = np.random.default_rng(ep)
        for _ in range(horizon):
            if teacher is None:
                a = rng.uniform(-1, 1, size=(n, k)).astype(np.float32)
            else:
                a = np.asarray(act(ts.obs, jax.random.key(int(rng.integers(2**31)))))
            gym.set_state(np.asarray(state.inner.data.qpos, np.float64),
                          np.asarray(state.inner.data.qvel, np.float64))
            obs, reward, terminated, _, _ = gym.step(
                np.concatenate([a.reshape(-1), [0.0]])[env.actuator_source])
            state, ts = step(state, jnp.asarray(a))
            obs_err.append(float(np.max(np.abs(np.asarray(ts.global_state, np.float64) - obs))))
            rew_err.append(abs(float(ts.reward) - reward))
            end_differs += int(bool(terminated) != bool(ts.done))
            if terminated or bool(ts.done):
                break
    return dict(steps=len(obs_err), obs_err_median=float(np.median(obs_err)),
                obs_err_p99=float(np.quantile(obs_err, 0.99)), obs_err_max=float(np.max(obs_err)),
                obs_err_steps_above={str(t): int(np.sum(np.asarray(obs_err) > t))
                                     for t in (0.01, 0.1)},
                reward_err_max=float(np.max(rew_err)), end_differs=end_differs)


def speed(scenario: str, setting: dict, num_envs: int, num_steps: int, repeats: int) -> dict:
    """Median env-steps/s (wall and CPU) of the auto-resetting adapter."""
    env = envs.make(f"mamujoco:{scenario}", **EXTRA.get(scenario, {}), **setting)
    runner = adapter_runner(env, num_envs, num_steps)
    key = jax.random.PRNGKey(0)
    t0 = time.perf_counter()
    carry = jax.block_until_ready(runner.init(key))
    carry, _, _ = _timed(runner, carry, key)
    compile_s = time.perf_counter() - t0
    walls, cpus = [], []
    for rep in range(repeats):
        carry, wall, cpu = _timed(runner, carry, jax.random.fold_in(key, rep + 1))
        walls.append(wall)
        cpus.append(cpu)
    work = num_envs * num_steps
    return dict(num_envs=num_envs, num_steps=num_steps, repeats=repeats,
                steps_per_s=work / statistics.median(walls),
                steps_per_cpu_s=work / statistics.median(cpus), compile_s=compile_s,
                wall_s=walls, cpu_s=cpus)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", nargs="+", default=list(GYM), choices=list(GYM))
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--steps", type=int, default=20, help="steps per timed scan")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--episodes", type=int, default=8, help="episodes of the physics check")
    p.add_argument("--horizon", type=int, default=100, help="steps per such episode at most")
    p.add_argument("--quick", action="store_true", help="hopper only, 2 episodes, 2 repeats")
    p.add_argument("--teacher", type=Path, default=None,
                   help="a teacher run directory: the physics check follows its sampled "
                        "actions instead of random ones")
    p.add_argument("--no-speed", action="store_true", help="the physics check only")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.scenarios, args.episodes, args.repeats = ["hopper_3x1"], 2, 2
    rows = []
    print("| scenario | setting | env-steps/s (CPU s) | compile s | obs error median / p99 / max "
          "| reward error max | ends differ |\n|---|---|---|---|---|---|---|", flush=True)
    for scenario in args.scenarios:
        for label in args.settings:
            setting = SETTINGS[label]
            if scenario == "halfcheetah_6x1" and setting.get("integrator") == "euler":
                continue  # its file already uses Euler
            row = dict(scenario=scenario, setting=label, overrides=setting,
                       **({} if args.no_speed else
                          speed(scenario, setting, args.num_envs, args.steps, args.repeats)),
                       **physics_error(scenario, setting, args.episodes, args.horizon,
                                       args.teacher))
            rows.append(row)
            fast = ("– | –" if args.no_speed else
                    f"{row['steps_per_s']:,.0f} ({row['steps_per_cpu_s']:,.0f}) | "
                    f"{row['compile_s']:.0f}")
            print(f"| {scenario} | {label} | {fast} | "
                  f"{row['obs_err_median']:.1e} / {row['obs_err_p99']:.1e} / "
                  f"{row['obs_err_max']:.1e} ({row['obs_err_steps_above']['0.1']} over 0.1) | "
                  f"{row['reward_err_max']:.1e} | "
                  f"{row['end_differs']} of {row['steps']} steps |", flush=True)
    out = dict(benchmark="mamujoco_solver", host=socket.gethostname(),
               date=datetime.date.today().isoformat(), platform=platform.platform(),
               cpu_count=os.cpu_count(), jax=jax.__version__,
               backend=jax.default_backend(), mujoco=_version("mujoco"),
               mujoco_mjx=_version("mujoco-mjx"), args={k: str(v) for k, v in vars(args).items()},
               rows=rows)
    tag = "" if args.teacher is None else "-teacher"
    path = args.out or RESULTS / f"mamujoco_solver{tag}-vm-{out['date']}.json"
    if not args.quick or args.out:
        path.write_text(json.dumps(out, indent=1))
        print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
