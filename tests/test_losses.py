"""Loss functions against float64 numpy references, with and without jit."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import losses as L
from jaxil.losses.discriminator import _interpolation_draws

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

    fn = _maybe_jit(lambda e, un, k: L.gradient_penalty(logit_fn, e, un, k), jit)
    got = fn(expert, union, key)
    # Same interpolation coefficients, pairing and shuffle as the implementation.
    u, partner, shuffle = (None if a is None else np.asarray(a) for a in _interpolation_draws(key, B, b2))
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
    assert (np.abs(z) == 10.0).any()  # the clip is exercised
    got = _maybe_jit(L.gumbel_value_loss, jit)(q, v, w, beta)
    np.testing.assert_allclose(float(got), np.mean(np.exp(z) - z - 1), rtol=1e-5, atol=1e-5)
    got_w = _maybe_jit(L.gumbel_weights, jit)(q, v, w, beta)
    np.testing.assert_allclose(np.asarray(got_w), np.exp(z), rtol=1e-5)
    # Small z: expm1 keeps relative accuracy where exp(z) − 1 − z cancels.
    tiny = L.gumbel_value_loss(np.full((1, 1), 1e-3), np.zeros((1, 1)), np.ones((1, 1)), 1.0)
    np.testing.assert_allclose(float(tiny), np.expm1(1e-3) - 1e-3, rtol=1e-3)


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
    # Masked-out rows carry no gradient.
    g = jax.grad(lambda v: L.gumbel_value_loss(q, v, w, beta, 10.0, mask))(jnp.asarray(v))
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

    g_ours = jax.jit(jax.grad(lambda v: L.gumbel_value_loss(q, v, w, beta)))(jnp.asarray(v))
    g_auth, m = jax.jit(jax.grad(authors, has_aux=True))(jnp.asarray(v))
    np.testing.assert_allclose(np.asarray(g_ours), np.exp(float(m)) * np.asarray(g_auth), rtol=1e-4, atol=1e-7)
    # Analytic: ∂L/∂V = (w̄/β)(1 − exp(z)) / (B·N), in float64.
    z = _np_gumbel_z(q, v, w, beta, 10.0)
    np.testing.assert_allclose(np.asarray(g_ours), w / beta * (1 - np.exp(z)) / (B * N), rtol=1e-4, atol=1e-7)
    # Values agree up to the V-independent terms and the scale.
    val_auth, m = jax.jit(authors)(jnp.asarray(v))
    const = np.mean(w.astype(np.float64) * q / beta) + 1
    np.testing.assert_allclose(
        float(L.gumbel_value_loss(q, v, w, beta)), math.exp(float(m)) * float(val_auth) - const, rtol=1e-4
    )
    # Targets are constants: no gradient into Q̄ or w̄.
    grad_targets = jax.jit(jax.grad(lambda q, w: L.gumbel_value_loss(q, v, w, beta), argnums=(0, 1)))
    gq, gw = grad_targets(jnp.asarray(q), jnp.asarray(w))
    assert np.all(np.asarray(gq) == 0) and np.all(np.asarray(gw) == 0)


def test_gumbel_shape_checks():
    with pytest.raises(AssertionError):
        L.gumbel_value_loss(np.zeros((B, N)), np.zeros((B, N + 1)), np.ones((B, N)), 1.0)
    with pytest.raises(AssertionError):
        L.gumbel_weights(np.zeros((B,)), np.zeros((B,)), np.ones((B,)), 1.0)
