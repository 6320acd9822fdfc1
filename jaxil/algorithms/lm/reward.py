"""Sequence reward models over token episodes (AfD-style IRL for token agents).

A reward model is a discriminator between *negative* and *positive* token
episodes whose logit, the episode's score, is the reward (Sun & van der
Schaar, "Inverse RL from demonstrations", arXiv 2405.15624). The sample
sources are those of `jaxil.algorithms.irl.reward_model.SOURCES`
(negatives → positives): `"init-sft"` (episodes of π_0 → episodes of
π_SFT; AfD's proposal), `"init-demo"` and `"sft-demo"`
([`source_episodes`][jaxil.algorithms.lm.reward.source_episodes]).

**The network** is a
[`jaxil.nn.transformer.TransformerPolicy`][jaxil.nn.transformer.TransformerPolicy]
(its own architecture, or π_SFT's parameters as the starting point, as AfD
initialises its reward model from the SFT model). Teacher-forced over an
episode it gives, at every step, the head's outputs `ℓ_θ(h_t) [V]` on the
agent's context `h_t` before its token
([`TransformerPolicy.chunk_logits`][jaxil.nn.transformer.TransformerPolicy.chunk_logits]);
the reward of the token `a_t` the agent emitted is the output at that token,
one scalar per (context, token):

    r_θ(h_t, a_t) = ℓ_θ(h_t)[a_t]

(a head over the context alone could not see the token it scores: `h_t`
holds the tokens before `a_t`, and an episode's last token never enters a
context). The episode's score sums the reads over a read mask `ρ [T, N]`
([`read_mask`][jaxil.algorithms.lm.reward.read_mask]):

    S_θ(τ) = Σ_t Σ_i ρ_ti · r_θ(h_ti, a_ti)

- `read="token"`: every token an agent emits on its turn
  ([`jaxil.algorithms.lm.turns.speaking`][jaxil.algorithms.lm.turns.speaking],
  forced tokens included: their read still depends on the context);
- `read="turn"`: once per turn, at its `<eot>`, where the context holds
  the whole turn (a reward per turn, summed);
- `read="last"`: once per episode, at the last token an agent emits,
  where the context holds the whole episode (one score per sequence, as a
  language-model reward model reads the end of its sequence; a sum over
  tokens or turns grows with the episode's length, which RL against it can
  exploit).

**The loss**
([`sequence_reward_loss`][jaxil.algorithms.lm.reward.sequence_reward_loss]) is
the logistic discriminator loss on episode scores
([`jaxil.losses.discriminator_loss`][jaxil.losses.discriminator.discriminator_loss],
positives labelled 1, negatives 0),

    L(θ) = E_{τ∼P}[softplus(−S_θ(τ))] + E_{τ∼Q}[softplus(S_θ(τ))],

whose optimum is `S_θ(τ) = log P(τ)/Q(τ)`.

**The analytic reward** of the Init–SFT pair
([`analytic_reward`][jaxil.algorithms.lm.reward.analytic_reward]) needs no
training: with deterministic transitions (tool answers are functions of the
history) the optimum above is the log-likelihood ratio of the agents' tokens,

    r_c(τ) = log π_SFT(τ) − log π_0(τ)
           = Σ_t Σ_i m_ti [log π_SFT(a_ti | h_ti) − log π_0(a_ti | h_ti)],

over the agent-token loss mask `m` of SFT
([`jaxil.losses.sequence.agent_token_mask`][jaxil.losses.sequence.agent_token_mask]
with the legal masks: tokens the grammar forces have `log π = 0` under every
policy), from
[`TransformerPolicy.episode_scores`][jaxil.nn.transformer.TransformerPolicy.episode_scores],
per token
([`analytic_token_rewards`][jaxil.algorithms.lm.reward.analytic_token_rewards],
the form RL consumes) or summed
([`analytic_reward`][jaxil.algorithms.lm.reward.analytic_reward]).

API (pure functions over pytrees; vmap seeds over the state):

```python
rm = SequenceRewardModel(env, SequenceRewardConfig(read="token"))
state = rm.init_state(key)                      # or rm.init_state(key, params=sft_params)
data = RewardEpisodes.build(env, positive, negative)   # TokenEpisodes of each source
state, metrics, health = rm.update_n(state, data, k)   # k fused Adam steps
s = rm.scores(state.params, episodes)           # [E] episode scores
r_c = analytic_reward(student, sft_params, init_params, episodes)   # [E]
```
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Optional, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxil import envs
from jaxil.algorithms.irl.reward_model import source_roles
from jaxil.algorithms.lm.sft import (
    SFTConfig,
    TokenEpisodes,
    _check_token_env,
    _token_mask,
    check_demos,
    check_model,
    from_episodes,
)
from jaxil.algorithms.lm.turns import speaking
from jaxil.losses import discriminator_loss
from jaxil.nn.task_vocab import TaskModel
from jaxil.nn.transformer import SIZES, TransformerPolicy, config_for_env
from jaxil.runs import engine
from jaxil.runs.checkpoint import params_digest
from jaxil.runs.guard import Health
from jaxil.runs.updates import fused_updates

#: Where a sequence reward model reads its per-token rewards (`read_mask`).
READS = ("token", "turn", "last")


@dataclasses.dataclass(frozen=True)
class SequenceRewardConfig:
    """Settings of a sequence reward model.

    Attributes:
      size: the transformer size (`jaxil.nn.transformer.SIZES`); to
        start from π_SFT's parameters, use π_SFT's size and `agent_ids`.
      agent_ids: add the learned agent-id embedding.
      read: `"token"` (a reward on every token an agent emits on its turn),
        `"turn"` (one at each turn's `<eot>`) or `"last"` (one at the episode's
        last emitted token); see
        [`read_mask`][jaxil.algorithms.lm.reward.read_mask].
      learning_rate: Adam's step size.
      max_grad_norm: global-norm gradient clipping.
      batch_episodes: episodes per source in each update (drawn with
        replacement).
      num_updates: updates in a whole run
        ([`train_reward_model`][jaxil.algorithms.lm.reward.train_reward_model]).
      eval_every: updates per chunk; an evaluation and a checkpoint follow
        each (must divide `num_updates`).
    """

    size: str = "tiny"
    agent_ids: bool = False
    read: str = "token"
    learning_rate: float = 1e-3
    max_grad_norm: float = 1.0
    batch_episodes: int = 32
    num_updates: int = 200
    eval_every: int = 100

    def __post_init__(self):
        if self.size not in SIZES:
            raise ValueError(f"SequenceRewardConfig.size must be one of {list(SIZES)}, got "
                             f"{self.size!r}")
        if self.read not in READS:
            raise ValueError(f"SequenceRewardConfig.read must be one of {READS}, got "
                             f"{self.read!r}")
        if int(self.batch_episodes) < 1:
            raise ValueError(f"SequenceRewardConfig.batch_episodes must be >= 1, got "
                             f"{self.batch_episodes}")
        if not self.learning_rate > 0 or not self.max_grad_norm > 0:
            raise ValueError(f"SequenceRewardConfig.learning_rate and max_grad_norm must be "
                             f"positive, got {self.learning_rate} and {self.max_grad_norm}")
        if int(self.num_updates) < 1 or int(self.eval_every) < 1 \
                or self.num_updates % self.eval_every:
            raise ValueError(f"SequenceRewardConfig.num_updates ({self.num_updates}) must be a "
                             f"positive multiple of eval_every ({self.eval_every})")


@struct.dataclass
class SequenceRewardState:
    """A reward model's training state (stack it `[R]` to vmap seeds)."""

    params: Any
    opt_state: Any
    step: jax.Array
    key: jax.Array


