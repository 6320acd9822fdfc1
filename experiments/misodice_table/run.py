"""The MisoDICE paper's comparison on jaxil's mixed-quality datasets.

BC(D_U), BC(D_E), INDD, MisoDICE-VDN and MisoDICE on each environment's
``misodice-200e-1000p`` dataset (MPE spread: 1000 DART expert + 5000 poor, at
least 20 000 updates; MaMuJoCo: observations standardised; ``ROW_OVERRIDES``
says why), ``--seeds`` seeds vmapped per learner; mean ± std of the final
evaluation return and win rate. Writes ``results.json``, ``table.md`` and
``bars.png`` into ``--out``. Finished rows
are kept in ``--out/.cache-<env>.json``: a killed run resumes where it stopped,
and a row is recomputed only when its settings or its dataset change.

    python experiments/misodice_table/run.py               # CPU size: 50 min on 2 idle cores
    python experiments/misodice_table/run.py --scale gpu   # the papers' sizes, into results_gpu/
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from jaxil import envs
from jaxil.algorithms.offline import LearnerData, make_learner
from jaxil.data.preferences import dataset_id
from jaxil.nn.policy import DEFAULT_BOX
from jaxil.runs.result_cache import ResultCache
from jaxil.collect.comparison import ALGOS, LABELS, VARIANTS, tier_returns
from jaxil.collect.recipes import env_short
from jaxil.algorithms.offline.train import expand_grid, train
from jaxil.collect.recipes import load_dataset
from jaxil.data.environment import dataset_env
from jaxil.data.labels import expert_labels
from jaxil.data.standardize import observation_stats, standardize

KIND = "misodice-200e-1000p"
#: Rows that depart from the table's recipe (``kind``) or budget (at least
#: ``min_updates``), and why; ``--plain-rows`` runs every row as the others.
ROW_OVERRIDES = {
    "mpe-simple_spread_continuous": dict(
        kind="mix-1000e-5000p-dart0.8", min_updates=20000,
        why="MPE spread's scripted expert never leaves its path, so BC on its plain "
            "demonstrations falls with training (0.20 → 0.05 normalised); on 1000 DART "
            "demonstrations (executed actions noised, σ = 0.8) it rises to 0.73 in 20 000 "
            "updates (README, dart.py). 5000 poor keep the table's 1:5 expert share"),
    **{name: dict(
        standardize_obs=True,
        why="by the dataset's statistics, as in the D4RL recipes of TD3+BC and IQL: MuJoCo "
            "observations mix heights near 1 with velocities up to ±10; on the hopper's raw "
            "observations BC(D_E) scored 91, below the poor tier's 344, and standardising "
            "lifted every learner 1.6-4.9x (MAMUJOCO.md)")
       for name in ("mamujoco-hopper_3x1", "mamujoco-halfcheetah_6x1")},
}
DEFAULT_ENVS = ("smax-3m", "smax-2s3z", "smax-5m_vs_6m", "smax-smacv2_5_units",
                "mpe-simple_spread_continuous", "jumanji-LevelBasedForaging-v0")


def normalised(r: dict, ref: dict) -> tuple[float, float] | None:
    """(R − R_random) / (R_expert − R_random), mean and std over seeds."""
    if "expert" not in ref or "random" not in ref or ref["expert"] == ref["random"]:
        return None
    x = (np.asarray(r["returns"]) - ref["random"]) / (ref["expert"] - ref["random"])
    return float(x.mean()), float(x.std())


def run_env(name: str, args) -> list[dict]:
    o = {} if args.plain_rows else ROW_OVERRIDES.get(name, {})
    recipe = f"{name}/{args.kind or o.get('kind', KIND)}"
    updates = max(args.updates, o.get("min_updates", 0))
    ds = load_dataset(recipe, args.data_seed)
    ref = tier_returns(recipe, args.data_seed)
    env = dataset_env(ds)
    settings = dict({k: getattr(args, k) for k in ("seeds", "evals", "eval_episodes",
                                                   "batch_size", "hidden", "seed", "data_seed")},
                    updates=updates, dataset=dataset_id(ds))
    if not ds.spec.discrete:  # the box head of the learners' policies (jaxil.nn.policy.DEFAULT_BOX)
        settings["policy_box"] = DEFAULT_BOX["state"]
    if args.deterministic_eval:  # absent otherwise: the sampled rows keep their cache keys
        settings["deterministic_eval"] = True
    standardize_obs = args.standardize_obs or o.get("standardize_obs", False)
    if standardize_obs:  # the dataset's statistics, in the data and in the environment
        settings["standardize_obs"] = True
        stats = observation_stats(ds)
        ds = standardize(ds, stats)
        env = envs.StandardizeObservations(env, **stats)
    cache = ResultCache(Path(args.out) / f".cache-{name}.json", settings, {"row:": tuple(settings)})
    rows = []
    for algo in args.algos:
        if cache.get(f"row:{algo}") is None:
            base, overrides = VARIANTS[algo][:2] if algo in VARIANTS else (algo, {})
            learner = make_learner(base, ds.spec, hidden=tuple(args.hidden), batch_size=args.batch_size,
                                   **overrides)
            flags = expert_labels(ds, "none" if base == "bc_union" else "ground_truth")
            data = LearnerData.from_dataset(ds, flags)
            out = train(learner, env, data, runs=expand_grid({}, args.seeds), num_updates=updates,
                        eval_every=updates // args.evals, eval_episodes=args.eval_episodes,
                        base_seed=args.seed, progress=True,
                        deterministic_eval=args.deterministic_eval)
            p = out["points"][0]
            cache.put(f"row:{algo}", dict(env=ds.spec.env_id, algo=algo, seconds=out["wall_seconds"],
                                          **{k: p[k] for k in ("return_mean", "return_std", "win_mean",
                                                               "win_std", "returns", "seeds")}))
        r = dict(cache.get(f"row:{algo}"), tiers=ref, recipe=recipe, updates=updates)
        if standardize_obs:
            r["standardize_obs"] = True
        rows.append(r)
        print(f"{r['env']:<34}{LABELS[algo]:<14}{r['return_mean']:8.3f} ± {r['return_std']:.3f}"
              f"  win {r['win_mean']:.3f} ± {r['win_std']:.3f}  ({r['seconds']:.0f}s)", flush=True)
    return rows


def write_outputs(rows: list[dict], out: Path, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(dict(meta, rows=rows), indent=2))
    env_ids = list(dict.fromkeys(r["env"] for r in rows))
    algos = list(dict.fromkeys(r["algo"] for r in rows))
    cell = {(r["env"], r["algo"]): r for r in rows}
    lines = ["| env | " + " | ".join(LABELS[a] for a in algos) + " |",
             "|---|" + "---|" * len(algos)]
    for e in env_ids:
        vals = []
        for a in algos:
            r = cell.get((e, a))
            if r is None:
                vals.append("-")
                continue
            v = f"{r['return_mean']:.2f} ± {r['return_std']:.2f}"
            if envs.make(e).spec.has_win:
                v += f" (win {r['win_mean']:.2f})"
            vals.append(v)
        lines.append(f"| {e} | " + " | ".join(vals) + " |")
    norm_lines = ["| env | " + " | ".join(LABELS[a] for a in algos) + " |", "|---|" + "---|" * len(algos)]
    for e in env_ids:
        vals = []
        for a in algos:
            n = normalised(cell[(e, a)], cell[(e, a)]["tiers"]) if (e, a) in cell else None
            vals.append("-" if n is None else f"{n[0]:.2f} ± {n[1]:.2f}")
        norm_lines.append(f"| {e} | " + " | ".join(vals) + " |")
    (out / "table.md").write_text(
        "Final evaluation return, mean ± std over seeds (win rate where the task has one):\n\n"
        + "\n".join(lines)
        + "\n\nNormalised return (R − R_random) / (R_expert − R_random), with the expert and random "
        "returns measured on the dataset's own tiers (`.tiers.json`): 0 = random, 1 = the expert "
        "that made the data.\n\n" + "\n".join(norm_lines)
        + f"\n\nCommand: `{meta['command']}`  \n"
        + "".join(f"Rows of {', '.join(envs_)} kept from an earlier run (`{cmd}`), same "
                  "settings.  \n" for cmd, envs_ in kept_by_command(meta).items())
        + "".join(f"Row{'s' if len(es) > 1 else ''} {', '.join(es)}: {setting} ({why}).  \n"
                  for (setting, why), es in _group_own_rows(rows).items())
        + "Training time (sum over rows, each timed when it ran): "
        f"{sum(r['seconds'] for r in rows):.0f}s; this invocation {meta['wall_seconds']:.0f}s; {meta['seeds']} seeds, {meta['updates']} updates, mean ± std over seeds of the final "
        f"evaluation return ({meta['eval_episodes']} "
        f"{'greedy' if meta.get('deterministic_eval') else 'sampled'} episodes per seed)"
        f"{'; observations standardised by the dataset' if meta.get('standardize_obs') else ''}.\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # One axis, normalised so every environment reads the same way: 0 random, 1 expert.
    fig, ax = plt.subplots(figsize=(1.9 * len(env_ids) + 1.5, 3.8))
    colors = ["#999", "#bbb", "#6a9", "#58c", "#c55"]
    width = 0.8 / len(algos)
    for j, a in enumerate(algos):
        xs, ys, es = [], [], []
        for i, e in enumerate(env_ids):
            n = normalised(cell[(e, a)], cell[(e, a)]["tiers"]) if (e, a) in cell else None
            if n is not None:
                xs.append(i + (j - (len(algos) - 1) / 2) * width)
                ys.append(n[0])
                es.append(n[1])
        ax.bar(xs, ys, width, yerr=es, capsize=2, color=colors[j % len(colors)], label=LABELS[a])
    ax.axhline(1.0, color="k", ls="--", lw=0.8)
    ax.axhline(0.0, color="k", lw=0.8)
    ax.text(len(env_ids) - 0.5, 1.0, "expert", va="bottom", ha="right", fontsize=8)
    ax.set_xticks(range(len(env_ids)), [e.split(":", 1)[1] for e in env_ids], fontsize=8)
    ax.set_ylabel("normalised return (0 random, 1 expert)")
    own = "".join(f"; {e.split(':', 1)[1]}: {row_setting(r, short=True)}"
                  for e, r, _ in own_rows(rows))
    ax.set_title(f"{KIND} datasets, {meta['seeds']} seeds, {meta['updates']} updates{own}", fontsize=8)
    ax.legend(fontsize=7, ncol=len(algos), loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    fig.savefig(out / "bars.png", dpi=120)


def own_rows(rows: list[dict]) -> list[tuple[str, dict, dict]]:
    """``(env, a row, its ROW_OVERRIDES entry)`` per environment whose rows
    were made with another recipe, budget or observation scaling than the
    table's."""
    out = {}
    for r in rows:
        over = ROW_OVERRIDES.get(env_short(r["env"]))
        if over is not None and row_setting(r):
            out.setdefault(r["env"], (r["env"], r, over))
    return list(out.values())


