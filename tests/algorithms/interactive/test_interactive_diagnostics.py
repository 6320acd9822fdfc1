"""Covariate-shift diagnostics (jaxil.algorithms.interactive.diagnostics)
against float64 numpy references written with explicit loops, with and without
jit."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers.fast_compile import fast_call, fast_compile
from jaxil.algorithms.interactive.diagnostics import disagreement_by_t, mmd2_by_t

jit_param = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])


def _maybe_jit(fn, jit, **kw):
    return jax.jit(fn, **kw) if jit else fn


# --------------------------------------------------------------------------
# disagreement_by_t


def _np_disagreement(a_s, a_e, mask, discrete):
    E, T = mask.shape
    rate, count = np.full(T, np.nan), np.zeros(T, np.int64)
    for t in range(T):
        vals = []
        for e in range(E):
            if not mask[e, t]:
                continue
            if discrete:
                per_agent = [float(a_s[e, t, i] != a_e[e, t, i]) for i in range(a_s.shape[2])]
            else:
                diff = np.asarray(a_s[e, t], np.float64) - np.asarray(a_e[e, t], np.float64)
                per_agent = [np.sqrt(np.sum(diff[i] ** 2)) for i in range(diff.shape[0])]
            vals.append(np.mean(per_agent))
        count[t] = len(vals)
        if vals:
            rate[t] = np.mean(vals)
    return rate, count


def _random_actions(rng, E, T, N, discrete, d=3, dtype=np.float32):
    if discrete:
        a_s = rng.integers(0, 3, size=(E, T, N)).astype(np.int32)
        a_e = rng.integers(0, 3, size=(E, T, N)).astype(np.int32)
    else:
        a_s = rng.normal(size=(E, T, N, d)).astype(dtype)
        a_e = rng.normal(size=(E, T, N, d)).astype(dtype)
    mask = rng.uniform(size=(E, T)) < 0.6
    mask[:, -1] = False  # one step with no valid episode: NaN, count 0
    return a_s, a_e, mask


@jit_param
@pytest.mark.parametrize("discrete", [True, False], ids=["discrete", "continuous"])
def test_disagreement_matches_numpy_reference(jit, discrete):
    """Averaging over all episodes instead of the valid ones, summing agents
    instead of averaging them, a squared or L1 distance instead of the
    Euclidean one, or averaging over the wrong axis fails the reference."""
    rng = np.random.default_rng(0)
    a_s, a_e, mask = _random_actions(rng, E=7, T=6, N=3, discrete=discrete)
    rate, count = _maybe_jit(disagreement_by_t, jit, static_argnames="discrete")(
        a_s, a_e, mask, discrete=discrete)
    want_rate, want_count = _np_disagreement(a_s, a_e, mask, discrete)
    assert rate.shape == (6,) and count.shape == (6,)
    assert count.dtype == jnp.int32 and rate.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(count), want_count)
    np.testing.assert_allclose(np.asarray(rate), want_rate, rtol=1e-5, atol=1e-6)
    assert np.isnan(np.asarray(rate)[-1]) and int(count[-1]) == 0
    assert np.all(np.isfinite(np.asarray(rate)[want_count > 0]))


def test_disagreement_hand_built_mask_off_by_one():
    """A mask read one step late or early (mask[t-1], mask[t+1]), a mask
    ignored, a sum instead of a mean over agents, or a squared distance
    instead of the Euclidean one changes these hand-computed numbers; a step
    with no valid episode is NaN, not 0."""
    # E = 2 episodes, T = 4 steps, N = 2 agents. Episode 0 ends after step 1,
    # episode 1 after step 2.
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 0]], bool)
    # Agent-mean disagreement d[e, t] (agent 1 always agrees):
    #   episode 0: [0, 1/2, 1/2, 1/2]     episode 1: [1/2, 0, 0, 1/2]
    a_e = np.zeros((2, 4, 2), np.int32)
    a_s = a_e.copy()
    a_s[0, 1:, 0] = 1
    a_s[1, [0, 3], 0] = 2
    rate, count = disagreement_by_t(a_s, a_e, mask, discrete=True)
    np.testing.assert_array_equal(np.asarray(count), [2, 2, 1, 0])
    # t=2: only episode 1 counts (0); a mask shifted right would give 1/4.
    np.testing.assert_allclose(np.asarray(rate)[:3], [0.25, 0.25, 0.0])
    assert np.isnan(np.asarray(rate)[3])

    # Continuous: the same mask, differences (3, 4) -> distance 5 for agent 0.
    c_e = np.zeros((2, 4, 2, 2), np.float32)
    c_s = c_e.copy()
    c_s[0, 1:, 0] = [3.0, 4.0]
    c_s[1, [0, 3], 0] = [3.0, 4.0]
    rate, count = disagreement_by_t(c_s, c_e, mask.astype(np.float32), discrete=False)
    np.testing.assert_array_equal(np.asarray(count), [2, 2, 1, 0])
    np.testing.assert_allclose(np.asarray(rate)[:3], [1.25, 1.25, 0.0])
    assert np.isnan(np.asarray(rate)[3])


def test_disagreement_all_masked_is_nan_and_bad_inputs_are_refused():
    """With no valid step every rate is NaN (0/0 guarded, not 0); float
    actions flagged discrete, a mask of the wrong shape, or mismatched
    student/expert shapes are refused instead of broadcast."""
    a = np.zeros((3, 5, 2), np.int32)
    rate, count = disagreement_by_t(a, a + 1, np.zeros((3, 5), bool), discrete=True)
    assert np.all(np.isnan(np.asarray(rate)))
    np.testing.assert_array_equal(np.asarray(count), 0)
    with pytest.raises(AssertionError):
        disagreement_by_t(a.astype(np.float32), a.astype(np.float32), np.ones((3, 5), bool), True)
    with pytest.raises(AssertionError):
        disagreement_by_t(a, a, np.ones((5, 3), bool), True)
    with pytest.raises(AssertionError):
        disagreement_by_t(a, a[:, :4], np.ones((3, 5), bool), True)
    with pytest.raises(AssertionError):  # continuous needs the trailing action axis
        disagreement_by_t(a.astype(np.float32), a.astype(np.float32), np.ones((3, 5), bool), False)


# --------------------------------------------------------------------------
# mmd2_by_t


def _np_mmd2_bin(xs, ys, sigma):
    """Unbiased MMD² (Gretton et al. 2012, eq. 3) with explicit pair loops."""
    xs, ys = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    m, n = len(xs), len(ys)
    if m < 2 or n < 2:
        return np.nan
    if sigma is None:
        pooled = np.concatenate([xs, ys])
        dists = [np.linalg.norm(pooled[i] - pooled[j])
                 for i, j in itertools.combinations(range(len(pooled)), 2)]
        sigma = np.median(dists)
        sigma = sigma if sigma > 0 else 1.0

    def k(a, b):
        return np.exp(-np.sum((a - b) ** 2) / (2.0 * sigma**2))

    kxx = sum(k(xs[i], xs[j]) for i in range(m) for j in range(m) if i != j)
    kyy = sum(k(ys[i], ys[j]) for i in range(n) for j in range(n) if i != j)
    kxy = sum(k(xs[i], ys[j]) for i in range(m) for j in range(n))
    return kxx / (m * (m - 1)) + kyy / (n * (n - 1)) - 2.0 * kxy / (m * n)


def _np_mmd2_by_t(x, x_mask, y, y_mask, bin_edges, sigma):
    out, nx, ny = [], [], []
    for lo, hi in zip(bin_edges[:-1], bin_edges[1:]):
        xs = [x[e, t] for e in range(x.shape[0]) for t in range(lo, hi) if x_mask[e, t]]
        ys = [y[e, t] for e in range(y.shape[0]) for t in range(lo, hi) if y_mask[e, t]]
        out.append(_np_mmd2_bin(xs, ys, sigma))
        nx.append(len(xs))
        ny.append(len(ys))
    return np.array(out), np.array(nx), np.array(ny)


def _fast_mmd2(x, x_mask, y, y_mask, bin_edges, bandwidth):
    """``jax.jit(mmd2_by_t)`` at XLA level 0 (tests/helpers/fast_compile.py), for
    tests whose claim is not about the default compile path."""
    return fast_call(lambda *a: mmd2_by_t(*a, bin_edges, bandwidth), x, x_mask, y, y_mask)


def _random_states(rng, E1, E2, T, S, shift=0.7, offset=3.0, dtype=np.float32):
    x = (offset + rng.normal(size=(E1, T, S))).astype(dtype)
    y = (offset + shift + rng.normal(size=(E2, T, S))).astype(dtype)
    x_mask = rng.uniform(size=(E1, T)) < 0.7
    y_mask = rng.uniform(size=(E2, T)) < 0.7
    return x, x_mask, y, y_mask


# (E1, E2, T, S, bin_edges): unequal sides; a bin not starting at 0, one not
# reaching T, and bins of unequal widths; a single bin over all steps. Eager
# calls compile op by op for each new shape, so only the first case (equal
# widths: one shape for every bin) runs both ways.
_SHAPES = [
    pytest.param((5, 4, 6, 3, (0, 2, 4, 6)), False, id="3bins-eager"),
    pytest.param((5, 4, 6, 3, (0, 2, 4, 6)), True, id="3bins-jit"),
    pytest.param((3, 6, 8, 2, (1, 3, 7)), True, id="offset_bins-jit"),
    pytest.param((4, 4, 3, 5, (0, 3)), True, id="one_bin-jit"),
]


@pytest.mark.parametrize("bandwidth", [1.7, None], ids=["fixed", "median"])
@pytest.mark.parametrize("shape, jit", _SHAPES)
def test_mmd2_matches_numpy_reference(shape, jit, bandwidth):
    """The biased V-statistic (i = j terms kept), dividing by m² instead of
    m(m−1), the cross term without its factor 2, padding counted as samples,
    a step landing in the wrong bin (edge_b < t <= edge_{b+1}), σ² for σ in
    the kernel, or a median over all pairs (padding, i = j) instead of the
    distinct valid ones fails the reference."""
    E1, E2, T, S, edges = shape
    rng = np.random.default_rng(sum(shape[:4]))
    x, x_mask, y, y_mask = _random_states(rng, E1, E2, T, S)
    fn = _maybe_jit(mmd2_by_t, jit, static_argnames="bin_edges")
    got, nx, ny = fn(x, x_mask, y, y_mask, bin_edges=edges, bandwidth=bandwidth)
    want, want_nx, want_ny = _np_mmd2_by_t(x, x_mask, y, y_mask, edges, bandwidth)
    B = len(edges) - 1
    assert got.shape == nx.shape == ny.shape == (B,)
    assert got.dtype == jnp.float32 and nx.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(nx), want_nx)
    np.testing.assert_array_equal(np.asarray(ny), want_ny)
    assert np.all(want_nx >= 2) and np.all(want_ny >= 2)  # every bin is compared
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=2e-6)


def test_mmd2_float64_matches_reference_to_round_off():
    """In float64 the estimate agrees with the loop reference to ~1e-12: a
    float32 cast left inside (a kernel or a median computed in float32)
    would show as a ~1e-7 error, and the outputs keep the input's dtype."""
    rng = np.random.default_rng(5)
    x, x_mask, y, y_mask = _random_states(rng, 4, 5, 6, 3, dtype=np.float64)
    edges = (0, 2, 6)
    with jax.enable_x64(True):
        for bw in (0.9, None):
            got, _, _ = _fast_mmd2(x, x_mask, y, y_mask, edges, bw)
            assert got.dtype == jnp.float64
            want, _, _ = _np_mmd2_by_t(x, x_mask, y, y_mask, edges, bw)
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-12)
        a_s, a_e, mask = _random_actions(rng, 5, 4, 2, discrete=False, dtype=np.float64)
        rate, _ = jax.jit(disagreement_by_t, static_argnames="discrete")(
            a_s, a_e, mask, discrete=False)
        assert rate.dtype == jnp.float64
        want_rate, _ = _np_disagreement(a_s, a_e, mask, False)
        np.testing.assert_allclose(np.asarray(rate), want_rate, rtol=1e-12)
    assert jnp.zeros(1).dtype == jnp.float32  # x64 did not leak out


