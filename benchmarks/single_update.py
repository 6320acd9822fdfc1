"""One update per call against fused updates, and where the difference goes.

A user who calls a learner's update from a loop of their own runs one
compiled call per update; ``jaxil train`` fuses K = 16 updates into one
call (:func:`jaxil.algorithms.offline.update_n`). At the paper shapes (MisoDICE on
SMACv1 5m_vs_6m: N = 5, obs 124, state 780, 12 actions, 256-256 networks,
1120 joint transitions per batch; O-MAPL: 8 trajectory pairs × 70 steps)
this measures, per update and side by side in one process:

- ``fused``: one call of K = 16 updates (the reference);
- ``single``: ``jax.jit(update_n)`` with K = 1 called once per update, the
  state not donated (jaxil before);
- ``single_donated``: :func:`jaxil.algorithms.offline.jit_update_n` (K = 1, the state
  donated).

Each configuration runs in child processes that differ in one thing set
before JAX starts: host memory as glibc gives it (``default``) or kept for
reuse (``retain``, :func:`jaxil.runs.hostmem.retain`), on 1 core (pinned, XLA's
single-thread flags) and on all cores. Rounds interleave the three calls,
so load drift hits them alike; medians over rounds of wall time, process
CPU time and minor page faults per update.

    python benchmarks/single_update.py                 # paper shapes, ~15 min on 2 cores
    python benchmarks/single_update.py --quick         # small shapes, ~1 min (smoke test)
    python benchmarks/single_update.py --learners omapl --cores 1
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from jaxil.runs import measure

RESULTS_DIR = Path(__file__).resolve().parent / "results"

LEARNERS = ("omapl", "misodice")
CALLS = ("fused", "single", "single_donated")
MEMORY = ("default", "retain")


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def child(args) -> dict[str, Any]:
    """Measure the three calls of one learner in this process."""
    if args.memory == "retain":
        from jaxil.runs.hostmem import retain

        if not retain():
            return {"error": "jaxil.runs.hostmem.retain() had no effect here (no glibc mallopt)"}
    import jax

    # The child always runs as this script (run_child), so its sibling imports plainly.
    from learner_throughput import (PAPER, PAPER_PAIRS, Shapes, _learner, synthetic_data, synthetic_preferences,
                                    synthetic_spec)
    from jaxil.algorithms.offline import jit_update_n, update_n

    if args.quick:
        shapes, batch, pairs, trajs = Shapes(obs_dim=32, state_per_agent=16, hidden=(64, 64),
                                             mixer_hidden=16, episode_len=20), 128, 4, 60
    else:
        shapes, batch, pairs, trajs = Shapes(), PAPER.batch, PAPER_PAIRS, 1200
    spec = synthetic_spec(5, shapes)
    if args.learner == "omapl":
        data = synthetic_preferences(jax.random.PRNGKey(1), spec, 16 * pairs, shapes.episode_len)
        learner = _learner("omapl", spec, pairs, shapes)
    else:
        data = synthetic_data(jax.random.PRNGKey(0), spec, trajs, shapes.episode_len)
        learner = _learner(args.learner, spec, batch, shapes)
    k = args.k
    calls = {
        "fused": (jax.jit(lambda s, d: update_n(learner, s, d, k)), k),
        "single": (jax.jit(lambda s, d: update_n(learner, s, d, 1)), 1),
        "single_donated": (jit_update_n(learner, 1), 1),
    }
    states = {c: learner.init(jax.random.PRNGKey(0)) for c in CALLS}
    t_compile = {}
    for c, (fn, _) in calls.items():  # compile and warm up twice (allocator, caches)
        t0 = time.perf_counter()
        for _ in range(2):
            states[c], _m = jax.block_until_ready(fn(states[c], data))
        t_compile[c] = time.perf_counter() - t0
    per: dict[str, dict[str, list[float]]] = {c: {"wall": [], "cpu": [], "faults": []} for c in CALLS}
    for _ in range(args.rounds):
        for c, (fn, kc) in calls.items():
            n = 1 if c == "fused" else args.singles
            f0, c0, t0 = _faults(), time.process_time(), time.perf_counter()
            for _ in range(n):
                states[c], _m = fn(states[c], data)
                jax.block_until_ready(states[c])  # as a loop that reads its metrics would
            per[c]["wall"].append((time.perf_counter() - t0) / (n * kc))
            per[c]["cpu"].append((time.process_time() - c0) / (n * kc))
            per[c]["faults"].append((_faults() - f0) / (n * kc))
    med = measure.median
    rows = {c: {"update_ms": 1e3 * med(v["wall"]), "cpu_ms": 1e3 * med(v["cpu"]),
                "faults_per_update": med(v["faults"]), "warmup_s": t_compile[c],
                "wall_ms_rounds": [round(1e3 * x, 2) for x in v["wall"]]} for c, v in per.items()}
    for c in ("single", "single_donated"):
        rows[c]["ratio_to_fused"] = rows[c]["update_ms"] / rows["fused"]["update_ms"]
        rows[c]["cpu_ratio_to_fused"] = rows[c]["cpu_ms"] / rows["fused"]["cpu_ms"]
    return {"learner": args.learner, "memory": args.memory, "cores": args.cores, "k": k,
            "rounds": args.rounds, "singles_per_round": args.singles, "calls": rows,
            "loadavg_end": measure.loadavg()}


def run_child(learner: str, memory: str, cores: str, args) -> dict[str, Any]:
    """:func:`child` in a child process running this script (``cores == "1"``:
    XLA's single-thread flags, pinned to one CPU)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--learner", learner,
           "--memory", memory, "--cores", cores, "--rounds", str(args.rounds),
           "--singles", str(args.singles), "--k", str(args.k)] + (["--quick"] if args.quick else [])
    try:
        return measure.run_json_child(cmd, one_cpu=cores == "1", timeout_s=args.timeout_s)
    except measure.ChildError as e:
        return {"learner": learner, "memory": memory, "cores": cores, "error": str(e)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--learners", default=",".join(LEARNERS), help="comma-separated (default: %(default)s)")
    p.add_argument("--memory", default=",".join(MEMORY), help="comma-separated from default,retain")
    p.add_argument("--cores", default="1,all", help="comma-separated from 1,all (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default: %(default)s)")
    p.add_argument("--singles", type=int, default=8, help="single-update calls per round")
    p.add_argument("--k", type=int, default=16, help="updates per fused call (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="small shapes, 2 rounds (smoke test)")
    p.add_argument("--out", type=Path, default=None, help="results folder (default: benchmarks/results)")
    p.add_argument("--name", default="single_update", help="results file stem")
    p.add_argument("--timeout-s", type=float, default=1800.0)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--learner", default="omapl", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.singles, args.k = min(args.rounds, 2), min(args.singles, 4), min(args.k, 4)
    for flag, vals, allowed in (("--learners", args.learners, LEARNERS), ("--memory", args.memory, MEMORY),
                                ("--cores", args.cores, ("1", "all"))):
        bad = [v for v in vals.split(",") if v not in allowed]
        if bad:
            p.error(f"{flag}: unknown {', '.join(bad)}; choose from {', '.join(allowed)}")
    if min(args.rounds, args.singles, args.k) < 1:
        p.error("--rounds, --singles and --k must be >= 1")
    return args


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return {}
    t0 = time.perf_counter()
    rows = []
    for cores in args.cores.split(","):
        for learner in args.learners.split(","):
            for memory in args.memory.split(","):
                r = run_child(learner, memory, cores, args)
                rows.append(r)
                if "error" in r:
                    print(f"{learner:9s} {memory:8s} cores={cores:3s} ERROR {r['error'][-300:]}", flush=True)
                    continue
                c = r["calls"]
                print(f"{learner:9s} {memory:8s} cores={cores:3s} fused {c['fused']['update_ms']:8.1f} ms  "
                      f"single {c['single']['update_ms']:8.1f} ms ({c['single']['ratio_to_fused']:.3f}x)  "
                      f"donated {c['single_donated']['update_ms']:8.1f} ms "
                      f"({c['single_donated']['ratio_to_fused']:.3f}x)  faults/upd "
                      f"{c['fused']['faults_per_update']:.0f}/{c['single']['faults_per_update']:.0f}/"
                      f"{c['single_donated']['faults_per_update']:.0f}  load {r['loadavg_end']}", flush=True)
    import jax  # noqa: F401  (machine_info reads the backend)

    payload = {"machine": measure.machine_info(), "versions": measure.library_versions(),
               "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "rows": rows, "wall_s": time.perf_counter() - t0}
    path = measure.write_json(args.name + ("_quick" if args.quick else ""), payload, args.out or RESULTS_DIR)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
