"""Several processes training one sharded run: `jax.distributed` set-up.

With `jax.distributed.initialize`, `jax.devices()` lists the devices of every
process, and the runs mesh of [`jaxil.runs.sharding`][jaxil.runs.sharding]
spans them all: each process trains the runs on its own devices, every process
runs the same program, and the metrics are gathered to all. Process 0 alone
writes the run directory (`run.json`, `metrics.jsonl`, `results.json`,
TensorBoard) and prints; orbax checkpoints are written by all processes
together (each saves the runs on its own devices; replicated arrays are written
once).

A run is multi-process when given `--coordinator HOST:PORT
--num-processes N --process-id I`, or the variables
`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID`, or
inside a SLURM or Open MPI job of more than one task (JAX reads those
itself); otherwise it is one process and nothing here does anything. On CPU
the processes talk through gloo (`jax_cpu_collectives_implementation`).

`jax.distributed.initialize` must run before JAX first touches a device, and
importing the environments already does (JaxMARL builds arrays at import), so
[`initialize_from_argv`][jaxil.runs.distributed.initialize_from_argv] runs
first thing in a program, before `envs` or `jaxil.algorithms.offline.train` are
imported.
"""

from __future__ import annotations

import argparse
import os
from typing import Optional, Sequence

import jax

_FLAGS = ("--coordinator", "--num-processes", "--process-id")


def add_flags(p: argparse.ArgumentParser) -> None:
    """The multi-process flags (for `--help`;
    [`initialize_from_argv`][jaxil.runs.distributed.initialize_from_argv] reads
    them)."""
    g = p.add_argument_group("multi-process run (jax.distributed)")
    g.add_argument("--coordinator", metavar="HOST:PORT", default=None,
                   help="process 0's address; with --num-processes and --process-id (or "
                        "JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID; SLURM "
                        "and Open MPI jobs are detected)")
    g.add_argument("--num-processes", metavar="N", type=int, default=None)
    g.add_argument("--process-id", metavar="I", type=int, default=None)


def initialize_from_argv(argv: Sequence[str]) -> list[str]:
    """Take the multi-process flags out of `argv` (wherever they stand),
    initialize from them or from the environment
    ([`initialize_from_env`][jaxil.runs.distributed.initialize_from_env]), and
    return the other arguments."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_flags(p)
    known, rest = p.parse_known_args(list(argv))
    initialize_from_env(known.coordinator, known.num_processes, known.process_id)
    return rest


def _multi_task_job() -> Optional[str]:
    """The launcher's name when this process is one of several tasks."""
    if int(os.environ.get("SLURM_STEP_NUM_TASKS", os.environ.get("SLURM_NTASKS", "1"))) > 1:
        return "SLURM"
    if int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
        return "Open MPI"
    return None


def initialize_from_env(coordinator: Optional[str] = None, num_processes: Optional[int] = None,
                        process_id: Optional[int] = None) -> bool:
    """Join a multi-process run when one is asked for (the arguments, else the
    variables, else a multi-task SLURM / Open MPI job); returns whether this
    is a multi-process run.

    Raises:
      ValueError: only some of the three settings are given, or
        `process_id` is outside `[0, num_processes)`.
      RuntimeError: JAX has already started (initialize before importing
        `envs`), or the coordinator cannot be reached.
    """
    if jax.distributed.is_initialized():
        return True
    given = (coordinator, num_processes, process_id)
    source = ", ".join(_FLAGS)
    kwargs: dict = {}
    if all(x is None for x in given):
        env = os.environ
        given = (env.get("JAX_COORDINATOR_ADDRESS"), env.get("JAX_NUM_PROCESSES"),
                 env.get("JAX_PROCESS_ID"))
        source = "JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID"
    if all(x is None for x in given):
        if _multi_task_job() is None:
            return False
    else:
        if any(x is None for x in given):
            raise ValueError(f"a multi-process run needs all of {source}; got "
                             + ", ".join(f"{n} {'unset' if x is None else x}"
                                         for n, x in zip(source.split(", "), given)))
        n, i = int(given[1]), int(given[2])
        if not (n >= 1 and 0 <= i < n):
            raise ValueError(f"process id {i} is outside [0, {n}) for {n} processes ({source})")
        kwargs = dict(coordinator_address=given[0], num_processes=n, process_id=i)
    try:
        jax.distributed.initialize(**kwargs)  # without kwargs JAX reads the job's variables
    except RuntimeError as e:
        if "must be called before" in str(e):
            raise RuntimeError("a multi-process run must join jax.distributed before JAX "
                               "starts: call jaxil.runs.distributed.initialize_from_argv (or "
                               "initialize_from_env) before importing envs or jaxil.algorithms.offline.train") from e
        raise
    return True


def is_writer() -> bool:
    """Whether this process writes run files (process 0 of a multi-process run)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches `name` (nothing to do with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
