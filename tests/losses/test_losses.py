"""Loss functions against float64 numpy references, with and without jit,
in float32 and float64 (``test_*_both_precisions``) and on several shapes."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.fast_compile import fast_call

from jaxil import losses as L
from jaxil.losses.discriminator import _interpolation_draws, agent_interpolation_draws

RNG = np.random.default_rng(1234)
B, B0, N = 16, 6, 3


@pytest.fixture(autouse=True)
def _reseed():
    """Each test draws the same data however the suite is selected or ordered."""
    global RNG
    RNG = np.random.default_rng(1234)


def _f32(*shape, scale=1.0):
    return (scale * RNG.normal(size=shape)).astype(np.float32)


def _maybe_jit(fn, jit, **kw):
    return jax.jit(fn, **kw) if jit else fn


def _key(seed):
    # RBG keys: XLA compiles them much faster than threefry on small CPUs.
    return jax.random.key(seed, impl="unsafe_rbg")


def _np_logsumexp(x):
    m = np.max(x)
    return m + np.log(np.sum(np.exp(x - m)))


def _np_softplus(x):
    return np.logaddexp(0.0, x)


jit_param = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
# Float64 runs switch JAX to 64 bits for the call only (jax.enable_x64).
dtype_param = pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
TOL = {np.float32: dict(rtol=2e-5, atol=2e-6), np.float64: dict(rtol=1e-10, atol=1e-12)}


def _arr(dtype, *shape, scale=1.0):
    return (scale * RNG.normal(size=shape)).astype(dtype)


def _x64(dtype):
    return jax.enable_x64(dtype == np.float64)


# ------------------------------------------------------------------ BC


@jit_param
@pytest.mark.parametrize("use_mask", [False, True])
def test_weighted_bc_loss(jit, use_mask):
    lp = -np.abs(_f32(B, N))
    w = np.abs(_f32(B))
    mask = RNG.random(B) < 0.6 if use_mask else None
    got = _maybe_jit(L.weighted_bc_loss, jit)(lp, w, mask)
    m = np.ones(B) if mask is None else mask.astype(np.float64)
    want = -np.sum(m * w.astype(np.float64) * lp.astype(np.float64).sum(-1)) / max(m.sum(), 1.0)
    np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-5)
    assert got.shape == ()


@jit_param
@pytest.mark.parametrize("use_mask", [False, True])
def test_agent_weighted_bc_loss(jit, use_mask):
    lp = -np.abs(_f32(B, N))
    w = np.abs(_f32(B, N))
    mask = RNG.random(B) < 0.6 if use_mask else None
    got = _maybe_jit(L.agent_weighted_bc_loss, jit)(lp, w, mask)
    m = np.ones(B) if mask is None else mask.astype(np.float64)
    want = -np.sum(m * (w.astype(np.float64) * lp).sum(-1)) / max(m.sum(), 1.0)
    np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-5)


def test_bc_losses_edge_cases_and_gradients():
    lp = -np.abs(_f32(B, N))
    w = np.abs(_f32(B))
    # Equal per-agent weights reduce to the per-sample form.
    np.testing.assert_allclose(
        float(L.agent_weighted_bc_loss(lp, np.repeat(w[:, None], N, 1))), float(L.weighted_bc_loss(lp, w)), rtol=1e-6
    )
    # All-masked batch: 0, not NaN.
    assert float(L.weighted_bc_loss(lp, w, np.zeros(B, bool))) == 0.0
    # Weights are constants: no gradient flows into them.
    gw = jax.jit(jax.grad(lambda w: L.weighted_bc_loss(jnp.asarray(lp), w)))(jnp.asarray(w))
    assert np.all(np.asarray(gw) == 0)
    glp = jax.jit(jax.grad(lambda l: L.weighted_bc_loss(l, jnp.asarray(w))))(jnp.asarray(lp))
    np.testing.assert_allclose(np.asarray(glp), -np.repeat(w[:, None], N, 1) / B, rtol=1e-6)


def test_bc_shape_checks():
    with pytest.raises(AssertionError):
        L.weighted_bc_loss(np.zeros((B, N)), np.ones((B + 1,)))
    with pytest.raises(AssertionError):
        L.weighted_bc_loss(np.zeros((B,)), np.ones((B,)))
    with pytest.raises(AssertionError):
        L.weighted_bc_loss(np.zeros((B, N)), np.ones((B,)), np.ones((B - 1,)))
    with pytest.raises(AssertionError):
        L.agent_weighted_bc_loss(np.zeros((B, N)), np.ones((B,)))


# ------------------------------------------------------------------ discriminator


@jit_param
def test_discriminator_loss(jit):
    le, lu = _f32(B, scale=3), _f32(2 * B, scale=3)
    got = _maybe_jit(L.discriminator_loss, jit)(le, lu)
    le64, lu64 = le.astype(np.float64), lu.astype(np.float64)
    # −mean log σ(ℓ_E) − mean log(1 − σ(ℓ_U))
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    want = -np.mean(np.log(sig(le64))) - np.mean(np.log(1 - sig(lu64)))
    np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-5)
    # Stable for huge logits.
    big = L.discriminator_loss(np.array([-200.0, 200.0]), np.array([200.0, -200.0]))
    np.testing.assert_allclose(float(big), 200.0, rtol=1e-6)
    with pytest.raises(AssertionError):
        L.discriminator_loss(np.zeros((B, 1)), np.zeros((B,)))


def _np_gradient_penalty(wts, expert, union, u, partner, shuffle, cost_eps=1e-3):
    """DemoDICE penalty for the logit ℓ(x) = Σ_j tanh(x·W_j), in float64."""
    eps32 = float(np.finfo(np.float32).eps)
    partner = union if partner is None else union[partner]
    x = np.concatenate([u[:, None] * expert + (1 - u[:, None]) * partner,
                        u[:, None] * union[shuffle] + (1 - u[:, None]) * partner], 0)
    h = x @ wts  # [M, H]
    logit = np.tanh(h).sum(-1)
    dlogit_dx = (1 - np.tanh(h) ** 2) @ wts.T  # [M, D]
    sig = 1 / (1 + np.exp(-logit))
    # c = log(1/(σ+ε) − 1 + ε); dc/dℓ = −σ(1−σ)/(σ+ε)² / (1/(σ+ε) − 1 + ε)
    dc = -sig * (1 - sig) / (sig + cost_eps) ** 2 / (1 / (sig + cost_eps) - 1 + cost_eps)
    g = dc[:, None] * dlogit_dx + eps32
    return np.mean((np.linalg.norm(g, axis=-1) - 1) ** 2)


@pytest.mark.parametrize(
    "jit,b2", [(False, B), (True, B), (True, 2 * B), (True, B // 2)], ids=["eager", "jit", "jit-b2>b", "jit-b2<b"]
)
def test_gradient_penalty_matches_numpy_demodice_form(jit, b2):
    d, h = 5, 4
    wts = _f32(d, h)
    expert, union = _f32(B, d), _f32(b2, d)
    key = _key(3)

    def logit_fn(x):
        return jnp.tanh(x @ wts).sum(-1)

    def penalty_and_draws(e, un, k):
        # Same interpolation coefficients, pairing and shuffle as the
        # implementation (drawn in the same program: one compile per case).
        return L.gradient_penalty(logit_fn, e, un, k), _interpolation_draws(k, B, b2)

    if jit:  # compiled at XLA level 0 (the last bits differ, far inside the tolerance)
        got, draws = fast_call(penalty_and_draws, expert, union, key)
    else:
        got, draws = penalty_and_draws(expert, union, key)
    u, partner, shuffle = (None if a is None else np.asarray(a) for a in draws)
    if b2 >= B:
        assert len(set(shuffle.tolist())) == B  # a permutation (subset) of the union batch
    want = _np_gradient_penalty(
        *(a.astype(np.float64) for a in (wts, expert, union, u)), partner, shuffle
    )
    np.testing.assert_allclose(float(got), want, rtol=1e-4)


def test_gradient_penalty_pytree_inputs_and_param_gradients():
    # Inputs as a tuple (obs, actions_onehot, state): the norm runs over all leaves.
    obs_e, act_e, st_e = _f32(B, 2, 3), _f32(B, 4), _f32(B, 5)
    obs_u, act_u, st_u = _f32(2 * B, 2, 3), _f32(2 * B, 4), _f32(2 * B, 5)
    wts = _f32(6 + 4 + 5)

    def logit_fn_factory(wts):
        def logit_fn(inputs):
            obs, act, st = inputs
            flat = jnp.concatenate([obs.reshape(obs.shape[0], -1), act, st], -1)
            return flat @ wts  # linear: ‖∇ℓ‖ = ‖wts‖ at every point

        return logit_fn

    key = _key(0)

    @jax.jit
    def gp_and_grad(wts):
        # cost_eps=0: the gradient of −ℓ itself, known in closed form here.
        gp = lambda w: L.gradient_penalty(  # noqa: E731
            logit_fn_factory(w), (obs_e, act_e, st_e), (obs_u, act_u, st_u), key, cost_eps=0.0
        )
        return jax.value_and_grad(gp)(wts)

    # Linear logit: every interpolate has gradient −wts (+ ε₃₂ per entry).
    wts64 = wts.astype(np.float64)
    norm = np.linalg.norm(-wts64 + np.finfo(np.float32).eps)
    val, g = gp_and_grad(jnp.asarray(wts))
    np.testing.assert_allclose(float(val), (norm - 1) ** 2, rtol=1e-5)
    # Differentiable in the parameters the logit closes over (double backprop):
    # d/dw (‖−w + ε‖ − 1)² = 2(‖·‖ − 1)·(w − ε)/‖·‖.
    np.testing.assert_allclose(
        np.asarray(g), 2 * (norm - 1) * (wts64 - np.finfo(np.float32).eps) / norm, rtol=1e-4, atol=1e-6
    )
    # A gradient norm of exactly 1 is not penalised (up to ε₃₂).
    val, _ = gp_and_grad(jnp.asarray(wts / np.linalg.norm(wts)))
    assert float(val) < 1e-8
    with pytest.raises(ValueError, match="structure"):
        L.gradient_penalty(logit_fn_factory(jnp.asarray(wts)), (obs_e, act_e, st_e), (obs_u, act_u), key)
    with pytest.raises(ValueError, match="per-sample shape"):
        L.gradient_penalty(lambda x: x.sum(-1), _f32(B, 3), _f32(B, 4), key)


# ------------------------------------------------------------------ DICE


def _np_dice_advantage(r, nu, nu_next, done, gamma):
    return r + gamma * (1 - done.astype(np.float64)) * nu_next - nu


def _np_dice_nu_loss(nu_init, adv, alpha, gamma, mask=None):
    x = adv.astype(np.float64) / (1 + alpha)
    if mask is not None:
        x = x[mask]
    return (1 - gamma) * np.mean(nu_init) + (1 + alpha) * (_np_logsumexp(x) - np.log(x.size))


def _np_dice_weights(adv, alpha, mask=None):
    m = np.ones(adv.shape, bool) if mask is None else mask
    e = np.exp(adv.astype(np.float64) / (1 + alpha))
    return np.where(m, e / np.mean(e[m]), 0.0)


@jit_param
def test_dice_advantage(jit):
    r, nu, nu_next = _f32(B), _f32(B), _f32(B)
    done = RNG.random(B) < 0.3
    fn = _maybe_jit(L.dice_advantage, jit)
    for d in (done, done.astype(np.float32)):
        got = fn(r, nu, nu_next, d, 0.99)
        want = _np_dice_advantage(r, nu, nu_next, done, 0.99)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(AssertionError):
        L.dice_advantage(r, nu, nu_next[:-1], done, 0.99)


@jit_param
@pytest.mark.parametrize("use_mask", [False, True])
def test_dice_nu_loss(jit, use_mask):
    nu_init, adv = _f32(B0), _f32(B, scale=5.0)
    mask = RNG.random(B) < 0.6 if use_mask else None
    got = _maybe_jit(L.dice_nu_loss, jit)(nu_init, adv, 0.05, 0.99, mask)
    want = _np_dice_nu_loss(nu_init, adv, 0.05, 0.99, mask)
    np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-6)


def test_dice_nu_loss_stable_for_large_advantages_and_gradient():
    adv = np.array([500.0, 400.0, -300.0, 0.0], np.float32)
    got = float(L.dice_nu_loss(np.zeros(2), jnp.asarray(adv), 0.0, 0.99))
    np.testing.assert_allclose(got, _np_dice_nu_loss(np.zeros(2), adv, 0.0, 0.99), rtol=1e-6)
    # ∂L/∂adv = softmax(adv/(1+α)) / B·B = dice_weights / B.
    adv = _f32(B, scale=2)
    g = jax.jit(jax.grad(lambda a: L.dice_nu_loss(np.zeros(B0), a, 0.3, 0.9)))(jnp.asarray(adv))
    np.testing.assert_allclose(np.asarray(g), _np_dice_weights(adv, 0.3) / B, rtol=1e-5, atol=1e-7)


@jit_param
@pytest.mark.parametrize("use_mask", [False, True])
def test_dice_weights(jit, use_mask):
    adv = _f32(B, scale=30.0)  # large: a naive exp would overflow
    mask = RNG.random(B) < 0.6 if use_mask else None
    got = np.asarray(_maybe_jit(L.dice_weights, jit)(adv, 0.05, mask))
    want = _np_dice_weights(adv, 0.05, mask)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    m = np.ones(B, bool) if mask is None else mask
    np.testing.assert_allclose(got[m].mean(), 1.0, rtol=1e-5)
    assert np.all(np.isfinite(got))


def test_dice_weights_stop_gradient_and_all_masked():
    adv = jnp.asarray(_f32(B))
    g = jax.jit(jax.grad(lambda a: jnp.sum(L.dice_weights(a, 0.05) * a)))(adv)
    np.testing.assert_allclose(np.asarray(g), np.asarray(L.dice_weights(adv, 0.05)), rtol=1e-6)
    w = L.dice_weights(adv, 0.05, np.zeros(B, bool))
    assert np.all(np.asarray(w) == 0)
    # An all-invalid batch leaves only the linear ν(s0) term of the ν-loss.
    nu_init = _f32(B0)
    got = L.dice_nu_loss(nu_init, adv, 0.05, 0.9, np.zeros(B, bool))
    np.testing.assert_allclose(float(got), 0.1 * np.mean(nu_init.astype(np.float64)), rtol=1e-5, atol=1e-7)
    with pytest.raises(AssertionError):
        L.dice_weights(adv, 0.05, np.zeros(B - 1, bool))


def test_dice_traced_hyperparameters_vmap():
    """α and γ are sweep axes: vmap over them inside one jit."""
    nu_init, adv = _f32(B0), _f32(B, scale=3.0)
    alphas = np.array([0.0, 0.05, 1.0, 10.0], np.float32)
    gammas = np.array([0.9, 0.95, 0.99, 0.999], np.float32)

    @jax.jit
    def sweep(alpha, gamma):
        return L.dice_nu_loss(nu_init, adv, alpha, gamma), L.dice_weights(adv, alpha)

    losses, weights = jax.vmap(sweep)(alphas, gammas)
    for i, (a, g) in enumerate(zip(alphas, gammas)):
        want = _np_dice_nu_loss(nu_init, adv, float(a), float(g))
        np.testing.assert_allclose(float(losses[i]), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(weights[i]), _np_dice_weights(adv, float(a)), rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ preference


def _np_preference_loss(rx, ry, label, rewards, reg):
    logit = rx.astype(np.float64) - ry
    bce = label * _np_softplus(-logit) + (1 - label) * _np_softplus(logit)
    return np.mean(bce) + reg * np.mean(rewards.astype(np.float64) ** 2)


@jit_param
def test_preference_loss(jit):
    rewards = _f32(2 * B, 7, scale=0.5)  # per-step rewards of x and y stacked
    rx, ry = rewards[:B].sum(-1), rewards[B:].sum(-1)
    label = np.concatenate([RNG.integers(0, 2, B - 2), [0.5, 0.3]]).astype(np.float32)
    fn = _maybe_jit(L.preference_loss, jit)
    got = fn(rx, ry, label, rewards)
    np.testing.assert_allclose(float(got), _np_preference_loss(rx, ry, label, rewards, 0.5), rtol=1e-5, atol=1e-5)
    got = fn(rx, ry, label, rewards, 0.0)
    np.testing.assert_allclose(float(got), _np_preference_loss(rx, ry, label, rewards, 0.0), rtol=1e-5, atol=1e-5)
    # Stable for large return gaps.
    big = L.preference_loss(np.array([300.0]), np.array([0.0]), np.array([0.0]), np.zeros(1))
    np.testing.assert_allclose(float(big), 300.0, rtol=1e-6)
    with pytest.raises(AssertionError):
        L.preference_loss(rx, ry[:-1], label[:-1], rewards)
    with pytest.raises(AssertionError):
        L.preference_loss(rx[:, None], ry[:, None], label[:, None], rewards)


@jit_param
def test_preference_loss_reward_mask(jit):
    """The penalty averages only the valid steps; padding does not dilute it."""
    rewards = _f32(2 * B, 7, scale=0.5)
    mask = RNG.random((2 * B, 7)) < 0.6
    mask[:, 0] = True
    r = rewards * mask
    rx, ry = r[:B].sum(-1), r[B:].sum(-1)
    label = RNG.integers(0, 2, B).astype(np.float32)
    got = _maybe_jit(L.preference_loss, jit)(rx, ry, label, r, 0.5, mask)
    logit = rx.astype(np.float64) - ry
    bce = label * _np_softplus(-logit) + (1 - label) * _np_softplus(logit)
    want = np.mean(bce) + 0.5 * np.sum(r.astype(np.float64) ** 2) / mask.sum()
    np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(AssertionError):
        L.preference_loss(rx, ry, label, r, 0.5, mask[:, :-1])


# ------------------------------------------------------------------ Gumbel value


def _np_gumbel_z(q, v, w, beta, clip):
    return np.clip(w.astype(np.float64) * (q.astype(np.float64) - v) / beta, -clip, clip)


@jit_param
def test_gumbel_value_loss_and_weights(jit):
    beta = 2.0
    q, v, w = _f32(B, N, scale=5), _f32(B, N, scale=5), np.abs(_f32(B, N, scale=2))
    z = _np_gumbel_z(q, v, w, beta, 10.0)
    z_raw = w.astype(np.float64) * (q.astype(np.float64) - v) / beta
    assert (np.abs(z) == 10.0).any()  # the clip is exercised
    def loss_clip_linear_and_weights(q, v, w):  # (one program under jit)
        return (L.gumbel_value_loss(q, v, w, beta), L.gumbel_value_loss(q, v, w, beta, clip_linear=True),
                L.gumbel_weights(q, v, w, beta))

    got, got_clip_linear, got_w = _maybe_jit(loss_clip_linear_and_weights, jit)(q, v, w)
    # The authors' clip: inside exp only; the linear term is ẑ unclipped.
    np.testing.assert_allclose(float(got), np.mean(np.exp(z) - z_raw - 1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(got_clip_linear), np.mean(np.exp(z) - z - 1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got_w), np.exp(z), rtol=1e-5)
    # Small z: expm1 keeps relative accuracy where exp(z) − 1 − z cancels.
    tiny = L.gumbel_value_loss(np.full((1, 1), 1e-3), np.zeros((1, 1)), np.ones((1, 1)), 1.0)
    np.testing.assert_allclose(float(tiny), np.expm1(1e-3) - 1e-3, rtol=1e-3)


_gumbel_grad_v = jax.jit(jax.grad(L.gumbel_value_loss, argnums=1), static_argnums=(3, 4))


@jit_param
def test_gumbel_value_loss_mask(jit):
    beta = 1.5
    q, v, w = _f32(B, N, scale=3), _f32(B, N, scale=3), np.abs(_f32(B, N))
    mask = RNG.random(B) < 0.5
    mask[0] = True
    z = _np_gumbel_z(q, v, w, beta, 10.0)
    per = np.mean(np.exp(z) - z - 1, axis=-1)
    got = _maybe_jit(L.gumbel_value_loss, jit)(q, v, w, beta, 10.0, mask)
    np.testing.assert_allclose(float(got), per[mask].mean(), rtol=1e-5, atol=1e-6)
    # Masked-out rows carry no gradient (jitted once for both cases).
    g = _gumbel_grad_v(q, v, w, beta, 10.0, mask)
    assert np.all(np.asarray(g)[~mask] == 0) and np.any(np.asarray(g)[mask] != 0)
    with pytest.raises(AssertionError):
        L.gumbel_value_loss(q, v, w, beta, 10.0, mask[:-1])


def test_gumbel_value_loss_gradient_matches_authors_form():
    """∇_V of exp(z) − z − 1 equals exp(max z)·∇_V of the O-MAPL code's loss
    mean[exp(z − m) + exp(−m)·w̄·V/β], m = max(sg(max z), −1), inside the clip."""
    beta = 3.0
    q, w = _f32(B, N, scale=2), np.abs(_f32(B, N))
    v = q - _f32(B, N, scale=2)  # |z| well inside the clip range
    assert np.abs(_np_gumbel_z(q, v, w, beta, 10.0)).max() < 10.0

    def authors(v):
        z = jnp.clip(w * (q - v) / beta, -10.0, 10.0)
        m = jax.lax.stop_gradient(jnp.maximum(jnp.max(z), -1.0))
        return jnp.mean(jnp.exp(z - m) + jnp.exp(-m) * w * v / beta), m

    @jax.jit  # every gradient and the authors' value in one program: one compile
    def grads_and_authors_value(v, q_target, w_target):
        g_ours = jax.grad(lambda v: L.gumbel_value_loss(q, v, w, beta))(v)
        g_auth, m = jax.grad(authors, has_aux=True)(v)
        # Targets are constants: no gradient into Q̄ or w̄.
        g_targets = jax.grad(lambda q, w: L.gumbel_value_loss(q, v, w, beta), argnums=(0, 1))(q_target, w_target)
        return g_ours, g_auth, m, authors(v), g_targets

    g_ours, g_auth, m, (val_auth, m_val), (gq, gw) = grads_and_authors_value(
        jnp.asarray(v), jnp.asarray(q), jnp.asarray(w))
    np.testing.assert_allclose(np.asarray(g_ours), np.exp(float(m)) * np.asarray(g_auth), rtol=1e-4, atol=1e-7)
    # Analytic: ∂L/∂V = (w̄/β)(1 − exp(z)) / (B·N), in float64.
    z = _np_gumbel_z(q, v, w, beta, 10.0)
    np.testing.assert_allclose(np.asarray(g_ours), w / beta * (1 - np.exp(z)) / (B * N), rtol=1e-4, atol=1e-7)
    # Values agree up to the V-independent terms and the scale.
    const = np.mean(w.astype(np.float64) * q / beta) + 1
    np.testing.assert_allclose(
        float(L.gumbel_value_loss(q, v, w, beta)), math.exp(float(m_val)) * float(val_auth) - const, rtol=1e-4
    )
    assert np.all(np.asarray(gq) == 0) and np.all(np.asarray(gw) == 0)


def test_gumbel_shape_checks():
    with pytest.raises(AssertionError):
        L.gumbel_value_loss(np.zeros((B, N)), np.zeros((B, N + 1)), np.ones((B, N)), 1.0)
    with pytest.raises(AssertionError):
        L.gumbel_weights(np.zeros((B,)), np.zeros((B,)), np.ones((B,)), 1.0)



# ------------------------------------------------------------------ both precisions, several shapes


def _every_loss(lp, w_b, w_bn, le, lu, r, nu, nu_next, nu0, done, mask, q, v, wq, rew, rx, ry, label):
    """Every loss of the DICE / O-MAPL stack on one set of inputs (one program
    under jit)."""
    adv = L.dice_advantage(r, nu, nu_next, done, 0.99)
    return {
        "bc": L.weighted_bc_loss(lp, w_b, mask),
        "agent_bc": L.agent_weighted_bc_loss(lp, w_bn),
        "disc": L.discriminator_loss(le, lu),
        "adv": adv,
        "nu": L.dice_nu_loss(nu0, adv, 0.05, 0.99),
        "nu_mask": L.dice_nu_loss(nu0, adv, 0.05, 0.99, mask),
        "weights": L.dice_weights(adv, 0.05, mask),
        "bounded": L.bounded_reward(le),
        "pref": L.preference_loss(rx, ry, label, rew),
        "gumbel": L.gumbel_value_loss(q, v, wq, 2.0),
        "gumbel_clip_linear": L.gumbel_value_loss(q, v, wq, 2.0, clip_linear=True),
        "gumbel_weights": L.gumbel_weights(q, v, wq, 2.0),
    }


# Both precisions and both shapes, in two combinations (every new dtype or
# shape recompiles every op): float32 on [16, 3] eagerly (op by op; the
# other tests of this file cache most of those ops already) and float64 on
# [5, 1] (odd batch, a single agent) jitted. float32 on [5, 1] and float64 on
# [16, 3] check nothing the two do not.
@pytest.mark.parametrize("dtype,b,n,jit", [(np.float32, 16, 3, False), (np.float64, 5, 1, True)],
                         ids=["f32-16x3-eager", "f64-5x1-jit"])
def test_losses_match_numpy_in_both_precisions(dtype, b, n, jit):
    """Every loss of the DICE / O-MAPL stack against its float64 numpy
    reference, computed in ``dtype`` (the result keeps the input precision)."""
    tol = TOL[dtype]
    lp, w_b, w_bn = -np.abs(_arr(dtype, b, n)), np.abs(_arr(dtype, b)), np.abs(_arr(dtype, b, n))
    le, lu = _arr(dtype, b, scale=3), _arr(dtype, b + 2, scale=3)
    r, nu, nu_next, nu0 = _arr(dtype, b), _arr(dtype, b), _arr(dtype, b), _arr(dtype, max(b // 2, 1))
    done = RNG.random(b) < 0.3
    mask = RNG.random(b) < 0.7
    mask[0] = True
    q, v, wq = _arr(dtype, b, n, scale=5), _arr(dtype, b, n, scale=5), np.abs(_arr(dtype, b, n, scale=2))
    rew = _arr(dtype, 2 * b, 4, scale=0.5)
    label = RNG.random(b).astype(dtype)
    f64 = lambda x: np.asarray(x, np.float64)  # noqa: E731
    with _x64(dtype):
        got = _maybe_jit(_every_loss, jit)(lp, w_b, w_bn, le, lu, r, nu, nu_next, nu0, done, mask, q, v, wq,
                                           rew, rew[:b].sum(-1), rew[b:].sum(-1), label)
        got = {k: np.asarray(x) for k, x in got.items()}

    def check(name, want):
        assert got[name].dtype == dtype, (name, got[name].dtype, dtype)
        np.testing.assert_allclose(got[name], want, **tol)

    check("bc", -np.sum(mask * f64(w_b) * f64(lp).sum(-1)) / mask.sum())
    check("agent_bc", -np.mean((f64(w_bn) * f64(lp)).sum(-1)))
    check("disc", np.mean(_np_softplus(-f64(le))) + np.mean(_np_softplus(f64(lu))))
    adv64 = _np_dice_advantage(f64(r), f64(nu), f64(nu_next), done, 0.99)
    check("adv", adv64)
    check("nu", _np_dice_nu_loss(f64(nu0), adv64, 0.05, 0.99))
    check("nu_mask", _np_dice_nu_loss(f64(nu0), adv64, 0.05, 0.99, mask))
    check("weights", _np_dice_weights(adv64, 0.05, mask))
    check("bounded", _np_bounded_reward(f64(le)))
    check("pref", _np_preference_loss(f64(rew[:b]).sum(-1), f64(rew[b:]).sum(-1), f64(label), f64(rew), 0.5))
    z = _np_gumbel_z(q, v, wq, 2.0, 10.0)
    zr = f64(wq) * (f64(q) - v) / 2.0
    check("gumbel", np.mean(np.exp(z) - zr - 1))
    check("gumbel_clip_linear", np.mean(np.exp(z) - z - 1))
    check("gumbel_weights", np.exp(z))


# ------------------------------------------------------------------ DemoDICE's bounded reward


def _np_bounded_reward(logits, eps=1e-3):
    """The DemoDICE authors' expression, −log(1/(σ(ℓ)+ε) − 1 + ε), in float64."""
    sig = 1 / (1 + np.exp(-np.asarray(logits, np.float64)))
    return -np.log(1 / (sig + eps) - 1 + eps)


