"""The results table of every program: evaluation rows grouped and summarised.

A program's metrics rows (`metrics.jsonl`, one per evaluation and run) carry a
step field (`update`, `round` or `chunk`), the run's ids and `eval_return` /
`eval_win_rate`. [`summarize_step`][jaxil.runs.summary.summarize_step] groups
the rows of one step (the last by default) by a key (the grid point, the
regime, or nothing) and gives each group's mean ± population std over its runs;
[format_table][jaxil.runs.measure.format_table] prints such groups as a table
([mean_std][jaxil.runs.summary.mean_std] gives the column of a group's `return`
or `win`). Both serve `jaxil train`/`sweep`, `jaxil interactive` and the
adversarial programs, so their `results.json` and tables read alike.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np


def mean_std(field: str, header: str, fmt: str = "{:.3f} ± {:.3f}") -> tuple:
    """The [format_table][jaxil.runs.measure.format_table] column
    `(key, header, format)` of a group's `<field>_mean ± <field>_std`
    (`field`: `return` or `win` of a
    [summarize_step][jaxil.runs.summary.summarize_step] group)."""
    return ((f"{field}_mean", f"{field}_std"), header, fmt)


def summarize_step(rows: Sequence[dict], step_key: str, *, group: Callable[[dict], str],
                   group_name: str, order: Sequence[str] = (),
                   means: Sequence[str] = (), step: Optional[int] = None,
                   pick: Callable = max) -> tuple[Optional[int], list[dict]]:
    """`(step, groups)`: the rows at `step` (default: `pick` over the
    rows' steps, i.e. the last) grouped by `group(row)`; each group is
    `{group_name: label, seeds, return_mean, return_std, win_mean, win_std,
    <m>_mean for m in means, returns}`. Groups come in `order` (labels
    not seen there follow in row order). No rows: `(None, [])`."""
    if not rows:
        return None, []
    if step is None:
        step = pick(r[step_key] for r in rows)
    at = [r for r in rows if r[step_key] == step]
    by: dict[str, list[dict]] = {label: [] for label in order}
    for r in sorted(at, key=lambda r: r.get("run", 0)):
        by.setdefault(group(r), []).append(r)
    table = []
    for label, rs in by.items():
        if not rs:
            continue
        ret = np.array([x["eval_return"] for x in rs], np.float64)
        win = np.array([x["eval_win_rate"] for x in rs], np.float64)
        entry = {group_name: label, "seeds": len(rs), "return_mean": float(ret.mean()),
                 "return_std": float(ret.std()), "win_mean": float(win.mean()),
                 "win_std": float(win.std())}
        for m in means:
            entry[f"{m}_mean"] = float(np.mean([x[m] for x in rs]))
        entry["returns"] = ret.tolist()
        table.append(entry)
    return step, table


def returns_summary(rows: Sequence[dict], step_key: str, step: Any) -> dict:
    """One evaluation over all runs: `{step_key: step, return_mean,
    return_std, returns, win_rate_mean}` (the adversarial programs'
    `initial` and `final` entries)."""
    sel = [r for r in rows if r[step_key] == step]
    ret = np.array([r["eval_return"] for r in sel], np.float64)
    return {step_key: step, "return_mean": float(ret.mean()), "return_std": float(ret.std()),
            "returns": ret.tolist(),
            "win_rate_mean": float(np.mean([r["eval_win_rate"] for r in sel]))}
