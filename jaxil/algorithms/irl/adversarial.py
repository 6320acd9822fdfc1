"""PPO against a learned reward, and multi-agent GAIL and AIRL, on the teacher trainer.

One trainer: every method here is the PPO program of
[`jaxil.algorithms.rl.ppo.make_ppo`][jaxil.algorithms.rl.ppo.make_ppo] with a
[`jaxil.algorithms.rl.ppo.RewardHook`][jaxil.algorithms.rl.ppo.RewardHook]
(`make_hook`), so that one compiled program per chunk runs, for every seed at
once (`vmap`), `updates_per_chunk` iterations of:

```text
roll out the policy (num_envs × num_steps)
  → discriminator steps: demonstrations vs this rollout  (GAIL, AIRL; disc_steps of them)
  → score the rollout with the learned reward            (minus β·KL to π_SFT, optionally)
  → GAE and the PPO epochs
```

Methods (`METHODS`):

- `"ppo"`: a fixed reward model (e.g. one of
  [`jaxil.algorithms.irl.reward_model`][jaxil.algorithms.irl.reward_model])
  r(s, a) = its logit (AfD's reward); nothing is learned but the policy.
- `"gail"`: the discriminator is the reward model's network
  ([`jaxil.algorithms.irl.reward_model.RewardModel`][jaxil.algorithms.irl.reward_model.RewardModel]:
  local logits ℓ_i(o_i, a_i) mixed by the hypernetwork of the global state into
  a team logit, or one logit per agent with `mixing="none"`), trained with the
  logistic loss (demonstrations = 1, policy = 0; optional gradient penalty) by
  that model's own update. The policy's reward is
  [`jaxil.losses.adversarial.gail_reward`][jaxil.losses.adversarial.gail_reward]
  of the logit (`reward_form`; default `"softplus"` = −log(1 − D)).
- `"airl"`: ℓ = f − log π with f = g(s, a) + γ(1 − last)·h(s') − h(s)
  ([`jaxil.losses.adversarial.airl_logits`][jaxil.losses.adversarial.airl_logits]):
  g is the reward model's mixed logit, h a potential of the same form on
  observations (local h_i(o_i) mixed by a hypernetwork of s, or per agent); log
  π is the joint Σ_i log π_i under the current policy (per agent: each agent's
  own). The policy's reward is log D − log(1 − D) = f − log π.

Options (the literature's stabilisers): `gp_coef` (gradient penalty on the
discriminator, DemoDICE's two-sided form), PPO's `ent_coef` (entropy bonus),
`disc_steps` (discriminator updates per PPO iteration), `kl_coef` (KL
penalty towards π_SFT), and `sft_updates` (the policy starts as π_SFT, BC on
the demonstrations, and π_SFT is the KL reference).

[`train_adversarial`][jaxil.algorithms.irl.adversarial.train_adversarial] hands
the chunks to the run engine ([`jaxil.runs.engine`][jaxil.runs.engine]), which
shows a progress bar, writes a run directory
([`jaxil.runs.rundir`][jaxil.runs.rundir]: `run.json`, `metrics.jsonl` with one
row per evaluation and seed, orbax checkpoints of the whole stacked state,
`results.json`), stops on a non-finite loss
([`jaxil.runs.guard`][jaxil.runs.guard]) and resumes bit-for-bit
(`resume=True`). Row 0 (chunk 0) evaluates the initial policy: π_SFT, i.e. BC
on the same demonstrations.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from pathlib import Path
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxil import envs
from jaxil.envs.core import EnvSpec, MultiAgentEnv
from jaxil.runs import guard
from jaxil.data.sampling import sample_where
from jaxil.algorithms.irl.reward_model import RewardModel, RewardModelConfig, RewardModelState, StepBatch
from jaxil.algorithms.offline.base import init_opt
from jaxil.losses import discriminator_loss, gradient_penalty, agent_gradient_penalty
from jaxil.losses import weighted_bc_loss
from jaxil.losses.adversarial import (
    GAIL_REWARDS,
    agent_discriminator_loss,
    airl_logits,
    discriminator_accuracy,
    gail_reward,
)
from jaxil.nn.mixed_net import MIXING, MixedNet
from jaxil.algorithms.rl.config import PPOConfig
from jaxil.algorithms.rl.ppo import PPO, RewardBatch, RewardHook, make_ppo
from jaxil.runs import engine
from jaxil.runs.engine import open_run
from jaxil.runs.loggers import LoggerFactory
from jaxil.runs.rundir import check_run_dir
from jaxil.runs.summary import returns_summary
from jaxil.runs.checkpoint import params_digest
from jaxil.algorithms.rl.ppo import make_actor

METHODS = ("ppo", "gail", "airl")
# Guarded per-update metrics of the discriminator (with the parameters).
DISC_GUARDED = ("disc_loss",)


@dataclasses.dataclass(frozen=True)
class AdversarialConfig:
    """The static structure and numbers of an adversarial (or learned-reward) run.

    Attributes:
      method: `"gail"`, `"airl"` or `"ppo"` (a fixed learned reward).
      mixing: `"hyper"` (team discriminator, local logits + hypernetwork
        mixer), `"sum"` or `"none"` (one discriminator per agent, per-agent
        rewards).
      hidden, mixer_hidden: discriminator (and AIRL potential) widths.
      disc_steps: discriminator updates per PPO iteration (the update ratio).
      disc_batch: samples per source in each discriminator update.
      disc_lr: discriminator learning rate.
      gp_coef: gradient-penalty weight (0: none).
      reward_form: GAIL's reward of the logit (`softplus`: −log(1 − D),
        `logit`: log D − log(1 − D), `log_d`: log D); `"ppo"` uses it on
        the fixed model's logit (default there: the logit itself).
      kl_coef: β of the KL penalty towards π_SFT (0: none; needs sft_updates).
      sft_updates: BC updates on the demonstrations before PPO (0: start from
        the PPO initialisation).
      sft_lr, sft_batch: the BC step's Adam learning rate and batch.
      eval_episodes: episodes per evaluation (the same start states for
        every evaluation and seed).
      deterministic_eval: evaluate the greedy policy instead of sampling.
    """

    method: str = "gail"
    mixing: str = "hyper"
    hidden: tuple[int, ...] = (64, 64)
    mixer_hidden: int = 32
    disc_steps: int = 1
    disc_batch: int = 256
    disc_lr: float = 3e-4
    gp_coef: float = 0.0
    reward_form: Optional[str] = None
    kl_coef: float = 0.0
    sft_updates: int = 500
    sft_lr: float = 1e-3
    sft_batch: int = 256
    eval_episodes: int = 64
    deterministic_eval: bool = False

    def __post_init__(self):
        def fail(name, msg):
            raise ValueError(f"AdversarialConfig.{name}={getattr(self, name)!r}: {msg}")

        if self.method not in METHODS:
            fail("method", f"must be one of {METHODS}")
        if self.mixing not in MIXING:
            fail("mixing", f"must be one of {MIXING}")
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        if not self.hidden or min(self.hidden) < 1:
            fail("hidden", "must be positive layer widths")
        for name in ("mixer_hidden", "disc_steps", "disc_batch", "sft_batch", "eval_episodes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                fail(name, "must be an integer >= 1")
        if isinstance(self.sft_updates, bool) or not isinstance(self.sft_updates, int) \
                or self.sft_updates < 0:
            fail("sft_updates", "must be an integer >= 0")
        for name in ("disc_lr", "sft_lr"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                fail(name, "must be a finite number > 0")
        for name in ("gp_coef", "kl_coef"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                fail(name, "must be a finite number >= 0")
        if self.reward_form is None:
            object.__setattr__(self, "reward_form",
                               "softplus" if self.method == "gail" else "logit")
        if self.reward_form not in GAIL_REWARDS:
            fail("reward_form", f"must be one of {GAIL_REWARDS}")
        if self.method == "airl" and self.reward_form != "logit":
            fail("reward_form", "AIRL's reward is its logit f − log π; use 'logit'")
        if self.kl_coef > 0 and self.sft_updates == 0:
            fail("kl_coef", "needs a reference policy π_SFT: set sft_updates > 0")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["hidden"] = list(self.hidden)
        return d


# --------------------------------------------------------------------------
# Demonstrations
# --------------------------------------------------------------------------
@struct.dataclass
class Demos:
    """Demonstration steps on device, with a `[K]` sampling weight (0 on
    padding, so that demonstration sets of different sizes — one per seed —
    stack on a leading axis). `last`: the step ended its trajectory (done or
    truncated: as in the PPO rollouts, where the next observation after an
    episode's end belongs to the next episode)."""

    obs: jax.Array  # [K, N, O]
    global_state: jax.Array  # [K, S]
    avail: jax.Array  # [K, N, A]
    actions: jax.Array  # [K, N] int32 or [K, N, d]
    next_obs: jax.Array  # [K, N, O]
    next_global_state: jax.Array  # [K, S]
    last: jax.Array  # [K] bool
    reward: jax.Array  # [K] the environment's team reward
    weight: jax.Array  # [K] float32


def demos_from_dataset(dataset: Any, trajectories: Optional[Sequence[int]] = None,
                       size: Optional[int] = None, subsample: int = 1,
                       subsample_seed: int = 0) -> Demos:
    """The steps of `dataset`'s trajectories (all, or the indices
    `trajectories`) as [`Demos`][jaxil.algorithms.irl.adversarial.Demos],
    padded to `size` steps (weight 0).

    `subsample=k` keeps every k-th step of each trajectory from a random
    start offset in `[0, k)` (drawn per selected trajectory with
    `numpy.random.default_rng(subsample_seed)`), as GAIL's original MuJoCo
    pipeline did with `data_subsamp_freq: 20`: few, decorrelated
    state–action pairs, so that behaviour cloning cannot simply copy whole
    trajectories."""
    if isinstance(subsample, bool) or not isinstance(subsample, (int, np.integer)) or subsample < 1:
        raise ValueError(f"demonstrations: subsample must be an integer >= 1, got {subsample!r}")
    mask = np.asarray(dataset.mask, bool)
    length = np.asarray(dataset.length)
    idx = np.arange(len(length)) if trajectories is None else np.asarray(trajectories)
    if idx.size == 0:
        raise ValueError("demonstrations: no trajectory selected")
    sel = mask[idx]
    if subsample > 1:
        offset = np.random.default_rng(subsample_seed).integers(0, subsample, idx.size)
        t = np.arange(sel.shape[1])[None]
        sel = sel & (t >= offset[:, None]) & ((t - offset[:, None]) % subsample == 0)
        if not sel.any():
            raise ValueError(f"demonstrations: subsample={subsample} keeps no step of trajectories "
                             "this short; subsample less")
    traj, step = np.nonzero(sel)
    traj = idx[traj]
    obs, gs = np.asarray(dataset.obs), np.asarray(dataset.global_state)
    out = dict(
        obs=obs[traj, step], global_state=gs[traj, step],
        avail=np.asarray(dataset.avail_actions)[traj, step],
        actions=np.asarray(dataset.actions)[traj, step],
        next_obs=obs[traj, step + 1], next_global_state=gs[traj, step + 1],
        last=(step + 1 == length[traj]),
        reward=np.asarray(dataset.reward, np.float32)[traj, step],
    )
    k = traj.shape[0]
    size = k if size is None else int(size)
    if size < k:
        raise ValueError(f"demonstrations: {k} steps do not fit in size={size}")
    pad = np.concatenate([np.arange(k), np.zeros(size - k, np.int64)])
    out = {name: v[pad] for name, v in out.items()}
    out["weight"] = (np.arange(size) < k).astype(np.float32)
    return Demos(**{k_: jnp.asarray(v) for k_, v in out.items()})


def stack_demos(demos: Sequence[Demos]) -> Demos:
    """One [`Demos`][jaxil.algorithms.irl.adversarial.Demos] per run stacked on
    a leading runs axis (padded to the longest with weight-0 steps)."""
    size = max(int(d.weight.shape[0]) for d in demos)

    def pad(d: Demos) -> Demos:
        k = int(d.weight.shape[0])
        idx = np.concatenate([np.arange(k), np.zeros(size - k, np.int64)])
        padded = jax.tree.map(lambda x: np.asarray(x)[idx], d)
        return padded.replace(weight=np.where(np.arange(size) < k, padded.weight, 0.0)
                              .astype(np.float32))

    return jax.tree.map(lambda *xs: jnp.stack(xs), *[pad(d) for d in demos])


def demos_digest(demos: Demos) -> str:
    """SHA-256 (12 hex digits) of the demonstration arrays: part of a run's identity."""
    h = hashlib.sha256()
    for x in jax.tree.leaves(demos):
        a = np.ascontiguousarray(np.asarray(x))
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.reshape(-1).view(np.uint8))
    return h.hexdigest()[:12]