@jax.jit
def _bounded_reward_cases(logits, small, big):
    """Every evaluation of test_bounded_reward, in one program (jitted here;
    test_losses_match_numpy_in_both_precisions evaluates it eagerly)."""
    return (L.bounded_reward(logits), L.bounded_reward(logits, 0.0), L.bounded_reward(small),
            L.bounded_reward(big), jax.grad(lambda x: L.bounded_reward(x).sum())(big))


@pytest.mark.parametrize("dtype,shape", [(np.float32, (16,)), (np.float64, (6, 3))], ids=["f32", "f64"])
def test_bounded_reward(dtype, shape):
    """R = −log(1/(σ(ℓ)+ε) − 1 + ε): the authors' expression, ≈ ℓ for small
    |ℓ|, bounded in [−log(1/ε − 1 + ε), log((1+ε)/ε²)], ε = 0 → ℓ, and
    finite with a finite gradient for huge logits."""
    logits = _arr(dtype, *shape, scale=4)
    small = np.array([-0.01, 0.0, 0.02], dtype)  # R(ℓ) = ℓ + 3ε + O(εℓ, ε²) near 0
    big = np.array([-1e4, -50.0, 50.0, 1e4], dtype)
    with _x64(dtype):
        got, got_eps0, r_small, rb, g = (np.asarray(x) for x in _bounded_reward_cases(logits, small, big))
    assert got.dtype == dtype and got.shape == shape
    np.testing.assert_allclose(got, _np_bounded_reward(logits), **TOL[dtype])
    np.testing.assert_allclose(got_eps0, logits)
    np.testing.assert_allclose(r_small, small + 3e-3, atol=1e-4)
    eps = 1e-3
    lo, hi = -math.log(1 / eps - 1 + eps), math.log((1 + eps) / eps ** 2)
    np.testing.assert_allclose(rb[[0, -1]], [lo, hi], rtol=1e-4)
    assert np.all(rb >= lo - 1e-4) and np.all(rb <= hi + 1e-4)
    assert np.all(np.isfinite(g)) and np.all(g >= 0)


