"""Local agent networks and mixers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil.nn.nets import MLP, HyperMixer, LocalMLP, QMixer

N, IN, OUT, HID = 3, 5, 4, (16, 16)


def _numpy_params(module, *example_args, seed=0):
    """Random parameters for ``module`` with shapes from ``jax.eval_shape``.

    Filling them from numpy keeps compiled PRNG code (slow to compile on a
    small CPU) out of the tests that do not test initialisation itself.
    """
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), *example_args)
    return jax.tree_util.tree_map(
        lambda s: (rng.normal(size=s.shape) / np.sqrt(s.shape[-2] if len(s.shape) > 1 else 4)).astype(np.float32),
        shapes,
    )


def test_shared_mode_shapes_and_agent_id():
    net = LocalMLP(OUT, N, HID, shared=True)
    x = np.ones((7, N, IN), np.float32)  # identical inputs for every agent
    params = _numpy_params(net, x)
    apply = jax.jit(net.apply)
    y = np.asarray(apply(params, x))
    assert y.shape == (7, N, OUT)
    # One parameter set; its first layer sees obs ⊕ one-hot id.
    kernel = params["params"]["mlp"]["hidden_0"]["kernel"]
    assert kernel.shape == (IN + N, HID[0])
    # Identical inputs: outputs differ between agents, only through the id.
    assert not np.allclose(y[:, 0], y[:, 1])
    np.testing.assert_allclose(y[0], y[1])
    ids = np.broadcast_to(np.eye(N), (7, N, N))
    manual = MLP(OUT, HID).apply({"params": params["params"]["mlp"]}, jnp.concatenate([x, ids], -1))
    np.testing.assert_allclose(y, np.asarray(manual), rtol=1e-5, atol=1e-6)
    # Zeroing the id rows of the first layer makes the agents identical.
    p2 = jax.tree_util.tree_map(np.copy, params)
    p2["params"]["mlp"]["hidden_0"]["kernel"][IN:] = 0.0
    y2 = np.asarray(apply(p2, x))
    np.testing.assert_allclose(y2[:, 0], y2[:, 1], rtol=1e-6)


def test_independent_mode_stacks_params_and_matches_plain_mlp():
    net = LocalMLP(OUT, N, HID, shared=False)
    x = np.random.default_rng(1).normal(size=(2, 7, N, IN)).astype(np.float32)  # extra leading dims
    # The real initialiser; an RBG key keeps PRNG compile time down on small CPUs.
    params = jax.jit(net.init)(jax.random.key(0, impl="unsafe_rbg"), x)
    leaves = jax.tree_util.tree_leaves(params)
    assert leaves and all(leaf.shape[0] == N for leaf in leaves)
    assert params["params"]["agents"]["hidden_0"]["kernel"].shape == (N, IN, HID[0])
    # Agents get different initial parameters (split rngs).
    k = np.asarray(params["params"]["agents"]["hidden_0"]["kernel"])
    assert not np.allclose(k[0], k[1])
    y = np.asarray(jax.jit(net.apply)(params, x))
    assert y.shape == (2, 7, N, OUT)
    plain = jax.jit(MLP(OUT, HID).apply)
    for i in range(N):
        p_i = jax.tree_util.tree_map(lambda a: a[i], params["params"]["agents"])
        y_i = plain({"params": p_i}, x[..., i, :])
        np.testing.assert_allclose(y[..., i, :], np.asarray(y_i), rtol=1e-5, atol=1e-6)


def test_local_mlp_rejects_wrong_agent_axis():
    with pytest.raises(ValueError, match="agent axis"):
        jax.eval_shape(LocalMLP(OUT, N, HID).init, jax.random.PRNGKey(0), np.ones((7, N + 1, IN)))
    with pytest.raises(ValueError, match="agent axis"):
        jax.eval_shape(LocalMLP(OUT, N, HID, shared=False).init, jax.random.PRNGKey(0), np.ones((IN,)))


def test_hyper_mixer_nonnegative_weights_and_shapes():
    mixer = HyperMixer(N, hidden=8)
    s = np.random.default_rng(2).normal(size=(4, 6, 10)).astype(np.float32)
    params = _numpy_params(mixer, s)
    w, b = jax.jit(mixer.apply)(params, s)
    assert w.shape == (4, 6, N) and b.shape == (4, 6)
    assert np.all(np.asarray(w) >= 0)
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params["params"])
    # O-MAPL MixNet: shared trunk, |Linear(hidden→N)| weights, Linear(hidden→1) bias.
    assert p["trunk"]["kernel"].shape == (10, 8)
    assert p["weights"]["kernel"].shape == (8, N)
    assert p["bias"]["kernel"].shape == (8, 1)
    h = np.maximum(s.astype(np.float64) @ p["trunk"]["kernel"] + p["trunk"]["bias"], 0.0)
    np.testing.assert_allclose(
        np.asarray(w), np.abs(h @ p["weights"]["kernel"] + p["weights"]["bias"]), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        np.asarray(b), (h @ p["bias"]["kernel"] + p["bias"]["bias"])[..., 0], rtol=1e-4, atol=1e-5
    )
    sep = HyperMixer(N, hidden=8, separate_bias_trunk=True)
    shapes = jax.eval_shape(sep.init, jax.random.PRNGKey(0), s)
    assert "bias_trunk" in shapes["params"]
    w2, b2 = jax.eval_shape(sep.apply, shapes, s)
    assert w2.shape == (4, 6, N) and b2.shape == (4, 6)


def test_qmixer_shapes_and_monotone():
    mixer = QMixer(N, embed_dim=8)
    rng = np.random.default_rng(3)
    local = rng.normal(size=(5, N)).astype(np.float32)
    s = rng.normal(size=(5, 10)).astype(np.float32)
    params = _numpy_params(mixer, local, s)

    @jax.jit
    def out_and_grad(local):
        return mixer.apply(params, local, s), jax.grad(lambda l: mixer.apply(params, l, s).sum())(local)

    out, grads = out_and_grad(local)
    assert out.shape == (5,)
    assert np.all(np.asarray(grads) >= 0)
    with pytest.raises(AssertionError):
        jax.eval_shape(mixer.apply, params, local, s[:4])