@struct.dataclass
class RewardEpisodes:
    """The two sources of a reward model, on device: `positive` (labelled 1)
    and `negative` (labelled 0)
    [`TokenEpisodes`][jaxil.algorithms.lm.sft.TokenEpisodes], of any sizes."""

    positive: TokenEpisodes
    negative: TokenEpisodes

    @staticmethod
    def build(env: envs.MultiAgentEnv, positive: TokenEpisodes,
              negative: TokenEpisodes) -> "RewardEpisodes":
        """Both sources, checked against `env` (one-line errors for
        episodes of another task or configuration)."""
        check_demos(env, positive, "positive episodes")
        check_demos(env, negative, "negative episodes")
        return RewardEpisodes(positive, negative)


def source_episodes(source: str, episodes: dict[str, TokenEpisodes]) -> RewardEpisodes:
    """The [`RewardEpisodes`][jaxil.algorithms.lm.reward.RewardEpisodes] of
    `source` (`"init-sft"`, `"init-demo"` or `"sft-demo"`) from `episodes`,
    which maps the roles `"init"` (π_0's episodes), `"sft"` (π_SFT's) and
    `"demo"` (the demonstrations) to episodes; only the source's two roles are
    needed."""
    neg, pos = source_roles(source)
    missing = [r for r in (neg, pos) if r not in episodes]
    if missing:
        raise ValueError(f"source {source} needs episodes of {missing}; got {sorted(episodes)}")
    return RewardEpisodes(positive=episodes[pos], negative=episodes[neg])


