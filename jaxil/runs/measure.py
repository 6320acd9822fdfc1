"""Measuring compiled JAX programs: timings, machine facts, XLA's cost and
memory analyses, the machine's matmul rate, tables and JSON results.

Timing ([`time_call`][jaxil.runs.measure.time_call]): compile ahead of time
([`compile_ahead`][jaxil.runs.measure.compile_ahead]) so no repeat pays for
tracing, run the compiled call once as a warm-up, then take the median of
repeats, each ended by `jax.block_until_ready`. The process CPU time of each
repeat is kept too: on a machine shared with other work the wall clock includes
time spent waiting for a core, the CPU time does not.

Results: [`write_json`][jaxil.runs.measure.write_json] writes one JSON file per
run, `<out_dir>/<name>-<host>-<YYYY-MM-DD>.json`, by convention holding
[`machine_info`][jaxil.runs.measure.machine_info],
[`library_versions`][jaxil.runs.measure.library_versions], the load average
around the run ([`loadavg`][jaxil.runs.measure.loadavg]) and its rows;
[`format_table`][jaxil.runs.measure.format_table] prints the same rows as a
fixed-width table.

Memory: [`xla_memory`][jaxil.runs.measure.xla_memory] (a compiled call's output
and temporary buffers),
[`free_memory_bytes`][jaxil.runs.measure.free_memory_bytes] and
[`memory_shortfall`][jaxil.runs.measure.memory_shortfall] decide whether a size
fits before it runs; [`is_oom`][jaxil.runs.measure.is_oom] recognises the
out-of-memory errors of one that did not.

Yardsticks, to set a program's achieved GFLOP/s against:
[`matmul_rates`][jaxil.runs.measure.matmul_rates] (`jnp.dot` per product shape,
[`mlp_matmul_shapes`][jaxil.runs.measure.mlp_matmul_shapes] for those of an
MLP), [`PeakProbe`][jaxil.runs.measure.PeakProbe] (a 1024² product to time in
between other measurements) and
[`matmul_peak_children`][jaxil.runs.measure.matmul_peak_children] (the rates
with one thread and with all, each in a child process:
[`run_json_child`][jaxil.runs.measure.run_json_child]).

`jax` and `numpy` are imported inside the functions, not at module level,
so a process can still set `XLA_FLAGS` or its allocator
([`jaxil.runs.hostmem.retain`][jaxil.runs.hostmem.retain]) after importing this module.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from jaxil.runs.rundir import installed_versions

# XLA:CPU flags that make XLA run every op on the calling thread only.
SINGLE_THREAD_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

#: The share of the free memory a call's buffers may take (`memory_shortfall`).
MEMORY_HEADROOM = 0.8


# -- machine and library facts ------------------------------------------------


def cpu_model() -> str:
    """The CPU's marketing name (`/proc/cpuinfo`), or `platform.processor()`."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: Vector instruction sets, widest first, by the `/proc/cpuinfo` flag that names
#: each (x86 and Arm).
VECTOR_ISAS = ("avx512f", "avx2", "avx", "sse4_2", "sve2", "sve", "asimd", "neon")


def vector_isa(cpu_flags: Optional[str] = None) -> Optional[str]:
    """The widest vector instruction set in `cpu_flags` (the `flags` or
    `Features` line of `/proc/cpuinfo`; read from there when None), one of
    `VECTOR_ISAS`, or None when none is listed or the file is unreadable."""
    if cpu_flags is None:
        cpu_flags = ""
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.lower().startswith(("flags", "features")):
                        cpu_flags = line.split(":", 1)[1]
                        break
        except OSError:
            return None
    have = set(cpu_flags.lower().split())
    return next((isa for isa in VECTOR_ISAS if isa in have), None)


def compute_target() -> str:
    """What XLA compiles this process's programs for, in one line.

    On the CPU, XLA generates code for the host's own instruction set (capped
    by `--xla_cpu_max_isa` in `XLA_FLAGS`), and a wider vector set can change
    the last bits of floating-point results. So two machines with the same
    packages can compute different numbers, which chaotic dynamics (a
    MuJoCo robot's contacts) amplify within an episode. The line names the
    CPU model, its widest vector set and any cap, as
    `"cpu: <model> (avx512f, capped at AVX2)"`; on an accelerator, its
    platform and device kind, as `"gpu: <device kind>"`.
    """
    import jax

    dev = jax.devices()[0]
    if dev.platform != "cpu":
        return f"{dev.platform}: {dev.device_kind}"
    isa = vector_isa() or platform.machine()
    cap = re.search(r"--xla_cpu_max_isa=(\S+)", os.environ.get("XLA_FLAGS", ""))
    return f"cpu: {cpu_model()} ({isa}{', capped at ' + cap.group(1) if cap else ''})"


