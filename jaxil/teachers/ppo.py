"""IPPO and MAPPO teachers, PureJaxRL style: the whole run is one jitted program.

Teachers are the demonstrators of jaxil: we train them with PPO, keep their
actor parameters at several points of training (policies of several quality
levels from one run) and roll them out to build mixed-quality datasets.

Two levels of API:

- Pure functions. ``make_train(env, config) -> train(key)`` runs the whole
  training (environment steps in ``lax.scan``, GAE, epochs x minibatches in
  ``lax.scan``) and is jittable and vmappable over seeds::

      train = make_train(envs.make("smax:3m"), PPOConfig(algo="mappo"))
      runner, metrics = jax.jit(jax.vmap(train))(jax.random.split(key, 4))

  ``make_ppo(env, config)`` exposes the pieces: ``init(key) -> RunnerState``
  and ``update_chunk(runner) -> (runner, metrics)``, which runs
  ``config.updates_per_chunk`` PPO updates.

- The driver. ``train_teacher(env_id, config, seed, out_dir)`` loops over
  chunks with a progress bar, writes ``metrics.jsonl``, saves orbax
  checkpoints of the actor at several points, evaluates each with
  :func:`envs.run_episodes`, writes ``teacher.json`` and resumes exactly from
  the last checkpoint. ``load_teacher(out_dir)`` gives back a plain policy
  function ``policy(params, obs [N, O], avail [N, A], key) -> actions [N]``.

Model. One actor shared by all agents, input ``obs ⊕ one-hot(agent id)``,
MLP torso, and either a masked categorical head (unavailable actions get
probability exactly 0) or a tanh-squashed diagonal Gaussian mapped onto the
action box. Critic: IPPO evaluates ``V(o_i, i)`` on the agent's own
observation; MAPPO evaluates ``V(s, i)`` on the global state. Both are trained
on the team reward.

Conventions worth knowing:

- An episode boundary (``done`` or ``truncated``) stops the GAE recursion: the
  auto-reset wrapper hands back the next episode's first observation, so time
  limits are treated as terminal, as in PureJaxRL/JaxMARL.
- For continuous actions the buffer stores the pre-squash Gaussian sample
  ``u``; the tanh Jacobian does not depend on the parameters, so the PPO
  ratio of the squashed policy equals the Gaussian ratio on ``u``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil
import time
from typing import Any, Callable, NamedTuple, Optional, Sequence

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState

import envs
from envs.core import EnvSpec, MultiAgentEnv
from envs.policies import random_policy
from envs.wrappers import AutoReset

ALGOS = ("ippo", "mappo")
ACTIVATIONS = {"relu": nn.relu, "tanh": nn.tanh}
# Finite mask value: exp(MASKED - max) underflows to exactly 0 in float32, and
# 0 * MASKED stays finite in the entropy (-inf would give 0 * inf = NaN).
MASKED_LOGIT = -1e9


# --------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Hyper-parameters of an IPPO/MAPPO run (hashable; a static argument).

    Budget: every PPO update consumes ``num_envs * num_steps`` environment
    steps; updates are grouped into chunks of ``updates_per_chunk`` (the unit of
    logging and checkpointing). The run has
    ``num_chunks = total_timesteps // (num_envs * num_steps * updates_per_chunk)``
    chunks, so ``total_timesteps`` is rounded down to whole chunks.

    Attributes:
      algo: ``"ippo"`` (per-agent critic on the agent's observation) or
        ``"mappo"`` (centralised critic on the global state).
      total_timesteps: environment steps (one step = all agents act once).
      num_envs: parallel environments.
      num_steps: rollout length per update.
      update_epochs: passes over each rollout.
      num_minibatches: minibatches per epoch (splits the ``num_envs*num_steps``
        joint transitions; the agents of one transition stay together).
      lr: Adam learning rate of actor and critic.
      anneal_lr: decay the learning rate linearly to 0 over the run.
      gamma, gae_lambda: discount and GAE λ.
      clip_eps: PPO ratio clip (also used for value clipping).
      ent_coef, vf_coef: entropy bonus and value-loss weights.
      max_grad_norm: global gradient-norm clip (per network).
      hidden_sizes: MLP torso widths of actor and critic.
      activation: ``"relu"`` or ``"tanh"``.
      reward_scale: multiplies the team reward before GAE (MPE returns are
        large and negative; scaling keeps the value targets O(1)).
      normalize_advantages: per-minibatch advantage normalisation.
      log_std_init: initial log standard deviation of the Gaussian head.
      updates_per_chunk: PPO updates fused into one ``update_chunk`` call.
    """

    algo: str = "mappo"
    total_timesteps: int = 10_000_000
    num_envs: int = 128
    num_steps: int = 128
    update_epochs: int = 4
    num_minibatches: int = 4
    lr: float = 2e-3
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden_sizes: tuple[int, ...] = (128, 128)
    activation: str = "relu"
    reward_scale: float = 1.0
    normalize_advantages: bool = True
    log_std_init: float = -0.5
    updates_per_chunk: int = 10

    def __post_init__(self):
        def fail(name, msg):
            raise ValueError(f"PPOConfig.{name}={getattr(self, name)!r}: {msg}")

        if self.algo not in ALGOS:
            fail("algo", f"must be one of {ALGOS}")
        if self.activation not in ACTIVATIONS:
            fail("activation", f"must be one of {tuple(ACTIVATIONS)}")
        for name in ("total_timesteps", "num_envs", "num_steps", "update_epochs",
                     "num_minibatches", "updates_per_chunk"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                fail(name, "must be a positive integer")
        for name in ("anneal_lr", "normalize_advantages"):
            if not isinstance(getattr(self, name), bool):
                fail(name, "must be True or False")
        for name in ("lr", "clip_eps", "max_grad_norm", "reward_scale"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                fail(name, "must be a finite number > 0")
        for name in ("ent_coef", "vf_coef"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                fail(name, "must be a finite number >= 0")
        if not (isinstance(self.gamma, (int, float)) and 0 < self.gamma <= 1):
            fail("gamma", "must be in (0, 1]")
        if not (isinstance(self.gae_lambda, (int, float)) and 0 <= self.gae_lambda <= 1):
            fail("gae_lambda", "must be in [0, 1]")
        if not (isinstance(self.log_std_init, (int, float)) and math.isfinite(self.log_std_init)):
            fail("log_std_init", "must be a finite number")
        hs = self.hidden_sizes
        if isinstance(hs, int) or not all(
            isinstance(h, (int, np.integer)) and not isinstance(h, bool) and h > 0 for h in hs
        ) or len(hs) == 0:
            fail("hidden_sizes", "must be a non-empty sequence of positive integers")
        object.__setattr__(self, "hidden_sizes", tuple(int(h) for h in hs))
        batch = self.num_envs * self.num_steps
        if batch % self.num_minibatches:
            fail(
                "num_minibatches",
                f"must divide num_envs * num_steps = {batch} "
                f"(e.g. num_minibatches in {_divisors(batch)[:8]})",
            )
        per_chunk = batch * self.updates_per_chunk
        if self.total_timesteps < per_chunk:
            fail(
                "total_timesteps",
                f"is less than one chunk (num_envs * num_steps * updates_per_chunk = "
                f"{per_chunk} environment steps); raise it or lower updates_per_chunk",
            )

    @property
    def batch_size(self) -> int:
        """Environment steps per PPO update."""
        return self.num_envs * self.num_steps

    @property
    def num_chunks(self) -> int:
        return self.total_timesteps // (self.batch_size * self.updates_per_chunk)

    @property
    def num_updates(self) -> int:
        """PPO updates actually run (whole chunks)."""
        return self.num_chunks * self.updates_per_chunk

    @property
    def env_steps(self) -> int:
        """Environment steps actually run (``total_timesteps`` rounded down)."""
        return self.num_updates * self.batch_size

    def replace(self, **kw) -> "PPOConfig":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["hidden_sizes"] = list(self.hidden_sizes)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "PPOConfig":
        known = {f.name for f in dataclasses.fields(PPOConfig)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown PPOConfig fields {sorted(unknown)}; known: {sorted(known)}")
        return PPOConfig(**d)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# --------------------------------------------------------------------------
# Networks and action heads
# --------------------------------------------------------------------------
def _with_agent_id(x: jax.Array, num_agents: int) -> jax.Array:
    """``[..., N, D] -> [..., N, D + N]`` with a one-hot agent id appended."""
    ids = jnp.broadcast_to(jnp.eye(num_agents, dtype=x.dtype), x.shape[:-1] + (num_agents,))
    return jnp.concatenate([x, ids], axis=-1)


class _Torso(nn.Module):
    hidden_sizes: Sequence[int]
    activation: str

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        for h in self.hidden_sizes:
            x = act(nn.Dense(h, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
        return x


class Actor(nn.Module):
    """Parameter-shared actor: ``obs [..., N, O] ->`` logits ``[..., N, A]``
    (discrete) or ``(mean [..., N, D], log_std [D])`` (continuous)."""

    num_agents: int
    action_dim: int
    discrete: bool
    hidden_sizes: Sequence[int] = (128, 128)
    activation: str = "relu"
    log_std_init: float = -0.5

    @nn.compact
    def __call__(self, obs):
        x = _Torso(self.hidden_sizes, self.activation)(_with_agent_id(obs, self.num_agents))
        out = nn.Dense(self.action_dim, kernel_init=nn.initializers.orthogonal(0.01))(x)
        if self.discrete:
            return out
        log_std = self.param(
            "log_std", nn.initializers.constant(self.log_std_init), (self.action_dim,)
        )
        return out, log_std


class Critic(nn.Module):
    """``x [..., N, D] -> V [..., N]`` with the agent id appended to ``x``."""

    num_agents: int
    hidden_sizes: Sequence[int] = (128, 128)
    activation: str = "relu"

    @nn.compact
    def __call__(self, x):
        h = _Torso(self.hidden_sizes, self.activation)(_with_agent_id(x, self.num_agents))
        return nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0))(h)[..., 0]


def make_actor(spec: EnvSpec, config: PPOConfig) -> Actor:
    return Actor(
        num_agents=spec.num_agents,
        action_dim=spec.num_actions if spec.discrete else spec.action.dim,
        discrete=spec.discrete,
        hidden_sizes=config.hidden_sizes,
        activation=config.activation,
        log_std_init=config.log_std_init,
    )


def masked_logits(logits: jax.Array, avail: jax.Array) -> jax.Array:
    """Logits with unavailable actions set to a huge negative number.

    ``softmax(masked_logits(l, m))`` is exactly 0 where ``m`` is False and is
    never NaN (an all-False row gives a uniform distribution).
    """
    chex.assert_equal_shape([logits, avail])
    return jnp.where(avail, logits, MASKED_LOGIT)


def categorical_log_prob_entropy(
    logits: jax.Array, avail: jax.Array, actions: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """log π(a) and entropy of the masked categorical. ``[..., A] -> [...]``."""
    logp_all = jax.nn.log_softmax(masked_logits(logits, avail), axis=-1)
    logp = jnp.take_along_axis(logp_all, actions[..., None].astype(jnp.int32), axis=-1)[..., 0]
    p = jnp.exp(logp_all)
    entropy = -jnp.sum(jnp.where(avail, p * logp_all, 0.0), axis=-1)
    return logp, entropy


def gaussian_log_prob_entropy(
    mean: jax.Array, log_std: jax.Array, u: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Diagonal Gaussian log-density of the pre-squash sample ``u`` and its
    entropy. ``[..., D] -> [...]``."""
    z = (u - mean) * jnp.exp(-log_std)
    logp = jnp.sum(-0.5 * z**2 - log_std - 0.5 * jnp.log(2 * jnp.pi), axis=-1)
    entropy = jnp.sum(log_std + 0.5 * jnp.log(2 * jnp.pi * jnp.e), axis=-1)
    return logp, jnp.broadcast_to(entropy, logp.shape)


def squash(u: jax.Array, low: float, high: float) -> jax.Array:
    """Map ``u ∈ R^D`` onto the box ``[low, high]^D`` through tanh."""
    return low + (high - low) * 0.5 * (jnp.tanh(u) + 1.0)


def action_probs(actor: Actor, params: Any, obs: jax.Array, avail: jax.Array) -> jax.Array:
    """Masked action probabilities ``[..., N, A]`` of a discrete actor."""
    if not actor.discrete:
        raise ValueError("action_probs needs a discrete actor")
    return jax.nn.softmax(masked_logits(actor.apply(params, obs), avail), axis=-1)


def _sample(actor: Actor, out, avail, key, deterministic: bool):
    """Returns ``(raw, logp)``: raw = int action (discrete) or pre-squash u."""
    if actor.discrete:
        logits = masked_logits(out, avail)
        if deterministic:
            a = jnp.argmax(logits, axis=-1)
        else:
            a = jax.random.categorical(key, logits, axis=-1)
        a = a.astype(jnp.int32)
        logp, _ = categorical_log_prob_entropy(out, avail, a)
        return a, logp
    mean, log_std = out
    if deterministic:
        u = mean
    else:
        u = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
    logp, _ = gaussian_log_prob_entropy(mean, log_std, u)
    return u, logp


def _to_env_action(spec: EnvSpec, raw: jax.Array) -> jax.Array:
    if spec.discrete:
        return raw
    return squash(raw, spec.action.low, spec.action.high)


@functools.lru_cache(maxsize=64)
def make_policy(spec: EnvSpec, config: PPOConfig, deterministic: bool = False) -> Callable:
    """Plain policy function for ONE environment, usable with
    :func:`envs.rollout` / :func:`envs.run_episodes`:
    ``policy(actor_params, obs [N, O], avail [N, A], key) -> actions``
    (``[N]`` int32, or ``[N, D]`` float32 inside the action box).

    ``deterministic=True`` takes the most likely available action (discrete) or
    the squashed Gaussian mean (continuous). Cached: equal arguments give the
    same function object, so jitted rollouts of it compile once.
    """
    actor = make_actor(spec, config)

    def policy(params, obs, avail, key):
        raw, _ = _sample(actor, actor.apply(params, obs), avail, key, deterministic)
        return _to_env_action(spec, raw)

    return policy


def gae(
    reward: jax.Array,
    value: jax.Array,
    last: jax.Array,
    last_value: jax.Array,
    gamma: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation over a time-major batch.

    δ_t = r_t + γ (1 - last_t) V_{t+1} - V_t,
    A_t = δ_t + γ λ (1 - last_t) A_{t+1}      (Schulman et al., 2016),
    with ``V_T = last_value``; ``last_t`` marks that step t ended an episode
    (the next value belongs to a new episode and is not bootstrapped).

    Args:
      reward: ``[T, ...]`` reward of the transition taken at t.
      value: ``[T, ...]`` V(s_t).
      last: ``[T, ...]`` bool, the episode ended with step t.
      last_value: ``[...]`` value of the observation after step T-1.
      gamma, lam: discount and GAE λ.

    Returns:
      ``(advantages, value_targets)``, both ``[T, ...]``; targets = A + V.
    """
    chex.assert_equal_shape([reward, value, last])
    chex.assert_equal_shape([value[0], last_value])
    nonterminal = 1.0 - last.astype(value.dtype)

    def body(carry, x):
        next_adv, next_value = carry
        r, nt, v = x
        delta = r + gamma * next_value * nt - v
        adv = delta + gamma * lam * nt * next_adv
        return (adv, v), adv

    _, adv = jax.lax.scan(
        body, (jnp.zeros_like(last_value), last_value), (reward, nonterminal, value), reverse=True
    )
    return adv, adv + value


# --------------------------------------------------------------------------
# The PPO program
# --------------------------------------------------------------------------
class RunnerState(NamedTuple):
    """Everything a run carries between updates (a pytree; checkpointed whole)."""

    actor: TrainState
    critic: TrainState
    env_state: Any
    timestep: Any
    key: jax.Array
    update: jax.Array  # [] int32, PPO updates done


class Transition(NamedTuple):
    obs: jax.Array  # [E, N, O]
    global_state: jax.Array  # [E, S] (MAPPO) or [E, 0] (IPPO)
    avail: jax.Array  # [E, N, A]
    raw_action: jax.Array  # [E, N] int32 or [E, N, D] pre-squash
    logp: jax.Array  # [E, N]
    value: jax.Array  # [E, N]
    reward: jax.Array  # [E]
    last: jax.Array  # [E] episode ended with this step
    episode_return: jax.Array  # [E]
    won: jax.Array  # [E]


class PPO(NamedTuple):
    """The pure pieces of a run; see :func:`make_ppo`."""

    env: MultiAgentEnv
    config: PPOConfig
    actor: Actor
    critic: Critic
    init: Callable[[jax.Array], RunnerState]
    update_chunk: Callable[[RunnerState], tuple[RunnerState, dict]]


def make_ppo(env: MultiAgentEnv, config: PPOConfig) -> PPO:
    """Build ``init(key) -> RunnerState`` and ``update_chunk(runner) ->
    (runner, metrics)`` (``config.updates_per_chunk`` PPO updates).

    Both are pure and jittable, and vmappable over a leading seed axis.
    ``metrics`` are scalars summarising the chunk: ``episodes`` (finished in
    the training rollouts), ``return_mean``, ``win_rate`` (NaN when no episode
    finished), ``actor_loss``, ``value_loss``, ``entropy``, ``approx_kl``,
    ``clip_frac``, ``lr``, ``env_steps`` (total so far).
    """
    if not isinstance(config, PPOConfig):
        raise TypeError(f"config must be a PPOConfig, got {type(config).__name__}")
    spec = env.spec
    env = env if isinstance(env, AutoReset) else AutoReset(env)
    cfg = config
    n, E, T = spec.num_agents, cfg.num_envs, cfg.num_steps
    mappo = cfg.algo == "mappo"
    actor = make_actor(spec, cfg)
    critic = Critic(num_agents=n, hidden_sizes=cfg.hidden_sizes, activation=cfg.activation)
    total_opt_steps = cfg.num_updates * cfg.update_epochs * cfg.num_minibatches

    def lr_at(count):
        if cfg.anneal_lr:
            return cfg.lr * (1.0 - jnp.minimum(count, total_opt_steps) / total_opt_steps)
        return jnp.asarray(cfg.lr, jnp.float32)

    def make_tx():
        return optax.chain(
            optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(lr_at, eps=1e-5)
        )

    def critic_input(obs, global_state):
        if mappo:  # [..., S] -> [..., N, S]
            return jnp.broadcast_to(
                global_state[..., None, :], global_state.shape[:-1] + (n, global_state.shape[-1])
            )
        return obs

    def init(key: jax.Array) -> RunnerState:
        k_actor, k_critic, k_env, key = jax.random.split(key, 4)
        obs0 = jnp.zeros((n, spec.obs_dim), jnp.float32)
        gs0 = jnp.zeros((spec.state_dim,), jnp.float32)
        actor_ts = TrainState.create(
            apply_fn=actor.apply, params=actor.init(k_actor, obs0), tx=make_tx()
        )
        critic_ts = TrainState.create(
            apply_fn=critic.apply,
            params=critic.init(k_critic, critic_input(obs0, gs0)),
            tx=make_tx(),
        )
        env_state, ts = jax.vmap(env.reset)(jax.random.split(k_env, E))
        return RunnerState(actor_ts, critic_ts, env_state, ts, key, jnp.int32(0))

    def env_step(carry, _):
        actor_ts, critic_ts, env_state, ts, key = carry
        key, k_act = jax.random.split(key)
        out = actor.apply(actor_ts.params, ts.obs)
        raw, logp = _sample(actor, out, ts.avail_actions, k_act, deterministic=False)
        value = critic.apply(critic_ts.params, critic_input(ts.obs, ts.global_state))
        env_state, nts = jax.vmap(env.step)(env_state, _to_env_action(spec, raw))
        tr = Transition(
            obs=ts.obs,
            global_state=ts.global_state if mappo else jnp.zeros((E, 0), jnp.float32),
            avail=ts.avail_actions,
            raw_action=raw,
            logp=logp,
            value=value,
            reward=nts.reward,
            last=nts.last(),
            episode_return=nts.episode_return,
            won=nts.won,
        )
        return (actor_ts, critic_ts, env_state, nts, key), tr

    def advantages(traj: Transition, last_value: jax.Array):
        reward = jnp.broadcast_to((traj.reward * cfg.reward_scale)[..., None], traj.value.shape)
        last = jnp.broadcast_to(traj.last[..., None], traj.value.shape)
        return gae(reward, traj.value, last, last_value, cfg.gamma, cfg.gae_lambda)

    def losses(actor_params, critic_params, mb: Transition, adv, target):
        out = actor.apply(actor_params, mb.obs)
        if actor.discrete:
            logp, entropy = categorical_log_prob_entropy(out, mb.avail, mb.raw_action)
        else:
            logp, entropy = gaussian_log_prob_entropy(out[0], out[1], mb.raw_action)
        if cfg.normalize_advantages:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        log_ratio = logp - mb.logp
        ratio = jnp.exp(log_ratio)
        pg = -jnp.mean(
            jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv)
        )
        ent = jnp.mean(entropy)
        actor_loss = pg - cfg.ent_coef * ent

        value = critic.apply(critic_params, critic_input(mb.obs, mb.global_state))
        v_clipped = mb.value + jnp.clip(value - mb.value, -cfg.clip_eps, cfg.clip_eps)
        value_loss = 0.5 * jnp.mean(
            jnp.maximum(jnp.square(value - target), jnp.square(v_clipped - target))
        )
        aux = dict(
            actor_loss=pg,
            value_loss=value_loss,
            entropy=ent,
            approx_kl=jnp.mean((ratio - 1.0) - log_ratio),
            clip_frac=jnp.mean((jnp.abs(ratio - 1.0) > cfg.clip_eps).astype(jnp.float32)),
        )
        return actor_loss + cfg.vf_coef * value_loss, aux

    grad_fn = jax.grad(losses, argnums=(0, 1), has_aux=True)

    def update_minibatch(carry, mb):
        actor_ts, critic_ts = carry
        traj, adv, target = mb
        (g_actor, g_critic), aux = grad_fn(actor_ts.params, critic_ts.params, traj, adv, target)
        return (actor_ts.apply_gradients(grads=g_actor),
                critic_ts.apply_gradients(grads=g_critic)), aux

    def update_epoch(carry, key):
        actor_ts, critic_ts, data = carry
        perm = jax.random.permutation(key, T * E)
        mb_size = T * E // cfg.num_minibatches
        mbs = jax.tree.map(  # explicit sizes: some leaves are empty ([E, N, 0])
            lambda x: x.reshape((T * E,) + x.shape[2:])[perm].reshape(
                (cfg.num_minibatches, mb_size) + x.shape[2:]
            ),
            data,
        )
        (actor_ts, critic_ts), aux = jax.lax.scan(update_minibatch, (actor_ts, critic_ts), mbs)
        return (actor_ts, critic_ts, data), aux

    def update(runner: RunnerState, _):
        carry = (runner.actor, runner.critic, runner.env_state, runner.timestep, runner.key)
        carry, traj = jax.lax.scan(env_step, carry, None, T)
        actor_ts, critic_ts, env_state, ts, key = carry
        last_value = critic.apply(critic_ts.params, critic_input(ts.obs, ts.global_state))
        adv, target = advantages(traj, last_value)
        key, k_epochs = jax.random.split(key)
        lr = lr_at(_opt_count(actor_ts.opt_state))
        (actor_ts, critic_ts, _), aux = jax.lax.scan(
            update_epoch,
            (actor_ts, critic_ts, (traj, adv, target)),
            jax.random.split(k_epochs, cfg.update_epochs),
        )
        last = traj.last.astype(jnp.float32)
        stats = dict(
            episodes=last.sum(),
            return_sum=(traj.episode_return * last).sum(),
            win_sum=(traj.won.astype(jnp.float32) * last).sum(),
            lr=lr,
            **jax.tree.map(jnp.mean, aux),
        )
        runner = RunnerState(actor_ts, critic_ts, env_state, ts, key, runner.update + 1)
        return runner, stats

    def update_chunk(runner: RunnerState) -> tuple[RunnerState, dict]:
        runner, stats = jax.lax.scan(update, runner, None, cfg.updates_per_chunk)
        episodes = stats["episodes"].sum()
        safe = jnp.maximum(episodes, 1.0)
        metrics = dict(
            env_steps=runner.update * cfg.batch_size,
            episodes=episodes,
            return_mean=jnp.where(episodes > 0, stats["return_sum"].sum() / safe, jnp.nan),
            win_rate=jnp.where(episodes > 0, stats["win_sum"].sum() / safe, jnp.nan),
            **{k: stats[k].mean() for k in
               ("actor_loss", "value_loss", "entropy", "approx_kl", "clip_frac", "lr")},
        )
        if not spec.has_win:
            del metrics["win_rate"]
        return runner, metrics

    return PPO(env=env, config=cfg, actor=actor, critic=critic, init=init,
               update_chunk=update_chunk)


def _opt_count(opt_state) -> jax.Array:
    """Adam's step count inside ``chain(clip, adam)``."""
    return opt_state[1][0].count


def make_train(env: MultiAgentEnv, config: PPOConfig) -> Callable:
    """``train(key) -> (RunnerState, metrics)``: the whole run as one pure
    function (``config.num_chunks`` chunks of ``updates_per_chunk`` updates).
    ``metrics`` leaves have a leading ``[num_chunks]`` axis (a learning curve).
    ``jax.jit(jax.vmap(train))(keys)`` trains one seed per key.
    """
    ppo = make_ppo(env, config)

    def train(key: jax.Array):
        runner = ppo.init(key)
        return jax.lax.scan(lambda r, _: ppo.update_chunk(r), runner, None, config.num_chunks)

    return train


# --------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------
def summarize_episodes(eps: Any, has_win: bool) -> dict[str, float]:
    """Mean return (± std), mean length and win rate of an
    :class:`envs.rollout.Episodes` batch."""
    ret = np.asarray(eps.episode_return, np.float64)
    out = dict(
        episodes=int(ret.shape[0]),
        return_mean=float(ret.mean()),
        return_std=float(ret.std()),
        length_mean=float(np.asarray(eps.length).mean()),
    )
    if has_win:
        out["win_rate"] = float(np.asarray(eps.won).mean())
    return out


def evaluate(
    env: MultiAgentEnv, policy: Any, params: Any, key: jax.Array, num_episodes: int = 128
) -> dict[str, float]:
    """Mean episodic return (± std), win rate (if the env has one) and length
    over ``num_episodes`` complete episodes of :func:`envs.run_episodes`
    (jitted; the compiled program is cached per ``(env, policy)`` object)."""
    eps = _jit_run_episodes(env, policy, num_episodes)(params, key)
    return summarize_episodes(eps, env.spec.has_win)


@functools.lru_cache(maxsize=32)
def _jit_run_episodes(env, policy, num_episodes):
    return jax.jit(lambda params, key: envs.run_episodes(env, policy, params, key, num_episodes))


# --------------------------------------------------------------------------
# Driver: chunks, progress bar, metrics, checkpoints, resume
# --------------------------------------------------------------------------
TEACHER_FILE = "teacher.json"
METRICS_FILE = "metrics.jsonl"
CKPT_DIR = "checkpoints"


def checkpoint_chunks(num_chunks: int, num_checkpoints: int) -> list[int]:
    """Chunk indices (1-based) after which a checkpoint is saved: evenly
    spaced, the last one always at the end of the run."""
    if num_checkpoints < 1:
        raise ValueError(f"num_checkpoints must be >= 1, got {num_checkpoints}")
    k = min(num_checkpoints, num_chunks)
    return sorted({max(1, round(i * num_chunks / k)) for i in range(1, k + 1)})


class _Program:
    """The compiled pieces of one (env, config) pair. Cached per process (see
    :func:`_program`) so that a resume, or a second run with the same config,
    does not compile again."""

    def __init__(self, env_id: str, env_kwargs_items: tuple, config: PPOConfig,
                 compiler_items: tuple = ()):
        self.env = envs.make(env_id, **dict(env_kwargs_items))
        self.spec = self.env.spec
        self.ppo = make_ppo(self.env, config)
        self.compiler_options = dict(compiler_items) or None
        self._init = None
        self._chunk = None
        self._eval = {}

    def _compile(self, fn, *args):
        return jax.jit(fn).lower(*args).compile(self.compiler_options)

    def init(self, key: jax.Array) -> RunnerState:
        if self._init is None:
            self._init = self._compile(self.ppo.init, key)
        return self._init(key)

    def chunk(self, runner: RunnerState):
        """Ahead-of-time compiled ``update_chunk`` (first chunk timings stay
        honest); returns ``(executable, compile_seconds)``."""
        if self._chunk is None:
            t0 = time.time()
            self._chunk = (self._compile(self.ppo.update_chunk, runner), time.time() - t0)
        return self._chunk

    def evaluate(self, params: Any, key: jax.Array, num_episodes: int) -> dict[str, dict]:
        """Stochastic and deterministic evaluation with ONE compiled program
        (the mode is a traced flag)."""
        if num_episodes not in self._eval:
            stoch = make_policy(self.spec, self.ppo.config, deterministic=False)
            greedy = make_policy(self.spec, self.ppo.config, deterministic=True)

            def policy(p, obs, avail, key):
                actor_params, det = p
                return jax.lax.cond(det, greedy, stoch, actor_params, obs, avail, key)

            self._eval[num_episodes] = self._compile(
                lambda p, det, k: envs.run_episodes(self.env, policy, (p, det), k, num_episodes),
                params, jnp.bool_(False), key,
            )
        run = self._eval[num_episodes]
        has_win = self.spec.has_win
        return dict(
            eval_stochastic=summarize_episodes(run(params, jnp.bool_(False), key), has_win),
            eval_deterministic=summarize_episodes(run(params, jnp.bool_(True), key), has_win),
        )

    @functools.lru_cache(maxsize=8)
    def random_baseline(self, num_episodes: int, seed: int) -> dict:
        key = jax.random.fold_in(jax.random.PRNGKey(seed), 0x5EED)
        policy = random_policy(self.spec)
        run = self._compile(
            lambda k: envs.run_episodes(self.env, policy, None, k, num_episodes), key
        )
        return summarize_episodes(run(key), self.spec.has_win)


@functools.lru_cache(maxsize=8)
def _program(
    env_id: str, env_kwargs_items: tuple, config: PPOConfig, compiler_items: tuple = ()
) -> _Program:
    return _Program(env_id, env_kwargs_items, config, compiler_items)


def _ckptr():
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer()


def _save_tree(path: str, tree: Any) -> None:
    """Save a pytree's leaves with orbax (as ``{"leaf_<i>": array}``: any
    container type works, and zero-size leaves, which orbax refuses, are
    skipped and rebuilt from the template on restore)."""
    leaves = jax.tree.leaves(tree)
    flat = {f"leaf_{i:05d}": np.asarray(x) for i, x in enumerate(leaves) if np.size(x) > 0}
    ck = _ckptr()
    ck.save(os.path.abspath(path), flat, force=True)
    ck.wait_until_finished()


def _restore_tree(path: str, like: Any) -> Any:
    """Restore what :func:`_save_tree` wrote into the structure of ``like``
    (a pytree of arrays or ``jax.ShapeDtypeStruct``)."""
    leaves, treedef = jax.tree.flatten(like)
    abstract = {
        f"leaf_{i:05d}": jax.ShapeDtypeStruct(tuple(np.shape(x)), np.dtype(x.dtype))
        for i, x in enumerate(leaves)
        if np.prod(np.shape(x), dtype=np.int64) > 0
    }
    ck = _ckptr()
    try:
        flat = ck.restore(os.path.abspath(path), abstract)
    except Exception as e:  # noqa: BLE001 - re-raised with context
        raise ValueError(
            f"checkpoint {path} does not match the expected structure "
            f"({len(abstract)} arrays); was it written with another config or env?"
        ) from e
    out = [
        jnp.asarray(flat[f"leaf_{i:05d}"]) if f"leaf_{i:05d}" in flat
        else jnp.zeros(np.shape(x), x.dtype)
        for i, x in enumerate(leaves)
    ]
    return jax.tree.unflatten(treedef, out)


def _write_json(path: str, obj: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=_json_default)
    os.replace(tmp, path)


def _json_default(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def _jsonable_metrics(m: dict) -> dict:
    out = {}
    for k, v in m.items():
        v = np.asarray(v).item()
        out[k] = None if isinstance(v, float) and not math.isfinite(v) else v
    return out


def _list_checkpoints(out_dir: str) -> list[int]:
    d = os.path.join(out_dir, CKPT_DIR)
    if not os.path.isdir(d):
        return []
    steps = []
    for name in os.listdir(d):
        if name.isdigit() and os.path.exists(os.path.join(d, name, "checkpoint.json")):
            steps.append(int(name))
    return sorted(steps)


def train_teacher(
    env_id: str,
    config: PPOConfig,
    seed: int,
    out_dir: str,
    num_checkpoints: int = 5,
    eval_episodes: int = 128,
    resume: bool = False,
    env_kwargs: Optional[dict] = None,
    stop_after_chunks: Optional[int] = None,
    progress: bool = True,
    compiler_options: Optional[dict] = None,
) -> dict:
    """Train an IPPO/MAPPO teacher chunk by chunk and write it to ``out_dir``.

    Layout::

        out_dir/teacher.json         env id, algo, config, spec, random baseline,
                                     checkpoints with their evaluations
        out_dir/metrics.jsonl        one line per chunk (training-rollout stats)
        out_dir/checkpoints/<env_steps>/actor/      orbax: actor params
        out_dir/checkpoints/<env_steps>/runner/     orbax: full RunnerState
                                                    (latest checkpoint only)
        out_dir/checkpoints/<env_steps>/checkpoint.json   its evaluation

    Checkpoints are evenly spaced over the run (``num_checkpoints``, the last
    at the end). Each is evaluated with :func:`envs.run_episodes` on
    ``eval_episodes`` episodes (same reset keys for every checkpoint), with
    the stochastic policy (the one used to generate data) and
    deterministically (greedy action / squashed Gaussian mean).

    ``resume=True`` continues from the latest checkpoint's runner state; the
    result is bit-identical to an uninterrupted run. Without it, an ``out_dir``
    that already holds checkpoints is an error. ``stop_after_chunks`` stops
    after that chunk (as a kill would), for tests and time-boxed runs.
    ``compiler_options`` go to XLA (``jax.stages.Lowered.compile``), e.g.
    ``{"xla_backend_optimization_level": 0}`` halves CPU compile time for smoke
    runs (and slows the run down).

    Returns the ``teacher.json`` content.
    """
    if not isinstance(config, PPOConfig):
        raise TypeError(f"config must be a PPOConfig, got {type(config).__name__}")
    if isinstance(eval_episodes, bool) or not isinstance(eval_episodes, int) or eval_episodes < 1:
        raise ValueError(f"eval_episodes must be a positive integer, got {eval_episodes!r}")
    session_start = time.time()
    env_kwargs = dict(env_kwargs or {})
    ckpt_chunks = checkpoint_chunks(config.num_chunks, num_checkpoints)
    teacher_path = os.path.join(out_dir, TEACHER_FILE)
    metrics_path = os.path.join(out_dir, METRICS_FILE)
    existing = _list_checkpoints(out_dir)
    header = dict(
        env_id=env_id,
        env_kwargs=env_kwargs,
        algo=config.algo,
        seed=int(seed),
        config=config.to_dict(),
        eval_episodes=int(eval_episodes),
        eval_note="stochastic = actions sampled from the policy (as used for data); "
        "deterministic = greedy action / squashed Gaussian mean; the same "
        "eval_episodes reset keys for every checkpoint",
        checkpoint_chunks=ckpt_chunks,
    )
    old = None
    if existing:
        if not resume:
            raise FileExistsError(
                f"{out_dir} already has checkpoints {existing}; pass resume=True "
                f"(--resume) to continue, or choose an empty out_dir"
            )
        with open(teacher_path) as f:
            old = json.load(f)
        for k in ("env_id", "env_kwargs", "seed", "config", "checkpoint_chunks"):
            if old.get(k) != json.loads(json.dumps(header[k])):
                raise ValueError(
                    f"cannot resume {out_dir}: its {k} is {old.get(k)!r} but this run has "
                    f"{header[k]!r} (num_checkpoints must match too)"
                )

    prog = _program(env_id, tuple(sorted(env_kwargs.items())), config,
                    tuple(sorted((compiler_options or {}).items())))
    spec = prog.spec
    header["spec"] = spec.to_dict()
    os.makedirs(os.path.join(out_dir, CKPT_DIR), exist_ok=True)
    k_init, k_eval = jax.random.split(jax.random.PRNGKey(seed))

    start_chunk, wall = 0, 0.0
    if old is not None:
        with_state = [s for s in existing
                      if os.path.isdir(os.path.join(out_dir, CKPT_DIR, str(s), "runner"))]
        if not with_state:
            raise FileNotFoundError(f"no runner state to resume from in {out_dir}/{CKPT_DIR}")
        step = with_state[-1]
        like = jax.eval_shape(prog.ppo.init, k_init)
        runner = _restore_tree(os.path.join(out_dir, CKPT_DIR, str(step), "runner"), like)
        start_chunk = int(runner.update) // config.updates_per_chunk
        # Drop checkpoints and metrics written after the state we resume from.
        for s in existing:
            if s > step:
                shutil.rmtree(os.path.join(out_dir, CKPT_DIR, str(s)))
        wall = _truncate_metrics(metrics_path, start_chunk)
        header["random_baseline"] = old.get("random_baseline")
    else:
        runner = prog.init(k_init)
        if os.path.exists(metrics_path):
            os.remove(metrics_path)
        header["random_baseline"] = prog.random_baseline(eval_episodes, seed)
        _write_json(teacher_path, dict(header, checkpoints=[], complete=False))

    def save_checkpoint(runner, chunk, wall):
        step = int(runner.update) * config.batch_size
        cdir = os.path.join(out_dir, CKPT_DIR, str(step))
        params = runner.actor.params
        _save_tree(os.path.join(cdir, "actor"), params)
        _save_tree(os.path.join(cdir, "runner"), runner)
        info = dict(step=step, update=int(runner.update), chunk=chunk, wall_time_s=wall,
                    **prog.evaluate(params, k_eval, eval_episodes))
        _write_json(os.path.join(cdir, "checkpoint.json"), info)
        # Keep the full runner state for the latest checkpoint only.
        for s in _list_checkpoints(out_dir):
            rdir = os.path.join(out_dir, CKPT_DIR, str(s), "runner")
            if s != step and os.path.isdir(rdir):
                shutil.rmtree(rdir)
        return info

    def write_teacher(complete, wall):
        ckpts = []
        for s in _list_checkpoints(out_dir):
            with open(os.path.join(out_dir, CKPT_DIR, str(s), "checkpoint.json")) as f:
                ckpts.append(json.load(f))
        # wall_time_s: training chunks only (all sessions); session_elapsed_s:
        # this call, with compilation, evaluations and checkpoint writes.
        doc = dict(header, checkpoints=ckpts, complete=complete, wall_time_s=wall,
                   session_elapsed_s=time.time() - session_start,
                   env_steps=int(runner.update) * config.batch_size)
        _write_json(teacher_path, doc)
        return doc

    chunk_exec, compile_s = prog.chunk(runner)
    end_chunk = config.num_chunks
    if stop_after_chunks is not None:
        end_chunk = min(end_chunk, stop_after_chunks)
    steps_per_chunk = config.updates_per_chunk * config.batch_size
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=config.env_steps, initial=start_chunk * steps_per_chunk, unit="step",
            unit_scale=True, desc=f"{config.algo} {env_id}", dynamic_ncols=True,
            mininterval=5.0,
        )
    with open(metrics_path, "a") as mf:
        for chunk in range(start_chunk + 1, end_chunk + 1):
            t = time.time()
            runner, m = chunk_exec(runner)
            m = jax.device_get(m)
            dt = time.time() - t
            wall += dt
            rec = dict(chunk=chunk, update=int(runner.update), **_jsonable_metrics(m))
            rec.update(env_steps_per_s=steps_per_chunk / dt, chunk_time_s=dt, wall_time_s=wall)
            if chunk == start_chunk + 1:
                rec["compile_s"] = compile_s
            mf.write(json.dumps(rec) + "\n")
            mf.flush()
            if bar is not None:
                post = {"ret": "-" if rec["return_mean"] is None else f"{rec['return_mean']:.3g}"}
                if rec.get("win_rate") is not None:
                    post["win"] = f"{rec['win_rate']:.2f}"
                post["sps"] = f"{rec['env_steps_per_s']:.0f}"
                bar.set_postfix(post, refresh=False)
                bar.update(steps_per_chunk)
            if chunk in ckpt_chunks:
                info = save_checkpoint(runner, chunk, wall)
                write_teacher(complete=False, wall=wall)
                if bar is not None:
                    ev = info["eval_stochastic"]
                    msg = f"checkpoint {info['step']}: eval return {ev['return_mean']:.3f}"
                    if "win_rate" in ev:
                        msg += f", win rate {ev['win_rate']:.3f}"
                    bar.write(msg)
    if bar is not None:
        bar.close()
    return write_teacher(complete=int(runner.update) == config.num_updates, wall=wall)


def _truncate_metrics(path: str, upto_chunk: int) -> float:
    """Keep metric lines of chunks <= upto_chunk; return their wall time."""
    if not os.path.exists(path):
        return 0.0
    keep, wall = [], 0.0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec["chunk"] <= upto_chunk:
                keep.append(line if line.endswith("\n") else line + "\n")
                wall = rec.get("wall_time_s", wall)
    with open(path + ".tmp", "w") as f:
        f.writelines(keep)
    os.replace(path + ".tmp", path)
    return wall


# --------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------
def load_teacher(
    out_dir: str, step: Optional[int] = None, deterministic: bool = False
) -> tuple[Callable, Any, EnvSpec]:
    """Load a teacher written by :func:`train_teacher`.

    Args:
      out_dir: the run directory (holds ``teacher.json``).
      step: environment-step count of the checkpoint; ``None`` = the latest.
      deterministic: return the greedy / mean-action policy instead of the
        stochastic one.

    Returns:
      ``(policy, params, spec)``: ``policy(params, obs [N, O], avail [N, A],
      key) -> actions`` for one environment, usable with
      :func:`envs.run_episodes`; the actor parameters; the :class:`EnvSpec`.
    """
    path = os.path.join(out_dir, TEACHER_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: is {out_dir} a train_teacher output?")
    with open(path) as f:
        doc = json.load(f)
    steps = _list_checkpoints(out_dir)
    if not steps:
        raise FileNotFoundError(f"{out_dir} has no checkpoints yet")
    if step is None:
        step = steps[-1]
    elif int(step) not in steps:
        raise ValueError(f"no checkpoint at step {step} in {out_dir}; available: {steps}")
    config = PPOConfig.from_dict(doc["config"])
    spec = EnvSpec.from_dict(doc["spec"])
    actor = make_actor(spec, config)
    like = jax.eval_shape(
        actor.init, jax.random.PRNGKey(0), jnp.zeros((spec.num_agents, spec.obs_dim))
    )
    params = _restore_tree(os.path.join(out_dir, CKPT_DIR, str(int(step)), "actor"), like)
    return make_policy(spec, config, deterministic=deterministic), params, spec


def list_teacher_checkpoints(out_dir: str) -> list[dict]:
    """The checkpoint entries of ``teacher.json`` (step, evaluations, ...)."""
    with open(os.path.join(out_dir, TEACHER_FILE)) as f:
        return json.load(f)["checkpoints"]
