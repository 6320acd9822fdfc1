"""Interactive-imitation throughput: the time of one compiled round of OEC on
``smax:3m`` with the zoo expert, and where it goes (rollouts vs updates).

What is timed is :func:`jaxil.algorithms.interactive.loop.make_round` — the
program :func:`jaxil.algorithms.interactive.loop.run` calls once per round:
``envs_per_round`` (E) shared-control episodes
(:func:`jaxil.algorithms.interactive.rollout.mixed_episodes`, student until the
OEC switch, then the expert), their labels, loss mask, verifier, repetition
filter and budget allowance (:mod:`jaxil.algorithms.interactive.labels`), the
insert into the ring buffer, then K = ``updates_per_round`` fused BC updates of
the student (:func:`jaxil.algorithms.interactive.loop.train_student`).

Setup: the zoo expert of the env (for ``smax:3m`` a shipped MAPPO teacher,
:func:`jaxil.cli.interactive.load_expert`), demonstrations from
:func:`~jaxil.algorithms.interactive.loop.collect_demos`, the student (64-64
PolicyNet, batch 256) behaviour-cloned on the SFT set by
:func:`~jaxil.algorithms.interactive.loop.init_states`, one OEC regime
(:func:`jaxil.algorithms.interactive.config.regime` with ``switch_hi=7``, the verifier
on) whose budget is ``sft_labels + rounds × E_max × max_steps × N``: more
than any round can spend, so no episode is dropped for budget (checked: every
row's ``within_budget`` equals E).

1. **Envs per round** (E = 1 … 4096, ``--num-envs``): ONE run's state
   (``jax.tree.map(lambda x: x[0], states)`` of ``init_states``, seed 0).
   Three programs, each compiled ahead (``jax.jit``, no donation: the same
   state is the input of every repeat, and is checked to be intact after),
   run once as a warm-up, then timed in alternation so they see the same
   machine load, each repeat ended by ``block_until_ready``:

   - ``round``: ``make_round`` with K = 250;
   - ``rollout``: ``make_round`` with ``updates_per_round=1`` — the rollout
     part (episodes + labels/mask/filters + insert) plus ONE update (≈ 1/K
     of ``update``; not subtracted);
   - ``update``: ``train_student`` with K = 250 alone, on the state the
     round returns (its buffer holds that round's steps). Its shapes do not
     depend on E (the buffer's capacity is fixed), so it is compiled once.

   ``rollout share`` = rollout / (rollout + update), ``update share`` the
   rest; ``round/sum`` = round / (rollout + update) (below 1: fusing the two
   parts in one program saves time; above 1: it costs).
2. **Runs vmapped** (``--runs`` 1, 4, 16 at E = ``--runs-envs``, 64): the
   round ``jax.jit(jax.vmap(round, in_axes=(0, None, None)))`` over the
   stacked states of one seed per run, as the driver runs regimes × seeds.
   The vmapped while-loop runs until every run's episodes have ended.

Definitions: ``valid steps`` = environment steps of the round's episodes
(the sum of the rollout's mask), read from the round's metrics
(``env_steps``, which counts the valid steps of episodes within budget —
here all of them), summed over runs; ``loop steps`` (with ``--loop-steps``)
= trips of the rollout's while-loop (the longest of the E episodes; a
finished episode is frozen and masked until the others end), from a separate
untimed ``mixed_episodes`` call with the round's key whose lengths must sum to
the metrics' valid steps (off by default: one more ~12 s compile per E);
``env-steps/s`` = valid steps / median round seconds; ``updates/s`` =
runs × K / median round seconds; ``cpu s`` = median process CPU seconds (on
a machine shared with other work the wall clock includes waiting for a core).
The number of repeats adapts to the warm-up (about ``--target-s`` seconds of
repeats, at least ``--min-repeats``, at most ``--repeats``): the largest E get
fewer repeats, which their rows say (``note``).

    python benchmarks/interactive_throughput.py            # E = 1 … 4096, runs 1/4/16 at E = 64
    python benchmarks/interactive_throughput.py --quick    # E = 1, 4, 16; runs 1, 4 at E = 16
    python benchmarks/interactive_throughput.py --quick --out /tmp/ibench.json   # JSON to that path
    python benchmarks/interactive_throughput.py --num-envs 64 1024 --runs 1 4 --loop-steps

Wall time is mostly XLA compilation, ~15 s per round program on one core
(two per E, one per runs row): the default run is estimated at ~7 min on an
idle 2-core CPU, ``--quick`` at ~2 min.

Writes ``benchmarks/results/interactive_throughput-<host>-<date>.json``
(``--out PATH`` writes PATH instead) and prints two tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Optional

import jax
import numpy as np

from jaxil.cli.interactive import load_expert
from jaxil.algorithms.interactive.config import InteractiveConfig, regime, resolve_auto
from jaxil.algorithms.interactive.loop import (Demos, InteractiveState, collect_demos, demo_steps_for,
                                    init_states, make_round, make_student, train_student)
from jaxil.algorithms.interactive.rollout import SwitchRule, mixed_episodes
from jaxil.algorithms.interactive.schedule import expert_probability
from jaxil.runs import measure

RESULTS_DIR = Path(__file__).resolve().parent / "results"

DEFAULT_NUM_ENVS = (1, 4, 16, 64, 256, 1024, 4096)
QUICK_NUM_ENVS = (1, 4, 16)
DEFAULT_RUNS = (1, 4, 16)
QUICK_RUNS = (1, 4)


# -- setup ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Setup:
    env: Any
    expert: Any
    expert_params: Any
    source: str
    config: InteractiveConfig  # envs_per_round is set per row
    student: Any
    demos: Demos
    sft_steps: int
    demo_steps: int
    hp: dict
    demo_summary: dict
    sft_s: float


def setup(args) -> Setup:
    """Expert, demonstrations, the OEC regime and the SFT'd student's program."""
    env, expert, expert_params, source = load_expert(args.env, args.expert)
    spec = env.spec
    n = spec.num_agents
    config = InteractiveConfig(hidden=tuple(args.hidden), batch_size=args.batch_size,
                               updates_per_round=args.updates, sft_labels=args.sft_labels,
                               sft_updates=args.sft_updates, capacity=args.capacity)
    n_demo = 64
    while True:
        demos, cum, summary = collect_demos(env, expert, expert_params,
                                            jax.random.PRNGKey(args.seed + 777_777), n_demo)
        if cum[-1] >= config.sft_labels:
            break
        n_demo = int(np.ceil(n_demo * config.sft_labels / cum[-1] * 1.1)) + 8
    steps_cum = cum // n
    sft_steps = demo_steps_for(config.sft_labels, cum, steps_cum)
    if sft_steps == 0:
        raise SystemExit(f"--sft-labels {config.sft_labels} is less than one expert episode "
                         f"({int(cum[0])} labels); raise it")
    # More than a round can spend at the largest E, so the allowance never drops an episode.
    e_max = max(list(args.num_envs) + [args.runs_envs])
    budget = config.sft_labels + config.rounds * e_max * spec.max_steps * n
    if budget >= 2**31:
        raise SystemExit(f"budget {budget} overflows int32; use fewer --num-envs")
    hp = regime("oec", budget, sft_labels=config.sft_labels, has_win=spec.has_win,
                switch_hi=args.switch_hi)
    hp = resolve_auto(hp, summary["length_mean"], summary["return_q25"])
    demo_steps = demo_steps_for(int(hp["demo_labels"]), cum, steps_cum)
    return Setup(env, expert, expert_params, source, config, make_student(env, config),
                 demos, sft_steps, demo_steps, hp, summary, 0.0)


def stacked_states(s: Setup, runs: int, base_seed: int) -> InteractiveState:
    """``[runs]``-stacked states (seeds 0 … runs−1), each SFT-trained; every
    seed's state depends on its seed only, so ``x[:r]`` are the states of ``r`` runs."""
    cfg = s.config

    def sft(state, demos):
        return train_student(s.student, state, demos, cfg.sft_updates, cfg.batch_size)

    sft_fn = jax.jit(jax.vmap(sft, in_axes=(0, None)))
    t0 = time.perf_counter()
    states = init_states(s.env, s.student, cfg, [dict(s.hp)] * runs, list(range(runs)), base_seed,
                         [s.demo_steps] * runs, s.sft_steps, s.demos, sft_fn)
    states = jax.block_until_ready(states)
    s.sft_s += time.perf_counter() - t0
    return states


