"""Covariate-shift diagnostics of a student policy, per episode time step.

A student trained on expert states drifts away from them as an episode goes
on (Ross et al. 2011); interactive imitation exists to close that gap. Two
measures of the drift, as a function of the time step `t`, from batch-major
episode arrays (`E` episodes, `T` steps, `N` agents):

* `disagreement_by_t`: how often (discrete) or how far (continuous) the
  student's action differs from the expert's label on the student's own
  states;
* `mmd2_by_t`: the unbiased squared Maximum Mean Discrepancy (Gretton et
  al. 2012) between the global states the student visits and those the expert
  visits, per bin of time steps (`mmd2_unbiased`: the same estimate between two
  masked sets of samples, for bins of another kind, e.g. the turns of
  [`jaxil.algorithms.lm.diagnostics`][jaxil.algorithms.lm.diagnostics]).

A stochastic expert (a sampling teacher, a scripted expert that breaks ties at
random) disagrees with ITSELF:
[`twin_policy`][jaxil.algorithms.interactive.diagnostics.twin_policy] draws a
second, independent expert action at every step, and `disagreement_by_t`
between the two is the floor below which no student's disagreement can fall.

Both are masked (padding after an episode's end is ignored), jittable with
static shapes, and return NaN where there is nothing to measure, so that a
plot shows a gap instead of a fake 0.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence, Union

import chex
import jax
import jax.numpy as jnp

from jaxil.envs.policies import Policy, as_policy
from jaxil.algorithms.interactive.rollout import action_dtype


class Twin(NamedTuple):
    """The carry of
    [`twin_policy`][jaxil.algorithms.interactive.diagnostics.twin_policy]: the
    expert's own carry and the second draw of this step's action."""

    inner: Any
    second: jax.Array


def twin_policy(expert: Any, action_shape: tuple, legalize: Optional[Callable] = None) -> Policy:
    """The expert, also drawing a second action from the same state and
    carry with an independent key (recorded in `carry.second`, mapped onto
    a legal action by `legalize(actions, avail)` as the first draw is when
    played; the first draw moves the carry on).

    For a deterministic expert the two draws are equal; otherwise their
    disagreement is the expert's label noise at that state.
    """
    x = as_policy(expert)
    legal = legalize if legalize is not None else (lambda a, avail: a)

    def init(key, n):
        zeros = jnp.zeros((n,) + tuple(action_shape[1:]), action_dtype(action_shape))
        return Twin(x.init(key, n), zeros)

    def act(params, obs, avail, key, c: Twin):
        k1, k2 = jax.random.split(key)
        a1, inner = x.act(params, obs, avail, k1, c.inner)
        a2, _ = x.act(params, obs, avail, k2, c.inner)
        return a1, Twin(inner, legal(a2, avail).astype(a1.dtype))

    return Policy(init=init, act=act)


def disagreement_by_t(
    student_actions: jax.Array,
    expert_actions: jax.Array,
    mask: jax.Array,
    discrete: bool,
    agent_mask: Optional[jax.Array] = None,
) -> tuple[jax.Array, jax.Array]:
    """Student–expert action disagreement per time step.

        d_et   = (1/N) Σ_i 1[a^s_eti ≠ a^e_eti]        (discrete)
        d_et   = (1/N) Σ_i ‖a^s_eti − a^e_eti‖_2        (continuous)
        count_t = Σ_e m_et
        rate_t  = Σ_e m_et · d_et / count_t,   NaN where count_t = 0.

    The expert actions are the expert's labels on the student's states (the
    DAgger query), so `rate_t` is the student's error on its own state
    distribution at step `t`.

    With `agent_mask` `[E, T, N]` (e.g. the agents that have more than one
    available action: a dead SMAX unit can only no-op, and would count as
    agreeing), the agent mean runs over the masked agents only:
    `rate_t = Σ_e Σ_i m_et g_eti 1[a^s ≠ a^e] / Σ_e Σ_i m_et g_eti`.

    Args:
      student_actions: `[E, T, N]` int (discrete) or `[E, T, N, d]` float
        (continuous) actions the student took.
      expert_actions: the expert's actions at the same states, same shape and
        kind as `student_actions`.
      mask: `[E, T]` validity of each step (bool or 0/1).
      discrete: whether the actions are discrete indices (static).
      agent_mask: optional `[E, T, N]` agents to count (bool or 0/1).

    Returns:
      `(rate [T], count [T])`: `rate` float (the actions' dtype when
      continuous, the default float when discrete), `count` int32, the
      number of valid episodes at each step.
    """
    a_s, a_e, mask = jnp.asarray(student_actions), jnp.asarray(expert_actions), jnp.asarray(mask)
    chex.assert_rank(a_s, 3 if discrete else 4)
    chex.assert_equal_shape([a_s, a_e])
    chex.assert_type([a_s, a_e], int if discrete else float)
    chex.assert_shape(mask, a_s.shape[:2])
    if discrete:
        per_agent = (a_s != a_e).astype(jnp.result_type(float))
    else:
        per_agent = jnp.sqrt(jnp.sum(jnp.square(a_s - a_e), axis=-1))
    m = mask.astype(per_agent.dtype)
    count = jnp.sum(m, axis=0)
    if agent_mask is None:
        d = jnp.mean(per_agent, axis=-1)  # [E, T]
        total = jnp.sum(m * d, axis=0)
        rate = jnp.where(count > 0, total / jnp.maximum(count, 1.0), jnp.nan)
        return rate, count.astype(jnp.int32)
    chex.assert_shape(agent_mask, a_s.shape[:3])
    g = m[..., None] * jnp.asarray(agent_mask).astype(per_agent.dtype)  # [E, T, N]
    weight = jnp.sum(g, axis=(0, 2))
    total = jnp.sum(g * per_agent, axis=(0, 2))
    rate = jnp.where(weight > 0, total / jnp.maximum(weight, 1.0), jnp.nan)
    return rate, count.astype(jnp.int32)


def _check_bin_edges(bin_edges: Sequence[int], num_steps: int) -> tuple[int, ...]:
    edges = tuple(bin_edges)
    if len(edges) < 2 or not all(isinstance(e, int) and not isinstance(e, bool) for e in edges):
        raise ValueError(f"bin_edges must be a tuple of at least 2 ints (B+1 edges), got {bin_edges!r}")
    if any(hi <= lo for lo, hi in zip(edges[:-1], edges[1:])):
        raise ValueError(f"bin_edges must be strictly increasing, got {edges}")
    if edges[0] < 0 or edges[-1] > num_steps:
        raise ValueError(f"bin_edges {edges} fall outside [0, T] = [0, {num_steps}]")
    return edges


def _sq_dists(z: jax.Array, w: jax.Array) -> jax.Array:
    """`[M, M]` squared Euclidean distances, exact 0 on the diagonal.

    Uses ‖a‖² + ‖b‖² − 2a·b (no `[M, M, S]` intermediate) after centring on
    the mean of the valid samples: the distances do not change, and the
    cancellation in float32 is relative to the spread of the data instead of
    its offset from the origin.
    """
    centre = jnp.sum(w[:, None] * z, axis=0) / jnp.maximum(jnp.sum(w), 1.0)
    z = z - centre
    sq = jnp.sum(jnp.square(z), axis=-1)
    d2 = jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * (z @ z.T), 0.0)
    return jnp.where(jnp.eye(z.shape[0], dtype=bool), 0.0, d2)


def _median_bandwidth(d2: jax.Array, valid: jax.Array) -> jax.Array:
    """Median of ‖z_i − z_j‖ over pairs i < j of valid samples; 1 where that
    median is 0 (more than half the pairs coincide)."""
    m = d2.shape[0]
    upper = jnp.triu(jnp.ones((m, m), dtype=bool), k=1)
    pair = upper & valid[:, None] & valid[None, :]
    med = jnp.nanmedian(jnp.where(pair, jnp.sqrt(d2), jnp.nan))
    return jnp.where(med > 0, med, 1.0)


def _mmd2_unbiased(
    x: jax.Array,
    x_mask: jax.Array,
    y: jax.Array,
    y_mask: jax.Array,
    bandwidth: Optional[Union[float, jax.Array]],
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Unbiased MMD² between the valid rows of `x [Mx, S]` and `y [My, S]`."""
    mx, my = x.shape[0], y.shape[0]
    z = jnp.concatenate([x, y], axis=0)
    dtype = z.dtype
    wx = jnp.concatenate([x_mask.astype(dtype), jnp.zeros((my,), dtype)])
    wy = jnp.concatenate([jnp.zeros((mx,), dtype), y_mask.astype(dtype)])
    d2 = _sq_dists(z, wx + wy)
    if bandwidth is None:
        sigma = _median_bandwidth(d2, (wx + wy) > 0)
    else:
        sigma = jnp.asarray(bandwidth, dtype)
    k = jnp.exp(-d2 / (2.0 * jnp.square(sigma)))
    k_off = jnp.where(jnp.eye(mx + my, dtype=bool), 0.0, k)  # the i ≠ j sums
    n_x, n_y = jnp.sum(wx), jnp.sum(wy)
    kxx = wx @ k_off @ wx
    kyy = wy @ k_off @ wy
    kxy = wx @ k @ wy
    enough = (n_x >= 2) & (n_y >= 2)
    safe_x, safe_y = jnp.maximum(n_x, 2.0), jnp.maximum(n_y, 2.0)
    mmd2 = kxx / (safe_x * (safe_x - 1)) + kyy / (safe_y * (safe_y - 1)) - 2.0 * kxy / (safe_x * safe_y)
    return jnp.where(enough, mmd2, jnp.nan), n_x, n_y


