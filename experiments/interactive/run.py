"""Interactive imitation against BC at equal expert-label budgets.

On each environment, ONE compiled program per round runs every regime × seed:
BC, on-policy rejection sampling, DAgger, OEC and OEC+BC mix at four budgets
(a scaling curve), plus the OEC ablations at the third budget: the switch
distribution (early, late, geometric against uniform), the prefix mask off,
the repetition filter off and the verifier off. Every regime starts from the
same SFT student (BC on ``--sft-episodes`` expert episodes' worth of labels),
and every student is evaluated on the same start states (one reset key).

Budgets are multiples of the SFT set's labels (×2, ×4, ×8, ×16), so they
scale with each environment's episode length and team size.

Writes into ``--out``: ``results.json`` (all rows, the covariate-shift
diagnostic), ``table.md``, ``scaling.png``, ``ablations.png``, ``shift.png``.
Each environment is cached in ``--out/.cache-<env>.json``: a killed run
resumes at the environment it stopped in.

    python experiments/interactive/run.py              # CPU size (see README.md for its wall time)
    python experiments/interactive/run.py --scale 4    # 4× the episodes per round and updates
    python experiments/interactive/run.py --quick      # a minute-long smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

DEFAULT_ENVS = ("smax:3m", "smax:2s3z", "jumanji:LevelBasedForaging-v0", "smax:smacv2_5_units")
# The far-from-perfect expert: the scripted heuristic on smacv2_5_units.
EXPERTS = {"smax:smacv2_5_units": "scripted", "jumanji:LevelBasedForaging-v0": "scripted"}
METHOD_LABELS = {"bc": "BC", "onpolicy": "on-policy RS", "dagger": "DAgger", "oec": "OEC",
                 "oec_mix": "OEC+BC mix"}
MULTIPLES = (2, 4, 8, 16)
ABLATION_MULTIPLE = 8
ABLATIONS = {
    "switch=early": dict(switch_kind="early"),
    "switch=late": dict(switch_kind="late"),
    "switch=geometric": dict(switch_kind="geometric", switch_p=0.15),
    "mask off": dict(mask_prefix=False),
    "repetition filter off": dict(repeat_limit=0),
    "verifier off": dict(verifier="off"),
}


def regimes_for(env, sft_labels: int) -> list[tuple[str, dict]]:
    from jaxil.algorithms.interactive.config import regime

    kw = dict(sft_labels=sft_labels, has_win=env.spec.has_win)
    out = []
    for m in MULTIPLES:
        for method in METHOD_LABELS:
            out.append((f"{method}@{m}", regime(method, sft_labels * m, **kw)))
    for name, over in ABLATIONS.items():
        out.append((f"oec[{name}]@{ABLATION_MULTIPLE}",
                    regime("oec", sft_labels * ABLATION_MULTIPLE, **kw, **over)))
    return out


def run_env(env_id: str, args) -> dict:
    import jax

    from jaxil.cli.interactive import load_expert
    from jaxil.algorithms.interactive.config import InteractiveConfig
    from jaxil.algorithms.interactive.loop import collect_demos, run

    env, policy, params, source = load_expert(env_id, EXPERTS.get(env_id, "zoo"))
    _, _, probe = collect_demos(env, policy, params, jax.random.PRNGKey(args.seed + 777_777), 64)
    n = env.spec.num_agents
    sft_labels = int(round(args.sft_episodes * n * probe["length_mean"]))
    capacity = int(np.ceil(sft_labels * MULTIPLES[-1] / n)) + 64
    config = InteractiveConfig(
        hidden=(64, 64), batch_size=256, rounds=args.rounds,
        envs_per_round=args.envs_per_round * args.scale,
        updates_per_round=args.updates_per_round * args.scale,
        sft_labels=sft_labels, sft_updates=args.sft_updates, capacity=capacity,
        eval_episodes=args.eval_episodes)
    regimes = regimes_for(env, sft_labels)
    t0 = time.perf_counter()
    import hashlib

    stamp = hashlib.sha256(json.dumps(settings_of(args), sort_keys=True).encode()).hexdigest()[:10]
    run_dir = Path(args.run_dir) / stamp / env_id.replace(":", "_")
    summary = run(env, policy, params, regimes, seeds=args.seeds, config=config,
                  base_seed=args.seed, progress=not args.no_progress, diagnostics=True,
                  out_dir=run_dir, resume=True, eval_every=args.eval_every,
                  run_info=dict(expert=source))
    summary.pop("states")
    wall = time.perf_counter() - t0
    return dict(env_id=env_id, expert=source, expert_probe=probe, sft_labels=sft_labels,
                config=config.to_dict(), wall_seconds=wall, summary=summary)


def _parse_name(name: str) -> tuple[str, str, int]:
    """``"oec[mask off]@8"`` -> ("oec", "mask off", 8)."""
    base, mult = name.rsplit("@", 1)
    ablation = ""
    if "[" in base:
        base, ablation = base[:-1].split("[", 1)
    return base, ablation, int(mult)


def table(results: list[dict]) -> str:
    lines = ["| environment | expert | budget (labels) | " + " | ".join(METHOD_LABELS.values()) + " |",
             "|---|---|---|" + "---|" * len(METHOD_LABELS)]
    for res in results:
        by = {p["regime"]: p for p in res["summary"]["regimes"]}
        win = res["expert_probe"]["win_rate"]
        exp = f"{res['expert']} ({res['expert_probe']['return_mean']:.2f}" + (
            f", win {win:.2f})" if win > 0 else ")")
        for m in MULTIPLES:
            cells = []
            best = max(by[f"{k}@{m}"]["return_mean"] for k in METHOD_LABELS)
            for k in METHOD_LABELS:
                p = by[f"{k}@{m}"]
                cell = f"{p['return_mean']:.3f} ± {p['return_std']:.3f}"
                cells.append(f"**{cell}**" if p["return_mean"] == best else cell)
            lines.append(f"| {res['env_id']} | {exp} | {res['sft_labels'] * m} | " + " | ".join(cells) + " |")
            exp = ""
    lines += ["", "Ablations of OEC at budget ×8 (return, mean ± std over seeds):", "",
              "| environment | OEC | " + " | ".join(ABLATIONS) + " |",
              "|---|---|" + "---|" * len(ABLATIONS)]
    for res in results:
        by = {p["regime"]: p for p in res["summary"]["regimes"]}
        cells = [by[f"oec@{ABLATION_MULTIPLE}"]] + [by[f"oec[{a}]@{ABLATION_MULTIPLE}"] for a in ABLATIONS]
        lines.append(f"| {res['env_id']} | " + " | ".join(
            f"{p['return_mean']:.3f} ± {p['return_std']:.3f}" for p in cells) + " |")
    return "\n".join(lines)


def comparisons(results: list[dict]) -> list[dict]:
    """Per environment and budget: each method minus BC, and whether the gap
    exceeds one standard deviation of both (the issue's criterion)."""
    out = []
    for res in results:
        by = {p["regime"]: p for p in res["summary"]["regimes"]}
        for m in MULTIPLES:
            bc = by[f"bc@{m}"]
            for k in ("dagger", "oec", "oec_mix", "onpolicy"):
                p = by[f"{k}@{m}"]
                gap = p["return_mean"] - bc["return_mean"]
                out.append(dict(env_id=res["env_id"], budget=res["sft_labels"] * m, method=k,
                                gap=gap, beats_bc=bool(gap > max(p["return_std"], bc["return_std"]))))
    return out


def gap_table(results: list[dict]) -> str:
    """Each method minus BC at equal budget; ✓ where the gap exceeds one
    standard deviation over seeds of both (the issue's criterion)."""
    comp = comparisons(results)
    methods = ("dagger", "oec", "oec_mix", "onpolicy")
    lines = ["| environment | budget (labels) | " + " | ".join(METHOD_LABELS[m] for m in methods)
             + " |", "|---|---|" + "---|" * len(methods)]
    for res in results:
        for m in MULTIPLES:
            b = res["sft_labels"] * m
            cells = []
            for k in methods:
                c = next(x for x in comp if x["env_id"] == res["env_id"] and x["budget"] == b
                         and x["method"] == k)
                cells.append(f"{c['gap']:+.3f}" + (" ✓" if c["beats_bc"] else ""))
            lines.append(f"| {res['env_id']} | {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shift_table(results: list[dict]) -> str:
    """Covariate shift at budgets ×2 and ×8: the expert–student disagreement on
    the student's own states averaged over the thirds of the expert's mean
    episode length L; the floor, two independent expert draws on the same
    (student's) states, over t < L; and the squared MMD of the first and the
    last time bin within 1.5 L (mean over seeds). The first row of each
    environment is the expert's self-disagreement on its own states."""
    lines = ["| environment | student | disagreement t∈[0,L/3) | [L/3,2L/3) | [2L/3,L) "
             "| expert vs itself, t<L | MMD² first bin | MMD² last bin |",
             "|---|---|---|---|---|---|---|---|"]
    arr = lambda xs: np.array([np.nan if x is None else x for x in xs], float)
    for res in results:
        shift = res["summary"]["shift"]
        L = max(3, int(round(shift["expert_length_mean"])))
        thirds = [(0, L // 3), (L // 3, 2 * L // 3), (2 * L // 3, L)]
        own = arr(shift["expert_self_on_expert"])[:L]
        lines.append(f"| {res['env_id']} | expert (own states) | "
                     + " | ".join(f"{np.nanmean(own[a:b]):.3f}" for a, b in thirds)
                     + f" | {np.nanmean(own):.3f} | | |")
        for m in (2, ABLATION_MULTIPLE):
            for k in ("bc", "dagger", "oec"):
                runs = [r for r in shift["runs"] if r["regime"] == f"{k}@{m}"]
                d = np.array([arr(r["disagreement"]) for r in runs])
                noise = np.array([arr(r["expert_self"]) for r in runs])
                mm = np.array([arr(r["mmd2"][:-1]) for r in runs])
                parts = [np.nanmean(d[:, a:b]) for a, b in thirds]
                col = np.nanmean(mm, 0)
                last = col[np.isfinite(col)][-1] if np.isfinite(col).any() else np.nan
                lines.append(f"| {res['env_id']} | {METHOD_LABELS[k]} @×{m} | "
                             + " | ".join(f"{x:.3f}" for x in parts)
                             + f" | {np.nanmean(noise[:, :L]):.3f}"
                             + f" | {col[0]:.4f} | {last:.4f} |")
    return "\n".join(lines)


def plots(results: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), squeeze=False)
    for ax, res in zip(axes[0], results):
        by = {p["regime"]: p for p in res["summary"]["regimes"]}
        for k, label in METHOD_LABELS.items():
            x = [res["sft_labels"] * m for m in MULTIPLES]
            y = np.array([by[f"{k}@{m}"]["return_mean"] for m in MULTIPLES])
            s = np.array([by[f"{k}@{m}"]["return_std"] for m in MULTIPLES])
            ax.plot(x, y, marker="o", label=label)
            ax.fill_between(x, y - s, y + s, alpha=0.15)
        ax.axhline(res["expert_probe"]["return_mean"], color="k", ls=":", lw=1, label="expert")
        ax.set_xscale("log", base=2)
        ax.set_title(res["env_id"])
        ax.set_xlabel("expert labels (agent-steps)")
        ax.set_ylabel("return (fixed start states)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "scaling.png", dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), squeeze=False)
    names = ["OEC"] + list(ABLATIONS)
    for ax, res in zip(axes[0], results):
        by = {p["regime"]: p for p in res["summary"]["regimes"]}
        ps = [by[f"oec@{ABLATION_MULTIPLE}"]] + [by[f"oec[{a}]@{ABLATION_MULTIPLE}"] for a in ABLATIONS]
        ax.bar(range(len(ps)), [p["return_mean"] for p in ps], yerr=[p["return_std"] for p in ps],
               color=["C3"] + ["C7"] * len(ABLATIONS))
        ax.set_xticks(range(len(ps)), names, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"{res['env_id']} (budget ×{ABLATION_MULTIPLE})")
        ax.set_ylabel("return")
    fig.tight_layout()
    fig.savefig(out / "ablations.png", dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(2, n, figsize=(4.2 * n, 6.4), squeeze=False)
    for j, res in enumerate(results):
        shift = res["summary"]["shift"]
        edges = shift["bin_edges"]
        horizon = edges[-2] if len(edges) > 2 else edges[-1]
        for k, label in (("bc", "BC"), ("dagger", "DAgger"), ("oec", "OEC")):
            runs = [r for r in shift["runs"] if r["regime"] == f"{k}@{ABLATION_MULTIPLE}"]
            d = np.array([[np.nan if x is None else x for x in r["disagreement"][:horizon]] for r in runs])
            axes[0][j].plot(np.arange(horizon), np.nanmean(d, 0), label=label)
            mm = np.array([[np.nan if x is None else x for x in r["mmd2"][:-1]] for r in runs])
            centers = [(a + b) / 2 for a, b in zip(edges[:-2], edges[1:-1])]
            axes[1][j].plot(centers, np.nanmean(mm, 0)[: len(centers)], marker="o", label=label)
        own = [np.nan if x is None else x for x in shift["expert_self_on_expert"][:horizon]]
        axes[0][j].plot(np.arange(horizon), own, "k:", label="expert vs itself")
        axes[0][j].set_title(f"{res['env_id']} (budget ×{ABLATION_MULTIPLE})")
        axes[0][j].set_ylabel("disagreement with expert")
        axes[1][j].set_ylabel("MMD² to expert states")
        axes[1][j].set_xlabel("time step t")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "shift.png", dpi=120)
    plt.close(fig)


def code_fingerprint() -> str:
    """A digest of ``jaxil/algorithms/interactive/*.py``: a fix there must not
    be answered from a cache or resumed from checkpoints that the old code
    wrote."""
    import hashlib

    import jaxil.algorithms.interactive

    h = hashlib.sha256()
    for f in sorted(Path(jaxil.algorithms.interactive.__file__).parent.glob("*.py")):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:12]


def settings_of(args) -> dict:
    """What a result depends on (the cache and the run directories are keyed by it)."""
    out = {k: getattr(args, k) for k in ("seeds", "seed", "rounds", "envs_per_round",
                                         "updates_per_round", "sft_episodes", "sft_updates",
                                         "eval_episodes", "eval_every", "scale")}
    out["code"] = code_fingerprint()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=list(DEFAULT_ENVS))
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--envs-per-round", type=int, default=64)
    p.add_argument("--updates-per-round", type=int, default=250)
    p.add_argument("--sft-episodes", type=float, default=8.0,
                   help="SFT set size, in expert episodes' worth of labels")
    p.add_argument("--sft-updates", type=int, default=500)
    p.add_argument("--eval-episodes", type=int, default=128)
    p.add_argument("--eval-every", type=int, default=8,
                   help="rounds between evaluations (default: the SFT start and the end)")
    p.add_argument("--run-dir", default="runs/experiments/interactive",
                   help="run directories (checkpoints: a killed run resumes mid-environment)")
    p.add_argument("--scale", type=int, default=1, help="multiply episodes per round and updates")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    p.add_argument("--out", default=None)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--reuse-code", nargs="+", default=[], metavar="DIGEST",
                   help="also take an environment's cached result written by these "
                        "jaxil/interactive digests (a change shown not to alter its numbers; "
                        "each result records the digest that produced it)")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.envs_per_round, args.updates_per_round = 2, 8, 20
        args.sft_updates, args.eval_episodes, args.seeds, args.eval_every = 20, 8, 2, 1
        args.run_dir = str(Path(args.run_dir) / "quick")
        args.envs = args.envs[:1]
    out = Path(args.out or Path(__file__).parent / ("results_quick" if args.quick else "results"))
    out.mkdir(parents=True, exist_ok=True)

    from jaxil.runs.result_cache import ResultCache

    settings = settings_of(args)
    results, t0 = [], time.perf_counter()
    for env_id in args.envs:
        cache = ResultCache(out / f".cache-{env_id.replace(':', '_')}.json", settings,
                            {"env:": tuple(settings)})
        res = cache.get("env:result")
        if res is not None:
            res.setdefault("code", settings["code"])
        for old in args.reuse_code:
            if res is None:
                res = ResultCache(cache.path, dict(settings, code=old),
                                  {"env:": tuple(settings)}).get("env:result")
                if res is not None:
                    res["code"] = old
                    print(f"{env_id}: the result of code {old} (--reuse-code)", file=sys.stderr)
        if res is None:
            print(f"== {env_id}", file=sys.stderr)
            res = cache.put("env:result", dict(run_env(env_id, args), code=settings["code"]))
        print(f"{env_id}: {res['wall_seconds']:.0f} s", file=sys.stderr)
        results.append(res)
    doc = dict(settings=settings, command=" ".join(["python", "experiments/interactive/run.py"]
                                                   + (argv if argv is not None else sys.argv[1:])),
               wall_seconds_total=sum(r["wall_seconds"] for r in results),
               comparisons=comparisons(results), environments=results)
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    (out / "table.md").write_text(table(results) + "\n\nMethod minus BC at equal budget "
                                  "(✓: the gap exceeds one standard deviation over seeds of "
                                  "both):\n\n" + gap_table(results)
                                  + "\n\nCovariate shift (the students of "
                                  "the table, on the fixed start states):\n\n"
                                  + shift_table(results) + "\n")
    plots(results, out)
    print(table(results))
    print(shift_table(results))
    print(f"wrote {out}; environments took {doc['wall_seconds_total']:.0f} s "
          f"(this call {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