def test_mmd2_float32_far_from_the_origin():
    """States around 1e3 (absolute positions) in float32: distances taken as
    ‖a‖² + ‖b‖² − 2a·b without centring first lose most of their digits to
    cancellation and miss the reference by far more than 1e-4."""
    rng = np.random.default_rng(8)
    x, x_mask, y, y_mask = _random_states(rng, 4, 4, 4, 3, offset=1e3)
    for bw in (1.5, None):
        got, _, _ = _fast_mmd2(x, x_mask, y, y_mask, (0, 4), bw)
        want, _, _ = _np_mmd2_by_t(x, x_mask, y, y_mask, (0, 4), bw)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


def test_mmd2_nan_where_a_side_has_fewer_than_two_samples():
    """A bin with one valid sample on a side (the i ≠ j sums are empty) is
    NaN, not a division-by-zero inf or a fake 0; the counts still report it."""
    x = np.random.default_rng(6).normal(size=(3, 4, 2)).astype(np.float32)
    y = x + 1.0
    x_mask = np.ones((3, 4), bool)
    y_mask = np.ones((3, 4), bool)
    x_mask[:, 2:] = False
    x_mask[0, 2] = True  # bin (2, 4): one valid x sample
    y_mask[:, :2] = False  # bin (0, 2): no valid y sample
    for bw in (1.0, None):
        got, nx, ny = _fast_mmd2(x, x_mask, y, y_mask, (0, 2, 4), bw)
        assert np.all(np.isnan(np.asarray(got)))
        np.testing.assert_array_equal(np.asarray(nx), [6, 1])
        np.testing.assert_array_equal(np.asarray(ny), [0, 6])


