"""The one checkpoint format of jaxil: orbax, through this module.

- [`save_tree`][jaxil.runs.checkpoint.save_tree] /
  [`restore_tree`][jaxil.runs.checkpoint.restore_tree]: one pytree in one
  directory, its leaves stored as `{"leaf_<i>": array}` in tree order (any
  container type works; zero-size leaves, which orbax refuses, are skipped and
  rebuilt from the template on restore). Teachers' actors and runner states,
  and the teacher policies shipped inside the package, use it.
- [`Checkpointer`][jaxil.runs.checkpoint.Checkpointer]: numbered steps of a
  whole learner state (all seeds / grid points at once) under one directory, of
  which the manager keeps the newest few (`jaxil train`, `jaxil interactive`).
  Zero-size leaves (a box-action environment's `[.., 0]` legal-action mask) are
  stored as empty nodes and rebuilt from the template on restore.
- [`params_digest`][jaxil.runs.checkpoint.params_digest]: a SHA-256 over a
  pytree's leaves, recorded wherever a dataset or a shipped teacher must pin
  exact weights.

Orbax writes into a temporary directory and renames it when complete, so a
kill mid-save leaves the previous checkpoint loadable.

A read that fails says why in one line:
[`CheckpointDamaged`][jaxil.runs.checkpoint.CheckpointDamaged] (a file is
missing or cut short) or
[`CheckpointMismatch`][jaxil.runs.checkpoint.CheckpointMismatch] (the files
are intact but hold another state: the run's settings changed after it was
written). [`restore_newest_intact`][jaxil.runs.checkpoint.restore_newest_intact]
passes a damaged checkpoint over for the newest one that reads; `--resume`
and `jaxil eval` both go through it.

A save that fails (a full disk, a permission change) raises one
[`CheckpointWriteError`][jaxil.runs.checkpoint.CheckpointWriteError] naming the
step, the directory and the fix; the tracebacks that orbax's background threads
log meanwhile are held back (the exception chains the original error, which
`jaxil --debug` shows). A Ctrl-C during a save keeps them silent too.
[`Checkpointer.check_space`][jaxil.runs.checkpoint.Checkpointer.check_space]
refuses a run whose checkpoint cannot fit before any work is done.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp


#: Free space asked for beyond one checkpoint's bytes (metadata, metrics rows).
SPACE_MARGIN_BYTES = 1 << 20


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the message names the step, the
    directory and what to do. Earlier checkpoints are untouched."""


class CheckpointDamaged(ValueError):
    """A checkpoint's files are missing or cut short (a crash, a full disk, a
    deleted file): its state cannot be read, and an older one may be.

    Attributes:
      path: the checkpoint's directory.
      reason: what is wrong with it, in a few words.
    """

    def __init__(self, path: Path, reason: str, cause: BaseException, fix: str = ""):
        self.path, self.reason, self.cause = path, reason, cause
        super().__init__(f"checkpoint {path} cannot be read: {reason} ({_first_line(cause)})"
                         + (f"; {fix}" if fix else ""))


class CheckpointMismatch(ValueError):
    """A checkpoint is intact but holds another state than the one asked
    for (the run's settings were changed after it was written); no other
    checkpoint of the run can match either."""


