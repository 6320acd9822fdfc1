"""Preference queries: which trajectory segments an oracle is asked to compare.

A query set is chosen once, on the host, with a budget (the number of queries);
the oracle answers it once; the preference learner then trains on minibatches
of the answered queries. [`QueryPairs`][jaxil.data.preferences.QueryPairs]
holds indices only (trajectory and start step of both sides), so the same
queries can be answered by several oracles and compared.

    pairs = sample_query_pairs(dataset, num_queries=1000, segment_len=None, seed=0)
    x, y = pair_segments(dataset, pairs)          # numpy Segments [Q, L(+1), ...]
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Optional

import numpy as np

from jaxil.data.format import Dataset
from jaxil.data.sampling import Segments


@dataclasses.dataclass(frozen=True)
class QueryPairs:
    """Q preference queries over one dataset: segment x vs segment y.

    Attributes:
      traj_x, traj_y: `[Q]` int32 trajectory indices (never equal in a pair).
      start_x, start_y: `[Q]` int32 first step of each segment.
      segment_len: steps per segment; `None` = whole trajectories (start 0,
        length = the dataset's padded T, masked past each episode's end).
    """

    traj_x: np.ndarray
    traj_y: np.ndarray
    start_x: np.ndarray
    start_y: np.ndarray
    segment_len: Optional[int] = None

    def __post_init__(self):
        shapes = {a.shape for a in (self.traj_x, self.traj_y, self.start_x, self.start_y)}
        if len(shapes) != 1 or len(next(iter(shapes))) != 1:
            raise ValueError(f"QueryPairs arrays must all be [Q]; got shapes {sorted(shapes)}")
        if np.any(self.traj_x == self.traj_y):
            raise ValueError("a query compares a trajectory with itself; sample distinct pairs")

    def __len__(self) -> int:
        return int(self.traj_x.shape[0])

    def keys(self, dataset_id: str = "") -> list[str]:
        """A stable string per query (for caching answers): the dataset id,
        both trajectories, both starts and the segment length."""
        L = "all" if self.segment_len is None else str(self.segment_len)
        return [
            f"{dataset_id}|{int(a)}@{int(sa)}|{int(b)}@{int(sb)}|{L}"
            for a, sa, b, sb in zip(self.traj_x, self.start_x, self.traj_y, self.start_y)
        ]

    def take(self, idx) -> "QueryPairs":
        idx = np.asarray(idx)
        return QueryPairs(self.traj_x[idx], self.traj_y[idx], self.start_x[idx],
                          self.start_y[idx], self.segment_len)


def dataset_id(dataset: Dataset) -> str:
    """A short content hash of the trajectories a query set indexes into."""
    h = hashlib.sha256()
    for name in ("episode_return", "length", "seed", "reward"):
        h.update(np.ascontiguousarray(getattr(dataset, name)).tobytes())
    h.update(dataset.info.env_id.encode())
    return h.hexdigest()[:16]


def sample_query_pairs(
    dataset: Dataset,
    num_queries: int,
    segment_len: Optional[int] = None,
    seed: int = 0,
) -> QueryPairs:
    """`num_queries` random pairs of distinct trajectories (uniform), each
    cut to a segment of `segment_len` steps starting uniformly in
    `[0, max(length − L, 0)]` (so it lies inside the episode when the
    episode is long enough), or whole trajectories when `segment_len` is
    None. Deterministic given `seed`."""
    M = dataset.num_trajectories
    T = dataset.reward.shape[1]
    if int(num_queries) < 1:
        raise ValueError(f"num_queries must be >= 1, got {num_queries}")
    if M < 2:
        raise ValueError(f"preference queries need at least 2 trajectories; the dataset has {M}")
    if segment_len is not None and not 1 <= int(segment_len) <= T:
        raise ValueError(
            f"segment_len must be in [1, T={T}] (the dataset's padded length) or None for "
            f"whole trajectories, got {segment_len}"
        )
    rng = np.random.default_rng(seed)
    Q = int(num_queries)
    tx = rng.integers(0, M, Q)
    ty = (tx + rng.integers(1, M, Q)) % M
    length = np.asarray(dataset.length, np.int64)

    def starts(t):
        if segment_len is None:
            return np.zeros(Q, np.int32)
        hi = np.maximum(length[t] - int(segment_len), 0)
        return np.floor(rng.random(Q) * (hi + 1)).astype(np.int32)

    return QueryPairs(tx.astype(np.int32), ty.astype(np.int32), starts(tx), starts(ty),
                      None if segment_len is None else int(segment_len))


def _segments_per_trajectory(dataset: Dataset, segment_len: Optional[int]) -> np.ndarray:
    """`[M]` the number of distinct segments of each trajectory: one start per
    step in `[0, max(length − L, 0)]`
    ([`sample_query_pairs`][jaxil.data.preferences.sample_query_pairs]), or one
    whole trajectory."""
    if segment_len is None:
        return np.ones(dataset.num_trajectories, np.int64)
    return np.maximum(np.asarray(dataset.length, np.int64) - int(segment_len), 0) + 1


def num_distinct_pairs(dataset: Dataset, segment_len: Optional[int] = None) -> int:
    """How many distinct queries the dataset offers: unordered pairs of
    segments from two different trajectories (`M(M−1)/2` for whole
    trajectories). `x vs y` and `y vs x` are the same pair."""
    c = _segments_per_trajectory(dataset, segment_len)
    s = int(c.sum())
    return (s * s - int(np.sum(c * c))) // 2


def _unordered(pairs: QueryPairs) -> list[tuple]:
    """A key per query that is the same for x vs y and y vs x."""
    return [(a, b) if a <= b else (b, a) for a, b in zip(
        zip(pairs.traj_x.tolist(), pairs.start_x.tolist()),
        zip(pairs.traj_y.tolist(), pairs.start_y.tolist()))]


def _concat(parts: list[QueryPairs], segment_len: Optional[int]) -> QueryPairs:
    return QueryPairs(*(np.concatenate([getattr(p, f) for p in parts]).astype(np.int32)
                        for f in ("traj_x", "traj_y", "start_x", "start_y")), segment_len)


def _all_pairs(dataset: Dataset, num: int, segment_len: Optional[int], seed: int) -> QueryPairs:
    """`num` pairs chosen uniformly without replacement among all
    distinct pairs, each side order a coin flip."""
    c = _segments_per_trajectory(dataset, segment_len)
    traj = np.repeat(np.arange(len(c)), c)
    start = np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c)
    i, j = np.triu_indices(len(traj), 1)
    other = traj[i] != traj[j]
    i, j = i[other], j[other]
    rng = np.random.default_rng([int(seed), 1])
    pick = rng.permutation(len(i))[:num]
    i, j = i[pick], j[pick]
    swap = rng.random(len(i)) < 0.5
    x, y = np.where(swap, j, i), np.where(swap, i, j)
    return QueryPairs(traj[x].astype(np.int32), traj[y].astype(np.int32),
                      start[x].astype(np.int32), start[y].astype(np.int32), segment_len)


def distinct_query_pairs(dataset: Dataset, num_queries: int, segment_len: Optional[int] = None,
                         seed: int = 0) -> QueryPairs:
    """`min(num_queries, num_distinct_pairs(...))` distinct random queries.

    [`sample_query_pairs`][jaxil.data.preferences.sample_query_pairs] draws
    with replacement, so a budget near or above the number of distinct pairs
    asks many pairs twice (or both ways round) while seeming to ask more. Here
    a repeated pair is dropped and replaced by a fresh draw; when the budget
    asks for more than half of all distinct pairs they are chosen without
    replacement from the full list instead, and a budget above the total asks
    every pair once. When the first draw has no repeats (a budget small against
    the number of pairs) the queries are exactly `sample_query_pairs(dataset,
    num_queries, segment_len, seed)`. Deterministic given `seed`.
    """
    drawn = sample_query_pairs(dataset, num_queries, segment_len, seed=seed)  # checks the args
    total = num_distinct_pairs(dataset, segment_len)
    want = min(int(num_queries), total)
    if 2 * want > total:  # dense: redrawing would mostly hit pairs already drawn
        return _all_pairs(dataset, want, segment_len, seed)
    seen: set = set()
    parts, have, draw = [], 0, 0
    while have < want:
        if draw:
            sub = int(np.random.SeedSequence([int(seed), draw]).generate_state(1)[0])
            drawn = sample_query_pairs(dataset, 2 * (want - have) + 8, segment_len, seed=sub)
        keep = []
        for i, key in enumerate(_unordered(drawn)):
            if key not in seen and have < want:
                seen.add(key)
                keep.append(i)
                have += 1
        parts.append(drawn.take(keep))
        draw += 1
    return parts[0] if len(parts) == 1 else _concat(parts, segment_len)


def _window(x: np.ndarray, traj: np.ndarray, start: np.ndarray, n: int) -> np.ndarray:
    """`x[traj, start:start+n]` per query, zero-padded past the end of T."""
    T = x.shape[1]
    steps = start[:, None] + np.arange(n)[None, :]  # [Q, n]
    valid = steps < T
    out = x[traj[:, None], np.minimum(steps, T - 1)]
    shape = valid.shape + (1,) * (out.ndim - 2)
    return np.where(valid.reshape(shape), out, np.zeros((), out.dtype))


def segments(dataset: Dataset, traj: np.ndarray, start: np.ndarray, L: Optional[int]) -> Segments:
    """numpy [`Segments`][jaxil.data.sampling.Segments] of the given
    trajectories/starts. `L=None` means whole trajectories, cut to the
    dataset's longest episode (padding beyond it would only cost compute)."""
    n = int(np.max(dataset.length)) if L is None else int(L)
    mask = _window(dataset.mask, traj, start, n)
    return Segments(
        obs=_window(dataset.obs, traj, start, n + 1),
        global_state=_window(dataset.global_state, traj, start, n + 1),
        avail=_window(dataset.avail_actions, traj, start, n + 1),
        actions=_window(dataset.actions, traj, start, n),
        reward=_window(dataset.reward, traj, start, n) * mask,
        mask=mask,
        done=_window(dataset.done, traj, start, n) & mask,
        traj_index=np.asarray(traj, np.int32),
        start=np.asarray(start, np.int32),
    )