def _gauss_mmd2(shift_sq, sigma, S):
    """Population MMD² between N(0, I_S) and N(μ, I_S), Gaussian kernel σ."""
    s2 = sigma**2
    return 2.0 * (s2 / (s2 + 2.0)) ** (S / 2) * (1.0 - np.exp(-shift_sq / (2.0 * (s2 + 2.0))))


def test_mmd2_zero_for_equal_distributions_and_grows_with_shift():
    """Samples from one normal give estimates around 0, some of them
    negative (the biased V-statistic is never negative and sits near 2/m);
    a mean shift gives a clearly positive value that grows with the shift
    and, with a fixed σ, matches the closed-form population value (a kernel
    exp(−d²/σ²) or exp(−d/(2σ²)) would not)."""
    rng = np.random.default_rng(7)
    K, E, S = 16, 48, 3  # K independent one-bin problems, 48 samples a side
    mask = np.ones((E, 1), bool)
    x = rng.normal(size=(K, E, 1, S)).astype(np.float32)
    base = rng.normal(size=(K, E, 1, S)).astype(np.float32)
    sigma = np.float32(2.0)

    def one(x, y, bandwidth=None):
        return mmd2_by_t(x, mask, y, mask, (0, 1), bandwidth)[0][0]

    # The claims do not depend on how XLA optimises: compile at level 0.
    median = fast_compile(jax.vmap(one), x, base)
    fixed = fast_compile(jax.vmap(one, in_axes=(0, 0, None)), x, base, sigma)

    same = np.asarray(median(x, base))
    assert np.all(np.abs(same) < 0.08)
    assert abs(same.mean()) < 0.01
    assert np.sum(same < 0) >= 3

    last = {"median": -np.inf, "fixed": -np.inf}
    for shift in (0.5, 1.0, 2.0):
        y = base + np.float32(shift)  # shift every coordinate: ‖μ‖² = S·shift²
        for name, got in (("median", median(x, y)), ("fixed", fixed(x, y, sigma))):
            got = np.asarray(got, np.float64)
            mean, sem = got.mean(), got.std(ddof=1) / np.sqrt(K)
            assert mean > 0.03 and mean > last[name] + 0.05, (shift, name, mean)
            last[name] = mean
            if name == "fixed":
                want = _gauss_mmd2(S * shift**2, float(sigma), S)
                assert abs(mean - want) < 4 * sem + 1e-3, (shift, mean, want, sem)


