"""GAIL and AIRL against BC on multi-agent Hopper over the number of
demonstrations, with and without subsampling: one table and one figure from
the result files of `adversarial.py`.

    python experiments/irl/hopper_grid.py

Reads `results/hopper_<d>d_<sub20|full>[_cold][_airl].json` (`adversarial.py`)
and `results/hopper_<d>d_full_dagger[_greedy].json` (`hopper_dagger.py`; the commands
are in `README.md`, "Multi-agent Hopper"), writes `results/hopper_grid.md` and
`results/hopper_grid.png`. Each cell is the mean ± std over seeds of the
greedy return at the end of training, with the return per step and the
episode length beside it: the hopper pays 1 a step for staying upright, so
a policy can raise its return by surviving without hopping.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
DEMOS = (4, 11, 25)
REGIMES = (("sub20", "every 20th step"), ("full", "every step"))
#: (column, method, file suffix, chunk): BC is chunk 0 of the warm-started runs.
COLUMNS = (("BC (π_SFT)", "gail", "", 0), ("GAIL", "gail", "", -1),
           ("AIRL", "airl", "", -1), ("GAIL, no warm start", "gail", "_cold", -1),
           ("AIRL, no warm start", "airl", "_cold", -1))
#: The interactive runs (`hopper_dagger.py`): their own BC and DAgger, at the
#: expert-label budget of `d` whole trajectories; (column, regime, file suffix),
#: the suffix ``_greedy`` for the runs whose expert acts on its mean.
DAGGER_COLUMNS = (("BC (same labels)", "bc", ""), ("DAgger (same labels)", "dagger", ""),
                  ("BC, greedy expert", "bc", "_greedy"),
                  ("DAgger, greedy expert", "dagger", "_greedy"))


def _load(demos: int, regime: str, suffix: str, method: str):
    """The `method` entry of the first result file holding it, or None."""
    for extra in ("", "_" + method):
        path = RESULTS / f"hopper_{demos}d_{regime}{suffix}{extra}.json"
        if path.exists():
            doc = json.loads(path.read_text())
            entry = doc["results"][0]["methods"].get(method)
            if entry is not None:
                return doc, entry
    return None, None


def cell(demos: int, regime: str, method: str, suffix: str, chunk: int):
    """`dict(mean, std, per_step, length, start)` of one cell, or None;
    `start` is the run's own π_SFT (its chunk-0 evaluation) when it was
    warm-started, else None."""
    doc, entry = _load(demos, regime, suffix, method)
    if entry is None:
        return None
    point = entry["summary"]["initial" if chunk == 0 else "final"]
    curves = entry["curves"]
    i = curves["chunk"].index(point["chunk"])
    ret, length = curves["eval_return"][i], curves["eval_length"][i]
    warm = doc["results"][0].get("warm_start", True)
    start = entry["summary"]["initial"] if warm else None
    return dict(mean=point["return_mean"], std=point["return_std"], per_step=ret / length,
                length=length, start=None if start is None else dict(
                    mean=start["return_mean"], std=start["return_std"]))


def dagger_cell(demos: int, regime: str, suffix: str = ""):
    """`dict(mean, std, per_step, length, labels)` of one regime of
    `results/hopper_<d>d_full_dagger<suffix>.json`, or None."""
    path = RESULTS / f"hopper_{demos}d_full_dagger{suffix}.json"
    if not path.exists():
        return None
    res = json.loads(path.read_text())["result"]
    entry, curve = res["regimes"].get(regime), res["curves"].get(regime)
    if entry is None:
        return None
    ret, length = curve["eval_return"][-1], curve["eval_length"][-1]
    return dict(mean=entry["return_mean"], std=entry["return_std"], per_step=ret / length,
                length=length, labels=entry["labels_mean"], budget=res["budget"])


def _text(c: dict) -> str:
    return f"{c['mean']:.0f} ± {c['std']:.0f} ({c['per_step']:.2f}/step, {c['length']:.0f} steps)"


def dagger_table() -> tuple[str, dict]:
    """The DAgger rows, or an empty text when no interactive run is there."""
    data = {d: [dagger_cell(d, r, s) for _, r, s in DAGGER_COLUMNS] for d in DEMOS}
    if all(c is None for cells in data.values() for c in cells):
        return "", data
    rows = ["| labels of (whole trajectories) | expert labels | "
            + " | ".join(c[0] for c in DAGGER_COLUMNS) + " |",
            "|" + "---|" * (len(DAGGER_COLUMNS) + 2)]
    for d, cells in data.items():
        if all(c is None for c in cells):
            continue
        budget = next(c["budget"] for c in cells if c is not None)
        out = ["not run" if c is None else _text(c) for c in cells]
        for j in range(1, len(cells), 2):  # each DAgger against the BC of the same expert
            bc, dg = cells[j - 1], cells[j]
            if bc is not None and dg is not None \
                    and dg["mean"] - bc["mean"] > max(dg["std"], bc["std"]):
                out[j] += " ✓"
        rows.append(f"| {d} | {budget:,} | " + " | ".join(out) + " |")
    note = ("\nThe interactive runs (`hopper_dagger.py`): the PPO actor's network as the student, "
            "the shipped teacher as the expert (fresh episodes, acting sampled, or on its mean "
            "action in the greedy-expert columns, for its demonstrations and its labels alike), "
            "greedy return after 8 rounds, mean ± std over 4 seeds; ✓: DAgger above the BC of "
            "the same expert by more than one std of both. BC spends the labels on whole expert "
            "episodes; DAgger on about two of them, then on the expert's labels of the states "
            "its β-mixture visits.\n")
    return "\n".join(rows) + "\n" + note, data


def _demonstrator_return() -> float | None:
    """The mean return of the dataset's expert trajectories the seeds draw from."""
    for path in sorted(RESULTS.glob("hopper_*d_*.json")):
        doc = json.loads(path.read_text())
        if "results" in doc:  # adversarial.py's files
            return doc["results"][0]["demos"]["demo_return_mean"]
    return None


