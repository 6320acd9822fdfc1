"""The quickstart: scripted and random demonstrators on SMAX, side by side.

``python -m jaxil.quickstart`` (or ``jaxil quickstart``) rolls out SMAX's
scripted heuristic and the uniformly random policy on a few maps, each as one
jitted, vectorized program, and prints mean return and win rate.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import envs
from envs.policies import random_policy
from envs.smax import heuristic_policy

DEFAULT_MAPS = ("smax:3m", "smax:2s3z", "smax:smacv2_5_units")


def evaluate_policies(env_id: str, episodes: int, seed: int) -> list[dict]:
    env = envs.make(env_id)
    rows = []
    for name, pol in (("heuristic", heuristic_policy(env)), ("random", random_policy(env.spec))):
        run = jax.jit(lambda k, pol=pol: envs.run_episodes(env, pol, None, k, episodes))
        t0 = time.perf_counter()
        ep = jax.block_until_ready(run(jax.random.PRNGKey(seed)))
        ret = np.asarray(ep.episode_return)
        rows.append(
            dict(
                env=env_id,
                policy=name,
                episodes=episodes,
                mean_return=float(ret.mean()),
                std_return=float(ret.std()),
                win_rate=float(np.asarray(ep.won).mean()),
                mean_length=float(np.asarray(ep.length).mean()),
                seconds=time.perf_counter() - t0,
            )
        )
    return rows


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(prog="jaxil quickstart", description=__doc__.splitlines()[0])
    p.add_argument("--envs", default=",".join(DEFAULT_MAPS), help="comma-separated SMAX ids")
    p.add_argument("--episodes", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rows = []
    print(f"{'env':<22}{'policy':<11}{'return':>16}{'win rate':>10}{'length':>8}{'time s':>8}")
    for eid in args.envs.split(","):
        for r in evaluate_policies(eid.strip(), args.episodes, args.seed):
            rows.append(r)
            print(
                f"{r['env']:<22}{r['policy']:<11}{r['mean_return']:>9.3f} ± {r['std_return']:<5.2f}"
                f"{r['win_rate']:>10.3f}{r['mean_length']:>8.1f}{r['seconds']:>8.1f}"
            )
    return rows


if __name__ == "__main__":
    main()
