"""Expert-vs-union discriminator: logistic loss and gradient penalty.

The discriminator logit ℓ(s, a) is trained with label 1 on expert samples and
label 0 on union (expert + unlabelled) samples; at the optimum
`ℓ = log d_E(s,a) / d_U(s,a)`, which DemoDICE / MisoDICE use as the reward
(Kim et al., ICLR 2022; Bui et al., NeurIPS 2025).
"""

from __future__ import annotations

from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np

# Constants of the DemoDICE authors' penalty (geon-hyeong/imitation-dice,
# demodice.py): float32 machine epsilon added to the gradient, and the
# smoothing constant inside their cost transform.
_GP_GRAD_EPS = float(np.finfo(np.float32).eps)
_GP_COST_EPS = 1e-3


def discriminator_loss(expert_logits: jax.Array, union_logits: jax.Array) -> jax.Array:
    """Logistic (minimax GAN) discriminator loss, expert = 1, union = 0.

        L = E_{D_E}[softplus(−ℓ)] + E_{D_U}[softplus(ℓ)]
          = −E_{D_E}[log σ(ℓ)] − E_{D_U}[log(1 − σ(ℓ))]

    (DemoDICE's `minimax_discriminator_loss(expert, union)`; each term is a
    mean over its own batch, so the two batches may differ in size.)

    Args:
      expert_logits: `[B]` logits on expert samples.
      union_logits: `[B2]` logits on union samples.

    Returns:
      Scalar loss.
    """
    expert_logits, union_logits = jnp.asarray(expert_logits), jnp.asarray(union_logits)
    chex.assert_rank([expert_logits, union_logits], 1)
    chex.assert_type([expert_logits, union_logits], float)
    return jnp.mean(jax.nn.softplus(-expert_logits)) + jnp.mean(jax.nn.softplus(union_logits))


def _demodice_cost(logits: jax.Array, eps: float) -> jax.Array:
    """DemoDICE's cost `log(1/(σ(ℓ) + ε) − 1 + ε)`; equals −ℓ when ε = 0.

    Evaluated as `log(σ(−ℓ)(1−ε) + ε²) − log(σ(ℓ) + ε)` (the same number:
    `1/(σ+ε) − 1 + ε = ((1−σ)(1−ε) + ε²)/(σ+ε)`), which avoids the
    cancellation of `1/(σ+ε) − 1` when σ → 1."""
    if isinstance(eps, (int, float)) and eps == 0.0:  # exact, and stable for any ℓ
        return -logits
    return (jnp.log(jax.nn.sigmoid(-logits) * (1.0 - eps) + eps * eps)
            - jnp.log(jax.nn.sigmoid(logits) + eps))


def bounded_reward(logits: jax.Array, eps: float = _GP_COST_EPS) -> jax.Array:
    """DemoDICE's reward: minus its cost, the logit of a clipped discriminator.

        R(ℓ) = −log(1/(σ(ℓ) + ε) − 1 + ε)
             = log(σ(ℓ) + ε) − log(σ(−ℓ)(1−ε) + ε²)

    (geon-hyeong/imitation-dice, `demodice.py`: `union_cost` enters the
    advantage as `−union_cost`; ε = `EPS2` = 1e-3.) R ≈ ℓ while
    |ℓ| ≪ log(1/ε), and R is bounded:
    `−log(1/ε − 1 + ε) ≤ R ≤ log((1+ε)/ε²)`, i.e. [−6.91, 13.82] for
    ε = 1e-3, where the raw logit ℓ is not (a discriminator that separates
    expert from union data almost perfectly drives ℓ, and through
    `exp(e/(1+α))` the DICE weights, without bound). `eps = 0` gives ℓ.

    Args:
      logits: discriminator logits, any shape (float).
      eps: ε > 0 (a Python float), or 0 for the raw logit.

    Returns:
      Rewards, the shape of `logits`.
    """
    logits = jnp.asarray(logits)
    chex.assert_type(logits, float)
    return -_demodice_cost(logits, eps)


def _batch_size(tree: Any, name: str) -> int:
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        raise ValueError(f"gradient_penalty: `{name}` has no arrays")
    sizes = {leaf.shape[0] if leaf.ndim else None for leaf in leaves}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(
            f"gradient_penalty: every array of `{name}` needs the same leading batch axis, "
            f"got shapes {[leaf.shape for leaf in leaves]}"
        )
    return sizes.pop()


def _interpolate(u: jax.Array, x: Any, y: Any) -> Any:
    """`u·x + (1−u)·y` leaf-wise, one `u` per sample shared by all leaves."""

    def lerp(a, b):
        uu = u.reshape(u.shape + (1,) * (a.ndim - 1)).astype(a.dtype)
        return uu * a + (1.0 - uu) * b

    return jax.tree_util.tree_map(lerp, x, y)


