"""Markdown tables of the chat-form experiments' JSON files.

    python experiments/lm_chat/report.py            # every table whose JSON is in results/

Reads `compare_ops<k>.json` (OEC against BC, DAgger, RS and OPD, with the
per-turn divergence), `tiny_student_ops<k>.json` (the tiny student in both
forms) and `afd_ops<k>.json` (the reward models and best-of-N), and prints
one table each.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _pm(mean, std) -> str:
    return f"{mean:.3f} ± {std:.3f}"


def compare_table(d: dict) -> str:
    start = ("the pretrained model itself" if not d["start_updates"] else
             f"{d['start_updates']} SFT updates on one demonstration")
    lines = [f"Start: {start}, greedy success {d['start_success']:.3f}; "
             f"seeds {d['rows'][0]['seeds']}; "
             f"{d['config']['rounds']} rounds × {d['config']['episodes_per_round']} rollouts × "
             f"{d['config']['updates_per_round']} updates of {d['config']['batch_episodes']} "
             f"episodes; expert LM (OPD) success {d.get('expert_lm_success')}",
             "",
             "| method | budget (episodes) | expert tokens spent | success | wall time |",
             "|---|---|---|---|---|"]
    for r in d["rows"]:
        lines.append(f"| {r['method']} | ×{r['budget_episodes']:g} ({r['budget_tokens']} tokens) | "
                     f"{r['expert_tokens']:.0f} | {_pm(r['win_mean'], r['win_std'])} | "
                     f"{r['wall_s']:.0f} s |")
    shift = [r for r in d["rows"] if r.get("shift")]
    if shift:
        bins = [b["turn"] for b in shift[0]["shift"]]
        lines += ["", "Per-turn next-token disagreement with the expert on the student's own "
                  "chats, and (floor) on the expert's chats:", "",
                  "| method | budget | " + " | ".join(f"turn {b}" for b in bins) + " |",
                  "|---|---|" + "---|" * len(bins)]
        fmt = lambda x: "–" if x is None else f"{x:.3f}"  # noqa: E731
        for r in shift:
            cells = [f"{fmt(b['disagreement_student'])} ({fmt(b['disagreement_floor'])})"
                     for b in r["shift"]]
            lines.append(f"| {r['method']} | ×{r['budget_episodes']:g} | " + " | ".join(cells)
                         + " |")
    return "\n".join(lines)


def tiny_table(d: dict) -> str:
    rows = d["rows"]
    keys = sorted({(r["method"], r["budget_episodes"]) for r in rows},
                  key=lambda k: (k[1], k[0]))
    by = {(r["form"], r["method"], r["budget_episodes"]): r for r in rows}
    lines = ["| method | budget (episodes) | private form | chat form |", "|---|---|---|---|"]
    for m, b in keys:
        cells = []
        for form in ("private", "chat"):
            r = by.get((form, m, b))
            cells.append("not run" if r is None else _pm(r["win_mean"], r["win_std"]))
        lines.append(f"| {m} | ×{b:g} | " + " | ".join(cells) + " |")
    # A program that buys more demonstrations than the others (BC at a large
    # budget) collects another set and trains its own start: list each.
    starts: dict = {}
    for r in rows:
        ms = starts.setdefault(r["form"], {}).setdefault(f"{r['start_mean']:.3f}", [])
        if r["method"] not in ms:
            ms.append(r["method"])
    lines.append("")
    lines.append("SFT start: " + "; ".join(
        f"{f} " + ", ".join(f"{s} ({' '.join(ms)})" for s, ms in by_s.items())
        for f, by_s in starts.items()))
    return "\n".join(lines)


def afd_table(d: dict) -> str:
    s = d["best_of_n"]["success"]
    lines = [f"π_0 sampled success {d['role_stats']['init']['success']:.3f}, π_SFT sampled "
             f"{d['role_stats']['sft']['success']:.3f} (sources); demonstrator on the best-of-N "
             f"instances {d['demonstrator']['success']:.3f}", "",
             "| pick by | " + " | ".join(f"N = {n}" for n in s["ns"]) + " | Spearman ρ |",
             "|---|" + "---|" * (len(s["ns"]) + 1),
             "| oracle | " + " | ".join(f"{x:.3f}" for x in s["oracle"]) + " | |"]
    for name, r in s["rewards"].items():
        rho = r["spearman"]
        lines.append(f"| {name} | " + " | ".join(f"{x:.3f}" for x in r["curve"])
                     + f" | {'–' if rho != rho else f'{rho:.3f}'} |")
    rm = [r for r in d["rm_rows"] if "eval_accuracy" in r]
    if rm:
        lines += ["", "Reward model held-out accuracy: " + ", ".join(
            f"update {r['update']}: {r['eval_accuracy']:.3f}" for r in rm)]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    res = Path(args.results)
    for pattern, fn in (("compare_ops*.json", compare_table), ("tiny_student_ops*.json", tiny_table),
                        ("afd_ops*.json", afd_table)):
        for path in sorted(res.glob(pattern)):
            print(f"## {path.name}\n\n{fn(json.loads(path.read_text()))}\n")


if __name__ == "__main__":
    main()