def loadavg() -> Optional[list[float]]:
    """1/5/15-minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def machine_info() -> dict[str, Any]:
    """Host, CPU, usable cores, JAX devices and the XLA flags in force."""
    import jax

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "compute_target": compute_target(),
        "loadavg": loadavg(),
    }


def _git(*args: str) -> Optional[str]:
    """`git <args>` in the checkout jaxil runs from (None outside one)."""
    try:
        out = subprocess.run(
            ["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True, text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def library_versions() -> dict[str, Any]:
    """Versions of the libraries jaxil's measurements depend on, and the
    commit of the checkout jaxil runs from (None when installed from a wheel)."""
    versions: dict[str, Any] = installed_versions(
        ("jax", "jaxlib", "flax", "optax", "chex", "numpy", "jaxil"))
    commit = _git("rev-parse", "--short", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    versions["jaxil_commit"] = commit
    versions["jaxil_dirty"] = bool(status) if status is not None else None
    return versions


# -- timing -------------------------------------------------------------------


@dataclasses.dataclass
class Timing:
    """Wall-clock and process-CPU seconds of the timed repeats of one call."""

    times_s: list[float]
    cpu_times_s: list[float]
    warmup_s: Optional[float]

    @property
    def median_s(self) -> float:
        return median(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    @property
    def cpu_median_s(self) -> float:
        return median(self.cpu_times_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "median_s": self.median_s,
            "min_s": self.min_s,
            "max_s": max(self.times_s),
            "cpu_median_s": self.cpu_median_s,
            "repeats": len(self.times_s),
            "warmup_s": self.warmup_s,
            "times_s": [round(t, 6) for t in self.times_s],
        }


def median(xs: Sequence[float]) -> float:
    """The median of `xs` (the mean of the middle two for an even count)."""
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def time_once(fn: Callable, *args) -> tuple[float, float, Any]:
    """(wall seconds, process CPU seconds, output) of one `fn(*args)`, waited for."""
    import jax

    t0, c0 = time.perf_counter(), time.process_time()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0, time.process_time() - c0, out


def time_call(
    fn: Callable,
    *args,
    warmup: int = 1,
    repeats: int = 5,
    min_repeats: int = 2,
    target_s: Optional[float] = None,
) -> Timing:
    """Median-of-repeats timing of `fn(*args)` (compile `fn` beforehand).

    `warmup` untimed calls come first (the first one's time is kept as
    `warmup_s`). With `target_s`, the number of repeats adapts to the
    warm-up time: about `target_s` seconds of repeats, at least
    `min_repeats` and at most `repeats`; slow calls thus get few repeats.
    """
    warm = None
    for i in range(warmup):
        t, _, _ = time_once(fn, *args)
        if i == 0:
            warm = t
    n = repeats
    if target_s is not None and warm is not None:
        n = int(min(repeats, max(min_repeats, math.floor(target_s / max(warm, 1e-9)))))
    walls, cpus = [], []
    for _ in range(max(n, 1)):
        w, c, _ = time_once(fn, *args)
        walls.append(w)
        cpus.append(c)
    return Timing(walls, cpus, warm)


def compile_ahead(fn: Callable, *args, static_argnums: Sequence[int] = ()) -> tuple[Any, float]:
    """`jax.jit(fn).lower(*args).compile()` and the seconds it took
    (tracing + lowering + XLA compilation)."""
    import jax

    t0 = time.perf_counter()
    compiled = jax.jit(fn, static_argnums=tuple(static_argnums)).lower(*args).compile()
    return compiled, time.perf_counter() - t0


# -- XLA's analyses of a compiled call --------------------------------------------


def xla_cost(compiled) -> dict[str, float]:
    """XLA's cost analysis of a compiled call (`flops`, `bytes accessed`...).

    Note: XLA's HLO cost analysis counts the body of a `while` loop (what a
    `lax.scan` becomes) once, whatever its trip count; see
    [`xla_loop_flops_multiplier`][jaxil.runs.measure.xla_loop_flops_multiplier].
    """
    ca = compiled.cost_analysis()
    if isinstance(ca, (list, tuple)):  # older jax: one dict per computation
        ca = ca[0] if ca else {}
    return {k: float(v) for k, v in (ca or {}).items() if isinstance(v, (int, float))}


def xla_loop_flops_multiplier() -> float:
    """How many times XLA's cost analysis counts a scanned body per trip.

    Compiles a `lax.scan` of a 64×64 matmul with 1 and 8 trips: returns
    ~1/8 if the body is counted once (then total flops = reported × trips),
    ~1 if the trip count is honoured.
    """
    import jax
    import jax.numpy as jnp

    def scanned(x, k):
        return jax.lax.scan(lambda c, _: (c @ x, None), x, None, length=k)[0]

    x = jnp.ones((64, 64), jnp.float32)
    f1 = xla_cost(jax.jit(scanned, static_argnums=1).lower(x, 1).compile()).get("flops", 0.0)
    f8 = xla_cost(jax.jit(scanned, static_argnums=1).lower(x, 8).compile()).get("flops", 0.0)
    return (f8 / f1) / 8.0 if f1 > 0 else float("nan")


def xla_memory(compiled) -> dict[str, Optional[int]]:
    """XLA's memory analysis of a compiled call: `xla_output_bytes` and
    `xla_temp_bytes` (None where the backend gives none)."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001
        m = None
    get = lambda k: int(getattr(m, k)) if m is not None and hasattr(m, k) else None  # noqa: E731
    return {"xla_output_bytes": get("output_size_in_bytes"), "xla_temp_bytes": get("temp_size_in_bytes")}