def policy_episodes(env: envs.MultiAgentEnv, policy: Any, params: Any, key: jax.Array,
                    num_episodes: int) -> TokenEpisodes:
    """`[S, E]` sampled episodes of each of the S stacked parameter sets
    `params` of `policy` (a
    [`TransformerPolicy`][jaxil.nn.transformer.TransformerPolicy]), all on the
    instances and draws of `key`; one compiled program. The `"init"` and
    `"sft"` roles of
    [`source_episodes`][jaxil.algorithms.lm.reward.source_episodes] for S
    seeds."""
    _check_token_env(env, "reward-model sources are token episodes")
    act = policy.policy()
    return jax.jit(jax.vmap(lambda p: from_episodes(
        env, envs.run_episodes(env, act, p, key, num_episodes))))(params)


def stacked_sources(sources: Sequence[str], roles: dict[str, TokenEpisodes]
                    ) -> tuple[RewardEpisodes, list[str]]:
    """`(data [len(sources)·S], labels)`: the
    [`RewardEpisodes`][jaxil.algorithms.lm.reward.RewardEpisodes] of every
    source in `sources` for each of S seeds, source-major (entry `j` is source
    `j // S` of seed `j % S`), from `roles` that map `"init"`, `"sft"` and
    `"demo"` to episodes stacked `[S, E]` (only the roles the sources need);
    the input of
    [`train_reward_model`][jaxil.algorithms.lm.reward.train_reward_model] for
    every (source, seed) at once."""
    if not sources:
        raise ValueError("stacked_sources needs at least one source")
    per = [source_episodes(s, roles) for s in sources]
    sizes = {int(x.shape[0]) for p in per for x in jax.tree.leaves(p)}
    if len(sizes) != 1:
        raise ValueError(f"the roles hold different numbers of seeds: {sorted(sizes)}")
    data = jax.tree.map(lambda *xs: jnp.concatenate(xs), *per)
    (seeds,) = sizes
    return data, [s for s in sources for _ in range(seeds)]


