"""The sequence losses of :mod:`jaxil.losses.sequence` against float64 numpy
references on random inputs, with and without jit; masks wrong by one token
must change the loss. Each test names the mutation it kills."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil.losses.sequence import after_switch, agent_token_mask, masked_sequence_nll

jit_param = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
T, N, V, E = 9, 2, 5, 3


def _rng(seed=0):
    return np.random.default_rng(seed)


def _maybe_jit(fn, jit, **kw):
    return jax.jit(fn, **kw) if jit else fn


def _np_nll(lp, m):
    lp, m = np.asarray(lp, np.float64), np.asarray(m, np.float64)
    return -np.sum(m * lp) / max(m.sum(), 1.0)


@jit_param
@pytest.mark.parametrize("shape", [(T, N), (E, T, N)], ids=["episode", "batch"])
def test_masked_sequence_nll_matches_numpy(jit, shape):
    """Kills: a mean over all tokens instead of the masked ones (or a mean
    per episode, then over episodes), a flipped sign, and a denominator
    counting padding."""
    rng = _rng(1)
    lp = -np.abs(rng.normal(size=shape)).astype(np.float32)
    mask = rng.random(shape) < 0.6
    got = _maybe_jit(masked_sequence_nll, jit)(lp, mask)
    assert got.shape == ()
    np.testing.assert_allclose(float(got), _np_nll(lp, mask), rtol=1e-6)
    # Float masks (0/1) are the same loss.
    np.testing.assert_allclose(float(_maybe_jit(masked_sequence_nll, jit)(lp, mask.astype(np.float32))),
                               _np_nll(lp, mask), rtol=1e-6)


@jit_param
def test_masked_sequence_nll_ignores_masked_infinities_and_empty_mask(jit):
    """Kills: multiplying by the mask (``0 · -inf = nan`` on an illegal
    padding action) and dividing by an empty mask's zero count."""
    lp = np.full((T, N), -1.0, np.float32)
    lp[-1] = -np.inf
    mask = np.ones((T, N), bool)
    mask[-1] = False
    f = _maybe_jit(masked_sequence_nll, jit)
    np.testing.assert_allclose(float(f(lp, mask)), 1.0, rtol=1e-7)
    assert float(f(lp, np.zeros((T, N), bool))) == 0.0


@jit_param
def test_masked_sequence_nll_sees_a_mask_shifted_by_one_step(jit):
    """Kills: an off-by-one loss mask (the episode's valid steps shifted one
    token later or earlier, e.g. aligning the mask with ``obs[:, 1:]``)."""
    rng = _rng(2)
    lp = -np.abs(rng.normal(size=(T, N))).astype(np.float32)
    valid = np.arange(T) < 6
    f = _maybe_jit(masked_sequence_nll, jit)
    base = float(f(lp, np.broadcast_to(valid[:, None], (T, N))))
    for shifted in (np.roll(valid, 1), np.roll(valid, -1)):
        moved = float(f(lp, np.broadcast_to(shifted[:, None], (T, N))))
        assert abs(moved - base) > 1e-3
        np.testing.assert_allclose(moved, _np_nll(lp, np.broadcast_to(shifted[:, None], (T, N))),
                                   rtol=1e-6)


def test_masked_sequence_nll_gradient_is_the_mask_over_the_count():
    """Kills: a ``stop_gradient`` on the log-probabilities and a gradient
    reaching masked-out tokens: ∂L/∂lp_ti = −m_ti / Σm."""
    rng = _rng(3)
    lp = jnp.asarray(-np.abs(rng.normal(size=(T, N))), jnp.float32)
    mask = rng.random((T, N)) < 0.5
    g = jax.grad(masked_sequence_nll)(lp, mask)
    np.testing.assert_allclose(np.asarray(g), -mask.astype(np.float64) / mask.sum(), rtol=1e-6)


def test_masked_sequence_nll_rejects_bad_shapes():
    """Kills: a silently broadcast mask (``[T]`` against ``[T, N]``) and an
    integer log-probability."""
    with pytest.raises(AssertionError):
        masked_sequence_nll(np.zeros((T, N), np.float32), np.ones((T,), bool))
    with pytest.raises(AssertionError):
        masked_sequence_nll(np.zeros((T, N), np.int32), np.ones((T, N), bool))
    with pytest.raises(ValueError, match="log_probs must be"):
        masked_sequence_nll(np.zeros((T,), np.float32), np.ones((T,), bool))