def round_lengths(s: Setup, state: InteractiveState, num_envs: int):
    """Episode lengths ``[E]`` of the round ``state`` starts, from the same key
    and switch rule as :func:`make_round` (untimed; checked against its metrics)."""
    hp = state.hp

    @jax.jit
    def lengths(st):
        k_roll = jax.random.split(st.key, 3)[1]
        beta = expert_probability(st.round, hp.beta0, hp.beta_kind, hp.beta_rate)
        rule = SwitchRule(hp.switch_kind, hp.switch_lo, hp.switch_hi, hp.switch_p, beta)
        ep = mixed_episodes(s.env, s.student.policy(False), s.expert, st.student.params,
                            s.expert_params, rule, k_roll, num_envs)
        return ep.length

    return np.asarray(lengths(state))


# -- timing ----------------------------------------------------------------------------------


def n_repeats(warm_s: float, args) -> int:
    """About ``target_s`` seconds of repeats, within [min_repeats, repeats]."""
    return int(min(args.repeats, max(args.min_repeats, math.floor(args.target_s / max(warm_s, 1e-9)))))


def alternate(calls: dict[str, tuple], n: int, warm: dict[str, float]) -> dict[str, measure.Timing]:
    """``n`` timed repeats of each ``name: (fn, args)``, in alternation."""
    walls = {k: [] for k in calls}
    cpus = {k: [] for k in calls}
    for _ in range(max(n, 1)):
        for k, (fn, a) in calls.items():
            w, c, out = measure.time_once(fn, *a)
            del out
            walls[k].append(w)
            cpus[k].append(c)
    return {k: measure.Timing(walls[k], cpus[k], warm[k]) for k in calls}