def read_mask(avail: jax.Array, actions: jax.Array, valid: jax.Array,
              read: str = "token", *, eot: int, wait: int) -> jax.Array:
    """`[T, N]` bool: where a reward model reads one episode's rewards.

        ρ_ti = speaking_ti                    (read="token")
        ρ_ti = speaking_ti ∧ [a_ti = <eot>]   (read="turn")
        ρ_ti = speaking_ti ∧ [t = t_last]     (read="last")

    with `speaking` the valid steps at which agent i is on turn and
    `t_last` the last step at which any agent is
    ([`jaxil.algorithms.lm.turns.speaking`][jaxil.algorithms.lm.turns.speaking]).

    Args:
      avail: `[T, N, V]` legal-token masks.
      actions: `[T, N]` int tokens emitted.
      valid: `[T]` bool, the episode's valid steps.
      read: `"token"`, `"turn"` or `"last"`.
      eot: the environment's `<eot>` id (`TokenEpisodes.eot`).
      wait: its `<wait>` id (`TokenEpisodes.wait`).
    """
    chex.assert_rank([avail, actions, valid], [3, 2, 1])
    if read not in READS:
        raise ValueError(f"read must be one of {READS}, got {read!r}")
    on_turn = speaking(avail, valid, wait=wait)
    if read == "turn":
        return on_turn & (actions == eot)
    if read == "last":  # the last step at which any agent speaks
        t = jnp.arange(on_turn.shape[0])
        last = jnp.max(jnp.where(jnp.any(on_turn, axis=1), t, -1))
        return on_turn & (t == last)[:, None]
    return on_turn


def masked_episode_sum(values: jax.Array, mask: jax.Array) -> jax.Array:
    """`[B]`: `Σ_{t,i} m_bti · v_bti` of `values`, `mask` `[B, T, N]`
    (select, not multiply: masked-out entries may be non-finite)."""
    chex.assert_rank([values, mask], 3)
    chex.assert_type(values, float)
    chex.assert_equal_shape([values, mask])
    return jnp.sum(jnp.where(mask.astype(bool), values, 0.0), axis=(1, 2))


def sequence_reward_loss(positive_rewards: jax.Array, positive_mask: jax.Array,
                         negative_rewards: jax.Array, negative_mask: jax.Array) -> jax.Array:
    """The logistic discriminator loss on episode scores.

        S(τ) = Σ_{t,i} ρ_ti · r_ti
        L = mean_{τ∈P} softplus(−S(τ)) + mean_{τ∈Q} softplus(S(τ))

    ([`jaxil.losses.discriminator_loss`][jaxil.losses.discriminator.discriminator_loss]
    on the scores; at the optimum `S = log P(τ)/Q(τ)`; Sun & van der Schaar,
    arXiv 2405.15624).

    Args:
      positive_rewards: `[B, T, N]` per-token rewards of the positive
        episodes (anything, even non-finite, where the mask is off).
      positive_mask: `[B, T, N]` the reads
        ([`read_mask`][jaxil.algorithms.lm.reward.read_mask]).
      negative_rewards: `[B2, T, N]` of the negative episodes.
      negative_mask: `[B2, T, N]`.

    Returns:
      Scalar loss.
    """
    chex.assert_rank([positive_rewards, positive_mask, negative_rewards, negative_mask], 3)
    chex.assert_equal_shape([positive_rewards, positive_mask])
    chex.assert_equal_shape([negative_rewards, negative_mask])
    return discriminator_loss(masked_episode_sum(positive_rewards, positive_mask),
                              masked_episode_sum(negative_rewards, negative_mask))


