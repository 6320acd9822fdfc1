"""Helpers shared by the jaxil benchmarks: machine facts, timing, tables, JSON.

Every benchmark script writes one JSON file,
``benchmarks/results/<name>-<host>-<YYYY-MM-DD>.json``, holding
:func:`machine_info`, :func:`library_versions`, the load average around the
run and its rows, and prints the same rows as a table.

Timing rules (see :func:`time_call`): compile ahead of time so no row pays for
tracing, run the compiled call once as a warm-up, then take the median of
repeats, each ended by ``jax.block_until_ready``. The process CPU time of each
repeat is kept too: on a machine shared with other work the wall clock
includes time spent waiting for a core, the CPU time does not.

``jax`` is imported inside the functions, not at module level, so a script
can set ``XLA_FLAGS`` (thread counts, backends) after importing this module.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent

# XLA:CPU flags that make XLA run every op on the calling thread only.
SINGLE_THREAD_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


# -- machine and library facts ------------------------------------------------


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo``), or ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
        "loadavg": loadavg(),
    }


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def library_versions() -> dict[str, Any]:
    """Versions of the libraries a jaxil benchmark depends on, and the commit."""
    from importlib import metadata

    versions: dict[str, Any] = {}
    for dist in ("jax", "jaxlib", "flax", "optax", "chex", "numpy", "jaxil"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
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
        return _median(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    @property
    def cpu_median_s(self) -> float:
        return _median(self.cpu_times_s)

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


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def time_once(fn: Callable, *args) -> tuple[float, float, Any]:
    """(wall seconds, process CPU seconds, output) of one ``fn(*args)``, waited for."""
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
    """Median-of-repeats timing of ``fn(*args)`` (compile ``fn`` beforehand).

    ``warmup`` untimed calls come first (the first one's time is kept as
    ``warmup_s``). With ``target_s``, the number of repeats adapts to the
    warm-up time: about ``target_s`` seconds of repeats, at least
    ``min_repeats`` and at most ``repeats``; slow calls thus get few repeats.
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
    """``jax.jit(fn).lower(*args).compile()`` and the seconds it took
    (tracing + lowering + XLA compilation)."""
    import jax

    t0 = time.perf_counter()
    compiled = jax.jit(fn, static_argnums=tuple(static_argnums)).lower(*args).compile()
    return compiled, time.perf_counter() - t0


def xla_cost(compiled) -> dict[str, float]:
    """XLA's cost analysis of a compiled call (``flops``, ``bytes accessed``...).

    Note: XLA's HLO cost analysis counts the body of a ``while`` loop (what a
    ``lax.scan`` becomes) once, whatever its trip count; see
    :func:`xla_loop_flops_multiplier`.
    """
    ca = compiled.cost_analysis()
    if isinstance(ca, (list, tuple)):  # older jax: one dict per computation
        ca = ca[0] if ca else {}
    return {k: float(v) for k, v in (ca or {}).items() if isinstance(v, (int, float))}


def xla_loop_flops_multiplier() -> float:
    """How many times XLA's cost analysis counts a scanned body per trip.

    Compiles a ``lax.scan`` of a 64×64 matmul with 1 and 8 trips: returns
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


# -- output ---------------------------------------------------------------------


def results_path(name: str, out_dir: Optional[Path] = None) -> Path:
    """``<out_dir>/<name>-<host>-<YYYY-MM-DD>.json`` (default: benchmarks/results)."""
    out_dir = Path(out_dir) if out_dir is not None else RESULTS_DIR
    host = socket.gethostname() or "host"  # as benchmarks/env_throughput.py names its files
    date = _dt.date.today().isoformat()
    return out_dir / f"{name}-{host}-{date}.json"


def write_json(name: str, payload: dict[str, Any], out_dir: Optional[Path] = None) -> Path:
    """Write ``payload`` (plus a ``created`` timestamp) and return the path."""
    path = results_path(name, out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "created": _dt.datetime.now().isoformat(timespec="seconds"), **payload}
    with open(path, "w") as f:
        json.dump(payload, f, indent=1, default=_json_default)
        f.write("\n")
    return path


def _json_default(x):
    try:
        import numpy as np

        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, np.ndarray):
            return x.tolist()
    except ImportError:  # pragma: no cover
        pass
    if dataclasses.is_dataclass(x):
        return dataclasses.asdict(x)
    return str(x)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """A plain-text table; ``columns`` are ``(key, header, format)`` triples
    (format like ``"{:.1f}"``; a missing value prints as ``-``)."""
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        line = []
        for key, _, fmt in columns:
            v = r.get(key)
            line.append("-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v))
        cells.append(line)
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    out = []
    for j, c in enumerate(cells):
        out.append("  ".join(s.rjust(w) for s, w in zip(c, widths)))
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def si(x: float, unit: str = "") -> str:
    """``12345 -> '12.3k'`` for table cells."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{prefix}{unit}"
    return f"{x:.3g}{unit}"
