"""Loggers: where the run engine sends every metrics row besides `metrics.jsonl`.

A [`Logger`][jaxil.runs.loggers.Logger] has `write(rows)` and `close()`; the engine
([`jaxil.runs.engine.run`][jaxil.runs.engine.run]) builds each from a `LoggerFactory`,
`factory(run_names, step_key, resume_from) -> Logger`, once it knows the
step a resumed run continues from. Only the rows of the steps a session
trains reach a logger: a resumed run sends none at or before the step it
resumes from.

TensorBoard (`--tensorboard DIR`,
[`tensorboard`][jaxil.runs.loggers.tensorboard]): the metrics rows that a loop
appends to `metrics.jsonl` are also written as scalars, one TensorBoard run
(sub-directory) per jaxil run, e.g. `DIR/run3-seed1-alpha=0.1`, so
TensorBoard's run selector filters seeds and grid points. tensorboardX is the
writer (extra `jaxil[tensorboard]`); it needs neither TensorFlow nor PyTorch.

A resumed run purges the events past the step it resumes from, so curves do
not double back.

Weights & Biases (`--wandb PROJECT`, [`wandb`][jaxil.runs.loggers.wandb]; extra
`jaxil[wandb]`, wandb >= 0.19.10): one W&B run per jaxil run (seed, grid point,
regime), named by its run name, all runs of one invocation in one W&B group
(default: the run directory's name), so W&B's grouping averages seeds and its
filters pick grid points:

- config: the settings given to [`wandb`][jaxil.runs.loggers.wandb] (the
  command line's, for `jaxil` commands) and each run's ids from its rows
  (`seed`, `grid`, `regime`, `run`);
- history: every numeric field of a row (not the ids), logged at the row's
  step field as the W&B step (`run.log(metrics, step=row[step_key])`), so
  each panel's x-axis is the jaxil step (`update`, `round`, `chunk`,
  `env_steps`) without choosing a custom axis;
- resume: a fresh jaxil run makes new W&B run ids and keeps them in
  `<run_dir>/wandb.json`; a resumed run reads them back and continues the
  same W&B runs (`resume="allow"`). Rows W&B already holds (those a killed
  session logged after its last checkpoint: the resumed run reproduces them
  exactly) are not logged again. Without `run_dir` a resumed run starts new
  W&B runs, with a warning;
- `mode`: `"online"` (W&B's default), `"offline"` (local files under
  W&B's directory, uploaded later with `wandb sync`) or `"disabled"`;
- a run that stops on an error (the non-finite guard, a kill by Ctrl-C) is
  finished as failed.

A sweep of R runs opens R W&B runs in one process (wandb's
`reinit="create_new"`); `close()` finishes them all.
"""

from __future__ import annotations

import json
import re
import secrets
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, Sequence

from jaxil.runs.io_atomic import atomic_write_text


class Logger(Protocol):
    """Receives the engine's metrics rows (each with `run` and the step field)."""

    def write(self, rows: Sequence[dict]) -> None: ...

    def close(self) -> None: ...


#: `(run_names, step_key, resume_from) -> Logger`; `resume_from` is the
#: step a resumed run continues from (None for a fresh run).
LoggerFactory = Callable[[Sequence[str], str, Optional[int]], Logger]

_SKIP = {"run", "seed", "grid", "regime", "round", "update"}
#: The fields of a row that name its run (W&B config, not history).
_IDS = ("run", "seed", "grid", "regime")
#: The `mode` values of `wandb` (and `--wandb-mode`).
WANDB_MODES = ("online", "offline", "disabled")
#: wandb releases before this finish the open run when another starts.
_WANDB_MIN = (0, 19, 10)
#: The file of a run directory that keeps its W&B run ids.
WANDB_IDS = "wandb.json"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=,+-]+", "_", name)


class TensorBoard:
    """One `SummaryWriter` per run; `write(rows)` adds every numeric
    field of each row at `row[step_key]`."""

    def __init__(self, logdir: str | Path, run_names: Sequence[str], step_key: str = "update",
                 resume_from: Optional[int] = None):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise ValueError('--tensorboard needs tensorboardX: pip install "jaxil[tensorboard]"'
                             ) from None
        purge = None if resume_from is None else resume_from + 1
        self.step_key = step_key
        self.writers = [SummaryWriter(str(Path(logdir) / _safe(n)), purge_step=purge, flush_secs=30)
                        for n in run_names]

    def write(self, rows: Sequence[dict]) -> None:
        for row in rows:
            w, step = self.writers[row["run"]], int(row[self.step_key])
            for k, v in row.items():
                if k not in _SKIP and isinstance(v, (int, float)) and not isinstance(v, bool):
                    w.add_scalar(k, v, step)

    def close(self) -> None:
        for w in self.writers:
            w.close()


def tensorboard(logdir: str | Path) -> LoggerFactory:
    """A `LoggerFactory` of TensorBoard scalars under `logdir`."""
    def make(names: Sequence[str], step_key: str, resume_from: Optional[int]) -> TensorBoard:
        return TensorBoard(logdir, names, step_key=step_key, resume_from=resume_from)

    return make


def prefixed(factory: LoggerFactory, prefix: str) -> LoggerFactory:
    """`factory` with `prefix` before every run name: several programs of
    one invocation (a π_SFT and the model trained on it) log side by side
    without two runs sharing a name."""
    def make(names: Sequence[str], step_key: str, resume_from: Optional[int]) -> Logger:
        return factory([prefix + n for n in names], step_key, resume_from)

    return make


