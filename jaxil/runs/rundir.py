"""Run directories with an identity: the one layout of `jaxil train`,
`jaxil sweep` and `jaxil interactive`.

A run directory holds:

```text
run.json        what determines the run (its identity) and what it was run with
metrics.jsonl   one row per (evaluation, run), appended as training goes
checkpoints/    orbax steps of the whole stacked state (jaxil.runs.checkpoint)
results.json    the final summary
```

[`open_run_dir`][jaxil.runs.rundir.open_run_dir] decides what may happen to a
directory before any work:

- a directory that holds another run is refused unless `resume` (continue
  it) or `overwrite` (start afresh: its run files are removed);
- `resume` compares the recorded identity with the new one and refuses any
  difference, listing each changed setting with its old and new value;
- on resume, metrics rows past the newest committed checkpoint are dropped
  (a kill between a metrics append and its checkpoint, or before the first
  checkpoint, leaves such rows), so the resumed run rewrites them exactly;
- the directory is checked writable up front, so no work is lost to a
  permission error at the end;
- one process at a time: [`check_run_dir`][jaxil.runs.rundir.check_run_dir] and
  [`open_run_dir`][jaxil.runs.rundir.open_run_dir] take an advisory lock
  (`.lock`, `fcntl.flock`) that the process holds until `RunDir.close` or its
  exit, so a second run on the same directory is refused with the holder named;
  the operating system drops the lock of a killed process, so a stale lock
  never blocks `--resume` (on platforms without `fcntl` there is no lock);
- `run.json` records the library versions that wrote the run (jaxil,
  JAX, flax, optax, orbax). A resume under other versions goes ahead with a
  one-line warning: the run's identity, which decides what it computes, is
  checked exactly, while another JAX or XLA may change only the last bits
  of a float, so refusing would strand a long run after an upgrade;
- a metrics file whose last line a kill cut short is repaired on resume (the
  cut row is dropped) and the repair is reported.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from jaxil.runs.checkpoint import Checkpointer
from jaxil.runs.io_atomic import atomic_write_text

RUN_FILES = ("run.json", "metrics.jsonl", "results.json")
LOCK_FILE = ".lock"
#: The distributions whose versions a run directory records.
VERSIONED = ("jaxil", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint")


def note(message: str) -> None:
    """A one-line notice on standard error (a repair or a version change)."""
    print(f"jaxil: {message}", file=sys.stderr, flush=True)


def read_jsonl(path: Path, *, report: bool = False) -> list[dict]:
    """The complete rows of a JSONL file ([] if absent); stops at a line cut
    by a kill (`report`: say so on standard error)."""
    if not path.exists():
        return []
    rows = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if report:
                note(f"{path}: dropped {len(lines) - i} unreadable line(s) after row {i} (a "
                     "line cut by a kill); the resumed run rewrites them")
            break
    return rows


def installed_versions(names: Sequence[str] = VERSIONED) -> dict[str, Optional[str]]:
    """The installed versions of the distributions `names` (None where
    absent); by default those a run directory records."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def check_versions(recorded: Optional[dict], where: Path) -> dict[str, Optional[str]]:
    """The current versions; a one-line warning when `recorded` (a resumed
    run's) differs."""
    now = installed_versions()
    if recorded:
        changed = [f"{k} {recorded.get(k)} -> {now.get(k)}" for k in VERSIONED
                   if k in recorded and recorded.get(k) != now.get(k)]
        if changed:
            note(f"resuming {where} under other library versions ({'; '.join(changed)}): the "
                 "settings are the same, but the result may differ from an uninterrupted run "
                 "in the last bits")
    return now


class RunDirInUse(OSError):
    """Another process holds the run directory's lock."""


_LOCKS: dict[Path, Any] = {}


