"""Text renderings of preference queries, for a language-model judge.

[`render_pair`][jaxil.algorithms.labelling.render.render_pair] turns query `i`
of a [`QueryPairs`][jaxil.data.preferences.QueryPairs] into a short prompt:
what the task is and how to answer ("#1" or "#2"), then a per-phase summary of
each of the two trajectory segments (team reward so far; for SMAX also allies
and enemies alive and their total health) and how the segment ends.
Trajectory #1 is side x of the query, #2 side y.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from jaxil.data.format import Dataset
from jaxil.data.preferences import QueryPairs, segments
from jaxil.algorithms.labelling.smax_state import smax_health, smax_layout

_SMAX_TASK = (
    "The task is a StarCraft-style battle (SMAX map {map}): a team of {A} allied units, "
    "controlled together, fights {E} enemy units driven by a built-in AI. A battle is won "
    "when every enemy unit is dead. Better team play keeps the allies' health high, removes "
    "as much enemy health as possible, and wins in fewer steps."
)
_GENERIC_TASK = (
    "The task is the cooperative multi-agent environment {env_id}: {N} agents act as one team "
    "and share a team reward after every step. Better team play earns more team reward{win}."
)


def _pct(x: float) -> str:
    return f"{100.0 * x:.0f}%"


def render_pair(dataset: Dataset, pairs: QueryPairs, i: int, max_lines: int = 10) -> str:
    """Query `i` as a prompt for a judge that answers "#1" or "#2".

    Args:
      dataset: the dataset the queries index into.
      pairs: the query set.
      i: which query.
      max_lines: at most this many phase lines per trajectory (the first
        and last state are always shown; phases are evenly spaced).

    Returns:
      The prompt text (a header, one block per trajectory, the question).
    """
    Q = len(pairs)
    if not -Q <= int(i) < Q:
        raise IndexError(f"query {i} is out of range for a query set of {Q} queries")
    if int(max_lines) < 2:
        raise ValueError(f"max_lines must be >= 2 (first and last state), got {max_lines}")
    i = int(i) % Q
    spec = dataset.spec
    layout = None
    if spec.env_id.startswith("smax:"):
        layout = smax_layout(spec)
        task = _SMAX_TASK.format(map=spec.env_id.split(":", 1)[1], A=layout.num_allies,
                                 E=layout.num_enemies)
    else:
        win = " and reaching the goal (success) matters most" if spec.has_win else ""
        task = _GENERIC_TASK.format(env_id=spec.env_id, N=spec.num_agents, win=win)
    L = pairs.segment_len
    what = ("whole episodes" if L is None
            else f"segments of at most {L} steps cut from longer episodes")
    lines = [
        "You are judging which of two recordings shows better team behaviour.",
        task,
        f"Both recordings are {what}, summarised every few steps (step = steps since the "
        f"recording began; reward so far = summed team reward).",
        "",
    ]
    sides = ((pairs.traj_x, pairs.start_x), (pairs.traj_y, pairs.start_y))
    for number, (traj, start) in enumerate(sides, start=1):
        t, s = int(traj[i]), int(start[i])
        lines.append(f"Trajectory #{number}:")
        lines.extend(_render_side(dataset, t, s, L, layout, int(max_lines)))
        lines.append("")
    lines.append("Which trajectory shows the better team behaviour? "
                 "Answer with exactly one of: #1 or #2.")
    return "\n".join(lines)


def _render_side(dataset: Dataset, traj: int, start: int, L: Optional[int], layout,
                 max_lines: int) -> list[str]:
    seg = segments(dataset, np.array([traj]), np.array([start]), L)
    n = int(np.asarray(seg.mask[0]).sum())
    if n == 0:
        return ["  (no steps: the recording starts after its episode ended)"]
    cum = np.concatenate([[0.0], np.cumsum(np.asarray(seg.reward[0], np.float64)[:n])])
    shown = np.unique(np.round(np.linspace(0, n, min(max_lines, n + 1))).astype(int))
    health = None
    if layout is not None:
        health = smax_health(np.asarray(seg.global_state[0, : n + 1]), layout)
    out = []
    for j in shown:
        text = f"  step {j:3d}: reward so far {cum[j]:.2f}"
        if health is not None:
            a, e = health[0][j], health[1][j]
            text += (f" | allies {int((a > 0).sum())}/{a.size} alive, health {_pct(a.mean())}"
                     f" | enemies {int((e > 0).sum())}/{e.size} alive, health {_pct(e.mean())}")
        out.append(text)
    out.append("  " + _outcome(dataset, traj, start, n, health))
    return out


def _outcome(dataset: Dataset, traj: int, start: int, n: int, health) -> str:
    length = int(dataset.length[traj])
    if start + n < length:
        return f"recording stops after {n} steps; the episode goes on"
    terminal = bool(dataset.done[traj, length - 1])
    if health is not None:
        allies_alive = bool(np.any(health[0][n] > 0))
        enemies_alive = bool(np.any(health[1][n] > 0))
        if not enemies_alive and allies_alive:
            return f"outcome: WON, every enemy dead after {n} steps"
        if not enemies_alive:
            return f"outcome: draw, both teams wiped out after {n} steps"
        if not allies_alive:
            return f"outcome: LOST, every ally dead after {n} steps"
        return f"outcome: time limit reached after {n} steps, no winner"
    end = "the episode ended" if terminal else "the episode hit its time limit"
    text = f"outcome: {end} after {n} steps"
    if dataset.spec.has_win:
        text += ", goal reached" if bool(dataset.success[traj]) else ", goal not reached"
    return text
