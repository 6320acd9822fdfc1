"""Covariate shift of a transformer student on a token task, per turn.

A student cloned from expert episodes is trained on the expert's contexts and
deployed on its own; once it errs it conditions on histories the expert never
produced, and errs more (Ross et al. 2011). On a token task the natural clock
of that drift is the TURN (a tool call and its answer,
[`jaxil.algorithms.lm.turns`][jaxil.algorithms.lm.turns]), not the step: turns
have different lengths in different episodes. Per turn bin `b` (turns
`0, 1, …, B−2` and a last bin for every turn `≥ B−1`), over the tokens an agent
says
([`jaxil.algorithms.lm.turns.speaking`][jaxil.algorithms.lm.turns.speaking]):

* next-token disagreement on the student's OWN episodes: how often the
  student's most likely legal token (`D.categorical_mode` of
  [`TransformerPolicy.chunk_logits`][jaxil.nn.transformer.TransformerPolicy.chunk_logits])
  differs from the expert's label at that state (the DAgger query, recorded by
  the shared-control rollout of
  [`jaxil.algorithms.interactive.rollout`][jaxil.algorithms.interactive.rollout]);
* its floor: the same on the EXPERT's episodes, the student teacher-forced
  on the expert's histories against the expert's own tokens — the error SFT
  measures. The gap between the two is the error that covariate shift adds;
* the hidden-state distance: the unbiased MMD² (RBF kernel, median heuristic:
  [`jaxil.algorithms.interactive.diagnostics.mmd2_unbiased`][jaxil.algorithms.interactive.diagnostics.mmd2_unbiased])
  between the student's final hidden states
  ([`TransformerPolicy.chunk_features`][jaxil.nn.transformer.TransformerPolicy.chunk_features])
  on its own histories and on the expert's, and its floor, the MMD² between two
  disjoint halves of the expert's episodes: the value a student that visits the
  expert's distribution would get from this many samples.

The functions over arrays
([`disagreement_by_turn`][jaxil.algorithms.lm.diagnostics.disagreement_by_turn],
[`mmd2_by_turn`][jaxil.algorithms.lm.diagnostics.mmd2_by_turn]) and over
episodes
([`student_disagreement_by_turn`][jaxil.algorithms.lm.diagnostics.student_disagreement_by_turn],
[`feature_mmd2_by_turn`][jaxil.algorithms.lm.diagnostics.feature_mmd2_by_turn])
are pure and jittable with static shapes; they return NaN where a bin has
nothing to measure, so that a plot shows a gap instead of a fake 0.
[`shift_episodes`][jaxil.algorithms.lm.diagnostics.shift_episodes] draws the
two sets of episodes,
[`shift_table`][jaxil.algorithms.lm.diagnostics.shift_table] measures them and
[`covariate_shift`][jaxil.algorithms.lm.diagnostics.covariate_shift] does both,
returning columns for a results table
([`covariate_shift_rows`][jaxil.algorithms.lm.diagnostics.covariate_shift_rows]
turns them into JSON rows).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxil import envs
from jaxil.algorithms.interactive.diagnostics import mmd2_unbiased
from jaxil.algorithms.interactive.rollout import SwitchRule, mixed_policy
from jaxil.algorithms.lm.sft import TokenEpisodes, from_episodes
from jaxil.algorithms.lm.turns import speaking, turn_index
from jaxil.nn import distributions as D
from jaxil.nn.transformer import TransformerPolicy

#: Student alone: the OEC switch never comes (kind 0) and no DAgger coin.
_STUDENT_ONLY = SwitchRule(kind=0, lo=0, hi=0, p=0.5, beta=0.0)


def _check_num_bins(num_bins: int) -> int:
    if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 1:
        raise ValueError(f"num_bins (max_turn_bins) must be an int >= 1, got {num_bins!r}")
    return int(num_bins)


def turn_bin_labels(num_bins: int) -> list[str]:
    """`["0", "1", …, "≥B−1"]`: the names of the `B` turn bins."""
    b = _check_num_bins(num_bins)
    return [str(i) for i in range(b - 1)] + [f"≥{b - 1}"]


def _bin_weights(turn: jax.Array, mask: jax.Array, num_bins: int) -> jax.Array:
    """`[E, T, N, B]` float: `mask` spread onto each token's turn bin
    `min(turn, B − 1)`."""
    bins = jnp.minimum(turn, num_bins - 1)
    onehot = jax.nn.one_hot(bins, num_bins, dtype=jnp.float32)  # [E, T, B]
    return mask.astype(jnp.float32)[..., None] * onehot[:, :, None, :]


def disagreement_by_turn(
    predicted: jax.Array,
    target: jax.Array,
    turn: jax.Array,
    mask: jax.Array,
    num_bins: int,
) -> tuple[jax.Array, jax.Array]:
    """Token disagreement per turn bin.

        bin(e, t) = min(turn_et, B − 1)
        count_b   = Σ_{e,t,i} m_eti · 1[bin(e, t) = b]
        rate_b    = Σ_{e,t,i} m_eti · 1[bin(e, t) = b] · 1[p_eti ≠ y_eti] / count_b,

    NaN where `count_b = 0`. Every counted token weighs the same: a bin's
    rate is over its tokens, not a mean of per-episode rates.

    Args:
      predicted: `[E, T, N]` int tokens predicted (the student's).
      target: `[E, T, N]` int tokens they are compared to (the expert's).
      turn: `[E, T]` int the turn of each step
        ([`jaxil.algorithms.lm.turns.turn_index`][jaxil.algorithms.lm.turns.turn_index]),
        `>= 0`.
      mask: `[E, T, N]` the tokens to count (bool or 0/1; e.g. the
        speaking tokens of the valid steps).
      num_bins: `B` (static), turns `0 … B−2` and a last bin `≥ B−1`.

    Returns:
      `(rate [B] float32, count [B] int32)`.
    """
    num_bins = _check_num_bins(num_bins)
    predicted, target = jnp.asarray(predicted), jnp.asarray(target)
    turn, mask = jnp.asarray(turn), jnp.asarray(mask)
    chex.assert_rank([predicted, target, turn, mask], [3, 3, 2, 3])
    chex.assert_equal_shape([predicted, target, mask])
    chex.assert_type([predicted, target, turn], int)
    chex.assert_shape(turn, predicted.shape[:2])
    w = _bin_weights(turn, mask, num_bins)
    count = jnp.sum(w, axis=(0, 1, 2))
    wrong = jnp.sum(w * (predicted != target).astype(jnp.float32)[..., None], axis=(0, 1, 2))
    rate = jnp.where(count > 0, wrong / jnp.maximum(count, 1.0), jnp.nan)
    return rate, count.astype(jnp.int32)


def _pick(valid: jax.Array, max_samples: int | None, key: jax.Array | None):
    """Indices of at most `max_samples` rows, uniformly among the valid
    ones (all rows when they fit), and the validity of the picked rows."""
    m = valid.shape[0]
    if max_samples is None or max_samples >= m:
        return jnp.arange(m), valid
    score = jnp.where(valid, jax.random.uniform(key, (m,)), -1.0)
    _, idx = jax.lax.top_k(score, max_samples)
    return idx, valid[idx]


def mmd2_by_turn(
    x: jax.Array,
    x_turn: jax.Array,
    x_mask: jax.Array,
    y: jax.Array,
    y_turn: jax.Array,
    y_mask: jax.Array,
    num_bins: int,
    bandwidth: float | jax.Array | None = None,
    max_samples: int | None = None,
    key: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Unbiased squared MMD between two sets of token features, per turn bin.

    Bin `b` of each side holds the masked tokens whose step has
    `min(turn, B − 1) = b`; per bin,
    [`mmd2_unbiased`][jaxil.algorithms.interactive.diagnostics.mmd2_unbiased]
    of the two (Gretton et al. 2012, eq. 3; RBF kernel `exp(−‖a − b‖² / 2σ²)`,
    σ = `bandwidth` or the median heuristic over the bin's pooled samples,
    recomputed per bin, as `mmd2_by_t` does). Tokens of one episode are
    correlated: a diagnostic, not a test statistic.

    Memory: each bin builds a kernel of side `Mx + My` with `M = E·T·N`
    (or `2·max_samples`). With `max_samples`, a bin with more valid
    tokens on one side uses `max_samples` of them drawn uniformly without
    replacement (with `key`; each bin and side its own draw).

    Args:
      x: `[Ex, T, N, S]` float features of one policy's tokens.
      x_turn: `[Ex, T]` int turn of each step of `x`.
      x_mask: `[Ex, T, N]` tokens of `x` to use.
      y, y_turn, y_mask: the same for the other policy (`[Ey, T', N', S]`).
      num_bins: `B` (static).
      bandwidth: kernel width σ > 0, or `None` for the median heuristic.
      max_samples: static cap on the samples per bin and side, or `None`.
      key: PRNG key for the subsample (needed when `max_samples` is
        smaller than `E·T·N` of a side).

    Returns:
      `(mmd2 [B], n_x [B], n_y [B])`: the estimate (NaN where a side has
      fewer than 2 samples) and the samples used per side (int32).
    """
    num_bins = _check_num_bins(num_bins)
    x, y = jnp.asarray(x), jnp.asarray(y)
    chex.assert_rank([x, x_turn, x_mask, y, y_turn, y_mask], [4, 2, 3, 4, 2, 3])
    chex.assert_type([x, y], float)
    chex.assert_type([x_turn, y_turn], int)
    chex.assert_shape(x_turn, x.shape[:2])
    chex.assert_shape(x_mask, x.shape[:3])
    chex.assert_shape(y_turn, y.shape[:2])
    chex.assert_shape(y_mask, y.shape[:3])
    chex.assert_equal_shape_suffix([x, y], 1)
    if max_samples is not None and (int(max_samples) < 2):
        raise ValueError(f"max_samples must be >= 2 or None, got {max_samples}")
    sizes = (math.prod(x.shape[:3]), math.prod(y.shape[:3]))
    if max_samples is not None and max_samples < max(sizes) and key is None:
        raise ValueError(f"mmd2_by_turn subsamples to max_samples={max_samples} of "
                         f"{max(sizes)} tokens and needs a key")
    s = x.shape[-1]
    xf, yf = x.reshape(-1, s), y.reshape(-1, s)
    wx = _bin_weights(x_turn, x_mask, num_bins).reshape(-1, num_bins) > 0  # [Mx, B]
    wy = _bin_weights(y_turn, y_mask, num_bins).reshape(-1, num_bins) > 0
    keys = (jax.random.split(key, (num_bins, 2)) if key is not None
            else [(None, None)] * num_bins)
    out = []
    for b in range(num_bins):
        ix, vx = _pick(wx[:, b], max_samples, keys[b][0])
        iy, vy = _pick(wy[:, b], max_samples, keys[b][1])
        out.append(mmd2_unbiased(xf[ix], vx, yf[iy], vy, bandwidth))
    mmd2, n_x, n_y = (jnp.stack(v) for v in zip(*out))
    return mmd2, n_x, n_y


def _turns_and_speaking(episodes: TokenEpisodes) -> tuple[jax.Array, jax.Array]:
    """`(turn [E, T], speaking [E, T, N])` of each episode."""
    turn = jax.vmap(functools.partial(turn_index, eot=episodes.eot))(episodes.actions)
    said = jax.vmap(functools.partial(speaking, wait=episodes.wait))(episodes.avail,
                                                                    episodes.mask)
    return turn, said


def student_disagreement_by_turn(
    student: TransformerPolicy,
    params: Any,
    episodes: TokenEpisodes,
    num_bins: int,
    targets: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """[`disagreement_by_turn`][jaxil.algorithms.lm.diagnostics.disagreement_by_turn]
    of the student's most likely legal token, teacher-forced on `episodes`,
    against `targets`, over the speaking tokens, binned by the turns of
    `episodes.actions`.

    On the student's own episodes `targets` are the expert's labels; with
    `targets=None` they are the episodes' own tokens (on the expert's
    episodes: the floor).

    Args:
      student: the transformer.
      params: its parameters.
      episodes: `E` token episodes (`obs [E, T, N, K]`).
      num_bins: `B` (static).
      targets: `[E, T, N]` int tokens to compare with, or `None`.

    Returns:
      `(rate [B], count [B])` as
      [`disagreement_by_turn`][jaxil.algorithms.lm.diagnostics.disagreement_by_turn].
    """
    logits = jax.vmap(student.chunk_logits, in_axes=(None, 0))(params, episodes.obs)
    predicted = D.categorical_mode(logits, episodes.avail)
    turn, said = _turns_and_speaking(episodes)
    target = episodes.actions if targets is None else targets
    return disagreement_by_turn(predicted, jnp.asarray(target, jnp.int32), turn, said, num_bins)


def feature_mmd2_by_turn(
    student: TransformerPolicy,
    params: Any,
    x: TokenEpisodes,
    y: TokenEpisodes,
    num_bins: int,
    bandwidth: float | jax.Array | None = None,
    max_samples: int | None = None,
    key: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """[`mmd2_by_turn`][jaxil.algorithms.lm.diagnostics.mmd2_by_turn] between
    the student's final hidden states
    ([`TransformerPolicy.chunk_features`][jaxil.nn.transformer.TransformerPolicy.chunk_features],
    teacher-forced) on the speaking tokens of episodes `x` and of episodes `y`,
    each binned by its own turns."""
    feats = jax.vmap(student.chunk_features, in_axes=(None, 0))
    x_turn, x_said = _turns_and_speaking(x)
    y_turn, y_said = _turns_and_speaking(y)
    return mmd2_by_turn(feats(params, x.obs), x_turn, x_said, feats(params, y.obs), y_turn,
                        y_said, num_bins, bandwidth, max_samples, key)


class ShiftEpisodes(NamedTuple):
    """The episodes of
    [`covariate_shift`][jaxil.algorithms.lm.diagnostics.covariate_shift].

    Attributes:
      student: the student's own episodes (it acts alone).
      labels: `[E, T, N]` int32 the expert's label at every state of
        `student` (zeros on padding).
      expert: the expert's own episodes.
    """

    student: TokenEpisodes
    labels: jax.Array
    expert: TokenEpisodes


def _episodes(env, student, expert_policy, num_episodes, deterministic, params,
              expert_params, key) -> ShiftEpisodes:
    k_student, k_expert = jax.random.split(key)
    spec = env.spec
    pol = mixed_policy(student.policy(deterministic=deterministic), expert_policy, _STUDENT_ONLY,
                       (spec.num_agents,) + spec.action.shape, env.legalize)
    # Record the labels only: the student's carry is its KV cache.
    mine = envs.run_episodes(env, pol, (params, expert_params), k_student, num_episodes,
                             record_carry=lambda c: c.label)
    theirs = envs.run_episodes(env, expert_policy, expert_params, k_expert, num_episodes)
    return ShiftEpisodes(from_episodes(env, mine), mine.carry.astype(jnp.int32),
                         from_episodes(env, theirs))


def shift_episodes(env: envs.MultiAgentEnv, student: TransformerPolicy, params: Any,
                   expert_policy: Any, key: jax.Array, num_episodes: int, *,
                   expert_params: Any = None, deterministic: bool = False,
                   compiler_options: dict | None = None) -> ShiftEpisodes:
    """`num_episodes` episodes of the student acting alone, with the
    expert's label at each of its states, and `num_episodes` of the expert;
    both drawn from `key` (`jax.random.split(key)`: student, expert).

    The student samples its tokens (`deterministic`: the most likely legal one)
    in the shared-control rollout of
    [`jaxil.algorithms.interactive.rollout.mixed_policy`][jaxil.algorithms.interactive.rollout.mixed_policy]
    with the expert never acting, which records the expert's label at each step
    (and nothing else of its carry: the student's part is its KV cache). One
    compiled program, cached for the same `env`, `student` and `expert_policy`
    objects; `compiler_options` go to XLA.
    """
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    run = jax.jit(_episodes, static_argnums=(0, 1, 2, 3, 4), compiler_options=compiler_options)
    return run(env, student, expert_policy, int(num_episodes), bool(deterministic), params,
               expert_params, key)


def _measure(student, num_bins, half, bandwidth, max_samples, params, eps: ShiftEpisodes,
             key) -> dict[str, jax.Array]:
    k_value, k_floor = jax.random.split(key)
    d_student, c_student = student_disagreement_by_turn(student, params, eps.student, num_bins,
                                                        eps.labels)
    d_floor, c_floor = student_disagreement_by_turn(student, params, eps.expert, num_bins)
    first, reference = eps.expert.take(slice(0, half)), eps.expert.take(slice(half, 2 * half))
    m_student, n_student, n_ref = feature_mmd2_by_turn(
        student, params, eps.student.take(slice(0, half)), reference, num_bins, bandwidth,
        max_samples, k_value)
    m_floor, n_floor, _ = feature_mmd2_by_turn(student, params, first, reference, num_bins,
                                               bandwidth, max_samples, k_floor)
    return {"disagreement_student": d_student, "disagreement_floor": d_floor,
            "mmd2_student": m_student, "mmd2_floor": m_floor, "count_student": c_student,
            "count_floor": c_floor, "mmd_samples_student": n_student,
            "mmd_samples_expert": n_ref, "mmd_samples_floor": n_floor}


def shift_table(student: TransformerPolicy, params: Any, episodes: ShiftEpisodes,
                key: jax.Array, max_turn_bins: int, *,
                bandwidth: float | None = None, max_samples: int | None = 1024,
                compiler_options: dict | None = None) -> dict[str, Any]:
    """The table of
    [`covariate_shift`][jaxil.algorithms.lm.diagnostics.covariate_shift] from
    episodes already drawn
    ([`shift_episodes`][jaxil.algorithms.lm.diagnostics.shift_episodes]); `key`
    draws the MMD subsamples only."""
    b = _check_num_bins(max_turn_bins)
    e = episodes.expert.num_episodes
    if e < 4 or episodes.student.num_episodes < e // 2:
        raise ValueError(f"the covariate-shift table needs >= 4 expert episodes (two halves of "
                         f">= 2) and at least half as many student episodes, got {e} and "
                         f"{episodes.student.num_episodes}")
    if bandwidth is not None and not float(bandwidth) > 0:
        raise ValueError(f"bandwidth must be > 0 (or None for the median heuristic), got "
                         f"{bandwidth}")
    run = jax.jit(_measure, static_argnums=(0, 1, 2, 3, 4), compiler_options=compiler_options)
    out = run(student, b, e // 2, None if bandwidth is None else float(bandwidth),
              max_samples, params, episodes, key)
    table: dict[str, Any] = {"turn_bin": np.arange(b), "turn": turn_bin_labels(b)}
    for name, v in out.items():
        integer = name.startswith(("count", "mmd_samples"))
        table[name] = np.asarray(v, np.int64 if integer else np.float64)
    table.update(num_episodes=int(episodes.student.num_episodes),
                 student_win_rate=float(np.mean(np.asarray(episodes.student.won))),
                 expert_win_rate=float(np.mean(np.asarray(episodes.expert.won))))
    return table


def covariate_shift(env: envs.MultiAgentEnv, student: TransformerPolicy, params: Any,
                    expert_policy: Any, key: jax.Array, num_episodes: int,
                    max_turn_bins: int, *, expert_params: Any = None,
                    deterministic: bool = False, bandwidth: float | None = None,
                    max_samples: int | None = 1024,
                    compiler_options: dict | None = None) -> dict[str, Any]:
    """The per-turn covariate-shift diagnostic of a transformer student
    (see the module docstring). Deterministic given `key`.

    Draws `E = num_episodes` episodes of the student acting alone (labelled by
    the expert) and `E` of the expert
    ([`shift_episodes`][jaxil.algorithms.lm.diagnostics.shift_episodes]), then
    measures them
    ([`shift_table`][jaxil.algorithms.lm.diagnostics.shift_table]). The
    disagreement uses all of them. The MMD² uses halves of `h = E // 2`
    episodes so that the value and its floor have the same sample sizes and one
    reference: the student's first `h` episodes against the expert's last `h`
    (value), the expert's first `h` against the same last `h` (floor). Tokens
    of one episode are correlated, so the floor is positive with few episodes;
    compare the value with it, not with 0.

    Args:
      env: a token environment.
      student: the transformer
        ([`jaxil.algorithms.lm.make_student`][jaxil.algorithms.lm.sft.make_student]).
      params: its parameters.
      expert_policy: the expert (e.g. `scripted_expert(env)[0]`).
      key: PRNG key.
      num_episodes: `E >= 4` episodes of each.
      max_turn_bins: `B`: turns `0 … B−2` and a last bin `≥ B−1`.
      expert_params: the expert's parameters (`None` for a scripted one).
      deterministic: the student plays its most likely legal token instead
        of sampling.
      bandwidth: the MMD kernel width, `None` for the median heuristic.
      max_samples: cap on the tokens per bin and side in the MMD (`None`:
        all; memory grows with the square).
      compiler_options: XLA options of the two compiled programs.

    Returns:
      A dict of columns over the `B` bins — `turn_bin` (int), `turn` (labels
      `"0" … "≥B−1"`), `disagreement_student`, `disagreement_floor`,
      `mmd2_student`, `mmd2_floor` (float64, NaN where empty), `count_student`,
      `count_floor` (speaking tokens in the disagreement),
      `mmd_samples_student`, `mmd_samples_expert` (the reference half),
      `mmd_samples_floor` (int64) — and scalars `num_episodes`,
      `student_win_rate`, `expert_win_rate`.
      [`covariate_shift_rows`][jaxil.algorithms.lm.diagnostics.covariate_shift_rows]
      makes JSON rows of it.
    """
    _check_num_bins(max_turn_bins)
    if num_episodes < 4:
        raise ValueError(f"covariate_shift needs num_episodes >= 4 (two halves of expert "
                         f"episodes of >= 2 each), got {num_episodes}")
    k_eps, k_mmd = jax.random.split(key)
    eps = shift_episodes(env, student, params, expert_policy, k_eps, num_episodes,
                         expert_params=expert_params, deterministic=deterministic,
                         compiler_options=compiler_options)
    return shift_table(student, params, eps, k_mmd, max_turn_bins, bandwidth=bandwidth,
                       max_samples=max_samples, compiler_options=compiler_options)


def covariate_shift_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    """One JSON-ready dict per turn bin of a
    [`covariate_shift`][jaxil.algorithms.lm.diagnostics.covariate_shift] table:
    the per-bin columns as Python numbers (NaN as `None`) and the scalars
    repeated in every row."""
    b = len(table["turn_bin"])
    rows = []
    for i in range(b):
        row = {}
        for name, v in table.items():
            if isinstance(v, (list, np.ndarray)) and len(v) == b:
                x = v[i]
                if isinstance(x, (np.integer, int)):
                    x = int(x)
                elif isinstance(x, (np.floating, float)):
                    x = None if not np.isfinite(x) else float(x)
                row[name] = x
            else:
                row[name] = v
        rows.append(row)
    return rows