class SequenceRewardModel:
    """The sequence reward model of `env` and `config` (see the module
    docstring): a transformer whose head, read at each emitted token, is
    that token's reward, summed into the episode's score.

    With a pretrained `model` (a [`TaskModel`][jaxil.nn.task_vocab.TaskModel]
    of `env`, e.g. [`chat_model`][jaxil.nn.task_vocab.chat_model] in a
    chat-form task) the network is the model's decoder and its logits are
    the reads; its parameters start from the model's (the pretrained base),
    unless π_SFT's are given to `init_state`. `config.size` is then not
    used."""

    def __init__(self, env: envs.MultiAgentEnv,
                 config: SequenceRewardConfig = SequenceRewardConfig(),
                 model: Optional[TaskModel] = None):
        _check_token_env(env, "a sequence reward model scores token episodes")
        if model is not None:
            check_model(env, dataclasses.replace(SFTConfig(), agent_ids=config.agent_ids), model)
        self.env, self.config, self.model = env, config, model
        self.net = TransformerPolicy(
            model.config if model is not None
            else config_for_env(env, config.size, agent_ids=config.agent_ids))
        self.tx = optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                              optax.adam(config.learning_rate))

    # -- parameters ------------------------------------------------------------------
    def init(self, key: jax.Array) -> Any:
        """Fresh network parameters (with a pretrained model: its own)."""
        return self.net.init(key) if self.model is None else self.model.params

    def init_state(self, key: jax.Array, params: Optional[Any] = None) -> SequenceRewardState:
        """Parameters (`params`, e.g. π_SFT's of the same architecture, or a
        fresh draw from `key`), a fresh Adam state, step 0."""
        k_net, k_state = jax.random.split(key)
        if params is None:
            params = self.init(k_net)
        else:
            want = jax.tree.map(lambda x: tuple(x.shape), jax.eval_shape(self.init, k_net))
            got = jax.tree.map(lambda x: tuple(x.shape), params)
            if want != got:
                raise ValueError("the starting parameters do not fit the reward model's "
                                 f"transformer ({self.net.config}); give the reward model "
                                 "the policy's size and agent_ids")
        return SequenceRewardState(params, self.tx.init(params), jnp.int32(0), k_state)

    # -- the reward --------------------------------------------------------------------
    def token_rewards(self, params: Any, obs: jax.Array, actions: jax.Array) -> jax.Array:
        """`r_θ(h_t, a_t) [T, N]`: the head's output at each emitted token
        of one episode (`obs [T, N, K]`, `actions [T, N]`), on the
        context before it."""
        chex.assert_rank([obs, actions], [3, 2])
        logits = self.net.chunk_logits(params, obs)
        return jnp.take_along_axis(logits, actions[..., None].astype(jnp.int32), -1)[..., 0]

    def read_masks(self, episodes: TokenEpisodes) -> jax.Array:
        """`[E, T, N]` the reads
        ([`read_mask`][jaxil.algorithms.lm.reward.read_mask] with
        `config.read`)."""
        reads = functools.partial(read_mask, eot=episodes.eot, wait=episodes.wait)
        return jax.vmap(reads, in_axes=(0, 0, 0, None))(
            episodes.avail, episodes.actions, episodes.mask, self.config.read)

    def scores(self, params: Any, episodes: TokenEpisodes) -> jax.Array:
        """`S_θ(τ) [E]`: each episode's summed reads."""
        r = jax.vmap(self.token_rewards, in_axes=(None, 0, 0))(params, episodes.obs,
                                                               episodes.actions)
        return masked_episode_sum(r, self.read_masks(episodes))

    # -- training ------------------------------------------------------------------------
    def loss(self, params: Any, positive: TokenEpisodes, negative: TokenEpisodes
             ) -> tuple[jax.Array, dict]:
        """[`sequence_reward_loss`][jaxil.algorithms.lm.reward.sequence_reward_loss]
        of a positive and a negative batch, and its metrics (`accuracy`:
        positives scored > 0 and negatives < 0; the mean scores). Pure;
        differentiable in `params`."""
        rewards = jax.vmap(self.token_rewards, in_axes=(None, 0, 0))
        r_p = rewards(params, positive.obs, positive.actions)
        r_n = rewards(params, negative.obs, negative.actions)
        m_p, m_n = self.read_masks(positive), self.read_masks(negative)
        loss = sequence_reward_loss(r_p, m_p, r_n, m_n)
        s_p, s_n = masked_episode_sum(r_p, m_p), masked_episode_sum(r_n, m_n)
        return loss, dict(loss=loss, accuracy=0.5 * (jnp.mean(s_p > 0) + jnp.mean(s_n < 0)),
                          score_positive=jnp.mean(s_p), score_negative=jnp.mean(s_n))

    def update(self, state: SequenceRewardState, positive: TokenEpisodes,
               negative: TokenEpisodes) -> tuple[SequenceRewardState, dict]:
        """One clipped-Adam step on
        [`loss`][jaxil.algorithms.lm.reward.SequenceRewardModel.loss].
        Jit-able; vmap it over seeds."""
        grads, metrics = jax.grad(self.loss, has_aux=True)(state.params, positive, negative)
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        return state.replace(params=optax.apply_updates(state.params, updates),
                             opt_state=opt_state, step=state.step + 1), metrics

    def sample(self, key: jax.Array, data: RewardEpisodes) -> tuple[TokenEpisodes, TokenEpisodes]:
        """A positive and an independent negative batch of
        `batch_episodes` episodes each (with replacement)."""
        b = self.config.batch_episodes

        def pick(k, eps):
            return eps.take(jax.random.randint(k, (b,), 0, eps.num_episodes))

        kp, kn = jax.random.split(key)
        return pick(kp, data.positive), pick(kn, data.negative)

    def update_n(self, state: SequenceRewardState, data: RewardEpisodes, k: int
                 ) -> tuple[SequenceRewardState, dict, Health]:
        """`k` updates fused in one `lax.scan` with on-device batches
        ([`jaxil.runs.updates.fused_updates`][jaxil.runs.updates.fused_updates]):
        `(state, the last update's metrics, jaxil.runs.guard.Health)`."""
        return fused_updates(lambda s, key: self.update(s, *self.sample(key, data)), state, k)