def lock_run_dir(path: Path) -> None:
    """Hold the advisory lock of run directory `path` for this process
    (a no-op if it already does, or without `fcntl`).

    Raises:
      RunDirInUse: another process holds it (named in the message).
    """
    key = Path(path).resolve()
    if key in _LOCKS:
        return
    try:
        import fcntl
    except ImportError:  # no advisory locks here (Windows)
        return
    f = open(key / LOCK_FILE, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise RunDirInUse(f"{path} is in use by {holder}; wait for that run to end, or choose "
                          "another --out") from None
    f.seek(0)
    f.truncate()
    f.write(f"process {os.getpid()} on {socket.gethostname()} "
            f"({' '.join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:160]})")
    f.flush()
    _LOCKS[key] = f


def unlock_run_dir(path: Path) -> None:
    """Release this process's lock of `path` (if it holds one)."""
    f = _LOCKS.pop(Path(path).resolve(), None)
    if f is not None:
        import fcntl

        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        f.close()


def write_jsonl_atomic(path: Path, rows: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def _canonical(x: Any) -> str:
    return json.dumps(x, sort_keys=True, default=str)


def _short(x: Any, limit: int = 60) -> str:
    s = json.dumps(x, sort_keys=True, default=str)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def identity_changes(old: dict, new: dict) -> list[str]:
    """`"name (old -> new)"` for each identity key whose value differs
    (a key present on one side only counts as a change)."""
    out = []
    for k in sorted(set(old) | set(new)):
        if k not in old:
            out.append(f"{k} (absent -> {_short(new[k])})")
        elif k not in new:
            out.append(f"{k} ({_short(old[k])} -> absent)")
        elif _canonical(old[k]) != _canonical(new[k]):
            out.append(f"{k} ({_short(old[k])} -> {_short(new[k])})")
    return out


def metrics_rows(step: dict, ids: list[dict], returns: Any, wins: Any,
                 metrics: dict) -> list[dict]:
    """One metrics row per run: the `step` fields (`{"update": u}` or
    `{"round": r}`), the run's `ids` (`run` is its index into the
    arrays), the mean evaluation return and win rate over its episodes
    (`returns`/`wins` `[R, episodes]`) and each metric's value (`[R]`)."""
    rows = []
    for ident in ids:
        i = ident["run"]
        row = dict(step, **ident, eval_return=float(np.mean(returns[i])),
                   eval_win_rate=float(np.mean(wins[i])))
        row.update({k: float(v[i]) for k, v in metrics.items()})
        rows.append(row)
    return rows


class RunDir:
    """An opened run directory (see [`open_run_dir`][jaxil.runs.rundir.open_run_dir]).

    Attributes:
      path: the directory.
      checkpointer: its
        [`jaxil.runs.checkpoint.Checkpointer`][jaxil.runs.checkpoint.Checkpointer].
      latest: the newest committed checkpoint step to resume from, or None.
      rows: the metrics rows kept (those at steps `<= latest`).
    """

    def __init__(self, path: Path, checkpointer: Checkpointer, latest: Optional[int],
                 rows: list[dict], step_key: str):
        self.path, self.checkpointer, self.latest = path, checkpointer, latest
        self.rows, self.step_key = rows, step_key

    def append(self, rows: list[dict]) -> None:
        """Append metrics rows (the caller saves the matching checkpoint after)."""
        with open(self.path / "metrics.jsonl", "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)

    def save(self, step: int, state: Any) -> None:
        self.checkpointer.save(step, state)

    def keep_rows(self, rows: list[dict], step: Optional[int]) -> None:
        """Resume from `step` (None: the start) instead of
        [`latest`][jaxil.runs.rundir.RunDir] (a newer checkpoint was damaged,
        or lost rows): keep only `rows` in `metrics.jsonl` and drop the
        newer checkpoints, which the resumed run writes again."""
        self.rows, self.latest = rows, step
        write_jsonl_atomic(self.path / "metrics.jsonl", rows)
        self.checkpointer.drop_after(step)

    def write_results(self, summary: dict) -> None:
        atomic_write_text(self.path / "results.json", json.dumps(summary, indent=2))

    def close(self) -> None:
        try:
            self.checkpointer.close()
        finally:
            unlock_run_dir(self.path)


def holds_run(path: Path) -> bool:
    """Whether `path` holds any of a run's files."""
    if any((path / f).exists() for f in RUN_FILES):
        return True
    ck = path / "checkpoints"
    return ck.is_dir() and any(ck.iterdir())


def check_writable(path: Path, flag: str = "--out") -> None:
    """Create `path` (a directory) and prove it writable, or raise a
    one-line error naming it and the fix."""
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{flag} {path} is a file, not a directory; choose another {flag}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test.{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise PermissionError(f"{flag} {path} is not writable ({e.strerror}); choose a "
                              f"directory you can write to") from None


def check_run_dir(path: str | os.PathLike, *, resume: bool = False,
                  overwrite: bool = False) -> None:
    """What [`open_run_dir`][jaxil.runs.rundir.open_run_dir] refuses before it
    reads any identity: call it before the expensive work (a dataset build) so
    that a bad `--out` fails at once. Creates the directory."""
    if resume and overwrite:
        raise ValueError("--resume and --overwrite exclude each other: resume continues "
                         "the run, overwrite deletes it")
    path = Path(path)
    check_writable(path)
    lock_run_dir(path)
    if holds_run(path) and not (resume or overwrite):
        raise FileExistsError(f"{path} already holds a run; pass --resume to continue it, "
                              "--overwrite to start afresh, or choose another --out")


def open_run_dir(path: str | os.PathLike, identity: dict, *, resume: bool = False,
                 overwrite: bool = False, step_key: str = "update",
                 info: Optional[dict] = None) -> RunDir:
    """Open `path` for a run whose result is determined by `identity`
    (JSON-able; recorded in `run.json` under `"identity"`, with `info`
    beside it for what does not change the result).

    Raises:
      FileExistsError: `path` holds another run and neither `resume` nor
        `overwrite` is given, or `path` is a file.
      ValueError: `resume` with an identity that differs from the recorded
        one (each changed setting listed), or a run without `run.json`.
      PermissionError: `path` cannot be written.
    """
    path = Path(path)
    check_run_dir(path, resume=resume, overwrite=overwrite)
    if overwrite and holds_run(path):
        for f in RUN_FILES:
            (path / f).unlink(missing_ok=True)
        shutil.rmtree(path / "checkpoints", ignore_errors=True)
    run_json = path / "run.json"
    latest, rows = None, []
    if resume and holds_run(path):
        if not run_json.exists():
            raise ValueError(f"{path} holds run files but no run.json, so --resume cannot "
                             "check its settings; pass --overwrite to start afresh")
        try:
            old = json.loads(run_json.read_text()).get("identity")
        except json.JSONDecodeError as e:
            raise ValueError(f"{run_json} is not valid JSON ({e}); pass --overwrite to "
                             "start afresh") from None
        if old is None:
            raise ValueError(f"{run_json} records no identity (written by an older jaxil); "
                             "pass --overwrite to start afresh")
        changes = identity_changes(old, json.loads(_canonical(identity)))
        if changes:
            raise ValueError(f"--resume with settings that differ from the run in {path}: "
                             f"{'; '.join(changes)}. Rerun with the original settings, or "
                             "pass --overwrite (or another --out) to start afresh")
    ckpt = Checkpointer(path / "checkpoints")
    recorded = None
    if resume:
        latest = ckpt.latest_step()
        keep = -1 if latest is None else latest
        rows = [r for r in read_jsonl(path / "metrics.jsonl", report=True) if r[step_key] <= keep]
        if run_json.exists():
            recorded = json.loads(run_json.read_text()).get("versions")
    write_jsonl_atomic(path / "metrics.jsonl", rows)
    versions = check_versions(recorded, path)
    atomic_write_text(run_json, json.dumps(dict(identity=identity, **(info or {}),
                                                versions=versions), indent=2, default=str))
    return RunDir(path, ckpt, latest, rows, step_key)
