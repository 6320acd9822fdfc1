"""Learning curves of run directories.

One line per grid point (`jaxil train` / `sweep`), regime
(`jaxil interactive`) or directory (`--by dir`): the mean over seeds of a
`metrics.jsonl` metric at each evaluation, with a band of ±1 standard
deviation over seeds (population std, as `results.json`'s
`return_std`; none for one seed). x is the `update` or `round`.

CLI: `jaxil plot RUN_DIR [RUN_DIR ...] [--metric eval_return] [--out FIG.png]`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from jaxil.runs.export import algorithm_name, check_metric, group_rows, load_run


def curves(run_dirs: Sequence[Union[str, Path]], metric: str = "eval_return",
           by: Optional[str] = None) -> list[dict]:
    """`[{label, x [T], mean [T], std [T], seeds}]`, one per line of
    [`plot_runs`][jaxil.runs.plot.plot_runs]; at each x, over the seeds that
    recorded `metric`."""
    runs = [load_run(p) for p in run_dirs]
    lines = []
    for run in runs:
        check_metric(run, metric)
        for label, seeds in group_rows(run, by).items():
            at: dict[int, list[float]] = {}
            for rows in seeds.values():
                for r in rows:
                    if metric in r:
                        v = r[metric]
                        at.setdefault(int(r[run.x]), []).append(
                            float(np.mean(v)) if isinstance(v, list) else float(v))
            if not at:
                continue
            xs = sorted(at)
            name = run.path.name if by == "dir" else algorithm_name(run, label)
            lines.append(dict(label=name, dir=run.path, x=np.array(xs), x_key=run.x,
                              mean=np.array([np.mean(at[x]) for x in xs]),
                              std=np.array([np.std(at[x]) for x in xs]),
                              seeds=max(len(v) for v in at.values())))
    names = [ln["label"] for ln in lines]
    for ln in lines:  # the same name from two directories: say which is which
        if names.count(ln["label"]) > 1:
            ln["label"] = f"{ln['dir'].name}: {ln['label']}"
    return lines


def plot_runs(run_dirs: Sequence[Union[str, Path]], metric: str = "eval_return",
              by: Optional[str] = None, out: Optional[Union[str, Path]] = None) -> Figure:
    """Learning curves of `metric`: mean over seeds ± 1 std, one line per
    grid point / regime (`by=None`), or per directory (`by="dir"`).

    Args:
      run_dirs: run directories of `jaxil train`/`sweep`/`interactive`.
      metric: a `metrics.jsonl` key (`eval_return`, `eval_win_rate`, a
        training loss, ...).
      by: None (each directory's own grouping), `"grid"`, `"regime"` or
        `"dir"`; see [`jaxil.runs.export.group_rows`][jaxil.runs.export.group_rows].
      out: write the figure there (PNG by suffix) when given.

    Returns:
      The figure (Agg canvas; no pyplot state): `fig.axes[0].get_lines()`
      holds one line per curve, the bands are its collections.

    Raises:
      FileNotFoundError / ValueError: a directory without metrics, an empty
        file, an unknown metric (the available ones are listed).
    """
    lines = curves(run_dirs, metric, by)
    # the legend goes beside the axes, in columns of at most 20 entries
    ncol = -(-len(lines) // 20)
    fig = Figure(figsize=(7 + 2.6 * ncol, max(4.5, 0.22 * min(len(lines), 20))),
                 layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, ln in enumerate(lines):
        # past the 10 colours of the cycle, the line style tells lines apart
        (h,) = ax.plot(ln["x"], ln["mean"], marker="o", markersize=3,
                       linestyle=("-", "--", ":", "-.")[(i // 10) % 4],
                       label=f"{ln['label']} ({ln['seeds']} seed{'s' * (ln['seeds'] != 1)})")
        if ln["seeds"] > 1:
            ax.fill_between(ln["x"], ln["mean"] - ln["std"], ln["mean"] + ln["std"],
                            color=h.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel(" / ".join(dict.fromkeys(ln["x_key"] for ln in lines)))
    ax.set_ylabel(metric)
    ax.set_title(f"{metric}: mean ± 1 std over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=ncol,
              frameon=False)
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=120)
    return fig


