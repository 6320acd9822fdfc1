"""Interactive imitation at token level, with experts that see only the
transcript beside the privileged ones: BC, on-policy RS, DAgger, OEC,
OEC+BC, the entropy-gated switch and on-policy distillation (OPD) at equal
expert-token budgets.

Per task, the **experts** (`EXPERTS`):

- `privileged`: the task's scripted expert, which reads the hidden answer;
- `transcript`: its transcript-only expert (its tokens are a function of
  the agent's own context alone);
- `lm`: an expert LM, a transformer trained by SFT on the transcript-only
  expert's demonstrations (it acts greedily; OPD reads its distribution).

and the **starts**: `sft` (every run starts from an SFT student on
`sft` expert episodes' worth of tokens, near BC's threshold, see
DIFFICULTY.md) and `untrained` (no SFT: one episode's worth of
demonstrations is in every run's data and budget). A *cell* is one
(expert, start) pair and its methods (`CELLS`); each is one compiled
program per round running its regimes × 4 seeds, with its own run
directory `--out/runs/<task>/<cell>` (a killed experiment resumes where it
stopped with the same command). Budgets are the same numbers of tokens for
every expert: multiples of the privileged expert's mean episode length.

Then, per task:

- the **imitation gap** of the privileged expert (`imitation_gap_by_turn`)
  over its DAgger labels, its OEC segments (the trained tokens of every
  DAgger/OEC run of the privileged cell) and its demonstrations, per turn;
- the per-turn **covariate shift** of the transcript cell's BC, DAgger
  and OEC students at its smallest budget.

Writes into `--out`: `results.json`, `table.md`, `scaling.png`,
`ablations.png`, `shift.png`, `gap.png`.

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

# The task settings and why: experiments/lm_agents/DIFFICULTY.md. Budgets are multiples of the
# privileged expert's mean episode length in tokens. ``sft``: the SFT start's demonstrations,
# just above BC's threshold (300 updates at lr 3e-3, 3 seeds: repair 24 / 32 / 40 demos give
# 0.02 / 0.22 / 0.71, arith 24 / 32 give 0.19 / 0.47, exchange rises slowly); ``multiples``:
# the budgets of each start; ``ablation``: the budget of the OEC ablations (transcript expert,
# SFT start); ``episodes``: the rollouts per round.
TASKS = {
    "tokens:repair": dict(knobs=dict(length=16, faults=4, values=32, max_turns=16),
                          sft=32, multiples=dict(sft=(36, 40, 44, 48), untrained=(24, 32, 40, 48)),
                          ablation=40, episodes=16, agent_ids=False),
    "tokens:arith": dict(knobs=dict(num_ops=4, modulus=31, max_turns=8),
                         sft=28, multiples=dict(sft=(32, 36, 40, 48), untrained=(16, 24, 32, 48)),
                         ablation=36, episodes=16, agent_ids=False),
    "tokens:exchange": dict(knobs=dict(half=3, values=32, sort=True, max_turns=6),
                            sft=128, multiples=dict(sft=(160, 192, 256, 384),
                                                    untrained=(64, 128, 256, 384)),
                            ablation=192, episodes=48, agent_ids=True, untrained_units=3),
}
METHOD_LABELS = {"bc": "BC", "onpolicy": "on-policy RS", "dagger": "DAgger", "oec": "OEC",
                 "oec_mix": "OEC+BC mix", "gated": "entropy-gated", "opd": "OPD"}
ALL = ("bc", "onpolicy", "dagger", "oec", "oec_mix", "gated")
CORE = ("bc", "onpolicy", "dagger", "oec")
EXPERTS = ("privileged", "transcript", "lm")
# (expert, start, methods, with the OEC ablations). OPD runs in a program of its own (one GKD β
# per program); it needs an expert LM.
CELLS = (("transcript", "sft", ALL, True), ("lm", "sft", CORE, False),
         ("lm", "sft", ("opd",), False), ("privileged", "sft", CORE, False),
         ("transcript", "untrained", CORE, False),
         ("transcript", "untrained", ("oec_mix", "gated"), False),
         ("lm", "untrained", ("opd",), False))
# A cell's directory and name: expert-start, and a suffix for a cell of other methods.
CELL_SUFFIX = {("opd",): "-opd", ("oec_mix", "gated"): "-mix"}
SHIFT_METHODS = ("bc", "dagger", "oec")
GAP_SOURCES = {"bc": "demonstrations", "dagger": "DAgger labels", "oec": "OEC segments"}


TIMING = "train_seconds.json"


def first_timing(run_dir: Path, overwrite: bool, train):
    """`(train(), seconds)`: run `train` in `run_dir` and return the
    seconds its training took the first time it ran to the end. The engine
    rewrites a run directory's `results.json` when it restores a finished
    run, so the first measured time is kept apart, in `train_seconds.json`;
    `resumed` there says that run continued a stopped one, whose earlier
    part is not counted."""
    path = run_dir / TIMING
    kept = json.loads(path.read_text()) if path.exists() and not overwrite else None
    resumed = run_dir.exists() and not overwrite
    t0 = time.time()
    res = train()
    if kept is None:
        kept = {"seconds": time.time() - t0, "resumed": resumed}
        path.write_text(json.dumps(kept))
    return res, float(kept["seconds"])


def cell_name(expert: str, start: str, methods) -> str:
    return f"{expert}-{start}" + CELL_SUFFIX.get(tuple(methods), "")


def regimes_for(task: dict, start: str, methods, ablations: bool, unit: int, sft_tokens: int,
                quick: bool) -> list[tuple[str, dict]]:
    """A cell's regimes: each method at each budget of its start, and OEC's
    ablations."""
    from jaxil.algorithms.lm.interactive import OEC_ABLATIONS, token_regime

    mults = task["multiples"][start]
    mults = mults[::2] if quick else mults
    out = [(f"{m}@{x}", token_regime(m, unit * x, sft_tokens=sft_tokens))
           for x in mults for m in methods]
    if ablations:
        at = mults[-1] if quick else task["ablation"]
        out += [(f"oec[{name}]@{at}", token_regime("oec", unit * at, sft_tokens=sft_tokens,
                                                    **over))
                for name, over in OEC_ABLATIONS.items()]
    return out


def expert_stats(env, expert, params, key, episodes: int) -> dict:
    """Success, tokens, turns per episode of an expert (greedy for an LM)."""
    from jaxil.algorithms.lm import interactive as TI
    from jaxil.algorithms.lm.sft import collect_demos

    eps = collect_demos(env, expert, params, key, episodes)
    acc = TI.demo_accounting(env, eps)
    return dict(win=float(np.mean(np.asarray(eps.won))),
                tokens=float(acc["tokens"][-1] / episodes),
                turns=float(acc["turns"][-1] / episodes), episodes=episodes)


def train_expert_lm(env_id: str, env, task: dict, transcript, args, run_dir: Path):
    """The expert LM: SFT of a `--expert-size` transformer on the
    transcript-only expert's demonstrations (seed 0)."""
    import jax

    from jaxil.algorithms.lm import sft

    demos = sft.collect_demos(env, transcript, None, jax.random.PRNGKey(args.seed + 555_555),
                              args.expert_demos)
    cfg = sft.SFTConfig(size=args.expert_size, agent_ids=task["agent_ids"],
                        learning_rate=1e-3, batch_episodes=32,
                        num_updates=args.expert_updates, eval_every=args.expert_updates,
                        eval_episodes=args.eval_episodes)
    res, seconds = first_timing(run_dir, args.overwrite, lambda: sft.train_sft(
        env, demos, cfg, seeds=[args.seed], out_dir=run_dir,
        resume=run_dir.exists() and not args.overwrite, overwrite=args.overwrite,
        progress=not args.no_progress))
    params = jax.tree.map(lambda x: x[0], res.state.params)
    policy = sft.make_student(env, cfg)
    print(f"{env_id}: expert LM ({args.expert_size}, {args.expert_demos} transcript demos, "
          f"{args.expert_updates} updates) in {seconds:.0f}s")
    return policy, params, dict(size=args.expert_size, demos=args.expert_demos,
                                updates=args.expert_updates, seconds=seconds)