def _first_line(e: Optional[BaseException]) -> str:
    """`Type: first line of the message` (160 characters at most)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160]}" if text else type(e).__name__


def _from_orbax(obj: Any) -> bool:
    """Whether `obj` (a coroutine, a task or a future's repr) is orbax's."""
    code = getattr(obj, "cr_code", None) or getattr(getattr(obj, "get_coro", lambda: None)(),
                                                    "cr_code", None)
    return "orbax" in (code.co_filename if code is not None else repr(obj))


def _raised_in_orbax(exc: Optional[BaseException]) -> bool:
    """Whether a frame of `exc`'s traceback is orbax's or tensorstore's."""
    tb = getattr(exc, "__traceback__", None)
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if "orbax" in name or "tensorstore" in name:
            return True
        tb = tb.tb_next
    return False


class _OrbaxTaskFilter(logging.Filter):
    """Drops asyncio's "Task (or Future) exception was never retrieved" for
    orbax's reads and writes: a task whose coroutine is orbax's, or a future
    whose exception was raised in orbax's code (the thread of a failed write,
    which names no orbax object in the message)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).split("\n", 1)[0].endswith(" exception was never retrieved"):
            return True
        text = record.getMessage()
        if "orbax" in text or "tensorstore" in text:
            return False
        return not _raised_in_orbax(record.exc_info[1] if record.exc_info else None)


_TASK_FILTER = _OrbaxTaskFilter()


def _hush_closed_loop_reports() -> None:
    """Drop what a failed orbax read or write reports after its one-line error.

    When a write fails, the futures of the step's other writes that failed
    too are left unretrieved. Each reports its traceback on the `asyncio`
    logger whenever it is garbage-collected: long after the one line, or
    even inside another library's `compile()` of Python source, which on
    Python 3.11 then raises `SystemError: AST constructor recursion depth
    mismatch` (formatting the traceback parses source too).

    When a read fails, orbax closes its asyncio loop while tensorstore still
    completes the other reads of the step; each completion then reports a
    `RuntimeError: Event loop is closed` through `sys.unraisablehook`, and
    the reads' unfinished tasks and coroutines report again when they are
    collected ("Task exception was never retrieved" on the `asyncio`
    logger, "Exception ignored in: <coroutine ...>"), a traceback apiece,
    around and after the one line that says what is wrong, even in the
    middle of the training a resume goes on with.

    Only those reports are dropped; every other one reaches the hook
    installed before.
    """
    log = logging.getLogger("asyncio")
    if _TASK_FILTER not in log.filters:
        log.addFilter(_TASK_FILTER)
    previous = sys.unraisablehook
    if getattr(previous, "jaxil_hushes_closed_loops", False):
        return

    def hook(report):
        closed = isinstance(report.exc_value, RuntimeError) and \
            str(report.exc_value) == "Event loop is closed"
        if closed or _from_orbax(report.object):
            return
        previous(report)

    hook.jaxil_hushes_closed_loops = True
    sys.unraisablehook = hook


def _damage(path: Path, abstract: Any) -> Optional[str]:
    """Why a failed read of the orbax tree in directory `path` is damage
    rather than another state, or None: its metadata is missing or
    unreadable, or it lists exactly the arrays of `abstract` (so the data
    files are at fault)."""
    try:
        meta = json.loads((path / "_METADATA").read_text())["tree_metadata"]
        values = [v["value_metadata"] for v in meta.values()]
        stored = [v.get("write_shape") for v in values if not v.get("skip_deserialize")]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "its metadata (_METADATA) is missing or damaged"
    want = collections.Counter(tuple(np.shape(x)) for x in jax.tree.leaves(abstract))
    # numpy leaves (save_tree's) record no shape: their number must match
    known = collections.Counter(tuple(w) for w in stored if w is not None)
    same = len(stored) == sum(want.values()) and not known - want
    return "a data file in it is missing or cut short" if same else None


def restore_newest_intact(checkpoints: Any, restore: Callable[[int], Any], latest: int, *,
                          describe: Callable[[int], str] = lambda s: f"step {s}",
                          using: str = "resuming from",
                          fix: str = "pass --overwrite to start afresh",
                          ) -> tuple[Any, int, Optional[str]]:
    """`(state, step, notice)` from the newest checkpoint at or before
    `latest` that can be read: what `--resume` and `jaxil eval` both use.

    `checkpoints` lists the steps (`all_steps()`) and names the place
    (`directory`); `restore(step)` reads one. A damaged checkpoint
    ([`CheckpointDamaged`][jaxil.runs.checkpoint.CheckpointDamaged]) is passed
    over for the next older one, and `notice` is then one line naming the
    step passed over, why, and the step taken (`using` says what is done
    with it); None when `latest` itself was read. `describe` names a step
    as the run does (`"update 400"`).

    Raises:
      CheckpointMismatch: an intact checkpoint holds another state (older
        ones are not tried: they were written by the same settings).
      CheckpointDamaged: no checkpoint can be read; the message ends with
        `fix`.
      ValueError: another failure to read, as one line.
    """
    _hush_closed_loop_reports()
    older = getattr(checkpoints, "all_steps", list)()
    steps = [latest] + sorted((s for s in older if s < latest), reverse=True)
    where = getattr(checkpoints, "directory", "the run directory")
    first: Optional[BaseException] = None
    for step in steps:
        try:
            state = restore(step)
        except CheckpointMismatch:
            raise
        except Exception as e:  # noqa: BLE001 - orbax raises bare Exceptions for damaged files
            first = first or e
            continue
        notice = None
        if step != latest:
            why = first.reason if isinstance(first, CheckpointDamaged) else _first_line(first)
            notice = (f"checkpoint {describe(latest)} in {where} cannot be read "
                      f"({why}); {using} the intact {describe(step)}")
        return state, step, notice
    older = " and no older one is intact" if len(steps) > 1 else ""
    if isinstance(first, CheckpointDamaged):
        raise CheckpointDamaged(first.path, first.reason + older, first.cause, fix) from first
    raise ValueError(f"no checkpoint in {where} can be read (the newest, "
                     f"{describe(latest)}: {_first_line(first)}); {fix}") from first


@contextlib.contextmanager
def _quiet_background_errors():
    """Hold back the ERROR records (each with a traceback) that orbax's save
    threads log through absl while a save fails; the failure itself reaches
    the caller as an exception. After a Ctrl-C the records stay held back:
    the process is stopping and the threads' reports would bury its one line.
    After any failure the unretrieved futures' later reports are dropped too
    (`_hush_closed_loop_reports`).
    """
    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    except KeyboardInterrupt:
        _hush_closed_loop_reports()
        raise
    except BaseException:
        _hush_closed_loop_reports()
        log.setLevel(level)
        raise
    else:
        log.setLevel(level)


def _write_failure(what: str, where: Path, e: BaseException) -> CheckpointWriteError:
    """One-line error for a failed checkpoint write, from orbax's exception."""
    text = str(e)
    full = isinstance(e, OSError) and e.errno == errno.ENOSPC or (
        "No space left on device" in text or "os_error_code='28'" in text)
    if full:
        reason = "the disk is full"
        fix = "free some space (or move the run directory) and continue with --resume"
    else:
        first = (text.strip().splitlines() or [type(e).__name__])[0][:200]
        reason = f"{type(e).__name__}: {first}"
        fix = "check the directory and the disk, then continue with --resume"
    return CheckpointWriteError(
        f"could not write {what} to {where}: {reason} (the earlier checkpoints are kept); {fix}")


def check_space(directory: str | os.PathLike, state: Any) -> None:
    """Refuse, before any work, a directory without room for one more
    checkpoint of `state`: its arrays' bytes plus `SPACE_MARGIN_BYTES`
    (an old step is deleted only after the new one is complete).

    Raises:
      CheckpointWriteError: naming the sizes, the directory and the fix.
    """
    need = sum(int(np.prod(np.shape(x))) * np.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(state)) + SPACE_MARGIN_BYTES
    path = Path(directory)
    while not path.exists() and path != path.parent:
        path = path.parent
    free = shutil.disk_usage(path).free
    if free < need:
        raise CheckpointWriteError(
            f"not enough free space for checkpoints in {directory}: one needs about "
            f"{need / 2**20:.1f} MiB and {free / 2**20:.1f} MiB are free; free some space "
            "or choose another --out")


def _leaf_name(i: int) -> str:
    return f"leaf_{i:05d}"


def _tree_checkpointer() -> ocp.Checkpointer:
    """Orbax's synchronous checkpointer of one pytree. jaxil waits for every
    save anyway; the asynchronous one, when its temporary directory cannot be
    made (a file in the way, a permission change), left threads waiting for
    that directory that held the exiting process for orbax's 300 s timeout."""
    return ocp.Checkpointer(ocp.StandardCheckpointHandler())


def save_tree(path: str | os.PathLike, tree: Any) -> None:
    """Save a pytree's (non-empty) leaves with orbax into the directory `path`
    (overwritten if it exists).

    Raises:
      CheckpointWriteError: the write failed (see
        [`Checkpointer`][jaxil.runs.checkpoint.Checkpointer]).
    """
    leaves = jax.tree.leaves(tree)
    flat = {_leaf_name(i): np.asarray(x) for i, x in enumerate(leaves) if np.size(x) > 0}
    ck = _tree_checkpointer()
    try:
        with _quiet_background_errors():
            ck.save(os.path.abspath(path), flat, force=True)
    except Exception as e:  # noqa: BLE001 - orbax re-raises its threads' errors as they were
        raise _write_failure("checkpoint", Path(path).absolute(), e) from e


def restore_tree(path: str | os.PathLike, like: Any) -> Any:
    """Restore what [`save_tree`][jaxil.runs.checkpoint.save_tree] wrote into
    the structure of `like` (a pytree of arrays or `jax.ShapeDtypeStruct`).

    Raises:
      FileNotFoundError: `path` does not exist.
      CheckpointDamaged: a file of it is missing or cut short.
      CheckpointMismatch: the stored arrays do not match `like` (another
        config or environment wrote them).
    """
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    leaves, treedef = jax.tree.flatten(like)
    abstract = {
        _leaf_name(i): jax.ShapeDtypeStruct(tuple(np.shape(x)), np.dtype(x.dtype))
        for i, x in enumerate(leaves)
        if np.prod(np.shape(x), dtype=np.int64) > 0
    }
    _hush_closed_loop_reports()
    try:
        flat = _tree_checkpointer().restore(path, abstract)
    except Exception as e:  # noqa: BLE001 - re-raised with context
        damage = _damage(Path(path), abstract)
        if damage:
            raise CheckpointDamaged(Path(path), damage, e) from e
        raise CheckpointMismatch(
            f"checkpoint {path} does not match the expected structure "
            f"({len(abstract)} arrays); was it written with another config or env?"
        ) from e
    out = [
        jnp.asarray(flat[_leaf_name(i)]) if _leaf_name(i) in flat
        else jnp.zeros(np.shape(x), x.dtype)
        for i, x in enumerate(leaves)
    ]
    return jax.tree.unflatten(treedef, out)


def params_digest(params: Any) -> str:
    """SHA-256 over a parameter pytree's leaves (dtype, shape and bytes, in
    tree order): pins exact weights, even if a run directory is later
    overwritten."""
    h = hashlib.sha256()
    for x in jax.tree.leaves(params):
        a = np.ascontiguousarray(np.asarray(x))
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.reshape(-1).view(np.uint8))
    return h.hexdigest()