def test_mmd2_bad_bin_edges_and_shapes_are_refused():
    """Edges that do not increase, leave [0, T], or are too few raise a
    ValueError with the edges in the message; mismatched state sizes or
    masks are refused by chex instead of broadcast."""
    x = np.zeros((2, 5, 3), np.float32)
    m = np.ones((2, 5), bool)
    for edges, word in [((0, 3, 3), "increasing"), ((0, 4, 2), "increasing"),
                        ((0, 6), r"\[0, T\]"), ((-1, 2), r"\[0, T\]"), ((2,), "at least 2"),
                        ((0, 2.5), "ints")]:
        with pytest.raises(ValueError, match=word):
            mmd2_by_t(x, m, x, m, edges)
    with pytest.raises(ValueError, match="bandwidth"):
        mmd2_by_t(x, m, x, m, (0, 5), bandwidth=0.0)
    with pytest.raises(AssertionError):
        mmd2_by_t(x, m, x[..., :2], m, (0, 5))
    with pytest.raises(AssertionError):
        mmd2_by_t(x, m[:, :4], x, m, (0, 5))
    with pytest.raises(AssertionError):
        mmd2_by_t(x, m, x[:, :4], m[:, :4], (0, 4))


@pytest.mark.parametrize("jit", [False, True])
def test_disagreement_agent_mask_counts_only_agents_with_a_choice(jit):
    """With ``agent_mask`` the mean runs over the masked agents of the valid
    steps only, against a float64 loop. Catches dividing by all N agents
    (dead SMAX units, which can only no-op, would dilute the rate) and
    forgetting the step mask."""
    rng = np.random.default_rng(7)
    E, T, N, A = 5, 6, 3, 4
    a_s = rng.integers(0, A, (E, T, N)).astype(np.int32)
    a_e = rng.integers(0, A, (E, T, N)).astype(np.int32)
    mask = rng.uniform(size=(E, T)) < 0.8
    agents = rng.uniform(size=(E, T, N)) < 0.6
    agents[:, -1] = False  # no agent with a choice at the last step: NaN
    fn = jax.jit(disagreement_by_t, static_argnums=3) if jit else disagreement_by_t
    rate, count = fn(a_s, a_e, mask, True, agents)
    for t in range(T):
        num = den = 0.0
        for e in range(E):
            for i in range(N):
                if mask[e, t] and agents[e, t, i]:
                    num += float(a_s[e, t, i] != a_e[e, t, i])
                    den += 1.0
        if den:
            np.testing.assert_allclose(float(rate[t]), num / den, rtol=1e-6)
        else:
            assert np.isnan(float(rate[t]))
        assert int(count[t]) == int(mask[:, t].sum())


