"""Networks: per-agent local MLPs and the mixers that combine them.

Local networks see only their own agent's input (decentralised execution) and
are evaluated for all N agents in one batched call, in one of two modes:

- `shared=True`: one parameter set for every agent; a one-hot agent id is
  appended to each agent's input so the agents can still behave differently
  (the O-MAPL / PyMARL convention).
- `shared=False`: independent parameters stacked on a leading agent axis
  (every parameter leaf is `[N, ...]`), applied with `nn.vmap`.

Mixers map the global state to non-negative per-agent weights and a bias, so
that a team quantity is `x_tot(s) = Σ_i w_i(s)·x_i + b(s)` (see
`jaxil.nn.mixing.mix`). `QMixer` is the nonlinear QMIX mixer, kept only to
demonstrate in the tests why MisoDICE mixes linearly.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

Activation = Callable[[jax.Array], jax.Array]
Initializer = Callable[..., jax.Array]

# Hidden activations by name (configs store names, not functions).
ACTIVATIONS: dict[str, Activation] = {"relu": nn.relu, "tanh": nn.tanh}


def activation(name: str) -> Activation:
    """The hidden activation called `name` (`"relu"` or `"tanh"`)."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def orthogonal_init(out_scale: float) -> tuple[Initializer, Initializer]:
    """`(hidden, output)` kernel initialisers of the PPO convention
    (orthogonal, gain √2 on hidden layers and `out_scale` on the output
    layer: 0.01 for a policy head, 1.0 for a value head)."""
    return nn.initializers.orthogonal(math.sqrt(2.0)), nn.initializers.orthogonal(out_scale)


class MLP(nn.Module):
    """Plain MLP: `Dense(h_1) → act → … → Dense(h_k) → act → Dense(out_dim)`.

    Attributes:
      out_dim: output width.
      hidden: hidden layer widths.
      activation: hidden activation.
      kernel_init: hidden-layer kernel initialiser (None: flax's LeCun normal).
      out_kernel_init: output-layer kernel initialiser (None: LeCun normal).
    """

    out_dim: int
    hidden: Sequence[int] = (256, 256)
    activation: Activation = nn.relu
    kernel_init: Optional[Initializer] = None
    out_kernel_init: Optional[Initializer] = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """`x [..., in_dim] -> [..., out_dim]`."""
        hidden_init = _init_kw(self.kernel_init)
        for i, width in enumerate(self.hidden):
            x = self.activation(nn.Dense(width, name=f"hidden_{i}", **hidden_init)(x))
        return nn.Dense(self.out_dim, name="out", **_init_kw(self.out_kernel_init))(x)


def _init_kw(init: Optional[Initializer]) -> dict:
    return {} if init is None else {"kernel_init": init}


# Independent per-agent MLPs: parameters stacked on a leading agent axis, each
# agent initialised from its own rng, one vmapped call over the agent axis.
_AgentStackedMLP = nn.vmap(
    MLP,
    variable_axes={"params": 0},
    split_rngs={"params": True},
    in_axes=0,
    out_axes=0,
)


class LocalMLP(nn.Module):
    """Per-agent MLP evaluated for all agents at once.

    `__call__(x [..., N, in_dim]) -> [..., N, out_dim]`.

    Parameter layout:

    - `shared=True`: `params["mlp"]` is one [`MLP`][jaxil.nn.nets.MLP] whose input is
      `in_dim + N` wide (observation ⊕ one-hot agent id).
    - `shared=False`: `params["agents"]` is an [`MLP`][jaxil.nn.nets.MLP] whose every
      leaf has a leading agent axis of size N; slice `i` of it is agent
      `i`'s network (`MLP(out_dim, hidden).apply({"params": slice_i}, x_i)`
      reproduces the output of agent `i`).

    Attributes:
      out_dim: output width per agent.
      num_agents: N, checked against `x.shape[-2]`.
      hidden: hidden widths.
      shared: parameter sharing (one-hot id appended) vs independent stacked
        parameters.
      activation: hidden activation.
      kernel_init, out_kernel_init: kernel initialisers of the hidden and
        output layers (None: LeCun normal; see
        [`orthogonal_init`][jaxil.nn.nets.orthogonal_init]).
    """

    out_dim: int
    num_agents: int
    hidden: tuple[int, ...] = (256, 256)
    shared: bool = True
    activation: Activation = nn.relu
    kernel_init: Optional[Initializer] = None
    out_kernel_init: Optional[Initializer] = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """`x [..., N, in_dim] -> [..., N, out_dim]`."""
        x = jnp.asarray(x)
        if x.ndim < 2 or x.shape[-2] != self.num_agents:
            raise ValueError(
                f"LocalMLP expects inputs [..., N={self.num_agents}, in_dim] with the agent "
                f"axis second to last, got shape {x.shape}"
            )
        if self.shared:
            ids = jnp.broadcast_to(
                jnp.eye(self.num_agents, dtype=x.dtype), x.shape[:-1] + (self.num_agents,)
            )
            return MLP(self.out_dim, self.hidden, self.activation, self.kernel_init,
                       self.out_kernel_init, name="mlp")(jnp.concatenate([x, ids], axis=-1))
        # Agent axis to the front, one vmapped call over stacked parameters.
        x = jnp.moveaxis(x, -2, 0)
        y = _AgentStackedMLP(self.out_dim, self.hidden, self.activation, self.kernel_init,
                             self.out_kernel_init, name="agents")(x)
        return jnp.moveaxis(y, 0, -2)


