"""Runs and batches on a device mesh: `jaxil train`/`sweep` over N × M devices.

A training run stacks R = grid points × seeds learner states on a leading runs
axis `[R, ...]`
([`jaxil.algorithms.offline.train`][jaxil.algorithms.offline.train]). Runs
never talk to each other, so splitting that axis over N devices needs no
communication: on a `Mesh` of axes `("runs", "batch")` (N × 1 unless batches
are split too), the states are placed with `NamedSharding(mesh,
P("runs"))`, the dataset is replicated (`P()`), and the chunk and evaluation
are jitted with those in/out shardings, so each device trains and evaluates its
own R/N runs.

Padding. R is padded up to a multiple of N by repeating the last run's state
(the padded runs train as copies of it and are thrown away). Only the real R
runs ever leave the devices:
[`RunsLayout.gather`][jaxil.runs.sharding.RunsLayout.gather] (metrics, health,
evaluation) and
[`RunsLayout.checkpoint_view`][jaxil.runs.sharding.RunsLayout.checkpoint_view]
(what is saved) both cut the runs axis to R, so padded runs never reach metrics
rows, results.json or a checkpoint.

Checkpoints hold exactly the R real runs, the same arrays an unsharded run
saves, so a checkpoint does not depend on the device count: `jaxil eval`
restores it on one device, and a run may be resumed on another number of
devices. When N divides R the sharded state is saved as it is (each device
writes its runs) and restored straight into `P("runs")`; otherwise the R
runs are gathered (replicated) to save, restored replicated and re-padded.

N counts `jax.devices()`: in one process its local devices, after
`jax.distributed.initialize` the devices of all processes.

Batch sharding (one large run, data-parallel). The mesh is 2-D,
`("runs", "batch")` of N × M devices (M = 1 unless asked for): the states are
split over `runs` and copied over `batch`, and inside each update the sampled
batch is constrained to `P("batch")` on its leading axis
([`constrain_batch`][jaxil.runs.sharding.constrain_batch]). Each of the M
devices then computes the losses of B/M samples, and XLA's partitioner adds the
all-reduce that sums the gradients (and the batch means and normalisers), so
the update is the unsharded one up to float round-off. The batch size must
divide by M.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

RUNS = "runs"
BATCH = "batch"


def num_devices(requested: Optional[int], num_runs: int, batch_devices: int = 1) -> int:
    """The device count the runs axis uses: `requested` (checked), or by
    default all devices (divided by `batch_devices`, which each run's batch
    is split over), but no more than there are runs. A multi-process run
    uses all devices of all processes (each process must hold part of the
    mesh).

    Raises:
      ValueError: `requested` or `batch_devices` is < 1, or they need
        more devices than there are; `requested` is more than
        `num_runs` (a device would train only padding); in a
        multi-process run, anything but all devices, or fewer runs than
        devices.
    """
    avail = jax.device_count()
    backend = jax.default_backend()
    if not 1 <= batch_devices <= avail:
        raise ValueError(f"--batch-devices {batch_devices}: there {'is' if avail == 1 else 'are'} "
                         f"{avail} {backend} device{'s' if avail != 1 else ''}; pass "
                         f"--batch-devices between 1 and {avail}")
    per_run = avail // batch_devices  # runs-axis devices available
    if jax.process_count() > 1:  # every process must hold part of the mesh
        procs = jax.process_count()
        if avail % batch_devices:
            raise ValueError(f"--batch-devices {batch_devices} does not divide the {avail} devices "
                             f"of the {procs} processes; pass a divisor of {avail}")
        if requested not in (None, per_run):
            raise ValueError(f"--devices {requested}: a run of {procs} processes uses all their "
                             f"{avail} devices ({per_run} for runs × {batch_devices} for batches); "
                             f"drop --devices or pass --devices {per_run}")
        if num_runs < per_run:
            raise ValueError(f"{num_runs} runs are fewer than the {per_run} runs-axis devices of "
                             f"the {procs} processes; train at least one run per device "
                             "(--seeds), or start fewer processes")
        return per_run
    if requested is None:
        return max(1, min(per_run, num_runs))
    if requested < 1 or requested * batch_devices > avail:
        extra = f" × --batch-devices {batch_devices}" if batch_devices > 1 else ""
        raise ValueError(f"--devices {requested}{extra}: there {'is' if avail == 1 else 'are'} "
                         f"{avail} {backend} device{'s' if avail != 1 else ''}; pass "
                         f"--devices between 1 and {per_run}")
    if requested > num_runs:
        raise ValueError(f"--devices {requested} is more than the {num_runs} runs (grid points × "
                         f"seeds); each device needs a run of its own: pass --devices <= "
                         f"{num_runs}, or more --seeds")
    return requested


def make_mesh(n: int, batch: int = 1) -> Mesh:
    """A `("runs", "batch")` mesh of `n` × `batch` of `jax.devices()`."""
    avail = jax.devices()
    if n < 1 or batch < 1 or n * batch > len(avail):
        raise ValueError(f"a mesh of {n * batch} devices was asked for, but there are {len(avail)} "
                         f"{jax.default_backend()} devices; use 1 to {len(avail)}")
    return Mesh(np.array(avail[:n * batch]).reshape(n, batch), (RUNS, BATCH))


def check_batch_split(batch_size: int, batch_devices: int) -> None:
    """Refuse a batch that does not split evenly over `batch_devices`."""
    if batch_size % batch_devices:
        raise ValueError(f"--batch-size {batch_size} does not split over --batch-devices "
                         f"{batch_devices}; pass a batch size that is a multiple of "
                         f"{batch_devices}")


def constrain_batch(batch: Any, mesh: Mesh, batch_size: int) -> Any:
    """Inside a jitted update: place every array of a sampled `batch` whose
    leading axis is the batch (length `batch_size`) on `P("batch")`.

    Other arrays are left to the partitioner: a PRNG key (`uint32` raw or a
    typed key, which is never split) and anything of another leading size.
    Under `vmap(..., spmd_axis_name="runs")` the runs axis goes on top.
    """
    if mesh.shape[BATCH] == 1:
        return batch
    split = NamedSharding(mesh, P(BATCH))

    def place(x):
        if (getattr(x, "ndim", 0) == 0 or x.shape[0] != batch_size or x.dtype == jnp.uint32
                or jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)):
            return x
        return jax.lax.with_sharding_constraint(x, split)

    return jax.tree.map(place, batch)


def _pad_host(x: np.ndarray, total: int) -> np.ndarray:
    extra = total - x.shape[0]
    return x if extra == 0 else np.concatenate([x, np.repeat(x[-1:], extra, axis=0)])


def _place_host(x: Any, sharding: NamedSharding) -> jax.Array:
    # make_array_from_callback works across processes as well (each process
    # fills only its own devices), where device_put of a host array may not.
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


@dataclasses.dataclass(frozen=True)
class RunsLayout:
    """R real runs on a mesh, padded to `padded` (a multiple of the mesh size)."""

    mesh: Mesh
    num_runs: int

    @property
    def size(self) -> int:
        """Devices along the runs axis (each run's batch may span more)."""
        return self.mesh.shape[RUNS]

    @property
    def padded(self) -> int:
        return -(-self.num_runs // self.size) * self.size

    @property
    def runs(self) -> NamedSharding:
        return NamedSharding(self.mesh, P(RUNS))

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    @property
    def checkpoint_sharding(self) -> NamedSharding:
        """How the R real runs are laid out when saved and restored."""
        return self.runs if self.padded == self.num_runs else self.replicated

    def place(self, states: Any) -> Any:
        """Stacked states `[R, ...]` (host or one device) -> padded `[R', ...]`
        sharded over the runs axis."""
        return jax.tree.map(lambda x: _place_host(_pad_host(np.asarray(x), self.padded),
                                                  self.runs), states)

    def replicate(self, tree: Any) -> Any:
        """A copy of `tree` (the dataset, an evaluation key) on every device."""
        return jax.tree.map(lambda x: _place_host(x, self.replicated), tree)

    def gather(self, tree: Any) -> Any:
        """The real runs of a sharded `[R', ...]` tree, as numpy `[R, ...]`."""
        return jax.tree.map(np.asarray, self._cut(self.replicated)(tree))

    def checkpoint_view(self, states: Any) -> Any:
        """What a checkpoint holds: the R real runs, laid out as
        [`checkpoint_sharding`][jaxil.runs.sharding.RunsLayout.checkpoint_sharding]."""
        if self.padded == self.num_runs:
            return states
        return self._cut(self.replicated)(states)

    def from_checkpoint(self, states: Any) -> Any:
        """Restored `[R, ...]`
        ([`checkpoint_sharding`][jaxil.runs.sharding.RunsLayout.checkpoint_sharding])
        -> padded and sharded."""
        if self.padded == self.num_runs:
            return states
        return _pad_fn(self.padded, self.runs)(states)

    def _cut(self, out: NamedSharding):
        return _cut_fn(self.num_runs, out)


@functools.lru_cache(maxsize=32)
def _cut_fn(num_runs: int, out: NamedSharding):
    return jax.jit(lambda t: jax.tree.map(lambda x: x[:num_runs], t), out_shardings=out)


@functools.lru_cache(maxsize=32)
def _pad_fn(total: int, out: NamedSharding):
    def pad(t):
        return jax.tree.map(
            lambda x: jnp.concatenate([x, jnp.repeat(x[-1:], total - x.shape[0], axis=0)]), t)

    return jax.jit(pad, out_shardings=out)