# ------------------------------------------------------------------ INDD: per-agent penalty


def _np_agent_gradient_penalty(wts, expert, union, u, partner, shuffle, cost_eps=1e-3):
    """Σ_i of the DemoDICE penalty for ℓ_i(x) = Σ_j tanh(x·W_i,j), each
    agent interpolating its own samples (draws ``[N, B]``), in float64."""
    total = 0.0
    for i in range(expert.shape[1]):
        p = None if partner is None else partner[i]
        total += _np_gradient_penalty(wts[i], expert[:, i], union[:, i], u[i], p, shuffle[i], cost_eps)
    return total


@pytest.mark.parametrize("dtype,b,b2,n", [(np.float32, 16, 16, 3), (np.float64, 8, 12, 2),
                                          (np.float32, 10, 6, 1)], ids=["f32", "f64-b2>b", "f32-b2<b"])
def test_agent_gradient_penalty_matches_numpy(dtype, b, b2, n):
    """INDD's penalty: agent i penalised on interpolates of its own inputs,
    summed over agents; the same draws as the implementation."""
    d, h = 5, 4
    wts, expert, union = _arr(dtype, n, d, h), _arr(dtype, b, n, d), _arr(dtype, b2, n, d)
    key = _key(7)

    def logit_fn(x):  # [M, N, D] -> [M, N]; agent i's own weights
        return jnp.tanh(jnp.einsum("mnd,ndh->mnh", x, wts)).sum(-1)

    with _x64(dtype):
        # The penalty and the draws in one jitted program (one compile per
        # case, at XLA level 0: the last bits differ, far inside the tolerance).
        got, draws = fast_call(lambda e, un, k: (L.agent_gradient_penalty(logit_fn, e, un, k),
                                                 agent_interpolation_draws(k, b, b2, n)), expert, union, key)
        draws = [None if a is None else np.asarray(a) for a in draws]
        assert got.dtype == dtype
    want = _np_agent_gradient_penalty(np.asarray(wts, np.float64), np.asarray(expert, np.float64),
                                      np.asarray(union, np.float64), *draws)
    np.testing.assert_allclose(float(got), want, rtol=1e-4 if dtype == np.float32 else 1e-9)