def token_rewards_of(model: "SequenceRewardModel"):
    """The per-token reward function `(params, episodes) -> (r [E, T, N], ρ [E,
    T, N])` of a learned reward model: `r_θ(h_t, a_t)` and its read mask, whose
    masked sum is
    [`SequenceRewardModel.scores`][jaxil.algorithms.lm.reward.SequenceRewardModel.scores]
    (the form RL against a learned reward consumes,
    [`jaxil.algorithms.lm.align`][jaxil.algorithms.lm.align])."""

    def fn(params: Any, episodes: TokenEpisodes) -> tuple[jax.Array, jax.Array]:
        r = jax.vmap(model.token_rewards, in_axes=(None, 0, 0))(params, episodes.obs,
                                                                episodes.actions)
        return r, model.read_masks(episodes)

    return fn


def analytic_token_rewards(policy: TransformerPolicy, params: dict, episodes: TokenEpisodes
                           ) -> tuple[jax.Array, jax.Array]:
    """The per-token form of
    [`analytic_reward`][jaxil.algorithms.lm.reward.analytic_reward]:
    `(log π_SFT(a_ti|h_ti) − log π_0(a_ti|h_ti) [E, T, N], the agent-token mask
    m [E, T, N])` with `params = {"sft": π_SFT's, "init":
    π_0's}`; the masked sum is r_c."""
    score = jax.vmap(policy.episode_scores, in_axes=(None, 0, 0, 0))
    num, _ = score(params["sft"], episodes.obs, episodes.avail, episodes.actions)
    den, _ = score(params["init"], episodes.obs, episodes.avail, episodes.actions)
    mask = _token_mask(episodes, forced_tokens=False)
    return jnp.where(mask, num - den, 0.0), mask


def analytic_reward(policy: TransformerPolicy, params_sft: Any, params_0: Any,
                    episodes: TokenEpisodes) -> jax.Array:
    """`r_c(τ) = log π_SFT(τ) − log π_0(τ)` per episode `[E]`.

    The teacher-forced token log-probabilities of both parameter sets
    ([`TransformerPolicy.episode_scores`][jaxil.nn.transformer.TransformerPolicy.episode_scores]),
    differenced and summed over the agent tokens of SFT's loss mask (valid
    steps with a choice:
    [`jaxil.losses.sequence.agent_token_mask`][jaxil.losses.sequence.agent_token_mask])
    by
    [`analytic_token_rewards`][jaxil.algorithms.lm.reward.analytic_token_rewards].

    Args:
      policy: the transformer both parameter sets belong to (π_SFT's student,
        e.g.
        [`jaxil.algorithms.lm.sft.make_student`][jaxil.algorithms.lm.sft.make_student]).
      params_sft: π_SFT's parameters.
      params_0: π_0's (the same network at its initialisation).
      episodes: the episodes to score.
    """
    return masked_episode_sum(*analytic_token_rewards(
        policy, {"sft": params_sft, "init": params_0}, episodes))


