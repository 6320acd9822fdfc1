"""Interactive imitation at token level: BC, DAgger, OEC and their ablations
on the multi-turn token tasks, at equal expert-token budgets.

On each task, ONE compiled program per round runs every regime × seed:
BC, on-policy rejection sampling (RS), DAgger, OEC, OEC+BC mix and the
entropy-gated switch at four budgets (a scaling curve), and the OEC
ablations at the third budget: the prefix mask off, the repetition filter
off, the verifier off, both filters off, and the switch distribution (early,
late, geometric, against uniform). Every regime of a seed starts from the
same SFT student (BC on ``sft`` expert tokens), every student is evaluated
greedily on the same instances (one reset key), and the expert is the
task's scripted expert. Budgets are multiples of the expert's mean episode
length in tokens (:data:`TASKS`), so they scale with each task.

After training, the per-turn covariate-shift diagnostic
(:func:`jaxil.algorithms.lm.diagnostics.covariate_shift`) of the BC, DAgger
and OEC students at the smallest budget: next-token disagreement with the
expert on the student's own histories and the hidden-state MMD² to the
expert's histories, per turn, against the expert's floor.

Writes into ``--out``: ``results.json`` (rows, summaries, diagnostics),
``table.md``, ``scaling.png``, ``ablations.png``, ``shift.png``; each
task's run directory is ``--out/runs/<task>`` (a killed experiment resumes
where it stopped with the same command).

    python experiments/lm_agents/run.py                # CPU size (README.md has its wall time)
    python experiments/lm_agents/run.py --scale 4      # 4× episodes per round and updates (GPU)
    python experiments/lm_agents/run.py --quick        # a few-minute smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

# The task settings and why: experiments/lm_agents/DIFFICULTY.md. ``multiples``: the
# budgets in expert episodes' worth of tokens (BC's success jumps from ~0 to ~1 between 32
# and 64 demonstrations on repair and arith; it rises slowly on exchange); ``episodes``: the
# rollouts per round (enough for OEC to spend the larger budgets); ``ablation``: the budget of
# the OEC ablations (None: none on this task).
TASKS = {
    "tokens:repair": dict(knobs=dict(length=16, faults=4, values=32, max_turns=16),
                          multiples=(12, 24, 36, 48), ablation=24, episodes=16, agent_ids=False),
    "tokens:arith": dict(knobs=dict(num_ops=4, modulus=31, max_turns=8),
                         multiples=(12, 24, 36, 48), ablation=24, episodes=16, agent_ids=False),
    "tokens:exchange": dict(knobs=dict(half=3, values=32, sort=True, max_turns=6),
                            multiples=(32, 64, 128, 256), ablation=None, episodes=48,
                            agent_ids=True),
}
METHOD_LABELS = {"bc": "BC", "onpolicy": "on-policy RS", "dagger": "DAgger", "oec": "OEC",
                 "oec_mix": "OEC+BC mix", "gated": "entropy-gated"}
ABLATIONS = {
    "mask off": dict(mask_prefix=False),
    "repetition filter off": dict(repeat_limit=0),
    "verifier off": dict(verifier="off"),
    "verifier and filter off": dict(verifier="off", repeat_limit=0),
    "switch=early": dict(switch_kind="early"),
    "switch=late": dict(switch_kind="late"),
    "switch=geometric": dict(switch_kind="geometric", switch_p=0.3),
}
SHIFT_METHODS = ("bc", "dagger", "oec")


def regimes_for(task: dict, unit: int, sft_tokens: int, quick: bool,
                ablations_at: int | None = None) -> list[tuple[str, dict]]:
    """The main regimes and the task's ablations, or with ``ablations_at``
    only OEC and its ablations at that multiple."""
    from jaxil.algorithms.lm.interactive import token_regime

    mults = task["multiples"][:2] if quick else task["multiples"]
    methods = task.get("methods", tuple(METHOD_LABELS))
    out = []
    if ablations_at:
        mults = ()
        out.append((f"oec@{ablations_at}",
                    token_regime("oec", unit * ablations_at, sft_tokens=sft_tokens)))
    for m in mults:
        for method in methods:
            out.append((f"{method}@{m}", token_regime(method, unit * m, sft_tokens=sft_tokens)))
    abl = ablations_at or (mults[-1] if quick else task["ablation"])
    for name, over in ABLATIONS.items() if abl else ():
        out.append((f"oec[{name}]@{abl}",
                    token_regime("oec", unit * abl, sft_tokens=sft_tokens, **over)))
    return out


def run_task(env_id: str, task: dict, args) -> dict:
    import jax

    from jaxil import envs
    from jaxil.algorithms.lm import diagnostics as DG
    from jaxil.algorithms.lm import interactive as TI
    from jaxil.envs.experts import scripted_expert

    knobs = task["knobs"]
    env = envs.make(env_id, **knobs)
    expert = scripted_expert(env)[0]
    probe = TI._demos_for(env, expert, None, jax.random.PRNGKey(args.seed + 777_777), 1)
    acc = TI.demo_accounting(env, probe.episodes)
    unit = int(round(float(acc["tokens"][-1]) / len(acc["tokens"])))
    sft_tokens = args.sft_episodes * unit
    s = args.scale
    config = TI.TokenInteractiveConfig(
        rounds=args.rounds, episodes_per_round=task["episodes"] * s, agent_ids=task["agent_ids"],
        updates_per_round=args.updates_per_round * s, batch_episodes=args.batch_episodes,
        sft_tokens=sft_tokens, sft_updates=args.sft_updates * s,
        eval_episodes=args.eval_episodes, learning_rate=args.lr)
    regimes = regimes_for(task, unit, sft_tokens, args.quick, args.ablations_at)
    kind = f"ablations@{args.ablations_at}" if args.ablations_at else "main"
    run_dir = Path(args.out) / "runs" / (env_id.replace(":", "-")
                                         + (f"-{kind.replace('@', '-')}" if args.ablations_at
                                            else ""))
    t0 = time.time()
    res = TI.run(env, expert, None, regimes, seeds=args.seeds, config=config,
                 base_seed=args.seed, out_dir=run_dir, resume=run_dir.exists(),
                 eval_every=config.rounds, progress=not args.no_progress)
    train_s = time.time() - t0
    print(f"{env_id}: {len(regimes)} regimes × {args.seeds} seeds in {train_s:.0f}s")
    print(TI.format_table(res.summary))
    entry = dict(env_id=env_id, kind=kind, knobs=knobs, unit_tokens=unit, sft_tokens=sft_tokens,
                 config=dict(vars(config)), regimes=[n for n, _ in regimes],
                 summary={k: v for k, v in res.summary.items() if k != "states"},
                 rows=res.rows, train_seconds=train_s,
                 command="python experiments/lm_agents/run.py " + " ".join(sys.argv[1:]))
    if args.ablations_at:
        return entry

    # The covariate-shift diagnostic of the BC, DAgger and OEC students at the smallest budget.
    student = TI.make_student(env, config)
    first = task["multiples"][0]
    run_of = {(r["regime"], r["seed"]): r["run"] for r in res.rows}
    shift = {}
    t1 = time.time()
    for method in SHIFT_METHODS:
        tables = []
        for seed in range(args.seeds):
            i = run_of[(f"{method}@{first}", seed)]
            params = jax.tree.map(lambda x: x[i], res.state.params)
            table = DG.covariate_shift(env, student, params, expert, jax.random.PRNGKey(99),
                                       args.shift_episodes, args.turn_bins)
            tables.append(DG.covariate_shift_rows(table))
        shift[method] = tables
    print(f"{env_id}: covariate-shift diagnostic in {time.time() - t1:.0f}s")
    return dict(entry, shift=shift, shift_budget=first * unit,
                shift_seconds=time.time() - t1)


def _curve(task: dict, method: str):
    xs, ys, es = [], [], []
    for g in task["summary"]["regimes"]:
        name = g["regime"]
        if name.split("@")[0] == method:
            xs.append(g["expert_tokens_mean"])
            ys.append(g["win_mean"])
            es.append(g["win_std"])
    return np.asarray(xs), np.asarray(ys), np.asarray(es)


def write_report(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = results["tasks"]
    main = [t for t in entries if t.get("kind", "main") == "main"]
    lines = ["# Interactive imitation on token tasks", "",
             f"{results['seeds']} seeds; training and diagnostics "
             f"{results['wall_seconds'] / 60:.1f} min in all.", ""]
    for t in entries:
        lines += [f"## {t['env_id']} {t['knobs']}, {t.get('kind', 'main')}", "",
                  f"`{t.get('command', '')}`: {t['train_seconds'] / 60:.1f} min training"
                  + (f", {t['shift_seconds'] / 60:.1f} min diagnostic" if "shift_seconds" in t
                     else "") + f"; expert episode ≈ {t['unit_tokens']} tokens; SFT start "
                  f"{t['sft_tokens']} tokens.", "",
                  "| regime | expert tokens | win rate (mean ± std over seeds) | return |",
                  "|---|---:|---:|---:|"]
        for g in t["summary"]["regimes"]:
            lines.append(f"| {g['regime']} | {g['expert_tokens_mean']:.0f} | "
                         f"{g['win_mean']:.3f} ± {g['win_std']:.3f} | "
                         f"{g['return_mean']:.3f} ± {g['return_std']:.3f} |")
        lines.append("")
        if "shift" not in t:
            continue
        lines += [f"Per-turn next-token disagreement with the expert on the student's own "
                  f"histories and hidden-state MMD² to the expert's histories (mean over "
                  f"seeds; floors: the student on the expert's histories, two halves of the "
                  f"expert's histories), students at {t['shift_budget']} tokens:", "",
                  "| turn | " + " | ".join(f"{m} | {m} floor | {m} MMD² | {m} MMD² floor"
                                          for m in SHIFT_METHODS) + " |",
                  "|---|" + "---:|" * (4 * len(SHIFT_METHODS))]
        bins = [r["turn"] for r in t["shift"][SHIFT_METHODS[0]][0]]
        for b, label in enumerate(bins):
            cells = []
            for m in SHIFT_METHODS:
                for col in ("disagreement_student", "disagreement_floor", "mmd2_student",
                            "mmd2_floor"):
                    vals = [rows[b][col] for rows in t["shift"][m] if rows[b][col] is not None]
                    cells.append(f"{np.mean(vals):.3f}" if vals else "–")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    (out / "table.md").write_text("\n".join(lines) + "\n")

    n = len(main)
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4), squeeze=False)
    for ax, t in zip(axes[0], main):
        for method, label in METHOD_LABELS.items():
            x, y, e = _curve(t, method)
            if len(x):
                ax.errorbar(x, y, yerr=e, marker="o", capsize=3, label=label)
        ax.set_xscale("log")
        ax.set_xlabel("expert tokens (demonstrations included)")
        ax.set_ylabel("greedy success rate")
        ax.set_title(t["env_id"])
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "scaling.png", dpi=120)
    plt.close(fig)

    abl = [t for t in entries if any(r.startswith("oec[") for r in t["regimes"])]
    if abl:
        fig, axes = plt.subplots(1, len(abl), figsize=(6.5 * len(abl), 4), squeeze=False)
        for ax, t in zip(axes[0], abl):
            at = next(r for r in t["regimes"] if r.startswith("oec[")).split("@")[1]
            groups = [g for g in t["summary"]["regimes"]
                      if g["regime"].startswith("oec[") or g["regime"] == f"oec@{at}"]
            ax.barh([g["regime"].split("@")[0] for g in groups],
                    [g["win_mean"] for g in groups], xerr=[g["win_std"] for g in groups])
            ax.set_xlabel("greedy success rate (mean ± std over seeds)")
            ax.set_title(f"{t['env_id']}: OEC ablations at ×{at}")
        fig.tight_layout()
        fig.savefig(out / "ablations.png", dpi=120)
        plt.close(fig)

    shifted = [t for t in main if "shift" in t]
    fig, axes = plt.subplots(1, len(shifted), figsize=(5.5 * len(shifted), 4), squeeze=False)
    for ax, t in zip(axes[0], shifted):
        col = lambda rows, b, c: rows[b][c] if rows[b][c] is not None else np.nan
        x = np.arange(len(t["shift"]["bc"][0]))
        for m in SHIFT_METHODS:
            y = [np.nanmean([col(r, b, "disagreement_student") for r in t["shift"][m]])
                 if any(r[b]["disagreement_student"] is not None for r in t["shift"][m])
                 else np.nan for b in x]
            ax.plot(x, y, marker="o", label=f"{METHOD_LABELS[m]}, own histories")
        floor = [np.nanmean([col(r, b, "disagreement_floor") for r in t["shift"]["bc"]])
                 if any(r[b]["disagreement_floor"] is not None for r in t["shift"]["bc"])
                 else np.nan for b in x]
        ax.plot(x, floor, "k--", label="BC on the expert's histories (floor)")
        ax.set_xticks(x, [r["turn"] for r in t["shift"]["bc"][0]])
        ax.set_xlabel("turn")
        ax.set_ylabel("next-token disagreement with the expert")
        ax.set_title(t["env_id"])
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "shift.png", dpi=120)
    plt.close(fig)


def _task(env_id: str, args) -> dict:
    """``TASKS[env_id]`` with the command line's overrides."""
    task = dict(TASKS[env_id])
    if args.multiples:
        task.update(multiples=tuple(sorted(args.multiples)), ablation=None)
    if args.methods:
        missing = [m for m in SHIFT_METHODS if m not in args.methods]
        task.update(methods=tuple(m for m in METHOD_LABELS if m in args.methods))
        if missing:
            raise SystemExit(f"error: --methods must include {', '.join(missing)} (the "
                             f"covariate-shift diagnostic's students)")
    if args.episodes_per_round:
        task.update(episodes=args.episodes_per_round)
    return task


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="experiments/lm_agents/results")
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=int, default=1,
                   help="multiply episodes per round, updates and SFT updates (a GPU: 4-16)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--updates-per-round", type=int, default=60)
    p.add_argument("--batch-episodes", type=int, default=16)
    p.add_argument("--sft-episodes", type=int, default=4)
    p.add_argument("--sft-updates", type=int, default=150)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-episodes", type=int, default=128)
    p.add_argument("--shift-episodes", type=int, default=64)
    p.add_argument("--turn-bins", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="2 budgets, 2 seeds, short rounds")
    p.add_argument("--ablations-at", type=int, default=None, metavar="MULTIPLE",
                   help="run only OEC and its ablations at this budget multiple (merged into "
                        "results.json beside the main runs)")
    p.add_argument("--multiples", type=int, nargs="+", default=None, metavar="M",
                   help="the budgets, in expert episodes' worth of tokens, instead of the "
                        "task's (no ablations then, unless --ablations-at)")
    p.add_argument("--methods", nargs="+", default=None, choices=list(METHOD_LABELS),
                   help="a subset of the regimes' methods")
    p.add_argument("--episodes-per-round", type=int, default=None,
                   help="rollouts per round instead of the task's")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.multiples and min(args.multiples) < args.sft_episodes:
        p.error(f"--multiples {min(args.multiples)} is below --sft-episodes "
                f"{args.sft_episodes}: a budget includes the SFT start's demonstrations; "
                f"raise the multiple")
    if args.quick:
        args.seeds, args.rounds, args.updates_per_round = 2, 2, 10
        args.sft_updates, args.eval_episodes, args.shift_episodes = 30, 16, 16
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    new = [run_task(eid, _task(eid, args), args) for eid in args.tasks]
    # Merge with the entries of earlier invocations (other tasks, or the ablations).
    path = out / "results.json"
    old = json.loads(path.read_text())["tasks"] if path.exists() else []
    keys = {(t["env_id"], t.get("kind", "main")) for t in new}
    tasks = [t for t in old if (t["env_id"], t.get("kind", "main")) not in keys] + new
    order = list(TASKS)
    tasks.sort(key=lambda t: (order.index(t["env_id"]), t.get("kind", "main") != "main"))
    results = dict(seeds=args.seeds, tasks=tasks,
                   wall_seconds=sum(t["train_seconds"] + t.get("shift_seconds", 0.0)
                                    for t in tasks))
    path.write_text(json.dumps(results, indent=1, default=float))
    write_report(results, out)
    print(f"this invocation {(time.time() - t0) / 60:.1f} min; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
