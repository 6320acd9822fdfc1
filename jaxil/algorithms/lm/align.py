"""RL of a token policy against a learned sequence reward, with a per-token
KL penalty towards π_SFT (the RL step of alignment from demonstrations).

The policy starts at π_SFT's parameters. Each update draws M prompts (task
instances) and rolls the policy out K times from each
([`jaxil.algorithms.lm.best_of_n.same_start_token_episodes`][jaxil.algorithms.lm.best_of_n.same_start_token_episodes]).
A token reward function gives per-token rewards `r_ti` and their read mask
`ρ_ti` (a learned model:
[`jaxil.algorithms.lm.reward.token_rewards_of`][jaxil.algorithms.lm.reward.token_rewards_of];
the analytic r_c:
[`jaxil.algorithms.lm.reward.analytic_token_rewards`][jaxil.algorithms.lm.reward.analytic_token_rewards]).
Each agent token the policy chose (mask `m`) pays the one-sample KL penalty of
[`jaxil.losses.kl_penalized_reward`][jaxil.losses.adversarial.kl_penalized_reward],

    r̃_ti = ρ_ti · r_ti − β · m_ti · (log π_θ(a_ti|h_ti) − log π_SFT(a_ti|h_ti)),

whose expectation under π_θ is `Σ_t KL(π_θ(·|h_t) ‖
π_SFT(·|h_t))` summed over the episode's tokens. The episode's return
`R = Σ_{t,i} r̃_ti` enters a REINFORCE update with a leave-one-out baseline
over the prompt's K rollouts
([`jaxil.losses.leave_one_out_advantages`][jaxil.losses.sequence.leave_one_out_advantages],
[`jaxil.losses.reinforce_loss`][jaxil.losses.sequence.reinforce_loss]).

**Why REINFORCE with a leave-one-out baseline, not PPO.** The reward is a
score of the whole episode (a sum of per-token reads, most of them near the
end, where the discriminator sees whether the work was done), so a critic
would have to learn a value of partial token histories from a few thousand
episodes, which is what makes PPO's advantages noisy on short budgets; the K
rollouts of one prompt give an unbiased per-prompt baseline for free, as in
RLOO (Ahmadian et al., arXiv 2402.14740), which matches PPO on RL from
learned rewards for language models. Every update is on fresh on-policy
episodes, one gradient step each, so no importance ratio or clipping is
needed.

Runs are stacked `[R]` over (seed, KL coefficient) pairs, each with its own
π_SFT and reward parameters, in one compiled program run by
[`jaxil.runs.engine.run`][jaxil.runs.engine.run] (run directories, resume, the
guard). The evaluation rolls every policy out on the same fixed instances and
reports the true score and success (`eval_return`, `eval_win_rate`), the
learned reward of those episodes (`eval_reward`) and their KL to π_SFT
(`eval_kl`, the per-episode sum of the token log-ratios on the policy's own
samples). Reward hacking shows as `eval_reward` rising while `eval_return`
falls.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxil import envs
from jaxil.algorithms.lm.best_of_n import same_start_token_episodes
from jaxil.algorithms.lm.reward import check_stacked, masked_episode_sum
from jaxil.algorithms.lm.sft import (
    SFTConfig,
    SFTState,
    TokenEpisodes,
    _check_token_env,
    _token_mask,
    check_model,
    from_episodes,
)
from jaxil.losses import kl_penalized_reward, leave_one_out_advantages, reinforce_loss
from jaxil.nn.task_vocab import TaskModel
from jaxil.nn.transformer import SIZES, TransformerPolicy, config_for_env
from jaxil.runs import engine
from jaxil.runs.checkpoint import params_digest
from jaxil.runs.measure import format_table as fmt_table
from jaxil.runs.summary import mean_std
from jaxil.runs.summary import summarize_step
from jaxil.runs.updates import fused_updates

#: `(reward_params, episodes) -> (r [E, T, N], ρ [E, T, N])`: per-token
#: rewards and where they are read.
TokenReward = Callable[[Any, TokenEpisodes], tuple[jax.Array, jax.Array]]


@dataclasses.dataclass(frozen=True)
class AlignConfig:
    """Settings of RL against a learned reward.

    Attributes:
      size: the policy's transformer size (π_SFT's).
      agent_ids: the policy's agent-id embedding (π_SFT's).
      prompts: task instances per update (M).
      rollouts_per_prompt: rollouts of each (K ≥ 2, the leave-one-out
        baseline's group).
      learning_rate: Adam's step size.
      max_grad_norm: global-norm gradient clipping.
      num_updates: updates in the whole run.
      eval_every: updates per chunk; an evaluation and a checkpoint follow
        each (must divide `num_updates`).
      eval_episodes: rollouts per evaluation (sampled, as in training).
    """

    size: str = "tiny"
    agent_ids: bool = False
    prompts: int = 8
    rollouts_per_prompt: int = 4
    learning_rate: float = 1e-4
    max_grad_norm: float = 1.0
    num_updates: int = 200
    eval_every: int = 50
    eval_episodes: int = 64

    def __post_init__(self):
        if self.size not in SIZES:
            raise ValueError(f"AlignConfig.size must be one of {list(SIZES)}, got {self.size!r}")
        for name in ("prompts", "num_updates", "eval_every", "eval_episodes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"AlignConfig.{name} must be >= 1, got {getattr(self, name)}")
        if int(self.rollouts_per_prompt) < 2:
            raise ValueError("AlignConfig.rollouts_per_prompt must be >= 2 (the leave-one-out "
                             f"baseline), got {self.rollouts_per_prompt}")
        if not self.learning_rate > 0 or not self.max_grad_norm > 0:
            raise ValueError(f"AlignConfig.learning_rate and max_grad_norm must be positive, "
                             f"got {self.learning_rate} and {self.max_grad_norm}")
        if self.num_updates % self.eval_every:
            raise ValueError(f"AlignConfig.num_updates ({self.num_updates}) must be a multiple "
                             f"of eval_every ({self.eval_every})")


#: One run's state (stacked `[R]`): the policy, its optimiser, its key (SFT's).
AlignState = SFTState


def make_policy(env: envs.MultiAgentEnv, config: AlignConfig,
                model: Optional[TaskModel] = None) -> TransformerPolicy:
    """The transformer RL trains (π_SFT's architecture): `config.size`, or a
    pretrained `model`'s decoder (a
    [`TaskModel`][jaxil.nn.task_vocab.TaskModel] of `env`)."""
    if model is not None:
        check_model(env, dataclasses.replace(SFTConfig(), agent_ids=config.agent_ids), model)
        return TransformerPolicy(model.config)
    return TransformerPolicy(config_for_env(env, config.size, agent_ids=config.agent_ids))


def shaped_returns(rewards: jax.Array, reads: jax.Array, log_p: jax.Array,
                   log_p_ref: jax.Array, mask: jax.Array, kl_coef: jax.Array
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`(R [E], learned score S [E], KL estimate [E])` of a batch:

        S = Σ ρ·r,   KL = Σ m·(log π − log π_SFT),   R = S − β·KL

    (per token
    [`jaxil.losses.kl_penalized_reward`][jaxil.losses.adversarial.kl_penalized_reward],
    summed). All inputs `[E, T, N]` but `kl_coef` (β, a scalar); the
    log-probabilities are the sampled tokens' (masked-out entries may be
    non-finite)."""
    reads, mask = reads.astype(bool), mask.astype(bool)
    lp = jnp.where(mask, log_p, 0.0)
    lp_ref = jnp.where(mask, log_p_ref, 0.0)
    r = jnp.where(reads, rewards, 0.0)
    shaped = kl_penalized_reward(r, lp, lp_ref, kl_coef)
    return (jnp.sum(shaped, axis=(1, 2)), masked_episode_sum(r, reads),
            masked_episode_sum(lp - lp_ref, mask))


def align_program(env: envs.MultiAgentEnv, token_reward: TokenReward, reward_params: Any,
                  sft_params: Any, kl_coefs: Sequence[float], seeds: Sequence[int],
                  config: AlignConfig = AlignConfig(), eval_seed: int = 10_000,
                  model: Optional[TaskModel] = None) -> engine.Program:
    """The [`jaxil.runs.engine.Program`][jaxil.runs.engine.Program] of RL
    against `token_reward`.

    Run r trains from `sft_params[r]` against `token_reward(
    reward_params[r], ·)` with KL coefficient `kl_coefs[r]` and seed
    `seeds[r]` (every parameter tree stacked `[R]`). A chunk is
    `eval_every` fused updates of every run (one compiled `vmap`).
    Rows carry the last update's `loss`, `reward` (learned score),
    `kl`, `return` and `win_rate` of its training rollouts, and the
    evaluation's `eval_return`, `eval_win_rate`, `eval_reward` and
    `eval_kl` (also at update 0: π_SFT itself). With a pretrained `model`
    the policy is its decoder (`config.size` is not used) and `sft_params`
    are that decoder's parameters, e.g. the model fine-tuned by
    [`train_sft`][jaxil.algorithms.lm.sft.train_sft] in a chat-form task.
    """
    _check_token_env(env, "RL against a learned reward trains a transformer on token episodes")
    seeds = [int(s) for s in seeds]
    kl_coefs = [float(b) for b in kl_coefs]
    if not seeds or len(seeds) != len(kl_coefs):
        raise ValueError(f"align_program needs one KL coefficient per seed, got {len(seeds)} "
                         f"seeds and {len(kl_coefs)} coefficients")
    if any(not np.isfinite(b) or b < 0 for b in kl_coefs):
        raise ValueError(f"KL coefficients must be finite and >= 0, got {kl_coefs}")
    check_stacked(sft_params, len(seeds), "sft_params")
    check_stacked(reward_params, len(seeds), "reward_params")
    policy_net = make_policy(env, config, model)
    want = jax.tree.map(lambda x: tuple(x.shape), jax.eval_shape(policy_net.init,
                                                                 jax.random.PRNGKey(0)))
    got = jax.tree.map(lambda x: tuple(x.shape[1:]), sft_params)
    if want != got:
        raise ValueError("sft_params do not fit the policy's transformer; give AlignConfig "
                         "π_SFT's size and agent_ids (or model= for a pretrained π_SFT)")
    tx = optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                     optax.adam(config.learning_rate))
    sample = policy_net.policy()
    m, k = int(config.prompts), int(config.rollouts_per_prompt)
    betas = jnp.asarray(kl_coefs, jnp.float32)
    eval_key = jax.random.PRNGKey(eval_seed)

    def log_probs(params, eps):
        return jax.vmap(policy_net.episode_scores, in_axes=(None, 0, 0, 0))(
            params, eps.obs, eps.avail, eps.actions)[0]

    def update(state: AlignState, key, ref, rparams, beta):
        k_prompts, k_roll = jax.random.split(key)
        eps = same_start_token_episodes(env, sample, state.params,
                                        jax.random.split(k_prompts, m), k_roll, k)
        rewards, reads = token_reward(rparams, eps)
        mask = _token_mask(eps, forced_tokens=False)
        lp_ref = log_probs(ref, eps)

        def loss_fn(params):
            lp = log_probs(params, eps)
            ret, score, kl = shaped_returns(rewards, reads, jax.lax.stop_gradient(lp), lp_ref,
                                            mask, beta)
            adv = leave_one_out_advantages(ret.reshape(m, k)).reshape(-1)
            loss = reinforce_loss(lp, mask, adv)
            return loss, dict(loss=loss, reward=jnp.mean(score), kl=jnp.mean(kl),
                              **{"return": jnp.mean(eps.episode_return)},
                              win_rate=jnp.mean(eps.won))

        grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        return state.replace(params=optax.apply_updates(state.params, updates),
                             opt_state=opt_state), metrics

    def chunk_one(state, ref, rparams, beta):
        return fused_updates(lambda s, key: update(s, key, ref, rparams, beta), state,
                             config.eval_every)

    chunk = jax.jit(jax.vmap(chunk_one))

    def evaluate_one(params, ref, rparams):
        eps = from_episodes(env, envs.run_episodes(env, sample, params, eval_key,
                                                   config.eval_episodes))
        rewards, reads = token_reward(rparams, eps)
        mask = _token_mask(eps, forced_tokens=False)
        _, score, kl = shaped_returns(rewards, reads, log_probs(params, eps),
                                      log_probs(ref, eps), mask, jnp.float32(0))
        return dict(eval_return=eps.episode_return, eval_win_rate=eps.won, eval_reward=score,
                    eval_kl=kl)

    evaluate = jax.jit(jax.vmap(evaluate_one))

    def init_one(params, seed):
        return AlignState(params=params, opt_state=tx.init(params),
                          key=jax.random.PRNGKey(seed))

    labels = [f"seed {s}, kl {b:g}" for s, b in zip(seeds, kl_coefs)]

    def summarize(rows):
        step, points = summarize_step(rows, "update", group=lambda row: f"{row['kl_coef']:g}",
                                      group_name="kl_coef", means=("eval_reward", "eval_kl"))
        return {"learner": "align", "env_id": env.spec.env_id, "update": step, "points": points}

    return engine.Program(
        name=f"RL on a learned reward on {env.spec.env_id}", step_key="update",
        num_chunks=config.num_updates // config.eval_every,
        steps_per_chunk=config.eval_every, step_unit=config.eval_every,
        run_ids=[dict(run=i, seed=s, kl_coef=b) for i, (s, b) in enumerate(zip(seeds, kl_coefs))],
        run_labels=labels,
        init=lambda: jax.jit(jax.vmap(init_one))(sft_params, jnp.asarray(seeds, jnp.int32)),
        chunk=lambda s, c: chunk(s, sft_params, reward_params, betas),
        evaluate=lambda s, c: evaluate(s.params, sft_params, reward_params),
        eval_at_start=True, summarize=summarize,
        postfix=lambda v: dict(ret=f"{np.mean(v['eval_return']):.2f}",
                               rew=f"{np.mean(v['eval_reward']):.1f}",
                               kl=f"{np.mean(v['eval_kl']):.2f}"))


