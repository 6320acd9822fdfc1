"""Run directories in the formats other tools read.

`jaxil train` / `jaxil sweep` and `jaxil interactive` write `metrics.jsonl`:
one row per (evaluation, run) with `update` (train) or `round` (interactive),
`run`, `seed`, `grid` (train: the grid point's hyper-parameters) or `regime`
(interactive), `eval_return`, `eval_win_rate` and the learner's last training
metrics. This module reads those rows
([`load_run`][jaxil.runs.export.load_run],
[`group_rows`][jaxil.runs.export.group_rows], shared with
[`jaxil.runs.plot`][jaxil.runs.plot]) and writes them for InstaDeep's
`marl-eval` ([`to_marl_eval`][jaxil.runs.export.to_marl_eval]), the aggregation
used by Mava and OG-MARL.

CLI: `jaxil export marl-eval RUN_DIR [RUN_DIR ...] --out results.json`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

# metrics.jsonl key -> marl-eval metric name. marl-eval picks the metrics to
# aggregate by splitting names on "_" (`_select_metrics_for_plotting`), so
# a normalised metric must be one word: `return`, not `eval_return`.
DEFAULT_METRICS = {"eval_return": "return", "eval_win_rate": "win_rate"}

# Row keys that index a row rather than measure something.
_INDEX_KEYS = ("update", "round", "run", "seed", "grid", "regime")


@dataclasses.dataclass(frozen=True)
class Run:
    """One run directory as read back.

    Attributes:
      path: the directory.
      kind: `"train"` (`jaxil train` / `sweep`) or `"interactive"`.
      x: the row key counting evaluations: `"update"` or `"round"`.
      info: `run.json` ({} when absent).
      rows: the complete rows of `metrics.jsonl`, in file order.
    """

    path: Path
    kind: str
    x: str
    info: dict
    rows: list

    def field(self, key: str):
        """A `run.json` entry, flat or under `identity` (both layouts exist)."""
        if key in self.info:
            return self.info[key]
        return (self.info.get("identity") or {}).get(key)

    @property
    def by(self) -> str:
        """The row key that names a run's group: `"grid"` or `"regime"`."""
        return "grid" if self.kind == "train" else "regime"


def _read_rows(path: Path) -> list[dict]:
    """The rows of `metrics.jsonl`; a last line cut by a kill is dropped (as
    the writers in jaxil.algorithms.offline.train and
    jaxil.algorithms.interactive.loop do on resume)."""
    if not path.is_file():
        hint = "" if path.parent.is_dir() else f" ({path.parent} does not exist)"
        raise FileNotFoundError(
            f"{path} not found{hint}: pass a run directory written by `jaxil train`, "
            "`jaxil sweep` or `jaxil interactive` with --out")
    lines = path.read_text().splitlines()
    rows = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # cut by a kill mid-write
                break
            raise ValueError(f"{path} line {i + 1} is not JSON; the file is damaged, "
                             "rerun the training into a fresh --out") from None
        if not isinstance(row, dict) or not ("update" in row or "round" in row):
            raise ValueError(f"{path} line {i + 1} has no `update` or `round` key: it is not "
                             "the metrics.jsonl of `jaxil train`/`sweep`/`interactive`")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no evaluation yet: wait until the run has finished "
                         "its first evaluation (--eval-every), or pass another run directory")
    return rows


def load_run(path: Union[str, Path]) -> Run:
    """Read a run directory (`metrics.jsonl` and, when present, `run.json`).

    Raises:
      FileNotFoundError: no `metrics.jsonl` in `path`.
      ValueError: an empty or damaged `metrics.jsonl`, or one mixing
        `update` and `round` rows.
    """
    path = Path(path)
    rows = _read_rows(path / "metrics.jsonl")
    kinds = {"update" in r for r in rows}
    if len(kinds) > 1:
        raise ValueError(f"{path / 'metrics.jsonl'} mixes `update` (train) and `round` "
                         "(interactive) rows; keep one run per directory")
    train = kinds.pop()
    info_path = path / "run.json"
    try:
        info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"{info_path} is not valid JSON ({e}): it was cut short or edited; "
                         "restore it from a copy of the run, or move it aside to read "
                         "metrics.jsonl alone") from None
    return Run(path, "train" if train else "interactive", "update" if train else "round",
               info, rows)


def grid_label(grid: Mapping[str, float]) -> str:
    """`alpha=0.1;gamma=0.99` (`;`, not `,`: marl-eval refuses commas in
    algorithm names)."""
    return ";".join(f"{k}={float(v):g}" for k, v in sorted(grid.items()))


