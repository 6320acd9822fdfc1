"""MisoDICE's stabilisers against weight collapse: DemoDICE's vs the slow-ν fix.

On SMAX 3m MisoDICE's return falls as training goes on (0.97 after
2000 updates, 0.64 after 8000) while ν-loss sinks and the largest normalised
weight of a batch grows: weight collapse. jaxil's default against it is a slow
ν learning rate (``lr_critic`` 3e-5, 10× below the other networks); the
authors' DemoDICE code instead bounds the reward (the logit of a clipped
discriminator) and puts a small gradient penalty on ν. This script trains
MisoDICE under each variant on the same data and seeds and records the learning
curves of the evaluation return, the largest normalised weight and ν's loss
(the metrics ``jaxil.algorithms.offline.train`` writes per evaluation: those of
the chunk's last update).

Variants (``lr_critic`` 3e-4 is the rate of the other networks):

- ``slow_nu``: jaxil's default (``lr_critic`` 3e-5, logit reward, no ν penalty);
- ``fast_nu``: ``lr_critic`` 3e-4, nothing else (the collapse slow ν avoids);
- ``bounded``: fast ν with DemoDICE's bounded reward;
- ``nu_gp``: fast ν with DemoDICE's ν gradient penalty (1e-4);
- ``demodice``: fast ν with both (the DemoDICE code's setting);
- ``demodice_slownu``: both, and slow ν.

Default data: ``smax-3m/misodice-200e-1000p`` built with the heuristic expert
(the table's setting), which this script builds when it is missing::

    jaxil data build smax-3m/misodice-200e-1000p --no-teacher \\
        --out runs/data/smax-3m-misodice-200e-1000p-heuristic.npz

Run directories go under ``--runs`` (resumed where they stopped, reused when
finished); ``results.json``, ``table.md`` and ``curves.png`` into ``--out``.

    python experiments/misodice_stabilisers/run.py                 # 6 variants, 3 seeds, 8000 updates
    python experiments/misodice_stabilisers/run.py --variants slow_nu,demodice --updates 2000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from jaxil.cli.args import positive_int
from jaxil.algorithms.offline import LearnerData, make_learner
from jaxil.data.preferences import dataset_id
from jaxil.runs.plot import curves
from jaxil.algorithms.offline.train import expand_grid, train
from jaxil.collect.recipes import load_dataset
from jaxil.data.environment import dataset_env
from jaxil.data.labels import expert_labels, labels_digest

HERE = Path(__file__).parent
HEURISTIC = "runs/data/smax-3m-misodice-200e-1000p-heuristic.npz"
SLOW, FAST = 3e-5, 3e-4
#: name: (static config overrides, lr_critic, description)
VARIANTS = {
    "slow_nu": ({}, SLOW, "lr_critic 3e-5 (default)"),
    "fast_nu": ({}, FAST, "lr_critic 3e-4"),
    "bounded": (dict(reward="bounded"), FAST, "bounded reward, lr_critic 3e-4"),
    "nu_gp": (dict(nu_grad_penalty=True), FAST, "ν gradient penalty, lr_critic 3e-4"),
    "demodice": (dict(reward="bounded", nu_grad_penalty=True), FAST,
                 "bounded + ν penalty, lr_critic 3e-4 (DemoDICE)"),
    "demodice_slownu": (dict(reward="bounded", nu_grad_penalty=True), SLOW,
                        "bounded + ν penalty, lr_critic 3e-5"),
}
METRICS = (("eval_return", "evaluation return"), ("weight_max", "largest normalised weight"),
           ("nu_loss", "ν loss"))


def tier_returns(path: str) -> dict:
    """Measured tier returns of the dataset's ``.tiers.json`` sidecar, or {}."""
    from jaxil.collect.recipes import sidecar_path
    from jaxil.collect.recipes import dataset_path

    side = sidecar_path(dataset_path(path))
    if not side.exists():
        return {}
    tiers = json.loads(side.read_text())["tier_measurements"]["tiers"]
    return {t: v["mean_return"] for t, v in tiers.items()}