def test_agent_gradient_penalty_never_mixes_agents():
    """Kills the mutation 'INDD's union–union interpolation shuffles over the
    flattened B·N agent-steps' (jaxil before): every input of agent i is the
    constant c_i, so every within-agent interpolate is c_i too and, with
    ℓ_i(x) = Σ_d sin(x_d) and the exact −ℓ cost (cost_eps = 0), the penalty
    is Σ_i (‖cos(c_i)·1 − ε₃₂‖ − 1)² whatever the draws. A point between two
    agents' inputs changes the gradient, and the value."""
    b, n, d = 32, 3, 4
    c = np.array([0.3, 1.2, 2.5])
    expert = np.broadcast_to(c[None, :, None], (b, n, d)).astype(np.float32)
    union = expert.copy()

    def logit_fn(x):
        return jnp.sin(x).sum(-1)

    eps = float(np.finfo(np.float32).eps)
    want = sum((np.linalg.norm(-np.cos(ci) * np.ones(d) + eps) - 1) ** 2 for ci in c)

    def per_agent_and_flat(e, un, k):
        per_agent = L.agent_gradient_penalty(logit_fn, e, un, k, cost_eps=0.0)
        # The flattened form (what INDD did) draws its union shuffle across agents.
        flat = n * L.gradient_penalty(lambda x: jnp.sin(x).sum(-1), e.reshape(-1, d), un.reshape(-1, d), k,
                                      cost_eps=0.0)
        return per_agent, flat

    # Both forms in one jitted program (one compile, at XLA level 0).
    got, flat = fast_call(per_agent_and_flat, expert, union, _key(0))
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    assert abs(float(flat) - want) > 1e-2
    with pytest.raises(ValueError, match=r"\[N, D\]"):
        L.agent_gradient_penalty(logit_fn, expert, union[:, :2], _key(0))


