"""The quickstart: demonstrators, a mixed-quality dataset, BC vs MisoDICE.

`jaxil quickstart` (or `python -m jaxil.cli.quickstart`):

1. rolls out SMAX's scripted heuristic and the uniformly random policy on a
   few maps (one jitted, vectorized program each) and prints mean return and
   win rate;
2. collects a small mixed-quality SMAX 3m dataset (heuristic = expert,
   ε-noised heuristic = poor), trains BC on all data D_U, MisoDICE, and BC
   on the expert episodes D_E alone (the reference), several seeds vmapped
   in one program each, evaluates all three in the environment, and says in
   one line what the comparison means.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from jaxil import envs
from jaxil.envs.policies import random_policy
from jaxil.envs.smax import heuristic_policy
from jaxil.cli.args import nonneg_int, positive_int

DEFAULT_MAPS = ("smax:3m", "smax:2s3z", "smax:smacv2_5_units")


def evaluate_policies(env_id: str, episodes: int, seed: int) -> list[dict]:
    env = envs.make(env_id)
    rows = []
    for name, pol in (("heuristic", heuristic_policy(env)), ("random", random_policy(env.spec))):
        run = jax.jit(lambda k, pol=pol: envs.run_episodes(env, pol, None, k, episodes))
        t0 = time.perf_counter()
        ep = jax.block_until_ready(run(jax.random.PRNGKey(seed)))
        s = envs.episode_summary(ep, has_win=True)
        rows.append(dict(env=env_id, policy=name, episodes=episodes,
                         mean_return=s["return_mean"], std_return=s["return_std"],
                         win_rate=s["win_rate"], mean_length=s["length_mean"],
                         seconds=time.perf_counter() - t0))
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The quickstart's flags (shared by `jaxil quickstart` and `main`)."""
    p.add_argument("--envs", default=",".join(DEFAULT_MAPS), help="comma-separated SMAX ids")
    p.add_argument("--episodes", type=positive_int, default=256)
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--skip-learning", action="store_true", help="only the policy table")
    p.add_argument("--updates", type=positive_int, default=500)
    p.add_argument("--seeds", type=positive_int, default=4)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(prog="jaxil quickstart", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


def run(args: argparse.Namespace) -> list[dict]:
    rows = []
    print(f"{'env':<22}{'policy':<11}{'return':>16}{'win rate':>10}{'length':>8}{'time s':>8}")
    for eid in args.envs.split(","):
        for r in evaluate_policies(eid.strip(), args.episodes, args.seed):
            rows.append(r)
            print(
                f"{r['env']:<22}{r['policy']:<11}{r['mean_return']:>9.3f} ± {r['std_return']:<5.2f}"
                f"{r['win_rate']:>10.3f}{r['mean_length']:>8.1f}{r['seconds']:>8.1f}"
            )
    if not args.skip_learning:
        rows.extend(learning_demo(args.updates, args.seeds, args.seed))
    return rows


# Each learner of the demo, as the table names it.
DEMO_LEARNERS = (("bc_union", "BC(D_U)"), ("misodice", "MisoDICE"), ("bc_expert", "BC(D_E)"))


def meaning(expert_episodes: int) -> str:
    """What the table means, printed under it."""
    return (f"BC(D_E), BC on the {expert_episodes} clean expert episodes alone, is the "
            f"reference: with clean expert labels, use them; MisoDICE is the tool when expert "
            f"labels are few or the mixed data is all you have.")


def learning_demo(updates: int, seeds: int, seed: int, expert_episodes: int = 40,
                  poor_episodes: int = 200, eval_episodes: int = 64) -> list[dict]:
    """A mixed SMAX 3m dataset (by default 40 expert + 200 poor episodes);
    BC(D_U), MisoDICE and BC(D_E) trained on it, then evaluated."""
    from jaxil.envs.policies import epsilon_mixture
    from jaxil.data import Dataset, concatenate
    from jaxil.algorithms.offline import LearnerData, make_learner
    from jaxil.algorithms.offline.train import expand_grid, train

    env = envs.make("smax:3m")
    spec = env.spec
    heur = heuristic_policy(env)
    collect = lambda pol, n, s: jax.jit(lambda k: envs.run_episodes(env, pol, None, k, n))(
        jax.random.PRNGKey(s))
    t0 = time.perf_counter()
    ds = concatenate([
        Dataset.from_episodes(collect(heur, expert_episodes, seed + 1), spec, "expert",
                              "heuristic", seed + 1, expert=True),
        Dataset.from_episodes(collect(epsilon_mixture(heur, spec, 0.8), poor_episodes, seed + 2),
                              spec, "poor", "heuristic-eps0.8", seed + 2, expert=False),
    ]).shuffle(seed)
    print(f"\nSMAX 3m dataset: {expert_episodes} expert + {poor_episodes} poor episodes, "
          f"{ds.num_transitions} transitions ({time.perf_counter() - t0:.0f}s)")
    data = LearnerData.from_dataset(ds, np.asarray(ds.expert))
    rows = []
    print(f"{'learner':<12}{'seeds':>6}{'return':>18}{'win rate':>16}{'time s':>8}")
    for algo, label in DEMO_LEARNERS:
        learner = make_learner(algo, spec, hidden=(64, 64), batch_size=256)
        out = train(learner, env, data, runs=expand_grid({}, seeds), num_updates=updates,
                    eval_every=updates, eval_episodes=eval_episodes, base_seed=seed,
                    progress=False)
        p = out["points"][0]
        print(f"{label:<12}{seeds:>6}{p['return_mean']:>10.3f} ± {p['return_std']:<5.3f}"
              f"{p['win_mean']:>9.3f} ± {p['win_std']:<5.3f}{out['wall_seconds']:>8.1f}")
        rows.append(dict(env="smax:3m", policy=algo, **{k: v for k, v in p.items() if k != "grid"}))
    print(f"(± is the population std over seeds.) {meaning(expert_episodes)}")
    return rows


if __name__ == "__main__":
    main()