def check_intact(tree: Any, what: str) -> None:
    if any(x.is_deleted() for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)):
        raise RuntimeError(f"{what} was donated by a timed call; every repeat must read the same state")


def fits(compiled, label: str) -> Optional[str]:
    """A reason to skip when XLA's buffers would not fit in free memory."""
    reason = measure.memory_shortfall(measure.xla_memory(compiled))
    return f"{label} {reason}" if reason else None


# -- 1. envs per round -------------------------------------------------------------------------


def measure_envs(s: Setup, state: InteractiveState, num_envs: int, update_call, args) -> dict:
    """One row: round, rollout (K = 1) and update (K alone) at E = ``num_envs``."""
    K = s.config.updates_per_round
    cfg = dataclasses.replace(s.config, envs_per_round=num_envs)
    cfg1 = dataclasses.replace(cfg, updates_per_round=1)
    row: dict[str, Any] = dict(section="envs", env=s.env.spec.env_id, num_envs=num_envs, runs=1,
                               updates_per_round=K)
    args_r = (state, s.demos, s.expert_params)
    try:
        round_c, row["compile_round_s"] = measure.compile_ahead(
            make_round(s.env, s.student, s.expert, cfg), *args_r)
        rollout_c, row["compile_rollout_s"] = measure.compile_ahead(
            make_round(s.env, s.student, s.expert, cfg1), *args_r)
        for c, label in ((round_c, "round"), (rollout_c, "rollout")):
            reason = fits(c, label)
            if reason:
                print(f"  E={num_envs}: skipped ({reason})", flush=True)
                return dict(row, skipped=reason)
        row.update({f"round_{k}": v for k, v in measure.xla_memory(round_c).items()})

        w_round, _, (after, metrics) = measure.time_once(round_c, *args_r)
        w_roll, _, out = measure.time_once(rollout_c, *args_r)
        del out
        args_u = (after, s.demos)
        w_upd, _, out = measure.time_once(update_call, *args_u)
        del out
        warm = dict(round=w_round, rollout=w_roll, update=w_upd)
        n = n_repeats(w_round + w_roll + w_upd, args)
        t = alternate(dict(round=(round_c, args_r), rollout=(rollout_c, args_r),
                           update=(update_call, args_u)), n, warm)
        check_intact(state, "the round's input state")
        lengths = round_lengths(s, state, num_envs) if args.loop_steps else None
    except Exception as e:  # noqa: BLE001
        if measure.is_oom(e):
            reason = f"out of memory: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            print(f"  E={num_envs}: skipped ({reason})", flush=True)
            return dict(row, skipped=reason)
        raise

    m = jax.tree.map(np.asarray, metrics)
    valid = int(m["env_steps"]) - int(np.asarray(state.env_steps))
    within = int(m["episodes_within_budget"])
    if within != num_envs:
        print(f"  warning: E={num_envs}: only {within} episodes within budget", flush=True)
    loop_steps = None
    if lengths is not None:
        if int(lengths.sum()) == valid:
            loop_steps = int(lengths.max())
        else:
            print(f"  warning: E={num_envs}: recomputed lengths sum {int(lengths.sum())} != "
                  f"metrics env_steps {valid}; loop steps not reported", flush=True)
    r, ro, up = t["round"].median_s, t["rollout"].median_s, t["update"].median_s
    parts = ro + up
    row.update(
        skipped=None,
        round_s=r, round_cpu_s=t["round"].cpu_median_s,
        rollout_s=ro, rollout_cpu_s=t["rollout"].cpu_median_s,
        update_s=up, update_cpu_s=t["update"].cpu_median_s,
        rollout_share=ro / parts, update_share=up / parts, round_over_sum=r / parts,
        valid_steps=valid, loop_steps=loop_steps, mean_length=valid / num_envs,
        env_steps_per_s=valid / r, updates_per_s=K / r,
        rollout_env_steps_per_s=valid / ro, update_only_updates_per_s=K / up,
        within_budget=within, episodes_kept=int(m["episodes_kept"]),
        trained_steps=int(m["trained_steps"]), interactive_labels=int(m["interactive_labels"]),
        accept_rate=float(m["accept_rate"]), rollout_return=float(m["rollout_return"]),
        repeats=n,
        note=(f"{n} repeats (most {args.repeats}): warm-up {w_round + w_roll + w_upd:.1f} s"
              if n < args.repeats else None),
        timing={k: v.to_dict() for k, v in t.items()},
    )
    return row