def test_demodice_cost_stable_form_equals_authors():
    """The penalty's cost log(σ(−ℓ)(1−ε)+ε²) − log(σ(ℓ)+ε) is the authors'
    log(1/(σ+ε) − 1 + ε), and stays accurate where 1/(σ+ε) − 1 cancels."""
    from jaxil.losses.discriminator import _demodice_cost

    with jax.enable_x64(True):  # (the naive float64 reference itself loses ~1e-11 near σ = 1)
        x = np.linspace(-30, 30, 61)
        np.testing.assert_allclose(np.asarray(_demodice_cost(jnp.asarray(x), 1e-3)),
                                   -_np_bounded_reward(x), rtol=1e-9)
    x32 = np.array([8.0, 12.0, 20.0], np.float32)  # σ ≈ 1: the naive float32 form loses digits
    np.testing.assert_allclose(np.asarray(_demodice_cost(jnp.asarray(x32), 1e-3)),
                               -_np_bounded_reward(x32), rtol=1e-5)


# ------------------------------------------------------------------ DemoDICE's ν penalty


def _np_nu_gp(grad_fn, points):
    eps = float(np.finfo(np.float32).eps)
    return np.mean(np.sum((grad_fn(points) + eps) ** 2, axis=-1))


# float32 eagerly, float64 jitted (one program; an eager float64 run
# recompiles every op for the new dtype).
@pytest.mark.parametrize("dtype,b,d,jit", [(np.float32, 16, 5, False), (np.float64, 7, 2, True)],
                         ids=["f32-eager", "f64-jit"])
