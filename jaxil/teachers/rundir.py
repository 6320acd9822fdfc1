"""A teacher's run directory as the run engine writes it.

A teacher keeps the layout of [`jaxil.teachers.io`][jaxil.teachers.io]
(`teacher.json`, `metrics.jsonl`,
`checkpoints/<env_steps>/{actor,runner,checkpoint.json}`) because shipped
teachers, dataset recipes and
[`jaxil.teachers.load_teacher`][jaxil.teachers.io.load_teacher] read it.
[`TeacherRunDir`][jaxil.teachers.rundir.TeacherRunDir] gives that layout the
interface of [`jaxil.runs.rundir.RunDir`][jaxil.runs.rundir.RunDir], so
[`jaxil.runs.engine.run`][jaxil.runs.engine.run] drives a teacher as it drives
every other program: the engine appends the rows and asks for checkpoints; this
module decides where they go.

- [`open_teacher_dir`][jaxil.teachers.rundir.open_teacher_dir] checks the
  directory before any compilation: writable, holding no other kind of run, and
  on `resume` the same settings as the recorded run (one line naming the first
  that differs).
- A checkpoint writes the actor, the full runner state, `checkpoint.json`
  with the evaluation of the row the engine has just appended, and
  refreshes `teacher.json`. Every checkpoint keeps its runner state, so a
  run stays resumable when its newest checkpoint is lost or damaged: the
  engine resumes from the newest one it can read.
- On resume, checkpoints past the newest runner state and metrics rows past
  its chunk are dropped (a line cut by a kill included), so the resumed run
  rewrites them exactly; a lost row of a checkpointed chunk (a cut last
  line of a finished run) moves the resume back to the checkpoint before
  it, so that row is written again too.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Optional

from jaxil.runs.checkpoint import check_space, restore_tree, save_tree
from jaxil.runs.rundir import (RunDir, check_versions, check_writable, lock_run_dir,
                                read_jsonl, write_jsonl_atomic)
from jaxil.teachers.io import (
    ACTOR_FORMAT,
    CKPT_DIR,
    METRICS_FILE,
    TEACHER_FILE,
    list_checkpoints,
    write_json,
)

STEP_KEY = "env_steps"
EVAL_MODES = ("eval_stochastic", "eval_deterministic")
# What must match on resume (eval_episodes only where the run's teacher.json
# records it; a run directory without it is not compared on it).
RESUME_KEYS = ("env_id", "env_kwargs", "seed", "config", "checkpoint_chunks")


def evaluation_fields(evaluation: dict[str, dict]) -> dict[str, Any]:
    """`{"eval_stochastic": {...}, ...}` as flat row fields
    (`"eval_stochastic/return_mean"`)."""
    return {f"{mode}/{k}": v for mode, stats in evaluation.items() for k, v in stats.items()}


def _nested_evaluation(row: dict) -> dict[str, dict]:
    """Undo [`evaluation_fields`][jaxil.teachers.rundir.evaluation_fields] for
    one row (episode counts as ints)."""
    out: dict[str, dict] = {}
    for key, v in row.items():
        mode, _, k = key.partition("/")
        if mode in EVAL_MODES:
            out.setdefault(mode, {})[k] = int(v) if k == "episodes" else v
    return out


class _Checkpoints:
    """The engine's checkpointer for a teacher: `checkpoints/<env_steps>/`."""

    def __init__(self, rundir: "TeacherRunDir"):
        self.rundir = rundir
        self.directory = rundir.path / CKPT_DIR

    def save(self, step: int, runner: Any) -> None:
        d = self.directory / str(step)
        save_tree(d / "actor", runner.actor.params)
        save_tree(d / "runner", runner)
        row = self.rundir.last_row
        info = dict(step=step, update=row["update"], chunk=row["chunk"],
                    wall_time_s=row["wall_time_s"], **_nested_evaluation(row))
        write_json(d / "checkpoint.json", info)
        self.rundir.write_teacher(complete=False, session_elapsed_s=None)

    def all_steps(self) -> list[int]:
        """The complete checkpoints that hold a runner state, oldest first."""
        return [s for s in list_checkpoints(self.rundir.path)
                if (self.directory / str(s) / "runner").is_dir()]

    def drop_after(self, step: Optional[int]) -> None:
        """Delete the checkpoints newer than `step` (all for None)."""
        for s in list_checkpoints(self.rundir.path):
            if step is None or s > step:
                shutil.rmtree(self.directory / str(s))

    def restore(self, like: Any, step: int) -> Any:
        return restore_tree(self.directory / str(step) / "runner", like)

    def check_space(self, runner: Any) -> None:
        check_space(self.directory, runner)

    def close(self) -> None:
        pass


