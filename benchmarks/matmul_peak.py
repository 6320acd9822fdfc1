"""Measured fp32 matmul throughput of this machine through JAX (GFLOP/s).

The yardstick for the learner benchmark: what ``jnp.dot`` reaches on a 1024²
square product and on the products a 256-256 local MLP does at the MisoDICE
SMACv1 shapes (``m`` rows = batch × agents; forward, input-gradient and
weight-gradient layouts).

    python benchmarks/matmul_peak.py                # all threads and 1 thread
    python benchmarks/matmul_peak.py --threads all  # this process only
    python benchmarks/matmul_peak.py --m 5600 --json

A thread count is fixed when XLA starts, so the 1-thread figure comes from a
child process started with :data:`common.SINGLE_THREAD_XLA_FLAGS` and pinned
to one CPU (:func:`peak_in_subprocess`; the flags alone leave XLA's dot
library on every core).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402

# m = 5600 = 1120 joint transitions × 5 agents (one MisoDICE batch at SMACv1 shapes)
DEFAULT_M = 5600


def matmul_shapes(m: int = DEFAULT_M, obs_in: int = 129, hidden: int = 256) -> dict[str, tuple[int, int, int]]:
    """``name -> (M, K, N)`` of ``[M, K] @ [K, N]`` products to measure."""
    return {
        "square_1024": (1024, 1024, 1024),
        "mlp_in_fwd": (m, obs_in, hidden),  # obs ⊕ agent id -> hidden
        "mlp_hidden_fwd": (m, hidden, hidden),  # hidden -> hidden (also its input gradient)
        "mlp_hidden_wgrad": (hidden, m, hidden),  # weight gradient: contracts the batch
        "mlp_hidden_fwd_2m": (2 * m, hidden, hidden),  # gradient-penalty batch (2 × union)
    }


def measure(
    shapes: Optional[dict[str, tuple[int, int, int]]] = None,
    repeats: int = 7,
    target_s: float = 1.0,
) -> list[dict[str, Any]]:
    """Median GFLOP/s of ``jnp.dot`` per shape in this process.

    ``gflops`` uses the median wall time; ``gflops_best`` the fastest repeat;
    ``gflops_cpu`` the median process CPU time (per core-second when the
    process runs on one thread; under contention it is the less disturbed
    figure)."""
    import jax
    import jax.numpy as jnp

    shapes = matmul_shapes() if shapes is None else shapes
    rows = []
    for i, (name, (m, k, n)) in enumerate(shapes.items()):
        ka, kb = jax.random.split(jax.random.PRNGKey(i))
        a = jax.random.normal(ka, (m, k), jnp.float32)
        b = jax.random.normal(kb, (k, n), jnp.float32)
        f, _ = common.compile_ahead(jnp.dot, a, b)
        t = common.time_call(f, a, b, warmup=2, repeats=repeats, min_repeats=5, target_s=target_s)
        flops = 2.0 * m * k * n
        rows.append(
            {
                "shape": name,
                "m": m,
                "k": k,
                "n": n,
                "gflops": flops / t.median_s / 1e9,
                "gflops_best": flops / t.min_s / 1e9,
                "gflops_cpu": flops / max(t.cpu_median_s, 1e-12) / 1e9,
                **{f"time_{key}": v for key, v in t.to_dict().items() if key in ("median_s", "min_s", "repeats")},
            }
        )
    return rows


class PeakProbe:
    """A compiled 1024² ``jnp.dot`` to time in between other measurements, so a
    throughput can be set against the matmul rate of the same moment."""

    FLOPS = 2.0 * 1024**3

    def __init__(self):
        import jax
        import jax.numpy as jnp

        self.a = jax.random.normal(jax.random.PRNGKey(0), (1024, 1024), jnp.float32)
        self.f, _ = common.compile_ahead(jnp.dot, self.a, self.a)
        common.time_once(self.f, self.a, self.a)

    def __call__(self, repeats: int = 5) -> float:
        """Median GFLOP/s over ``repeats`` calls."""
        t = common.time_call(self.f, self.a, self.a, warmup=0, repeats=repeats)
        return self.FLOPS / t.median_s / 1e9


def mlp_step(rows: int, in_dim: int = 129, hidden: tuple[int, ...] = (256, 256), k: int = 16, seed: int = 0):
    """A compiled call of ``k`` plain gradient steps of one :class:`jaxil.nn.nets.MLP`
    (``in_dim -> hidden -> 1``, squared-output loss, SGD) on a ``[rows, in_dim]``
    batch, fused in a ``lax.scan`` like ``update_n``: the most a learner made
    of such networks can get from XLA's dots, element-wise ops and layout
    copies on this machine. Returns ``(compiled, args, flops_per_call)``."""
    import jax
    import jax.numpy as jnp

    from jaxil.nn.nets import MLP

    net = MLP(1, tuple(hidden))
    kx, kp = jax.random.split(jax.random.PRNGKey(seed))
    x = jax.random.normal(kx, (rows, in_dim), jnp.float32)
    params = net.init(kp, x)

    def loss(p, x):
        return jnp.mean(net.apply(p, x) ** 2)

    def call(params, x):
        def body(p, _):
            g = jax.grad(loss)(p, x)
            return jax.tree.map(lambda w, d: w - 1e-3 * d, p, g), None

        return jax.lax.scan(body, params, None, length=k)[0]

    compiled, _ = common.compile_ahead(call, params, x)
    flops = common.xla_cost(compiled).get("flops")
    if flops is not None and common.xla_loop_flops_multiplier() < 0.5:
        flops *= k  # this XLA counts a while body once
    return compiled, (params, x), flops


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``square_1024``, the best MLP shape and the best of all (GFLOP/s)."""
    by = {r["shape"]: r["gflops"] for r in rows}
    mlp = [v for k, v in by.items() if k.startswith("mlp")]
    return {
        "square_1024_gflops": by.get("square_1024"),
        "mlp_best_gflops": max(mlp) if mlp else None,
        "mlp_median_gflops": common._median(mlp) if mlp else None,
        "peak_gflops": max(by.values()) if by else None,
    }


