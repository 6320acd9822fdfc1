"""Measured fp32 matmul throughput of this machine through JAX (GFLOP/s).

The yardstick for the learner benchmark: what ``jnp.dot`` reaches on a 1024²
square product and on the products a 256-256 local MLP does at the MisoDICE
SMACv1 shapes (``m`` rows = batch × agents; forward, input-gradient and
weight-gradient layouts: :func:`jaxil.runs.measure.mlp_matmul_shapes`).

    python benchmarks/matmul_peak.py                # all threads and 1 thread
    python benchmarks/matmul_peak.py --threads all  # this process only
    python benchmarks/matmul_peak.py --m 5600 --json

A thread count is fixed when XLA starts, so each setting is measured in a
child process (:func:`jaxil.runs.measure.matmul_peak_children`); the 1-thread
one runs with :data:`jaxil.runs.measure.SINGLE_THREAD_XLA_FLAGS` and pinned to
one CPU (the flags alone leave XLA's dot library on every core).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jaxil.runs import measure

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# m = 5600 = 1120 joint transitions × 5 agents (one MisoDICE batch at SMACv1 shapes)
DEFAULT_M = 5600


COLUMNS = [
    ("threads", "threads", "{}"),
    ("shape", "shape", "{}"),
    ("m", "M", "{}"),
    ("k", "K", "{}"),
    ("n", "N", "{}"),
    ("gflops", "GFLOP/s (median)", "{:.1f}"),
    ("gflops_best", "GFLOP/s (best)", "{:.1f}"),
    ("gflops_cpu", "GFLOP/cpu-s", "{:.1f}"),
]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--threads",
        default="both",
        choices=["both", "all", "1", "here"],
        help="'both': child processes with all threads and 1 thread; 'all'/'1': one child; "
        "'here': this process with its XLA_FLAGS as they are",
    )
    p.add_argument("--m", type=int, default=DEFAULT_M, help="rows of the MLP-shaped products (batch × agents)")
    p.add_argument("--json", action="store_true", help="print one JSON line only (no file)")
    args = p.parse_args(argv)

    if args.threads == "here":
        res = measure.matmul_peak(args.m)
        if args.json:
            print(json.dumps(res))
            return
        results = {"here": res}
    else:
        results = measure.matmul_peak_children(args.m, ("all", "1") if args.threads == "both" else (args.threads,))
    table = []
    for th, res in results.items():
        if "error" in res:
            print(f"[{th} threads] failed: {res['error']}", file=sys.stderr)
            continue
        table += [{"threads": th, **r} for r in res["rows"]]
    print(measure.format_table(table, COLUMNS))
    payload = {
        "machine": measure.machine_info(),
        "versions": measure.library_versions(),
        "loadavg_after": measure.loadavg(),
        "results": results,
    }
    print("wrote", measure.write_json("matmul_peak", payload, RESULTS_DIR))


if __name__ == "__main__":
    main()