def per_seed(rows: list[dict], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """``(updates [T], values [S, T])`` of ``metric`` from metrics rows."""
    ups = sorted({r["update"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})
    v = np.full((len(seeds), len(ups)), np.nan)
    for r in rows:
        v[seeds.index(r["seed"]), ups.index(r["update"])] = r[metric]
    return np.array(ups), v


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln]


def summarise(name: str, rows: list[dict], ref: dict) -> dict:
    ups, ret = per_seed(rows, "eval_return")
    _, wmax = per_seed(rows, "weight_max")
    _, nu = per_seed(rows, "nu_loss")
    late = ups > ups[-1] / 2  # the second half of training
    out = dict(variant=name, description=VARIANTS[name][2], updates=ups.tolist(),
               return_curve=ret.mean(0).tolist(), return_curve_std=ret.std(0).tolist(),
               final_return=ret[:, -1].tolist(), best_return=ret.max(1).tolist(),
               late_min_return=ret[:, late].min(1).tolist(),
               weight_max_late=np.median(wmax[:, late], axis=1).tolist(),
               nu_loss_final=nu[:, -1].tolist())
    if "expert" in ref and "random" in ref and ref["expert"] != ref["random"]:
        scale = lambda x: ((np.asarray(x) - ref["random"]) / (ref["expert"] - ref["random"])).tolist()  # noqa: E731
        out.update(final_norm=scale(out["final_return"]), late_min_norm=scale(out["late_min_return"]),
                   curve_norm=scale(out["return_curve"]))
    return out


def write_table(results: list[dict], meta: dict, out: Path) -> None:
    ms = lambda x: f"{np.mean(x):.2f} ± {np.std(x):.2f}"  # noqa: E731
    norm = all("final_norm" in r for r in results)
    head = ["variant", "setting", "final return"] + (["final (norm.)"] if norm else []) + [
        "worst eval, 2nd half" + (" (norm.)" if norm else ""), "best eval",
        "median max weight, 2nd half", "final ν loss"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [r["variant"], r["description"], ms(r["final_return"])]
        if norm:
            cells.append(ms(r["final_norm"]))
        cells += [ms(r["late_min_norm"] if norm else r["late_min_return"]), ms(r["best_return"]),
                  ms(r["weight_max_late"]), ms(r["nu_loss_final"])]
        lines.append("| " + " | ".join(cells) + " |")
    curve = ["| variant | " + " | ".join(str(u) for u in results[0]["updates"]) + " |",
             "|---|" + "---|" * len(results[0]["updates"])]
    for r in results:
        curve.append(f"| {r['variant']} | " + " | ".join(
            f"{m:.2f}" for m in r["curve_norm" if norm else "return_curve"]) + " |")
    ref = meta["tiers"]
    (out / "table.md").write_text(
        f"MisoDICE on `{meta['dataset']}` ({meta['seeds']} seeds, {meta['updates']} updates, "
        f"hidden {meta['hidden']}, batch {meta['batch_size']}, {meta['eval_episodes']} evaluation "
        "episodes per seed and evaluation); mean ± std over seeds.\n\n" + "\n".join(lines)
        + ("\n\nNormalised: (R − R_random) / (R_expert − R_random) with the dataset's measured "
           f"tiers (expert {ref['expert']:.3f}, random {ref['random']:.3f})." if norm else "")
        + "\n\nMean evaluation return over seeds" + (" (normalised)" if norm else "")
        + " at each evaluation:\n\n" + "\n".join(curve)
        + f"\n\nCommand: `{meta['command']}`; training time {meta['train_seconds']:.0f}s "
        "(sum over variants, each timed when it ran).\n")


def plot(run_dirs: dict[str, Path], out: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(METRICS))
    for ax, (metric, title) in zip(axes, METRICS):
        for name, d in run_dirs.items():
            (ln,) = curves([d], metric)
            (h,) = ax.plot(ln["x"], ln["mean"], marker="o", markersize=3, label=name)
            ax.fill_between(ln["x"], ln["mean"] - ln["std"], ln["mean"] + ln["std"],
                            color=h.get_color(), alpha=0.15, linewidth=0)
        ax.set_title(f"{title} (mean ± 1 std over seeds)", fontsize=9)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
        if metric == "weight_max":
            ax.set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.savefig(out / "curves.png", dpi=110)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--seeds", type=positive_int, default=3)
    p.add_argument("--updates", type=positive_int, default=8000)
    p.add_argument("--eval-every", type=positive_int, default=1000)
    p.add_argument("--eval-episodes", type=positive_int, default=64)
    p.add_argument("--batch-size", type=positive_int, default=256)
    p.add_argument("--hidden", type=positive_int, nargs="+", default=[64, 64])
    p.add_argument("--dataset", default=HEURISTIC,
                   help="dataset file or recipe (default: smax-3m with the heuristic expert, "
                        "built if missing)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", default="runs/experiments/misodice_stabilisers",
                   help="parent of the run directories")
    p.add_argument("--out", default=str(HERE / "results"))
    args = p.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        raise SystemExit(f"error: unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    if args.updates % args.eval_every:
        raise SystemExit(f"error: --updates ({args.updates}) must be a multiple of "
                         f"--eval-every ({args.eval_every})")
    if args.dataset == HEURISTIC and not Path(HEURISTIC).exists():
        subprocess.run([sys.executable, "-m", "jaxil.cli.main", "data", "build",
                        "smax-3m/misodice-200e-1000p", "--no-teacher", "--out", HEURISTIC],
                       check=True)
    ds = load_dataset(args.dataset, 0)
    env = dataset_env(ds)
    flags = expert_labels(ds, "ground_truth")
    data = LearnerData.from_dataset(ds, flags)
    ref = tier_returns(args.dataset)
    t0 = time.perf_counter()
    train_seconds, run_dirs, results = 0.0, {}, []
    for name in names:
        cfg, lr, _ = VARIANTS[name]
        learner = make_learner("misodice", ds.spec, hidden=tuple(args.hidden),
                               batch_size=args.batch_size, **cfg)
        d = Path(args.runs) / name
        out = train(learner, env, data, runs=expand_grid({"lr_critic": [lr]}, args.seeds),
                    num_updates=args.updates, eval_every=args.eval_every,
                    eval_episodes=args.eval_episodes, out_dir=d, resume=True,
                    base_seed=args.seed, progress=True,
                    data_identity=dict(dataset=dataset_id(ds), labels=labels_digest(flags)))
        train_seconds += out["wall_seconds"]
        run_dirs[name] = d
        r = summarise(name, read_rows(d), ref)
        results.append(r)
        print(f"{name:<16} final {np.mean(r['final_return']):.3f} ± {np.std(r['final_return']):.3f}"
              f"  worst late {np.mean(r['late_min_return']):.3f}"
              f"  max weight {np.mean(r['weight_max_late']):.1f}  ({out['wall_seconds']:.0f}s)",
              flush=True)
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    meta = dict(command="python " + " ".join([sys.argv[0]] + (sys.argv[1:] if argv is None else argv)),
                dataset=args.dataset, dataset_id=dataset_id(ds), tiers=ref, seeds=args.seeds,
                updates=args.updates, eval_every=args.eval_every, eval_episodes=args.eval_episodes,
                batch_size=args.batch_size, hidden=args.hidden, seed=args.seed,
                train_seconds=train_seconds, wall_seconds=time.perf_counter() - t0)
    (outdir / "results.json").write_text(json.dumps(dict(meta, variants=results), indent=2))
    write_table(results, meta, outdir)
    plot(run_dirs, outdir)
    print((outdir / "table.md").read_text())


if __name__ == "__main__":
    main()