def format_table(summary: dict) -> str:
    """The results table of
    [`train_align`][jaxil.algorithms.lm.align.train_align]: one line per KL
    coefficient at the last evaluation (true score and success mean ± std over
    seeds, the learned reward and the KL to π_SFT)."""
    return fmt_table(summary["points"], [("kl_coef", "KL coef", "{:.3f}", "<"),
                                         ("seeds", "seeds", "{}"),
                                         mean_std("return", "true score"),
                                         mean_std("win", "success"),
                                         ("eval_reward_mean", "learned reward", "{:.3f}"),
                                         ("eval_kl_mean", "KL to SFT", "{:.3f}")])


def align_identity(env: envs.MultiAgentEnv, reward_name: str, reward_params: Any,
                   sft_params: Any, kl_coefs: Sequence[float], seeds: Sequence[int],
                   config: AlignConfig, eval_seed: int = 10_000) -> dict:
    """What determines an RL run's result, as its run directory records it
    (`resume` refuses a run whose identity differs; `num_updates` may
    grow)."""
    cfg = dataclasses.asdict(config)
    cfg.pop("num_updates")
    return dict(learner="align", env_id=env.spec.env_id, spec=env.spec.to_dict(), config=cfg,
                reward=reward_name, reward_params=params_digest(reward_params),
                sft_params=params_digest(sft_params), kl_coefs=[float(b) for b in kl_coefs],
                seeds=[int(s) for s in seeds], eval_seed=int(eval_seed))