def group_rows(run: Run, by: Optional[str] = None) -> dict[str, dict[int, list[dict]]]:
    """`{group label: {seed: rows sorted by run.x}}`.

    `by`: `"grid"` (train: the label of the grid point, `""` without a
    grid), `"regime"` (interactive: the regime's name), `"dir"` (all runs
    of the directory in one group `""`, keyed by run index), or None for the
    directory's own (grid or regime).

    Raises:
      ValueError: `by` does not fit the directory, or a (group, seed) holds
        two rows at one evaluation.
    """
    by = by or run.by
    if by not in ("grid", "regime", "dir"):
        raise ValueError(f"unknown grouping {by!r}; use grid, regime or dir")
    if by not in ("dir", run.by):
        raise ValueError(f"{run.path} is a {run.kind} run (grouped by {run.by}), not by {by}; "
                         f"pass --by {run.by} (or leave --by out)")
    out: dict[str, dict[int, dict[int, dict]]] = {}
    for row in run.rows:
        if by == "dir":
            label, seed = "", int(row["run"])
        else:
            label = grid_label(row.get("grid") or {}) if by == "grid" else str(row["regime"])
            seed = int(row["seed"])
        at = out.setdefault(label, {}).setdefault(seed, {})
        x = int(row[run.x])
        if x in at:
            raise ValueError(f"{run.path / 'metrics.jsonl'} has two rows for "
                             f"{label or 'its runs'}, seed {seed} at {run.x} {x}; "
                             "the file was appended to twice, rerun into a fresh --out")
        at[x] = row
    return {g: {s: [at[x] for x in sorted(at)] for s, at in sorted(seeds.items())}
            for g, seeds in out.items()}


def metric_keys(rows: Sequence[dict]) -> list[str]:
    """The numeric metric keys that occur in `rows`, sorted."""
    keys = set()
    for r in rows:
        keys.update(k for k, v in r.items() if k not in _INDEX_KEYS
                    and isinstance(v, (int, float, list)) and not isinstance(v, bool))
    return sorted(keys)


def check_metric(run: Run, metric: str) -> None:
    if not any(metric in r for r in run.rows):
        raise ValueError(f"metric {metric!r} is not in {run.path / 'metrics.jsonl'}; "
                         f"available: {', '.join(metric_keys(run.rows))}")


def _name(prefix: str, label: str) -> str:
    if not prefix:
        return label
    return f"{prefix}[{label}]" if label else prefix


def algorithm_name(run: Run, label: str) -> str:
    """The default name of one group: `learner[grid]` (train; `learner`
    without a grid) or the regime's name (interactive)."""
    if run.kind == "interactive":
        return label
    return _name(run.field("learner") or run.path.name, label)


def _env_task(run: Run, env_name: Optional[str], task_name: Optional[str]) -> tuple[str, str]:
    if env_name and task_name:
        return env_name, task_name
    env_id = run.field("env_id")
    if not env_id:
        raise ValueError(f"{run.path} has no run.json with an env_id; pass env_name and "
                         "task_name (--env-name, --task-name)")
    env, _, task = str(env_id).partition(":")
    return env_name or env, task_name or task or env


def _values(v) -> list:
    return [float(x) for x in v] if isinstance(v, list) else [float(v)]


