"""The one checkpoint format of jaxil: orbax, through this module.

- [`save_tree`][jaxil.runs.checkpoint.save_tree] / [`restore_tree`][jaxil.runs.checkpoint.restore_tree]: one pytree in one directory, its
  leaves stored as `{"leaf_<i>": array}` in tree order (any container type
  works; zero-size leaves, which orbax refuses, are skipped and rebuilt from
  the template on restore). Teachers' actors and runner states, and the
  teacher policies shipped inside the package, use it.
- [`Checkpointer`][jaxil.runs.checkpoint.Checkpointer]: numbered steps of a whole learner state (all seeds /
  grid points at once) under one directory, of which the manager keeps the
  newest few (`jaxil train`, `jaxil interactive`). Zero-size leaves (a
  box-action environment's `[.., 0]` legal-action mask) are stored as empty
  nodes and rebuilt from the template on restore.
- [`params_digest`][jaxil.runs.checkpoint.params_digest]: a SHA-256 over a pytree's leaves, recorded wherever
  a dataset or a shipped teacher must pin exact weights.

Orbax writes into a temporary directory and renames it when complete, so a
kill mid-save leaves the previous checkpoint loadable.

A save that fails (a full disk, a permission change) raises one
[`CheckpointWriteError`][jaxil.runs.checkpoint.CheckpointWriteError] naming the step, the directory and the fix; the
tracebacks that orbax's background threads log meanwhile are held back (the
exception chains the original error, which `jaxil --debug` shows). A
Ctrl-C during a save keeps them silent too. [`Checkpointer.check_space`][jaxil.runs.checkpoint.Checkpointer.check_space]
refuses a run whose checkpoint cannot fit before any work is done.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp


#: Free space asked for beyond one checkpoint's bytes (metadata, metrics rows).
SPACE_MARGIN_BYTES = 1 << 20


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the message names the step, the
    directory and what to do. Earlier checkpoints are untouched."""


@contextlib.contextmanager
def _quiet_background_errors():
    """Hold back the ERROR records (each with a traceback) that orbax's save
    threads log through absl while a save fails; the failure itself reaches
    the caller as an exception. After a Ctrl-C the records stay held back:
    the process is stopping and the threads' reports would bury its one line.
    """
    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    except KeyboardInterrupt:
        raise
    except BaseException:
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


def save_tree(path: str | os.PathLike, tree: Any) -> None:
    """Save a pytree's (non-empty) leaves with orbax into the directory `path`
    (overwritten if it exists).

    Raises:
      CheckpointWriteError: the write failed (see [`Checkpointer`][jaxil.runs.checkpoint.Checkpointer]).
    """
    leaves = jax.tree.leaves(tree)
    flat = {_leaf_name(i): np.asarray(x) for i, x in enumerate(leaves) if np.size(x) > 0}
    ck = ocp.StandardCheckpointer()
    try:
        with _quiet_background_errors():
            ck.save(os.path.abspath(path), flat, force=True)
            ck.wait_until_finished()
    except Exception as e:  # noqa: BLE001 - orbax re-raises its threads' errors as they were
        raise _write_failure("checkpoint", Path(path).absolute(), e) from e


def restore_tree(path: str | os.PathLike, like: Any) -> Any:
    """Restore what [`save_tree`][jaxil.runs.checkpoint.save_tree] wrote into the structure of `like` (a
    pytree of arrays or `jax.ShapeDtypeStruct`).

    Raises:
      FileNotFoundError: `path` does not exist.
      ValueError: the stored arrays do not match `like` (another config or
        environment wrote them).
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
    try:
        flat = ocp.StandardCheckpointer().restore(path, abstract)
    except Exception as e:  # noqa: BLE001 - re-raised with context
        raise ValueError(
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
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        )

    def latest_step(self) -> Optional[int]:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        """Every committed step, oldest first."""
        return sorted(self.manager.all_steps())

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
        """[`check_space`][jaxil.runs.checkpoint.Checkpointer.check_space] of this directory."""
        check_space(self.directory, state)

    def restore(self, like: Any, step: Optional[int] = None,
                sharding: Optional[jax.sharding.Sharding] = None) -> Any:
        """Restore into the structure, shapes and dtypes of `like`.

        The arrays are placed as `like`'s are (its leaves may be
        `jax.ShapeDtypeStruct` with a `sharding`), or every leaf with
        `sharding` when given: orbax then reads each device's part straight
        into place ([`jaxil.runs.sharding`][jaxil.runs.sharding]). Where a leaf of `like` is an
        uncommitted array (what a freshly initialised state holds), the
        restored one is uncommitted too: orbax returns committed arrays,
        whose programs do not match the persistent compilation cache's
        entries of the original run, so a resumed run recompiled everything.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
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
            damage = self._damage(step, abstract)
            if damage:
                first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
                raise ValueError(f"checkpoint {where} cannot be read: {damage} "
                                 f"({type(e).__name__}: {first})") from e
            raise ValueError(
                f"checkpoint {where} does not match the state this run "
                f"expects ({len(jax.tree.leaves(like))} arrays): it was written with another "
                "learner, network shape, number of runs or environment") from e

    def _damage(self, step: int, abstract: Any) -> Optional[str]:
        """Why a failed restore of `step` is damage rather than another
        state, or None: its metadata is missing or unreadable, or it lists
        exactly the arrays of `abstract` (so the data files are at fault)."""
        path = self.directory / str(step) / "default" / "_METADATA"
        try:
            meta = json.loads(path.read_text())["tree_metadata"]
            stored = sorted(tuple(v["value_metadata"]["write_shape"]) for v in meta.values())
        except (OSError, ValueError, KeyError, TypeError):
            return "its metadata (_METADATA) is missing or damaged"
        want = sorted(tuple(np.shape(x)) for x in jax.tree.leaves(_without_empty(abstract)))
        return "a data file in it is missing or cut short" if stored == want else None

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
