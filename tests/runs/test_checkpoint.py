"""The one checkpoint format (``jaxil.runs.checkpoint``) on the states it must hold."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxil import envs
from jaxil.runs.checkpoint import Checkpointer
from jaxil.algorithms.interactive.buffer import empty_buffer, insert


def test_zero_size_leaves_round_trip(tmp_path):
    """A box-action environment's interactive buffer has a legal-action mask
    of shape ``[C, N, 0]``. Orbax refuses zero-size arrays, so saving it used
    to fail (`jaxil interactive bc --env mpe:simple_spread_continuous` died at
    its first checkpoint). The state must come back leaf for leaf, the empty
    mask with its shape and dtype, and the leaves after it in their places (a
    refill that drops the empty leaf shifts every later leaf by one)."""
    spec = envs.make("mpe:simple_spread_continuous").spec
    n, d = spec.num_agents, spec.action.dim
    buf = insert(empty_buffer(spec, 8), jnp.ones((3, n, spec.obs_dim)), jnp.zeros((3, n, 0), bool),
                 jnp.full((3, n, d), 0.25), jnp.ones((3,), bool))
    state = {"buffer": buf, "after": (jnp.arange(3.0), jnp.zeros((0, 2), jnp.int32))}
    ck = Checkpointer(tmp_path / "ck")
    ck.save(1, state)
    like = jax.tree.map(jnp.zeros_like, state)
    got = ck.restore(like)
    ck.close()
    want, got_leaves = jax.tree.leaves(state), jax.tree.leaves(got)
    assert jax.tree.structure(got) == jax.tree.structure(state)
    for a, b in zip(want, got_leaves):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert got["buffer"].avail.shape == (8, n, 0)


def test_a_none_field_before_an_empty_leaf_keeps_the_leaves_in_place(tmp_path):
    """An MPE runner state: the environment's state has a field that is None
    (no goal) before the empty legal-action mask of an environment whose
    actions are all legal. The refill used to count the None as a leaf of the
    restored tree but not of the template, so every leaf after it moved by
    one and `--resume` of GAIL/AIRL on MPE failed with "does not match the
    state". The state must come back leaf for leaf."""
    env = envs.make("mpe:simple_spread")
    state, _ = env.reset(jax.random.PRNGKey(0))
    assert state.avail_actions.size == 0
    assert any(x is None for x in jax.tree.leaves(state.inner, is_leaf=lambda x: x is None))
    ck = Checkpointer(tmp_path / "ck")
    ck.save(1, {"env": state, "after": jnp.arange(4.0)})
    got = ck.restore(jax.tree.map(jnp.zeros_like, {"env": state, "after": jnp.arange(4.0)}))
    ck.close()
    assert jax.tree.structure(got) == jax.tree.structure({"env": state, "after": jnp.arange(4.0)})
    for a, b in zip(jax.tree.leaves({"env": state, "after": jnp.arange(4.0)}), jax.tree.leaves(got)):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_restored_arrays_are_placed_as_the_template(tmp_path):
    """Orbax returns committed arrays. A resumed run's programs then differ from
    the original run's (committed arguments change the compile key), so every
    program was compiled again instead of hitting the persistent compilation
    cache (a CLI resume took 16 s instead of 1 s). Restoring into a freshly
    initialised, uncommitted state must give uncommitted arrays; a committed
    template keeps its placement."""
    state = {"w": jnp.arange(6.0).reshape(2, 3), "n": jnp.int32(4)}
    ck = Checkpointer(tmp_path / "ck")
    ck.save(1, state)
    got = ck.restore(jax.tree.map(jnp.zeros_like, state))
    assert not any(x.committed for x in jax.tree.leaves(got))
    np.testing.assert_array_equal(np.asarray(got["w"]), np.asarray(state["w"]))
    placed = jax.tree.map(lambda x: jax.device_put(x, jax.devices()[0]), state)
    assert all(x.committed for x in jax.tree.leaves(ck.restore(placed)))
    ck.close()
