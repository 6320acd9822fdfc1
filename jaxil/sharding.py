"""The runs axis on a device mesh: ``jaxil train``/``sweep`` over N devices.

A training run stacks R = grid points × seeds learner states on a leading
runs axis ``[R, ...]`` (:mod:`jaxil.train`). Runs never talk to each other,
so splitting that axis over N devices needs no communication: with a 1-D
``Mesh`` named ``"runs"``, the states are placed with
``NamedSharding(mesh, P("runs"))``, the dataset is replicated (``P()``), and
the chunk and evaluation are jitted with those in/out shardings, so each
device trains and evaluates its own R/N runs.

Padding. R is padded up to a multiple of N by repeating the last run's state
(the padded runs train as copies of it and are thrown away). Only the real R
runs ever leave the devices: :meth:`RunsLayout.gather` (metrics, health,
evaluation) and :meth:`RunsLayout.checkpoint_view` (what is saved) both cut
the runs axis to R, so padded runs never reach metrics rows, results.json or
a checkpoint.

Checkpoints hold exactly the R real runs, the same arrays an unsharded run
saves, so a checkpoint does not depend on the device count: ``jaxil eval``
restores it on one device, and a run may be resumed on another number of
devices. When N divides R the sharded state is saved as it is (each device
writes its runs) and restored straight into ``P("runs")``; otherwise the R
runs are gathered (replicated) to save, restored replicated and re-padded.

N counts ``jax.devices()``: in one process its local devices, after
:func:`jax.distributed.initialize` the devices of all processes.
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


def num_devices(requested: Optional[int], num_runs: int) -> int:
    """The device count a run uses: ``requested`` (checked), or by default all
    devices, but no more than there are runs. A multi-process run uses all
    devices of all processes (each process must hold part of the mesh).

    Raises:
      ValueError: ``requested`` is < 1, more than the devices there are, or
        more than ``num_runs`` (a device would train only padding); in a
        multi-process run, anything but all devices, or fewer runs than
        devices.
    """
    avail = jax.device_count()
    if jax.process_count() > 1:  # every process must hold part of the mesh
        procs = jax.process_count()
        if requested not in (None, avail):
            raise ValueError(f"--devices {requested}: a run of {procs} processes uses all their "
                             f"{avail} devices; drop --devices or pass --devices {avail}")
        if num_runs < avail:
            raise ValueError(f"{num_runs} runs are fewer than the {avail} devices of the {procs} "
                             "processes; train at least one run per device (--seeds), or start "
                             "fewer processes")
        return avail
    if requested is None:
        return max(1, min(avail, num_runs))
    if not 1 <= requested <= avail:
        raise ValueError(f"--devices {requested}: there {'is' if avail == 1 else 'are'} {avail} "
                         f"{jax.default_backend()} device{'s' if avail != 1 else ''}; pass "
                         f"--devices between 1 and {avail}")
    if requested > num_runs:
        raise ValueError(f"--devices {requested} is more than the {num_runs} runs (grid points × "
                         f"seeds); each device needs a run of its own: pass --devices <= "
                         f"{num_runs}, or more --seeds")
    return requested


def make_mesh(n: int) -> Mesh:
    """A 1-D mesh ``("runs",)`` over the first ``n`` of ``jax.devices()``."""
    avail = jax.devices()
    if not 1 <= n <= len(avail):
        raise ValueError(f"a mesh of {n} devices was asked for, but there are {len(avail)} "
                         f"{jax.default_backend()} devices; use 1 to {len(avail)}")
    return Mesh(np.array(avail[:n]), (RUNS,))


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
    """R real runs on a mesh, padded to ``padded`` (a multiple of the mesh size)."""

    mesh: Mesh
    num_runs: int

    @property
    def size(self) -> int:
        return self.mesh.devices.size

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
        """Stacked states ``[R, ...]`` (host or one device) -> padded ``[R', ...]``
        sharded over the runs axis."""
        return jax.tree.map(lambda x: _place_host(_pad_host(np.asarray(x), self.padded),
                                                  self.runs), states)

    def replicate(self, tree: Any) -> Any:
        """A copy of ``tree`` (the dataset, an evaluation key) on every device."""
        return jax.tree.map(lambda x: _place_host(x, self.replicated), tree)

    def gather(self, tree: Any) -> Any:
        """The real runs of a sharded ``[R', ...]`` tree, as numpy ``[R, ...]``."""
        return jax.tree.map(np.asarray, self._cut(self.replicated)(tree))

    def checkpoint_view(self, states: Any) -> Any:
        """What a checkpoint holds: the R real runs, laid out as
        :attr:`checkpoint_sharding`."""
        if self.padded == self.num_runs:
            return states
        return self._cut(self.replicated)(states)

    def from_checkpoint(self, states: Any) -> Any:
        """Restored ``[R, ...]`` (:attr:`checkpoint_sharding`) -> padded and sharded."""
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