# --------------------------------------------------------------------------
# The reward hook
# --------------------------------------------------------------------------
@struct.dataclass
class AdversarialState:
    """`RunnerState.reward` of these methods: the discriminator (GAIL: the
    reward model's state; AIRL: params `{"g", "h"}` in the same state type;
    `"ppo"`: the fixed model, never updated), the run's demonstrations, and
    π_SFT's parameters when there is a KL penalty (else None)."""

    disc: RewardModelState
    demos: Optional[Demos]
    ref: Any = None


def reward_model_config(config: AdversarialConfig) -> RewardModelConfig:
    return RewardModelConfig(mixing=config.mixing, hidden=config.hidden,
                             mixer_hidden=config.mixer_hidden, batch_size=config.disc_batch,
                             grad_penalty=config.gp_coef > 0)


class Adversarial:
    """The networks and pure functions of one (spec, PPO config, config)."""

    def __init__(self, spec: EnvSpec, actor: Any, ppo_config: PPOConfig,
                 config: AdversarialConfig):
        self.spec, self.actor, self.ppo_config, self.config = spec, actor, ppo_config, config
        self.rm = RewardModel(spec, reward_model_config(config))
        self.per_agent = config.mixing == "none"
        self.potential = MixedNet(spec.num_agents, config.mixing, config.hidden,
                                  config.mixer_hidden, self.rm.config.shared)
        self.gamma = ppo_config.gamma

    # -- state ---------------------------------------------------------------------
    def init_disc(self, key: jax.Array, reward_params: Any = None) -> RewardModelState:
        hp = self.rm.default_hparams(lr=self.config.disc_lr, gp_coef=self.config.gp_coef)
        if self.config.method == "ppo":
            if reward_params is None:
                raise ValueError("method 'ppo' needs the learned reward's parameters")
            k_state = key
            return RewardModelState(reward_params, None, hp, jnp.int32(0), k_state)
        if self.config.method == "gail":
            return self.rm.init_state(key, hp)
        k_g, k_h, k_state = jax.random.split(key, 3)
        n, spec = self.spec.num_agents, self.spec
        obs = jnp.zeros((1, n, spec.obs_dim), jnp.float32)
        state = jnp.zeros((1, spec.state_dim), jnp.float32)
        params = {"g": self.rm.init(k_g), "h": self.potential.init(k_h, obs, state)}
        return RewardModelState(params, init_opt(self.rm.tx, params, hp.lr), hp, jnp.int32(0),
                                k_state)

    # -- AIRL ----------------------------------------------------------------------
    def joint_log_pi(self, actor_params, obs, avail, actions) -> jax.Array:
        """`[B]` Σ_i log π_i (team) or `[B, N]` (per agent)."""
        lp = self.actor.log_prob(actor_params, obs, avail, actions)
        return lp if self.per_agent else jnp.sum(lp, axis=-1)

    def airl_step_logits(self, params, actor_params, obs, gs, avail, actions, next_obs,
                         next_gs, last) -> jax.Array:
        g = self.rm.step_reward(params["g"], obs, actions, gs)
        h = self.potential(params["h"], obs, gs)
        h_next = self.potential(params["h"], next_obs, next_gs)
        if self.per_agent:
            last = jnp.broadcast_to(last[..., None], g.shape)
        log_pi = self.joint_log_pi(actor_params, obs, avail, actions)
        return airl_logits(g, h, h_next, last, log_pi, self.gamma)

    def airl_loss(self, params, actor_params, expert: Demos, policy: Demos, key, gp_coef):
        """AIRL's logistic loss (demonstrations = 1) plus `gp_coef` × the
        gradient penalty of g (the learned reward term)."""
        args = lambda b: (b.obs, b.global_state, b.avail, b.actions, b.next_obs,  # noqa: E731
                          b.next_global_state, b.last)
        l_e = self.airl_step_logits(params, actor_params, *args(expert))
        l_p = self.airl_step_logits(params, actor_params, *args(policy))
        d_loss = agent_discriminator_loss(l_e, l_p) if self.per_agent else discriminator_loss(l_e, l_p)
        gp = jnp.float32(0.0)
        if self.config.gp_coef > 0:
            x_e, x_p = self.rm._input(expert.obs, expert.actions), self.rm._input(policy.obs, policy.actions)
            if self.per_agent:
                gp = agent_gradient_penalty(
                    lambda x: self.rm.net.local_values(params["g"], x), x_e, x_p, key)
            else:
                gp = gradient_penalty(lambda inp: self.rm.net(params["g"], *inp),
                                      (x_e, expert.global_state), (x_p, policy.global_state), key)
        return d_loss + gp_coef * gp, dict(disc_loss=d_loss, grad_penalty=gp,
                                           disc_accuracy=discriminator_accuracy(l_e, l_p),
                                           expert_logit=jnp.mean(l_e), policy_logit=jnp.mean(l_p))

    # -- the hook ------------------------------------------------------------------
    def policy_samples(self, batch: RewardBatch, key: jax.Array) -> Demos:
        """`disc_batch` steps of the rollout, uniformly."""
        # The explicit length keeps zero-size leaves (a box-action
        # environment's [T, E, N, 0] legal-action mask) reshapable.
        flat = jax.tree.map(lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:]),
                            (batch.obs, batch.global_state, batch.avail, batch.action,
                             batch.next_obs, batch.next_global_state, batch.last))
        idx = jax.random.randint(key, (self.config.disc_batch,), 0, flat[0].shape[0])
        o, s, av, a, no, ns, last = (x[idx] for x in flat)
        return Demos(obs=o, global_state=s, avail=av, actions=a, next_obs=no,
                     next_global_state=ns, last=last, reward=jnp.zeros(idx.shape, jnp.float32),
                     weight=jnp.ones(idx.shape, jnp.float32))

    def disc_update(self, rs: AdversarialState, actor_params, batch: RewardBatch, key):
        """`disc_steps` discriminator updates: demonstrations vs this rollout."""
        cfg = self.config

        def step(disc: RewardModelState, k):
            k_e, k_p = jax.random.split(k)
            expert = sample_where(k_e, rs.demos, cfg.disc_batch, rs.demos.weight)
            policy = self.policy_samples(batch, k_p)
            if cfg.method == "gail":
                disc, m = self.rm.update(
                    disc, StepBatch(expert.obs, expert.actions, expert.global_state),
                    StepBatch(policy.obs, policy.actions, policy.global_state))
                l_e = self.rm.step_reward(disc.params, expert.obs, expert.actions,
                                          expert.global_state)
                return disc, dict(disc_loss=m["disc_loss"], grad_penalty=m["grad_penalty"],
                                  disc_accuracy=m["accuracy"], expert_logit=m["reward_positive"],
                                  policy_logit=m["reward_negative"],
                                  expert_reward=jnp.mean(gail_reward(l_e, cfg.reward_form)))
            k_gp, k_next = jax.random.split(disc.key)
            grads, m = jax.grad(self.airl_loss, has_aux=True)(
                disc.params, actor_params, expert, policy, k_gp, disc.hparams.gp_coef)
            updates, opt = self.rm.tx.update(grads, disc.opt_state, disc.params)
            params = jax.tree.map(lambda p, u: p + u, disc.params, updates)
            return disc.replace(params=params, opt_state=opt, step=disc.step + 1, key=k_next), m

        disc, ms = jax.lax.scan(step, rs.disc, jax.random.split(key, cfg.disc_steps))
        return rs.replace(disc=disc), jax.tree.map(lambda x: x[-1], ms)

    def reward(self, rs: AdversarialState, actor_params, batch: RewardBatch) -> jax.Array:
        """The policy's reward on a rollout: `[T, E]` (team) or `[T, E, N]`."""
        if self.config.method == "airl":
            return self.airl_step_logits(rs.disc.params, actor_params, batch.obs,
                                         batch.global_state, batch.avail, batch.action,
                                         batch.next_obs, batch.next_global_state, batch.last)
        logits = self.rm.step_reward(rs.disc.params, batch.obs, batch.action, batch.global_state)
        return gail_reward(logits, self.config.reward_form)

    def hook(self) -> RewardHook:
        cfg = self.config
        update = None if cfg.method == "ppo" else self.disc_update
        ref = None
        if cfg.kl_coef > 0:
            ref = lambda rs, obs, avail, a: self.actor.log_prob(rs.ref, obs, avail, a)  # noqa: E731
        return RewardHook(reward=self.reward, update=update, kl_coef=float(cfg.kl_coef),
                          ref_log_prob=ref, guarded=() if update is None else DISC_GUARDED)

    # -- π_SFT ---------------------------------------------------------------------
    def pretrain(self, params: Any, demos: Demos, key: jax.Array) -> tuple[Any, jax.Array]:
        """`sft_updates` BC steps of the PPO actor on the demonstrations (Adam,
        `sft_lr`;
        [`jaxil.losses.weighted_bc_loss`][jaxil.losses.bc.weighted_bc_loss]);
        returns the parameters and the per-step losses. An actor that
        normalises its observations first takes the demonstrations' statistics,
        so that BC fits the inputs PPO will go on to see."""
        import optax

        cfg = self.config
        if self.actor.obs_norm:
            w = jnp.broadcast_to(demos.weight[:, None], demos.obs.shape[:-1])
            params = self.actor.with_obs_stats(params, demos.obs, w)
        tx = optax.adam(cfg.sft_lr)

        def loss(p, b: Demos):
            lp = self.actor.log_prob(p, b.obs, b.avail, b.actions)
            return weighted_bc_loss(lp, jnp.ones(lp.shape[0], lp.dtype))

        def step(carry, k):
            p, opt = carry
            b = sample_where(k, demos, cfg.sft_batch, demos.weight)
            val, g = jax.value_and_grad(loss)(p, b)
            upd, opt = tx.update(g, opt, p)
            return (optax.apply_updates(p, upd), opt), val

        (params, _), losses = jax.lax.scan(step, (params, tx.init(params)),
                                           jax.random.split(key, cfg.sft_updates))
        return params, losses


