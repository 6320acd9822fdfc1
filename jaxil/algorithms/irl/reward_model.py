"""Discriminator reward models between two sample sources (AfD-style IRL).

A reward model is a discriminator between *negative* and *positive* samples
of state-action steps; its logit is the reward (Sun & van der Schaar, "Inverse
RL from demonstrations", arXiv 2405.15624). The
sources (`SOURCES`, negatives → positives):

- `"init-sft"`: rollouts of the initial policy π_0 → rollouts of π_SFT
  (BC on the demonstrations; the least heterogeneous pair, AfD's proposal);
- `"init-demo"`: rollouts of π_0 → the demonstrations;
- `"sft-demo"`: rollouts of π_SFT → the demonstrations (the most prone to
  reward hacking).

Network (the MisoDICE discriminator's,
[`jaxil.nn.mixed_net.MixedNet`][jaxil.nn.mixed_net.MixedNet]): local logits
ℓ_i(o_i, a_i) of each agent's observation and one-hot (or box) action, mixed by
the hypernetwork of the global state into the team reward

    r(s, a) = Σ_i w_i(s)·ℓ_i(o_i, a_i) + b(s),   w_i(s) ≥ 0

(`mixing="hyper"`; `"sum"`: Σ_i ℓ_i; `"none"`: one reward per agent, each agent
its own discriminator). Loss: the logistic discriminator loss
([`jaxil.losses.discriminator_loss`][jaxil.losses.discriminator.discriminator_loss],
positives labelled 1, negatives 0; summed over agents with `"none"`) plus
`gp_coef` × DemoDICE's gradient penalty
([`jaxil.losses.gradient_penalty`][jaxil.losses.discriminator.gradient_penalty],
per agent
[`jaxil.losses.agent_gradient_penalty`][jaxil.losses.discriminator.agent_gradient_penalty]).
At the optimum `r = log d_pos(s, a) / d_neg(s, a)`. A trajectory's score is the
discounted sum of its step rewards over its valid steps
([`jaxil.losses.discounted_score`][jaxil.losses.trajectory.discounted_score]).

The analytic reward `r_c(τ) = log π_SFT(τ) − log π_0(τ)`
([`analytic_reward`][jaxil.algorithms.irl.reward_model.analytic_reward]) is
computed exactly from the two policies' per-step log-probabilities
([`jaxil.losses.log_ratio_score`][jaxil.losses.trajectory.log_ratio_score]).

API (pure functions over pytrees; seeds vmap):

```python
rm = RewardModel(spec, RewardModelConfig(mixing="hyper"))
params = rm.init(key)                                   # or init_params(key, spec, config)
r = rm.step_reward(params, obs, actions, global_state)  # [...] team / [..., N] per agent
loss, metrics = rm.loss(params, positive, negative, key, gp_coef)
state = rm.init_state(key)                              # params + optax state + hparams
state, metrics = rm.update(state, positive, negative)   # one jit-able Adam step
data = RewardData.build(positive_transitions, negative_transitions)
state, metrics, health = rm.update_n(state, data, k)    # k fused steps, batches on device
scores = rm.trajectory_scores(params, episodes, gamma)  # [E] / [E, N]
```

`positive`/`negative` are batches with `obs [B, N, O]`, `actions [B, N(, d)]`
and `global_state [B, S]` (a
[`StepBatch`][jaxil.algorithms.irl.reward_model.StepBatch], or the
[`jaxil.data.sampling.Transitions`][jaxil.data.sampling.Transitions] of a
dataset or rollouts).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxil.envs.core import EnvSpec
from jaxil.data.sampling import Transitions, sample_where
from jaxil.runs.updates import fused_updates
from jaxil.algorithms.offline.base import (NONNEGATIVE, POSITIVE, LearnerState, adam, check_hparams,
                                          init_opt)
from jaxil.losses import (
    agent_gradient_penalty,
    discounted_score,
    discriminator_loss,
    gradient_penalty,
    log_ratio_score,
)
from jaxil.nn.mixed_net import MIXING, MixedNet
from jaxil.nn.policy import encode_actions

# source name -> (negatives, positives)
SOURCES: dict[str, tuple[str, str]] = {
    "init-sft": ("init", "sft"),
    "init-demo": ("init", "demo"),
    "sft-demo": ("sft", "demo"),
}


def source_roles(source: str) -> tuple[str, str]:
    """`(negatives, positives)` of a source name, e.g. `("init", "sft")`."""
    if source not in SOURCES:
        raise ValueError(f"unknown reward source {source!r}; choose one of {', '.join(SOURCES)}")
    return SOURCES[source]


@dataclasses.dataclass(frozen=True)
class RewardModelConfig:
    """Static structure of a reward model.

    Attributes:
      mixing: `"hyper"` (team reward through the hypernetwork mixer),
        `"sum"` (Σ_i ℓ_i) or `"none"` (one reward per agent).
      hidden: hidden widths of the local logit network.
      mixer_hidden: hidden width of the mixer.
      shared: one local network with a one-hot agent id (True) or
        independent per-agent networks (False); None: shared unless
        `mixing="none"` (the DICE learner's convention).
      batch_size: steps per source in each update.
      max_grad_norm: global-norm gradient clipping.
      grad_penalty: add DemoDICE's gradient penalty (weight `gp_coef`).
    """

    mixing: str = "hyper"
    hidden: tuple[int, ...] = (256, 256)
    mixer_hidden: int = 64
    shared: Optional[bool] = None
    batch_size: int = 512
    max_grad_norm: float = 1.0
    grad_penalty: bool = True

    def __post_init__(self):
        if self.mixing not in MIXING:
            raise ValueError(f"mixing must be one of {MIXING}, got {self.mixing!r}")
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        if not self.hidden or any(h <= 0 for h in self.hidden):
            raise ValueError(f"hidden must be positive layer widths, got {self.hidden}")
        if self.mixer_hidden <= 0:
            raise ValueError(f"mixer_hidden must be positive, got {self.mixer_hidden}")
        if self.batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {self.batch_size}")
        if not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be positive, got {self.max_grad_norm}")
        if self.shared is None:
            object.__setattr__(self, "shared", self.mixing != "none")


@struct.dataclass
class RewardModelHParams:
    """The numbers a sweep varies (traced; one per seed under vmap)."""

    lr: jax.Array
    gp_coef: jax.Array  # 0.1 in DemoDICE

    RANGES: ClassVar[dict] = dict(
        lr=POSITIVE, gp_coef=NONNEGATIVE._replace(why="a gradient-penalty weight"))


#: A reward model's training state is a learner's (params, Adam state,
#: hyper-parameters, update count, key).
RewardModelState = LearnerState


@struct.dataclass
class StepBatch:
    """B steps: `obs [B, N, O]`, `actions [B, N]` int (or `[B, N, d]`
    float), `global_state [B, S]`."""

    obs: jax.Array
    actions: jax.Array
    global_state: jax.Array


@struct.dataclass
class RewardData:
    """Both sources on device: all their steps and a `[K]` sampling weight
    each (0 on padding, so that sources of different sizes — e.g. one per
    seed, stacked — share one shape)."""

    positive: Transitions
    positive_weight: jax.Array
    negative: Transitions
    negative_weight: jax.Array

    @staticmethod
    def build(positive: Transitions, negative: Transitions) -> "RewardData":
        """Unpadded sources: every step weighs 1."""
        return RewardData(positive, jnp.ones(positive.reward.shape[0], jnp.float32),
                          negative, jnp.ones(negative.reward.shape[0], jnp.float32))


def pad_transitions(trans: Transitions, size: int) -> tuple[Transitions, np.ndarray]:
    """`trans` padded to `size` steps by repeating step 0, and the `[size]`
    weights (1 on real steps, 0 on padding): stacks sources of different
    sizes on a seeds axis."""
    k = int(trans.reward.shape[0])
    if size < k:
        raise ValueError(f"pad_transitions: size {size} is below the {k} steps held")
    idx = np.concatenate([np.arange(k), np.zeros(size - k, np.int64)])
    out = jax.tree.map(lambda x: None if x is None else np.asarray(x)[idx], trans)
    return out, (np.arange(size) < k).astype(np.float32)


class RewardModel:
    """The reward model of `spec` and `config` (see the module docstring)."""

    def __init__(self, spec: EnvSpec, config: RewardModelConfig = RewardModelConfig()):
        self.spec, self.config = spec, config
        self.per_agent = config.mixing == "none"
        self.net = MixedNet(spec.num_agents, config.mixing, config.hidden, config.mixer_hidden,
                            config.shared)
        self.tx = adam(config.max_grad_norm)

    # -- parameters ------------------------------------------------------------
    def default_hparams(self, lr: float = 3e-4, gp_coef: float = 0.1) -> RewardModelHParams:
        return RewardModelHParams(lr=jnp.float32(lr), gp_coef=jnp.float32(gp_coef))

    def init(self, key: jax.Array) -> Any:
        """Network parameters."""
        n, spec = self.spec.num_agents, self.spec
        obs = jnp.zeros((1, n, spec.obs_dim), jnp.float32)
        dtype = jnp.int32 if spec.discrete else jnp.float32
        act = jnp.zeros((1, n) + spec.action.shape, dtype)
        state = jnp.zeros((1, spec.state_dim), jnp.float32)
        return self.net.init(key, self._input(obs, act), state)

    def init_state(self, key: jax.Array, hparams: Optional[RewardModelHParams] = None
                   ) -> RewardModelState:
        """Parameters, a fresh Adam state (learning rate `hparams.lr`), step 0."""
        hparams = self.default_hparams() if hparams is None else hparams
        k_net, k_state = jax.random.split(key)
        params = self.init(k_net)
        return RewardModelState(params, init_opt(self.tx, params, hparams.lr), hparams,
                                jnp.int32(0), k_state)

    # -- the reward ----------------------------------------------------------------
    def _input(self, obs, actions):
        return jnp.concatenate([jnp.asarray(obs, jnp.float32),
                                encode_actions(self.spec, actions)], -1)

    def step_reward(self, params: Any, obs: jax.Array, actions: jax.Array,
                    global_state: jax.Array) -> jax.Array:
        """`r(s, a)`: `obs [..., N, O]`, `actions [..., N(, d)]`,
        `global_state [..., S]` → `[...]` (team) or `[..., N]` (`mixing="none"`)."""
        obs, actions, global_state = map(jnp.asarray, (obs, actions, global_state))
        spec = self.spec
        lead = obs.shape[:-2]
        chex.assert_shape(obs, lead + (spec.num_agents, spec.obs_dim))
        chex.assert_shape(actions, lead + (spec.num_agents,) + spec.action.shape)
        chex.assert_shape(global_state, lead + (spec.state_dim,))
        return self.net(params, self._input(obs, actions), global_state)

    def trajectory_scores(self, params: Any, episodes: Any, gamma) -> jax.Array:
        """Discounted learned return `Σ_t γ^t r(s_t, a_t)` over the valid steps
        of padded episodes (`obs [E, T(+1), N, O]`, `actions [E, T, ...]`,
        `global_state [E, T(+1), S]`, `mask [E, T]`, e.g.
        [`envs.rollout.Episodes`][jaxil.envs.rollout.Episodes] or a
        [`jaxil.data.Dataset`][jaxil.data.format.Dataset]): `[E]` or
        `[E, N]`."""
        t = episodes.actions.shape[1]
        r = self.step_reward(params, episodes.obs[:, :t], episodes.actions,
                             episodes.global_state[:, :t])
        return discounted_score(r, episodes.mask, gamma)

    # -- training ---------------------------------------------------------------------
    def loss(self, params: Any, positive: Any, negative: Any, key: jax.Array,
             gp_coef: Any = 0.1) -> tuple[jax.Array, dict]:
        """`L = discriminator_loss(r(pos), r(neg)) + gp_coef·GP` (per agent:
        summed over agents), and its metrics. Pure; differentiable in `params`."""
        x_p = self._input(positive.obs, positive.actions)
        x_n = self._input(negative.obs, negative.actions)
        l_p = self.net(params, x_p, positive.global_state)
        l_n = self.net(params, x_n, negative.global_state)
        if self.per_agent:
            d_loss = jnp.sum(jax.vmap(discriminator_loss, in_axes=(1, 1))(l_p, l_n))
        else:
            d_loss = discriminator_loss(l_p, l_n)
        gp = jnp.float32(0.0)
        if self.config.grad_penalty and self.per_agent:
            gp = agent_gradient_penalty(lambda x: self.net.local_values(params, x), x_p, x_n, key)
        elif self.config.grad_penalty:
            gp = gradient_penalty(lambda inp: self.net(params, *inp),
                                  (x_p, positive.global_state), (x_n, negative.global_state), key)
        total = d_loss + gp_coef * gp
        metrics = dict(
            loss=total,
            disc_loss=d_loss,
            grad_penalty=gp,
            accuracy=0.5 * (jnp.mean(l_p > 0) + jnp.mean(l_n < 0)),
            reward_positive=jnp.mean(l_p),
            reward_negative=jnp.mean(l_n),
        )
        return total, metrics

    def update(self, state: RewardModelState, positive: Any, negative: Any
               ) -> tuple[RewardModelState, dict]:
        """One clipped-Adam step on
        [`loss`][jaxil.algorithms.irl.reward_model.RewardModel.loss] (the
        penalty's key is split off `state.key`). Jit-able; vmap it over
        seeds."""
        key, gp_key = jax.random.split(state.key)
        grads, metrics = jax.grad(self.loss, has_aux=True)(
            state.params, positive, negative, gp_key, state.hparams.gp_coef)
        updates, opt = self.tx.update(grads, state.opt_state, state.params)
        params = jax.tree.map(lambda p, u: p + u, state.params, updates)
        return state.replace(params=params, opt_state=opt, step=state.step + 1, key=key), metrics

    def sample(self, key: jax.Array, data: RewardData) -> tuple[Transitions, Transitions]:
        """A positive and an independent negative batch (`batch_size` steps
        each, with replacement, by the sources' weights)."""
        kp, kn = jax.random.split(key)
        b = self.config.batch_size
        return (sample_where(kp, data.positive, b, data.positive_weight),
                sample_where(kn, data.negative, b, data.negative_weight))

    def update_n(self, state: RewardModelState, data: RewardData, k: int):
        """`k` updates fused in one `lax.scan` with on-device batches:
        `(state, last update's metrics, jaxil.runs.guard.Health)`."""

        def one(state: RewardModelState, key: jax.Array):
            return self.update(state, *self.sample(key, data))

        return fused_updates(one, state, k)

    def check_hparams(self, hparams: RewardModelHParams) -> None:
        """One-line error for an out-of-range learning rate or penalty weight."""
        check_hparams("reward model", hparams)


def init_params(key: jax.Array, spec: EnvSpec, config: RewardModelConfig = RewardModelConfig()
                ) -> Any:
    """`RewardModel(spec, config).init(key)`."""
    return RewardModel(spec, config).init(key)


def episode_log_probs(policy: Any, params: Any, episodes: Any) -> jax.Array:
    """`[E, T, N]` per-agent log-probabilities of the episodes' actions under
    `policy` (an [`envs.policies.Policy`][jaxil.envs.policies.Policy] with
    `log_prob`; e.g.
    [`jaxil.nn.policy.PolicyNet.policy`][jaxil.nn.policy.PolicyNet.policy]), on
    the observations they acted on."""
    if getattr(policy, "log_prob", None) is None:
        raise ValueError("the analytic reward needs policies with log_prob (neural policies, "
                         "jaxil.nn.policy.PolicyNet.policy()); scripted experts have none")
    t = episodes.actions.shape[1]
    obs, avail = episodes.obs[:, :t], episodes.avail_actions[:, :t]
    fn = jax.vmap(jax.vmap(policy.log_prob, in_axes=(None, 0, 0, 0)), in_axes=(None, 0, 0, 0))
    return fn(params, obs, avail, episodes.actions)


def analytic_reward(sft_policy: Any, sft_params: Any, init_policy: Any, init_params_: Any,
                    episodes: Any) -> jax.Array:
    """`r_c(τ) = log π_SFT(τ) − log π_0(τ)` per episode `[E]`: the per-step
    per-agent action log-probabilities of both policies summed over valid steps
    and agents
    ([`jaxil.losses.log_ratio_score`][jaxil.losses.trajectory.log_ratio_score])."""
    num = episode_log_probs(sft_policy, sft_params, episodes)
    den = episode_log_probs(init_policy, init_params_, episodes)
    return log_ratio_score(num, den, episodes.mask)
