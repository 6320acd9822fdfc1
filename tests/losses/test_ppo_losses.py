"""PPO's losses and GAE (jaxil.losses.ppo, jaxil.losses.gae) against float64
numpy references on random inputs, with and without jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import losses as L

jit_param = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])


def _maybe_jit(fn, jit, **kw):
    return jax.jit(fn, **kw) if jit else fn


def _np_gae(r, v, last, lv, gamma, lam):
    r, v, lv = (np.asarray(x, np.float64) for x in (r, v, lv))
    adv = np.zeros_like(v)
    next_adv, next_v = np.zeros_like(lv), lv
    for t in reversed(range(len(r))):
        nt = 1.0 - last[t]
        next_adv = r[t] + gamma * next_v * nt - v[t] + gamma * lam * nt * next_adv
        adv[t], next_v = next_adv, v[t]
    return adv, adv + v


@jit_param
def test_gae_matches_numpy_reference(jit):
    """Bootstrapping across an episode boundary, a missing λ in the trace, or
    an off-by-one between the step and its 'last' flag fails the reference."""
    rng = np.random.default_rng(0)
    T, E, N = 7, 3, 2
    r = rng.normal(size=(T, E, N)).astype(np.float32)
    v = rng.normal(size=(T, E, N)).astype(np.float32)
    last = rng.uniform(size=(T, E, N)) < 0.3
    lv = rng.normal(size=(E, N)).astype(np.float32)
    gamma, lam = 0.9, 0.8
    gae = _maybe_jit(L.gae, jit)
    adv, tgt = gae(r, v, last, lv, gamma, lam)
    ref_adv, ref_tgt = _np_gae(r, v, last, lv, gamma, lam)
    np.testing.assert_allclose(np.asarray(adv), ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(tgt), ref_tgt, rtol=1e-5, atol=1e-5)
    # λ = 1 and no boundary: the advantage is the discounted return-to-go
    # (bootstrapped with the last value) minus V.
    no_last = np.zeros_like(last)
    adv1, _ = gae(r, v, no_last, lv, gamma, 1.0)  # (jitted: the same program, λ is traced)
    disc = gamma ** np.arange(T)
    g0 = (disc[:, None, None] * r.astype(np.float64)).sum(0) + gamma**T * lv
    np.testing.assert_allclose(np.asarray(adv1)[0], g0 - v[0], rtol=1e-5, atol=1e-5)


def test_gae_takes_traced_discounts_and_checks_shapes():
    """γ and λ may be traced (a hyper-parameter axis); a value of the wrong
    shape is refused instead of broadcast."""
    rng = np.random.default_rng(1)
    r, v = rng.normal(size=(2, 5, 4)).astype(np.float32)
    last = np.zeros((5, 4), bool)
    lv = np.zeros((4,), np.float32)
    got = jax.jit(jax.vmap(lambda g: L.gae(r, v, last, lv, g, 0.9)[0]))(jnp.array([0.5, 0.99]))
    for i, g in enumerate((0.5, 0.99)):
        np.testing.assert_allclose(np.asarray(got[i]), _np_gae(r, v, last, lv, g, 0.9)[0],
                                   rtol=1e-5, atol=1e-5)
    with pytest.raises(AssertionError):
        L.gae(r, v[:, :3], last, lv, 0.9, 0.9)
    with pytest.raises(AssertionError):
        L.gae(r, v, last, lv[:3], 0.9, 0.9)


def _np_surrogate(lp, old, adv, eps):
    lp, old, adv = (np.asarray(x, np.float64) for x in (lp, old, adv))
    ratio = np.exp(lp - old)
    loss = -np.mean(np.minimum(ratio * adv, np.clip(ratio, 1 - eps, 1 + eps) * adv))
    kl = np.mean((ratio - 1) - (lp - old))
    frac = np.mean(np.abs(ratio - 1) > eps)
    return loss, kl, frac


@jit_param
def test_clipped_surrogate_loss_matches_numpy(jit):
    """A max instead of a min, a clip around 0 instead of 1, or the ratio
    inverted (old/new) fails the reference."""
    rng = np.random.default_rng(2)
    shape = (64, 3)
    old = rng.normal(size=shape).astype(np.float32)
    lp = (old + 0.4 * rng.normal(size=shape)).astype(np.float32)
    adv = rng.normal(size=shape).astype(np.float32)
    loss, stats = _maybe_jit(L.clipped_surrogate_loss, jit)(lp, old, adv, 0.2)
    want, kl, frac = _np_surrogate(lp, old, adv, 0.2)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(stats.approx_kl), kl, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(float(stats.clip_frac), frac, rtol=1e-6)
    assert 0.1 < frac < 0.9  # both branches are exercised


def test_clipped_surrogate_gradient_vanishes_where_clipped():
    """Outside the trust region on the side the advantage favours, the sample
    gives no gradient; inside it the gradient is −ρ·A/B (a missing
    stop-gradient on the old log-prob would double it)."""
    old = jnp.zeros(4)
    lp = jnp.log(jnp.array([1.5, 0.5, 1.1, 0.9]))  # ρ = 1.5, 0.5, 1.1, 0.9
    adv = jnp.array([1.0, -1.0, 1.0, -1.0])
    g_lp, g_old = jax.jit(jax.grad(lambda a, b: L.clipped_surrogate_loss(a, b, adv, 0.2)[0],
                                   argnums=(0, 1)))(lp, old)
    ratio = np.array([1.5, 0.5, 1.1, 0.9])
    want = np.where([False, False, True, True], -ratio * np.asarray(adv) / 4, 0.0)
    np.testing.assert_allclose(np.asarray(g_lp), want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(np.asarray(g_old), 0.0)


_value_loss_grad = jax.jit(jax.grad(L.clipped_value_loss), static_argnums=3)


@jit_param
def test_clipped_value_loss_matches_numpy(jit):
    """Taking the min of the two errors, or clipping around the target
    instead of the old value, fails the reference."""
    rng = np.random.default_rng(3)
    old = rng.normal(size=(50,)).astype(np.float32)
    value = (old + 0.5 * rng.normal(size=(50,))).astype(np.float32)
    target = rng.normal(size=(50,)).astype(np.float32)
    got = _maybe_jit(L.clipped_value_loss, jit)(value, old, target, 0.2)
    v, o, t = (x.astype(np.float64) for x in (value, old, target))
    vc = o + np.clip(v - o, -0.2, 0.2)
    want = 0.5 * np.mean(np.maximum((v - t) ** 2, (vc - t) ** 2))
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    g = _value_loss_grad(value, old, target, 0.2)  # jitted once, for both cases
    # Where the clipped error is the larger one and V left the clip range, V
    # gets no gradient.
    frozen = (np.abs(v - o) > 0.2) & ((vc - t) ** 2 > (v - t) ** 2)
    assert frozen.any()
    np.testing.assert_array_equal(np.asarray(g)[frozen], 0.0)


def test_normalize_advantages_and_shape_checks():
    """Normalisation gives zero mean and unit std; mismatched shapes are
    refused rather than broadcast (a [B] advantage against [B, N] log-probs)."""
    a = jnp.asarray(np.random.default_rng(4).normal(3.0, 5.0, size=(200,)), jnp.float32)
    z = np.asarray(L.normalize_advantages(a), np.float64)
    np.testing.assert_allclose([z.mean(), z.std()], [0.0, 1.0], atol=1e-5)
    with pytest.raises(AssertionError):
        L.clipped_surrogate_loss(jnp.zeros((4, 3)), jnp.zeros((4, 3)), jnp.zeros((4,)), 0.2)
    with pytest.raises(AssertionError):
        L.clipped_value_loss(jnp.zeros((4,)), jnp.zeros((4,)), jnp.zeros((4, 1)), 0.2)