# -- memory ---------------------------------------------------------------------------


def free_memory_bytes() -> Optional[int]:
    """Free memory of the default device (host `MemAvailable` on CPU)."""
    import jax

    dev = jax.devices()[0]
    try:
        stats = dev.memory_stats()
    except Exception:  # noqa: BLE001 - not every backend has them
        stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_shortfall(mem: dict[str, Optional[int]], headroom: float = MEMORY_HEADROOM) -> Optional[str]:
    """Why a call whose buffers are `mem`
    ([`xla_memory`][jaxil.runs.measure.xla_memory]) would not fit:
    `"needs ~X GiB (XLA output + temp), Y GiB free"` when they exceed
    `headroom` × [`free_memory_bytes`][jaxil.runs.measure.free_memory_bytes];
    None when they fit or the free memory is unknown."""
    need = (mem["xla_output_bytes"] or 0) + (mem["xla_temp_bytes"] or 0)
    free = free_memory_bytes()
    if free is not None and need > headroom * free:
        return f"needs ~{need / 2**30:.1f} GiB (XLA output + temp), {free / 2**30:.1f} GiB free"
    return None


def is_oom(e: BaseException) -> bool:
    """Whether `e` is an out-of-memory error (host or device)."""
    if isinstance(e, MemoryError):
        return True
    s = str(e).lower()
    return any(k in s for k in ("resource_exhausted", "out of memory", "failed to allocate"))


# -- child processes ------------------------------------------------------------------


class ChildError(RuntimeError):
    """A child process of [`run_json_child`][jaxil.runs.measure.run_json_child]
    timed out or failed (the message is the reason: the timeout, or the end of
    its stderr)."""


