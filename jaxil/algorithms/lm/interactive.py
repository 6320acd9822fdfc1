"""Interactive imitation on token tasks: BC, DAgger, OEC, OEC + BC,
on-policy rejection sampling and on-policy distillation (OPD) for a
transformer student, as one program.

A round, for every run (regime × seed) at once (`vmap`), in ONE compiled
program:

```text
takeover rollouts (episodes_per_round per run)          takeover.takeover_episodes
  → expert tokens spent, verifier, repetition filter,  corrections.*
    budget allowance
  → loss masks and targets of the kept episodes         corrections.token_loss_mask
  → append them to the run's episode ring buffer
  → K fused updates on demos ∪ buffer (masked token NLL, teacher-forced)
```

Every run of a seed starts from the same SFT student (`sft_tokens` expert
tokens of demonstrations, `sft_updates` updates). The regimes are the knobs of
[`jaxil.algorithms.interactive.config.regime`][jaxil.algorithms.interactive.config.regime]
— budgets in EXPERT TOKENS (the speaking agent tokens an expert produced or
labelled, demonstrations included), OEC's switch in TURNS — built by
[`token_regime`][jaxil.algorithms.lm.interactive.token_regime], which adds the
entropy-gated switch (`gated`).

The buffer holds whole episodes, not transitions: a token's distribution
depends on its whole context. With OEC's prefix mask a kept episode's
student tokens are context only; DAgger's targets are the expert's labels
at every token the student visited.

On-policy distillation (`opd`,
[`jaxil.algorithms.lm.distill`][jaxil.algorithms.lm.distill]) needs an expert
LM (a [`TransformerPolicy`][jaxil.nn.transformer.TransformerPolicy]; a scripted
expert is refused in one line) and has its own round,
[`make_opd_round`][jaxil.algorithms.lm.interactive.make_opd_round]:

```text
the student samples its episodes (every turn; no takeover, no filter)
  → every speaking token is scored by the expert and paid for, within the
    round's allowance                                  distill.expert_tokens_scored
  → the expert LM scores them teacher-forced, once     distill.expert_log_probs
  → the buffer is REPLACED by these episodes
  → K fused updates on them: GKD's generalized JSD_β to the expert at every
    agent token (β = 1: the reverse KL), environment tokens masked
```

It trains on the round's own fresh episodes only, not on an aggregate as
DAgger does: GKD's on-policy setting (Agarwal et al. 2024, λ = 1) samples
the outputs of the CURRENT student, so that the student learns where its
own distribution goes; older episodes would weigh the contexts of earlier
students. The budget counts alike for both: DAgger pays for every token
the student visited (a label each) once, when the episode is collected,
and OPD for every token it visited (the expert's distribution read at
each) once, when the expert scores the episode; the K updates reuse those
scores at no further cost. The demonstrations serve the shared SFT start
only (`demo_labels` is the SFT start's). β is compiled into the round, so
the `opd` regimes of a run share one β and run without the other methods.

[`run`][jaxil.algorithms.lm.interactive.run] hands the rounds to the run engine
([`jaxil.runs.engine`][jaxil.runs.engine]): evaluation on fixed instances every
`eval_every` rounds (greedy success rate and return), `metrics.jsonl`, orbax
checkpoints, resume that reproduces the uninterrupted run, and the non-finite
guard.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxil.envs.core import MultiAgentEnv
from jaxil.envs.rollout import run_episodes
from jaxil.envs.tokens import token_specials
from jaxil.algorithms.interactive import labels as L
from jaxil.algorithms.interactive.buffer import mixed_draw
from jaxil.algorithms.interactive.config import (METHODS, RegimeHParams, check_regime, regime,
                                                 resolve_auto, stack_regimes)
from jaxil.algorithms.interactive.schedule import expert_probability
from jaxil.algorithms.lm.corrections import expert_tokens, passes_repetition, token_loss_mask
from jaxil.algorithms.lm.distill import (check_expert_lm, expert_log_probs, expert_tokens_scored,
                                         opd_loss_from_scores)
from jaxil.algorithms.lm.sft import (SFTConfig, TokenEpisodes, _check_token_env, check_model,
                                     collect_demos, from_episodes)
from jaxil.algorithms.lm.takeover import TakeoverRule, takeover_episodes
from jaxil.algorithms.lm.turns import speaking
from jaxil.losses.sequence import agent_token_mask, masked_sequence_nll
from jaxil.nn.task_vocab import TaskModel
from jaxil.nn.transformer import SIZES, TransformerPolicy, config_for_env, obs_tokens
from jaxil.runs import engine, guard
from jaxil.runs.checkpoint import params_digest
from jaxil.runs.measure import format_table as fmt_table
from jaxil.runs.summary import mean_std, summarize_step
from jaxil.runs.updates import fused_updates

#: The token methods: those of `jaxil.algorithms.interactive.config.METHODS`
#: and `gated` (the expert takes over once the student's token entropy
#: exceeds `entropy_gate`; trained like OEC on the expert's tokens).
TOKEN_METHODS = METHODS + ("gated",)
#: On-policy distillation from an expert LM
#: ([`jaxil.algorithms.lm.distill`][jaxil.algorithms.lm.distill]): the
#: student samples every turn and is trained on its own episodes.
OPD = "opd"
#: Every method of the program: `TOKEN_METHODS`, which take any expert
#: (scripted, transcript-only or an LM acting greedily), and `OPD`, which
#: needs an expert LM.
INTERACTIVE_METHODS = TOKEN_METHODS + (OPD,)
#: The regime key of OPD's GKD β (a static setting, so not a traced knob of
#: [`RegimeHParams`][jaxil.algorithms.interactive.config.RegimeHParams]).
DISTILL_BETA = "distill_beta"
#: A repeated turn (same answer, same command) this often rejects an episode.
DEFAULT_REPEAT_LIMIT = 3
#: The entropy gate of `gated` in nats, unless given.
DEFAULT_ENTROPY_GATE = 0.5
#: OEC's ablations on tokens, as `token_regime` overrides: the prefix mask
#: off (the student's own turns are trained on too), the repetition filter
#: off, the verifier off (failed episodes are kept) and a geometric switch
#: turn instead of a uniform one.
OEC_ABLATIONS = {
    "mask off": dict(mask_prefix=False),
    "repetition filter off": dict(repeat_limit=0),
    "verifier off": dict(verifier="off"),
    "switch=geometric": dict(switch_kind="geometric", switch_p=0.3),
}


class BudgetUnderspent(UserWarning):
    """A regime ended its rounds more than one expert episode below its
    expert-token budget (its comparison with the others is then not at an
    equal budget)."""


@dataclasses.dataclass(frozen=True)
class TokenInteractiveConfig:
    """Static settings of an interactive token run (changing one recompiles).

    Attributes:
      size: the student transformer's size (`jaxil.nn.transformer.SIZES`).
      agent_ids: the student's learned agent-id embedding.
      learning_rate: Adam's step size of the shared SFT start; the rounds of a
        regime use its own `lr`
        ([`token_regime`][jaxil.algorithms.lm.interactive.token_regime]'s
        `lr=`, default 1e-3, the tiny student's; a pretrained student wants
        about 1e-4).
      max_grad_norm: global-norm gradient clipping.
      batch_episodes: episodes per minibatch.
      rounds: interactive rounds after the SFT start.
      episodes_per_round: takeover rollouts per round and run.
      updates_per_round: updates per round.
      sft_tokens: expert tokens of the demonstrations the shared SFT start
        is trained on.
      sft_updates: updates of that start; 0 starts every run from the
        untrained student (the `sft_tokens` demonstrations are still in
        every run's data and budget).
      capacity: episodes the buffer holds (a ring: the oldest are
        overwritten); 0 means `rounds × episodes_per_round`. An `opd`
        run's buffer holds its round's episodes (`episodes_per_round`).
      eval_episodes: greedy rollouts per evaluation (fixed instances).
    """

    size: str = "tiny"
    agent_ids: bool = False
    learning_rate: float = 1e-3
    max_grad_norm: float = 1.0
    batch_episodes: int = 16
    rounds: int = 4
    episodes_per_round: int = 32
    updates_per_round: int = 100
    sft_tokens: int = 1000
    sft_updates: int = 300
    capacity: int = 0
    eval_episodes: int = 64

    def __post_init__(self):
        if self.size not in SIZES:
            raise ValueError(f"size must be one of {list(SIZES)}, got {self.size!r}")
        for name in ("batch_episodes", "rounds", "episodes_per_round", "updates_per_round",
                     "sft_tokens", "eval_episodes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if int(self.sft_updates) < 0:
            raise ValueError(f"sft_updates must be >= 0 (0: an untrained start), got "
                             f"{self.sft_updates}")
        if self.capacity < 0:
            raise ValueError(f"capacity must be >= 0 (0: rounds × episodes_per_round), got "
                             f"{self.capacity}")
        if not self.learning_rate > 0 or not self.max_grad_norm > 0:
            raise ValueError("learning_rate and max_grad_norm must be positive")

    @property
    def buffer_episodes(self) -> int:
        return self.capacity or self.rounds * self.episodes_per_round


def token_regime(method: str, budget: int, *, sft_tokens: int, **overrides: Any) -> dict:
    """The knobs of `method` (one of `INTERACTIVE_METHODS`) at a total `budget`
    of expert tokens, with `overrides` (names of
    [`jaxil.algorithms.interactive.config.RegimeHParams`][jaxil.algorithms.interactive.config.RegimeHParams]).

    Token defaults: the repetition filter rejects a turn repeated
    `DEFAULT_REPEAT_LIMIT` times; OEC's switch turn is uniform over
    `[0, auto]` (auto: half the expert's mean number of turns); `gated`
    is OEC without a random switch, whose expert takes over once the
    student's entropy exceeds `entropy_gate` (default
    `DEFAULT_ENTROPY_GATE` nats).

    `opd` takes only `lr` and `distill_beta` (GKD's β, default 1: the
    reverse KL): its student samples every turn (DAgger's rollout with
    β_r = 0), every speaking token is scored and paid for, and nothing
    else of a regime applies to it."""
    if method not in INTERACTIVE_METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of "
                         f"{', '.join(INTERACTIVE_METHODS)}")
    if method == OPD:
        other = sorted(set(overrides) - {"lr", DISTILL_BETA})
        if other:
            raise ValueError(f"opd takes no {', '.join(other)}: its student samples every turn "
                             "and is distilled on all its tokens; give only its GKD beta "
                             "(--beta) and learning rate (--lr)")
        beta = overrides.get(DISTILL_BETA, 1.0)
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta <= 1:
            raise ValueError(f"opd's distill_beta (GKD's beta) must be a number in [0, 1] "
                             f"(1: reverse KL, 0: forward KL), got {beta!r}")
        lr = {"lr": overrides["lr"]} if "lr" in overrides else {}
        h = regime("dagger", budget, sft_labels=sft_tokens, has_win=True, beta0=0.0,
                   beta_kind="constant", **lr)
        return dict(h, **{DISTILL_BETA: float(beta)})
    extra: dict[str, Any] = {}
    if method in ("oec", "oec_mix", "onpolicy", "gated"):
        extra["repeat_limit"] = DEFAULT_REPEAT_LIMIT
    if method == "gated":
        extra.update(switch_kind="none", entropy_gate=DEFAULT_ENTROPY_GATE)
    extra.update(overrides)
    return regime("oec" if method == "gated" else method, budget, sft_labels=sft_tokens,
                  has_win=True, **extra)


@struct.dataclass
class EpisodeBuffer:
    """A ring of training episodes: `obs [C, T, N, K]` (token columns),
    `avail [C, T, N, V]`, `targets [C, T, N]`, `mask [C, T, N]`."""

    obs: jax.Array
    avail: jax.Array
    targets: jax.Array
    mask: jax.Array
    size: jax.Array
    ptr: jax.Array


def empty_buffer(env: MultiAgentEnv, capacity: int) -> EpisodeBuffer:
    spec = env.spec
    T, N, K, V = spec.max_steps, spec.num_agents, env.token_width, spec.num_actions
    return EpisodeBuffer(obs=jnp.zeros((capacity, T, N, K), jnp.float32),
                         avail=jnp.zeros((capacity, T, N, V), bool),
                         targets=jnp.zeros((capacity, T, N), jnp.int32),
                         mask=jnp.zeros((capacity, T, N), bool),
                         size=jnp.int32(0), ptr=jnp.int32(0))


def insert_episodes(buf: EpisodeBuffer, obs, avail, targets, mask, kept) -> EpisodeBuffer:
    """Append the `kept` episodes (`[E]` bool) in index order; the rest
    are dropped."""
    cap = buf.obs.shape[0]
    rank = jnp.cumsum(kept.astype(jnp.int32)) - 1
    slot = jnp.where(kept, (buf.ptr + rank) % cap, cap)
    put = lambda b, x: b.at[slot].set(x.astype(b.dtype), mode="drop")
    n = jnp.sum(kept, dtype=jnp.int32)
    return EpisodeBuffer(obs=put(buf.obs, obs), avail=put(buf.avail, avail),
                         targets=put(buf.targets, targets), mask=put(buf.mask, mask),
                         size=jnp.minimum(buf.size + n, cap), ptr=(buf.ptr + n) % cap)


@struct.dataclass
class Demos:
    """The expert demonstrations shared by every run, in episode order, with
    their loss masks (`[E, T, N]`, the tokens with a choice)."""

    episodes: TokenEpisodes
    mask: jax.Array


@struct.dataclass
class TokenRunState:
    params: Any
    opt_state: Any
    hp: RegimeHParams
    buffer: EpisodeBuffer
    spent: jax.Array  # interactive expert tokens so far
    expert_turns: jax.Array  # interactive expert turns so far
    expert_episodes: jax.Array  # interactive episodes the expert acted in or labelled
    demo_eps: jax.Array  # demonstration episodes this run may use
    round: jax.Array
    key: jax.Array


def _optimizer(config: TokenInteractiveConfig) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                       optax.inject_hyperparams(optax.adam)(learning_rate=config.learning_rate))


def _set_lr(opt_state, lr):
    clip, adam = opt_state
    return (clip, adam._replace(hyperparams=dict(adam.hyperparams, learning_rate=lr)))


def make_student(env: MultiAgentEnv, config: TokenInteractiveConfig,
                 model: Optional[TaskModel] = None) -> TransformerPolicy:
    """The student network: a transformer of `config.size` trained from
    scratch, or a pretrained `model`'s decoder (its own configuration)."""
    if model is not None:
        return TransformerPolicy(model.config)
    return TransformerPolicy(config_for_env(env, config.size, agent_ids=config.agent_ids))


def _batch(key, state: TokenRunState, demos: Demos, size: int):
    """`size` episodes, each from the demos with probability ρ
    (`hp.demo_ratio`, or in proportion to the episodes when −1), else
    from the buffer; all from the demos while the buffer is empty."""
    i_d, i_b, from_d = mixed_draw(key, state.demo_eps, state.buffer.size, state.hp.demo_ratio,
                                  size)
    pick = lambda d, b: jnp.where(from_d.reshape((-1,) + (1,) * (d.ndim - 1)), d[i_d],
                                  b[i_b].astype(d.dtype))
    ep, buf = demos.episodes, state.buffer
    return (pick(ep.obs, buf.obs), pick(ep.avail, buf.avail), pick(ep.actions, buf.targets),
            pick(demos.mask, buf.mask))


def token_nll(student: TransformerPolicy, params, obs, avail, targets, mask) -> jax.Array:
    """The masked teacher-forced token NLL of a batch of episodes (`obs
    [B, T, N, K]`, `avail [B, T, N, V]`, `targets` and `mask [B, T,
    N]`)."""
    log_p, _ = jax.vmap(student.episode_scores, in_axes=(None, 0, 0, 0))(
        params, obs, avail, targets)
    return masked_sequence_nll(log_p, mask)


def _train(student, tx, state: TokenRunState, demos: Demos, k: int, batch: int):
    def one(s: TokenRunState, key):
        b = _batch(key, s, demos, batch)
        loss, grads = jax.value_and_grad(lambda p: token_nll(student, p, *b))(s.params)
        updates, opt = tx.update(grads, s.opt_state, s.params)
        return s.replace(params=optax.apply_updates(s.params, updates), opt_state=opt), {
            "loss": loss}

    return fused_updates(one, state, k)


def make_round(env: MultiAgentEnv, student: TransformerPolicy, expert: Any,
               config: TokenInteractiveConfig, tx):
    """`round(state, demos, expert_params) -> (state, metrics, health)` for ONE run."""
    T, K = env.spec.max_steps, env.token_width
    width = env.cmd_width + 1
    E = config.episodes_per_round
    eot, wait = token_specials(env)
    ep_axes = lambda *a: jax.vmap(*a)

    def round_fn(state: TokenRunState, demos: Demos, expert_params: Any):
        hp, r = state.hp, state.round
        key, k_roll = jax.random.split(state.key)
        beta = expert_probability(r, hp.beta0, hp.beta_kind, hp.beta_rate)
        rule = TakeoverRule(hp.switch_kind, hp.switch_lo, hp.switch_hi, hp.switch_p, beta,
                            hp.entropy_gate)
        ep = takeover_episodes(env, student, expert, state.params, expert_params, rule, k_roll, E)
        rec, valid = ep.carry, ep.mask
        avail, obs = ep.avail_actions[:, :T], ep.obs[:, :T, :, :K]
        spent = ep_axes(functools.partial(expert_tokens, wait=wait), (0, 0, 0, None))(
            valid, avail, rec.expert_acted, hp.use_label)
        interactive = hp.budget - hp.demo_labels
        allowance = (interactive * (r + 1)) // config.rounds - state.spent
        within = L.within_allowance(spent, allowance)
        accepted = L.verify(ep.won, ep.episode_return, hp.verifier, hp.return_threshold)
        accepted &= ep_axes(functools.partial(passes_repetition, eot=eot, wait=wait),
                            (0, 0, 0, 0, None, None))(
            obs_tokens(ep.obs[:, 1:, :, :K], K), ep.actions, avail, valid, hp.repeat_limit,
            width)
        kept = within & accepted
        mask = ep_axes(token_loss_mask, (0, 0, 0, None, 0))(valid, avail, rec.expert_acted,
                                                            hp.mask_prefix, kept)
        targets = L.training_targets(rec.label, ep.actions, hp.use_label)
        buf = insert_episodes(state.buffer, obs, avail, targets, mask, kept)
        asked = (rec.expert_acted | hp.use_label)[..., None] & ep_axes(
            functools.partial(speaking, wait=wait))(avail, valid)
        turns = jnp.sum(asked & (ep.actions == eot), axis=(1, 2), dtype=jnp.int32)
        paid = lambda x: jnp.sum(jnp.where(within, x, 0), dtype=jnp.int32)
        new = state.replace(buffer=buf, key=key, round=r + 1, spent=state.spent + paid(spent),
                            expert_turns=state.expert_turns + paid(turns),
                            expert_episodes=state.expert_episodes + paid(spent > 0))
        new, last, health = _train(student, tx, new, demos, config.updates_per_round,
                                   config.batch_episodes)
        n_within = jnp.maximum(jnp.sum(within), 1)
        metrics = dict(
            loss=last["loss"], beta=beta, interactive_tokens=new.spent,
            episodes_within_budget=jnp.sum(within), episodes_kept=jnp.sum(kept),
            accept_rate=jnp.sum(within & accepted) / n_within,
            rollout_win_rate=jnp.sum(jnp.where(within, ep.won, 0.0)) / n_within,
            expert_share=jnp.sum(valid & rec.expert_acted) / jnp.maximum(jnp.sum(valid), 1),
            trained_tokens=jnp.sum(mask), buffer_size=buf.size)
        return new, metrics, health

    return round_fn


def make_opd_round(env: MultiAgentEnv, student: TransformerPolicy, expert: TransformerPolicy,
                   config: TokenInteractiveConfig, tx, beta: float):
    """`round(state, demos, expert_params) -> (state, metrics, health)` of
    on-policy distillation for ONE run (`demos` served the SFT start only).

    ```text
    the student samples episodes_per_round episodes (every turn)
      → tokens scored (every speaking token), allowance  distill.expert_tokens_scored
      → the expert LM scores them teacher-forced, once   distill.expert_log_probs
      → the buffer is replaced by those within it
      → K fused updates on minibatches of them           distill.opd_loss_from_scores
    ```

    Episodes past the round's allowance are neither paid for nor trained
    on (the compiled round scores all `episodes_per_round`, a fixed shape,
    and drops theirs). `beta` is GKD's β (a Python float: it selects the
    divergence).
    """
    E = config.episodes_per_round
    B = min(config.batch_episodes, E)
    eot, wait = token_specials(env)
    sampler = student.policy()

    def round_fn(state: TokenRunState, demos: Demos, expert_params: Any):
        hp, r = state.hp, state.round
        key, k_roll = jax.random.split(state.key)
        ep = from_episodes(env, run_episodes(env, sampler, state.params, k_roll, E))
        scored = expert_tokens_scored(ep)
        allowance = ((hp.budget - hp.demo_labels) * (r + 1)) // config.rounds - state.spent
        within = L.within_allowance(scored, allowance)
        ep = ep.replace(mask=ep.mask & within[:, None])
        scores = expert_log_probs(expert, expert_params, ep)
        mask = jax.vmap(agent_token_mask, in_axes=(0, None, 0))(ep.mask, env.spec.num_agents,
                                                               ep.avail)
        buf = insert_episodes(jax.tree.map(jnp.zeros_like, state.buffer), ep.obs, ep.avail,
                              ep.actions, mask, within)
        speak = jax.vmap(functools.partial(speaking, wait=wait))(ep.avail, ep.mask)
        turns = jnp.sum(speak & (ep.actions == eot), axis=(1, 2), dtype=jnp.int32)
        n = jnp.sum(within, dtype=jnp.int32)
        paid = lambda x: jnp.sum(jnp.where(within, x, 0), dtype=jnp.int32)
        new = state.replace(buffer=buf, key=key, round=r + 1, spent=state.spent + paid(scored),
                            expert_turns=state.expert_turns + paid(turns),
                            expert_episodes=state.expert_episodes + paid(scored > 0))

        def one(s: TokenRunState, k):
            # B episodes of the round, those within the allowance first.
            order = jnp.argsort(jnp.where(within, jax.random.uniform(k, (E,)), 2.0))[:B]
            loss, grads = jax.value_and_grad(lambda p: opd_loss_from_scores(
                student, p, scores[order], ep.take(order), beta))(s.params)
            updates, opt = tx.update(grads, s.opt_state, s.params)
            return s.replace(params=optax.apply_updates(s.params, updates), opt_state=opt), {
                "loss": loss}

        trained, last, health = fused_updates(one, new, config.updates_per_round)
        # No episode within the allowance: no update (Adam's momentum alone
        # would still move the student).
        keep = lambda a, b: jax.tree.map(lambda x, y: jnp.where(n > 0, x, y), a, b)
        new = trained.replace(params=keep(trained.params, new.params),
                              opt_state=keep(trained.opt_state, new.opt_state))
        metrics = dict(
            loss=last["loss"], beta=expert_probability(r, hp.beta0, hp.beta_kind, hp.beta_rate),
            interactive_tokens=new.spent, episodes_within_budget=n, episodes_kept=n,
            accept_rate=jnp.float32(1.0),
            rollout_win_rate=jnp.sum(jnp.where(within, ep.won, 0.0)) / jnp.maximum(n, 1),
            expert_share=jnp.float32(0.0), trained_tokens=jnp.sum(mask), buffer_size=buf.size)
        return new, metrics, health

    return round_fn


def demo_accounting(env: MultiAgentEnv, demos: TokenEpisodes) -> dict[str, np.ndarray]:
    """Cumulative expert tokens, turns and episodes after each demonstration."""
    eot, wait = token_specials(env)
    valid, avail = np.asarray(demos.mask), np.asarray(demos.avail)
    speak = np.asarray(jax.vmap(functools.partial(speaking, wait=wait))(avail, valid))
    tokens = speak.sum(axis=(1, 2))
    turns = (speak & (np.asarray(demos.actions) == eot)).sum(axis=(1, 2))
    return dict(tokens=np.cumsum(tokens), turns=np.cumsum(turns),
                episodes=np.arange(1, len(tokens) + 1))


def episodes_within(tokens: int, cum_tokens: np.ndarray) -> int:
    """Whole demonstration episodes (a prefix) costing at most `tokens`."""
    return int(np.searchsorted(cum_tokens, tokens, side="right"))


def _demos_for(env, expert, expert_params, key, need_tokens: int) -> Demos:
    n = 64
    while True:
        eps = collect_demos(env, expert, expert_params, key, n)
        cum = demo_accounting(env, eps)["tokens"]
        if cum[-1] >= need_tokens:
            break
        n = int(np.ceil(n * need_tokens / max(cum[-1], 1) * 1.1)) + 8
    mask = jax.vmap(agent_token_mask, in_axes=(0, None, 0))(eps.mask, env.spec.num_agents,
                                                           eps.avail)
    return Demos(episodes=eps, mask=mask)


def identity(env: MultiAgentEnv, regimes, seeds: int, config: TokenInteractiveConfig,
             base_seed: int, expert_name: str, model: Optional[TaskModel] = None) -> dict:
    """What determines a run's result, as its run directory records it (a
    pretrained student by its starting parameters' digest)."""
    task = {k: v for k, v in sorted(vars(env).items())
            if isinstance(v, (bool, int, float, str)) and not k.startswith("_")}
    return dict(learner="token-interactive", env_id=env.spec.env_id, spec=env.spec.to_dict(),
                task=task, config=dataclasses.asdict(config), expert=expert_name,
                regimes=[dict(name=n, **{k: (float(v) if isinstance(v, float) else v)
                                         for k, v in h.items()}) for n, h in regimes],
                seeds=seeds, base_seed=base_seed,
                **({} if model is None else
                   {"model": params_digest(model.params)[:16]}))


def run(env: MultiAgentEnv, expert: Any, expert_params: Any,
        regimes: Sequence[tuple[str, dict]], *, seeds: int,
        config: TokenInteractiveConfig = TokenInteractiveConfig(), base_seed: int = 0,
        out_dir: Optional[str | Path] = None, resume: bool = False, overwrite: bool = False,
        eval_every: int = 1, progress: bool = False, expert_name: str = "scripted",
        stop_after_rounds: Optional[int] = None,
        model: Optional[TaskModel] = None,
        start_cache: Optional[str | Path] = None) -> engine.RunResult:
    """Run every regime × `seeds` seeds together (see the module docstring).

    `expert`: an acting expert (a
    [`jaxil.envs.policies.Policy`][jaxil.envs.policies.Policy], e.g. the task's
    scripted one) or an expert LM (a
    [`TransformerPolicy`][jaxil.nn.transformer.TransformerPolicy], acting
    greedily; `opd` reads its distribution). `regimes`: `(name, knobs)` pairs
    from [`token_regime`][jaxil.algorithms.lm.interactive.token_regime] (`opd`
    regimes alone, with one β). Returns the engine's
    [`jaxil.runs.engine.RunResult`][jaxil.runs.engine.RunResult]: `rows` (one
    per evaluation and run: `round`, `regime`, `seed`, `expert_tokens`,
    `expert_turns`, `expert_episodes`, `eval_win_rate`, `eval_return` and the
    round's metrics), `summary` (per regime, mean ± std over seeds at the last
    evaluation; also `results.json`) and `state` (the students' parameters
    `state.params`, stacked `[R]`). `stop_after_rounds` stops early, as a kill
    would (`resume` continues). `model`: a pretrained student (a
    [`TaskModel`][jaxil.nn.task_vocab.TaskModel] of this environment, e.g.
    [`chat_model`][jaxil.nn.task_vocab.chat_model] for a chat-form task): every
    run starts from its parameters and `config.size` / `agent_ids` are not
    used. `start_cache`: a directory that keeps the SFT start of each seed, so
    that programs which split one sweep's regimes (to bound memory) train it
    once: a start is read back only when the students before SFT, the
    demonstrations and the whole configuration are the same (`sft_start_key`);
    otherwise it is trained and written beside the others.

    Raises:
      ValueError: not a token environment, a bad setting or regime, `opd`
        beside another method or without an expert LM, or a `resume` with
        other settings.
      jaxil.runs.guard.NonFiniteError: a loss or the parameters became
        non-finite.
    """
    _check_token_env(env)
    if not regimes:
        raise ValueError("an interactive run needs at least one regime")
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    if not 1 <= eval_every <= config.rounds or config.rounds % eval_every:
        raise ValueError(f"eval_every must divide the {config.rounds} rounds, got {eval_every}")
    names = [n for n, _ in regimes]
    if len(set(names)) != len(names):
        raise ValueError(f"regime names must be unique, got {names}")
    recorded, (regimes, distill_beta) = regimes, _split_distill(regimes)
    if distill_beta is not None:
        check_expert_lm(make_student(env, config, model), expert)
    for name, h in regimes:
        check_regime(h, config.sft_tokens)
        if h["scratch"]:
            raise ValueError(f"regime {name}: scratch retraining is not supported on token tasks")
    rd = None
    if out_dir is not None:
        rd = engine.open_run(out_dir, identity(env, recorded, seeds, config, base_seed,
                                               expert_name, model),
                             step_key="round", resume=resume, overwrite=overwrite)
    try:
        if model is not None:
            check_model(env, dataclasses.replace(SFTConfig(), agent_ids=config.agent_ids), model)
        program = _program(env, expert, expert_params, regimes, seeds, config, base_seed,
                           eval_every, distill_beta, model, start_cache)
    except BaseException:
        if rd is not None:
            rd.close()
        raise
    res = engine.run(program, rundir=rd, progress=progress, stop_after_chunks=stop_after_rounds)
    for line in res.summary.get("budget_warnings", []):
        warnings.warn(line, BudgetUnderspent, stacklevel=2)
    return res


def _split_distill(regimes) -> tuple[list[tuple[str, dict]], Optional[float]]:
    """`(regimes without OPD's β, that β or None)`: a run is all `opd`
    regimes with one β, or none (one-line `ValueError` otherwise)."""
    betas = {n: h.get(DISTILL_BETA) for n, h in regimes}
    opd = sorted(n for n, b in betas.items() if b is not None)
    if opd and len(opd) < len(regimes):
        other = sorted(set(betas) - set(opd))
        raise ValueError(f"opd regimes ({', '.join(opd)}) train on their own loss and run "
                         f"without the other methods ({', '.join(other)}); run them in another "
                         "call")
    if len({betas[n] for n in opd}) > 1:
        raise ValueError(f"opd regimes of one run share GKD's beta (it is compiled in), got "
                         f"{sorted({betas[n] for n in opd})}; run each beta in its own call")
    stripped = [(n, {k: v for k, v in h.items() if k != DISTILL_BETA}) for n, h in regimes]
    return stripped, (betas[opd[0]] if opd else None)


def budget_warnings(table: Sequence[dict], budgets: dict[str, int], episode_tokens: float,
                    config: TokenInteractiveConfig,
                    demo_tokens: Optional[dict[str, float]] = None,
                    round_tokens: Optional[dict[str, int]] = None) -> list[str]:
    """One line per regime of a summary `table` that did not spend its
    budget, with the numbers and the fix: its rounds bought nothing at all
    (`demo_tokens`, the regime's mean demonstration cost, given: its mean
    expert tokens are no more than that, though the budget is larger, and
    its rounds had tokens to buy with, `round_tokens`, the budget less its
    demonstration allowance, when given: BC's rounds have none, and its
    whole-episode demonstrations may cost a little less than its budget),
    or its mean expert tokens fall more than one expert episode
    (`episode_tokens`) short of its budget."""
    out = []
    for g in table:
        budget, spent = budgets.get(g["regime"]), g.get("expert_tokens_mean")
        if budget is None or spent is None:
            continue
        demo = None if demo_tokens is None else demo_tokens.get(g["regime"])
        seeds = f"{g['seeds']} seed{'s' if g['seeds'] != 1 else ''}"
        buys = round_tokens is None or round_tokens.get(g["regime"], 1) > 0
        if demo is not None and spent <= demo < budget and buys:
            allowance = (budget - demo) / config.rounds
            out.append(
                f"{g['regime']} bought no expert tokens in its rounds (mean over {seeds}; its "
                f"demonstrations cost {demo:.0f} of its {budget}): a round pays for its rollouts "
                f"in order while they fit its allowance of about {allowance:.0f} tokens, and in "
                "every round the first that needed the expert cost more (an opd rollout costs "
                "every token the student writes); raise the budget or lower --rounds (rounds)")
        elif budget - spent > episode_tokens:
            out.append(
                f"{g['regime']} spent {spent:.0f} of its {budget} expert tokens (mean over "
                f"{seeds}; one expert episode is {episode_tokens:.0f}): its "
                f"{config.episodes_per_round} rollouts per round × {config.rounds} rounds could "
                "not use the allowance; raise --episodes-per-round (episodes_per_round) or "
                "--rounds so that every regime spends its budget")
    return out


def sft_start_key(config: TokenInteractiveConfig, student: TransformerPolicy, state: Any,
                  demos: Any) -> str:
    """The digest that names a cached SFT start: everything the start
    depends on, namely the configuration, the student's architecture, the
    students before SFT (`state`: parameters, optimizer state and keys of
    every seed) and the arrays of the demonstrations it trains on. A regime's knobs
    (`state.hp`) are left out: SFT draws only demonstrations (the buffer
    is empty), whatever the regime's demonstration ratio."""
    head = repr((sorted(dataclasses.asdict(config).items()), student.config)).encode()
    body = params_digest((state.replace(hp=None), demos)).encode()
    return hashlib.sha256(head + body).hexdigest()[:24]


def _cached_sft(train: Any, check: Any, state: Any, key: Optional[str],
                cache: Optional[str | Path]) -> Any:
    """`train(state)`'s start after `check(health)`, or the start cached
    under `key` in `cache`; a freshly trained start that passed `check` is
    written there (atomically, so a killed writer leaves no half file).
    The file leaves out the episode buffer, which SFT leaves empty (with a
    pretrained vocabulary its legal-token masks are most of the state)."""
    path = None if cache is None else Path(cache) / f"sft-start-{key}.npz"
    if path is not None and path.is_file():
        ref = state.replace(buffer=None)
        with np.load(path) as f:
            leaves = [f[f"a{i}"] for i in range(len(f.files))]
        if [(a.shape, a.dtype) for a in leaves] != [(r.shape, r.dtype)
                                                    for r in jax.tree.leaves(ref)]:
            raise ValueError(f"{path} does not hold this program's SFT start (its arrays "
                             "differ); delete it and run again")
        loaded = jax.tree.unflatten(jax.tree.structure(ref), [jnp.asarray(a) for a in leaves])
        return loaded.replace(buffer=state.buffer)
    state, _, health = train(state)
    check(jax.device_get(health))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.stem + ".tmp.npz")
        kept = jax.device_get(jax.tree.leaves(state.replace(buffer=None)))
        np.savez(tmp, **{f"a{i}": np.asarray(x) for i, x in enumerate(kept)})
        tmp.replace(path)
    return state