class TeacherRunDir(RunDir):
    """An opened teacher directory (see
    [`open_teacher_dir`][jaxil.teachers.rundir.open_teacher_dir]).

    Attributes (beyond [`jaxil.runs.rundir.RunDir`][jaxil.runs.rundir.RunDir]'s):
      header: the settings `teacher.json` records (`spec` and
        `random_baseline` are added by
        [`begin`][jaxil.teachers.rundir.TeacherRunDir.begin]).
      doc: the `teacher.json` last written.
      last_row: the newest metrics row (a checkpoint records its evaluation).
    """

    def __init__(self, path: Path, header: dict, latest: Optional[int], rows: list[dict],
                 env_steps_per_chunk: int):
        self.header, self.doc = header, None
        self.env_steps_per_chunk = env_steps_per_chunk
        self.last_row = rows[-1] if rows else None
        self.path = path
        super().__init__(path, _Checkpoints(self), latest, rows, STEP_KEY)

    def begin(self, spec: dict, random_baseline: Optional[dict]) -> None:
        """Record the environment's spec, and on a fresh run the random
        baseline, and write the first `teacher.json`."""
        self.header["spec"] = spec
        if self.latest is None:
            self.header["random_baseline"] = random_baseline
            (self.path / METRICS_FILE).unlink(missing_ok=True)
            self.doc = dict(self.header, checkpoints=[], complete=False)
            write_json(self.path / TEACHER_FILE, self.doc)

    def append(self, rows: list[dict]) -> None:
        super().append(rows)
        self.last_row = rows[-1]

    def keep_rows(self, rows: list[dict], step: Optional[int]) -> None:
        super().keep_rows(rows, step)
        self.last_row = rows[-1] if rows else None
        self.write_teacher(complete=False, session_elapsed_s=None)

    def write_teacher(self, complete: bool, session_elapsed_s: Optional[float]) -> dict:
        """`teacher.json`: the header, every checkpoint with its evaluation,
        and the wall time of the training chunks (all sessions)."""
        ckpts = [json.loads((self.path / CKPT_DIR / str(s) / "checkpoint.json").read_text())
                 for s in list_checkpoints(self.path)]
        last = self.last_row or {}
        doc = dict(self.header, checkpoints=ckpts, complete=complete,
                   wall_time_s=last.get("wall_time_s", 0.0),
                   env_steps=last.get("chunk", 0) * self.env_steps_per_chunk)
        if session_elapsed_s is not None:
            doc["session_elapsed_s"] = session_elapsed_s
        write_json(self.path / TEACHER_FILE, doc)
        self.doc = doc
        return doc

    def write_results(self, summary: dict) -> None:
        self.write_teacher(complete=summary["complete"],
                           session_elapsed_s=summary["wall_seconds"])


def _refuse_foreign_run(path: Path) -> None:
    """Refuse a directory that holds a run other than a teacher's: a teacher
    would remove its `metrics.jsonl` and mix its files with ours."""
    foreign = [f for f in ("run.json", "results.json") if (path / f).exists()]
    if not (path / TEACHER_FILE).exists():
        foreign += [f for f in (METRICS_FILE,) if (path / f).exists()]
        ck = path / CKPT_DIR
        if ck.is_dir() and any(ck.iterdir()):
            foreign.append(CKPT_DIR + "/")
    if foreign:
        raise FileExistsError(
            f"{path} holds {', '.join(foreign)}: the files of another kind of run (a "
            f"`jaxil train` run directory?), not of a teacher; choose another --out")