def run_json_child(
    cmd: Sequence[str],
    one_cpu: bool = False,
    timeout_s: float = 300.0,
    env: Optional[dict[str, str]] = None,
) -> Any:
    """Run `cmd` in a child process and return the JSON of the last line it
    prints; raises [`ChildError`][jaxil.runs.measure.ChildError] when it times
    out or fails.

    The child inherits this process's environment, with `env` set on top.
    A thread count is fixed when XLA starts, so measurements on one core run in
    a child: `one_cpu` adds `SINGLE_THREAD_XLA_FLAGS` to its
    `XLA_FLAGS` and pins it to one CPU (the flags alone leave XLA's dot
    library on every core)."""
    env = dict(os.environ, **(env or {}))
    pin = None
    if one_cpu:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + SINGLE_THREAD_XLA_FLAGS).strip()
        cpu = min(os.sched_getaffinity(0))
        pin = lambda: os.sched_setaffinity(0, {cpu})  # noqa: E731
    try:
        out = subprocess.run(list(cmd), env=env, capture_output=True, text=True, timeout=timeout_s,
                             preexec_fn=pin)
    except subprocess.TimeoutExpired:
        raise ChildError(f"timed out after {timeout_s:.0f} s") from None
    if out.returncode != 0:
        raise ChildError(out.stderr.strip()[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- matmul yardsticks ----------------------------------------------------------------


def mlp_matmul_shapes(m: int, obs_in: int = 129, hidden: int = 256) -> dict[str, tuple[int, int, int]]:
    """`name -> (M, K, N)` of `[M, K] @ [K, N]` products to measure: a
    1024² square and those of a `hidden`-`hidden` MLP on `m` rows of
    `obs_in` inputs (forward, input-gradient and weight-gradient layouts,
    and the doubled batch of a gradient penalty)."""
    return {
        "square_1024": (1024, 1024, 1024),
        "mlp_in_fwd": (m, obs_in, hidden),  # obs ⊕ agent id -> hidden
        "mlp_hidden_fwd": (m, hidden, hidden),  # hidden -> hidden (also its input gradient)
        "mlp_hidden_wgrad": (hidden, m, hidden),  # weight gradient: contracts the batch
        "mlp_hidden_fwd_2m": (2 * m, hidden, hidden),  # gradient-penalty batch (2 × union)
    }


def matmul_rates(
    shapes: dict[str, tuple[int, int, int]],
    repeats: int = 7,
    target_s: float = 1.0,
) -> list[dict[str, Any]]:
    """Median GFLOP/s of fp32 `jnp.dot` per shape in this process.

    `gflops` uses the median wall time; `gflops_best` the fastest repeat;
    `gflops_cpu` the median process CPU time (per core-second when the
    process runs on one thread; under contention it is the less disturbed
    figure)."""
    import jax
    import jax.numpy as jnp

    rows = []
    for i, (name, (m, k, n)) in enumerate(shapes.items()):
        ka, kb = jax.random.split(jax.random.PRNGKey(i))
        a = jax.random.normal(ka, (m, k), jnp.float32)
        b = jax.random.normal(kb, (k, n), jnp.float32)
        f, _ = compile_ahead(jnp.dot, a, b)
        t = time_call(f, a, b, warmup=2, repeats=repeats, min_repeats=5, target_s=target_s)
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


def summarize_matmul(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """`square_1024`, the best and the median MLP shape and the best of all
    (GFLOP/s) of [`matmul_rates`][jaxil.runs.measure.matmul_rates]' rows."""
    by = {r["shape"]: r["gflops"] for r in rows}
    mlp = [v for k, v in by.items() if k.startswith("mlp")]
    return {
        "square_1024_gflops": by.get("square_1024"),
        "mlp_best_gflops": max(mlp) if mlp else None,
        "mlp_median_gflops": median(mlp) if mlp else None,
        "peak_gflops": max(by.values()) if by else None,
    }


def matmul_peak(m: int) -> dict[str, Any]:
    """[`matmul_rates`][jaxil.runs.measure.matmul_rates] of
    [`mlp_matmul_shapes`][jaxil.runs.measure.mlp_matmul_shapes] at `m` rows in
    this process: `{rows, summary, xla_flags}`."""
    rows = matmul_rates(mlp_matmul_shapes(m))
    return {"rows": rows, "summary": summarize_matmul(rows), "xla_flags": os.environ.get("XLA_FLAGS", "")}


_MATMUL_PEAK_CHILD = "import json; from jaxil.runs import measure; print(json.dumps(measure.matmul_peak({m})))"


def matmul_peak_children(
    m: int, threads: Sequence[str] = ("all", "1"), timeout_s: float = 300.0
) -> dict[str, dict[str, Any]]:
    """[`matmul_peak`][jaxil.runs.measure.matmul_peak] in a child process per
    thread setting (`"all"`: XLA's threads as the environment sets them; `"1"`:
    one thread pinned to one CPU,
    [`run_json_child`][jaxil.runs.measure.run_json_child]):
    `{threads: {rows, summary, xla_flags}}`, or `{threads: {"error":
    ...}}` for a child that failed."""
    results: dict[str, dict[str, Any]] = {}
    for th in threads:
        cmd = [sys.executable, "-c", _MATMUL_PEAK_CHILD.format(m=int(m))]
        try:
            results[th] = run_json_child(cmd, one_cpu=th == "1", timeout_s=timeout_s)
        except ChildError as e:
            results[th] = {"error": str(e)}
    return results


class PeakProbe:
    """A compiled 1024² `jnp.dot` to time in between other measurements, so a
    throughput can be set against the matmul rate of the same moment."""

    FLOPS = 2.0 * 1024**3

    def __init__(self):
        import jax
        import jax.numpy as jnp

        self.a = jax.random.normal(jax.random.PRNGKey(0), (1024, 1024), jnp.float32)
        self.f, _ = compile_ahead(jnp.dot, self.a, self.a)
        time_once(self.f, self.a, self.a)

    def __call__(self, repeats: int = 5) -> float:
        """Median GFLOP/s over `repeats` calls."""
        t = time_call(self.f, self.a, self.a, warmup=0, repeats=repeats)
        return self.FLOPS / t.median_s / 1e9


# -- output ---------------------------------------------------------------------


def results_path(name: str, out_dir: Union[str, os.PathLike]) -> Path:
    """`<out_dir>/<name>-<host>-<YYYY-MM-DD>.json`."""
    host = socket.gethostname() or "host"
    date = _dt.date.today().isoformat()
    return Path(out_dir) / f"{name}-{host}-{date}.json"


def write_json(
    name: str,
    payload: dict[str, Any],
    out_dir: Optional[Union[str, os.PathLike]] = None,
    path: Optional[Union[str, os.PathLike]] = None,
) -> Path:
    """Write `{"benchmark": name, "created": <timestamp>,
    **payload}` to `path`, or to
    [`results_path`][jaxil.runs.measure.results_path] under `out_dir`; returns
    the path."""
    if path is None:
        if out_dir is None:
            raise ValueError("write_json needs out_dir or path")
        path = results_path(name, out_dir)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "created": _dt.datetime.now().isoformat(timespec="seconds"), **payload}
    with open(path, "w") as f:
        json.dump(payload, f, indent=1, default=_json_default)
        f.write("\n")
    return path


def _json_default(x):
    import numpy as np

    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if dataclasses.is_dataclass(x):
        return dataclasses.asdict(x)
    return str(x)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple]) -> str:
    """A plain-text table: a header, a rule, one line per row.

    The one table printer of the library: the benchmarks' tables and the
    results tables of `jaxil train`, `interactive`, `lm` (each program's
    `format_table` picks its columns).

    Args:
      rows: one dict per line.
      columns: `(key, header, format)` or `(key, header, format, align)`
        tuples. `key` names a row field, or is a tuple of fields formatted
        together (`format` gets one positional argument per field, e.g.
        `(("return_mean", "return_std"), "return", "{:.3f} ± {:.3f}")`).
        A missing or NaN value prints as `-`. `align` is `">"` (the
        default: numbers) or `"<"` (text).

    Returns:
      The table; each column as wide as its widest cell, two spaces apart.
    """
    def missing(v):
        return v is None or (isinstance(v, float) and math.isnan(v))

    def cell(r, key, fmt):
        if isinstance(key, tuple):
            vs = [r.get(k) for k in key]
            return "-" if any(missing(v) for v in vs) else fmt.format(*vs)
        v = r.get(key)
        return "-" if missing(v) else fmt.format(v)

    for c in columns:
        if len(c) not in (3, 4) or (len(c) == 4 and c[3] not in ("<", ">")):
            raise ValueError(f"a column is (key, header, format[, '<' or '>']), got {c!r}")
    cells = [[c[1] for c in columns]]
    cells += [[cell(r, c[0], c[2]) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    left = [len(c) == 4 and c[3] == "<" for c in columns]
    out = []
    for j, line in enumerate(cells):
        out.append("  ".join(s.ljust(w) if lf else s.rjust(w)
                             for s, w, lf in zip(line, widths, left)).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def si(x: float, unit: str = "") -> str:
    """`12345 -> '12.3k'` for table cells."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{prefix}{unit}"
    return f"{x:.3g}{unit}"