def table() -> tuple[str, dict]:
    rows, data = [], {}
    head = "| demonstrations per seed | steps kept | " + " | ".join(c[0] for c in COLUMNS) + " |"
    rows += [head, "|" + "---|" * (len(COLUMNS) + 2)]
    for regime, label in REGIMES:
        for d in DEMOS:
            cells = [cell(d, regime, m, s, k) for _, m, s, k in COLUMNS]
            data[(regime, d)] = cells
            if all(c is None for c in cells):
                continue
            bc = cells[0]
            out = []
            for j, c in enumerate(cells):
                if c is None:
                    out.append("not run")
                    continue
                text = _text(c)
                # a warm-started run against the π_SFT it started from, a cold one against BC
                ref = c["start"] if j > 0 and c["start"] is not None else bc
                if j > 0 and ref is not bc and bc is not None \
                        and abs(ref["mean"] - bc["mean"]) > 0.5:
                    text += f" from {ref['mean']:.0f} ± {ref['std']:.0f}"
                if j > 0 and ref is not None and c["mean"] - ref["mean"] > max(c["std"], ref["std"]):
                    text += " ✓"
                out.append(text)
            rows.append(f"| {d} | {label} | " + " | ".join(out) + " |")
    note = ("\nGreedy return at the end of training, mean ± std over 4 seeds; in brackets "
            "the mean return over the mean episode length, and that length; ✓: above the policy "
            "the run started from (its own π_SFT; BC for a cold start) by more than one std of "
            "both. BC is the chunk-0 evaluation of the warm-started GAIL runs, the policy GAIL "
            "starts from; \"from x\": a run whose own π_SFT differs from that column's, "
            "because it drew its demonstrations from a rebuild of the dataset on another "
            "machine (the same trajectories up to last-bit differences of the physics that "
            "some episodes amplify); the cold starts (all but GAIL's at 4 subsampled "
            "trajectories) ran on such rebuilds and are compared with the first build's BC. "
            "163,840 env-steps per seed (`--scale 0.2`).\n")
    return "\n".join(rows) + "\n" + note, data


def figure(data: dict, path: Path, expert: float | None, dagger: dict | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    handles = {}
    for ax, (regime, label) in zip(axes, REGIMES):
        for j, (name, *_rest) in enumerate(COLUMNS):
            pts = [(d, data[(regime, d)][j]) for d in DEMOS if data[(regime, d)][j] is not None]
            if not pts:
                continue
            x = np.array([d for d, _ in pts], float) * (1 + 0.03 * (j - 1.5))
            h = ax.errorbar(x, [c["mean"] for _, c in pts], yerr=[c["std"] for _, c in pts],
                            marker="o", capsize=3, color=f"C{j}", label=name)
            handles[name] = h
        if regime == "full" and dagger:
            for j, (name, *_rest) in enumerate(DAGGER_COLUMNS):
                pts = [(d, cells[j]) for d, cells in dagger.items() if cells[j] is not None]
                if not pts:
                    continue
                x = np.array([d for d, _ in pts], float) * (1 + 0.03 * (j + 2.5))
                handles[name] = ax.errorbar(
                    x, [c["mean"] for _, c in pts], yerr=[c["std"] for _, c in pts],
                    marker="s" if j < 2 else "D", ls=":", capsize=3,
                    color=f"C{len(COLUMNS) + j}", label=name)
        if expert is not None:
            handles["demonstrations"] = ax.axhline(expert, color="gray", ls="--", lw=1,
                                                   label="demonstrations")
        ax.set_xscale("log")
        ax.set_xlim(3.3, 30)
        ax.set_xticks(DEMOS, [str(d) for d in DEMOS])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("expert trajectories per seed")
        ax.set_title(f"steps kept: {label}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("greedy return (mean ± std, 4 seeds)")
    ncol = len(handles) if len(handles) <= 6 else (len(handles) + 1) // 2
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=ncol,
               fontsize=8, frameon=False)
    fig.suptitle("Multi-agent Hopper: GAIL, AIRL and DAgger against BC", fontsize=11)
    fig.tight_layout(rect=(0, 0.06 * -(-len(handles) // ncol), 1, 1))
    fig.savefig(path, dpi=110)


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    text, data = table()
    dtext, dagger = dagger_table()
    text = text + ("\n" + dtext if dtext else "")
    (RESULTS / "hopper_grid.md").write_text(text)
    figure(data, RESULTS / "hopper_grid.png", _demonstrator_return(), dagger)
    print(text)
    print(f"wrote {RESULTS / 'hopper_grid.md'} and {RESULTS / 'hopper_grid.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