class HyperMixer(nn.Module):
    """State-conditioned linear mixing weights (O-MAPL `MixNet` / QMIX style).

    `h = relu(Dense(hidden)(s))`, `w(s) = |Dense(N)(h)| ≥ 0`,
    `b(s) = Dense(1)(h)`, so `x_tot = Σ_i w_i(s) x_i + b(s)` is linear and
    monotone in the local values. As in the O-MAPL authors' `MixNet`
    (github.com/vietbt/OMAPL, `algos/utils.py`) weights and bias share the
    hidden layer; `separate_bias_trunk=True` gives the bias its own
    `Dense(hidden) → relu` trunk instead.

    Attributes:
      num_agents: N.
      hidden: width of the hidden layer (64 in O-MAPL).
      separate_bias_trunk: give the bias its own hidden layer.
    """

    num_agents: int
    hidden: int = 64
    separate_bias_trunk: bool = False

    @nn.compact
    def __call__(self, state: jax.Array) -> tuple[jax.Array, jax.Array]:
        """`state [..., S] -> (weights [..., N] >= 0, bias [...])`."""
        if state.ndim < 1:
            raise ValueError(f"HyperMixer expects a state [..., S], got a scalar of shape {state.shape}")
        h = nn.relu(nn.Dense(self.hidden, name="trunk")(state))
        weights = jnp.abs(nn.Dense(self.num_agents, name="weights")(h))
        if self.separate_bias_trunk:
            h = nn.relu(nn.Dense(self.hidden, name="bias_trunk")(state))
        bias = nn.Dense(1, name="bias")(h)[..., 0]
        return weights, bias


class QMixer(nn.Module):
    """Two-layer monotonic QMIX mixer (Rashid et al., 2018).

    `W1(s) = |Dense(N·E)(s)|` reshaped `[N, E]`, `b1(s) = Dense(E)(s)`,
    `h = elu(local · W1 + b1)`, `w2(s) = |Dense(E)(s)|`,
    `V(s) = Dense(1)(relu(Dense(E)(s)))`; `x_tot = h · w2 + V(s)`.

    Monotone in every local value, but *nonlinear* (the ELU layer), which
    breaks the convexity of the DICE ν-loss in the local values; jaxil uses it
    only in the tests that show this (MisoDICE mixes linearly).

    Attributes:
      num_agents: N.
      embed_dim: E, width of the mixing hidden layer.
    """

    num_agents: int
    embed_dim: int = 32

    @nn.compact
    def __call__(self, local: jax.Array, state: jax.Array) -> jax.Array:
        """`local [..., N], state [..., S] -> [...]`."""
        chex.assert_axis_dimension(local, -1, self.num_agents)
        chex.assert_equal_shape_prefix([local, state], local.ndim - 1)
        chex.assert_rank(state, local.ndim)
        n, e = self.num_agents, self.embed_dim
        w1 = jnp.abs(nn.Dense(n * e, name="hyper_w1")(state)).reshape(state.shape[:-1] + (n, e))
        b1 = nn.Dense(e, name="hyper_b1")(state)
        hidden = nn.elu(jnp.einsum("...n,...ne->...e", local, w1) + b1)
        w2 = jnp.abs(nn.Dense(e, name="hyper_w2")(state))
        v = nn.Dense(1, name="hyper_v_out")(nn.relu(nn.Dense(e, name="hyper_v")(state)))[..., 0]
        return jnp.sum(hidden * w2, axis=-1) + v