def _group_own_rows(rows: list[dict]) -> dict[tuple[str, str], list[str]]:
    """``{(setting, why): [env, ...]}`` of ``own_rows``, so that rows changed
    the same way for the same reason are named once."""
    out: dict = {}
    for e, r, over in own_rows(rows):
        out.setdefault((row_setting(r), over["why"]), []).append(e)
    return out


def row_setting(r: dict, short: bool = False) -> str:
    """What a row of ``own_rows`` changed: its dataset and budget where they
    differ from the table's, and standardised observations where its
    ``ROW_OVERRIDES`` entry asks for them."""
    kind = r.get("recipe", f"/{KIND}").split("/", 1)[1]
    parts = []
    if kind != KIND:
        parts.append(f"{kind}, {r['updates']}" if short
                     else f"dataset `{r['recipe']}`, {r['updates']} updates")
    if r.get("standardize_obs") and ROW_OVERRIDES.get(env_short(r["env"]), {}).get("standardize_obs"):
        parts.append("standardised" if short else "observations standardised")
    return ", ".join(parts)


#: Sizes per ``--scale``: ``cpu`` finishes in under an hour on a 2-core CPU;
#: ``gpu`` is the MisoDICE/DemoDICE papers' setting: 256-256 networks, batch
#: 512, and 20 000 updates, which is over the papers' 100 epochs on each of
#: these datasets (31k–67k transitions); 10 evaluations.
SCALES = {
    "cpu": dict(seeds=4, updates=2000, evals=2, eval_episodes=32, batch_size=256, hidden=[64, 64],
                out=str(Path(__file__).parent / "results")),
    "gpu": dict(seeds=4, updates=20000, evals=10, eval_episodes=32, batch_size=512, hidden=[256, 256],
                out=str(Path(__file__).parent / "results_gpu")),
}