# -- 2. runs vmapped ---------------------------------------------------------------------------


def measure_runs(s: Setup, all_states: InteractiveState, runs: int, num_envs: int, args) -> dict:
    """One row: ``runs`` vmapped rounds at E = ``num_envs`` (the first ``runs``
    of ``all_states``)."""
    K = s.config.updates_per_round
    cfg = dataclasses.replace(s.config, envs_per_round=num_envs)
    states = jax.tree.map(lambda x: x[:runs], all_states)
    row: dict[str, Any] = dict(section="runs", env=s.env.spec.env_id, num_envs=num_envs, runs=runs,
                               updates_per_round=K)
    fn = jax.vmap(make_round(s.env, s.student, s.expert, cfg), in_axes=(0, None, None))
    a = (states, s.demos, s.expert_params)
    try:
        compiled, row["compile_round_s"] = measure.compile_ahead(fn, *a)
        reason = fits(compiled, "round")
        if reason:
            print(f"  runs={runs}: skipped ({reason})", flush=True)
            return dict(row, skipped=reason)
        w, _, (_, metrics) = measure.time_once(compiled, *a)
        n = n_repeats(w, args)
        t = alternate(dict(round=(compiled, a)), n, dict(round=w))["round"]
        check_intact(states, "the vmapped round's input states")
    except Exception as e:  # noqa: BLE001
        if measure.is_oom(e):
            reason = f"out of memory: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            print(f"  runs={runs}: skipped ({reason})", flush=True)
            return dict(row, skipped=reason)
        raise
    m = jax.tree.map(np.asarray, metrics)
    valid = int(m["env_steps"].sum()) - int(np.asarray(states.env_steps).sum())
    within = int(m["episodes_within_budget"].sum())
    if within != runs * num_envs:
        print(f"  warning: runs={runs}: only {within} of {runs * num_envs} episodes within budget",
              flush=True)
    r = t.median_s
    row.update(skipped=None, round_s=r, round_cpu_s=t.cpu_median_s, per_run_s=r / runs,
               valid_steps=valid, mean_length=valid / (runs * num_envs),
               env_steps_per_s=valid / r, updates_per_s=runs * K / r, within_budget=within,
               repeats=n,
               note=(f"{n} repeats (most {args.repeats}): warm-up {w:.1f} s"
                     if n < args.repeats else None),
               timing=t.to_dict())
    return row