def test_nu_gradient_penalty_matches_numpy(dtype, b, d, jit):
    """GP_ν = mean over {s_U, u·s_E+(1−u)·s_U, u·s'_E+(1−u)·s'_U} of
    ‖∇ν + ε₃₂‖² for ν(x) = Σ_j tanh(x·W_j), with the implementation's u."""
    h = 3
    wts = _arr(dtype, d, h)
    su, se, sun, sen = (_arr(dtype, b, d) for _ in range(4))
    key = _key(5)

    def penalty_u_and_points(su, se, sun, sen, key):
        return (L.nu_gradient_penalty(lambda x: jnp.tanh(x @ wts).sum(-1), su, se, sun, sen, key),
                jax.random.uniform(key, (b,)), L.nu_penalty_points(key, su, se, sun, sen))

    with _x64(dtype):
        got, u, p = _maybe_jit(penalty_u_and_points, jit)(su, se, sun, sen, key)
        u = np.asarray(u, np.float64)[:, None]
        assert got.dtype == dtype
    w64 = np.asarray(wts, np.float64)
    f = lambda x: np.asarray(x, np.float64)  # noqa: E731
    pts = np.concatenate([f(su), u * f(se) + (1 - u) * f(su), u * f(sen) + (1 - u) * f(sun)])
    want = _np_nu_gp(lambda x: (1 - np.tanh(x @ w64) ** 2) @ w64.T, pts)
    np.testing.assert_allclose(float(got), want, rtol=1e-4 if dtype == np.float32 else 1e-9)
    # The points themselves.
    np.testing.assert_allclose(np.asarray(p), pts, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)