def mmd2_unbiased(
    x: jax.Array,
    x_mask: jax.Array,
    y: jax.Array,
    y_mask: jax.Array,
    bandwidth: float | jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Unbiased squared MMD between the valid rows of two sample sets.

    The estimate of
    [`mmd2_by_t`][jaxil.algorithms.interactive.diagnostics.mmd2_by_t] for one
    bin, over samples gathered in any way (padding rows masked out): the same
    RBF kernel, the same median heuristic over the pooled valid samples when
    `bandwidth` is `None`.

    Memory: a square kernel of side `Mx + My`, masked rows included.

    Args:
      x: `[Mx, S]` float samples of one distribution.
      x_mask: `[Mx]` validity of each row of `x` (bool or 0/1).
      y: `[My, S]` float samples of the other.
      y_mask: `[My]` validity of each row of `y`.
      bandwidth: kernel width σ > 0, or `None` for the median heuristic.

    Returns:
      `(mmd2, n_x, n_y)`: the scalar estimate (NaN where either side has
      fewer than 2 valid rows) and the numbers of valid rows (int32).

    Raises:
      ValueError: if a Python `bandwidth` <= 0.
    """
    x, y = jnp.asarray(x), jnp.asarray(y)
    x_mask, y_mask = jnp.asarray(x_mask), jnp.asarray(y_mask)
    chex.assert_rank([x, y, x_mask, y_mask], [2, 2, 1, 1])
    chex.assert_type([x, y], float)
    chex.assert_equal_shape_suffix([x, y], 1)
    chex.assert_shape(x_mask, x.shape[:1])
    chex.assert_shape(y_mask, y.shape[:1])
    if isinstance(bandwidth, (int, float)) and bandwidth <= 0:
        raise ValueError(f"bandwidth must be > 0 (or None for the median heuristic), got {bandwidth}")
    dtype = jnp.result_type(x, y)
    mmd2, n_x, n_y = _mmd2_unbiased(x.astype(dtype), x_mask, y.astype(dtype), y_mask, bandwidth)
    return mmd2, n_x.astype(jnp.int32), n_y.astype(jnp.int32)


def mmd2_by_t(
    x: jax.Array,
    x_mask: jax.Array,
    y: jax.Array,
    y_mask: jax.Array,
    bin_edges: tuple[int, ...],
    bandwidth: Optional[Union[float, jax.Array]] = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Unbiased squared MMD between two policies' visited states, per time bin.

    Bin `b` holds the steps `edge_b <= t < edge_{b+1}`; its samples are
    the valid `(episode, step)` states of that bin, `{x_i}` (m of them)
    and `{y_j}` (n of them). Per bin (Gretton et al. 2012, JMLR, eq. 3):

        MMD²_u = 1/(m(m−1)) Σ_{i≠j} k(x_i, x_j)
               + 1/(n(n−1)) Σ_{i≠j} k(y_i, y_j)
               − 2/(mn)     Σ_{i,j} k(x_i, y_j),

        k(a, b) = exp(−‖a − b‖² / (2σ²)).

    The estimate is unbiased, so it can be slightly negative when the two
    distributions are equal. σ is `bandwidth` when given, else the median
    heuristic: the median of ‖z_i − z_j‖_2 over pairs `i < j` of distinct
    valid samples of the pooled set `{x} ∪ {y}` of that bin, recomputed per
    bin (σ = 1 where that median is 0, i.e. more than half the pairs
    coincide). Steps within one episode are correlated, so treat the value as
    a diagnostic, not as a test statistic with i.i.d. guarantees.

    Memory: each bin builds a square kernel of side
    `(E1 + E2) · T_bin` (`T_bin` its number of steps), padding included;
    the median heuristic also sorts its upper triangle. Bins are processed in
    a Python loop over the static `bin_edges`.

    Args:
      x: `[E1, T, S]` float global states visited by one policy (student).
      x_mask: `[E1, T]` validity of each step of `x`.
      y: `[E2, T, S]` float global states visited by the other (expert).
      y_mask: `[E2, T]` validity of each step of `y`.
      bin_edges: static tuple of `B + 1` strictly increasing ints in
        `[0, T]`.
      bandwidth: kernel width σ > 0, or `None` for the median heuristic.

    Returns:
      `(mmd2 [B], n_x [B], n_y [B])`: the estimate (NaN where either side
      has fewer than 2 valid samples) and the number of valid samples of each
      side per bin (int32).

    Raises:
      ValueError: if `bin_edges` is not strictly increasing, has fewer than
        two edges, or leaves `[0, T]`; or if a Python `bandwidth` <= 0.
    """
    x, y = jnp.asarray(x), jnp.asarray(y)
    x_mask, y_mask = jnp.asarray(x_mask), jnp.asarray(y_mask)
    chex.assert_rank([x, y, x_mask, y_mask], [3, 3, 2, 2])
    chex.assert_type([x, y], float)
    chex.assert_equal_shape_suffix([x, y], 2)
    chex.assert_shape(x_mask, x.shape[:2])
    chex.assert_shape(y_mask, y.shape[:2])
    edges = _check_bin_edges(bin_edges, x.shape[1])
    if isinstance(bandwidth, (int, float)) and bandwidth <= 0:
        raise ValueError(f"bandwidth must be > 0 (or None for the median heuristic), got {bandwidth}")
    dtype = jnp.result_type(x, y)
    x, y = x.astype(dtype), y.astype(dtype)
    num_states = x.shape[-1]
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        out.append(_mmd2_unbiased(
            x[:, lo:hi].reshape(-1, num_states), x_mask[:, lo:hi].reshape(-1),
            y[:, lo:hi].reshape(-1, num_states), y_mask[:, lo:hi].reshape(-1),
            bandwidth,
        ))
    mmd2, n_x, n_y = (jnp.stack(v) for v in zip(*out))
    return mmd2, n_x.astype(jnp.int32), n_y.astype(jnp.int32)