# -- main ----------------------------------------------------------------------------------


ENV_COLUMNS = [
    ("num_envs", "E", "{}"),
    ("compile_round_s", "compile s", "{:.1f}"),
    ("round_s", "round s", "{:.4f}"),
    ("round_cpu_s", "cpu s", "{:.4f}"),
    ("valid_steps", "valid steps", "{}"),
    ("loop_steps", "loop steps", "{}"),
    ("env_steps_per_s", "env-steps/s", "{:.0f}"),
    ("updates_per_s", "updates/s", "{:.0f}"),
    ("rollout_s", "rollout s", "{:.4f}"),
    ("update_s", "update s", "{:.4f}"),
    ("rollout_share", "rollout %", "{:.0%}"),
    ("update_share", "update %", "{:.0%}"),
    ("round_over_sum", "round/sum", "{:.2f}"),
    ("repeats", "reps", "{}"),
]

RUN_COLUMNS = [
    ("num_envs", "E", "{}"),
    ("runs", "runs", "{}"),
    ("compile_round_s", "compile s", "{:.1f}"),
    ("round_s", "round s", "{:.4f}"),
    ("round_cpu_s", "cpu s", "{:.4f}"),
    ("per_run_s", "s/run", "{:.4f}"),
    ("per_run_vs_1", "s/run vs 1 run", "{:.2f}"),
    ("valid_steps", "valid steps", "{}"),
    ("env_steps_per_s", "env-steps/s", "{:.0f}"),
    ("updates_per_s", "updates/s", "{:.0f}"),
    ("repeats", "reps", "{}"),
]

