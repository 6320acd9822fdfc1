"""Behaviour cloning: L = −E_D[Σ_i log π_i(a_i|o_i)], unavailable actions masked.

One learner covers the three baselines of the MisoDICE paper through the
traced mixture weight β: each batch sample comes from D_E with probability β
and from D_U otherwise (β = 1: BC(D_E); β = 0: BC(D_U); β = 0.5: mixture).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Optional

import jax
import jax.numpy as jnp
from flax import struct

from jaxil.envs.core import EnvSpec
from jaxil.data.sampling import sample_transitions
from jaxil.algorithms.offline.base import (
    POSITIVE,
    PROBABILITY,
    Learner,
    LearnerData,
    LearnerState,
    adam,
    apply_grads,
    expert_and_union,
    init_opt,
)
from jaxil.nn.policy import BOX_HEADS, DEFAULT_BOX, PolicyNet
from jaxil.losses import weighted_bc_loss


@struct.dataclass
class BCBatch:
    """What one BC update reads.

    `union`: the batch it trains on when `expert` is None (D_U, or the
    interactive student's demos ∪ buffer). With expert labels, `expert`
    (a D_E batch) and `coin` `[B]` uniform draws: sample i comes from D_E
    where `coin[i] < β`, else from `union`.
    """

    union: Any
    expert: Any = None
    coin: Optional[jax.Array] = None


@dataclasses.dataclass(frozen=True)
class BCConfig:
    hidden: tuple[int, ...] = (256, 256)
    shared: bool = True
    batch_size: int = 512
    max_grad_norm: float = 1.0
    box: str = DEFAULT_BOX["state"]  # the policy's head on box actions (jaxil.nn.policy)

    def __post_init__(self):
        _check_common(self)


@struct.dataclass
class BCHParams:
    beta: jax.Array  # probability that a sample comes from D_E
    lr: jax.Array

    RANGES: ClassVar[dict] = dict(beta=PROBABILITY._replace(why="the share of D_E samples"),
                                  lr=POSITIVE)


def _check_common(cfg) -> None:
    if not cfg.hidden or any(int(h) <= 0 for h in cfg.hidden):
        raise ValueError(f"hidden must be positive layer widths, got {cfg.hidden}")
    if cfg.batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {cfg.batch_size}")
    if cfg.max_grad_norm <= 0:
        raise ValueError(f"max_grad_norm must be positive, got {cfg.max_grad_norm}")
    if cfg.box not in BOX_HEADS:
        raise ValueError(f"box must be one of {BOX_HEADS}, got {cfg.box!r}")


def make_bc(spec: EnvSpec, config: BCConfig = BCConfig(), beta: float = 0.0,
            policy: Optional[PolicyNet] = None) -> Learner:
    """BC learner; `beta` is the default D_E fraction of its hparams.

    `policy`: the network to clone into, instead of the one `config` describes
    (`hidden`, `shared` and `box` are then the network's own; the batch size
    and gradient clip still come from `config`). The interactive student uses
    it to clone into the PPO actor's network. A network that normalises its
    observations (`obs_norm`) starts at the identity statistics: the caller
    sets them with
    [`PolicyNet.with_obs_stats`][jaxil.nn.policy.PolicyNet.with_obs_stats]
    on `state.params["policy"]`, and the updates leave them as they are."""
    if policy is not None and policy.spec != spec:
        raise ValueError(f"make_bc policy was built for {policy.spec.env_id}, not {spec.env_id}")
    pi = PolicyNet(spec, config.hidden, config.shared, box=config.box) if policy is None else policy
    tx = adam(config.max_grad_norm)

    def default_hparams():
        return BCHParams(beta=jnp.float32(beta), lr=jnp.float32(3e-4))

    def init(key, hparams=None):
        hparams = default_hparams() if hparams is None else hparams
        k_pi, k_state = jax.random.split(key)
        params = {"policy": pi.init(k_pi)}
        opt = {"policy": init_opt(tx, params["policy"], hparams.lr)}
        return LearnerState(params, opt, hparams, jnp.int32(0), k_state)

    def sample(key, data: LearnerData):
        k, kc = jax.random.split(key)
        if data.expert is None:
            return BCBatch(sample_transitions(k, data.union, config.batch_size))
        e, u = expert_and_union(k, data, config.batch_size)
        return BCBatch(u, e, jax.random.uniform(kc, (config.batch_size,)))

    def update(state: LearnerState, batch: BCBatch):
        if batch.expert is None:  # unlabelled data: plain BC on D_U
            b = batch.union
        else:
            e, u = batch.expert, batch.union
            take_e = batch.coin < state.hparams.beta
            b = jax.tree.map(
                lambda x, y: jnp.where(take_e.reshape((-1,) + (1,) * (x.ndim - 1)), x, y), e, u
            )

        def loss_fn(params):
            logp = pi.log_prob(params["policy"], b.obs, b.avail, b.actions)
            return weighted_bc_loss(logp, jnp.ones(logp.shape[0], logp.dtype))

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        params, opt = apply_grads(tx, state.params, grads, state.opt_state)
        new = state.replace(params=params, opt_state=opt, step=state.step + 1)
        return new, {"bc_loss": loss}

    act, policy = pi.learner_fns()

    return Learner("bc", config, init, sample, update, act, default_hparams, policy)
