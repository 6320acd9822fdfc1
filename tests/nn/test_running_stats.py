"""Running observation statistics (jaxil.nn.running_stats) against a float64
numpy reference, with and without jit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil.nn import running_stats as rs


def _reference(batches, weights=None):
    """Gym's RunningMeanStd in float64: mean 0, var 1, count 1e-4, then the
    parallel merge of each batch (weighted rows count that many times)."""
    mean, var, count = np.zeros(batches[0].shape[-1]), np.ones(batches[0].shape[-1]), 1e-4
    for i, x in enumerate(batches):
        x = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
        w = np.ones(len(x)) if weights is None else np.asarray(weights[i], np.float64).reshape(-1)
        n = w.sum()
        if n == 0:
            continue
        bm = (w[:, None] * x).sum(0) / n
        bv = (w[:, None] * (x - bm) ** 2).sum(0) / n
        d = bm - mean
        tot = count + n
        mean, var, count = (mean + d * n / tot,
                            (var * count + bv * n + d ** 2 * count * n / tot) / tot, tot)
    return mean, var, count


@pytest.mark.parametrize("jit", [False, True])
def test_update_matches_the_float64_reference_and_the_pooled_moments(jit):
    """Three batches of different shapes (leading axes pooled) on features of
    very different scales. Fails if the merge drops the δ² n n_B / n' term
    (the pooled variance is then too small by the spread of the batch
    means), uses the sample variance (ddof=1), or pools only the last axis
    pair."""
    rng = np.random.default_rng(0)
    scale = np.array([0.1, 1.0, 30.0, 5.0], np.float32)
    shift = np.array([3.0, -1.0, 100.0, 0.0], np.float32)
    batches = [(rng.normal(size=s + (4,)) * scale + shift + i).astype(np.float32)
               for i, s in enumerate([(16, 3), (5,), (2, 7, 3)])]
    up = jax.jit(rs.update) if jit else rs.update
    stats = rs.init(4)
    for x in batches:
        stats = up(stats, jnp.asarray(x))
    mean, var, count = _reference(batches)
    np.testing.assert_allclose(np.asarray(stats.mean), mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(stats.var), var, rtol=1e-4)
    np.testing.assert_allclose(float(stats.count), count, rtol=1e-6)
    pooled = np.concatenate([b.reshape(-1, 4) for b in batches]).astype(np.float64)
    np.testing.assert_allclose(np.asarray(stats.mean), pooled.mean(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(stats.var), pooled.var(0), rtol=1e-3)


@pytest.mark.parametrize("jit", [False, True])
def test_weights_count_rows_and_zero_weight_leaves_no_trace(jit):
    """A row of weight 2 counts as two copies; rows of weight 0 (padding)
    change nothing; a batch of total weight 0 leaves the statistics as they
    were (no division by zero). Fails if the weight multiplies only the mean
    or is ignored."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 2, 3)).astype(np.float32) * 4
    w = rng.integers(0, 3, size=(6, 2)).astype(np.float32)
    up = jax.jit(rs.update) if jit else rs.update
    got = up(rs.init(3), jnp.asarray(x), jnp.asarray(w))
    mean, var, count = _reference([x], [w])
    np.testing.assert_allclose(np.asarray(got.mean), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got.var), var, rtol=1e-4)
    copies = np.repeat(x.reshape(-1, 3), w.reshape(-1).astype(int), axis=0)
    dup = up(rs.init(3), jnp.asarray(copies[None]), jnp.ones((1, len(copies))))
    np.testing.assert_allclose(np.asarray(got.mean), np.asarray(dup.mean), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got.var), np.asarray(dup.var), rtol=1e-4)
    same = up(got, jnp.asarray(x), jnp.zeros((6, 2)))
    for a, b in zip(same, got):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def test_normalize_standardises_clips_and_passes_no_gradient_to_the_statistics():
    """(x − μ)/√(σ²+1e-8), clipped to ±clip; the gradient reaches the input
    but not the statistics (otherwise a trainer's optimiser would move
    them)."""
    stats = rs.RunningStats(jnp.array([1.0, -2.0]), jnp.array([4.0, 0.25]), jnp.array(10.0))
    x = jnp.array([[3.0, -2.5], [1.0, 100.0]])
    got = np.asarray(rs.normalize(stats, x, clip=5.0))
    want = np.clip((np.asarray(x) - [1.0, -2.0]) / np.sqrt(np.array([4.0, 0.25]) + 1e-8), -5, 5)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    g_stats, g_x = jax.grad(lambda s, v: rs.normalize(s, v).sum(), argnums=(0, 1))(stats, x)
    assert all(float(jnp.abs(leaf).max()) == 0.0 for leaf in jax.tree.leaves(g_stats))
    assert float(jnp.abs(g_x).max()) > 0.0


def test_shape_errors_name_the_mismatch():
    with pytest.raises(ValueError, match="x has 5 features, the statistics 3"):
        rs.update(rs.init(3), jnp.zeros((2, 5)))
    with pytest.raises(ValueError, match="weight has shape"):
        rs.update(rs.init(3), jnp.zeros((2, 3)), jnp.ones((3,)))
