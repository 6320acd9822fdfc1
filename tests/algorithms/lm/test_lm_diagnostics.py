"""The per-turn covariate-shift diagnostic of transformer students
(jaxil.algorithms.lm.diagnostics) and the transformer's teacher-forced
hidden states (TransformerPolicy.chunk_features): the binned disagreement
against a float64 numpy reference written with loops, with and without jit;
the per-turn MMD against the per-time-step one of the interactive
diagnostics; its floor; and the whole driver on ``tokens:arith`` with two
operations against a reference recomputed from its own episodes."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.fast_compile import FAST_COMPILE, fast_call, fast_compile
from jaxil.envs.experts import scripted_expert
from jaxil.envs.tokens import EOT, WAIT

from jaxil import envs
from jaxil.algorithms.interactive.diagnostics import mmd2_by_t, mmd2_unbiased
from jaxil.algorithms.lm import diagnostics as dg
from jaxil.algorithms.lm.turns import turn_index
from jaxil.nn.transformer import TransformerConfig, TransformerPolicy, config_for_env

jit_param = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])


def _params(policy, seed):
    """Random weights of ``policy``'s shapes drawn in numpy (compiling the
    initialiser costs seconds), N(0, 1/fan_in) kernels and embeddings: logits
    of order 1, a student far from the expert."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(policy.init, jax.random.PRNGKey(0))

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        if "scale" in name:
            return jnp.ones(leaf.shape, leaf.dtype)
        if "kernel" in name or "embed" in name:
            std = 1.0 / np.sqrt(leaf.shape[0] if "embed" not in name else leaf.shape[-1])
            return jnp.asarray(rng.normal(0.0, std, leaf.shape), leaf.dtype)
        return jnp.asarray(0.1 * rng.normal(size=leaf.shape), leaf.dtype)

    return jax.tree_util.tree_map_with_path(draw, shapes)


def _turns_np(actions):
    """``[T]`` turns of one episode's ``[T, N]`` tokens, by a loop: a step
    belongs to the turn that the ``<eot>`` tokens BEFORE it closed."""
    out, turn = [], 0
    for row in np.asarray(actions):
        out.append(turn)
        turn += int(np.any(row == EOT))
    return np.asarray(out)


def _disagreement_np(pred, target, turn, mask, num_bins):
    wrong = np.zeros(num_bins, np.float64)
    count = np.zeros(num_bins, np.int64)
    E, T, N = pred.shape
    for e in range(E):
        for t in range(T):
            b = min(int(turn[e, t]), num_bins - 1)
            for i in range(N):
                if mask[e, t, i]:
                    count[b] += 1
                    wrong[b] += float(pred[e, t, i] != target[e, t, i])
    rate = np.full(num_bins, np.nan)
    rate[count > 0] = wrong[count > 0] / count[count > 0]
    return rate, count


@jit_param
def test_disagreement_by_turn_matches_float64_numpy_reference(jit):
    """Random tokens, masks and turns (reaching past the last bin) against
    explicit loops, with and without jit; turns from random ``<eot>``
    placements against a loop too. Kills: the last bin not gathering every
    turn ``≥ B−1`` (dropped or wrapped around), the mask ignored, a per-episode
    mean instead of a per-token one, 0 instead of NaN in an empty bin, and
    :func:`turn_index` counting the ``<eot>`` step in the turn it closes."""
    rng = np.random.default_rng(0)
    E, T, N, V, B = 4, 12, 2, 5, 4
    actions = rng.integers(1, V, (E, T, N))
    actions[rng.random((E, T, N)) < 0.3] = EOT
    turn = np.stack([_turns_np(a) for a in actions])
    assert turn.max() > B  # the last bin collects several turns
    pred, target = rng.integers(0, 3, (E, T, N)), rng.integers(0, 3, (E, T, N))
    mask = (rng.random((E, T, N)) < 0.7) & (turn != 1)[..., None]  # bin 1 left empty
    turn_jax = jax.vmap(functools.partial(turn_index, eot=EOT))(jnp.asarray(actions))
    np.testing.assert_array_equal(turn_jax, turn)
    fn = jax.jit(dg.disagreement_by_turn, static_argnums=4) if jit else dg.disagreement_by_turn
    rate, count = fn(jnp.asarray(pred), jnp.asarray(target), jnp.asarray(turn),
                     jnp.asarray(mask), B)
    ref_rate, ref_count = _disagreement_np(pred, target, turn, mask, B)
    assert ref_count[1] == 0 and np.all(ref_count[[0, 2, 3]] > 0)
    np.testing.assert_array_equal(count, ref_count)
    np.testing.assert_allclose(rate, ref_rate, rtol=1e-6)
    assert dg.turn_bin_labels(B) == ["0", "1", "2", "≥3"]