def peak_in_subprocess(threads: str = "1", m: int = DEFAULT_M, timeout_s: float = 300.0) -> dict[str, Any]:
    """Run this script in a child process (``threads``: ``"1"`` or ``"all"``)
    and return its JSON (``rows``, ``summary``), or ``{"error": ...}``."""
    env = dict(os.environ)
    pin = None
    if threads == "1":
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + common.SINGLE_THREAD_XLA_FLAGS).strip()
        # The flags alone do not stop XLA's dot library from using every core:
        # pin the child to one CPU as well.
        cpu = min(os.sched_getaffinity(0))
        pin = lambda: os.sched_setaffinity(0, {cpu})  # noqa: E731
    cmd = [sys.executable, str(Path(__file__).resolve()), "--threads", "here", "--m", str(m), "--json"]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s, preexec_fn=pin)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    if out.returncode != 0:
        return {"error": out.stderr.strip()[-2000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


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


def run(threads: Sequence[str] = ("all", "1"), m: int = DEFAULT_M) -> dict[str, Any]:
    """Measure for each thread setting, each in its own child process."""
    results = {}
    for th in threads:
        results[th] = peak_in_subprocess(th, m)
    return results


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
        rows = measure(matmul_shapes(args.m))
        res = {"rows": rows, "summary": summarize(rows), "xla_flags": os.environ.get("XLA_FLAGS", "")}
        if args.json:
            print(json.dumps(res))
            return
        results = {"here": res}
    else:
        results = run(("all", "1") if args.threads == "both" else (args.threads,), args.m)
    table = []
    for th, res in results.items():
        if "error" in res:
            print(f"[{th} threads] failed: {res['error']}", file=sys.stderr)
            continue
        table += [{"threads": th, **r} for r in res["rows"]]
    print(common.format_table(table, COLUMNS))
    payload = {
        "machine": common.machine_info(),
        "versions": common.library_versions(),
        "loadavg_after": common.loadavg(),
        "results": results,
    }
    print("wrote", common.write_json("matmul_peak", payload))


if __name__ == "__main__":
    main()