def test_nu_gradient_penalty_pytree_and_agent_axis():
    """A pytree input (obs [B, N, O], state [B, S]) takes one norm over all
    leaves; ``agent_axis`` takes one per agent and sums the agents' means.
    Linear ν: the gradient is the weight vector everywhere."""
    b, n, o, s = 8, 3, 4, 5
    wo, ws = _f32(n, o), _f32(s)
    obs, st = _f32(b, n, o), _f32(b, s)
    eps = float(np.finfo(np.float32).eps)

    @jax.jit  # both forms in one program: one compile
    def pytree_and_per_agent(obs, st, key):
        tree = L.nu_gradient_penalty(lambda x: jnp.einsum("bno,no->b", x[0], wo) + x[1] @ ws,
                                     (obs, st), (obs + 1, st + 1), (obs, st), (obs - 1, st), key)
        per_agent = L.nu_gradient_penalty(lambda x: jnp.einsum("bno,no->bn", x, wo), obs, obs + 1, obs, obs - 1,
                                          key, agent_axis=True)
        return tree, per_agent

    got, got_agents = pytree_and_per_agent(obs, st, _key(1))
    want = np.sum((wo.astype(np.float64) + eps) ** 2) + np.sum((ws.astype(np.float64) + eps) ** 2)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    np.testing.assert_allclose(float(got_agents), np.sum((wo.astype(np.float64) + eps) ** 2), rtol=1e-5)
    with pytest.raises(ValueError, match="pairs sample b"):
        L.nu_gradient_penalty(lambda x: x.sum(-1), obs[:, 0], obs[:4, 0], obs[:, 0], obs[:, 0], _key(0))