def _interpolation_draws(key: jax.Array, b: int, b2: int):
    """Random draws of `gradient_penalty`: `(u [b], partner_idx [b] | None,
    shuffle_idx [b])`.

    `u ~ U(0,1)` per expert sample; `partner_idx` picks the union partner
    of each expert sample (`None`: sample b pairs with union sample b, when
    `b == b2`); `shuffle_idx` is the shuffled union copy for the
    union–union interpolates (a permutation when `b ≤ b2`).
    """
    k_u, k_pair, k_perm = jax.random.split(key, 3)
    u = jax.random.uniform(k_u, (b,))
    partner_idx = None if b == b2 else jax.random.randint(k_pair, (b,), 0, b2)
    if b <= b2:
        shuffle_idx = jax.random.permutation(k_perm, b2)[:b]
    else:
        shuffle_idx = jax.random.randint(k_perm, (b,), 0, b2)
    return u, partner_idx, shuffle_idx


def gradient_penalty(
    logit_fn: Callable[[Any], jax.Array],
    expert_inputs: Any,
    union_inputs: Any,
    key: jax.Array,
    target_norm: float = 1.0,
    cost_eps: float = _GP_COST_EPS,
    union_union: bool = True,
) -> jax.Array:
    """DemoDICE's gradient penalty on the discriminator.

    The form of the DemoDICE authors' code (geon-hyeong/imitation-dice,
    `demodice.py`, cost network update; coefficient 0.1 there, applied by the
    caller):

    1. `u_b ~ U(0, 1)` per sample; interpolates
       `x̃ = u·x_E + (1−u)·x_U` (expert–union) and, with `union_union`,
       `x̃' = u·perm(x_U) + (1−u)·x_U` (union–union, a shuffled copy of the
       union batch); both sets are penalised together.
    2. The gradient is taken of their cost
       `c(ℓ) = log(1/(σ(ℓ)+ε) − 1 + ε)` (≈ −ℓ; `cost_eps` = ε = 1e-3, and
       `cost_eps=0` gives exactly the logit's gradient), not of ℓ itself.
    3. `g = ∇_x c(x̃) + ε_32` (float32 machine epsilon, which keeps the norm
       differentiable at 0), the norm taken over all input features of a
       sample jointly, and

           GP = mean_b (‖g_b‖₂ − 1)²      (two-sided, target norm 1).

    Inputs may be a pytree (e.g. `(obs, actions_onehot, state)`): every leaf
    is `[B, ...]`, a sample uses the same `u` in all leaves and its norm
    runs over all leaves. `logit_fn` must act per sample (no batch
    statistics) and return `[M]` logits for `M` stacked samples, since the
    per-sample gradients are read off the gradient of the summed cost.
    Differentiable in the parameters `logit_fn` closes over.

    When the batch sizes differ (`B` expert, `B2` union), each expert
    sample is paired with a uniformly drawn union sample; with equal sizes
    sample `b` is paired with union sample `b` as in the authors' code.

    Args:
      logit_fn: maps a pytree of `[M, ...]` inputs to `[M]` logits.
      expert_inputs: pytree of `[B, ...]` expert inputs.
      union_inputs: pytree of `[B2, ...]` union inputs, same structure and
        per-sample shapes.
      key: PRNG key for the interpolation coefficients and shuffles.
      target_norm: the norm the penalty pulls towards (1 in DemoDICE).
      cost_eps: ε of the cost transform (see 2.); a Python float (`0.0`
        switches to the exact `−ℓ`).
      union_union: include the union–union interpolates.

    Returns:
      Scalar penalty (multiply by the coefficient yourself, e.g. 0.1).
    """
    expert_inputs = jax.tree_util.tree_map(jnp.asarray, expert_inputs)
    union_inputs = jax.tree_util.tree_map(jnp.asarray, union_inputs)
    b = _batch_size(expert_inputs, "expert_inputs")
    b2 = _batch_size(union_inputs, "union_inputs")
    e_struct = jax.tree_util.tree_structure(expert_inputs)
    u_struct = jax.tree_util.tree_structure(union_inputs)
    if e_struct != u_struct:
        raise ValueError(
            f"gradient_penalty: expert and union inputs differ in structure: {e_struct} vs {u_struct}"
        )
    for e_leaf, u_leaf in zip(jax.tree_util.tree_leaves(expert_inputs), jax.tree_util.tree_leaves(union_inputs)):
        if e_leaf.shape[1:] != u_leaf.shape[1:]:
            raise ValueError(
                "gradient_penalty: expert and union inputs differ in per-sample shape: "
                f"{e_leaf.shape} vs {u_leaf.shape}"
            )
        chex.assert_type([e_leaf, u_leaf], float)

    u, partner_idx, shuffle_idx = _interpolation_draws(key, b, b2)
    take = lambda idx: jax.tree_util.tree_map(lambda x: x[idx], union_inputs)  # noqa: E731
    union_partner = union_inputs if partner_idx is None else take(partner_idx)
    mixed = _interpolate(u, expert_inputs, union_partner)
    if union_union:
        mixed_uu = _interpolate(u, take(shuffle_idx), union_partner)
        mixed = jax.tree_util.tree_map(lambda x, y: jnp.concatenate([x, y], axis=0), mixed, mixed_uu)

    def total_cost(inputs):
        logits = logit_fn(inputs)
        chex.assert_rank(logits, 1)
        return jnp.sum(_demodice_cost(logits, cost_eps))

    grads = jax.grad(total_cost)(mixed)
    sq_norm = sum(
        jnp.sum(jnp.reshape(g + _GP_GRAD_EPS, (g.shape[0], -1)) ** 2, axis=-1)
        for g in jax.tree_util.tree_leaves(grads)
    )
    return jnp.mean((jnp.sqrt(sq_norm) - target_norm) ** 2)