def _np_agent_token_mask(valid, n, avail=None):
    m = np.repeat(np.asarray(valid, bool)[:, None], n, axis=1)
    if avail is not None:
        m &= np.asarray(avail).sum(-1) > 1
    return m


@jit_param
@pytest.mark.parametrize("use_avail", [False, True], ids=["valid", "choices"])
def test_agent_token_mask_matches_numpy(jit, use_avail):
    """Kills: dropping the valid-step mask (padding counted), counting a
    forced token (one legal choice) as a choice, and leaving out a token
    with two legal choices (``> 1`` written ``> 2``)."""
    rng = _rng(4)
    valid = np.arange(T) < 7
    avail = rng.random((T, N, V)) < 0.3
    avail[0, 0] = False
    avail[0, 0, 1] = True  # forced
    avail[1, 0] = False
    avail[1, 0, 1:3] = True  # two choices
    f = _maybe_jit(agent_token_mask, jit, static_argnums=1)
    got = np.asarray(f(valid, N, avail if use_avail else None))
    want = _np_agent_token_mask(valid, N, avail if use_avail else None)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == bool and got.shape == (T, N)
    if use_avail:
        assert not got[0, 0] and got[1, 0]


@jit_param
def test_agent_token_mask_shifted_valid_changes_the_loss(jit):
    """Kills: a token mask one step off the episode's valid steps (the last
    valid token dropped, or the first padding token counted)."""
    rng = _rng(5)
    lp = -np.abs(rng.normal(size=(T, N))).astype(np.float32)
    valid = np.arange(T) < 5
    f = _maybe_jit(lambda v, l: masked_sequence_nll(l, agent_token_mask(v, N)), jit)
    base = float(f(valid, lp))
    np.testing.assert_allclose(base, _np_nll(lp, _np_agent_token_mask(valid, N)), rtol=1e-6)
    for wrong in (np.arange(T) < 4, np.arange(T) < 6):
        assert abs(float(f(wrong, lp)) - base) > 1e-3


@jit_param
@pytest.mark.parametrize("per_agent", [False, True], ids=["scalar", "per_agent"])
def test_after_switch_matches_numpy(jit, per_agent):
    """Kills: ``t > s`` for ``t ≥ s`` (the expert's first token after the
    takeover lost), the mask reversed (the student's segment trained on),
    and agents' switches swapped."""
    rng = _rng(6)
    t = np.arange(T, dtype=np.int32)
    s = (rng.integers(0, T + 1, size=(N,)) if per_agent else np.int32(4)).astype(np.int32)
    if per_agent:
        s[:2] = [2, 6]
    got = np.asarray(_maybe_jit(after_switch, jit)(t, s))
    want = t[:, None] >= s[None, :] if per_agent else t >= s
    np.testing.assert_array_equal(got, want)
    first = [int(x) for x in np.atleast_1d(s)]
    cols = got.T if per_agent else got[None]
    for col, sw in zip(cols, first):
        if sw < T:
            assert col[sw] and (sw == 0 or not col[sw - 1])


@jit_param
def test_after_switch_by_one_changes_the_loss(jit):
    """Kills: a takeover mask one token early or late (a student token
    labelled as the expert's, or the expert's first token dropped)."""
    rng = _rng(7)
    lp = -np.abs(rng.normal(size=(T, N))).astype(np.float32)
    t = jnp.arange(T)
    valid = np.ones(T, bool)

    def loss(s):
        m = agent_token_mask(valid, N) & after_switch(t, s)[:, None]
        return masked_sequence_nll(lp, m)

    f = _maybe_jit(loss, jit)
    base = float(f(jnp.int32(3)))
    np.testing.assert_allclose(base, _np_nll(lp[3:], np.ones((T - 3, N))), rtol=1e-6)
    for s in (2, 4):
        assert abs(float(f(jnp.int32(s))) - base) > 1e-3
    assert float(f(jnp.int32(T))) == 0.0  # no expert segment, no loss