# --------------------------------------------------------------------------
# The program: init and chunk for one run (vmapped for the engine)
# --------------------------------------------------------------------------
class Program:
    """The PPO program with the adversarial hook, for one (env, configs)."""

    def __init__(self, env: MultiAgentEnv, ppo_config: PPOConfig, config: AdversarialConfig):
        self.env, self.ppo_config, self.config = env, ppo_config, config
        self.adv = Adversarial(env.spec, make_actor(env.spec, ppo_config), ppo_config, config)
        self.ppo: PPO = make_ppo(env, ppo_config, self.adv.hook())

    def init(self, key: jax.Array, demos: Optional[Demos], reward_params: Any = None):
        """One run's `RunnerState` (the actor as π_SFT when
        `sft_updates > 0`), its SFT losses `[sft_updates]` and their
        [`jaxil.runs.guard.Health`][jaxil.runs.guard.Health]."""
        cfg = self.config
        k_ppo, k_disc, k_sft = jax.random.split(key, 3)
        disc = self.adv.init_disc(k_disc, reward_params)
        runner = self.ppo.init(k_ppo, AdversarialState(disc=disc, demos=demos, ref=None))
        losses = jnp.zeros((1,), jnp.float32)
        if cfg.sft_updates > 0:
            if demos is None:
                raise ValueError("sft_updates > 0 needs demonstrations")
            params, losses = self.adv.pretrain(runner.actor.params, demos, k_sft)
            actor = runner.actor.replace(params=params, opt_state=runner.actor.tx.init(params))
            ref = params if cfg.kl_coef > 0 else None
            runner = runner._replace(actor=actor, reward=runner.reward.replace(ref=ref))
        return runner, losses, guard.health({"bc_loss": losses}, runner.actor.params)

    def evaluate(self, actor_params: Any, key: jax.Array):
        policy = self.adv.actor.policy_fn(self.config.deterministic_eval)
        return envs.run_episodes(self.env, policy, actor_params, key, self.config.eval_episodes)