def train_align(env: envs.MultiAgentEnv, token_reward: TokenReward, reward_params: Any,
                sft_params: Any, kl_coefs: Sequence[float], seeds: Sequence[int],
                config: AlignConfig = AlignConfig(), *, reward_name: str = "reward",
                out_dir: Optional[str | Path] = None, resume: bool = False,
                overwrite: bool = False, eval_seed: int = 10_000,
                progress: bool = False, stop_after_chunks: Optional[int] = None,
                model: Optional[TaskModel] = None) -> engine.RunResult:
    """RL against a learned reward
    ([`align_program`][jaxil.algorithms.lm.align.align_program] run by
    [`jaxil.runs.engine.run`][jaxil.runs.engine.run]): one run per (seed, KL
    coefficient).

    `out_dir` is the run directory (`run.json`, `metrics.jsonl`, checkpoints
    after every evaluation, `results.json`); `resume` continues a stopped run
    from its newest checkpoint and reproduces the uninterrupted run exactly
    (`stop_after_chunks` stops early, as a kill would). `reward_name` names the
    reward in the identity (e.g. `"init-sft"`); `model`: a pretrained π_SFT's
    architecture ([`align_program`][jaxil.algorithms.lm.align.align_program]).
    Returns the engine's
    [`jaxil.runs.engine.RunResult`][jaxil.runs.engine.RunResult] (`rows`,
    `state.params` `[R]`).

    Raises:
      ValueError: parameters not stacked per run, a bad setting, or a
        `resume` with other settings or parameters.
      jaxil.runs.guard.NonFiniteError: the loss or the parameters became
        non-finite.
    """
    program = align_program(env, token_reward, reward_params, sft_params, kl_coefs, seeds,
                            config, eval_seed, model)
    rd = None
    if out_dir is not None:
        rd = engine.open_run(out_dir, align_identity(env, reward_name, reward_params, sft_params,
                                                     kl_coefs, seeds, config, eval_seed),
                             step_key="update", resume=resume, overwrite=overwrite,
                             info=dict(num_updates=config.num_updates))
        if rd.latest is not None and rd.latest > config.num_updates:
            rd.close()
            raise ValueError(f"num_updates {config.num_updates} is less than the {rd.latest} "
                             f"updates already trained in {out_dir}")
    return engine.run(program, rundir=rd, progress=progress, stop_after_chunks=stop_after_chunks)
