"""The distillation losses of [`jaxil.losses.distill`][jaxil.losses.distill]
against float64 numpy references on random inputs, with and without jit:
the KL direction, the loss mask, the expert's step, the β endpoints, the
legal-token renormalisation, the stopped expert gradient and the sign of
the objective. Each test names the bug it kills."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import losses as L
from jaxil.nn import distributions as D


def distillation_loss(s, e, avail, mask, beta=1.0):
    """The loss of the logits `s` (student) and `e` (expert): the library's
    takes log-probabilities normalised over the legal tokens."""
    return L.distillation_loss(D.categorical_log_probs(s, avail), D.categorical_log_probs(e, avail),
                               avail, mask, beta=beta)


def generalized_jsd(s, e, avail, beta=1.0):
    """The per-token divergence of the logits `s` and `e` (as above)."""
    return L.generalized_jsd(D.categorical_log_probs(s, avail), D.categorical_log_probs(e, avail),
                             avail, beta)

jit_param = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
T, N, V, E = 8, 2, 6, 3


def _maybe_jit(fn, jit):
    return jax.jit(fn, static_argnames="beta") if jit else fn


def _inputs(seed, shape=(T, V), scale=2.0, p_legal=0.6):
    """Random student / expert logits, a legal mask with >= 1 legal token per
    row (some rows with exactly one) and a loss mask of the logits' shape
    without V."""
    rng = np.random.default_rng(seed)
    s = (scale * rng.normal(size=shape)).astype(np.float32)
    e = (scale * rng.normal(size=shape)).astype(np.float32)
    avail = rng.random(shape) < p_legal
    rows = avail.reshape(-1, shape[-1])
    rows[np.arange(rows.shape[0]), rng.integers(0, shape[-1], rows.shape[0])] = True
    avail = rows.reshape(shape)
    mask = rng.random(shape[:-1]) < 0.7
    return s, e, avail, mask


# -- float64 numpy reference ---------------------------------------------------------
def _np_log_probs(logits, avail):
    x = np.where(avail, np.asarray(logits, np.float64), -np.inf)
    mx = np.max(x, axis=-1, keepdims=True)
    lse = mx + np.log(np.sum(np.exp(x - mx), axis=-1, keepdims=True))
    return x - lse                                   # -inf on illegal tokens


def _np_kl(lp, lq, avail):
    """KL(p ‖ q) over the legal tokens (illegal ones: 0 · log 0 = 0)."""
    with np.errstate(invalid="ignore"):
        term = np.exp(lp) * (lp - lq)
    return np.sum(np.where(avail, term, 0.0), axis=-1)


def _np_jsd(s, e, avail, beta):
    ls, le = _np_log_probs(s, avail), _np_log_probs(e, avail)
    if beta == 0.0:
        return _np_kl(le, ls, avail)
    if beta == 1.0:
        return _np_kl(ls, le, avail)
    with np.errstate(divide="ignore"):
        lm = np.log(beta * np.exp(le) + (1 - beta) * np.exp(ls))
    return beta * _np_kl(le, lm, avail) + (1 - beta) * _np_kl(ls, lm, avail)


def _np_loss(s, e, avail, mask, beta):
    m = np.asarray(mask, np.float64)
    return np.sum(m * _np_jsd(s, e, avail, beta)) / max(m.sum(), 1.0)


# -- tests ------------------------------------------------------------------------------
@jit_param
@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("shape", [(T, V), (E, T, N, V)], ids=["episode", "batch"])
def test_distillation_loss_matches_numpy(jit, beta, shape):
    """Kills: a wrong divergence formula (unnormalised or unmasked softmax,
    the mixture's weights swapped, β ↔ 1 − β), a mean over all tokens or
    per episode instead of over the masked tokens, and a denominator that
    counts unmasked tokens."""
    s, e, avail, mask = _inputs(1, shape)
    f = _maybe_jit(distillation_loss, jit)
    got = f(s, e, avail, mask, beta=beta)
    assert got.shape == ()
    np.testing.assert_allclose(float(got), _np_loss(s, e, avail, mask, beta), rtol=2e-5, atol=1e-6)
    # 0/1 float masks are the same loss; the per-token divergence matches too.
    np.testing.assert_allclose(float(f(s, e, avail, mask.astype(np.float32), beta=beta)),
                               _np_loss(s, e, avail, mask, beta), rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(_maybe_jit(generalized_jsd, jit)(s, e, avail, beta=beta)),
                               _np_jsd(s, e, avail, beta), rtol=2e-5, atol=1e-6)


@jit_param
def test_reverse_kl_is_not_the_forward_kl(jit):
    """Kills the KL direction swapped: at β = 1 the loss is the reverse KL
    KL(π_s ‖ π_e), far from the forward KL(π_e ‖ π_s) of the same inputs,
    and at β = 0 the other way round."""
    s, e, avail, mask = _inputs(2, (E, T, V), scale=3.0)
    f = _maybe_jit(distillation_loss, jit)
    reverse = _np_loss(s, e, avail, mask, 1.0)
    forward = np.sum(mask * _np_kl(_np_log_probs(e, avail), _np_log_probs(s, avail), avail)) / mask.sum()
    assert abs(reverse - forward) > 0.1 * max(reverse, forward)
    np.testing.assert_allclose(float(f(s, e, avail, mask, beta=1.0)), reverse, rtol=2e-5)
    np.testing.assert_allclose(float(f(s, e, avail, mask, beta=0.0)), forward, rtol=2e-5)
    assert abs(float(f(s, e, avail, mask, beta=1.0)) - forward) > 0.1 * forward


@jit_param
def test_loss_mask_off_by_one_token_is_far_off(jit):
    """Kills an environment-token mask off by one token: a reference with the
    agent-token mask shifted one step later or earlier (e.g. aligned with
    the next observation) is far from the loss, which equals the reference
    with the right mask."""
    s, e, avail, _ = _inputs(3, (T, V), scale=3.0)
    # Agent turns of 3 tokens, then 1 environment token, repeated; the expert
    # is close to the student on the agent tokens, not on the others.
    mask = (np.arange(T) % 4) != 3
    e = np.where(mask[:, None], s + 0.3 * e / 3.0, e).astype(np.float32)
    f = _maybe_jit(distillation_loss, jit)
    got = float(f(s, e, avail, mask, beta=1.0))
    np.testing.assert_allclose(got, _np_loss(s, e, avail, mask, 1.0), rtol=2e-5)
    for shifted in (np.roll(mask, 1), np.roll(mask, -1)):
        assert abs(got - _np_loss(s, e, avail, shifted, 1.0)) > 2.0 * got


@jit_param
def test_expert_from_the_wrong_step_is_far_off(jit):
    """Kills the expert's distribution taken from the wrong step (shifted by
    one, e.g. the logits that predict the NEXT token): a student equal to
    the expert has loss 0, and against the expert shifted one step the
    loss is far from 0 and equals the shifted reference."""
    s, _, avail, mask = _inputs(4, (E, T, V), scale=3.0)
    f = _maybe_jit(distillation_loss, jit)
    assert abs(float(f(s, s, avail, mask, beta=1.0))) < 1e-6
    for shift in (1, -1):
        e = np.roll(s, shift, axis=-2)
        got = float(f(s, e, avail, mask, beta=1.0))
        assert got > 0.5
        np.testing.assert_allclose(got, _np_loss(s, e, avail, mask, 1.0), rtol=2e-5)


def test_beta_endpoints_are_the_two_kls_and_the_interior_tends_to_them():
    """Kills the endpoint convention swapped (β = 0 must be the forward KL
    KL(π_e ‖ π_s), β = 1 the reverse KL(π_s ‖ π_e), as GKD and TRL) and a
    mixture with its weights swapped: near β = 0 the JSD is β · KL(π_e ‖ π_s),
    near β = 1 it is (1 − β) · KL(π_s ‖ π_e)."""
    s, e, avail, _ = _inputs(5, (T, V), scale=1.0)
    ls, le = _np_log_probs(s, avail), _np_log_probs(e, avail)
    fwd, rev = _np_kl(le, ls, avail), _np_kl(ls, le, avail)
    np.testing.assert_allclose(np.asarray(generalized_jsd(s, e, avail, 0.0)), fwd, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(generalized_jsd(s, e, avail, 1.0)), rev, rtol=2e-5, atol=1e-6)
    b = 1e-3
    np.testing.assert_allclose(np.asarray(generalized_jsd(s, e, avail, b)) / b, fwd, rtol=0.01, atol=1e-4)
    np.testing.assert_allclose(np.asarray(generalized_jsd(s, e, avail, 1 - b)) / b, rev, rtol=0.01,
                               atol=1e-4)


@jit_param
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_illegal_tokens_contribute_nothing(jit, beta):
    """Kills a softmax over the whole vocabulary (not renormalised over the
    legal tokens) and a `0 · log 0` taken as NaN or as a huge term:
    changing the illegal logits of either side, even to ±1e4, changes
    neither the loss nor its gradient, which is 0 on the illegal tokens."""
    s, e, avail, mask = _inputs(6, (E, T, V))
    rng = np.random.default_rng(7)
    s2 = np.where(avail, s, 1e4 * rng.choice([-1.0, 1.0], size=s.shape)).astype(np.float32)
    e2 = np.where(avail, e, 50.0 * rng.normal(size=e.shape)).astype(np.float32)
    f = _maybe_jit(distillation_loss, jit)
    base = float(f(s, e, avail, mask, beta=beta))
    np.testing.assert_allclose(float(f(s2, e2, avail, mask, beta=beta)), base, rtol=1e-6, atol=1e-7)
    g = jax.grad(lambda x: distillation_loss(x, e2, avail, mask, beta=beta))(jnp.asarray(s2))
    assert np.all(np.isfinite(np.asarray(g)))
    assert np.all(np.asarray(g)[~avail] == 0.0)
    g0 = jax.grad(lambda x: distillation_loss(x, e, avail, mask, beta=beta))(jnp.asarray(s))
    np.testing.assert_allclose(np.asarray(g), np.asarray(g0), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_gradient_reaches_the_student_only(beta):
    """Kills a missing `stop_gradient` on the expert's side (the expert would
    be pulled towards the student) and one on the student's side (no
    learning): the gradient w.r.t. the expert logits is exactly 0, the one
    w.r.t. the student logits is not, and it is 0 on masked-out steps."""
    s, e, avail, mask = _inputs(8, (E, T, V))
    ge = jax.grad(lambda x: distillation_loss(s, x, avail, mask, beta=beta))(jnp.asarray(e))
    gs = jax.grad(lambda x: distillation_loss(x, e, avail, mask, beta=beta))(jnp.asarray(s))
    assert np.all(np.asarray(ge) == 0.0)
    assert np.abs(np.asarray(gs)[mask]).max() > 1e-3
    assert np.all(np.asarray(gs)[~mask] == 0.0)


@pytest.mark.parametrize("beta", [0.0, 0.2, 0.5, 1.0])
def test_loss_is_nonnegative_and_zero_when_the_two_agree(beta):
    """Kills a flipped sign and a divergence that is not one (e.g. cross
    entropy, which is > 0 when the two agree): the loss is ≥ 0 on random
    inputs, and 0 when the expert's logits differ from the student's only by
    a per-step constant and on the illegal tokens (the same distribution
    over the legal tokens)."""
    for seed in range(5):
        s, e, avail, mask = _inputs(10 + seed, (E, T, V))
        assert float(distillation_loss(s, e, avail, mask, beta=beta)) >= 0.0
        assert np.all(np.asarray(generalized_jsd(s, e, avail, beta)) >= -1e-6)
    same = s + 3.0 * np.arange(T, dtype=np.float32)[:, None]
    same = np.where(avail, same, -7.0 + e).astype(np.float32)
    assert abs(float(distillation_loss(s, same, avail, mask, beta=beta))) < 1e-5


@pytest.mark.parametrize("beta", [1.0, 0.5, 0.0])
def test_gradient_descent_on_the_loss_brings_the_student_to_the_expert(beta):
    """Kills a flipped objective (`−KL`, gradient ascent): 300 gradient steps
    on a uniform student's logits bring its legal distribution to the
    expert's (the reverse KL falls by > 50×, every legal probability within
    0.02), while the same steps up the loss drive the KL up."""
    _, e, avail, _ = _inputs(20, (T, V), scale=2.0)
    mask = np.ones((T,), bool)
    start_logits = jnp.zeros((T, V), jnp.float32)

    def kl(x):
        return float(distillation_loss(x, e, avail, mask, beta=1.0))

    @jax.jit
    def move(x, lr):
        def step(x, _):
            return x - lr * jax.grad(lambda y: distillation_loss(y, e, avail, mask, beta=beta))(x), None
        return jax.lax.scan(step, x, None, length=300)[0]

    start = kl(start_logits)
    end_logits = move(start_logits, 8.0)
    assert start > 0.3
    assert kl(end_logits) < start / 50
    p_s = np.exp(_np_log_probs(np.asarray(end_logits), avail))
    p_e = np.exp(_np_log_probs(e, avail))
    np.testing.assert_allclose(np.where(avail, p_s, 0.0), np.where(avail, p_e, 0.0), atol=0.02)
    assert kl(move(start_logits, -8.0)) > 2 * start


@pytest.mark.parametrize("beta", [-0.1, 1.5, float("nan")])
def test_beta_outside_the_unit_interval_is_refused_in_one_line(beta):
    """Kills a β outside [0, 1] silently accepted (a negative mixture weight,
    a NaN loss)."""
    s, e, avail, mask = _inputs(30)
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\]") as info:
        distillation_loss(s, e, avail, mask, beta=beta)
    assert "\n" not in str(info.value)


def test_traced_beta_and_bad_shapes_are_refused():
    """Kills a β traced under jit silently taking the interior branch at an
    endpoint, and a loss mask that broadcasts against the wrong axis (a
    `[T]` mask for `[T, N]` tokens, a mask with the vocabulary axis)."""
    s, e, avail, mask = _inputs(31, (T, N, V))
    with pytest.raises(TypeError, match="static"):
        jax.jit(lambda b: distillation_loss(s, e, avail, mask, beta=b))(1.0)
    with pytest.raises(AssertionError):
        distillation_loss(s, e, avail, mask[:, 0])
    with pytest.raises(AssertionError):
        distillation_loss(s, e, avail, avail)
    with pytest.raises(AssertionError):
        distillation_loss(s, e[..., :-1], avail, mask)