SETTINGS = ("seeds", "updates", "eval_episodes", "hidden", "batch_size", "deterministic_eval",
            "standardize_obs", "kind")


def merge_rows(path: Path, rows: list[dict], meta: dict) -> tuple[list[dict], dict]:
    """The rows of an earlier ``results.json`` with those of the environments
    run now replaced (in the earlier order, new environments last)."""
    if not path.is_file():
        raise SystemExit(f"error: --merge needs an earlier {path}; run without --merge first")
    old = json.loads(path.read_text())
    differ = [k for k in SETTINGS if old.get(k) != meta.get(k)]
    if differ:
        raise SystemExit(f"error: --merge: {path} was made with other settings ("
                         + ", ".join(f"{k} {old.get(k)} vs {meta.get(k)}" for k in differ)
                         + "); rerun every environment instead")
    fresh = {r["env"] for r in rows}
    kept = [r for r in old["rows"] if r["env"] not in fresh]
    order = list(dict.fromkeys([r["env"] for r in old["rows"]] + [r["env"] for r in rows]))
    merged = sorted(kept + rows, key=lambda r: order.index(r["env"]))
    kept_envs = list(dict.fromkeys(r["env"] for r in kept))
    made_by = old_sources(old)
    meta = dict(meta, sources={e: made_by[e] if e in kept_envs else meta["command"]
                               for e in dict.fromkeys(r["env"] for r in merged)})
    return merged, meta


