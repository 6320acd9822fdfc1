"""Does the instruction set XLA compiles for change a MaMuJoCo rollout?

Rolls out the shipped hopper teacher's expert-tier checkpoint (sampled, the
dataset's solver settings, 8 episodes from one key) in child processes, one
per `XLA_FLAGS` setting: the host's own instruction set and the same capped
at `--xla_cpu_max_isa=<ISA>`. Each child prints the episodes' lengths and
returns, the first step whose observations differ from the first setting's
and a SHA-256 of all observations. The same setting twice shows that a
setting is deterministic; two settings that differ show that the compile
target alone changes the numbers, which is why a recipe's bytes depend on
the machine that builds it (`docs/datasets.md`).

    python experiments/misodice_table/compile_target.py              # host, host, AVX2
    python experiments/misodice_table/compile_target.py --caps AVX2 AVX

Writes `results/compile_target.json`. Each child compiles the rollout
(about 1-2 min on 2 cores).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "results" / "compile_target.json"
TEACHER = ROOT / "jaxil" / "teachers" / "shipped" / "mamujoco_hopper_3x1"
EXPERT_STEP = 2703360  # the zoo's expert tier of the hopper dataset
EPISODES = 8


def rollout() -> dict:
    """One setting's episodes (runs in a child, after `XLA_FLAGS` is set)."""
    import jax
    import numpy as np

    from jaxil import envs
    from jaxil.runs.measure import compute_target
    from jaxil.teachers.io import load_checkpoint

    env = envs.make("mamujoco:hopper_3x1", iterations=4, ls_iterations=8)
    policy, params, _, _ = load_checkpoint(TEACHER, step=EXPERT_STEP)
    run = jax.jit(lambda p, k: envs.run_episodes(env, policy, p, k, EPISODES))
    ep = jax.device_get(run(params, jax.random.key(0)))
    obs = np.asarray(ep.obs)
    return dict(target=compute_target(), lengths=np.asarray(ep.length).tolist(),
                returns=np.asarray(ep.episode_return).reshape(EPISODES, -1)[:, 0].tolist(),
                obs_sha256=hashlib.sha256(obs.tobytes()).hexdigest(),
                obs=obs.reshape(EPISODES, obs.shape[1], -1).tolist())


def first_difference(a: list, b: list) -> int | None:
    """The first time step at which any episode's observations differ."""
    import numpy as np

    x, y = np.asarray(a), np.asarray(b)
    differ = (x != y).any(axis=(0, 2))
    return int(np.argmax(differ)) if differ.any() else None


def main(argv=None) -> int:
    if os.environ.get("_JAXIL_COMPILE_TARGET_CHILD"):
        print(json.dumps(rollout()))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--caps", nargs="+", default=["AVX2"],
                   help="--xla_cpu_max_isa values to run after the host's own setting (twice)")
    args = p.parse_args(argv)
    settings = [None, None] + args.caps
    runs = []
    for cap in settings:
        env = dict(os.environ, _JAXIL_COMPILE_TARGET_CHILD="1", JAX_PLATFORMS="cpu")
        env.pop("XLA_FLAGS", None)
        if cap is not None:
            env["XLA_FLAGS"] = f"--xla_cpu_max_isa={cap}"
        out = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True)
        if out.returncode != 0:
            tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise SystemExit(f"error: the rollout with max ISA {cap or 'host'} failed: {tail}")
        runs.append(dict(cap=cap, **json.loads(out.stdout.strip().splitlines()[-1])))
    base = runs[0]
    rows = []
    for r in runs:
        r["first_differing_step"] = first_difference(base["obs"], r["obs"])
        rows.append({k: v for k, v in r.items() if k != "obs"})
        print(f"{r['target']:<60} returns {' '.join(f'{x:.6f}' for x in r['returns'][:4])} ... "
              f"obs sha256 {r['obs_sha256'][:12]}  first step differing from the first run: "
              f"{r['first_differing_step']}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(dict(command="python experiments/misodice_table/compile_target.py "
                                   + " ".join(["--caps", *args.caps]),
                                   teacher_step=EXPERT_STEP, episodes=EPISODES, runs=rows),
                              indent=1))
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