def gap_rows(env, transcript, res, regimes, demos, turn_bins: int) -> list[dict]:
    """The privileged expert's imitation gap, per method source and budget:
    over the trained tokens of each DAgger/OEC run's buffer (its labels, its
    expert segments; the buffer keeps the token columns only, so the
    privileged tokens are the recorded targets) and over the demonstrations
    a BC run at that budget trains on."""
    import jax

    from jaxil.algorithms.lm import interactive as TI
    from jaxil.algorithms.lm.diagnostics import turn_bin_labels
    from jaxil.algorithms.lm.imitation_gap import imitation_gap_by_turn

    class _Eps:  # the buffer's steps as recorded episodes (one closing observation)
        def __init__(self, obs, avail):
            pad = lambda x: np.concatenate([x, x[:, -1:]], 1)
            self.obs, self.avail_actions = pad(obs), pad(avail)
            self.mask = np.ones(obs.shape[:2], bool)

    labels = ["all"] + turn_bin_labels(turn_bins)
    row = lambda g: dict(states=g.states, differs=g.differs, undetermined=g.undetermined,
                         shared=g.shared)
    state = jax.device_get(res.state)
    run_of = {(r["regime"], r["seed"]): r["run"] for r in res.rows}
    seeds = sorted({s for _, s in run_of})
    out = []
    acc = TI.demo_accounting(env, demos.episodes)
    for name, h in regimes:
        method = name.split("@")[0]
        if method not in GAP_SOURCES:
            continue
        per_seed = []
        if method == "bc":  # the same demonstrations for every seed
            n = TI.episodes_within(int(h["demo_labels"]), acc["tokens"])
            ep = jax.tree.map(lambda x: np.asarray(x)[:n], demos.episodes)
            per_seed.append(imitation_gap_by_turn(
                env, None, transcript, _Eps(ep.obs, ep.avail), np.asarray(demos.mask)[:n],
                num_bins=turn_bins, labels=ep.actions))
        else:
            for s in seeds:
                i = run_of[(name, s)]
                buf = jax.tree.map(lambda x: np.asarray(x)[i], state.buffer)
                n = int(buf.size)
                if not n:
                    continue
                per_seed.append(imitation_gap_by_turn(
                    env, None, transcript, _Eps(buf.obs[:n], buf.avail[:n]), buf.mask[:n],
                    num_bins=turn_bins, labels=buf.targets[:n]))
        rows = []
        for b, label in enumerate(labels):
            gs = [g[b] for g in per_seed if g[b].states]
            total = sum(g.states for g in gs)
            mean = lambda f: (sum(getattr(g, f) * g.states for g in gs) / total if total
                              else None)
            rows.append(dict(turn=label, states=total, differs=mean("differs"),
                             undetermined=mean("undetermined"), shared=mean("shared")))
        out.append(dict(regime=name, source=GAP_SOURCES[method], budget=int(h["budget"]),
                        seeds=len(per_seed), rows=rows))
    return out