def check_stacked(tree: Any, runs: int, what: str) -> None:
    """Raise a one-line `ValueError` unless every leaf of `tree` has the
    leading size `runs` (one entry per stacked run)."""
    lead = {int(np.shape(x)[0]) if np.ndim(x) else -1 for x in jax.tree.leaves(tree)}
    if lead != {runs}:
        raise ValueError(f"{what} must be stacked with one entry per run ([{runs}, ...]), got "
                         f"leading sizes {sorted(lead)}")


def reward_program(env: envs.MultiAgentEnv, data: RewardEpisodes, config: SequenceRewardConfig,
                   seeds: Sequence[int], labels: Sequence[str],
                   init_params: Optional[Any] = None,
                   heldout: Optional[RewardEpisodes] = None,
                   model: Optional[TaskModel] = None) -> engine.Program:
    """The [`jaxil.runs.engine.Program`][jaxil.runs.engine.Program] of R reward
    models at once.

    Run r trains on `data` entry r (every leaf stacked `[R, ...]`, e.g.
    one source of one seed's episodes), from `init_params[r]` (stacked
    `[R]`, e.g. π_SFT's; None: fresh parameters from the seed), with seed
    `seeds[r]`; `labels[r]` names it in rows (`source`) and errors.
    A chunk is `eval_every` fused updates of every run (one compiled
    `vmap`). Rows carry the last update's `loss` and `accuracy`; with
    `heldout` (stacked like `data`) the evaluation adds `eval_loss` and
    `eval_accuracy` on it (also at update 0). With a pretrained `model`
    every run starts from its parameters unless `init_params` are given
    (see [`SequenceRewardModel`][jaxil.algorithms.lm.reward.SequenceRewardModel]).
    """
    seeds, labels = [int(s) for s in seeds], [str(x) for x in labels]
    if not seeds or len(seeds) != len(labels):
        raise ValueError(f"reward_program needs one label per seed, got {len(seeds)} seeds and "
                         f"{len(labels)} labels")
    r = len(seeds)
    rm = SequenceRewardModel(env, config, model)
    if model is not None and init_params is None:
        # The base's parameters as arguments of the compiled init, one per
        # run (closed over, they would be compiled in as constants).
        init_params = jax.tree.map(lambda x: jnp.broadcast_to(x, (r,) + jnp.shape(x)),
                                   model.params)
    check_stacked(data, r, "reward data")
    if heldout is not None:
        check_stacked(heldout, r, "held-out reward data")
    if init_params is not None:
        check_stacked(init_params, r, "init_params")
        rm.init_state(jax.random.PRNGKey(0), jax.tree.map(lambda x: x[0], init_params))

    def init_one(seed, params):
        return rm.init_state(jax.random.PRNGKey(seed), params)

    def init():
        seeds_ = jnp.asarray(seeds, jnp.int32)
        if init_params is None:
            return jax.jit(jax.vmap(lambda s: init_one(s, None)))(seeds_)
        return jax.jit(jax.vmap(init_one))(seeds_, init_params)

    def chunk_one(state, d):
        state, metrics, health = rm.update_n(state, d, config.eval_every)
        return state, dict(loss=metrics["loss"], accuracy=metrics["accuracy"]), health

    chunk = jax.jit(jax.vmap(chunk_one))

    def evaluate_one(params, held):
        _, m = rm.loss(params, held.positive, held.negative)
        return dict(eval_loss=m["loss"], eval_accuracy=m["accuracy"])

    evaluate = jax.jit(jax.vmap(evaluate_one))

    def summarize(rows):
        last = max(row["update"] for row in rows)
        at = [row for row in rows if row["update"] == last]
        points = []
        for label in dict.fromkeys(labels):
            rs = [row for row in at if row["source"] == label]
            entry = dict(source=label, seeds=len(rs),
                         accuracy_mean=float(np.mean([row.get("accuracy", np.nan) for row in rs])))
            if heldout is not None:
                acc = [row["eval_accuracy"] for row in rs]
                entry.update(eval_accuracy_mean=float(np.mean(acc)),
                             eval_accuracy_std=float(np.std(acc)))
            points.append(entry)
        return {"learner": "sequence reward model", "env_id": env.spec.env_id, "update": last,
                "points": points}

    return engine.Program(
        name=f"sequence reward models on {env.spec.env_id}", step_key="update",
        num_chunks=config.num_updates // config.eval_every,
        steps_per_chunk=config.eval_every, step_unit=config.eval_every,
        run_ids=[dict(run=i, seed=s, source=lab) for i, (s, lab) in enumerate(zip(seeds, labels))],
        run_labels=[f"{lab}, seed {s}" for s, lab in zip(seeds, labels)],
        init=init, chunk=lambda s, c: chunk(s, data),
        evaluate=(lambda s, c: evaluate(s.params, heldout)) if heldout is not None
        else (lambda s, c: {}),
        eval_at_start=heldout is not None, summarize=summarize,
        postfix=lambda v: dict(acc=f"{np.mean(v.get('eval_accuracy', v.get('accuracy', np.nan))):.2f}"))


