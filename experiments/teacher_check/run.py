"""Does a teacher trained with the same preset, seed and budget reach the
same evaluation return as before a change to the training code?

Trains ``--seeds`` teachers of one preset with whatever ``jaxil`` is on the
path (run it from two checkouts to compare them), one ``jaxil teach`` run per
seed, and records each run's final and best checkpoint evaluation (128
episodes, sampled actions, the same reset keys for every checkpoint)::

    python experiments/teacher_check/run.py --env smax:3m --seeds 0 1 2 --label new --out DIR
    python experiments/teacher_check/run.py --compare DIR/old.json DIR/new.json

``--compare`` prints the mean ± std over seeds of both, and whether the
difference of the means lies within the seed-to-seed spread (the larger of
the two standard deviations).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def _evals(doc: dict, key: str) -> dict:
    ckpts = doc["checkpoints"]
    final = ckpts[-1][key]
    best = max(ckpts, key=lambda c: (c[key]["return_mean"], c["step"]))
    out = dict(final_return=final["return_mean"], best_return=best[key]["return_mean"],
               best_step=best["step"])
    if "win_rate" in final:
        out.update(final_win=final["win_rate"], best_win=best[key]["win_rate"])
    return out


def train(args) -> int:
    from jaxil.teachers import train_teacher
    from jaxil.teachers.presets import preset

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = preset(args.env)
    runs = []
    for seed in args.seeds:
        t0 = time.perf_counter()
        doc = train_teacher(args.env, cfg, seed, str(out / f"{args.label}_seed{seed}"),
                            progress=False)
        runs.append(dict(seed=seed, wall_s=time.perf_counter() - t0,
                         stochastic=_evals(doc, "eval_stochastic"),
                         deterministic=_evals(doc, "eval_deterministic")))
        print(json.dumps(runs[-1]), flush=True)
    res = dict(env_id=args.env, label=args.label, config=cfg.to_dict(), runs=runs,
               random_baseline=doc["random_baseline"])
    (out / f"{args.label}.json").write_text(json.dumps(res, indent=2) + "\n")
    return 0


def compare(paths: list[str]) -> int:
    docs = [json.loads(Path(p).read_text()) for p in paths]
    if len({d["env_id"] for d in docs}) != 1:
        raise SystemExit("error: the files are for different environments")
    print(f"{docs[0]['env_id']}: {len(docs[0]['runs'])} seeds each "
          f"(random policy {docs[0]['random_baseline']['return_mean']:.3f})\n")
    keys = [k for k in ("final_return", "best_return", "final_win", "best_win")
            if k in docs[0]["runs"][0]["stochastic"]]
    print("| metric (sampled actions) | " + " | ".join(d["label"] for d in docs)
          + " | |difference| | spread (max std) |")
    print("|---" * (len(docs) + 3) + "|")
    for k in keys:
        vals = [np.array([r["stochastic"][k] for r in d["runs"]]) for d in docs]
        ms = [f"{v.mean():.3f} ± {v.std(ddof=1):.3f}" for v in vals]
        diff = abs(vals[0].mean() - vals[-1].mean())
        spread = max(v.std(ddof=1) for v in vals)
        print(f"| {k} | " + " | ".join(ms) + f" | {diff:.3f} | {spread:.3f} |")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="smax:3m")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--label", default="run")
    p.add_argument("--out", default="runs/teacher_check")
    p.add_argument("--compare", nargs="+", metavar="JSON", default=None)
    args = p.parse_args(argv)
    return compare(args.compare) if args.compare else train(args)


if __name__ == "__main__":
    sys.exit(main())