@pytest.mark.slow  # default-suite time (~12 s); run with -m slow
def test_twin_policy_measures_the_experts_own_label_noise():
    """Two draws of a uniformly random expert over A legal actions disagree
    with probability 1 − 1/A; a deterministic expert never disagrees with
    itself; the played action is the first draw and the carry moves on as the
    expert's own. Catches both draws using one key (noise 0), the second draw
    being played, or the twin advancing its carry with the second draw."""
    from jaxil import envs
    from jaxil.envs.policies import Policy, random_policy
    from jaxil.algorithms.interactive.diagnostics import twin_policy

    env = envs.make("mpe:simple_spread")
    spec = env.spec
    shape = (spec.num_agents,) + spec.action.shape
    run = lambda pol: envs.run_episodes(env, pol, None, jax.random.PRNGKey(3), 32, record_carry=True)

    ep = jax.jit(lambda: run(twin_policy(random_policy(spec), shape)))()
    rate = np.asarray(disagreement_by_t(ep.carry.second, ep.actions, ep.mask, True)[0])
    A = spec.num_actions  # every MPE action is always legal
    assert abs(np.nanmean(rate) - (1 - 1 / A)) < 0.03

    def count_act(params, obs, avail, key, c):  # deterministic, with a carry
        return jnp.full(obs.shape[0], c % A, jnp.int32), c + 1

    counter = Policy(lambda key, n: jnp.int32(0), count_act)
    ep = jax.jit(lambda: run(twin_policy(counter, shape)))()
    T = int(ep.length[0])
    np.testing.assert_array_equal(np.asarray(ep.carry.second[0, :T]), np.asarray(ep.actions[0, :T]))
    np.testing.assert_array_equal(np.asarray(ep.actions[0, :T, 0]), np.arange(T) % A)
    np.testing.assert_array_equal(np.asarray(ep.carry.inner[0, :T]), np.arange(1, T + 1))