DEFINITIONS = {
    "round": "jax.jit(make_round(env, student, expert, config)) on one run's state, "
             "updates_per_round = K",
    "rollout": "make_round with updates_per_round = 1: mixed_episodes + labels/mask/verifier/"
               "repetition filter/budget + buffer insert + ONE student update",
    "update": "train_student(student, state, demos, K, batch_size) alone, on the state the round returns",
    "round_s / rollout_s / update_s": "median wall seconds of a call (cpu_s: median process CPU seconds)",
    "rollout_share / update_share": "rollout_s / (rollout_s + update_s), update_s / (rollout_s + update_s)",
    "round_over_sum": "round_s / (rollout_s + update_s)",
    "valid_steps": "environment steps of the round's episodes (sum of the rollout mask), from the "
                   "round's metrics env_steps (valid steps of episodes within budget; all are), "
                   "summed over runs",
    "loop_steps": "while-loop trips of the rollout = the longest episode of the round (untimed "
                  "mixed_episodes call with the round's key; its lengths sum to valid_steps)",
    "mean_length": "valid_steps / (runs * E)",
    "env_steps_per_s": "valid_steps / round_s",
    "updates_per_s": "runs * K / round_s",
    "rollout_env_steps_per_s": "valid_steps / rollout_s",
    "update_only_updates_per_s": "K / update_s",
    "per_run_s": "round_s / runs (runs vmapped in one program)",
    "per_run_vs_1": "per_run_s / the 1-run row's round_s",
    "within_budget": "episodes the budget allowance kept (must be runs * E: nothing dropped)",
    "episodes_kept / trained_steps / accept_rate": "the round's metrics: episodes passing the "
                                                    "verifier and repetition filter, steps trained on",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="E = 1, 4, 16; runs 1, 4 at E = 16; fewer repeats (~2 min)")
    p.add_argument("--env", default="smax:3m", help="env id with a zoo expert (default: %(default)s)")
    p.add_argument("--expert", default="zoo", help="zoo | scripted | a teacher run directory")
    p.add_argument("--num-envs", nargs="+", type=int, default=None,
                   help=f"envs per round (default {' '.join(map(str, DEFAULT_NUM_ENVS))})")
    p.add_argument("--runs", nargs="+", type=int, default=None,
                   help=f"vmapped runs (default {' '.join(map(str, DEFAULT_RUNS))}; none: 0)")
    p.add_argument("--runs-envs", type=int, default=None, help="envs per round of the runs rows (64)")
    p.add_argument("--updates", type=int, default=250, help="K, updates per round")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--hidden", nargs="+", type=int, default=[64, 64])
    p.add_argument("--capacity", type=int, default=InteractiveConfig().capacity, help="buffer steps")
    p.add_argument("--sft-labels", type=int, default=InteractiveConfig().sft_labels)
    p.add_argument("--sft-updates", type=int, default=InteractiveConfig().sft_updates)
    p.add_argument("--switch-hi", type=int, default=7, help="OEC switch range upper end")
    p.add_argument("--seed", type=int, default=0, help="base seed")
    p.add_argument("--repeats", type=int, default=None, help="most timed calls per row (5; quick 3)")
    p.add_argument("--min-repeats", type=int, default=None, help="fewest timed calls per row (2; quick 1)")
    p.add_argument("--target-s", type=float, default=None,
                   help="about this many seconds of timed repeats per row (6; quick 2)")
    p.add_argument("--loop-steps", action="store_true",
                   help="also report loop steps (one more untimed program per E: ~12 s compile each)")
    p.add_argument("--cache-dir", default=None, help="JAX persistent compilation cache")
    p.add_argument("--out", default=None,
                   help="JSON path (default benchmarks/results/<name>-<host>-<date>.json)")
    p.add_argument("--name", default="interactive_throughput", help="JSON file name prefix")
    args = p.parse_args(argv)
    q = args.quick
    args.num_envs = sorted(set(args.num_envs or (QUICK_NUM_ENVS if q else DEFAULT_NUM_ENVS)))
    args.runs = sorted(set(args.runs if args.runs is not None else (QUICK_RUNS if q else DEFAULT_RUNS)))
    args.runs = [r for r in args.runs if r > 0]
    args.runs_envs = args.runs_envs or (16 if q else 64)
    args.repeats = args.repeats or (3 if q else 5)
    args.min_repeats = args.min_repeats or (1 if q else 2)
    args.target_s = args.target_s if args.target_s is not None else (2.0 if q else 6.0)
    for name in ("updates", "batch_size", "capacity", "sft_labels", "sft_updates", "runs_envs",
                 "repeats", "min_repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if any(n < 1 for n in args.num_envs):
        p.error("--num-envs must be positive")
    return args


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.cache_dir:
        jax.config.update("jax_compilation_cache_dir", args.cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    t0 = time.perf_counter()
    load = {"start": measure.loadavg()}
    payload: dict[str, Any] = {
        "machine": measure.machine_info(),
        "versions": measure.library_versions(),
        "config": dict(vars(args)),
        "definitions": DEFINITIONS,
    }
    m = payload["machine"]
    print(f"jaxil interactive-round throughput on {m['cpu_model']} ({m['cpu_count']} CPUs, backend "
          f"{m['backend']}), jax {payload['versions']['jax']}, load {load['start']}", flush=True)
    s = setup(args)
    K = s.config.updates_per_round
    print(f"{s.env.spec.env_id}: expert {s.source}; demos return {s.demo_summary['return_mean']:.3f}, "
          f"win {s.demo_summary['win_rate']:.3f}, length {s.demo_summary['length_mean']:.1f}; "
          f"OEC budget {s.hp['budget']}, switch [{s.hp['switch_lo']}, {s.hp['switch_hi']}]; "
          f"K={K}, batch {s.config.batch_size}, hidden {s.config.hidden}", flush=True)
    rows: list[dict[str, Any]] = []

    all_states = stacked_states(s, max([1] + args.runs), args.seed)
    state = jax.tree.map(lambda x: x[0], all_states)
    update_call, update_compile_s = measure.compile_ahead(
        lambda st, d: train_student(s.student, st, d, K, s.config.batch_size), state, s.demos)
    print(f"\n[envs per round] one run; update program compiled in {update_compile_s:.1f} s", flush=True)
    for n in args.num_envs:
        row = measure_envs(s, state, n, update_call, args)
        row["compile_update_s"] = update_compile_s
        rows.append(row)
        if not row.get("skipped"):
            print(f"  E={n}: round {row['round_s']:.4f} s ({row['repeats']} reps), "
                  f"{row['env_steps_per_s']:.0f} env-steps/s, {row['updates_per_s']:.0f} updates/s, "
                  f"rollout {row['rollout_share']:.0%} / update {row['update_share']:.0%}", flush=True)
        jax.clear_caches()  # keep one size's executables in memory at a time
    load["after_envs"] = measure.loadavg()

    if args.runs:
        print(f"\n[runs vmapped] E={args.runs_envs}", flush=True)
    for r in args.runs:
        row = measure_runs(s, all_states, r, args.runs_envs, args)
        rows.append(row)
        if not row.get("skipped"):
            print(f"  runs={r}: round {row['round_s']:.4f} s ({row['repeats']} reps), "
                  f"{row['per_run_s']:.4f} s/run, {row['env_steps_per_s']:.0f} env-steps/s", flush=True)
        jax.clear_caches()
    one = next((x for x in rows if x["section"] == "runs" and x["runs"] == 1 and not x.get("skipped")), None)
    for x in rows:
        if x["section"] == "runs" and not x.get("skipped") and one:
            x["per_run_vs_1"] = x["per_run_s"] / one["round_s"]
    load["end"] = measure.loadavg()

    payload.update(
        setup=dict(env=s.env.spec.env_id, expert=s.source,
                   config=dict(s.config.to_dict(), envs_per_round="num_envs of each row"),
                   regime={k: (v if isinstance(v, (int, float, str, bool)) else str(v))
                           for k, v in s.hp.items()},
                   demos=dict(s.demo_summary, sft_steps=s.sft_steps, demo_steps=s.demo_steps),
                   sft_s=s.sft_s, update_compile_s=update_compile_s),
        rows=rows, load=load, wall_s=time.perf_counter() - t0)
    path = measure.write_json(args.name, payload, RESULTS_DIR, path=args.out)
    print()
    print(f"envs per round (one run, K={K}):")
    env_rows = [x for x in rows if x["section"] == "envs" and not x.get("skipped")]
    cols = [c for c in ENV_COLUMNS if c[0] != "loop_steps" or args.loop_steps]
    print(measure.format_table(env_rows, cols))
    notes = [x for x in rows if x.get("note")]
    runs_rows = [x for x in rows if x["section"] == "runs" and not x.get("skipped")]
    if runs_rows:
        print(f"\nruns vmapped (E={args.runs_envs}, K={K} each):")
        print(measure.format_table(runs_rows, RUN_COLUMNS))
    for x in notes:
        print(f"note: {x['section']} E={x['num_envs']} runs={x['runs']}: {x['note']}")
    for x in rows:
        if x.get("skipped"):
            print(f"skipped: {x['section']} E={x['num_envs']} runs={x['runs']}: {x['skipped']}")
    print(f"\nwrote {path} ({payload['wall_s']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
