"""MisoDICE and its variants, one learner with a `mixing` switch.

Objective (DemoDICE form): min KL(d_π ‖ d_E) + α·KL(d_π ‖ d_U). Per update,
with a D_E batch and an independent D_U batch:

1. discriminator: local logits ℓ_i(o_i, a_i), team logit
   ℓ_tot(s,a) = Σ_i w^c_i(s)·ℓ_i + b^c(s), logistic loss expert-vs-union
   (+ gradient penalty); reward R = sg(ℓ_tot) ≈ log d_E/d_U.
2. value: ν_tot(s) = Σ_i w^ν_i(s)·ν_i(o_i) + b^ν(s);
   e = R + γ(1−done)·ν_tot(s') − ν_tot(s);
   L_ν = (1−γ)·E[ν_tot(s0)] + (1+α)·log E_{D_U}[exp(e/(1+α))].
3. policy: ω = sg(exp(e/(1+α))) normalised over the batch;
   L_π = −E_{D_U}[ω·Σ_i log π_i(a_i|o_i)].

`mixing`:
- `"hyper"` — MisoDICE: both mixers are hypernetworks of the global state
  with non-negative weights (linear in the local values, so L_ν stays convex
  in them, and monotone, so local and global values agree).
- `"sum"` — MisoDICE-VDN: w = 1, b = 0.
- `"none"` — INDD: each agent runs DemoDICE on its own (o_i, a_i) with its
  own logit, ν_i and weights; the per-agent losses are summed. Its networks
  are independent per agent by default (`shared=None` resolves to False):
  "independent DemoDICE" learners, as the same authors' independent baseline
  of O-MAPL (IIPL, github.com/vietbt/OMAPL `algos/iipl.py`: one network and
  one optimiser per agent). `shared=True` gives one parameter set with an
  agent id instead. MisoDICE and VDN share parameters by default (O-MAPL's
  networks take obs ⊕ one-hot id).

Faithfulness switches (DemoDICE: Kim et al. 2022, github.com/geon-hyeong/
imitation-dice `demodice.py` and `lfd_mujoco.py`):
- `init_sampling="trajectory"` (default): the s0 of (1−γ)·E[ν(s0)] is drawn
  uniformly over trajectories, as DemoDICE does; `"transition"` reads the
  s0 of the sampled union transitions (which weights each trajectory's s0
  by its length).
- `reward="bounded"`: DemoDICE's reward, the logit of a clipped discriminator
  `log(σ(ℓ)+ε) − log(σ(−ℓ)(1−ε)+ε²)` ∈ [−6.9, 13.8]
  ([`jaxil.losses.bounded_reward`][jaxil.losses.discriminator.bounded_reward]);
  default `"logit"` (R = ℓ).
- `nu_grad_penalty=True`: DemoDICE's ν penalty, `nu_gp_coef` (1e-4) × mean
  ‖∇ν‖² on union states and expert–union interpolates of states and next states
  ([`jaxil.losses.nu_gradient_penalty`][jaxil.losses.dice.nu_gradient_penalty]);
  off by default.
- `policy_sampling="stratified"` (not in DemoDICE or the paper): the policy
  step's batch is the first B//2 of the D_E batch and then the first B − B//2
  of the D_U batch, and its weights are the self-normalised importance weights
  ρ·exp(e/(1+α)) with ρ = d_U/q for the mixture q = ½·D_E + ½·D_U
  ([`jaxil.data.sampling.stratified_log_ratio`][jaxil.data.sampling.stratified_log_ratio]).
  It estimates the same weighted-BC objective as the default `"union"` batch
  (D_U only), with far more expert samples per update when the experts are a
  small part of D_U and carry most of the weight. ν and the discriminator are
  unchanged.
The default against weight collapse is instead the slow ν learning rate
(`lr_critic` 3e-5, see `default_hparams`), kept on evidence
(experiments/misodice_stabilisers, SMAX 3m, heuristic expert, 3 seeds, 8000
updates): at ν's normal rate (3e-4) the bounded reward, the ν penalty or both
still collapse (normalised return 0.02-0.06 after 8000 updates against 0.44
with slow ν); both on top of slow ν end at 0.56 ± 0.15 against 0.44 ± 0.24,
within one standard deviation. No setting removes the slow decline after
~1000 updates.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Optional

import jax
import jax.numpy as jnp
from flax import struct

from jaxil.envs.core import EnvSpec
from jaxil.data.sampling import sample_initial_states, stratified_log_ratio
from jaxil.algorithms.offline.base import (
    DISCOUNT,
    NONNEGATIVE,
    POSITIVE,
    Learner,
    LearnerData,
    LearnerState,
    adam,
    apply_grads,
    expert_and_union,
    init_opt,
)
from jaxil.algorithms.offline.bc import _check_common
from jaxil.nn.policy import DEFAULT_BOX, PolicyNet, encode_actions
from jaxil.losses import (
    agent_gradient_penalty,
    agent_weighted_bc_loss,
    bounded_reward,
    dice_advantage,
    dice_nu_loss,
    dice_weights,
    discriminator_loss,
    gradient_penalty,
    nu_gradient_penalty,
    weighted_bc_loss,
)
from jaxil.nn.mixed_net import MixedNet

MIXING = ("hyper", "sum", "none")
INIT_SAMPLING = ("trajectory", "transition")
REWARDS = ("logit", "bounded")
POLICY_SAMPLING = ("union", "stratified")


@struct.dataclass
class DiceBatch:
    """What one DICE update reads.

    Attributes:
      expert: a D_E batch (the discriminator's positives; the first `B//2`
        of a stratified policy batch).
      union: an independent D_U batch (negatives, ν's and the policy's batch).
      init: initial states sampled by trajectory, or None with
        `init_sampling="transition"` (the union batch's own `init_*`
        fields are used).
      penalty_key: the key of the gradient penalties.
      log_ratio: with `policy_sampling="stratified"`, the `[B]` log
        importance ratios of the policy batch, else None.
    """

    expert: Any
    union: Any
    init: Any = None
    penalty_key: Optional[jax.Array] = None
    log_ratio: Optional[jax.Array] = None


@dataclasses.dataclass(frozen=True)
class DiceConfig:
    """Static structure of a DICE learner (see the module docstring).

    `shared=None` takes the variant's default: independent per-agent
    networks for INDD (`mixing="none"`), shared ones (with a one-hot agent
    id) for MisoDICE and VDN; the resolved bool is what the config holds.
    """

    mixing: str = "hyper"
    hidden: tuple[int, ...] = (256, 256)
    mixer_hidden: int = 64
    shared: Optional[bool] = None
    batch_size: int = 512
    max_grad_norm: float = 1.0
    grad_penalty: bool = True
    init_sampling: str = "trajectory"
    reward: str = "logit"
    nu_grad_penalty: bool = False
    box: str = DEFAULT_BOX["state"]  # the policy's head on box actions (jaxil.nn.policy)
    policy_sampling: str = "union"

    #: Fields left out of the run identity while they hold these values, so a
    #: run directory written by a jaxil without the field keeps its identity
    #: and resumes.
    IDENTITY_DEFAULTS: ClassVar[dict] = {"policy_sampling": "union"}

    def __post_init__(self):
        if self.mixing not in MIXING:
            raise ValueError(f"mixing must be one of {MIXING}, got {self.mixing!r}")
        if self.init_sampling not in INIT_SAMPLING:
            raise ValueError(f"init_sampling must be one of {INIT_SAMPLING}, got "
                             f"{self.init_sampling!r}")
        if self.reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {self.reward!r}")
        if self.policy_sampling not in POLICY_SAMPLING:
            raise ValueError(f"policy_sampling must be one of {POLICY_SAMPLING}, got "
                             f"{self.policy_sampling!r}")
        if self.policy_sampling == "stratified" and self.batch_size < 2:
            raise ValueError(f"policy_sampling='stratified' splits the batch in two halves; "
                             f"batch_size must be at least 2, got {self.batch_size}")
        if self.mixer_hidden <= 0:
            raise ValueError(f"mixer_hidden must be positive, got {self.mixer_hidden}")
        if self.shared is None:
            object.__setattr__(self, "shared", self.mixing != "none")
        _check_common(self)


@struct.dataclass
class DiceHParams:
    alpha: jax.Array  # weight of KL(d_π ‖ d_U); 0.05 in the MisoDICE paper
    gamma: jax.Array
    lr_actor: jax.Array
    lr_critic: jax.Array
    lr_disc: jax.Array
    gp_coef: jax.Array  # 0.1 in DemoDICE
    nu_gp_coef: jax.Array  # 1e-4 in DemoDICE; used with `nu_grad_penalty`

    RANGES: ClassVar[dict] = dict(
        alpha=NONNEGATIVE._replace(why="the weight of the KL to the union occupancy; the "
                                   "weights divide by 1 + alpha"),
        gamma=DISCOUNT, lr_actor=POSITIVE, lr_critic=POSITIVE, lr_disc=POSITIVE,
        gp_coef=NONNEGATIVE._replace(why="a gradient-penalty weight"),
        nu_gp_coef=NONNEGATIVE._replace(why="the weight of the gradient penalty on nu"))


def _Mixed(spec: EnvSpec, config: DiceConfig) -> MixedNet:
    """The discriminator / value network of `config`
    ([`jaxil.nn.mixed_net.MixedNet`][jaxil.nn.mixed_net.MixedNet])."""
    return MixedNet(spec.num_agents, config.mixing, config.hidden, config.mixer_hidden,
                    config.shared)


def make_dice(spec: EnvSpec, config: DiceConfig = DiceConfig(), alpha: float = 0.05) -> Learner:
    n = spec.num_agents
    pi = PolicyNet(spec, config.hidden, config.shared, box=config.box)
    disc = _Mixed(spec, config)
    nu = _Mixed(spec, config)
    tx = adam(config.max_grad_norm)
    per_agent = config.mixing == "none"
    name = {"hyper": "misodice", "sum": "misodice_vdn", "none": "indd"}[config.mixing]

    def default_hparams():
        return DiceHParams(
            alpha=jnp.float32(alpha),
            gamma=jnp.float32(0.99),
            lr_actor=jnp.float32(3e-4),
            # ν learns 10× slower than the rest. With 3e-4 on the SMAX 3m
            # teacher dataset (200 expert + 1000 ε-noised), the discriminator
            # separates expert from union almost perfectly (AUC 0.999) but ν's
            # errors, amplified by exp(e/(1+α)), collapse the weights onto a
            # few late poor transitions: the expert share of the policy weight
            # falls from 0.90 (500 updates) to 0.17 (2000; the expert fraction
            # is 0.145), effective sample size 0.2 %, return 0.43 ≈ BC(D_U).
            # With 3e-5: share 0.93, ESS 2.8 %, return 1.44 ± 0.09 (4 seeds).
            lr_critic=jnp.float32(3e-5),
            lr_disc=jnp.float32(3e-4),
            gp_coef=jnp.float32(0.1),
            nu_gp_coef=jnp.float32(1e-4),
        )

    def init(key, hparams=None):
        hparams = default_hparams() if hparams is None else hparams
        k_pi, k_d, k_nu, k_state = jax.random.split(key, 4)
        obs = jnp.zeros((1, n, spec.obs_dim), jnp.float32)
        act = encode_actions(spec, jnp.zeros((1, n) + spec.action.shape, _adtype(spec)))
        state = jnp.zeros((1, spec.state_dim), jnp.float32)
        params = {
            "policy": pi.init(k_pi),
            "disc": disc.init(k_d, jnp.concatenate([obs, act], -1), state),
            "nu": nu.init(k_nu, obs, state),
        }
        lrs = {"policy": hparams.lr_actor, "disc": hparams.lr_disc, "nu": hparams.lr_critic}
        opt = {k: init_opt(tx, params[k], lrs[k]) for k in params}
        return LearnerState(params, opt, hparams, jnp.int32(0), k_state)

    half = config.batch_size // 2  # D_E samples of a stratified policy batch

    def sample(key, data: LearnerData):
        """A [`DiceBatch`][jaxil.algorithms.offline.dice.DiceBatch] from `data`
        (labels required)."""
        k, kg = jax.random.split(key)
        log_ratio = None
        if config.policy_sampling == "stratified":
            e, u, idx = expert_and_union(k, data, config.batch_size, with_index=True)
            share = half / config.batch_size
            num_expert = jnp.sum(data.expert)
            is_expert = jnp.concatenate([jnp.ones((half,), bool),
                                         data.expert[idx[:config.batch_size - half]]])
            log_ratio = stratified_log_ratio(is_expert, share, num_expert,
                                             data.expert.shape[0])
        else:
            e, u = expert_and_union(k, data, config.batch_size)
        s0 = None
        if config.init_sampling == "trajectory":
            kg, k0 = jax.random.split(kg)
            s0 = sample_initial_states(k0, data.union, config.batch_size)
        return DiceBatch(expert=e, union=u, init=s0, penalty_key=kg, log_ratio=log_ratio)

    def disc_input(b):
        return jnp.concatenate([b.obs, encode_actions(spec, b.actions)], -1)

    def advantages(nu_params, b, reward, gamma):
        """The DICE advantages e of batch `b` (`[B]`, or `[B, N]` per agent)."""
        nu_s = nu(nu_params, b.obs, b.global_state)
        nu_next = nu(nu_params, b.next_obs, b.next_global_state)
        if per_agent:
            done = jnp.broadcast_to(b.done[:, None], reward.shape)
            return jax.vmap(dice_advantage, in_axes=(1, 1, 1, 1, None), out_axes=1)(
                reward, nu_s, nu_next, done, gamma)
        return dice_advantage(reward, nu_s, nu_next, b.done, gamma)

    def weights(adv, alpha, log_ratio=None):
        if per_agent:
            return jax.vmap(lambda a: dice_weights(a, alpha, log_ratio=log_ratio),
                            in_axes=1, out_axes=1)(adv)
        return dice_weights(adv, alpha, log_ratio=log_ratio)

    to_reward = bounded_reward if config.reward == "bounded" else (lambda logit: logit)

    def score_union(params, hp, u):
        """`(logit, reward, advantage)` of union batch `u`: the
        discriminator's logit, the (stop-gradient) reward it gives and the
        DICE advantage under ν."""
        logit = disc(params["disc"], disc_input(u), u.global_state)
        reward = jax.lax.stop_gradient(to_reward(logit))
        return logit, reward, advantages(params["nu"], u, reward, hp.gamma)

    def weigh(params, hp, u):
        """`(logit, weights)` of union batch `u` as the policy step of an
        unstratified update weighs it."""
        logit, _, adv = score_union(params, hp, u)
        return logit, weights(adv, hp.alpha)

    def loss_fn(params, hp: DiceHParams, batch):
        e, u, s0, gp_key, log_ratio = (batch.expert, batch.union, batch.init,
                                       batch.penalty_key, batch.log_ratio)
        if config.nu_grad_penalty:
            gp_key, nu_gp_key = jax.random.split(gp_key)
        # 1. discriminator
        x_e, x_u = disc_input(e), disc_input(u)
        l_e = disc(params["disc"], x_e, e.global_state)
        l_u, reward, adv = score_union(params, hp, u)
        if per_agent:
            d_loss = jnp.sum(jax.vmap(discriminator_loss, in_axes=(1, 1))(l_e, l_u))
        else:
            d_loss = discriminator_loss(l_e, l_u)
        gp = jnp.float32(0.0)
        if config.grad_penalty and per_agent:
            # INDD: each agent's discriminator is penalised on its own inputs,
            # every interpolate between two of that agent's samples.
            gp = agent_gradient_penalty(
                lambda x: disc.local_values(params["disc"], x), x_e, x_u, gp_key
            )
        elif config.grad_penalty:

            def logit_fn(inp):
                x, s = inp
                return disc(params["disc"], x, s)

            gp = gradient_penalty(logit_fn, (x_e, e.global_state), (x_u, u.global_state), gp_key)
        # 2. value
        init = u if s0 is None else s0
        nu_0 = nu(params["nu"], init.init_obs, init.init_global_state)
        if per_agent:
            nu_loss = jnp.sum(
                jax.vmap(dice_nu_loss, in_axes=(1, 1, None, None))(nu_0, adv, hp.alpha, hp.gamma)
            )
        else:
            nu_loss = dice_nu_loss(nu_0, adv, hp.alpha, hp.gamma)
        if log_ratio is None:
            p_batch, w = u, weights(adv, hp.alpha)
        else:
            # Stratified policy batch: B//2 D_E samples, the rest from D_U,
            # importance-weighted back to D_U (the weights stop gradients, so
            # ν learns from the D_U batch alone, as without stratification).
            rest = config.batch_size - half
            e_h = jax.tree.map(lambda x: x[:half], e)
            reward_e = jax.lax.stop_gradient(to_reward(l_e[:half]))
            adv_e = advantages(params["nu"], e_h, reward_e, hp.gamma)
            p_batch = jax.tree.map(lambda a, b: jnp.concatenate([a, b[:rest]]), e_h, u)
            w = weights(jnp.concatenate([adv_e, adv[:rest]]), hp.alpha, log_ratio)
        nu_gp = jnp.float32(0.0)
        if config.nu_grad_penalty:
            if per_agent:
                nu_gp = nu_gradient_penalty(
                    lambda x: nu.local_values(params["nu"], x),
                    u.obs, e.obs, u.next_obs, e.next_obs, nu_gp_key, agent_axis=True)
            else:
                nu_gp = nu_gradient_penalty(
                    lambda x: nu(params["nu"], *x),
                    (u.obs, u.global_state), (e.obs, e.global_state),
                    (u.next_obs, u.next_global_state), (e.next_obs, e.next_global_state),
                    nu_gp_key)
        # 3. policy: weighted BC with the (stop-gradient) DICE weights
        logp = pi.log_prob(params["policy"], p_batch.obs, p_batch.avail, p_batch.actions)
        pi_loss = agent_weighted_bc_loss(logp, w) if per_agent else weighted_bc_loss(logp, w)
        total = d_loss + hp.gp_coef * gp + nu_loss + hp.nu_gp_coef * nu_gp + pi_loss
        metrics = {
            "disc_loss": d_loss,
            "grad_penalty": gp,
            "nu_loss": nu_loss,
            "policy_loss": pi_loss,
            "reward_expert": jnp.mean(to_reward(l_e)),
            "reward_union": jnp.mean(reward),
            "weight_max": jnp.max(w),
            # (Σω)²/(B·Σω²): 1 for uniform weights, 1/B when one sample has them all
            "weight_ess": jnp.mean(jnp.sum(w, 0) ** 2 / (w.shape[0] * jnp.sum(w * w, 0))),
        }
        if log_ratio is not None:  # the share of the policy weight on the D_E half
            metrics["weight_expert_half"] = jnp.mean(jnp.sum(w[:half], 0) / jnp.sum(w, 0))
        if config.nu_grad_penalty:
            metrics["nu_grad_penalty"] = nu_gp
        return total, metrics

    def update(state: LearnerState, batch):
        grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params, state.hparams, batch)
        params, opt = apply_grads(tx, state.params, grads, state.opt_state)
        return state.replace(params=params, opt_state=opt, step=state.step + 1), metrics

    act, policy = pi.learner_fns()

    return Learner(name, config, init, sample, update, act, default_hparams, policy, weigh)


def _adtype(spec: EnvSpec):
    return jnp.int32 if spec.discrete else jnp.float32