def _program(env, expert, expert_params, regimes, seeds, config, base_seed, eval_every,
             distill_beta=None, model=None, start_cache=None):
    need = max(int(h["demo_labels"]) for _, h in regimes)
    # An expert LM acts greedily (the demonstrations, takeovers and labels);
    # OPD reads its distribution.
    acting = expert.policy(deterministic=True) if isinstance(expert, TransformerPolicy) else expert
    demos = _demos_for(env, acting, expert_params, jax.random.PRNGKey(base_seed + 777_777),
                       max(need, config.sft_tokens))
    acc = demo_accounting(env, demos.episodes)
    sft_eps = episodes_within(config.sft_tokens, acc["tokens"])
    if sft_eps == 0:
        raise ValueError(f"sft_tokens={config.sft_tokens} is less than one expert episode "
                         f"({int(acc['tokens'][0])} tokens); raise it")
    turns_mean = float(acc["turns"][-1] / acc["episodes"][-1])
    regimes = [(n, resolve_auto(h, turns_mean, 1.0)) for n, h in regimes]
    for _, h in regimes:
        check_regime(h, config.sft_tokens)
    runs = [(name, s) for name, _ in regimes for s in range(seeds)]
    hps = [dict(h) for _, h in regimes for _ in range(seeds)]
    demo_eps = [episodes_within(int(h["demo_labels"]), acc["tokens"]) for h in hps]
    demo_cost = {k: np.asarray([acc[k][e - 1] for e in demo_eps], np.int64)
                 for k in ("tokens", "turns", "episodes")}

    student = make_student(env, config, model)
    tx = _optimizer(config)
    if distill_beta is None:
        round_fn = make_round(env, student, acting, config, tx)
        capacity = config.buffer_episodes
    else:  # the buffer holds the round's own episodes
        round_fn = make_opd_round(env, student, expert, config, tx, distill_beta)
        capacity = config.episodes_per_round
    rounds = jax.jit(jax.vmap(round_fn, in_axes=(0, None, None)))
    policy = student.policy(deterministic=True)
    eval_key = jax.random.PRNGKey(base_seed + 10_000)

    def evaluate_one(params):
        ep = run_episodes(env, policy, params, eval_key, config.eval_episodes)
        return {"eval_win_rate": ep.won.astype(jnp.float32), "eval_return": ep.episode_return}

    evaluate = jax.jit(jax.vmap(evaluate_one))
    hp = stack_regimes(hps)
    seed_keys = lambda: jnp.stack([jax.random.PRNGKey(base_seed + s) for s in range(seeds)])
    if model is None:
        initial_params = lambda key: student.init(jax.random.split(key)[0])
    else:  # every seed starts from the model (vmapped eagerly: broadcast, not a constant)
        initial_params = lambda key: model.params

    def untrained() -> list[dict]:
        """The students before any training (before the SFT start), scored
        like the others: one row per seed, evaluated in the runs' shape so
        that the compiled evaluation is shared."""
        params = jax.vmap(initial_params)(seed_keys())
        pick = jnp.asarray([s for _, s in runs])
        vals = jax.device_get(evaluate(jax.tree.map(lambda x: x[pick], params)))
        first = [i for i, (n, _) in enumerate(runs) if n == runs[0][0]]
        return [dict(round=0, run=i, seed=runs[i][1],
                     eval_win_rate=float(np.mean(vals["eval_win_rate"][i])),
                     eval_return=float(np.mean(vals["eval_return"][i]))) for i in first]

    def init():
        uniq = list(range(seeds))
        keys = seed_keys()

        def one(key):
            k_run = jax.random.split(key)[1]
            params = initial_params(key)
            return TokenRunState(
                params=params, opt_state=tx.init(params), hp=jax.tree.map(lambda x: x[0], hp),
                buffer=empty_buffer(env, capacity), spent=jnp.int32(0),
                expert_turns=jnp.int32(0), expert_episodes=jnp.int32(0),
                demo_eps=jnp.int32(sft_eps), round=jnp.int32(0), key=k_run)

        base = jax.vmap(one)(keys)
        if config.sft_updates:
            sft = jax.jit(jax.vmap(lambda s: _train(student, tx, s, demos, config.sft_updates,
                                                    config.batch_episodes)))
            check = functools.partial(guard.check, learner="token interactive student (SFT)",
                                      run_labels=[f"seed {s}" for s in uniq], first_step=1,
                                      chunk_len=config.sft_updates)
            # SFT reads only the first `sft_eps` demonstrations, and a larger
            # set begins with the same episodes (collection draws episode i's
            # keys alike whatever the count), so the key covers those alone.
            key = None if start_cache is None else sft_start_key(
                config, student, base, jax.tree.map(lambda x: x[:sft_eps], demos))
            base = _cached_sft(sft, check, base, key, start_cache)
        pick = jnp.asarray([s for _, s in runs])
        st = jax.tree.map(lambda x: x[pick], base)
        opt = jax.vmap(_set_lr)(st.opt_state, hp.lr)
        keys = jax.vmap(lambda k, i: jax.random.fold_in(k, i))(st.key, jnp.arange(len(runs)))
        return st.replace(hp=hp, opt_state=opt, demo_eps=jnp.asarray(demo_eps, jnp.int32),
                          key=keys)

    def with_costs(state, values):
        spent = np.asarray(state.spent, np.int64)
        return dict(values, expert_tokens=demo_cost["tokens"] + spent,
                    expert_turns=demo_cost["turns"] + np.asarray(state.expert_turns, np.int64),
                    expert_episodes=demo_cost["episodes"]
                    + np.asarray(state.expert_episodes, np.int64))

    def summarize(rows):
        step, table = summarize_step(rows, "round", group=lambda r: r["regime"],
                                     group_name="regime", order=names,
                                     means=("expert_tokens", "expert_turns", "expert_episodes"))
        episode_tokens = float(acc["tokens"][-1] / len(acc["tokens"]))
        # Reference rows: the students before any training, and the shared
        # SFT start (round 0, the same for every regime of a seed).
        _, before = summarize_step(untrained(), "round", group=lambda r: "untrained student",
                                   group_name="regime")
        start = [r for r in rows if r["round"] == 0 and r["regime"] == names[0]]
        label = "SFT start (round 0)" if config.sft_updates else "untrained start (round 0)"
        _, sft_start = summarize_step(start, "round", group=lambda r: label,
                                      group_name="regime")
        start_tokens = float(acc["tokens"][sft_eps - 1]) if config.sft_updates else 0.0
        for g, tokens in ((before, 0.0), (sft_start, start_tokens)):
            for entry in g:
                entry["expert_tokens_mean"] = tokens
        budgets = {n: int(h["budget"]) for n, h in regimes}
        demo_tokens = {n: float(np.mean([demo_cost["tokens"][i] for i, (m, _) in enumerate(runs)
                                         if m == n])) for n in names}
        return {"env_id": env.spec.env_id, "round": step, "regimes": table,
                "reference": before + sft_start,
                "budget_warnings": budget_warnings(
                    table, budgets, episode_tokens, config, demo_tokens,
                    {n: int(h["budget"]) - int(h["demo_labels"]) for n, h in regimes}),
                "demos": dict(sft_episodes=sft_eps, expert_turns_mean=turns_mean,
                              expert_tokens_mean=episode_tokens)}

    names = [n for n, _ in regimes]
    return engine.Program(
        name=f"interactive transformer on {env.spec.env_id}", step_key="round",
        num_chunks=config.rounds, steps_per_chunk=config.updates_per_round,
        eval_every=eval_every, eval_at_start=True,
        run_ids=[dict(run=i, regime=n, seed=s) for i, (n, s) in enumerate(runs)],
        run_labels=[f"run {i} ({n}, seed {s})" for i, (n, s) in enumerate(runs)],
        init=init,
        chunk=lambda s, c: rounds(s, demos, expert_params),
        evaluate=lambda s, c: with_costs(jax.device_get(s), evaluate(s.params)),
        summarize=summarize,
        postfix=lambda v: dict(win=f"{np.mean(v['eval_win_rate']):.2f}",
                               tokens=f"{np.mean(v['expert_tokens']):.0f}"))


def format_table(summary: dict) -> str:
    """The results table of [`run`][jaxil.algorithms.lm.interactive.run]:
    the reference rows (the untrained students, the SFT start), one line per
    regime, then a `warning:` line per regime that did not spend its budget."""
    rows = list(summary.get("reference", [])) + list(summary["regimes"])
    table = fmt_table(rows, [("regime", "regime", "{}", "<"),
                             ("seeds", "seeds", "{}"),
                             ("expert_tokens_mean", "expert tokens", "{:.3f}"),
                             mean_std("win", "win rate"),
                             mean_std("return", "return")])
    return "\n".join([table] + [f"warning: {w}" for w in summary.get("budget_warnings", [])])
