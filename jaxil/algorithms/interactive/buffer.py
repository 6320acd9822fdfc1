"""A fixed-capacity ring buffer of labelled agent-steps, on device.

Every round's kept steps are appended in order; once `capacity` steps are
stored, the oldest are overwritten (a ring, not a reservoir: DAgger's aggregate
is "all rounds" only while it fits, so size the capacity to the label budget —
[`jaxil.algorithms.interactive.loop.run`][jaxil.algorithms.interactive.loop.run]
does). Insertion is one scatter with a static shape, so it runs inside the
round's compiled program.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import struct

from jaxil.envs.core import EnvSpec


@struct.dataclass
class StepBuffer:
    """`obs [C, N, O]`, `avail [C, N, A]`, `actions [C, N(, d)]` (the
    training targets), `ptr` (next write position) and `size` (≤ C)."""

    obs: jax.Array
    avail: jax.Array
    actions: jax.Array
    ptr: jax.Array
    size: jax.Array

    @property
    def capacity(self) -> int:
        return int(self.obs.shape[0])


def empty_buffer(spec: EnvSpec, capacity: int) -> StepBuffer:
    if capacity < 1:
        raise ValueError(f"buffer capacity must be >= 1 step, got {capacity}")
    n = spec.num_agents
    act_shape = (capacity, n) + spec.action.shape
    return StepBuffer(
        obs=jnp.zeros((capacity, n, spec.obs_dim), jnp.float32),
        avail=jnp.zeros((capacity, n, spec.num_actions), jnp.bool_),
        actions=jnp.zeros(act_shape, jnp.int32 if spec.discrete else jnp.float32),
        ptr=jnp.int32(0),
        size=jnp.int32(0),
    )


def insert(buf: StepBuffer, obs: jax.Array, avail: jax.Array, actions: jax.Array,
           keep: jax.Array) -> StepBuffer:
    """Append the rows `keep` selects (`[M]` bool) of `obs [M, N, O]`,
    `avail [M, N, A]`, `actions [M, N(, d)]`, in order. If more than
    `capacity` rows are kept, only the last `capacity` are written."""
    chex.assert_rank(keep, 1)
    chex.assert_equal_shape_prefix([obs, avail, actions, keep], 1)
    C = buf.capacity
    rank = jnp.cumsum(keep.astype(jnp.int32)) - 1
    n = rank[-1] + 1 if keep.shape[0] else jnp.int32(0)
    keep = keep & (rank >= n - C)
    idx = jnp.where(keep, (buf.ptr + rank) % C, C)  # C: out of bounds, dropped
    put = lambda b, x: b.at[idx].set(x.astype(b.dtype), mode="drop")
    return StepBuffer(
        obs=put(buf.obs, obs), avail=put(buf.avail, avail), actions=put(buf.actions, actions),
        ptr=(buf.ptr + n) % C, size=jnp.minimum(buf.size + n, C),
    )


def mixed_draw(key: jax.Array, n_demo: jax.Array, n_buffer: jax.Array, ratio: jax.Array,
               size: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Where each of `size` training samples comes from: `(i_demo,
    i_buffer, from_demo)`, each `[size]`. A sample is the demonstration
    `i_demo` with probability ρ (`ratio`, or `n_demo / (n_demo +
    n_buffer)` when it is −1, i.e. uniform over the union), else the buffer
    entry `i_buffer`; all from the demonstrations while the buffer is
    empty, all from the buffer when there are no demonstrations."""
    kd, kb, kc = jax.random.split(key, 3)
    i_d = jax.random.randint(kd, (size,), 0, jnp.maximum(n_demo, 1))
    i_b = jax.random.randint(kb, (size,), 0, jnp.maximum(n_buffer, 1))
    rho = jnp.where(ratio < 0, n_demo / jnp.maximum(n_demo + n_buffer, 1), ratio)
    rho = jnp.where(n_buffer == 0, 1.0, jnp.where(n_demo == 0, 0.0, rho))
    return i_d, i_b, jax.random.uniform(kc, (size,)) < rho
