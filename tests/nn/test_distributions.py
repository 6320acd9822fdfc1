"""Masked categorical and box tanh-Gaussian against float64 numpy references."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.fast_compile import fast_call

from jaxil.nn import distributions as D


def _maybe_jit(fn, jit, **kw):
    return jax.jit(fn, **kw) if jit else fn


def _key(seed):
    # RBG keys: the sampling maths is the same, and XLA compiles RBG bits much
    # faster than threefry on small CPUs.
    return jax.random.key(seed, impl="unsafe_rbg")


def _np_log_softmax_masked(logits, avail):
    logits = logits.astype(np.float64)
    out = np.full_like(logits, -np.inf)
    for idx in np.ndindex(logits.shape[:-1]):
        a = avail[idx]
        if not a.any():  # documented fallback: uniform over all actions
            out[idx] = -math.log(logits.shape[-1])
            continue
        x = logits[idx][a]
        lse = x.max() + np.log(np.exp(x - x.max()).sum())
        out[idx][a] = x - lse
    return out


def _random_categorical(seed, shape=(5, 3), num_actions=6):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=shape + (num_actions,)).astype(np.float32) * 3
    avail = rng.random(shape + (num_actions,)) < 0.6
    avail[0, 0] = False  # an all-unavailable row
    avail[1, 1] = False
    avail[1, 1, 2] = True  # a single available action
    return logits, avail


@pytest.mark.parametrize("jit", [False, True])
def test_categorical_log_prob_matches_numpy(jit):
    logits, avail = _random_categorical(0)
    ref = _np_log_softmax_masked(logits, avail)
    rng = np.random.default_rng(1)
    # Data actions: available ones where the row has any.
    actions = np.zeros(logits.shape[:-1], np.int32)
    for idx in np.ndindex(actions.shape):
        choices = np.flatnonzero(avail[idx]) if avail[idx].any() else np.arange(logits.shape[-1])
        actions[idx] = rng.choice(choices)
    got = _maybe_jit(D.categorical_log_prob, jit)(jnp.asarray(logits), jnp.asarray(avail), jnp.asarray(actions))
    want = np.take_along_axis(ref, actions[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    assert got.shape == actions.shape


@pytest.mark.parametrize("jit", [False, True])
def test_masked_softmax_zero_on_unavailable_and_uniform_fallback(jit):
    logits, avail = _random_categorical(2)
    masked = _maybe_jit(D.masked_logits, jit)(jnp.asarray(logits), jnp.asarray(avail))
    p = np.asarray(jax.nn.softmax(masked, axis=-1))
    assert np.all(np.isfinite(np.asarray(masked)))
    assert np.all(np.isfinite(p))
    has_any = np.broadcast_to(avail.any(-1, keepdims=True), avail.shape)
    assert np.all(p[has_any & ~avail] == 0.0)  # exactly 0, not just small
    np.testing.assert_allclose(p[0, 0], np.full(avail.shape[-1], 1 / avail.shape[-1]), rtol=1e-6)
    np.testing.assert_allclose(p[1, 1, 2], 1.0)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)


@jax.jit  # module level: compiled once for both cases
def _entropy_and_log_prob_grads(logits, avail):
    zeros = jnp.zeros(logits.shape[:-1], jnp.int32)
    return (jax.grad(lambda l: D.categorical_entropy(l, avail).sum())(logits),
            jax.grad(lambda l: D.categorical_log_prob(l, avail, zeros).sum())(logits))


@pytest.mark.parametrize("jit", [False, True])
def test_categorical_entropy_matches_numpy_and_has_finite_grads(jit):
    logits, avail = _random_categorical(3)
    ref = _np_log_softmax_masked(logits, avail)
    p = np.exp(ref)
    want = -np.sum(np.where(p > 0, p * np.where(p > 0, ref, 0.0), 0.0), -1)
    ent = _maybe_jit(D.categorical_entropy, jit)
    got = ent(jnp.asarray(logits), jnp.asarray(avail))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(got[0, 0]), math.log(avail.shape[-1]), rtol=1e-6)
    grads = _entropy_and_log_prob_grads(jnp.asarray(logits), jnp.asarray(avail))
    for g in grads:
        assert np.all(np.isfinite(np.asarray(g)))
        assert np.all(np.asarray(g)[~avail] == 0)  # no gradient into masked logits


def test_categorical_sample_and_mode_respect_mask():
    logits, avail = _random_categorical(4, shape=(4, 3), num_actions=5)
    logits_j, avail_j = jnp.asarray(logits), jnp.asarray(avail)

    def samples_and_mode(key, logits, avail):
        keys = jax.random.split(key, 2000)
        return jax.vmap(D.categorical_sample, (0, None, None))(keys, logits, avail), D.categorical_mode(logits, avail)

    # The draws and the mode in one jitted program (one compile, at XLA level 0).
    samples, mode = (np.asarray(x) for x in fast_call(samples_and_mode, _key(0), logits_j, avail_j))
    assert samples.dtype == np.int32 and samples.shape == (2000, 4, 3)
    has_any = avail.any(-1)
    taken_avail = np.take_along_axis(np.broadcast_to(avail, (2000,) + avail.shape), samples[..., None], -1)[..., 0]
    assert np.all(taken_avail[:, has_any])
    # Empirical frequencies match the masked softmax.
    p = np.exp(_np_log_softmax_masked(logits, avail))
    freq = np.stack([(samples == a).mean(0) for a in range(logits.shape[-1])], -1)
    np.testing.assert_allclose(freq, p, atol=0.05)
    assert mode.dtype == np.int32
    masked = np.where(avail, logits, -np.inf)
    np.testing.assert_array_equal(mode[has_any], masked.argmax(-1)[has_any])


def test_categorical_shape_checks():
    logits = np.zeros((4, 5))
    with pytest.raises(AssertionError):
        D.masked_logits(logits, np.ones((4, 6), bool))
    with pytest.raises(AssertionError):
        D.categorical_log_prob(logits, np.ones((4, 5), bool), np.zeros((3,), jnp.int32))
    with pytest.raises(AssertionError):
        D.categorical_log_prob(logits, np.ones((4, 5), bool), np.zeros((4,), jnp.float32))


# ---------------------------------------------------------------- tanh-Gaussian


def _np_tanh_gaussian_log_prob(mean, log_std, actions, low, high, eps=1e-6):
    mean, log_std, actions = (np.asarray(x, np.float64) for x in (mean, log_std, actions))
    loc, scale = (high + low) / 2, (high - low) / 2
    y = np.clip((actions - loc) / scale, -1 + eps, 1 - eps)
    u = np.arctanh(y)
    std = np.exp(log_std)
    log_n = -0.5 * ((u - mean) / std) ** 2 - log_std - 0.5 * np.log(2 * np.pi)
    return np.sum(log_n - np.log(1 - y**2) - np.log(scale), -1)


# Two of the four (jit, box) combinations, each value of each once: the
# scalar box eagerly, the per-dimension box jitted.
@pytest.mark.parametrize("jit,box", [(False, (-1.0, 1.0)),
                                     (True, (np.array([-2.0, 0.0, 1.0]), np.array([3.0, 0.5, 4.0])))],
                         ids=["eager-box0", "jit-box1"])
def test_tanh_gaussian_log_prob_matches_numpy(jit, box):
    low, high = box
    rng = np.random.default_rng(5)
    mean = rng.normal(size=(6, 2, 3)).astype(np.float32)
    log_std = rng.uniform(-1.5, 0.5, size=(6, 2, 3)).astype(np.float32)
    y = rng.uniform(-0.98, 0.98, size=(6, 2, 3))
    actions = ((high + low) / 2 + (high - low) / 2 * y).astype(np.float32)
    got = _maybe_jit(D.tanh_gaussian_log_prob, jit)(
        jnp.asarray(mean), jnp.asarray(log_std), jnp.asarray(actions), low, high
    )
    want = _np_tanh_gaussian_log_prob(mean, log_std, actions, low, high)
    assert got.shape == (6, 2)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def test_tanh_gaussian_log_prob_finite_on_bounds():
    mean = np.zeros((3, 2))
    log_std = np.zeros((3, 2))
    actions = np.array([[-1.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])
    lp, g = jax.jit(jax.value_and_grad(lambda m: D.tanh_gaussian_log_prob(m, log_std, actions).sum()))(mean)
    assert np.isfinite(float(lp))
    assert np.all(np.isfinite(np.asarray(g)))


def test_tanh_gaussian_density_integrates_to_one_1d():
    grid01 = np.linspace(0.0, 1.0, 100_001)

    @jax.jit
    def density(mean, log_std, low, high):
        a = low + (high - low) * jnp.asarray(grid01, jnp.float32)
        lp = D.tanh_gaussian_log_prob(
            jnp.full((grid01.size, 1), mean), jnp.full((grid01.size, 1), log_std), a[:, None], low, high
        )
        return jnp.exp(lp)

    for mean, log_std, low, high in [(0.0, 0.0, -1.0, 1.0), (0.7, -0.5, -2.0, 3.0), (-1.2, 0.4, 0.0, 0.5)]:
        dens = np.asarray(density(mean, log_std, low, high), np.float64)
        grid = low + (high - low) * grid01
        total = np.sum((dens[1:] + dens[:-1]) / 2 * np.diff(grid))
        np.testing.assert_allclose(total, 1.0, atol=2e-3)


def test_tanh_gaussian_sample_consistent_with_log_prob_and_mc():
    low, high = np.array([-2.0, 0.0]), np.array([3.0, 0.5])
    mean = np.array([[0.3, -0.4]], np.float32)
    log_std = np.array([[-0.3, -0.8]], np.float32)

    def sample_and_eval(key):
        keys = jax.random.split(key, 20_000)
        actions, lp = jax.vmap(lambda k: D.tanh_gaussian_sample(k, mean, log_std, low, high))(keys)
        b = jnp.broadcast_to
        lp_eval = D.tanh_gaussian_log_prob(b(mean, actions.shape), b(log_std, actions.shape), actions, low, high)
        return actions, lp, lp_eval

    # One jitted program (one compile, at XLA level 0).
    actions, lp, lp_eval = (np.asarray(a) for a in fast_call(sample_and_eval, _key(7)))
    assert actions.shape == (20_000, 1, 2) and lp.shape == (20_000, 1)
    assert np.all(actions >= low) and np.all(actions <= high)
    y = (actions - (high + low) / 2) / ((high - low) / 2)
    inside = np.all(np.abs(y) < 0.999, -1)
    np.testing.assert_allclose(lp[inside], lp_eval[inside], rtol=1e-3, atol=1e-3)
    # Monte-Carlo: the mean of the squashed sample matches quadrature in float64.
    u = np.linspace(-10, 10, 100_001)
    for d in range(2):
        m, s = float(mean[0, d]), float(np.exp(log_std[0, d]))
        pdf = np.exp(-0.5 * ((u - m) / s) ** 2) / (s * np.sqrt(2 * np.pi))
        a = (high[d] + low[d]) / 2 + (high[d] - low[d]) / 2 * np.tanh(u)
        ref = np.sum(a * pdf) * (u[1] - u[0])
        se = actions[:, 0, d].std() / np.sqrt(actions.shape[0])
        assert abs(actions[:, 0, d].mean() - ref) < 5 * se


def test_tanh_gaussian_sample_is_reparameterised():
    def f(mean, log_std):
        a, _ = D.tanh_gaussian_sample(_key(0), mean, log_std)
        return a.sum()

    gm, gs = jax.jit(jax.grad(f, argnums=(0, 1)))(np.zeros((4, 2)), np.zeros((4, 2)))
    assert np.all(np.abs(np.asarray(gm)) > 0) and np.all(np.isfinite(np.asarray(gs)))


def test_tanh_gaussian_mode_and_shape_checks():
    mode = D.tanh_gaussian_mode(np.array([[0.0, 100.0, -100.0]]), -2.0, 4.0)
    np.testing.assert_allclose(np.asarray(mode), [[1.0, 4.0, -2.0]], atol=1e-6)
    with pytest.raises(AssertionError):
        D.tanh_gaussian_log_prob(np.zeros((3, 2)), np.zeros((3, 2)), np.zeros((3, 3)))
    with pytest.raises(AssertionError):
        D.tanh_gaussian_sample(_key(0), np.zeros((3, 2)), np.zeros((2, 2)))


# --------------------------------------------------------------------------
# Diagonal Gaussian of the pre-squash variable (PPO's raw actions).
# --------------------------------------------------------------------------


@pytest.mark.parametrize("jit", [False, True])
def test_gaussian_log_prob_entropy_and_squash_match_numpy(jit):
    """A dropped −log σ, a per-dimension instead of summed density, an entropy
    without the ½·log(2πe) constant, or a squash onto the wrong interval fails
    the float64 reference."""
    rng = np.random.default_rng(11)
    # (The shape of the tanh-Gaussian test: eagerly, its ops are compiled already.)
    mean, x = rng.normal(size=(2, 6, 2, 3)).astype(np.float32)
    log_std = (0.4 * rng.normal(size=(6, 2, 3))).astype(np.float32)
    lp = _maybe_jit(D.gaussian_log_prob, jit)(mean, log_std, x)
    ent = _maybe_jit(D.gaussian_entropy, jit)(log_std)
    sd = np.exp(log_std.astype(np.float64))
    z = (x - mean) / sd
    np.testing.assert_allclose(np.asarray(lp), (-0.5 * z**2 - np.log(sd) - 0.5 * np.log(2 * np.pi)).sum(-1),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), (np.log(sd) + 0.5 * np.log(2 * np.pi * np.e)).sum(-1),
                               rtol=1e-5, atol=1e-6)
    low, high = np.array([-2.0, 0.0]), np.array([3.0, 0.5])
    u = np.array([[-1e3, 0.0], [0.3, 1e3]], np.float32)
    want = (high + low) / 2 + (high - low) / 2 * np.tanh(u.astype(np.float64))
    np.testing.assert_allclose(np.asarray(_maybe_jit(D.squash, jit)(u, low, high)), want, atol=1e-6)


def test_gaussian_sample_matches_its_density_and_the_tanh_sample():
    """The pre-squash draw has the requested mean and spread, and squashing it
    gives exactly the tanh-Gaussian sample of the same key (one sampler, not
    two that could drift apart)."""
    mean = np.array([[0.5, -1.0]], np.float32)
    log_std = np.array([[-0.5, 0.2]], np.float32)

    def draws(key):
        keys = jax.random.split(key, 20_000)
        u = jax.vmap(lambda k: D.gaussian_sample(k, mean, log_std))(keys)
        # The tanh-Gaussian sample of the first key, outside the vmap.
        a, lp = D.tanh_gaussian_sample(keys[0], mean, log_std, -1.0, 1.0)
        return u, a, lp, D.squash(u[0]), D.gaussian_log_prob(mean, log_std, u[0])

    # Every evaluation in one jitted program (one compile, at XLA level 0).
    u, a, lp, squashed, lp_gauss = (np.asarray(x) for x in fast_call(draws, _key(3)))
    se = np.exp(log_std) / np.sqrt(len(u))
    assert np.all(np.abs(u.mean(0) - mean) < 5 * se)
    np.testing.assert_allclose(u.std(0), np.exp(log_std), rtol=0.03)
    # (vmapped vs not: equal up to float32 rounding)
    np.testing.assert_allclose(a, squashed, rtol=1e-6, atol=1e-7)
    # log p(a) = log N(u) − Σ log(1 − tanh²u) on [−1, 1].
    ref = lp_gauss - np.log(1 - np.tanh(u[0].astype(np.float64)) ** 2).sum(-1)
    np.testing.assert_allclose(lp, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(AssertionError):
        D.gaussian_log_prob(np.zeros((3, 2)), np.zeros((3, 1)), np.zeros((3, 2)))


# --------------------------------------------------------------------------
# Censored ("clipped") Gaussian on a box.
# --------------------------------------------------------------------------


def _np_censored_log_prob(mean, log_std, actions, low, high, tol=1e-6):
    from scipy.stats import norm

    mean, log_std, actions = (np.asarray(x, np.float64) for x in (mean, log_std, actions))
    low, high = np.broadcast_to(low, mean.shape), np.broadcast_to(high, mean.shape)
    sd = np.exp(log_std)
    width = tol * (high - low)
    out = np.where(actions <= low + width, norm.logcdf(low, mean, sd),
                   np.where(actions >= high - width, norm.logsf(high, mean, sd),
                            norm.logpdf(actions, mean, sd)))
    return out.sum(-1)


def _censored_inputs(seed, low, high, shape=(6, 2, 3)):
    # (The shape of the other box tests: eagerly, the shared ops are compiled once.)
    rng = np.random.default_rng(seed)
    lo, hi = np.broadcast_to(low, shape), np.broadcast_to(high, shape)
    mean = (lo + (hi - lo) * rng.uniform(-0.5, 1.5, size=shape)).astype(np.float32)
    log_std = rng.uniform(-2.0, 0.5, size=shape).astype(np.float32)
    pick = rng.integers(0, 4, size=shape)  # 0: low, 1: high, 2: inside, 3: outside the box
    inside = lo + (hi - lo) * rng.uniform(0.01, 0.99, size=shape)
    outside = np.where(rng.random(shape) < 0.5, lo - 0.3, hi + 0.3)
    actions = np.choose(pick, [lo, hi, inside, outside]).astype(np.float32)
    return mean, log_std, actions


# Two of the four (jit, box) combinations, each value of each once: the
# scalar box eagerly, the per-dimension box jitted.
@pytest.mark.parametrize("jit,box", [(False, (0.0, 1.0)),
                                     (True, (np.array([-2.0, 0.0, 1.0]), np.array([3.0, 0.5, 4.0])))],
                         ids=["eager-box0", "jit-box1"])
def test_censored_gaussian_log_prob_matches_scipy(jit, box):
    """Per dimension: log Φ on the lower bound, log(1 − Φ) on the upper, the
    Gaussian log-density inside, summed over d (the two tails swapped, a
    density used on the bounds, an action outside the box not counted on its
    bound, or a per-dimension instead of summed result fails the float64
    scipy reference)."""
    low, high = box
    mean, log_std, actions = _censored_inputs(3, low, high)
    got = _maybe_jit(D.censored_gaussian_log_prob, jit)(mean, log_std, actions, low, high)
    assert got.shape == (6, 2)
    np.testing.assert_allclose(np.asarray(got), _np_censored_log_prob(mean, log_std, actions, low, high),
                               rtol=1e-4, atol=1e-4)


def test_censored_gaussian_tail_far_from_the_bound_is_finite_and_steep():
    """A mean 40 std inside the box gives an action on the bound a large
    negative finite log-probability with a finite gradient pushing the mean
    out (log(ndtr) instead of log_ndtr underflows to −inf and NaN gradients)."""
    f = lambda m: D.censored_gaussian_log_prob(m, jnp.full((1, 2), -3.0), jnp.array([[0.0, 1.0]]), 0.0, 1.0)
    m = jnp.array([[2.0, -1.0]])  # std e^-3 ≈ 0.05: both 40 std away
    lp, g = fast_call(jax.value_and_grad(lambda m: f(m).sum()), m)  # jitted (XLA level 0)
    from scipy.stats import norm

    sd = math.exp(-3.0)
    np.testing.assert_allclose(float(lp), norm.logcdf(0.0, 2.0, sd) + norm.logsf(1.0, -1.0, sd), rtol=1e-4)
    g = np.asarray(g)
    assert np.all(np.isfinite(g)) and g[0, 0] < 0 < g[0, 1]


def test_censored_gaussian_mass_sums_to_one_and_sampling_hits_the_bounds():
    """P(low) + P(high) + the integral of the density inside is 1 (a tail
    counted twice or forgotten fails), and clipped draws land on each bound
    with exactly those probabilities (a sampler that squashes or resamples
    instead of clipping fails)."""
    low, high = np.array([0.0, -2.0]), np.array([1.0, 3.0])
    mean = np.array([[0.2, 3.5]], np.float32)
    log_std = np.array([[-0.7, 0.3]], np.float32)

    def per_dim(a):  # [G, 2] actions -> [G, 2] per-dimension log-likelihoods
        m, s = jnp.broadcast_to(mean, a.shape), jnp.broadcast_to(log_std, a.shape)
        return jax.vmap(D.censored_gaussian_log_prob, in_axes=(1, 1, 1, 0, 0), out_axes=1)(
            m[..., None], s[..., None], a[..., None], jnp.asarray(low, jnp.float32),
            jnp.asarray(high, jnp.float32))

    num_draws = 20_000

    def evaluate(grid, ends, key):
        keys = jax.random.split(key, num_draws)
        acts = jax.vmap(lambda k: D.censored_gaussian_sample(k, mean, log_std, low, high))(keys)
        return per_dim(grid), per_dim(ends), acts, D.censored_gaussian_mode(jnp.array([[-1.0, 0.4, 9.0]]), 0.0, 1.0)

    grid = low + (high - low) * np.linspace(1e-5, 1 - 1e-5, 50_001)[:, None]
    # Every evaluation in one jitted program (one compile, at XLA level 0).
    lp_grid, lp_ends, acts, mode = (np.asarray(x) for x in fast_call(
        evaluate, jnp.asarray(grid, jnp.float32), jnp.asarray(np.stack([low, high]), jnp.float32), _key(5)))
    dens = np.exp(lp_grid.astype(np.float64))
    inside = np.sum((dens[1:] + dens[:-1]) / 2 * np.diff(grid, axis=0), axis=0)
    p_ends = np.exp(lp_ends.astype(np.float64))
    np.testing.assert_allclose(inside + p_ends.sum(0), 1.0, atol=2e-3)
    assert np.all(acts >= low) and np.all(acts <= high)
    freq = np.stack([(acts == low)[:, 0].mean(0), (acts == high)[:, 0].mean(0)])
    se = np.sqrt(p_ends * (1 - p_ends) / num_draws) + 1e-3
    assert np.all(np.abs(freq - p_ends) < 5 * se), (freq, p_ends)
    np.testing.assert_allclose(mode, [[0.0, 0.4, 1.0]])


def test_censored_gaussian_fits_bound_heavy_data_where_tanh_gaussian_diverges():
    """Maximum likelihood on clipped Gaussian data with 43 % of the actions on
    the lower bound: the censored Gaussian converges to the generating mean
    and std (Tobit is consistent) and so to the data's share of actions near
    the bound; the tanh-Gaussian, whose density of an action on the bound is
    ~1/eps, spreads its pre-squash Gaussian until it saturates (the failure
    seen on MPE spread). Bound actions scored with the density
    instead of Φ, or the two tails swapped, fail the first checks."""
    from scipy.stats import norm as scipy_norm

    rng = np.random.default_rng(0)
    m_true, sd_true = 0.05, 0.3
    x = np.clip(rng.normal(m_true, sd_true, 4000), 0.0, 1.0).astype(np.float32)[:, None]

    def fit(log_prob, steps, p):
        def loss(p):
            m, s = p
            return -jnp.mean(log_prob(jnp.full_like(x, m), jnp.full_like(x, s), x, 0.0, 1.0))

        def body(p, _):
            l, g = jax.value_and_grad(loss)(p)
            return jax.tree.map(lambda a, b: a - 0.05 * b, p, g), l
        return jax.lax.scan(body, p, None, length=steps)

    @jax.jit  # both fits in one program: one compile
    def fit_both(p):
        return fit(D.censored_gaussian_log_prob, 3000, p), fit(D.tanh_gaussian_log_prob, 3000, p)

    ((m, s), losses), ((m_t, s_t), _) = jax.tree.map(
        np.asarray, fit_both((jnp.float32(0.5), jnp.float32(0.0))))
    assert abs(float(m) - m_true) < 0.03 and abs(math.exp(float(s)) - sd_true) < 0.03, (m, s)
    assert abs(float(losses[-1] - losses[-500])) < 1e-4  # converged
    near = float(np.mean(x < 0.01))  # the data's share within 0.01 of the bound
    cdf = scipy_norm.cdf  # (float64; the check's margins are 0.03 and 0.15)
    assert abs(float(cdf(0.01, m, np.exp(s))) - near) < 0.03
    tanh_near = float(cdf(math.atanh(2 * 0.01 - 1), m_t, np.exp(s_t)))
    assert tanh_near > near + 0.15, (tanh_near, near)


# --------------------------------------------------------------------------
# Beta on a box.
# --------------------------------------------------------------------------


def _beta_inputs(seed, shape=(6, 2, 3)):
    rng = np.random.default_rng(seed)
    alpha = np.exp(rng.uniform(-2.0, 2.0, size=shape)).astype(np.float32)
    beta = np.exp(rng.uniform(-2.0, 2.0, size=shape)).astype(np.float32)
    return alpha, beta


def _beta_log_prob_and_entropy(alpha, beta, actions, low, high):
    return D.beta_log_prob(alpha, beta, actions, low, high), D.beta_entropy(alpha, beta, low, high)


# Two of the four (jit, box) combinations, each value of each once (every
# combination compiles the digamma/lgamma maths anew): the scalar box
# eagerly, the per-dimension box jitted.
@pytest.mark.parametrize("jit,box", [(False, (0.0, 1.0)),
                                     (True, (np.array([-2.0, 0.0, 1.0]), np.array([3.0, 0.5, 4.0])))],
                         ids=["eager-box0", "jit-box1"])
def test_beta_log_prob_and_entropy_match_scipy(jit, box):
    """Log-density and differential entropy of the box Beta against scipy in
    float64 (α and β swapped, a missing −log(high − low), or a sign slip in a
    digamma term of the entropy fails)."""
    from scipy.stats import beta as sbeta

    low, high = box
    alpha, beta = _beta_inputs(1)
    rng = np.random.default_rng(2)
    lo, hi = np.broadcast_to(low, alpha.shape), np.broadcast_to(high, alpha.shape)
    actions = (lo + (hi - lo) * rng.uniform(0.02, 0.98, size=alpha.shape)).astype(np.float32)
    if jit:  # compiled at XLA level 0 (the last bits differ, far inside the tolerance)
        got, ent = fast_call(_beta_log_prob_and_entropy, alpha, beta, actions, low, high)
    else:
        got, ent = _beta_log_prob_and_entropy(alpha, beta, actions, low, high)
    a64, b64 = alpha.astype(np.float64), beta.astype(np.float64)
    want = sbeta.logpdf(actions.astype(np.float64), a64, b64, loc=lo, scale=hi - lo).sum(-1)
    assert got.shape == (6, 2)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(ent), sbeta.entropy(a64, b64, loc=lo, scale=hi - lo).sum(-1),
                               rtol=1e-4, atol=1e-4)


def test_beta_mode_and_bound_actions():
    """The mode is the density's argmax in every regime (interior, J-shaped
    either way, U-shaped; α and β swapped fails), and actions on the bounds
    get finite log-densities."""
    from scipy.stats import beta as sbeta

    grid = np.linspace(1e-4, 1 - 1e-4, 20_001)
    cases = np.array([(2.0, 5.0), (0.5, 2.0), (3.0, 0.4), (0.3, 0.6), (0.7, 0.2), (1.0, 1.0)], np.float32)

    @jax.jit  # every evaluation in one program: one compile
    def modes_and_bound_log_prob(cases):
        return (D.beta_mode(cases[:, :1], cases[:, 1:]), D.beta_mode(cases[:1, :1], cases[:1, 1:], -2.0, 3.0),
                D.beta_log_prob(jnp.full((1, 2), 0.5), jnp.full((1, 2), 3.0), jnp.array([[0.0, 1.0]])))

    modes, mode_box, lp = (np.asarray(x) for x in modes_and_bound_log_prob(cases))
    modes = modes[:, 0]
    assert modes[-1] == 0.5  # uniform: the middle
    for (a, b), mode in zip(cases[:-1], modes[:-1]):
        assert abs(mode - grid[np.argmax(sbeta.pdf(grid, a, b))]) < 1e-3, (a, b, mode)
    np.testing.assert_allclose(mode_box, [[-2.0 + 5.0 * 0.2]], rtol=1e-6)
    assert np.isfinite(float(lp[0]))
    with pytest.raises(AssertionError):
        D.beta_log_prob(np.ones((3, 2)), np.ones((3, 1)), np.ones((3, 2)))


@pytest.mark.slow
def test_beta_sample_moments_and_gradients():
    """Draws have the Beta's mean and variance on the box (a sampler of
    Beta(β, α) or on [0, 1] fails) and are differentiable in the
    concentrations. Slow: XLA compiles JAX's gamma sampler for ~15 s."""
    low, high = np.array([-2.0, 0.0]), np.array([3.0, 0.5])
    alpha = np.array([[2.0, 0.3]], np.float32)
    beta = np.array([[5.0, 1.5]], np.float32)
    keys = jax.random.split(_key(9), 20_000)
    x = np.asarray(jax.jit(jax.vmap(lambda k: D.beta_sample(k, alpha, beta, low, high)))(keys), np.float64)
    assert np.all(x >= low) and np.all(x <= high)
    m = alpha / (alpha + beta)
    v = alpha * beta / ((alpha + beta) ** 2 * (alpha + beta + 1))
    w = high - low
    se = np.sqrt(v) * w / np.sqrt(len(keys))
    assert np.all(np.abs(x.mean(0) - (low + w * m)) < 5 * se)
    np.testing.assert_allclose(x.var(0), v * w**2, rtol=0.05)
    g = jax.grad(lambda a: D.beta_sample(_key(0), a, jnp.ones((4, 2))).sum())(jnp.full((4, 2), 2.0))
    assert np.all(np.isfinite(np.asarray(g))) and np.all(np.asarray(g) > 0)