def _without_empty(tree: Any) -> Any:
    """`tree` with every zero-size leaf replaced by `None` (orbax refuses to
    save zero-size arrays; `None` is an empty node it keeps)."""
    leaves, treedef = jax.tree.flatten(tree)
    return jax.tree.unflatten(treedef, [None if np.size(x) == 0 else x for x in leaves])


def _refill_empty(restored: Any, like: Any) -> Any:
    """Undo `_without_empty`: zero-size leaves of `like` come back as
    zeros of their shape and dtype, the others from `restored`. Both trees
    are read with `None` as an item, so a field that is None in `like`
    (an environment state without a goal) keeps the two aligned."""
    is_none = lambda x: x is None  # noqa: E731
    items, treedef = jax.tree.flatten(like, is_leaf=is_none)
    got = jax.tree.leaves(restored, is_leaf=is_none)
    return jax.tree.unflatten(treedef, [
        None if x is None else jnp.zeros(np.shape(x), x.dtype) if np.size(x) == 0 else g
        for x, g in zip(items, got, strict=True)])


def _place_like(x: Any, template: Any) -> Any:
    """`x` uncommitted where `template` is an uncommitted array, else as it is."""
    if isinstance(template, jax.Array) and not template.committed and x.committed:
        return jnp.asarray(np.asarray(x))
    return x