def run_cell(env_id: str, env, task: dict, expert_kind: str, start: str, methods,
             ablations: bool, experts: dict, unit: int, args, root: Path) -> dict:
    import jax

    from jaxil.algorithms.lm import interactive as TI

    s = args.scale
    # The untrained start still needs one demonstration in the data: the cell's expert's episode
    # may be longer than the privileged unit (exchange: 23 tokens against 13).
    sft_units = task["sft"] if start == "sft" else task.get("untrained_units", 1)
    sft_tokens = sft_units * unit
    config = TI.TokenInteractiveConfig(
        rounds=args.rounds, episodes_per_round=task["episodes"] * s, agent_ids=task["agent_ids"],
        updates_per_round=args.updates_per_round * s, batch_episodes=args.batch_episodes,
        sft_tokens=sft_tokens, sft_updates=(args.sft_updates * s if start == "sft" else 0),
        eval_episodes=args.eval_episodes, learning_rate=args.lr)
    regimes = regimes_for(task, start, methods, ablations, unit, sft_tokens, args.quick)
    name = cell_name(expert_kind, start, methods)
    expert, expert_params, expert_name = experts[expert_kind]
    run_dir = root / name
    # A complete cell that is only restored keeps the training time it was measured with.
    res, train_s = first_timing(run_dir, args.overwrite, lambda: TI.run(
        env, expert, expert_params, regimes, seeds=args.seeds, config=config,
        base_seed=args.seed, out_dir=run_dir, resume=run_dir.exists() and not args.overwrite,
        overwrite=args.overwrite, eval_every=config.rounds, progress=not args.no_progress,
        expert_name=expert_name))
    print(f"{env_id} {name}: {len(regimes)} regimes × {args.seeds} seeds in {train_s:.0f}s")
    print(TI.format_table(res.summary))
    return dict(cell=name, expert=expert_kind, start=start, sft_tokens=sft_tokens,
                config=dict(vars(config)), regimes=[n for n, _ in regimes],
                summary={k: v for k, v in res.summary.items() if k != "states"},
                rows=res.rows, train_seconds=train_s), res, regimes


