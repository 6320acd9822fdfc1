"""Linear mixing: shape checks, DICE ν-loss convexity, monotonicity.

MisoDICE mixes local values linearly, ν_tot = Σ_i w_i(s)·ν_i + b(s), because
that keeps the DICE ν-loss convex in the local values; a nonlinear (QMIX)
mixer does not. Non-negative weights keep ν_tot monotone in each ν_i.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil.losses import dice_advantage, dice_nu_loss
from jaxil.nn.mixing import mix, vdn_mix
from jaxil.nn.nets import HyperMixer, QMixer

N, S, B, B0 = 3, 4, 8, 4
ALPHA, GAMMA = 0.05, 0.9


@pytest.mark.parametrize("jit", [False, True])
def test_mix_matches_numpy(jit):
    rng = np.random.default_rng(0)
    local = rng.normal(size=(5, 2, N)).astype(np.float32)
    w = np.abs(rng.normal(size=(5, 2, N))).astype(np.float32)
    b = rng.normal(size=(5, 2)).astype(np.float32)
    f = jax.jit(mix) if jit else mix
    got = f(jnp.asarray(local), jnp.asarray(w), jnp.asarray(b))
    want = (local.astype(np.float64) * w).sum(-1) + b
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
    g = jax.jit(vdn_mix) if jit else vdn_mix
    want = local.astype(np.float64).sum(-1)
    np.testing.assert_allclose(np.asarray(g(jnp.asarray(local))), want, rtol=1e-6, atol=1e-6)


def test_mix_shape_checks():
    with pytest.raises(AssertionError):
        mix(np.ones((5, N)), np.ones((5, N + 1)), np.ones((5,)))
    with pytest.raises(AssertionError):
        mix(np.ones((5, N)), np.ones((5, N)), np.ones((4,)))
    with pytest.raises(AssertionError):
        mix(np.ones((5, N)), np.ones((5, N)), np.ones((5, 1)))


def _random_problem(rng, seeds):
    """States, rewards and dones of one DICE batch per seed (numpy)."""
    return dict(
        s0=rng.normal(size=(seeds, B0, S)).astype(np.float32),
        s=rng.normal(size=(seeds, B, S)).astype(np.float32),
        s_next=rng.normal(size=(seeds, B, S)).astype(np.float32),
        reward=rng.normal(size=(seeds, B)).astype(np.float32),
        done=rng.random((seeds, B)) < 0.2,
    )


def _random_locals(rng, seeds, pairs, scale=3.0):
    """Local values (ν_i(s0), ν_i(s), ν_i(s')) for ``pairs`` points per seed."""
    return tuple(
        (scale * rng.normal(size=(seeds, pairs, b, N))).astype(np.float32) for b in (B0, B, B)
    )


def _nu_loss(mix_fn, prob, local):
    """DICE ν-loss as a function of the local values (ν_i(s0), ν_i(s), ν_i(s'))."""
    nu0, nu, nu_next = local
    adv = dice_advantage(prob["reward"], mix_fn(nu, prob["s"]), mix_fn(nu_next, prob["s_next"]), prob["done"], GAMMA)
    return dice_nu_loss(mix_fn(nu0, prob["s0"]), adv, ALPHA, GAMMA)


def _midpoint_gaps(mix_fn, prob, x, y):
    """(L(x) + L(y))/2 − L((x+y)/2) per pair (≥ 0 for a convex L), and L(mid)."""
    loss = jax.vmap(lambda l: _nu_loss(mix_fn, prob, l))
    mid = jax.tree_util.tree_map(lambda a, b: (a + b) / 2, x, y)
    return (loss(x) + loss(y)) / 2 - loss(mid), loss(mid)


def _numpy_params(module, *example_args, rng, seeds):
    """``seeds`` random parameter sets for ``module``, stacked on a leading axis.

    Shapes come from ``jax.eval_shape`` and values from numpy, which keeps the
    test free of compiled PRNG code (slow to compile on small CPUs).
    """
    shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), *example_args)
    return jax.tree_util.tree_map(
        lambda s: (rng.normal(size=(seeds,) + s.shape) / np.sqrt(s.shape[0])).astype(np.float32), shapes
    )


def _hyper_mix_fn(mixer, params):
    def mix_fn(local, state):
        w, b = mixer.apply(params, state)  # fixed mixer outputs: linear in ν_i
        return mix(local, w, b)

    return mix_fn


def _qmix_fn(mixer, params):
    return lambda local, state: mixer.apply(params, local, state)


SEEDS, PAIRS = 16, 256


def _all_gaps(mixer, make_mix_fn, example_args, seed):
    """Midpoint gaps ``[seeds, pairs]`` for random mixer params and problems,
    one jit."""
    rng = np.random.default_rng(seed)
    prob = _random_problem(rng, SEEDS)
    params = _numpy_params(mixer, *example_args, rng=rng, seeds=SEEDS)
    x, y = _random_locals(rng, SEEDS, PAIRS), _random_locals(rng, SEEDS, PAIRS)

    @jax.jit
    def run(params, prob, x, y):
        one = lambda params, prob, x, y: _midpoint_gaps(make_mix_fn(mixer, params), prob, x, y)  # noqa: E731
        return jax.vmap(one)(params, prob, x, y)

    return tuple(np.asarray(a) for a in run(params, prob, x, y))


def test_dice_nu_loss_convex_in_local_values_with_linear_mixing():
    mixer = HyperMixer(N, hidden=8)
    gaps, mid = _all_gaps(mixer, _hyper_mix_fn, (np.zeros((B, S)),), seed=0)
    assert gaps.shape == (SEEDS, PAIRS)
    tol = 1e-5 * (1 + np.abs(mid))
    assert np.all(gaps >= -tol), float(np.min(gaps))
    assert np.any(gaps > 1e-3)  # strictly convex directions exist (not vacuous)


def test_dice_nu_loss_not_convex_with_nonlinear_qmixer():
    mixer = QMixer(N, embed_dim=4)
    gaps, mid = _all_gaps(mixer, _qmix_fn, (np.zeros((B, N)), np.zeros((B, S))), seed=1)
    violations = gaps < -1e-3 * (1 + np.abs(mid))
    assert violations.any(), "expected a midpoint-convexity violation with the nonlinear QMIX mixer"


def test_linear_mixing_is_monotone_in_each_local_value():
    """Raising one agent's local value never lowers ν_tot (HyperMixer weights ≥ 0)."""
    mixer = HyperMixer(N, hidden=8)
    rng = np.random.default_rng(2)
    seeds, batch = 16, 64
    params = _numpy_params(mixer, np.zeros((batch, S)), rng=rng, seeds=seeds)
    state = (3.0 * rng.normal(size=(seeds, batch, S))).astype(np.float32)
    local = rng.normal(size=(seeds, batch, N)).astype(np.float32)
    raise_by = (np.abs(rng.normal(size=(seeds, batch))) + 1e-2).astype(np.float32)

    @jax.jit
    @jax.vmap
    def check(params, state, local, raise_by):
        def nu_tot(local):
            w, b = mixer.apply(params, state)
            return mix(local, w, b)

        base = nu_tot(local)
        raised = jnp.stack([nu_tot(local.at[:, i].add(raise_by)) for i in range(N)])
        grad = jax.grad(lambda l: nu_tot(l).sum())(local)  # ∂ν_tot/∂ν_i = w_i(s)
        return raised - base, grad

    diff, grad = check(params, state, local, raise_by)
    assert np.all(np.asarray(diff) >= -1e-6)
    assert np.all(np.asarray(grad) >= 0)