# ------------------------------------------------------------------ Gumbel clip boundary


@pytest.mark.parametrize("dtype,b,n", [(np.float32, 4, 3), (np.float64, 4, 3), (np.float64, 7, 1)],
                         ids=["f32", "f64", "f64-n1"])
def test_gumbel_value_loss_gradient_at_the_clip_boundary(dtype, b, n):
    """Kills the mutation 'the linear term clipped too' (jaxil before: flat
    outside the clip). ∂L/∂V against float64 numpy just inside (|ẑ| = c − δ)
    and just outside (|ẑ| = c + δ) both ends of the clip: inside
    (w̄/β)(1 − exp(ẑ))/(B·N); outside w̄/β/(B·N), as the O-MAPL code
    (vietbt/OMAPL trainers/omarl.py: clamp on z, linear term w̄·V/β
    unclipped) — so an overshooting V (ẑ < −c) is pulled back down;
    ``clip_linear=True`` gives 0 outside. Also parallel to the authors' own
    loss, exp(m)·∇ L_authors, on both sides."""
    beta, c, delta = 2.0, 10.0, 1e-2
    w = (0.5 + RNG.random((b, n))).astype(dtype)
    q = _arr(dtype, b, n, scale=3)
    sign = np.where(RNG.random((b, n)) < 0.5, 1.0, -1.0)
    side = np.where(RNG.random((b, n)) < 0.5, c - delta, c + delta)  # inside / outside
    z_raw = sign * side
    v = (q.astype(np.float64) - z_raw * beta / w.astype(np.float64)).astype(dtype)
    zr = w.astype(np.float64) * (q.astype(np.float64) - v.astype(np.float64)) / beta  # ẑ as stored
    inside = np.abs(zr) < c
    assert inside.any() and (~inside).any() and (zr < -c).any()
    w64 = w.astype(np.float64)
    want = np.where(inside, w64 / beta * (1 - np.exp(zr)), w64 / beta) / (b * n)
    want_flat = np.where(inside, want, 0.0)

    def authors(v):  # the O-MAPL code's loss
        z = jnp.clip(w * (q - v) / beta, -c, c)
        m = jax.lax.stop_gradient(jnp.maximum(jnp.max(z), -1.0))
        return jnp.mean(jnp.exp(z - m) + jnp.exp(-m) * w * v / beta), m

    @jax.jit  # the three gradients in one program: one compile per case
    def grads(v):
        return (jax.grad(lambda v: L.gumbel_value_loss(q, v, w, beta, c))(v),
                jax.grad(lambda v: L.gumbel_value_loss(q, v, w, beta, c, clip_linear=True))(v),
                jax.grad(authors, has_aux=True)(v))

    with _x64(dtype):
        g, g_flat, (g_auth, m) = grads(jnp.asarray(v))
        g, g_flat = np.asarray(g), np.asarray(g_flat)
        assert g.dtype == dtype
    rtol = 1e-4 if dtype == np.float32 else 1e-9
    np.testing.assert_allclose(g, want, rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(g_flat, want_flat, rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(g, math.exp(float(m)) * np.asarray(g_auth, np.float64), rtol=rtol, atol=1e-12)
    # Past the clip on the high side V still moves down under gradient descent.
    assert np.all(g[zr < -c] > 0)
