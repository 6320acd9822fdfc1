"""On-device batches from a dataset: transitions and trajectory-segment pairs.

Build the device arrays ONCE, outside the training loop:

```python
trans = flatten_transitions(dataset, expert_flags=labels)   # on device
trajs = trajectory_arrays(dataset)
```

then gather inside the jitted update (`batch_size`/`segment_len` are
static Python ints; everything else is traced):

```python
batch = sample_transitions(key, trans, 256)
expert_batch = sample_where(key, trans, 256, trans.expert)
s0_batch = sample_initial_states(key, trans, 256)   # uniform over trajectories
x, y = sample_segment_pairs(key, trajs, 64, segment_len=20)
```

Each sampler is one `tree_map(lambda x: x[idx])` (JAX-CORL style): no host
round trip, no Python loop, vmappable over seeds.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxil.data.format import Dataset


@struct.dataclass
class Transitions:
    """K valid steps of a dataset, flattened (padding never appears).

    Attributes:
      obs: [K, N, O] observations the agents acted on.
      global_state: [K, S].
      avail: [K, N, A] legal-action mask at `obs`.
      actions: [K, N] int32 or [K, N, d] float32.
      reward: [K] team reward.
      next_obs, next_global_state, next_avail: the following step (for the
        last step of a trajectory: the final observation `obs[length]`).
      done: [K] terminal — no bootstrapping past it. A truncated (or cut)
        trajectory's last step is NOT done.
      init_obs, init_global_state, init_avail: step 0 of the same trajectory,
        for the (1 - γ)·E[ν(s0)] term of DICE objectives. Read off a uniform
        transition they weight each trajectory's s0 by its length; draw s0
        uniformly over trajectories with
        [`sample_initial_states`][jaxil.data.sampling.sample_initial_states].
      traj_index: [K] int32 trajectory of each step; step: [K] int32 its time
        (every trajectory has exactly one `step == 0` transition).
      expert: [K] bool labels copied from `expert_flags` per trajectory,
        or None when the data is unlabelled.
    """

    obs: jax.Array
    global_state: jax.Array
    avail: jax.Array
    actions: jax.Array
    reward: jax.Array
    next_obs: jax.Array
    next_global_state: jax.Array
    next_avail: jax.Array
    done: jax.Array
    init_obs: jax.Array
    init_global_state: jax.Array
    init_avail: jax.Array
    traj_index: jax.Array
    step: jax.Array
    expert: Optional[jax.Array] = None

    @property
    def num_transitions(self) -> int:
        return int(self.reward.shape[0])


def flatten_transitions(
    dataset: Dataset, expert_flags: Any = None, device: Any = None
) -> Transitions:
    """All valid steps of `dataset` as a
    [`Transitions`][jaxil.data.sampling.Transitions] on `device`.

    Args:
      dataset: the trajectories.
      expert_flags: optional [M] bool per-trajectory labels (ground truth
        `dataset.expert`, or labels a learner produced). None leaves
        `Transitions.expert` None, so nothing leaks the ground truth by default.
      device: a `jax.Device` or sharding for `jax.device_put` (default device
        if None).
    """
    length = np.asarray(dataset.length)
    M = len(length)
    if M == 0:
        raise ValueError("flatten_transitions needs at least one trajectory")
    traj, step = np.nonzero(np.asarray(dataset.mask))  # row-major: trajectory, then time
    obs = np.asarray(dataset.obs)
    gs = np.asarray(dataset.global_state)
    av = np.asarray(dataset.avail_actions)
    out = dict(
        obs=obs[traj, step],
        global_state=gs[traj, step],
        avail=av[traj, step],
        actions=np.asarray(dataset.actions)[traj, step],
        reward=np.asarray(dataset.reward)[traj, step],
        next_obs=obs[traj, step + 1],
        next_global_state=gs[traj, step + 1],
        next_avail=av[traj, step + 1],
        done=np.asarray(dataset.done)[traj, step],
        init_obs=obs[traj, 0],
        init_global_state=gs[traj, 0],
        init_avail=av[traj, 0],
        traj_index=traj.astype(np.int32),
        step=step.astype(np.int32),
    )
    if expert_flags is not None:
        flags = np.asarray(expert_flags)
        if flags.shape != (M,):
            raise ValueError(
                f"expert_flags must be one bool per trajectory, shape ({M},), got {flags.shape}"
            )
        out["expert"] = flags.astype(np.bool_)[traj]
    return jax.device_put(Transitions(**out), device)


def sample_transitions(key: jax.Array, transitions: Transitions, batch_size: int) -> Transitions:
    """`batch_size` transitions uniformly, with replacement. Jittable
    (`batch_size` static)."""
    return sample_transitions_indexed(key, transitions, batch_size)[0]


def sample_transitions_indexed(
    key: jax.Array, transitions: Transitions, batch_size: int
) -> tuple[Transitions, jax.Array]:
    """[`sample_transitions`][jaxil.data.sampling.sample_transitions] (the same
    draw for the same key) and the `[batch_size]` indices it drew."""
    k = transitions.reward.shape[0]
    idx = jax.random.randint(key, (batch_size,), 0, k)
    return jax.tree.map(lambda x: x[idx], transitions), idx


def stratified_log_ratio(
    is_expert: jax.Array, expert_share: float, num_expert: jax.Array, num_total: int
) -> jax.Array:
    """`log d_U(x)/q(x)` per sample, for a batch drawn from the mixture
    `q = λ·Uniform(D_E) + (1−λ)·Uniform(D_U)` (λ = `expert_share`, D_E ⊂
    D_U, `num_expert` = |D_E| > 0 and `num_total` = |D_U| transitions):

        ρ(x) = (1/K) / (λ·1[x∈D_E]/K_E + (1−λ)/K) = 1 / (λ·1[x∈D_E]·K/K_E + 1 − λ)

    An expert transition is over-drawn, so its ratio is below 1; any other
    transition has `1/(1−λ)`. A batch of λB draws from D_E and (1−λ)B from
    D_U is the stratified form of a draw from q.

    Args:
      is_expert: `[B]` bool, whether each sample lies in D_E.
      expert_share: λ ∈ [0, 1), a Python float.
      num_expert: K_E (traced OK).
      num_total: K.

    Returns:
      `[B]` float32 log ratios.
    """
    if not 0.0 <= expert_share < 1.0:
        raise ValueError(f"expert_share must be in [0, 1), got {expert_share}")
    is_expert = jnp.asarray(is_expert).astype(jnp.float32)
    over = expert_share * jnp.float32(num_total) / jnp.asarray(num_expert, jnp.float32)
    return -jnp.log(is_expert * over + (1.0 - expert_share))


def sample_where(
    key: jax.Array, transitions: Transitions, batch_size: int, weights_or_mask: jax.Array
) -> Transitions:
    """`batch_size` transitions with probability proportional to
    `weights_or_mask` [K] (bool mask or non-negative weights), with replacement.

    Entries with zero weight are never drawn. Inverse-CDF sampling: O(K) for the
    cumulative sum plus O(B log K), never a [B, K] array. At least one weight
    must be positive (checked when the weights are concrete; under jit an
    all-zero mask silently draws the last transition).
    """
    if weights_or_mask is None:
        raise ValueError(
            "weights_or_mask is None: the transitions are unlabelled — pass "
            "expert_flags to flatten_transitions to sample by label"
        )
    w = jnp.asarray(weights_or_mask)
    k = transitions.reward.shape[0]
    if w.shape != (k,):
        raise ValueError(f"weights_or_mask must have shape ({k},), got {w.shape}")
    if not isinstance(w, jax.core.Tracer):
        wn = np.asarray(w)
        if not (wn.astype(np.float64) > 0).any() or (wn.astype(np.float64) < 0).any():
            raise ValueError(
                "weights_or_mask must be non-negative with at least one positive entry"
            )
    w = w.astype(jnp.float32)
    cdf = jnp.cumsum(w)
    r = jax.random.uniform(key, (batch_size,)) * cdf[-1]
    idx = jnp.searchsorted(cdf, r, side="right")
    # Float rounding can land r on the total; clamp to the last positive entry.
    last_positive = k - 1 - jnp.argmax(w[::-1] > 0)
    idx = jnp.minimum(idx, last_positive)
    return jax.tree.map(lambda x: x[idx], transitions)


def initial_state_mask(transitions: Transitions) -> jax.Array:
    """`[K]` bool: the first transition (`step == 0`) of each trajectory,
    one per trajectory."""
    return transitions.step == 0


def sample_initial_states(key: jax.Array, transitions: Transitions, batch_size: int) -> Transitions:
    """`batch_size` trajectories uniformly (with replacement), each as its
    first transition: read `init_obs` / `init_global_state` off the result.

    This is the s0 ∼ p0 of DICE objectives as DemoDICE samples it, one initial
    state per trajectory (Kim et al. 2022; the authors' `lfd_mujoco.py` draws
    indices uniformly over an array of per-trajectory initial states). Taking
    `init_obs` of uniformly drawn *transitions* instead weights every
    trajectory's s0 by its length. Jittable (`batch_size` static); one O(K)
    cumulative sum per call ([`sample_where`][jaxil.data.sampling.sample_where]
    on [`initial_state_mask`][jaxil.data.sampling.initial_state_mask]). Every
    trajectory must keep its `step == 0` transition
    ([`flatten_transitions`][jaxil.data.sampling.flatten_transitions] does).
    """
    return sample_where(key, transitions, batch_size, initial_state_mask(transitions))


@struct.dataclass
class TrajectoryArrays:
    """The per-step fields of a dataset on device, batch-major
    `[M, T(+1), ...]` (what
    [`sample_segment_pairs`][jaxil.data.sampling.sample_segment_pairs] gathers
    from)."""

    obs: jax.Array  # [M, T+1, N, O]
    global_state: jax.Array  # [M, T+1, S]
    avail: jax.Array  # [M, T+1, N, A]
    actions: jax.Array  # [M, T, N] or [M, T, N, d]
    reward: jax.Array  # [M, T]
    done: jax.Array  # [M, T]
    mask: jax.Array  # [M, T]
    length: jax.Array  # [M]


def trajectory_arrays(dataset: Dataset, device: Any = None) -> TrajectoryArrays:
    """Put the per-step fields of `dataset` on `device` once."""
    return jax.device_put(
        TrajectoryArrays(
            obs=np.asarray(dataset.obs),
            global_state=np.asarray(dataset.global_state),
            avail=np.asarray(dataset.avail_actions),
            actions=np.asarray(dataset.actions),
            reward=np.asarray(dataset.reward),
            done=np.asarray(dataset.done),
            mask=np.asarray(dataset.mask),
            length=np.asarray(dataset.length),
        ),
        device,
    )


@struct.dataclass
class Segments:
    """B segments of L steps; observation-like fields carry L+1 entries, the
    last being the observation after the segment (for `r = Q - γ·V(s')`).

    Attributes:
      obs: [B, L+1, N, O]; global_state: [B, L+1, S]; avail: [B, L+1, N, A].
      actions: [B, L, N] or [B, L, N, d]; reward: [B, L] (ground truth, for
        oracles); mask: [B, L] valid steps (False past the episode's end);
        done: [B, L] terminal flags.
      traj_index: [B] trajectory of each segment; start: [B] its first step.
    """

    obs: jax.Array
    global_state: jax.Array
    avail: jax.Array
    actions: jax.Array
    reward: jax.Array
    mask: jax.Array
    done: jax.Array
    traj_index: jax.Array
    start: jax.Array


def sample_segment_pairs(
    key: jax.Array,
    dataset_arrays: TrajectoryArrays,
    batch_size: int,
    segment_len: Optional[int] = None,
) -> tuple[Segments, Segments]:
    """Two batches `(x, y)` of segments from distinct random trajectories.

    Trajectories are uniform; x and y never come from the same trajectory (M
    must be >= 2). The start is uniform over `[0, max(length - L, 0)]` so a
    segment lies inside the valid part when the episode is long enough;
    shorter episodes give a masked tail. `segment_len=None` means whole
    trajectories (L = T, start 0). Jittable (`batch_size`/`segment_len`
    static).
    """
    M, T = dataset_arrays.reward.shape
    L = T if segment_len is None else int(segment_len)
    if not 1 <= L <= T:
        raise ValueError(f"segment_len must be in [1, T={T}], got {segment_len}")
    if M < 2:
        raise ValueError(f"segment pairs need at least 2 trajectories, got {M}")
    kx, ky, ksx, ksy = jax.random.split(key, 4)
    ix = jax.random.randint(kx, (batch_size,), 0, M)
    iy = (ix + jax.random.randint(ky, (batch_size,), 1, M)) % M  # never == ix
    return (
        _segments(ksx, dataset_arrays, ix, L, segment_len is None),
        _segments(ksy, dataset_arrays, iy, L, segment_len is None),
    )


def _segments(
    key: jax.Array, data: TrajectoryArrays, idx: jax.Array, L: int, whole: bool
) -> Segments:
    length = data.length[idx]
    if whole:
        start = jnp.zeros_like(idx)
    else:
        hi = jnp.maximum(length - L, 0)  # inclusive upper bound of the start
        start = jax.random.randint(key, idx.shape, 0, hi + 1)
    start = start.astype(jnp.int32)

    def window(x, n):
        def one(i, s):
            begin = (i, s) + (0,) * (x.ndim - 2)
            return jax.lax.dynamic_slice(x, begin, (1, n) + x.shape[2:])[0]

        return jax.vmap(one)(idx, start)

    return Segments(
        obs=window(data.obs, L + 1),
        global_state=window(data.global_state, L + 1),
        avail=window(data.avail, L + 1),
        actions=window(data.actions, L),
        reward=window(data.reward, L),
        mask=window(data.mask, L),
        done=window(data.done, L),
        traj_index=idx.astype(jnp.int32),
        start=start,
    )
