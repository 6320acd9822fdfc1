"""DAgger against BC on multi-agent Hopper at the expert-label budgets of the
GAIL/AIRL grid's whole-trajectory rows.

    python experiments/irl/hopper_dagger.py --demos 4     # one budget (about 10-20 min on 2 cores)
    python experiments/irl/hopper_dagger.py --demos 4 11 25
    python experiments/irl/hopper_dagger.py --demos 4 --quick   # smoke run
    python experiments/irl/hopper_dagger.py --expert-greedy     # the expert acts on its mean

Per budget, ONE interactive program (`jaxil.algorithms.interactive.loop.run`,
4 seeds, both regimes vmapped):

- the expert is the shipped MAPPO hopper teacher (its zoo expert tier, the
  checkpoint the dataset's expert trajectories come from, acting sampled, or
  with `--expert-greedy` on its mean action, the label `imitation`'s DAgger
  asks its expert for; `jaxil interactive --expert-greedy`) on
  `mamujoco:hopper_3x1` at the dataset's solver settings (4/8 iterations);
  the demonstrations and every label come from the same policy;
- the budget is `demos` × 1,281 expert labels (agent-steps): the dataset's
  expert trajectories last 427 steps on average, × 3 agents, so `--demos 4`
  buys as many labels as the grid's 4 whole trajectories;
- the student is the PPO actor's network (`student="ppo"`: tanh 64-64, a
  tanh-Gaussian head, observations standardised by the SFT demonstrations),
  the network GAIL and AIRL train;
- `bc` spends the whole budget on expert episodes and clones them;
  `dagger` clones the first `SFT_LABELS` labels' worth of expert episodes, then
  rolls out a β-mixture of student and expert (β = 0.5 · 0.5^round) and
  buys the expert's label of every visited state with the rest;
- 1,000 SFT updates, then 8 rounds of 250 updates (batch 256, lr 1e-3);
  4 rollouts per run and round; greedy evaluations (16 episodes, the same
  start states for every run) at rounds 0, 4 and 8.

Writes `results/hopper_<d>d_full_dagger.json` (`..._dagger_greedy.json` with
`--expert-greedy`; read by `hopper_grid.py`). Run directories go under
`runs/experiments/irl/hopper_dagger/` and resume.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "experiments" / "irl" / "results"
RUNS = ROOT / "runs" / "experiments" / "irl" / "hopper_dagger"
ENV = "mamujoco:hopper_3x1"
ENV_KWARGS = {"iterations": 4, "ls_iterations": 8}
TEACHER = ROOT / "jaxil" / "teachers" / "shipped" / "mamujoco_hopper_3x1"
SEEDS = 4
#: Expert labels per trajectory of the dataset's expert tier (427 steps × 3 agents).
LABELS_PER_TRAJECTORY = 1281
#: DAgger's SFT set: about two expert episodes (whole episodes up to this many labels).
SFT_LABELS = 2600


def config(quick: bool):
    from jaxil.algorithms.interactive.config import InteractiveConfig

    if quick:
        return InteractiveConfig(hidden=(64, 64), rounds=2, envs_per_round=2, updates_per_round=20,
                                 sft_labels=SFT_LABELS, sft_updates=20, capacity=12288,
                                 eval_episodes=2, deterministic_eval=True, student="ppo")
    return InteractiveConfig(hidden=(64, 64), batch_size=256, rounds=8, envs_per_round=4,
                             updates_per_round=250, sft_labels=SFT_LABELS, sft_updates=1000,
                             capacity=12288, eval_episodes=16, deterministic_eval=True,
                             student="ppo")


def run_budget(demos: int, args) -> dict:
    from jaxil.algorithms.interactive.config import regime
    from jaxil.algorithms.interactive.loop import run
    from jaxil.cli.interactive import load_expert
    from jaxil.runs.rundir import read_jsonl

    env, policy, params, source = load_expert(ENV, str(TEACHER), dict(ENV_KWARGS),
                                              greedy=args.expert_greedy)
    cfg = config(args.quick)
    budget = demos * LABELS_PER_TRAJECTORY
    kw = dict(sft_labels=cfg.sft_labels, has_win=env.spec.has_win)
    regimes = [("bc", regime("bc", budget, **kw)), ("dagger", regime("dagger", budget, **kw))]
    out = RUNS / f"{demos}d{'_greedy' if args.expert_greedy else ''}{'_quick' if args.quick else ''}"
    eval_every = 1 if args.quick else 4
    t0 = time.time()
    summary = run(env, policy, params, regimes, seeds=SEEDS, config=cfg, out_dir=out,
                  resume=(out / "run.json").exists(), eval_every=eval_every,
                  progress=not args.no_progress, diagnostics=False,
                  run_info=dict(expert=source, env_kwargs=ENV_KWARGS, budget=budget,
                              expert_greedy=args.expert_greedy))
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "eval_return" in r]
    curves = {}
    for name, _ in regimes:
        mine = [r for r in rows if r["regime"] == name]
        rounds = sorted({r["round"] for r in mine})
        at = lambda k, t: [r[k] for r in mine if r["round"] == t]  # noqa: E731
        curves[name] = dict(round=rounds,
                            eval_return=[float(np.mean(at("eval_return", t))) for t in rounds],
                            eval_return_std=[float(np.std(at("eval_return", t))) for t in rounds],
                            eval_length=[float(np.mean(at("eval_length", t))) for t in rounds],
                            labels=[float(np.mean(at("labels", t))) for t in rounds])
    return dict(demos=demos, budget=budget, sft_labels=cfg.sft_labels, expert=source,
                expert_greedy=args.expert_greedy,
                expert_demos=summary["demos"], wall_seconds=time.time() - t0,
                run_dir=str(out.relative_to(ROOT)), config=cfg.to_dict(),
                regimes={e["regime"]: {k: e[k] for k in ("return_mean", "return_std", "returns",
                                                         "labels_mean")}
                         for e in summary["regimes"]},
                curves=curves)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demos", type=int, nargs="+", default=[4, 11, 25],
                   help="budgets, in the labels of this many expert trajectories")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 rounds, tiny evaluations")
    p.add_argument("--expert-greedy", action="store_true",
                   help="the expert demonstrates and labels with its mean action instead of "
                        "sampling (results/hopper_<d>d_full_dagger_greedy.json)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if any(d < 3 for d in args.demos):
        p.error(f"--demos must be at least 3 (the SFT set alone is {SFT_LABELS} labels, "
                f"about 2 trajectories), got {args.demos}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    for d in args.demos:
        res = run_budget(d, args)
        flags = (" --expert-greedy" if args.expert_greedy else "") + (" --quick" if args.quick else "")
        doc = dict(command=f"python experiments/irl/hopper_dagger.py --demos {d}{flags}",
                   commit=commit, seeds=SEEDS, result=res)
        if not args.quick:
            OUT.mkdir(parents=True, exist_ok=True)
            name = f"hopper_{d}d_full_dagger{'_greedy' if args.expert_greedy else ''}.json"
            (OUT / name).write_text(json.dumps(doc, indent=1))
        for name, e in res["regimes"].items():
            print(f"{d} trajectories' labels ({res['budget']}): {name} "
                  f"{e['return_mean']:.0f} ± {e['return_std']:.0f} "
                  f"(labels {e['labels_mean']:.0f})")
        print(f"wall time {res['wall_seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