def agent_interpolation_draws(key: jax.Array, b: int, b2: int, num_agents: int):
    """The draws of
    [`agent_gradient_penalty`][jaxil.losses.discriminator.agent_gradient_penalty]:
    `_interpolation_draws` once per agent (`jax.random.split(key,
    num_agents)`), stacked on a leading agent axis:
    `(u [N, b], partner_idx [N, b] | None, shuffle_idx [N, b])`."""
    keys = jax.random.split(key, num_agents)
    return jax.vmap(lambda k: _interpolation_draws(k, b, b2))(keys)


def agent_gradient_penalty(
    logit_fn: Callable[[jax.Array], jax.Array],
    expert_inputs: jax.Array,
    union_inputs: jax.Array,
    key: jax.Array,
    target_norm: float = 1.0,
    cost_eps: float = _GP_COST_EPS,
    union_union: bool = True,
) -> jax.Array:
    """[`gradient_penalty`][jaxil.losses.discriminator.gradient_penalty] for N
    independent per-agent discriminators (INDD), every interpolate built within
    one agent.

    Agent i's logit ℓ_i(x_i) sees its own input only, so agent i runs the
    DemoDICE penalty on its own samples: `u ~ U(0,1)`, partners and the union
    shuffle are drawn per agent
    ([`agent_interpolation_draws`][jaxil.losses.discriminator.agent_interpolation_draws]),
    `x̃_i = u·x_E,i + (1−u)·x_U,i` and `x̃'_i = u·perm_i(x_U,i) +
    (1−u)·x_U,i` — never a point between agent i's input and agent j's. Per
    agent, `GP_i = mean_b (‖∇_{x_i} c(ℓ_i(x̃_i)) + ε_32‖₂ − 1)²`, and

        GP = Σ_i GP_i

    (the per-agent DemoDICE losses are summed, so are their penalties).

    Args:
      logit_fn: `[M, N, D] -> [M, N]` logits, where `[m, i]` depends on
        `x[m, i]` alone (per-agent networks; shared parameters with an agent
        id qualify) and on no batch statistics.
      expert_inputs: `[B, N, D]` expert inputs.
      union_inputs: `[B2, N, D]` union inputs.
      key: PRNG key.
      target_norm, cost_eps, union_union: as in
        [`gradient_penalty`][jaxil.losses.discriminator.gradient_penalty].

    Returns:
      Scalar penalty, summed over agents (multiply by the coefficient yourself).
    """
    expert_inputs, union_inputs = jnp.asarray(expert_inputs), jnp.asarray(union_inputs)
    chex.assert_rank([expert_inputs, union_inputs], 3)
    chex.assert_type([expert_inputs, union_inputs], float)
    if expert_inputs.shape[1:] != union_inputs.shape[1:]:
        raise ValueError(
            "agent_gradient_penalty: expert and union inputs differ in [N, D]: "
            f"{expert_inputs.shape} vs {union_inputs.shape}"
        )
    b, n = expert_inputs.shape[:2]
    b2 = union_inputs.shape[0]
    u, partner_idx, shuffle_idx = agent_interpolation_draws(key, b, b2, n)
    take = lambda idx: jnp.take_along_axis(union_inputs, idx.T[..., None], axis=0)  # noqa: E731
    partner = union_inputs if partner_idx is None else take(partner_idx)  # [B, N, D]
    uu = u.T[..., None].astype(expert_inputs.dtype)  # [B, N, 1]
    mixed = uu * expert_inputs + (1.0 - uu) * partner
    if union_union:
        mixed = jnp.concatenate([mixed, uu * take(shuffle_idx) + (1.0 - uu) * partner], axis=0)

    def total_cost(x):
        logits = logit_fn(x)
        chex.assert_shape(logits, x.shape[:2])
        return jnp.sum(_demodice_cost(logits, cost_eps))

    g = jax.grad(total_cost)(mixed) + _GP_GRAD_EPS  # [M, N, D]
    norm = jnp.sqrt(jnp.sum(g ** 2, axis=-1))  # [M, N]
    return jnp.sum(jnp.mean((norm - target_norm) ** 2, axis=0))