def _import_wandb() -> Any:
    try:
        import wandb as wb
    except ImportError:
        raise ValueError('--wandb needs wandb: pip install "jaxil[wandb]"') from None
    version = tuple(int(x) for x in re.findall(r"\d+", getattr(wb, "__version__", ""))[:3])
    if version < _WANDB_MIN:
        raise ValueError(f"--wandb needs wandb >= {'.'.join(map(str, _WANDB_MIN))} (several "
                         f"runs open in one process), found {wb.__version__}: "
                         'pip install -U "jaxil[wandb]"')
    return wb


def _check_mode(mode: Optional[str]) -> None:
    if mode is not None and mode not in WANDB_MODES:
        raise ValueError(f"W&B mode must be one of {', '.join(WANDB_MODES)}, got {mode!r}")


def _stored(run_dir: Optional[str | Path]) -> dict:
    """`{"group": ..., "runs": {name: id}}` kept in `run_dir` (empty if none)."""
    if run_dir is None:
        return {}
    try:
        doc = json.loads((Path(run_dir) / WANDB_IDS).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _next_step(run: Any) -> int:
    """The first step `run` accepts: past the history a resumed W&B run
    already holds, 0 for a new one."""
    try:
        return max(int(getattr(run, "step", 0) or 0), 0)
    except (TypeError, ValueError):
        return 0


class WandB:
    """One W&B run per jaxil run; `write(rows)` logs every numeric field of
    each row (not its ids) at `row[step_key]` as the W&B step.

    `run_dir`: the jaxil run directory; its name is the default group and
    it keeps the W&B run ids (`wandb.json`) that a resumed run continues.
    `config`: the settings of the invocation, in every run's W&B config
    beside the run's ids.
    """

    def __init__(self, project: str, run_names: Sequence[str], step_key: str = "update",
                 resume_from: Optional[int] = None, *, entity: Optional[str] = None,
                 group: Optional[str] = None, mode: Optional[str] = None,
                 run_dir: Optional[str | Path] = None, config: Optional[dict] = None):
        wb = _import_wandb()
        _check_mode(mode)
        stored = _stored(run_dir) if resume_from is not None else {}
        known = stored.get("runs") or {}
        if resume_from is not None and run_dir is None:
            warnings.warn("a resumed run without run_dir= starts new W&B runs; pass the run "
                          "directory to continue the same ones", stacklevel=2)
        # A fresh run gets new ids even where the directory held a run before
        # (--overwrite): W&B would drop every row below the old run's last step.
        ids = [known.get(n) or secrets.token_hex(6) for n in run_names]
        group = group or stored.get("group") or (
            Path(run_dir).resolve().name if run_dir is not None else
            f"jaxil-{secrets.token_hex(4)}")
        if run_dir is not None and mode != "disabled":
            doc = _stored(run_dir)  # other programs' runs of the same directory stay
            doc.update(group=group, runs={**(doc.get("runs") or {}), **dict(zip(run_names, ids))})
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            atomic_write_text(Path(run_dir) / WANDB_IDS, json.dumps(doc, indent=2))
        self.step_key, self.group = step_key, group
        self.runs: list[Any] = []
        self.next: list[int] = []
        self.configured: list[bool] = []
        try:
            for name, run_id in zip(run_names, ids):
                run = wb.init(project=project, entity=entity, group=group, name=name,
                              id=run_id, resume="allow", mode=mode, reinit="create_new")
                self.runs.append(run)
                # Outside init: a resumed run's config may then change (--updates).
                run.config.update(dict(config or {}), allow_val_change=True)
                floor = 0 if resume_from is None else resume_from + 1
                self.next.append(max(_next_step(run), floor))
                self.configured.append(False)
        except BaseException:
            self.close()
            raise

    def write(self, rows: Sequence[dict]) -> None:
        for row in rows:
            i, step = row["run"], int(row[self.step_key])
            run = self.runs[i]
            if not self.configured[i]:
                run.config.update({k: row[k] for k in _IDS if k in row}, allow_val_change=True)
                self.configured[i] = True
            if step < self.next[i]:  # W&B holds this step already
                continue
            metrics = {k: v for k, v in row.items()
                       if k not in _SKIP and k != self.step_key
                       and isinstance(v, (int, float)) and not isinstance(v, bool)}
            run.log(metrics, step=step, commit=True)
            self.next[i] = step + 1

    def close(self) -> None:
        # Called from the engine's `finally`: an error on its way out (the
        # guard, Ctrl-C) marks every run failed.
        failed = sys.exc_info()[0] is not None
        for run in self.runs:
            try:
                run.finish(exit_code=1 if failed else 0)
            except Exception as e:  # finish the others; never mask the run's own error
                warnings.warn(f"W&B could not finish run {getattr(run, 'name', '?')}: {e}",
                              stacklevel=2)
        self.runs = []


def wandb(project: str, *, entity: Optional[str] = None, group: Optional[str] = None,
          mode: Optional[str] = None, run_dir: Optional[str | Path] = None,
          config: Optional[dict] = None) -> LoggerFactory:
    """A `LoggerFactory` of W&B runs in `project` (see the module
    notes): one per jaxil run, in `group` (default: the name of
    `run_dir`, else a generated one shared by every program this factory
    logs). Pass the run directory as `run_dir` so a resumed run continues
    its W&B runs. Refuses at once when wandb is missing or `mode` unknown.
    """
    _import_wandb()  # before the work that precedes the first row
    _check_mode(mode)
    group = group or (None if run_dir is not None else f"jaxil-{secrets.token_hex(4)}")

    def make(names: Sequence[str], step_key: str, resume_from: Optional[int]) -> WandB:
        return WandB(project, names, step_key=step_key, resume_from=resume_from, entity=entity,
                     group=group, mode=mode, run_dir=run_dir, config=config)

    return make