@functools.lru_cache(maxsize=8)
def _compiled(env, ppo_config: PPOConfig, config: AdversarialConfig, compiler_items: tuple):
    prog = Program(env, ppo_config, config)
    opts = dict(compiler_items) or None
    cache: dict = {}

    def compiled(name, fn, *args):
        if name not in cache:
            cache[name] = jax.jit(fn).lower(*args).compile(opts)
        return cache[name]

    return prog, compiled


# --------------------------------------------------------------------------
# Training: the program handed to the run engine
# --------------------------------------------------------------------------
def train_adversarial(
    env: MultiAgentEnv,
    ppo_config: PPOConfig,
    config: AdversarialConfig,
    demos: Optional[Demos],
    *,
    seeds: int = 1,
    base_seed: int = 0,
    reward_params: Any = None,
    out_dir: Optional[str | Path] = None,
    resume: bool = False,
    overwrite: bool = False,
    eval_every: int = 1,
    stop_after_chunks: Optional[int] = None,
    progress: bool = True,
    run_info: Optional[dict] = None,
    compiler_options: Optional[dict] = None,
    loggers: Sequence[LoggerFactory] = (),
) -> dict:
    """Train `seeds` runs of `config.method` together and return the
    summary (`results.json` in `out_dir`) with the final `states`.

    `demos`: the demonstrations
    ([`Demos`][jaxil.algorithms.irl.adversarial.Demos]), shared by every run,
    or stacked per run
    ([`stack_demos`][jaxil.algorithms.irl.adversarial.stack_demos], leading
    axis `seeds`): GAIL's and AIRL's positives and π_SFT's training set.
    `reward_params`: the fixed reward model of method `"ppo"` (one, shared by
    the runs).

    Evaluations (`config.eval_episodes` episodes on fixed start states)
    run at chunk 0 (the initial policy, π_SFT: BC) and every `eval_every`
    chunks; each writes one metrics row per run and a checkpoint.
    `stop_after_chunks` stops early (as a kill would) for tests.
    `loggers`: where the metrics rows go besides `metrics.jsonl`
    ([`jaxil.runs.loggers`][jaxil.runs.loggers]; runs named `run<i>-seed<s>`).

    Raises:
      jaxil.runs.guard.NonFiniteError: a loss or parameter became NaN/inf (the
        directory keeps its last good checkpoint).
      FileExistsError / ValueError: the run directory's rules
        ([`jaxil.runs.rundir`][jaxil.runs.rundir]).
    """

    if out_dir:
        check_run_dir(out_dir, resume=resume, overwrite=overwrite)
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be an integer >= 1, got {seeds!r}")
    chunks = ppo_config.num_chunks
    if not (isinstance(eval_every, int) and 1 <= eval_every <= chunks and chunks % eval_every == 0):
        raise ValueError(f"eval_every must divide the run's {chunks} chunks, got {eval_every!r}")
    if config.method in ("gail", "airl") and demos is None:
        raise ValueError(f"{config.method} needs demonstrations")
    if config.method == "ppo" and reward_params is None:
        raise ValueError("method 'ppo' needs reward_params (a learned reward model)")
    spec = env.spec
    prog, compiled = _compiled(env, ppo_config, config,
                               tuple(sorted((compiler_options or {}).items())))
    per_run = demos is not None and demos.weight.ndim == 2
    if per_run and demos.weight.shape[0] != seeds:
        raise ValueError(f"demos are stacked for {demos.weight.shape[0]} runs but seeds={seeds}")
    if demos is not None:
        _check_demos(spec, demos, per_run)

    keys = jnp.stack([jax.random.PRNGKey(base_seed + s) for s in range(seeds)])
    chunk_fn = jax.vmap(prog.ppo.update_chunk_checked)
    eval_fn = jax.vmap(prog.evaluate, in_axes=(0, None))
    eval_key = jax.random.PRNGKey(base_seed + 10_000)

    ids = [dict(run=s, seed=base_seed + s) for s in range(seeds)]
    identity = dict(env_id=spec.env_id, method=config.method, config=config.to_dict(),
                    ppo=ppo_config.to_dict(), seeds=seeds, base_seed=base_seed,
                    eval_every=eval_every,
                    demos=None if demos is None else demos_digest(demos),
                    reward=None if reward_params is None else _digest(reward_params))
    rd = None
    if out_dir:  # before any compilation: a refused resume costs nothing
        rd = open_run(out_dir, identity, step_key="chunk", resume=resume, overwrite=overwrite,
                      info=dict(run_info or {}))
    labels = [f"seed {i['seed']}" + (f" ({out_dir})" if out_dir else "") for i in ids]
    learner = f"{config.method.upper()} on {spec.env_id}"
    demos_of = (lambda i: jax.tree.map(lambda x: x[i], demos)) if per_run else (lambda i: demos)
    sft: dict = {}

    def init():
        # The runs are initialised one at a time (one compiled program) and
        # stacked: a vmapped init of SMAX 3m with π_SFT stalls XLA:CPU (every
        # thread waiting, no progress), while the vmapped chunk runs.
        init_one = compiled("init", prog.init, keys[0], demos_of(0), reward_params)
        states, sft["losses"], sft["health"] = jax.tree.map(
            lambda *xs: jnp.stack(xs), *[init_one(keys[i], demos_of(i), reward_params)
                                         for i in range(seeds)])
        return states

    def initial_metrics(states):
        """Row 0 (π_SFT), written only by a run that starts afresh: its BC
        losses are guarded and the last one recorded."""
        if not config.sft_updates:
            return {}
        guard.check(jax.device_get(sft["health"]), learner=f"π_SFT (BC) of {learner}",
                    run_labels=labels, first_step=1, chunk_len=config.sft_updates)
        return {"bc_loss": np.asarray(sft["losses"])[:, -1]}

    def chunk(states, c):
        return compiled("chunk", chunk_fn, states)(states)

    def evaluate(states, c):
        params = states.actor.params
        ep = compiled("eval", eval_fn, params, eval_key)(params, eval_key)
        return {"eval_return": ep.episode_return, "eval_win_rate": ep.won,
                "eval_length": ep.length}

    def postfix(v):
        post = dict(ret=f"{v['eval_return'].mean():.3f}")
        if "learned_reward" in v:
            post["r_hat"] = f"{v['learned_reward'].mean():.3f}"
        return post

    def summarize_rows(rows):
        out = summarize(rows, ids)
        out.update(method=config.method, env_id=spec.env_id)
        return out

    program = engine.Program(
        name=learner, step_key="chunk", num_chunks=chunks,
        steps_per_chunk=ppo_config.updates_per_chunk, eval_every=eval_every,
        eval_at_start=True, save_at_start=True, run_ids=ids, run_labels=labels, init=init,
        chunk=chunk, evaluate=evaluate, initial_metrics=initial_metrics,
        summarize=summarize_rows, postfix=postfix)
    result = engine.run(program, rundir=rd, progress=progress, loggers=loggers,
                        log_names=[f"run{i['run']}-seed{i['seed']}" for i in ids],
                        stop_after_chunks=stop_after_chunks)
    summary = dict(result.summary)
    summary["states"] = result.state
    return summary