def run_task(env_id: str, task: dict, args) -> dict:
    import jax

    from jaxil import envs
    from jaxil.algorithms.lm import diagnostics as DG
    from jaxil.algorithms.lm import interactive as TI

    knobs = task["knobs"]
    env = envs.make(env_id, **knobs)
    privileged = envs.token_expert(env, "scripted")[0]
    transcript = envs.token_expert(env, "transcript")[0]
    root = Path(args.out) / "runs" / env_id.replace(":", "-")
    t_task = time.time()
    probe = TI._demos_for(env, privileged, None, jax.random.PRNGKey(args.seed + 777_777), 1)
    acc = TI.demo_accounting(env, probe.episodes)
    unit = int(round(float(acc["tokens"][-1]) / len(acc["tokens"])))
    lm_policy, lm_params, lm_info = train_expert_lm(env_id, env, task, transcript, args,
                                                    root / "expert-lm")
    experts = {"privileged": (privileged, None, "scripted"),
               "transcript": (transcript, None, "transcript"),
               "lm": (lm_policy, lm_params, f"lm:{args.expert_size}")}
    key = jax.random.PRNGKey(args.seed + 31_337)
    stats = {"privileged": expert_stats(env, privileged, None, key, args.expert_eval),
             "transcript": expert_stats(env, transcript, None, key, args.expert_eval),
             "lm": expert_stats(env, lm_policy.policy(deterministic=True), lm_params, key,
                                args.expert_eval)}
    for k, v in stats.items():
        print(f"{env_id} expert {k}: win {v['win']:.3f}, {v['tokens']:.1f} tokens, "
              f"{v['turns']:.1f} turns per episode")
    entry = dict(env_id=env_id, knobs=knobs, unit_tokens=unit, experts=stats, expert_lm=lm_info,
                 command="python experiments/lm_agents/run.py " + " ".join(sys.argv[1:]),
                 cells=[])
    results = {}
    for expert_kind, start, methods, ablations in CELLS:
        if expert_kind not in args.experts or start not in args.starts:
            continue
        cell, res, regimes = run_cell(env_id, env, task, expert_kind, start, methods,
                                      ablations and not args.no_ablations, experts, unit,
                                      args, root)
        entry["cells"].append(cell)
        results[cell["cell"]] = (res, regimes)

    t1 = time.time()
    if "privileged-sft" in results:  # the imitation gap of the privileged expert
        res, regimes = results["privileged-sft"]
        demos = TI._demos_for(env, privileged, None, jax.random.PRNGKey(args.seed + 777_777),
                              max(int(h["demo_labels"]) for _, h in regimes))
        entry["gap"] = gap_rows(env, transcript, res, regimes, demos, args.turn_bins)
    if "transcript-sft" in results:  # the covariate shift of the transcript cell's students
        res, regimes = results["transcript-sft"]
        cell = next(c for c in entry["cells"] if c["cell"] == "transcript-sft")
        student = TI.make_student(env, TI.TokenInteractiveConfig(**cell["config"]))
        first = regimes[0][0].split("@")[1]
        run_of = {(r["regime"], r["seed"]): r["run"] for r in res.rows}
        shift = {}
        for method in SHIFT_METHODS:
            tables = []
            for seed in range(args.seeds):
                i = run_of[(f"{method}@{first}", seed)]
                params = jax.tree.map(lambda x: x[i], res.state.params)
                table = DG.covariate_shift(env, student, params, transcript,
                                           jax.random.PRNGKey(99), args.shift_episodes,
                                           args.turn_bins)
                tables.append(DG.covariate_shift_rows(table))
            shift[method] = tables
        entry.update(shift=shift, shift_budget=int(first) * unit)
    entry["diagnostic_seconds"] = time.time() - t1
    # Training as measured (a restored cell keeps its own time), plus the expert LM and the
    # diagnostics; `invocation_seconds` is this invocation's wall time for the task.
    entry["seconds"] = (lm_info["seconds"] + sum(c["train_seconds"] for c in entry["cells"])
                        + entry["diagnostic_seconds"])
    entry["invocation_seconds"] = time.time() - t_task
    print(f"{env_id}: {entry['seconds'] / 60:.1f} min (diagnostics {entry['diagnostic_seconds']:.0f}s)")
    return entry