def test_mmd2_by_turn_equals_mmd2_by_t_when_every_step_is_a_turn():
    """With one agent and turn = step, turn bins 0, 1, 2 and ``≥3`` are the
    time bins (0, 1, 2, 3, T) of :func:`mmd2_by_t`: the two estimates
    (median heuristic per bin) and their sample counts agree. Kills a
    token put in the wrong turn bin, a mask not applied to a bin's samples,
    and a kernel or bandwidth that differs from the interactive module's."""
    rng = np.random.default_rng(1)
    E1, E2, T, S, B = 12, 15, 6, 3, 4
    x = rng.normal(size=(E1, T, S)).astype(np.float32)
    y = (rng.normal(size=(E2, T, S)) + 1.0).astype(np.float32)
    xm, ym = rng.random((E1, T)) < 0.8, rng.random((E2, T)) < 0.8
    turns = lambda e: np.broadcast_to(np.arange(T), (e, T)).astype(np.int32)
    edges = (0, 1, 2, 3, T)  # turns 0, 1, 2 and ≥ 3

    def both(x, xm, y, ym):
        by_turn = dg.mmd2_by_turn(x[:, :, None], turns(E1), xm[:, :, None], y[:, :, None],
                                  turns(E2), ym[:, :, None], B)
        return by_turn, mmd2_by_t(x, xm, y, ym, edges)

    (m, nx, ny), (m_t, nx_t, ny_t) = fast_call(both, x, xm, y, ym)
    np.testing.assert_array_equal(nx, nx_t)
    np.testing.assert_array_equal(ny, ny_t)
    np.testing.assert_allclose(m, m_t, rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(m) > 0.05)  # y is shifted: the bins are not trivially 0


def test_mmd2_floor_of_two_halves_is_near_zero_and_a_shift_is_clearly_positive():
    """Features of two disjoint halves of one distribution give MMD² near 0
    in every turn bin; the same features shifted by one standard deviation
    give clearly positive MMD², also when each bin is subsampled to
    ``max_samples`` (the same subsample for the same key, another for
    another key). Each turn has its own mean and the masked tokens are far
    off, so kills: a bin's samples compared with another bin's, masked
    tokens counted in (by the estimate or by the subsample), and a
    subsample drawn across bins."""
    rng = np.random.default_rng(2)
    E, T, N, S, B = 100, 4, 1, 4, 3
    turn = np.broadcast_to(np.arange(T), (2 * E, T)).astype(np.int32)  # bin 2: turns 2, 3
    feats = rng.normal(size=(2 * E, T, N, S)) + 3.0 * np.minimum(turn, B - 1)[..., None, None]
    mask = np.ones((2 * E, T, N), bool)
    mask[:, -1] = False
    feats[:, -1] += 100.0
    feats = feats.astype(np.float32)
    a, b = slice(0, E), slice(E, 2 * E)

    def run(key, shift, max_samples):
        y = jnp.asarray(feats[b]) + shift
        return dg.mmd2_by_turn(feats[a], turn[a], mask[a], y, turn[b], mask[b], B,
                               max_samples=max_samples, key=key)

    key, shifts = jax.random.PRNGKey(0), jnp.asarray([0.0, 1.0])
    for max_samples in (None, 80):
        fn = fast_compile(jax.vmap(lambda k, d, m=max_samples: run(k, d, m), in_axes=(None, 0)),
                          key, shifts)
        out = fn(key, shifts)
        (same, shifted), n_x, _ = (np.asarray(v) for v in out)
        np.testing.assert_array_equal(n_x, [[E] * B] * 2 if max_samples is None else [[80] * B] * 2)
        assert np.all(np.abs(same) < 0.03), same
        assert np.all(shifted > 0.15), shifted
    np.testing.assert_array_equal(fn(key, shifts)[0], out[0])
    assert not np.array_equal(fn(jax.random.PRNGKey(1), shifts)[0], out[0])


def test_chunk_features_read_out_equals_chunk_logits():
    """The head applied to :meth:`chunk_features` gives :meth:`chunk_logits`
    at every step and agent, on random token chunks with PAD slots (and no
    token at all before the first). Kills features taken before the final
    LayerNorm, read at other positions than the logits, or not zero where an
    agent has no token yet."""
    config = TransformerConfig(vocab_size=11, token_width=3, max_context=40, d_model=16,
                               num_layers=1, num_heads=2)
    pol = TransformerPolicy(config)
    params = _params(pol, 0)
    rng = np.random.default_rng(3)
    obs = rng.integers(1, 11, (9, 2, 5)).astype(np.float32)
    obs[rng.random(obs.shape) < 0.4] = 0.0
    obs[0, 1, :3] = 0.0  # agent 1 has no token at step 0

    def both(params, obs):
        f = pol.chunk_features(params, obs)
        return f, pol.net.read_out(params, f), pol.chunk_logits(params, obs)

    f, read, logits = fast_call(both, params, jnp.asarray(obs))
    assert f.shape == (9, 2, 16)
    np.testing.assert_allclose(read, logits, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(f[0, 1]) == 0.0)
    assert np.abs(np.asarray(logits)).max() > 1.0  # not a trivially small head