def _digest(tree: Any) -> str:

    return params_digest(tree)[:12]


def _check_demos(spec: EnvSpec, demos: Demos, per_run: bool) -> None:
    lead = demos.weight.shape[:1 + per_run]
    want = lead + (spec.num_agents, spec.obs_dim)
    if tuple(demos.obs.shape) != want:
        raise ValueError(f"demonstrations have obs of shape {tuple(demos.obs.shape)} but "
                         f"{spec.env_id} needs {want}: were they recorded on another environment?")
    if tuple(demos.global_state.shape) != lead + (spec.state_dim,):
        raise ValueError(f"demonstrations have global_state of shape "
                         f"{tuple(demos.global_state.shape)}, {spec.env_id} needs "
                         f"{lead + (spec.state_dim,)}")
    w = np.asarray(demos.weight)
    if not (w.reshape((-1, w.shape[-1])) > 0).any(axis=-1).all():
        raise ValueError("demonstrations: a run has no demonstration step")
    for name in ("obs", "global_state", "next_obs", "next_global_state"):
        if not np.isfinite(np.asarray(getattr(demos, name))).all():
            raise ValueError(f"demonstrations: `{name}` holds NaN or inf; clean the dataset")


def summarize(rows: list[dict], ids: list[dict]) -> dict:
    """The initial (chunk 0: π_SFT) and final evaluations, mean ± std over runs."""
    if not rows:
        return {}
    steps = [r["chunk"] for r in rows]
    return {"initial": returns_summary(rows, "chunk", min(steps)),
            "final": returns_summary(rows, "chunk", max(steps))}


def format_summary(summary: dict) -> str:
    """Two lines: the initial (π_SFT / BC) and the final evaluation."""
    lines = []
    for name, label in (("initial", "chunk 0 (π_SFT: BC)"), ("final", "final")):
        if name in summary:
            e = summary[name]
            lines.append(f"{summary.get('method', '').upper()} {label:<20} chunk {e['chunk']:>4}: "
                         f"return {e['return_mean']:.3f} ± {e['return_std']:.3f}, "
                         f"win rate {e['win_rate_mean']:.3f}")
    lines.append(f"wall time {summary.get('wall_seconds', 0.0):.1f}s"
                 + ("" if summary.get("complete", True) else " (stopped early; --resume continues)"))
    return "\n".join(lines)