def to_marl_eval(
    run_dirs: Sequence[Union[str, Path]],
    *,
    env_name: Optional[str] = None,
    task_name: Optional[str] = None,
    algorithm_names: Optional[Union[Sequence[str], Mapping[str, str]]] = None,
    metrics: Optional[Union[Sequence[str], Mapping[str, str]]] = None,
) -> dict:
    """The runs of `run_dirs` in the raw-data JSON layout of marl-eval:

    ```text
    {env_name: {task_name: {algorithm: {"run_<seed>": {
        "step_<i>": {"step_count": int, metric: [values], ...},   # i = 0, 1, ...
        ...,
        "absolute_metrics": {metric: [values], ...}}}}}}
    ```

    (marl-eval README, "Data Structure for Raw Experiment data", and
    `marl_eval/utils/data_processing_utils.py`, version 0.0.4.)

    - algorithm: one per grid point of a train/sweep directory
      (`misodice[alpha=0.1]`, or `bc_union` without a grid) or per regime
      of an interactive one (`oec@4000`).
    - `run_<seed>`: the seed within the grid point / regime (the rows'
      `seed`, 0..S-1; the PRNG seed is `base_seed` + it). Seed s of every
      algorithm is the same run name, as marl-eval pairs runs by name.
    - `step_<i>`: the i-th evaluation in order of `update` (train) or
      `round` (interactive; round 0 is the student before any round);
      `step_count` is that update or round, not environment steps (an
      offline learner takes none).
    - metric values: jaxil records each evaluation's MEAN over its
      `--eval-episodes` episodes, not the episodes, so each list holds one
      element (the form marl-eval's own `JsonLogger` writes, which its
      README allows). A row value that is already a list (per-episode values)
      is exported as it is. marl-eval's min-max normalisation then spans the
      means, not single episodes.
    - `absolute_metrics`: the final evaluation's values. The protocol's
      absolute metric (the best policy re-evaluated on 10x the episodes) is
      not recorded by jaxil; these are the last step's values.

    marl-eval lower-cases every key and needs every algorithm of a task to
    have the same runs and steps; this is checked here.

    Args:
      run_dirs: run directories of `jaxil train`/`sweep`/`interactive`.
      env_name, task_name: where the runs go; by default from `run.json`'s
        `env_id` `"env:task"` (`smax:3m` -> `smax`, `3m`).
      algorithm_names: one name per run directory, replacing the learner
        name (`name[alpha=0.1]`; a regime becomes `name[oec@4000]`; a
        directory with one group gets `name`), or a mapping from the default
        names to new ones.
      metrics: metrics.jsonl keys to export, or a mapping key -> exported
        name; default `eval_return` -> `return`, `eval_win_rate` ->
        `win_rate`.

    Returns:
      The JSON-able dict (`json.dump` it; the key order is the step order).

    Raises:
      FileNotFoundError / ValueError: a directory without metrics, an unknown
        metric, clashing names, or algorithms with different runs or steps.
    """
    if not run_dirs:
        raise ValueError("to_marl_eval needs at least one run directory")
    runs = [load_run(p) for p in run_dirs]
    if metrics is None:
        metrics = DEFAULT_METRICS
    elif not isinstance(metrics, Mapping):
        metrics = {m: m for m in metrics}
    prefixes: list[Optional[str]] = [None] * len(runs)
    rename: Mapping[str, str] = {}
    if isinstance(algorithm_names, Mapping):
        rename = algorithm_names
    elif algorithm_names is not None:
        names = [algorithm_names] if isinstance(algorithm_names, str) else list(algorithm_names)
        if len(names) != len(runs):
            raise ValueError(f"algorithm_names gives {len(names)} names for {len(runs)} run "
                             "directories; give one per directory (--name once per RUN_DIR)")
        prefixes = names

    out: dict = {}
    origin: dict[tuple, str] = {}  # (env, task, lower-cased algorithm) -> where it came from
    for run, prefix in zip(runs, prefixes):
        for key in metrics:
            check_metric(run, key)
        env, task = _env_task(run, env_name, task_name)
        groups = group_rows(run)
        for label, seeds in groups.items():
            if prefix is not None and len(groups) == 1:
                name = prefix
            elif prefix is not None:
                name = _name(prefix, label)
            else:
                name = algorithm_name(run, label)
            name = rename.get(name, name)
            if "," in name:
                raise ValueError(f"algorithm name {name!r} (from {run.path}) has a comma, which "
                                 "marl-eval refuses; rename it (algorithm_names / --name)")
            key = (env.lower(), task.lower(), name.lower())
            if key in origin:
                raise ValueError(f"{origin[key]} and {run.path} both give algorithm {name!r} in "
                                 f"{env}/{task} (marl-eval ignores case); name the directories "
                                 "apart with algorithm_names (--name)")
            origin[key] = str(run.path)
            algo = out.setdefault(env, {}).setdefault(task, {}).setdefault(name, {})
            for seed, rows in seeds.items():
                entry = {}
                for i, row in enumerate(rows):
                    step = {"step_count": int(row[run.x])}
                    for k, exported in metrics.items():
                        if k not in row:
                            raise ValueError(
                                f"metric {k!r} is missing at {run.x} {row[run.x]} of "
                                f"{run.path / 'metrics.jsonl'}; export only metrics every "
                                f"evaluation records (e.g. {', '.join(DEFAULT_METRICS)})")
                        step[exported] = _values(row[k])
                    entry[f"step_{i}"] = step
                last = entry[f"step_{len(rows) - 1}"]
                entry["absolute_metrics"] = {m: list(last[m]) for m in metrics.values()}
                algo[f"run_{seed}"] = entry
    _check_rectangular(out, origin)
    return out


def _check_rectangular(out: dict, origin: dict) -> None:
    """marl-eval indexes every algorithm by the first one's run and step names."""
    for env, tasks in out.items():
        for task, algos in tasks.items():
            ref_name, ref = None, None
            for name, runs in algos.items():
                shape = {r: [s["step_count"] for k, s in v.items() if k.startswith("step_")]
                         for r, v in runs.items()}
                if ref is None:
                    ref_name, ref = name, shape
                    continue
                if sorted(shape) != sorted(ref):
                    raise ValueError(
                        f"in {env}/{task}, {name!r} has runs {sorted(shape)} but {ref_name!r} has "
                        f"{sorted(ref)}; marl-eval needs the same seeds for every algorithm "
                        "(train them with the same --seeds)")
                for r in shape:
                    if shape[r] != ref[r]:
                        where = origin[(env.lower(), task.lower(), name.lower())]
                        raise ValueError(
                            f"in {env}/{task}, {name!r} ({where}) {r} is evaluated at "
                            f"{shape[r]} but {ref_name!r} at {ref[r]}; marl-eval needs the same "
                            "evaluation steps everywhere (same --updates and --eval-every; "
                            "finish or --resume an interrupted run)")


# ----------------------------------------------------------------------------- CLI


