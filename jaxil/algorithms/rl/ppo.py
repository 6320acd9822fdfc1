"""IPPO and MAPPO, PureJaxRL style: the whole run is one jitted program.

Teachers are the demonstrators of jaxil: we train them with PPO, keep their
actor parameters at several points of training and roll them out to build
mixed-quality datasets. This module is the training program; the config is in
[`jaxil.algorithms.rl.config`][jaxil.algorithms.rl.config], the clipped losses
and GAE in [`jaxil.losses`][jaxil.losses], the driver (chunks, checkpoints,
evaluation, resume) in [`jaxil.teachers.train`][jaxil.teachers.train] and the
run directory (loading, shipped teachers) in
[`jaxil.teachers.io`][jaxil.teachers.io].

`make_train(env, config) -> train(key)` runs the whole training
(environment steps in `lax.scan`, GAE, epochs × minibatches in `lax.scan`)
and is jittable and vmappable over seeds:

```python
train = make_train(envs.make("smax:3m"), PPOConfig(algo="mappo"))
runner, metrics = jax.jit(jax.vmap(train))(jax.random.split(key, 4))
```

`make_ppo(env, config)` exposes the pieces: `init(key) -> RunnerState` and
`update_chunk(runner) -> (runner, metrics)`, which runs
`config.updates_per_chunk` PPO updates; `update_chunk_checked` also returns the
chunk's [`jaxil.runs.guard.Health`][jaxil.runs.guard.Health] (the driver stops
a diverging run with it).

A learned reward. `make_ppo(env, config, reward_hook=RewardHook(...))` trains
against a reward function instead of the environment's (PPO against a learned
reward, GAIL, AIRL:
[`jaxil.algorithms.irl.adversarial`][jaxil.algorithms.irl.adversarial]). The
hook's state lives in `RunnerState.reward` (`init(key, reward_state)`), so it
is vmapped over seeds and checkpointed with the run. Every update: roll out,
optionally update the reward (`hook.update`, e.g. discriminator steps on this
rollout), score the rollout (`hook.reward`), optionally subtract the KL penalty
towards a reference policy (`hook.kl_coef`, `hook.ref_log_prob`), then the
usual GAE and PPO epochs. The true episodic return is still what `return_mean`
reports; `env_reward` and `learned_reward` give the per-step means of both
rewards (the reward-hacking curve is learned up while true falls).

Model. The actor is a [`jaxil.nn.policy.PolicyNet`][jaxil.nn.policy.PolicyNet]
shared by all agents (one-hot agent id appended, orthogonal initialisation, a
masked categorical or a tanh-Gaussian with a state-independent log-std). The
critic is a [`jaxil.nn.nets.LocalMLP`][jaxil.nn.nets.LocalMLP] with one output:
IPPO evaluates `V(o_i, i)` on the agent's own observation, MAPPO `V(s, i)` on
the global state. Both are trained on the team reward.

Observation normalisation (`PPOConfig.normalize_obs`, the MuJoCo robots): the
actor and the critic standardise their inputs by running per-feature statistics
([`jaxil.nn.running_stats`][jaxil.nn.running_stats]) held in their parameters.
Each update's rollout is folded in after its epochs, so the epochs score
actions under the statistics they were sampled with; no gradient reaches them,
so Adam leaves them as they are.

Conventions worth knowing:

- An episode boundary (`done` or `truncated`) stops the GAE recursion: the
  auto-reset wrapper hands back the next episode's first observation, so time
  limits are treated as terminal, as in PureJaxRL/JaxMARL.
- For box actions the buffer stores the pre-squash Gaussian draw `u` (see
  [`jaxil.nn.policy`][jaxil.nn.policy], "raw actions").
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from flax.training.train_state import TrainState

from jaxil.envs.core import EnvSpec, MultiAgentEnv
from jaxil.envs.policies import Policy
from jaxil.envs.wrappers import AutoReset
from jaxil.runs import guard
from jaxil.losses.adversarial import kl_penalized_reward
from jaxil.losses.gae import gae
from jaxil.losses.ppo import clipped_surrogate_loss, clipped_value_loss, normalize_advantages
from jaxil.nn import running_stats
from jaxil.nn.nets import LocalMLP, activation, orthogonal_init
from jaxil.nn.policy import PolicyNet
from jaxil.algorithms.rl.config import PPOConfig


def make_actor(spec: EnvSpec, config: PPOConfig) -> PolicyNet:
    """The teacher's actor for `spec`: a shared-parameter
    [`PolicyNet`][jaxil.nn.policy.PolicyNet] with the PPO initialisation and a
    state-independent log-std."""
    return PolicyNet(spec, config.hidden_sizes, shared=True, activation=config.activation,
                     init="orthogonal", log_std="param", log_std_init=config.log_std_init,
                     obs_norm=config.normalize_obs)


def make_critic(spec: EnvSpec, config: PPOConfig) -> LocalMLP:
    """The critic: `x [..., N, D] -> [..., N, 1]` with the agent id appended."""
    hidden_init, out_init = orthogonal_init(1.0)
    return LocalMLP(out_dim=1, num_agents=spec.num_agents, hidden=config.hidden_sizes,
                    shared=True, activation=activation(config.activation),
                    kernel_init=hidden_init, out_kernel_init=out_init)


@functools.lru_cache(maxsize=64)
def make_policy(spec: EnvSpec, config: PPOConfig, deterministic: bool = False) -> Policy:
    """A teacher's [`envs.policies.Policy`][jaxil.envs.policies.Policy] for ONE
    environment, usable with [`envs.rollout`][jaxil.envs.rollout] /
    [`envs.run_episodes`][jaxil.envs.rollout.run_episodes] and everything else
    that takes a policy: `act(actor_params, obs [N, O], avail [N, A], key,
    carry)`, `log_prob` and `entropy`.

    `deterministic=True` takes the most likely available action (discrete) or
    the squashed Gaussian mean (box). Cached: equal arguments give the same
    object, so jitted rollouts of it compile once.
    """
    return make_actor(spec, config).policy(deterministic)


class RunnerState(NamedTuple):
    """Everything a run carries between updates (a pytree; checkpointed whole)."""

    actor: TrainState
    critic: TrainState
    env_state: Any
    timestep: Any
    key: jax.Array
    update: jax.Array  # [] int32, PPO updates done
    # The state of a RewardHook (None, no leaves, when training on the
    # environment's reward: teacher checkpoints keep their layout).
    reward: Any = None


class RewardBatch(NamedTuple):
    """One rollout as a reward function sees it (time-major, `[T, E, ...]`).

    `next_obs`/`next_global_state` are the observation after the step;
    where `last` (the episode ended, by termination or time limit) they are
    the next episode's first (auto-reset), so a reward of `s'` must mask
    them with `last` (time limits count as terminal, as in the GAE).
    """

    obs: jax.Array  # [T, E, N, O]
    global_state: jax.Array  # [T, E, S]
    avail: jax.Array  # [T, E, N, A]
    action: jax.Array  # [T, E, N] int32 or [T, E, N, D] environment actions
    next_obs: jax.Array  # [T, E, N, O]
    next_global_state: jax.Array  # [T, E, S]
    last: jax.Array  # [T, E] bool
    env_reward: jax.Array  # [T, E] the environment's team reward


class RewardHook(NamedTuple):
    """A learned reward for [`make_ppo`][jaxil.algorithms.rl.ppo.make_ppo] (see
    the module docstring).

    Attributes:
      reward: `(reward_state, actor_params, batch: RewardBatch) -> [T, E]`
        team rewards, or `[T, E, N]` one per agent.
      update: optional `(reward_state, actor_params, batch, key) ->
        (reward_state, metrics)` run on each rollout before it is scored
        (`metrics`: scalars, logged per chunk as their mean).
      kl_coef: β of the KL penalty `r − β Σ_i (log π_θ(a_i|o_i) − log
        π_ref(a_i|o_i))` (0: none). Needs `ref_log_prob`.
      ref_log_prob: `(reward_state, obs [.., N, O], avail, actions) ->
        [.., N]` log-probabilities of the reference policy (π_SFT).
      guarded: names of `update`'s metrics the non-finite guard watches.
    """

    reward: Callable[[Any, Any, RewardBatch], jax.Array]
    update: Optional[Callable[[Any, Any, RewardBatch, jax.Array], tuple[Any, dict]]] = None
    kl_coef: float = 0.0
    ref_log_prob: Optional[Callable[..., jax.Array]] = None
    guarded: tuple[str, ...] = ()


class Transition(NamedTuple):
    obs: jax.Array  # [E, N, O]
    global_state: jax.Array  # [E, S] (MAPPO) or [E, 0] (IPPO)
    avail: jax.Array  # [E, N, A]
    raw_action: jax.Array  # [E, N] int32 or [E, N, D] pre-squash
    logp: jax.Array  # [E, N]
    value: jax.Array  # [E, N]
    reward: jax.Array  # [E] (a learned reward: [E] or [E, N])
    last: jax.Array  # [E] episode ended with this step
    episode_return: jax.Array  # [E]
    won: jax.Array  # [E]
    # With a RewardHook: (global_state [E, S], env action, next obs, next
    # global state) of the step; None otherwise (no extra memory).
    step: Any = None


class PPO(NamedTuple):
    """The pure pieces of a run; see [`make_ppo`][jaxil.algorithms.rl.ppo.make_ppo]."""

    env: MultiAgentEnv
    config: PPOConfig
    actor: PolicyNet
    critic: LocalMLP
    init: Callable[[jax.Array], RunnerState]
    update_chunk: Callable[[RunnerState], tuple[RunnerState, dict]]
    update_chunk_checked: Callable[[RunnerState], tuple[RunnerState, dict, guard.Health]]


# The per-update quantities the non-finite guard watches (with the parameters).
GUARDED = ("actor_loss", "value_loss", "entropy", "approx_kl")


def make_ppo(env: MultiAgentEnv, config: PPOConfig,
             reward_hook: Optional[RewardHook] = None) -> PPO:
    """Build `init(key[, reward_state]) -> RunnerState` and
    `update_chunk(runner) -> (runner, metrics)` (`config.updates_per_chunk`
    PPO updates).

    Both are pure and jittable, and vmappable over a leading seed axis.
    `metrics` are scalars summarising the chunk: `episodes` (finished in the
    training rollouts), `return_mean`, `win_rate` (NaN when no episode
    finished), `actor_loss`, `value_loss`, `entropy`, `approx_kl`, `clip_frac`,
    `lr`, `env_steps` (total so far). `update_chunk_checked(runner) -> (runner,
    metrics, health)` is the same chunk plus
    [`jaxil.runs.guard.health`][jaxil.runs.guard.health] of the per-update
    losses (`GUARDED`, `[updates_per_chunk]` each) and of the actor and critic
    parameters after the chunk.

    With `reward_hook` ([`RewardHook`][jaxil.algorithms.rl.ppo.RewardHook]) PPO
    optimises its reward instead of the environment's;
    `init(key, reward_state)` stores the hook's state in the runner, and the
    metrics gain `env_reward` and `learned_reward` (per-step means over the
    chunk's rollouts), `kl` (per-step Σ_i log π_θ − log π_ref, with a KL
    penalty) and the means of the hook's update metrics; the guard also watches
    those named in `hook.guarded` and the reward state.
    """
    if not isinstance(config, PPOConfig):
        raise TypeError(f"config must be a PPOConfig, got {type(config).__name__}")
    hook = reward_hook
    if hook is not None:
        if not isinstance(hook, RewardHook):
            raise TypeError(f"reward_hook must be a RewardHook, got {type(hook).__name__}")
        if not (isinstance(hook.kl_coef, (int, float)) and hook.kl_coef >= 0):
            raise ValueError(f"RewardHook.kl_coef must be a number >= 0, got {hook.kl_coef!r}")
        if hook.kl_coef > 0 and hook.ref_log_prob is None:
            raise ValueError("RewardHook.kl_coef > 0 needs ref_log_prob (the reference "
                             "policy's log-probabilities)")
    spec = env.spec
    env = env if isinstance(env, AutoReset) else AutoReset(env)
    cfg = config
    n, E, T = spec.num_agents, cfg.num_envs, cfg.num_steps
    mappo = cfg.algo == "mappo"
    actor = make_actor(spec, cfg)
    critic = make_critic(spec, cfg)
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

    # With normalize_obs the critic's parameters are {"net": variables,
    # "in_stats": RunningStats of its input}, as the actor's hold "obs_stats".
    def value_fn(params, obs, global_state):
        x = critic_input(obs, global_state)
        if cfg.normalize_obs:
            return critic.apply(params["net"], running_stats.normalize(params["in_stats"], x))[
                ..., 0]
        return critic.apply(params, x)[..., 0]

    def critic_init(key, x):
        variables = critic.init(key, x)
        if cfg.normalize_obs:
            return {"net": variables, "in_stats": running_stats.init(x.shape[-1])}
        return variables

    def with_stats(actor_ts, critic_ts, traj):
        """Fold the rollout's observations into the running statistics (after
        the epochs, so the epochs score actions with the statistics they
        were sampled under)."""
        if not cfg.normalize_obs:
            return actor_ts, critic_ts
        x = critic_input(traj.obs, traj.global_state)
        cp = critic_ts.params
        return (actor_ts.replace(params=actor.with_obs_stats(actor_ts.params, traj.obs)),
                critic_ts.replace(params={**cp, "in_stats": running_stats.update(cp["in_stats"],
                                                                                 x)}))

    def init(key: jax.Array, reward_state: Any = None) -> RunnerState:
        if (reward_state is None) != (hook is None):
            raise ValueError("init needs a reward_state exactly when make_ppo has a reward_hook")
        k_actor, k_critic, k_env, key = jax.random.split(key, 4)
        obs0 = jnp.zeros((n, spec.obs_dim), jnp.float32)
        gs0 = jnp.zeros((spec.state_dim,), jnp.float32)
        actor_ts = TrainState.create(apply_fn=actor.head, params=actor.init(k_actor), tx=make_tx())
        critic_ts = TrainState.create(
            apply_fn=critic.apply, params=critic_init(k_critic, critic_input(obs0, gs0)),
            tx=make_tx(),
        )
        env_state, ts = jax.vmap(env.reset)(jax.random.split(k_env, E))
        return RunnerState(actor_ts, critic_ts, env_state, ts, key, jnp.int32(0), reward_state)

    def env_step(carry, _):
        actor_ts, critic_ts, env_state, ts, key = carry
        key, k_act = jax.random.split(key)
        raw, logp = actor.sample_raw(actor_ts.params, ts.obs, ts.avail_actions, k_act)
        value = value_fn(critic_ts.params, ts.obs, ts.global_state)
        env_state, nts = jax.vmap(env.step)(env_state, actor.to_env_action(raw))
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
            step=None if hook is None else (ts.global_state, actor.to_env_action(raw),
                                            nts.obs, nts.global_state),
        )
        return (actor_ts, critic_ts, env_state, nts, key), tr

    def learned_reward(reward_state, actor_params, traj: Transition, key):
        """Replace `traj.reward` by the hook's (after its update, minus the
        KL penalty); returns the new reward state, trajectory and stats."""
        gs, action, next_obs, next_gs = traj.step
        batch = RewardBatch(obs=traj.obs, global_state=gs, avail=traj.avail, action=action,
                            next_obs=next_obs, next_global_state=next_gs, last=traj.last,
                            env_reward=traj.reward)
        stats = {}
        if hook.update is not None:
            reward_state, stats = hook.update(reward_state, actor_params, batch, key)
            stats = dict(stats)
        r = hook.reward(reward_state, actor_params, batch)
        if r.shape not in (traj.reward.shape, traj.value.shape):
            raise ValueError(f"RewardHook.reward returned shape {r.shape}; expected "
                             f"{traj.reward.shape} (team) or {traj.value.shape} (per agent)")
        team = r if r.ndim == traj.reward.ndim else r.sum(-1)
        stats.update(env_reward=jnp.mean(traj.reward), learned_reward=jnp.mean(team))
        if hook.kl_coef > 0:
            logp = actor.log_prob(actor_params, traj.obs, traj.avail, action)
            ref = hook.ref_log_prob(reward_state, traj.obs, traj.avail, action)
            r = kl_penalized_reward(r, logp, ref, hook.kl_coef)
            stats["kl"] = jnp.mean(jnp.sum(logp - ref, axis=-1))
        return reward_state, traj._replace(reward=r.astype(jnp.float32), step=None), stats

    def advantages(traj: Transition, last_value: jax.Array):
        r = traj.reward * cfg.reward_scale  # [T, E] team or [T, E, N] per agent
        reward = jnp.broadcast_to(r if r.ndim == traj.value.ndim else r[..., None],
                                  traj.value.shape)
        last = jnp.broadcast_to(traj.last[..., None], traj.value.shape)
        return gae(reward, traj.value, last, last_value, cfg.gamma, cfg.gae_lambda)

    def losses(actor_params, critic_params, mb: Transition, adv, target):
        logp, entropy = actor.raw_log_prob_entropy(actor_params, mb.obs, mb.avail, mb.raw_action)
        if cfg.normalize_advantages:
            adv = normalize_advantages(adv)
        pg, stats = clipped_surrogate_loss(logp, mb.logp, adv, cfg.clip_eps)
        ent = jnp.mean(entropy)
        value = value_fn(critic_params, mb.obs, mb.global_state)
        value_loss = clipped_value_loss(value, mb.value, target, cfg.clip_eps)
        aux = dict(actor_loss=pg, value_loss=value_loss, entropy=ent,
                   approx_kl=stats.approx_kl, clip_frac=stats.clip_frac)
        return pg - cfg.ent_coef * ent + cfg.vf_coef * value_loss, aux

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
        reward_state, hook_stats = runner.reward, {}
        if hook is not None:
            key, k_reward = jax.random.split(key)
            reward_state, traj, hook_stats = learned_reward(reward_state, actor_ts.params, traj,
                                                            k_reward)
        last_value = value_fn(critic_ts.params, ts.obs, ts.global_state)
        adv, target = advantages(traj, last_value)
        key, k_epochs = jax.random.split(key)
        lr = lr_at(_opt_count(actor_ts.opt_state))
        (actor_ts, critic_ts, _), aux = jax.lax.scan(
            update_epoch,
            (actor_ts, critic_ts, (traj, adv, target)),
            jax.random.split(k_epochs, cfg.update_epochs),
        )
        actor_ts, critic_ts = with_stats(actor_ts, critic_ts, traj)
        last = traj.last.astype(jnp.float32)
        stats = dict(
            episodes=last.sum(),
            return_sum=(traj.episode_return * last).sum(),
            win_sum=(traj.won.astype(jnp.float32) * last).sum(),
            lr=lr,
            **jax.tree.map(jnp.mean, aux),
            **hook_stats,
        )
        runner = RunnerState(actor_ts, critic_ts, env_state, ts, key, runner.update + 1,
                             reward_state)
        return runner, stats

    base_keys = ("episodes", "return_sum", "win_sum", "lr", "actor_loss", "value_loss",
                 "entropy", "approx_kl", "clip_frac")

    def run_chunk(runner: RunnerState) -> tuple[RunnerState, dict, dict]:
        runner, stats = jax.lax.scan(update, runner, None, cfg.updates_per_chunk)
        hook_keys = [k for k in stats if k not in base_keys]
        episodes = stats["episodes"].sum()
        safe = jnp.maximum(episodes, 1.0)
        metrics = dict(
            env_steps=runner.update * cfg.batch_size,
            episodes=episodes,
            return_mean=jnp.where(episodes > 0, stats["return_sum"].sum() / safe, jnp.nan),
            win_rate=jnp.where(episodes > 0, stats["win_sum"].sum() / safe, jnp.nan),
            **{k: stats[k].mean() for k in
               ("actor_loss", "value_loss", "entropy", "approx_kl", "clip_frac", "lr")},
            **{k: v.mean() for k, v in stats.items() if k in hook_keys},
        )
        if not spec.has_win:
            del metrics["win_rate"]
        return runner, metrics, stats

    def update_chunk(runner: RunnerState) -> tuple[RunnerState, dict]:
        runner, metrics, _ = run_chunk(runner)
        return runner, metrics

    def update_chunk_checked(runner: RunnerState) -> tuple[RunnerState, dict, guard.Health]:
        runner, metrics, stats = run_chunk(runner)
        watched = GUARDED + (() if hook is None else ("learned_reward",) + tuple(hook.guarded))
        health = guard.health({k: stats[k] for k in watched},
                              (runner.actor.params, runner.critic.params, runner.reward))
        return runner, metrics, health

    return PPO(env=env, config=cfg, actor=actor, critic=critic, init=init,
               update_chunk=update_chunk, update_chunk_checked=update_chunk_checked)


def _opt_count(opt_state) -> jax.Array:
    """Adam's step count inside `chain(clip, adam)`."""
    return opt_state[1][0].count


def make_train(env: MultiAgentEnv, config: PPOConfig,
               reward_hook: Optional[RewardHook] = None) -> Callable:
    """`train(key[, reward_state]) -> (RunnerState,
    metrics)`: the whole run as one pure function (`config.num_chunks` chunks
    of `updates_per_chunk` updates). `metrics` leaves have a leading
    `[num_chunks]` axis (a learning curve). `jax.jit(jax.vmap(train))(keys)`
    trains one seed per key. `reward_hook`: see
    [`make_ppo`][jaxil.algorithms.rl.ppo.make_ppo].
    """
    ppo = make_ppo(env, config, reward_hook)

    def train(key: jax.Array, reward_state: Any = None):
        runner = ppo.init(key, reward_state)
        return jax.lax.scan(lambda r, _: ppo.update_chunk(r), runner, None, config.num_chunks)

    return train