def old_sources(old: dict) -> dict:
    """``{env: the command that made its row}`` of an earlier ``results.json``
    (``sources``; files written before it record one ``kept`` group)."""
    if "sources" in old:
        return dict(old["sources"])
    kept = old.get("kept") or {}
    return {r["env"]: kept["command"] if r["env"] in kept.get("envs", ()) else old["command"]
            for r in old["rows"]}


def kept_by_command(meta: dict) -> dict:
    """``{command: [env, ...]}`` of the rows not made by this invocation."""
    out: dict = {}
    for env, cmd in meta.get("sources", {}).items():
        if cmd != meta["command"]:
            out.setdefault(cmd, []).append(env)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", choices=sorted(SCALES), default="cpu",
                   help="preset sizes (cpu: under an hour on 2 cores; gpu: the papers' sizes, "
                        "written to results_gpu/); the flags below override it")
    p.add_argument("--envs", default=",".join(DEFAULT_ENVS))
    p.add_argument("--algos", default=",".join(ALGOS),
                   help=f"comma-separated; also {', '.join(VARIANTS)} (one setting changed)")
    p.add_argument("--seeds", type=int)
    p.add_argument("--updates", type=int)
    p.add_argument("--evals", type=int, help="evaluations per run")
    p.add_argument("--eval-episodes", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--hidden", type=int, nargs="+")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--kind",
                   help=f"the dataset recipe of every environment, e.g. {KIND}-greedy (the "
                        f"expert tier acting on its teacher's mean action); default: {KIND}, "
                        f"or a row's own recipe in ROW_OVERRIDES")
    p.add_argument("--out")
    p.add_argument("--plain-rows", action="store_true",
                   help=f"every row on <env>/{KIND} at --updates, without the per-row "
                        f"recipes, budgets and standardisation of ROW_OVERRIDES "
                        f"({', '.join(ROW_OVERRIDES)})")
    p.add_argument("--deterministic-eval", action="store_true",
                   help="evaluate the greedy policies (argmax, the box heads' mode) instead of "
                        "sampling, which the table and the zoo's tiers do")
    p.add_argument("--standardize-obs", action="store_true",
                   help="standardise observations and states by the dataset's statistics, in "
                        "the data and in the evaluation environment (jaxil.data.standardize)")
    p.add_argument("--merge", action="store_true",
                   help="keep the rows of the other environments from --out/results.json "
                        "(refused if its settings differ) and replace only those run now")
    args = p.parse_args(argv)
    for k, v in SCALES[args.scale].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.algos = args.algos.split(",")
    unknown = [a for a in args.algos if a not in LABELS]
    if unknown:
        p.error(f"--algos: unknown {', '.join(unknown)}; choose from {', '.join(LABELS)}")
    t0 = time.perf_counter()
    rows = []
    for name in args.envs.split(","):
        rows.extend(run_env(name.strip(), args))
    meta = dict(command="python " + " ".join([sys.argv[0]] + sys.argv[1:] if argv is None else argv),
                wall_seconds=time.perf_counter() - t0, seeds=args.seeds, updates=args.updates,
                eval_episodes=args.eval_episodes, hidden=args.hidden, batch_size=args.batch_size)
    if args.deterministic_eval:
        meta["deterministic_eval"] = True
    if args.kind:
        meta["kind"] = args.kind
    if args.standardize_obs:
        meta["standardize_obs"] = True
    if args.merge:
        rows, meta = merge_rows(Path(args.out) / "results.json", rows, meta)
    write_outputs(rows, Path(args.out), meta)
    print((Path(args.out) / "table.md").read_text())


if __name__ == "__main__":
    main()