def merge_task(prev: dict, entry: dict) -> dict:
    """A task's results: `entry`'s cells and diagnostics, and those of
    `prev` (an earlier invocation's) that `entry` lacks, cells in `CELLS`'
    order; `seconds` recounted over the merged cells."""
    names = [cell_name(e, s, m) for e, s, m, _ in CELLS]
    ran = {c["cell"] for c in entry["cells"]}
    cells = [c for c in prev["cells"] if c["cell"] not in ran] + entry["cells"]
    cells.sort(key=lambda c: names.index(c["cell"]) if c["cell"] in names else len(names))
    out = dict(entry, cells=cells)
    if "gap" not in entry and "shift" not in entry:
        out["diagnostic_seconds"] = prev.get("diagnostic_seconds", 0.0)
    for k in ("gap", "shift", "shift_budget"):
        if k not in entry and k in prev:
            out[k] = prev[k]
    out["seconds"] = (out["expert_lm"]["seconds"] + sum(c["train_seconds"] for c in cells)
                      + out["diagnostic_seconds"])
    return out


def _groups(cell: dict) -> dict:
    return {g["regime"]: g for g in cell["summary"]["regimes"]}


def _curve(cell: dict, method: str):
    xs, ys, es = [], [], []
    for g in cell["summary"]["regimes"]:
        if g["regime"].split("@")[0] == method:
            xs.append(g["expert_tokens_mean"])
            ys.append(g["win_mean"])
            es.append(g["win_std"])
    return np.asarray(xs), np.asarray(ys), np.asarray(es)


def _cell(task: dict, name: str):
    return next((c for c in task["cells"] if c["cell"] == name), None)


def _budgets(cell: dict) -> list[str]:
    out = []
    for r in cell["regimes"]:
        at = r.split("@")[1]
        if not r.startswith("oec[") and at not in out:
            out.append(at)
    return out


def beyond(a: dict, b: dict) -> bool:
    """`a` above `b` beyond one std: the difference of the means exceeds
    the larger of the two stds over seeds."""
    return a["win_mean"] - b["win_mean"] > max(a["win_std"], b["win_std"])


def claims(task: dict) -> list[dict]:
    """The seeds' claims, per cell and budget: OEC vs BC, BC vs on-policy
    RS, DAgger vs BC, OPD vs BC (with the expert LM), and the mask and
    repetition-filter ablations vs OEC."""
    out = []
    for cell in task["cells"]:
        g = _groups(cell)
        for at in _budgets(cell):
            for a, b in (("oec", "bc"), ("bc", "onpolicy"), ("dagger", "bc"), ("bc", "dagger")):
                if f"{a}@{at}" in g and f"{b}@{at}" in g:
                    x, y = g[f"{a}@{at}"], g[f"{b}@{at}"]
                    out.append(dict(cell=cell["cell"], budget=at, claim=f"{a} > {b}",
                                    a=x["win_mean"], a_std=x["win_std"], b=y["win_mean"],
                                    b_std=y["win_std"], holds=beyond(x, y)))
        abl = [r for r in cell["regimes"] if r.startswith("oec[")]
        if abl:
            at = abl[0].split("@")[1]
            base = g.get(f"oec@{at}")
            for name in ("mask off", "repetition filter off"):
                x = g.get(f"oec[{name}]@{at}")
                if base and x:
                    out.append(dict(cell=cell["cell"], budget=at, claim=f"oec > oec[{name}]",
                                    a=base["win_mean"], a_std=base["win_std"], b=x["win_mean"],
                                    b_std=x["win_std"], holds=beyond(base, x)))
    return out