def pair_segments(dataset: Dataset, pairs: QueryPairs) -> tuple[Segments, Segments]:
    """Both sides of every query as numpy
    [`Segments`][jaxil.data.sampling.Segments] `[Q, ...]`."""
    query_sides(dataset, pairs)
    return (segments(dataset, pairs.traj_x, pairs.start_x, pairs.segment_len),
            segments(dataset, pairs.traj_y, pairs.start_y, pairs.segment_len))


def query_sides(dataset: Dataset, pairs: QueryPairs):
    """`((traj_x, start_x), (traj_y, start_y))` as int64, checked against the
    dataset."""
    M = dataset.num_trajectories
    out = []
    for t, s in ((pairs.traj_x, pairs.start_x), (pairs.traj_y, pairs.start_y)):
        t, s = np.asarray(t, np.int64), np.asarray(s, np.int64)
        if t.size and (t.min() < 0 or t.max() >= M):
            raise IndexError(f"the queries index trajectories outside a dataset of {M}; "
                             "were they sampled from another dataset?")
        if s.size and s.min() < 0:
            raise ValueError("the queries have negative start steps")
        out.append((t, s))
    return out


def valid_steps(dataset: Dataset, traj: np.ndarray, start: np.ndarray, n: int) -> np.ndarray:
    """Valid steps of each segment `[Q]`: those in `[start, start + n)`
    before the episode's end (the dataset's mask is a prefix of each row)."""
    end = np.minimum(np.asarray(dataset.length, np.int64)[traj], np.asarray(start, np.int64) + n)
    return np.maximum(end - start, 0)


def segment_returns(dataset: Dataset, pairs: QueryPairs) -> tuple[np.ndarray, np.ndarray]:
    """True (recorded) returns of both sides of every query, `[Q]` float64
    each, summed over the segments' valid steps (without building the
    observation windows that
    [`pair_segments`][jaxil.data.preferences.pair_segments] gathers)."""
    n = dataset.reward.shape[1] if pairs.segment_len is None else int(pairs.segment_len)
    reward = np.asarray(dataset.reward)
    T = reward.shape[1]
    out = []
    for traj, start in query_sides(dataset, pairs):
        steps = start[:, None] + np.arange(n)[None, :]
        valid = np.arange(n)[None, :] < valid_steps(dataset, traj, start, n)[:, None]
        r = reward[traj[:, None], np.minimum(steps, T - 1)].astype(np.float64)
        out.append(np.where(valid, r, 0.0).sum(-1))
    return out[0], out[1]
