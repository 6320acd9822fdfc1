"""Phase 1 experiments: labelling quality and what it buys in Phase 2.

On each environment's ``misodice-200e-1000p`` dataset (200 expert + 1000
poor trajectories, expert flags hidden from Phase 1):

1. labelling precision / accuracy / AUC vs the label-flip rate of the
   ground-truth oracle (0, 5, 10, 20, 30 %), 1000 whole-trajectory queries;
2. the same vs the query budget (noiseless oracle);
3. top-K ablation: labelling metrics for several K from one O-MAPL fit
   (and Phase-2 MisoDICE return for the K in ``--phase2-ks``);
4. Phase-2 MisoDICE return with Phase-1 labels (K = 200) vs ground-truth
   labels vs no Phase 1 (every trajectory labelled expert).

Each O-MAPL fit trains ``--label-seeds`` seeds in one program; metrics are
mean ± std over those seeds (each seed's own top-K labels); Phase 2 uses the
seed-ensemble labels and trains ``--seeds`` seeds in one program. Writes
``results.json``, ``table.md``, ``labelling.png`` and ``phase2.png``.

    python experiments/phase1/run.py                 # CPU size (see table.md for the time)
    python experiments/phase1/run.py --label-updates 5000 --updates 20000 --hidden 256 256  # GPU size
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from jaxil.algorithms.offline import LearnerData, make_learner
from jaxil.algorithms.labelling.label import ensemble_scores, label_metrics, top_labels
from jaxil.algorithms.labelling.oracles import GroundTruthOracle
from jaxil.algorithms.labelling.pipeline import phase1
from jaxil.runs.result_cache import ResultCache
from jaxil.algorithms.offline.train import expand_grid, train
from jaxil.collect.recipes import load_dataset
from jaxil.data.environment import dataset_env

DEFAULT_ENVS = ("smax-3m", "mpe-simple_spread_continuous")
FLIPS = (0.0, 0.05, 0.1, 0.2, 0.3)
BUDGETS = (100, 300, 1000, 3000)
TOP_KS = (100, 200, 400)
KEYS = ("precision", "recall", "accuracy", "auc", "spearman")


def _stats(per_seed: list[dict]) -> dict:
    return {k: [float(np.mean([m[k] for m in per_seed])), float(np.std([m[k] for m in per_seed]))]
            for k in KEYS}


class _Fit:
    def __init__(self, d):
        self.per_seed, self.scores = d["per_seed"], np.asarray(d["scores"])


def run_env(name: str, args) -> dict:
    ds = load_dataset(f"{name}/misodice-200e-1000p", args.data_seed)
    env = dataset_env(ds)
    truth = np.asarray(ds.expert, bool)
    cfg = dict(hidden=tuple(args.label_hidden), batch_size=args.pairs_per_batch)
    common = dict(seeds=args.label_seeds, updates=args.label_updates, seed=args.seed, **cfg)
    res: dict = dict(env=ds.spec.env_id, flip={}, budget={}, top_k={}, phase2={})
    settings = {k: getattr(args, k) for k in ("label_seeds", "label_updates", "label_hidden",
                                              "pairs_per_batch", "seeds", "updates", "hidden",
                                              "batch_size", "evals", "eval_episodes", "seed",
                                              "data_seed")}
    fit_keys = ("label_seeds", "label_updates", "label_hidden", "pairs_per_batch", "seed", "data_seed")
    cache = ResultCache(Path(args.out) / f".cache-{name}.json", settings,
                   {"fit:": fit_keys, "phase2:": tuple(settings)})

    def fit(queries, flip):
        key = f"fit:{queries}:{flip}"
        if cache.get(key) is None:
            t = time.perf_counter()
            out = phase1(ds, GroundTruthOracle(flip_rate=flip, seed=args.seed), queries=queries,
                         top_k=200, **common)
            print(f"{ds.spec.env_id} flip {flip:.2f} queries {queries}: precision "
                  f"{np.mean([m['precision'] for m in out.per_seed]):.3f} "
                  f"({time.perf_counter() - t:.0f}s)", flush=True)
            cache.put(key, dict(per_seed=out.per_seed, scores=out.scores.tolist()))
        return _Fit(cache.get(key))

    base = None
    for flip in args.flips:
        out = fit(args.queries, flip)
        res["flip"][str(flip)] = _stats(out.per_seed)
        if flip == 0.0:
            base = out
    for q in args.budgets:
        out = base if (q == args.queries and base is not None) else fit(q, 0.0)
        res["budget"][str(q)] = _stats(out.per_seed)
    if base is None:
        base = fit(args.queries, 0.0)

    # Top-K ablation and Phase 2, from the noiseless fit.
    ens = ensemble_scores(base.scores)
    learner = make_learner("misodice", ds.spec, hidden=tuple(args.hidden), batch_size=args.batch_size)
    settings = {f"phase1_k{k}": top_labels(ens, top_k=k) for k in args.phase2_ks}
    settings["ground_truth"] = truth
    settings["no_phase1"] = np.ones_like(truth)
    for k in sorted(set(args.top_ks) | set(args.phase2_ks)):
        per_seed = [label_metrics(top_labels(s, top_k=k), truth, s, ds.episode_return)
                    for s in base.scores]
        res["top_k"][str(k)] = dict(_stats(per_seed), ensemble=label_metrics(
            top_labels(ens, top_k=k), truth, ens, ds.episode_return))
    for name_, labels in settings.items():
        key = f"phase2:{name_}:{hash_labels(labels)}"
        if cache.get(key) is None:
            s = train(learner, env, LearnerData.from_dataset(ds, labels),
                      runs=expand_grid({}, args.seeds), num_updates=args.updates,
                      eval_every=args.updates // args.evals, eval_episodes=args.eval_episodes,
                      base_seed=args.seed, progress=True)
            p = s["points"][0]
            cache.put(key, {k: p[k] for k in ("return_mean", "return_std", "win_mean",
                                              "win_std", "returns")})
            print(f"{ds.spec.env_id} phase2 {name_}: {p['return_mean']:.3f} ± "
                  f"{p['return_std']:.3f}", flush=True)
        res["phase2"][name_] = cache.get(key)
    res["has_win"] = bool(env.spec.has_win)
    return res


def hash_labels(labels) -> str:
    import hashlib

    return hashlib.sha256(np.packbits(np.asarray(labels, bool)).tobytes()).hexdigest()[:12]


def _fmt(ms):
    return f"{ms[0]:.3f} ± {ms[1]:.3f}"


def write_outputs(results: list[dict], out: Path, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(dict(meta, envs=results), indent=2))
    L = []
    for r in results:
        e = r["env"]
        L += [f"### {e}", "", "Labelling vs label-flip rate (1000 queries, top-200):", "",
              "| flip | precision | accuracy | AUC | Spearman |", "|---|---|---|---|---|"]
        L += [f"| {float(f):.0%} | {_fmt(m['precision'])} | {_fmt(m['accuracy'])} | "
              f"{_fmt(m['auc'])} | {_fmt(m['spearman'])} |" for f, m in r["flip"].items()]
        L += ["", "Labelling vs query budget (noiseless):", "",
              "| queries | precision | accuracy | AUC | Spearman |", "|---|---|---|---|---|"]
        L += [f"| {q} | {_fmt(m['precision'])} | {_fmt(m['accuracy'])} | {_fmt(m['auc'])} | "
              f"{_fmt(m['spearman'])} |" for q, m in r["budget"].items()]
        L += ["", "Phase 2 (MisoDICE) by the labels it is given:", "",
              "| labels | precision of labels | return | win rate |", "|---|---|---|---|"]
        for k, p in r["phase2"].items():
            prec = "1.000" if k == "ground_truth" else (
                f"{200 / 1200:.3f}" if k == "no_phase1" else
                f"{r['top_k'][k.split('_k')[1]]['ensemble']['precision']:.3f}")
            win = f"{p['win_mean']:.2f} ± {p['win_std']:.2f}" if r["has_win"] else "-"
            L.append(f"| {k} | {prec} | {p['return_mean']:.3f} ± {p['return_std']:.3f} | {win} |")
        L.append("")
    L += [f"Command: `{meta['command']}`  ", f"Wall time: {meta['wall_seconds']:.0f}s. "
          f"O-MAPL: {meta['label_seeds']} seeds × {meta['label_updates']} updates per fit, "
          f"{meta['pairs_per_batch']} pairs per batch, whole trajectories; labelling metrics are "
          f"mean ± std over the O-MAPL seeds (each seed's own top-K). Phase 2: MisoDICE, "
          f"{meta['seeds']} seeds × {meta['updates']} updates on the seed-ensemble labels, "
          f"final evaluation over {meta['eval_episodes']} episodes per seed."]
    (out / "table.md").write_text("\n".join(L) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
    for r in results:
        f = sorted(r["flip"], key=float)
        for key, ls in (("precision", "-"), ("auc", "--")):
            ax[0].errorbar([100 * float(x) for x in f], [r["flip"][x][key][0] for x in f],
                           yerr=[r["flip"][x][key][1] for x in f], ls=ls, marker="o", capsize=3,
                           label=f"{r['env']} {key}")
        q = sorted(r["budget"], key=int)
        ax[1].errorbar([int(x) for x in q], [r["budget"][x]["precision"][0] for x in q],
                       yerr=[r["budget"][x]["precision"][1] for x in q], marker="o", capsize=3,
                       label=r["env"])
        ks = sorted(r["top_k"], key=int)
        ax[2].plot([int(k) for k in ks], [r["top_k"][k]["ensemble"]["precision"] for k in ks],
                   marker="o", label=f"{r['env']} precision")
        ax[2].plot([int(k) for k in ks], [r["top_k"][k]["ensemble"]["recall"] for k in ks],
                   marker="s", ls="--", label=f"{r['env']} recall")
    ax[0].set(xlabel="label-flip rate (%)", ylabel="top-200 precision / AUC",
              title="labelling vs oracle noise")
    ax[1].set(xscale="log", xlabel="queries", ylabel="top-200 precision", title="vs query budget")
    ax[2].set(xlabel="K (trajectories labelled expert)", title="top-K (200 true experts)")
    for a in ax:
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "labelling.png", dpi=120)

    fig, axes = plt.subplots(1, len(results), figsize=(4.5 * len(results), 3.6), squeeze=False)
    for a, r in zip(axes[0], results):
        names = list(r["phase2"])
        a.bar(range(len(names)), [r["phase2"][n]["return_mean"] for n in names],
              yerr=[r["phase2"][n]["return_std"] for n in names], capsize=3,
              color=["#58c"] * (len(names) - 2) + ["#6a9", "#999"])
        a.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        a.set(title=f"{r['env']}: MisoDICE return", ylabel="return")
    fig.tight_layout()
    fig.savefig(out / "phase2.png", dpi=120)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", default=",".join(DEFAULT_ENVS))
    p.add_argument("--flips", type=float, nargs="+", default=list(FLIPS))
    p.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    p.add_argument("--top-ks", type=int, nargs="+", default=list(TOP_KS))
    p.add_argument("--phase2-ks", type=int, nargs="+", default=[200],
                   help="K values whose labels are also used to train Phase 2 (MisoDICE)")
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--label-seeds", type=int, default=3)
    p.add_argument("--label-updates", type=int, default=1000)
    p.add_argument("--label-hidden", type=int, nargs="+", default=[64, 64])
    p.add_argument("--pairs-per-batch", type=int, default=8)
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--updates", type=int, default=2000)
    p.add_argument("--evals", type=int, default=2)
    p.add_argument("--eval-episodes", type=int, default=32)
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    results = [run_env(n.strip(), args) for n in args.envs.split(",")]
    meta = dict(command="python " + " ".join([sys.argv[0]] + (sys.argv[1:] if argv is None else argv)),
                wall_seconds=time.perf_counter() - t0,
                **{k: getattr(args, k) for k in ("label_seeds", "label_updates", "pairs_per_batch",
                                                 "seeds", "updates", "eval_episodes", "queries")})
    write_outputs(results, Path(args.out), meta)
    print((Path(args.out) / "table.md").read_text())


if __name__ == "__main__":
    main()