@pytest.fixture(scope="module")
def arith_shift():
    """An untrained greedy tiny student on ``tokens:arith`` (two operations):
    its episodes and the expert's, and the driver's table of them."""
    env = envs.make("tokens:arith", num_ops=2)
    student = TransformerPolicy(config_for_env(env, "tiny", d_model=32, num_layers=1))
    params = _params(student, 1)
    expert = scripted_expert(env)[0]
    eps = dg.shift_episodes(env, student, params, expert, jax.random.PRNGKey(1), 8,
                            deterministic=True, compiler_options=FAST_COMPILE)
    table = dg.shift_table(student, params, eps, jax.random.PRNGKey(2), 4, max_samples=None,
                           compiler_options=FAST_COMPILE)
    return student, params, eps, table


@pytest.mark.slow
def test_covariate_shift_table_matches_a_reference_from_its_own_episodes(arith_shift):
    """The driver's per-turn columns recomputed outside it from the same
    episodes: turns by a loop over the tokens, the student's greedy token by
    argmax over the legal logits, MMD² of the bins' features gathered by
    hand (the student's first half and the expert's first half, each against
    the expert's second half). The expert's own episodes have the grammar's
    turns — ``CALC a op b <eot>`` twice, then ``SUBMIT r <eot>`` — so the
    floor counts are exactly E·(5, 5, 3, 0); and the greedy student's
    teacher-forced token is the token it played. Kills: the turn bins off by
    one token or one turn, the student's and the expert's episodes swapped
    (in either column, or in the MMD halves), the expert's labels replaced by
    the student's own tokens, and teacher-forced logits read one step off."""
    student, params, eps, table = arith_shift
    E, B = 8, 4
    np.testing.assert_array_equal(table["count_floor"], [5 * E, 5 * E, 3 * E, 0])
    np.testing.assert_array_equal(table["turn_bin"], np.arange(B))
    assert table["expert_win_rate"] == 1.0 and table["num_episodes"] == E

    def scores(params, obs):
        per_ep = jax.vmap(student.chunk_logits, in_axes=(None, 0))
        feats = jax.vmap(student.chunk_features, in_axes=(None, 0))
        return per_ep(params, obs), feats(params, obs)

    both_logits, both_feats = fast_call(scores, params,
                                        jnp.concatenate([eps.student.obs, eps.expert.obs]))
    columns = {}
    for j, (name, ep, target) in enumerate((("student", eps.student, eps.labels),
                                            ("floor", eps.expert, eps.expert.actions))):
        logits = np.asarray(both_logits[j * E:(j + 1) * E])
        avail = np.asarray(ep.avail)
        pred = np.where(avail, logits, -np.inf).argmax(-1)
        turn = np.stack([_turns_np(a) for a in ep.actions])
        only_wait = avail[..., WAIT] & (avail.sum(-1) == 1)
        said = np.asarray(ep.mask)[..., None] & ~only_wait
        if name == "student":
            # Greedy rollout: the teacher-forced mode is the token played.
            np.testing.assert_array_equal(pred[said], np.asarray(ep.actions)[said])
            assert np.mean(pred[said] != np.asarray(target)[said]) > 0.3
        columns[name] = (np.asarray(both_feats[j * E:(j + 1) * E]), turn, said)
        rate, count = _disagreement_np(pred, np.asarray(target), turn, said, B)
        np.testing.assert_array_equal(table[f"count_{name}"], count)
        np.testing.assert_allclose(table[f"disagreement_{name}"], rate, rtol=1e-6)
    assert not np.array_equal(table["count_student"], table["count_floor"])

    def gather(which, rows, b):
        """The bin's features of episodes ``rows``, flat, and which are in it."""
        feats, turn, said = columns[which]
        keep = said[rows] & (np.minimum(turn[rows], B - 1) == b)[..., None]
        return feats[rows].reshape(-1, feats.shape[-1]), keep.reshape(-1)

    mmd = fast_compile(mmd2_unbiased, *gather("floor", slice(0, E // 2), 0) * 2)
    h = E // 2
    first, second = slice(0, h), slice(h, E)
    for b in range(B):
        ref, ref_keep = gather("floor", second, b)
        assert table["mmd_samples_expert"][b] == ref_keep.sum()
        for col, (x, keep) in (("student", gather("student", first, b)),
                               ("floor", gather("floor", first, b))):
            assert table[f"mmd_samples_{col}"][b] == keep.sum()
            m, _, _ = mmd(x, keep, ref, ref_keep)
            np.testing.assert_allclose(table[f"mmd2_{col}"][b], m, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_covariate_shift_rows_are_json_ready(arith_shift):
    """One row per turn bin with Python numbers and None for the empty
    bins, and the scalars repeated. Kills NaN written into JSON (invalid
    JSON) and rows misaligned with their bin."""
    *_, table = arith_shift
    rows = dg.covariate_shift_rows(table)
    assert [r["turn"] for r in rows] == ["0", "1", "2", "≥3"]
    assert rows[3]["disagreement_floor"] is None and rows[3]["count_floor"] == 0
    assert rows[0]["count_floor"] == int(table["count_floor"][0])
    json.loads(json.dumps(rows, allow_nan=False))