def _episodes_digest(data: RewardEpisodes) -> str:
    return params_digest((data.positive.obs, data.positive.avail, data.positive.actions,
                          data.positive.mask, data.negative.obs, data.negative.avail,
                          data.negative.actions, data.negative.mask))


def train_reward_model(env: envs.MultiAgentEnv, data: RewardEpisodes,
                       config: SequenceRewardConfig, seeds: Sequence[int],
                       labels: Sequence[str], init_params: Optional[Any] = None,
                       heldout: Optional[RewardEpisodes] = None, *,
                       out_dir: Optional[str | Path] = None, resume: bool = False,
                       overwrite: bool = False, progress: bool = False,
                       stop_after_chunks: Optional[int] = None,
                       model: Optional[TaskModel] = None) -> engine.RunResult:
    """Train R sequence reward models
    ([`reward_program`][jaxil.algorithms.lm.reward.reward_program] run by
    [`jaxil.runs.engine.run`][jaxil.runs.engine.run]); `out_dir`, `resume` and
    `overwrite` as in
    [`jaxil.algorithms.lm.sft.train_sft`][jaxil.algorithms.lm.sft.train_sft] (a
    resumed run reproduces the uninterrupted one exactly; `stop_after_chunks`
    stops early, as a kill would). `state.params` of the result are the reward
    models' parameters, stacked `[R]`; `model`: a pretrained base
    ([`reward_program`][jaxil.algorithms.lm.reward.reward_program])."""
    program = reward_program(env, data, config, seeds, labels, init_params, heldout, model)
    rd = None
    if out_dir is not None:
        cfg = dataclasses.asdict(config)
        cfg.pop("num_updates")
        identity = dict(learner="sequence reward model", env_id=env.spec.env_id,
                        spec=env.spec.to_dict(), config=cfg, seeds=[int(s) for s in seeds],
                        labels=[str(x) for x in labels], data=_episodes_digest(data),
                        heldout=None if heldout is None else _episodes_digest(heldout),
                        init_params=None if init_params is None else params_digest(init_params),
                        **({} if model is None else {"model": params_digest(model.params)[:16]}))
        rd = engine.open_run(out_dir, identity, step_key="update", resume=resume,
                             overwrite=overwrite, info=dict(num_updates=config.num_updates))
        if rd.latest is not None and rd.latest > config.num_updates:
            rd.close()
            raise ValueError(f"num_updates {config.num_updates} is less than the {rd.latest} "
                             f"updates already trained in {out_dir}")
    return engine.run(program, rundir=rd, progress=progress, stop_after_chunks=stop_after_chunks)
