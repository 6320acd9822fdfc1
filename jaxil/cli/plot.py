"""`jaxil plot`: learning curves of run directories."""

from __future__ import annotations

from jaxil.runs.plot import plot_runs

from pathlib import Path


def _plot(args) -> int:
    out = args.out or Path(args.run_dirs[0]) / f"{args.metric}.png"
    fig = plot_runs(args.run_dirs, metric=args.metric, by=args.by, out=out)
    print(f"wrote {out} ({len(fig.axes[0].get_lines())} curve(s))")
    return 0


def register(sub) -> None:
    p = sub.add_parser("plot", help="learning curves of run directories (mean ± 1 std over seeds)")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--metric", default="eval_return",
                   help="a metrics.jsonl key (default eval_return)")
    p.add_argument("--out", default=None, help="figure file (default RUN_DIR/<metric>.png)")
    p.add_argument("--by", choices=("grid", "regime", "dir"), default=None,
                   help="one line per grid point (train/sweep), regime (interactive) or run "
                        "directory; default: each directory's own")
    p.set_defaults(func=_plot)
