"""GAIL, AIRL and PPO against a learned reward (issue 12, items 3-5).

The losses are checked against float64 numpy references on random inputs,
with and without jit; the reward hook of the PPO teacher trainer on the tiny
environments of tests/test_teachers.py; the GAIL driver's kill-and-resume
against an uninterrupted run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil.losses import discriminator_loss
from jaxil.losses.adversarial import (
    agent_discriminator_loss,
    airl_logits,
    airl_shaped_reward,
    discriminator_accuracy,
    gail_reward,
    kl_penalized_reward,
)

RNG = np.random.default_rng(7)
jit_param = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])


@pytest.fixture(autouse=True)
def _reseed():
    global RNG
    RNG = np.random.default_rng(7)


def _f32(*shape, scale=1.0):
    return (scale * RNG.normal(size=shape)).astype(np.float32)


def _maybe_jit(fn, jit, **kw):
    return jax.jit(fn, **kw) if jit else fn


def _np_softplus(x):
    return np.logaddexp(0.0, np.asarray(x, np.float64))


TOL = dict(rtol=2e-5, atol=2e-6)


# --------------------------------------------------------------------------
# Losses against numpy
# --------------------------------------------------------------------------
@jit_param
@pytest.mark.parametrize("form", ["softplus", "logit", "log_d"])
def test_gail_reward_forms_match_numpy(jit, form):
    """Each GAIL reward form equals its definition in D = σ(ℓ): −log(1−D),
    log D − log(1−D), log D. A flipped sign (rewarding the policy for looking
    like the policy) or the forms swapped fails; large |ℓ| stay finite."""
    logits = np.concatenate([_f32(64, scale=3.0), np.float32([-80.0, 80.0])])
    out = np.asarray(_maybe_jit(gail_reward, jit, static_argnums=1)(logits, form))
    x = logits.astype(np.float64)
    ref = {"softplus": _np_softplus(x),  # = -log(1 - D), stably
           "logit": x,
           "log_d": -_np_softplus(-x)}[form]
    np.testing.assert_allclose(out, ref, **TOL)
    mid = np.abs(x) < 10
    d = 1.0 / (1.0 + np.exp(-x[mid]))
    direct = {"softplus": -np.log1p(-d), "logit": np.log(d) - np.log1p(-d), "log_d": np.log(d)}[form]
    np.testing.assert_allclose(out[mid], direct, rtol=1e-4, atol=1e-5)
    assert np.isfinite(out).all()
    # Monotone increasing in the logit: more expert-like, more reward.
    order = np.argsort(x)
    assert (np.diff(out[order]) >= 0).all()


def test_gail_reward_unknown_form_is_named():
    with pytest.raises(ValueError, match="unknown GAIL reward form 'bogus'.*softplus"):
        gail_reward(jnp.zeros(3), "bogus")


@jit_param
@pytest.mark.parametrize("shape", [(32,), (16, 3)])
def test_airl_shaped_reward_and_logits_match_numpy(jit, shape):
    """f = g + γ(1−last)h' − h and ℓ = f − log π against numpy, team [B] and
    per agent [B, N]. Fails for: the shaping sign reversed (h − γh'), the
    terminal mask ignored (bootstrapping h' across an episode end), γ on h
    instead of h', or + log π."""
    g, h, hn, lp = (_f32(*shape) for _ in range(4))
    last = RNG.random(shape) < 0.3
    gamma = 0.93
    f = np.asarray(_maybe_jit(airl_shaped_reward, jit)(g, h, hn, last, gamma))
    lo = np.asarray(_maybe_jit(airl_logits, jit)(g, h, hn, last, lp, gamma))
    g64, h64, hn64, lp64 = (np.asarray(x, np.float64) for x in (g, h, hn, lp))
    ref_f = g64 + gamma * (1.0 - last) * hn64 - h64
    np.testing.assert_allclose(f, ref_f, **TOL)
    np.testing.assert_allclose(lo, ref_f - lp64, **TOL)
    # D = exp f / (exp f + π): the logistic of the logit.
    d = np.exp(ref_f) / (np.exp(ref_f) + np.exp(lp64))
    np.testing.assert_allclose(1 / (1 + np.exp(-lo)), d, rtol=1e-4, atol=1e-6)


def test_airl_logits_do_not_differentiate_the_policy_and_check_shapes():
    """The discriminator step treats log π as data: its gradient w.r.t.
    log π is zero (a missing stop-gradient would let the discriminator loss
    move the policy), w.r.t. g it is the logistic loss's. Mismatched shapes
    are refused."""
    g, h, hn, lp = (_f32(8) for _ in range(4))
    last = np.zeros(8, bool)

    def loss(g, lp):
        return discriminator_loss(airl_logits(g, h, hn, last, lp, 0.9), jnp.zeros(4))

    dg, dlp = jax.grad(loss, argnums=(0, 1))(g, lp)
    assert np.all(np.asarray(dlp) == 0.0)
    f = g + 0.9 * hn - h - lp
    np.testing.assert_allclose(np.asarray(dg), -(1 - 1 / (1 + np.exp(-f))) / 8, rtol=1e-4, atol=1e-6)
    with pytest.raises(AssertionError):
        airl_logits(g, h, hn[:4], last, lp, 0.9)
    with pytest.raises(AssertionError):
        airl_logits(g, h, hn, last, lp[:4], 0.9)


@jit_param
def test_agent_discriminator_loss_matches_numpy(jit):
    """Σ_i of each agent's logistic loss with expert = 1, policy = 0, over
    batches of different sizes. Swapped labels, a mean instead of a sum over
    agents, or mixing agents' columns fails."""
    e, p = _f32(12, 3, scale=2.0), _f32(20, 3, scale=2.0)
    out = float(_maybe_jit(agent_discriminator_loss, jit)(e, p))
    ref = sum(_np_softplus(-e[:, i]).mean() + _np_softplus(p[:, i]).mean() for i in range(3))
    np.testing.assert_allclose(out, ref, **TOL)
    # Agent i's loss depends on column i only.
    g = np.asarray(jax.grad(agent_discriminator_loss)(jnp.asarray(e), jnp.asarray(p)))
    e64 = e.astype(np.float64)
    np.testing.assert_allclose(g, -(1 - 1 / (1 + np.exp(-e64))) / 12, rtol=1e-4, atol=1e-6)
    with pytest.raises(AssertionError):
        agent_discriminator_loss(e, p[:, :2])
    with pytest.raises(AssertionError):
        agent_discriminator_loss(e[:, 0], p[:, 0])


def test_discriminator_accuracy():
    """Half expert-correct, all policy-correct -> 0.75 (a flipped comparison
    on either source fails)."""
    acc = discriminator_accuracy(jnp.array([1.0, -1.0, 2.0, -3.0]), jnp.array([-1.0, -0.5]))
    assert float(acc) == pytest.approx(0.75)


@jit_param
@pytest.mark.parametrize("per_agent", [False, True], ids=["team", "agents"])
def test_kl_penalized_reward_matches_numpy(jit, per_agent):
    """r − β(log π − log π_ref): for a team reward the log-ratio is summed over
    agents (the joint policy), for per-agent rewards each agent gets its own.
    Fails for: the ratio the wrong way round (rewarding divergence), a mean
    over agents, the coefficient dropped."""
    T, E, N = 5, 4, 3
    lp, ref = _f32(T, E, N), _f32(T, E, N)
    r = _f32(T, E, N) if per_agent else _f32(T, E)
    out = np.asarray(_maybe_jit(kl_penalized_reward, jit)(r, lp, ref, 0.3))
    ratio = lp.astype(np.float64) - ref
    expect = r - 0.3 * (ratio if per_agent else ratio.sum(-1))
    np.testing.assert_allclose(out, expect, **TOL)
    with pytest.raises(AssertionError):
        kl_penalized_reward(r[:2], lp, ref, 0.3)


def test_kl_penalty_estimates_the_kl_in_expectation():
    """E_{a~π}[log π(a) − log π_ref(a)] is KL(π‖π_ref): the mean penalty over
    many draws of a categorical approaches the exact KL (the estimator's sign
    or the ratio's orientation wrong fails)."""
    p = np.array([0.6, 0.3, 0.1])
    q = np.array([0.2, 0.5, 0.3])
    a = RNG.choice(3, size=200_000, p=p)
    lp = np.log(p)[a].astype(np.float32)[:, None]
    lq = np.log(q)[a].astype(np.float32)[:, None]
    pen = -np.asarray(kl_penalized_reward(jnp.zeros(a.shape[0]), lp, lq, 1.0))
    kl = float(np.sum(p * np.log(p / q)))
    assert abs(pen.mean() - kl) < 0.01