def _check_resumable(path: Path, header: dict, existing: list[int]) -> dict:
    """The recorded `teacher.json` of a run that may be resumed with
    `header`; a one-line error otherwise."""
    teacher_path = path / TEACHER_FILE
    if not teacher_path.exists():
        raise FileNotFoundError(
            f"cannot resume {path}: it holds checkpoints {existing} but no {TEACHER_FILE}, so "
            f"their settings cannot be checked; choose an empty out_dir")
    try:
        old = json.loads(teacher_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"cannot resume {path}: {teacher_path} is not valid JSON ({e}); "
                         f"choose an empty out_dir") from None
    if old.get("actor_format", 1) != ACTOR_FORMAT:
        raise ValueError(
            f"cannot resume {path}: it was written by an earlier jaxil (actor_format "
            f"{old.get('actor_format', 1)}); its checkpoints still load for data, but train "
            f"a new run in an empty out_dir to continue training")
    keys = RESUME_KEYS + (("eval_episodes",) if "eval_episodes" in old else ())
    for k in keys:
        if old.get(k) != json.loads(json.dumps(header[k])):
            raise ValueError(
                f"cannot resume {path}: its {k} is {old.get(k)!r} but this run has "
                f"{header[k]!r} (num_checkpoints and eval_episodes must match too); "
                f"rerun with the original settings, or choose another out_dir")
    return old


def open_teacher_dir(out_dir: str | os.PathLike, header: dict, *, resume: bool,
                     env_steps_per_chunk: int) -> TeacherRunDir:
    """Open `out_dir` for a teacher run with the settings `header`.

    Without `resume` a directory that already holds checkpoints is refused;
    with it, the newest checkpoint holding a runner state is the one to
    continue from (`latest`, in env steps), later checkpoints and metrics
    rows are removed, and the recorded `random_baseline` is kept.

    Raises:
      FileExistsError: `out_dir` holds checkpoints (without `resume`) or
        another kind of run.
      FileNotFoundError / ValueError: a run that cannot be resumed, or whose
        settings differ (the first difference named).
      PermissionError: `out_dir` cannot be written.
    """
    path = Path(out_dir)
    check_writable(path, "out_dir")
    lock_run_dir(path)
    _refuse_foreign_run(path)
    existing = list_checkpoints(path)
    if not existing:
        header["versions"] = check_versions(None, path)
        return TeacherRunDir(path, header, None, [], env_steps_per_chunk)
    if not resume:
        raise FileExistsError(f"{path} already has checkpoints {existing}; pass resume=True "
                              f"(--resume) to continue, or choose an empty out_dir")
    old = _check_resumable(path, header, existing)
    with_state = [s for s in existing if (path / CKPT_DIR / str(s) / "runner").is_dir()]
    if not with_state:
        raise FileNotFoundError(
            f"no runner state to resume from in {path / CKPT_DIR}: its checkpoints {existing} "
            "hold the actors only (an earlier jaxil kept the runner state in the newest "
            "checkpoint alone, and that one is gone); they still load as teachers, but train "
            "a new run in an empty out_dir to continue training")
    latest = with_state[-1]
    for s in existing:
        if s > latest:
            shutil.rmtree(path / CKPT_DIR / str(s))
    upto = latest // env_steps_per_chunk
    rows = [r for r in read_jsonl(path / METRICS_FILE, report=True) if r["chunk"] <= upto]
    write_jsonl_atomic(path / METRICS_FILE, rows)
    header["random_baseline"] = old.get("random_baseline")
    header["versions"] = check_versions(old.get("versions"), path)
    return TeacherRunDir(path, header, latest, rows, env_steps_per_chunk)