class Checkpointer:
    """Numbered checkpoints of a whole state under `directory/<step>/`."""

    def __init__(self, directory: str | Path, max_to_keep: int = 2):
        self.directory = Path(directory).absolute()
        self._failed = False
        self.manager = ocp.CheckpointManager(
            self.directory,
            # synchronous: each save is waited for, and an asynchronous one
            # whose step directory cannot be made held the exiting process
            # for orbax's 300 s timeout (see _tree_checkpointer)
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                                 enable_async_checkpointing=False),
        )

    def latest_step(self) -> Optional[int]:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        """Every committed step, oldest first."""
        return sorted(self.manager.all_steps())

    def drop_after(self, step: Optional[int]) -> None:
        """Delete every step newer than `step` (all of them for None): a run
        resumed from an older step writes them again, and orbax would skip
        a save at a step it already holds."""
        for s in self.all_steps():
            if step is None or s > step:
                self.manager.delete(s)

    def save(self, step: int, state: Any) -> None:
        """Write `state` as `step` and wait until it is complete.

        Raises:
          CheckpointWriteError: the write failed (a full disk, permissions);
            the steps saved before are kept.
        """
        try:
            with _quiet_background_errors():
                self.manager.save(step, args=ocp.args.StandardSave(_without_empty(state)))
                self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - orbax re-raises its threads' errors as they were
            self._failed = True
            raise _write_failure(f"checkpoint {step}", self.directory, e) from e

    def check_space(self, state: Any) -> None:
        """[`check_space`][jaxil.runs.checkpoint.Checkpointer.check_space] of
        this directory."""
        check_space(self.directory, state)

    def restore(self, like: Any, step: Optional[int] = None,
                sharding: Optional[jax.sharding.Sharding] = None) -> Any:
        """Restore into the structure, shapes and dtypes of `like`.

        The arrays are placed as `like`'s are (its leaves may be
        `jax.ShapeDtypeStruct` with a `sharding`), or every leaf with
        `sharding` when given: orbax then reads each device's part straight
        into place ([`jaxil.runs.sharding`][jaxil.runs.sharding]). Where a leaf
        of `like` is an uncommitted array (what a freshly initialised state
        holds), the restored one is uncommitted too: orbax returns committed
        arrays, whose programs do not match the persistent compilation cache's
        entries of the original run, so a resumed run recompiled everything.

        Raises:
          FileNotFoundError: the directory holds no checkpoint.
          CheckpointDamaged: a file of the step is missing or cut short.
          CheckpointMismatch: the step is intact but holds another state.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        _hush_closed_loop_reports()
        if sharding is None:
            abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        else:
            abstract = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding), like)
        try:
            got = self.manager.restore(step, args=ocp.args.StandardRestore(_without_empty(abstract)))
            got = _refill_empty(got, like)
            if sharding is None:
                got = jax.tree.map(_place_like, got, like)
            return got
        except Exception as e:  # noqa: BLE001 - orbax raises bare Exceptions for damaged files
            where = self.directory / str(step)
            damage = _damage(where / "default", _without_empty(abstract))
            if damage:
                raise CheckpointDamaged(where, damage, e) from e
            raise CheckpointMismatch(
                f"checkpoint {where} is intact, but it holds another state than the run's "
                f"run.json describes ({len(jax.tree.leaves(like))} arrays expected): run.json "
                "was changed after training (another learner, network shape, number of runs "
                "or environment), or another jaxil wrote it; restore the run.json that trained "
                "it (the checkpoints are good, keep them)") from e

    def close(self) -> None:
        """Finish pending work and release the manager. After a failed save
        the manager's repeat of that failure is dropped (it was raised
        once already)."""
        try:
            with _quiet_background_errors():
                self.manager.close()
        except Exception as e:  # noqa: BLE001 - see save
            if not self._failed:
                raise _write_failure("pending checkpoints", self.directory, e) from e