def _pm(g: dict | None) -> str:
    return "–" if g is None else f"{g['win_mean']:.3f} ± {g['win_std']:.3f}"


def write_report(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = results["tasks"]
    lines = ["# Interactive imitation on token tasks: privileged and transcript-only experts", "",
             f"{results['seeds']} seeds; {results['wall_seconds'] / 60:.1f} min in all "
             "(training, expert LMs and diagnostics).", "",
             "Experts (greedy, fixed instances):", "",
             "| task | expert | win | tokens / episode | turns / episode |",
             "|---|---|---:|---:|---:|"]
    for t in tasks:
        for k, v in t["experts"].items():
            lines.append(f"| {t['env_id']} | {k} | {v['win']:.3f} | {v['tokens']:.1f} | "
                         f"{v['turns']:.1f} |")
    lines.append("")
    for t in tasks:
        lines += [f"## {t['env_id']} {t['knobs']}", "",
                  f"`{t['command']}`: {t['seconds'] / 60:.1f} min; one privileged expert "
                  f"episode ≈ {t['unit_tokens']} tokens (the budgets' unit); expert LM "
                  f"{t['expert_lm']['size']} on {t['expert_lm']['demos']} transcript "
                  f"demonstrations, {t['expert_lm']['updates']} updates "
                  f"({t['expert_lm']['seconds']:.0f} s).", ""]
        # The effect of the expert's information: one table.
        cells = [c for c in ("privileged-sft", "transcript-sft", "lm-sft") if _cell(t, c)]
        if cells:
            ref = _cell(t, cells[0])
            lines += ["Greedy success, SFT start, privileged / transcript / expert LM "
                      "(mean ± std over seeds):", "",
                      "| budget (tokens) | " + " | ".join(METHOD_LABELS[m] for m in CORE)
                      + " | OPD (expert LM) |", "|---|" + "---|" * (len(CORE) + 1)]
            opd = _cell(t, "lm-sft-opd")
            for at in _budgets(ref):
                tok = int(at) * t["unit_tokens"]
                cols = []
                for m in CORE:
                    vals = []
                    for c in cells:
                        g = _groups(_cell(t, c)).get(f"{m}@{at}")
                        vals.append("–" if g is None else f"{g['win_mean']:.2f}")
                    cols.append(" / ".join(vals))
                og = _groups(opd).get(f"opd@{at}") if opd else None
                lines.append(f"| ×{at} ({tok}) | " + " | ".join(cols) + f" | {_pm(og)} |")
            lines.append("")
        for c in t["cells"]:
            summ = c["summary"]
            lines += [f"### {c['cell']}: {c['expert']} expert, {c['start']} start", "",
                      f"{c['train_seconds'] / 60:.1f} min; {len(c['regimes'])} regimes × "
                      f"{results['seeds']} seeds; start: " + ", ".join(
                          f"{g['regime']} {g['win_mean']:.3f} ± {g['win_std']:.3f}"
                          for g in summ.get("reference", [])), "",
                      "| regime | expert tokens | win rate | return |", "|---|---:|---:|---:|"]
            for g in summ["regimes"]:
                lines.append(f"| {g['regime']} | {g['expert_tokens_mean']:.0f} | {_pm(g)} | "
                             f"{g['return_mean']:.3f} ± {g['return_std']:.3f} |")
            for w in summ.get("budget_warnings", []):
                lines.append(f"\n> {w}")
            lines.append("")
        if t.get("gap"):
            bins = [r["turn"] for r in t["gap"][0]["rows"]]
            lines += ["Imitation gap of the privileged expert (its labels differ from the "
                      "transcript-only expert's / its label is provably not a function of the "
                      "context), over the states each source trains on, per turn:", "",
                      "| source | budget | states | " + " | ".join(f"turn {b}" for b in bins)
                      + " |", "|---|---:|---:|" + "---:|" * len(bins)]
            for gr in t["gap"]:
                cells_ = [("–" if r["differs"] is None else
                           f"{r['differs']:.2f} / {r['undetermined']:.2f}") for r in gr["rows"]]
                lines.append(f"| {gr['source']} ({gr['regime']}) | {gr['budget']} | "
                             f"{gr['rows'][0]['states']} | " + " | ".join(cells_) + " |")
            lines.append("")
        if t.get("shift"):
            lines += [f"Per-turn next-token disagreement with the transcript-only expert on "
                      f"the student's own histories (floor: on the expert's histories) and "
                      f"hidden-state MMD² (floor), transcript cell, students at "
                      f"{t['shift_budget']} tokens:", "",
                      "| turn | " + " | ".join(f"{m} | {m} floor | {m} MMD² | {m} MMD² floor"
                                              for m in SHIFT_METHODS) + " |",
                      "|---|" + "---:|" * (4 * len(SHIFT_METHODS))]
            for b, row in enumerate(t["shift"][SHIFT_METHODS[0]][0]):
                cells_ = []
                for m in SHIFT_METHODS:
                    for col in ("disagreement_student", "disagreement_floor", "mmd2_student",
                                "mmd2_floor"):
                        vals = [rows[b][col] for rows in t["shift"][m]
                                if rows[b][col] is not None]
                        cells_.append(f"{np.mean(vals):.3f}" if vals else "–")
                lines.append(f"| {row['turn']} | " + " | ".join(cells_) + " |")
            lines.append("")
        cl = claims(t)
        if cl:
            lines += ["Claims per cell and budget (holds: the first above the second by more "
                      "than the larger std):", "",
                      "| cell | budget | claim | first | second | holds |",
                      "|---|---|---|---:|---:|---|"]
            for c in cl:
                lines.append(f"| {c['cell']} | ×{c['budget']} | {c['claim']} | "
                             f"{c['a']:.3f} ± {c['a_std']:.3f} | {c['b']:.3f} ± "
                             f"{c['b_std']:.3f} | {'yes' if c['holds'] else 'no'} |")
            lines.append("")
    (out / "table.md").write_text("\n".join(lines) + "\n")

    order = ["transcript-sft", "lm-sft", "privileged-sft", "transcript-untrained", "lm-untrained"]
    fig, axes = plt.subplots(len(tasks), len(order), figsize=(4.6 * len(order), 3.6 * len(tasks)),
                             squeeze=False)
    for row, t in zip(axes, tasks):
        for ax, name in zip(row, order):
            for cname in (name, name + "-opd", name + "-mix"):
                c = _cell(t, cname)
                if c is None:
                    continue
                for k, (method, label) in enumerate(METHOD_LABELS.items()):
                    x, y, e = _curve(c, method)
                    if len(x):  # one colour per method in every panel
                        ax.errorbar(x, y, yerr=e, marker="o", capsize=3, label=label,
                                    color=f"C{k}")
            ax.set_title(f"{t['env_id']}: {name}", fontsize=9)
            ax.set_xlabel("expert tokens (demonstrations included)", fontsize=8)
            ax.set_ylim(-0.03, 1.03)
            ax.grid(alpha=0.3)
        row[0].set_ylabel("greedy success rate")
    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    order_labels = [lab for lab in METHOD_LABELS.values() if lab in handles]
    fig.legend([handles[lab] for lab in order_labels], order_labels, loc="upper center",
               ncol=len(order_labels), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out / "scaling.png", dpi=110)
    plt.close(fig)

    abl = [(t, c) for t in tasks for c in t["cells"] if any(r.startswith("oec[")
                                                          for r in c["regimes"])]
    if abl:
        fig, axes = plt.subplots(1, len(abl), figsize=(6.0 * len(abl), 3.8), squeeze=False)
        for ax, (t, c) in zip(axes[0], abl):
            at = next(r for r in c["regimes"] if r.startswith("oec[")).split("@")[1]
            groups = [g for g in c["summary"]["regimes"]
                      if g["regime"].startswith("oec[") or g["regime"] == f"oec@{at}"]
            ax.barh([g["regime"].split("@")[0] for g in groups],
                    [g["win_mean"] for g in groups], xerr=[g["win_std"] for g in groups])
            ax.set_xlabel("greedy success rate (mean ± std over seeds)")
            ax.set_title(f"{t['env_id']} ({c['cell']}): OEC ablations at ×{at}", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / "ablations.png", dpi=110)
        plt.close(fig)

    shifted = [t for t in tasks if t.get("shift")]
    if shifted:
        fig, axes = plt.subplots(1, len(shifted), figsize=(5.5 * len(shifted), 4),
                                 squeeze=False)
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
            ax.set_ylabel("disagreement with the transcript-only expert")
            ax.set_title(t["env_id"])
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "shift.png", dpi=110)
        plt.close(fig)

    gapped = [t for t in tasks if t.get("gap")]
    if gapped:
        fig, axes = plt.subplots(1, len(gapped), figsize=(5.5 * len(gapped), 4), squeeze=False)
        for ax, t in zip(axes[0], gapped):
            first = {}
            for gr in t["gap"]:  # each source at its smallest budget
                first.setdefault(gr["source"], gr)
            for src, gr in first.items():
                rows = gr["rows"][1:]
                x = np.arange(len(rows))
                ax.plot(x, [np.nan if r["differs"] is None else r["differs"] for r in rows],
                        marker="o", label=f"{src}: differs")
                ax.plot(x, [np.nan if r["undetermined"] is None else r["undetermined"]
                            for r in rows], marker="x", ls=":", label=f"{src}: undetermined")
            ax.set_xticks(np.arange(len(rows)), [r["turn"] for r in rows])
            ax.set_xlabel("turn")
            ax.set_ylabel("share of trained states")
            ax.set_ylim(-0.03, 1.03)
            ax.set_title(f"{t['env_id']}: privileged expert's imitation gap", fontsize=9)
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "gap.png", dpi=110)
        plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="experiments/lm_agents/results")
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--experts", nargs="+", default=list(EXPERTS), choices=list(EXPERTS))
    p.add_argument("--starts", nargs="+", default=["sft", "untrained"],
                   choices=["sft", "untrained"])
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=int, default=1,
                   help="multiply episodes per round, updates and SFT updates (a GPU: 4-16)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--updates-per-round", type=int, default=30)
    p.add_argument("--batch-episodes", type=int, default=16)
    p.add_argument("--sft-updates", type=int, default=300)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-episodes", type=int, default=128)
    p.add_argument("--expert-size", default="mini")
    p.add_argument("--expert-demos", type=int, default=512)
    p.add_argument("--expert-updates", type=int, default=500)
    p.add_argument("--expert-eval", type=int, default=256)
    p.add_argument("--shift-episodes", type=int, default=48)
    p.add_argument("--turn-bins", type=int, default=6)
    p.add_argument("--no-ablations", action="store_true")
    p.add_argument("--quick", action="store_true",
                   help="2 budgets, 2 seeds, short rounds, a small expert LM")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--overwrite", action="store_true",
                   help="start every cell afresh, replacing its run directory under --out "
                        "(default: resume it, which refuses a cell run with other settings)")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.rounds, args.updates_per_round = 2, 2, 10
        args.sft_updates, args.eval_episodes, args.shift_episodes = 30, 16, 16
        args.expert_size, args.expert_demos, args.expert_updates = "tiny", 64, 30
        args.expert_eval = 32
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    path = out / "results.json"
    for eid in args.tasks:  # results.json and the report are rewritten after every task
        try:
            entry = run_task(eid, TASKS[eid], args)
        except ValueError as e:  # e.g. a cell's run directory holds a run with other settings
            print(f"error: {eid}: {e}", file=sys.stderr)
            return 2
        old = json.loads(path.read_text()).get("tasks", []) if path.exists() else []
        prev = next((t for t in old if t["env_id"] == eid and "cells" in t), None)
        if prev is not None:  # cells (and diagnostics) this invocation did not run are kept
            entry = merge_task(prev, entry)
        tasks = [t for t in old if t["env_id"] != eid and "cells" in t] + [entry]
        tasks.sort(key=lambda t: list(TASKS).index(t["env_id"]))
        results = dict(seeds=args.seeds, tasks=tasks,
                       wall_seconds=sum(t["seconds"] for t in tasks))
        path.write_text(json.dumps(results, indent=1, default=float))
        write_report(results, out)
    print(f"this invocation {(time.time() - t0) / 60:.1f} min; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
