"""Supervised fine-tuning (SFT) of a transformer policy on token episodes.

Behaviour cloning on a token environment: the demonstrations are whole episodes
(every agent's tokens of every step, with the legal-token masks they were
chosen under), and the student, a
[`jaxil.nn.transformer.TransformerPolicy`][jaxil.nn.transformer.TransformerPolicy],
is trained teacher-forced to maximise their likelihood,

    L(θ) = − Σ_{e,t,i} m_eti · log π_θ(a_eti | tokens of e up to t, agent i)
           / Σ_{e,t,i} m_eti,

with `log π` from
[`TransformerPolicy.episode_scores`][jaxil.nn.transformer.TransformerPolicy.episode_scores]
(one pass per agent and episode) and the mask `m` over the valid agent tokens
([`jaxil.losses.sequence.agent_token_mask`][jaxil.losses.sequence.agent_token_mask];
tokens the grammar forces are left out) —
[`jaxil.losses.sequence.masked_sequence_nll`][jaxil.losses.sequence.masked_sequence_nll].

- [`TokenEpisodes`][jaxil.algorithms.lm.sft.TokenEpisodes] — the dataset:
  EPISODES, not transitions (a token's distribution depends on the whole
  context before it). Only the token columns `obs[..., :K]` are kept: the
  privileged expert columns never reach a student.
- [`collect_demos`][jaxil.algorithms.lm.sft.collect_demos] — episodes of a
  policy (the scripted expert,
  [`envs.experts.scripted_expert`][jaxil.envs.experts.scripted_expert]) via
  [`envs.run_episodes`][jaxil.envs.rollout.run_episodes].
- [`sft_program`][jaxil.algorithms.lm.sft.sft_program] — the
  [`jaxil.runs.engine.Program`][jaxil.runs.engine.Program]: R seeds vmapped in
  one compiled chunk of fused Adam updates on minibatches of episodes; the
  evaluation is the students' own rollouts (success rate and return) on a fixed
  set of evaluation keys, and optionally the held-out demonstrations' token NLL
  and accuracy.
- [`train_sft`][jaxil.algorithms.lm.sft.train_sft] — that program run by
  [`jaxil.runs.engine.run`][jaxil.runs.engine.run] (run directory, resume,
  checkpoints and the non-finite guard).

The student is a from-scratch transformer of `SIZES[config.size]`, or a
pretrained model in the task's vocabulary (`model=`, a
[`jaxil.nn.task_vocab.TaskModel`][jaxil.nn.task_vocab.TaskModel]): fine-tuned
in full, or through low-rank adapters on its projection kernels
(`config.lora_rank`, [`jaxil.nn.lora`][jaxil.nn.lora]), in which case the
trained parameters are the adapters and the pretrained ones stay frozen
([`decoder_params`][jaxil.algorithms.lm.sft.decoder_params] merges them):

```python
from jaxil.nn.task_vocab import task_decoder, export_model

model = task_decoder("smollm2-135m-instruct", env)
cfg = SFTConfig(lora_rank=8, learning_rate=1e-3, num_updates=40, eval_every=20)
res = train_sft(env, demos, cfg, heldout=held, model=model, out_dir="runs/smol-lora")
params = decoder_params(jax.tree.map(lambda x: x[0], res.state.params), cfg, model)
export_model("runs/smol-lora/hf", model, params)   # transformers loads it
```
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxil import envs
from jaxil.envs.tokens import EOT, WAIT, TokenSpecials, token_specials
from jaxil.losses.sequence import agent_token_mask, masked_sequence_nll
from jaxil.nn import distributions as D
from jaxil.nn import lora
from jaxil.nn.task_vocab import TaskModel
from jaxil.nn.transformer import SIZES, TransformerPolicy, config_for_env
from jaxil.runs import engine
from jaxil.runs.checkpoint import params_digest
from jaxil.runs.summary import summarize_step
from jaxil.runs.updates import fused_updates


@struct.dataclass
class TokenEpisodes:
    """A batch of token episodes, batch-major; `T = spec.max_steps`.

    Steps at and after an episode's length are padding (`mask` False).

    Attributes:
      obs: `[E, T, N, K]` float token ids entering each agent's context at
        each step (the first `K = env.token_width` columns of the
        observations; the privileged columns are dropped).
      avail: `[E, T, N, V]` bool legal-token masks the actions were chosen
        under.
      actions: `[E, T, N]` int32 tokens the agents emitted.
      mask: `[E, T]` bool valid steps.
      won: `[E]` whether each episode was solved.
      episode_return: `[E]` each episode's return.
      env_id: the environment the episodes come from.
      eot: the environment's `<eot>` id (`env.eot_token`), which ends a turn.
      wait: its `<wait>` id (`env.wait_token`), an off-turn agent's token.
    """

    obs: jax.Array
    avail: jax.Array
    actions: jax.Array
    mask: jax.Array
    won: jax.Array
    episode_return: jax.Array
    env_id: str = struct.field(pytree_node=False, default="")
    eot: int = struct.field(pytree_node=False, default=EOT)
    wait: int = struct.field(pytree_node=False, default=WAIT)

    @property
    def num_episodes(self) -> int:
        return int(self.actions.shape[0])

    def take(self, index: Any) -> "TokenEpisodes":
        """The episodes at `index` (a slice or an index array)."""
        return jax.tree.map(lambda x: x[index], self)

    def digest(self) -> str:
        """A content hash of the episodes (recorded in a run's identity)."""
        h = hashlib.sha256(self.env_id.encode())
        for x in (self.obs, self.avail, self.actions, self.mask):
            a = np.ascontiguousarray(np.asarray(x))
            h.update(str((a.shape, a.dtype.str)).encode())
            h.update(a.tobytes())
        return h.hexdigest()[:16]


def from_episodes(env: envs.MultiAgentEnv, episodes: envs.Episodes) -> TokenEpisodes:
    """The [`TokenEpisodes`][jaxil.algorithms.lm.sft.TokenEpisodes] of
    [`envs.run_episodes`][jaxil.envs.rollout.run_episodes]' output on a token
    environment (the acted-on steps, token columns only)."""
    specials = _check_token_env(env)
    T, K = env.spec.max_steps, env.token_width
    return TokenEpisodes(
        obs=jnp.asarray(episodes.obs[:, :T, :, :K], jnp.float32),
        avail=jnp.asarray(episodes.avail_actions[:, :T], bool),
        actions=jnp.asarray(episodes.actions, jnp.int32),
        mask=jnp.asarray(episodes.mask, bool),
        won=jnp.asarray(episodes.won, jnp.float32),
        episode_return=jnp.asarray(episodes.episode_return, jnp.float32),
        env_id=env.spec.env_id, eot=specials.eot, wait=specials.wait)


def collect_demos(env: envs.MultiAgentEnv, policy: Any, params: Any, key: jax.Array,
                  num_episodes: int) -> TokenEpisodes:
    """`num_episodes` episodes of `policy` (e.g. the scripted expert of
    [`envs.experts.scripted_expert`][jaxil.envs.experts.scripted_expert],
    `params=None`) on `env`, as
    [`TokenEpisodes`][jaxil.algorithms.lm.sft.TokenEpisodes]; instances are
    drawn from `key`."""
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    _check_token_env(env)
    eps = jax.jit(lambda p, k: envs.run_episodes(env, policy, p, k, num_episodes))(params, key)
    return from_episodes(env, eps)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Settings of one SFT run.

    Attributes:
      size: the transformer size (`jaxil.nn.transformer.SIZES`) of a
        student trained from scratch (a pretrained model brings its own).
      agent_ids: add the learned agent-id embedding (agents that differ,
        e.g. `tokens:exchange`; not with a pretrained model).
      learning_rate: Adam's step size.
      max_grad_norm: global-norm gradient clipping.
      batch_episodes: episodes per minibatch (drawn with replacement).
      num_updates: updates in the whole run.
      eval_every: updates per chunk; an evaluation and a checkpoint follow
        each chunk (must divide `num_updates`).
      eval_episodes: the students' rollouts per evaluation.
      deterministic_eval: evaluate the most likely legal token (greedy
        decoding) instead of sampling.
      forced_tokens: also count the tokens the grammar forces (one legal
        token) in the loss; they carry no gradient either way.
      lora_rank: train low-rank adapters of this rank on a pretrained
        model's projection kernels ([`jaxil.nn.lora`][jaxil.nn.lora]) instead of
        all its parameters; None: full fine-tuning.
      lora_alpha: the adapters' α (the update is scaled by α / rank).
    """

    size: str = "tiny"
    agent_ids: bool = False
    learning_rate: float = 1e-3
    max_grad_norm: float = 1.0
    batch_episodes: int = 32
    num_updates: int = 400
    eval_every: int = 200
    eval_episodes: int = 64
    deterministic_eval: bool = True
    forced_tokens: bool = False
    lora_rank: Optional[int] = None
    lora_alpha: float = 16.0

    def __post_init__(self):
        if self.size not in SIZES:
            raise ValueError(f"SFTConfig.size must be one of {list(SIZES)}, got {self.size!r}")
        for name in ("batch_episodes", "num_updates", "eval_every", "eval_episodes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"SFTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not self.learning_rate > 0 or not self.max_grad_norm > 0:
            raise ValueError(f"SFTConfig.learning_rate and max_grad_norm must be positive, got "
                             f"{self.learning_rate} and {self.max_grad_norm}")
        if self.num_updates % self.eval_every:
            raise ValueError(f"SFTConfig.num_updates ({self.num_updates}) must be a multiple of "
                             f"eval_every ({self.eval_every})")
        if self.lora_rank is not None:  # one-line errors for a bad rank or alpha
            lora.LoraConfig(rank=self.lora_rank, alpha=self.lora_alpha)

    @property
    def lora(self) -> Optional[lora.LoraConfig]:
        """The adapters' settings, None for full fine-tuning."""
        if self.lora_rank is None:
            return None
        return lora.LoraConfig(rank=self.lora_rank, alpha=self.lora_alpha)


@struct.dataclass
class SFTState:
    """One run's training state (stacked `[R]` over runs in a program)."""

    params: Any
    opt_state: Any
    key: jax.Array


def make_student(env: envs.MultiAgentEnv, config: SFTConfig,
                 model: Optional[TaskModel] = None) -> TransformerPolicy:
    """The transformer an SFT run with `config` trains on `env` (the
    pretrained `model`'s decoder when given)."""
    if model is not None:
        return TransformerPolicy(model.config)
    return TransformerPolicy(config_for_env(env, config.size, agent_ids=config.agent_ids))


def decoder_params(params: Any, config: SFTConfig, model: Optional[TaskModel] = None) -> Any:
    """The decoder parameters of one run's trained `params` (an
    [`SFTState`][jaxil.algorithms.lm.sft.SFTState]'s, unstacked): the
    adapters merged into the pretrained parameters under LoRA, `params`
    themselves otherwise."""
    if model is not None and config.lora is not None:
        return lora.merge(model.params, params, config.lora)
    return params


def check_model(env: envs.MultiAgentEnv, config: SFTConfig, model: Optional[TaskModel]) -> None:
    """Raise a one-line `ValueError` unless `model` (None: from scratch)
    and `config` fit `env`: a model of this task's vocabulary, width and
    context; LoRA only with a model; no agent-id embedding with one."""
    if model is None:
        if config.lora is not None:
            raise ValueError("LoRA adapts a pretrained model: give one (model=task_decoder(...), "
                             "--model NAME) or leave out lora_rank (--lora)")
        return
    if not isinstance(model, TaskModel):
        raise ValueError(f"model must be a TaskModel (jaxil.nn.task_vocab.task_decoder), got "
                         f"{type(model).__name__}")
    if config.agent_ids:
        raise ValueError("a pretrained model has no agent-id embedding; leave out agent_ids "
                         "(--agent-ids): the agents' prompts tell them apart")
    eid, c = env.spec.env_id, model.config
    names = env.vocab.names if hasattr(env, "vocab") else getattr(env, "token_names", ())
    want = (tuple(names), env.token_width, env.max_context)
    got = (model.vocab.names, c.token_width, c.max_context)
    if want != got or c.vocab_size != env.spec.num_actions:
        raise ValueError(f"the model was mapped for another task or setting (vocabulary of "
                         f"{len(got[0])}, token_width {got[1]}, max_context {got[2]}) than {eid} "
                         f"({len(want[0])}, {want[1]}, {want[2]}); build it with "
                         "task_decoder(name, env) for this environment")


def initial_params(student: TransformerPolicy, seed: int) -> Any:
    """The parameters an SFT run of `seed` starts from (π_0 of alignment
    from demonstrations: the same network before fine-tuning)."""
    return student.init(jax.random.split(jax.random.PRNGKey(seed))[0])


def _check_token_env(env: envs.MultiAgentEnv,
                     why: str = "SFT trains a transformer on token episodes") -> TokenSpecials:
    """The environment's special tokens, after checking it is a token
    environment (one-line `ValueError` otherwise)."""
    if not (hasattr(env, "token_width") and hasattr(env, "max_context")):
        raise ValueError(f"{env.spec.env_id} is not a token environment (tokens:repair, "
                         f"tokens:arith, tokens:exchange); {why}")
    return token_specials(env)


def check_demos(env: envs.MultiAgentEnv, demos: TokenEpisodes, what: str = "demos") -> None:
    """Raise a one-line `ValueError` unless `demos` are token episodes of
    `env` in its configuration (widths, agents, vocabulary, episode length)."""
    specials = _check_token_env(env)
    if not isinstance(demos, TokenEpisodes):
        raise ValueError(f"{what} must be TokenEpisodes (collect_demos / from_episodes), got "
                         f"{type(demos).__name__}")
    spec = env.spec
    eid = spec.env_id
    if demos.env_id != eid:
        raise ValueError(f"{what} come from {demos.env_id or 'an unnamed environment'} but the "
                         f"environment is {eid}; collect them on this environment")
    if (demos.eot, demos.wait) != tuple(specials):
        raise ValueError(f"{what} mark turns with <eot>={demos.eot} / <wait>={demos.wait} but "
                         f"{eid} uses {specials.eot} / {specials.wait}; build them with "
                         "from_episodes(env, ...)")
    E = demos.actions.shape[0] if demos.actions.ndim else 0
    want = {"obs": (E, spec.max_steps, spec.num_agents, env.token_width),
            "avail": (E, spec.max_steps, spec.num_agents, spec.num_actions),
            "actions": (E, spec.max_steps, spec.num_agents),
            "mask": (E, spec.max_steps), "won": (E,), "episode_return": (E,)}
    for field, shape in want.items():
        got = tuple(getattr(demos, field).shape)
        if got != shape:
            raise ValueError(
                f"{what} field `{field}` has shape {got} but {eid} in this configuration needs "
                f"{shape} ([episodes, max_steps={spec.max_steps}, agents={spec.num_agents}, "
                f"token_width={env.token_width} / vocabulary={spec.num_actions}]); collect them "
                "with the same difficulty settings")
    if E < 1:
        raise ValueError(f"{what} hold no episode")


def _token_mask(batch: TokenEpisodes, forced_tokens: bool) -> jax.Array:
    """`[E, T, N]` the tokens the loss counts."""
    n = batch.actions.shape[-1]
    if forced_tokens:
        return jax.vmap(agent_token_mask, in_axes=(0, None))(batch.mask, n)
    return jax.vmap(agent_token_mask, in_axes=(0, None, 0))(batch.mask, n, batch.avail)


def sft_loss(student: TransformerPolicy, params: Any, batch: TokenEpisodes,
             forced_tokens: bool = False) -> jax.Array:
    """The SFT loss of a minibatch of episodes: the masked token NLL of
    [`TransformerPolicy.episode_scores`][jaxil.nn.transformer.TransformerPolicy.episode_scores]
    (see the module docstring)."""
    log_p, _ = jax.vmap(student.episode_scores, in_axes=(None, 0, 0, 0))(
        params, batch.obs, batch.avail, batch.actions)
    return masked_sequence_nll(log_p, _token_mask(batch, forced_tokens))


def score_demos(student: TransformerPolicy, params: Any, demos: TokenEpisodes,
                forced_tokens: bool = False) -> dict[str, jax.Array]:
    """Teacher-forced fit of `params` to `demos`: `nll` (the mean token
    NLL, the SFT loss) and `accuracy` (how often the most likely legal
    token is the demonstrated one), over the tokens the loss counts."""
    logits = jax.vmap(student.chunk_logits, in_axes=(None, 0))(params, demos.obs)
    mask = _token_mask(demos, forced_tokens)
    log_p = D.categorical_log_prob(logits, demos.avail, demos.actions)
    hit = (D.categorical_mode(logits, demos.avail) == demos.actions).astype(jnp.float32)
    m = mask.astype(jnp.float32)
    return {"nll": masked_sequence_nll(log_p, mask),
            "accuracy": jnp.sum(m * hit) / jnp.maximum(jnp.sum(m), 1.0)}


def _optimizer(config: SFTConfig) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                       optax.adam(config.learning_rate))


def sft_program(env: envs.MultiAgentEnv, demos: TokenEpisodes, config: SFTConfig,
                seeds: Sequence[int], heldout: Optional[TokenEpisodes] = None,
                eval_seed: int = 10_000, model: Optional[TaskModel] = None) -> engine.Program:
    """The SFT [`jaxil.runs.engine.Program`][jaxil.runs.engine.Program]: one
    run per seed, stacked.

    A chunk is `config.eval_every` fused updates of every run (one compiled
    `vmap`); each update draws `batch_episodes` demonstration episodes and
    takes one Adam step on [`sft_loss`][jaxil.algorithms.lm.sft.sft_loss]. The
    evaluation (also before the first chunk, at update 0) rolls out each
    student for `eval_episodes` episodes from the same keys every time (drawn
    from `eval_seed`): `eval_win_rate` and `eval_return`; with `heldout`
    demonstrations also `eval_nll` and `eval_accuracy`
    ([`score_demos`][jaxil.algorithms.lm.sft.score_demos]). Rows carry the last
    update's `loss`.

    With a pretrained `model` every run starts from its parameters (full
    fine-tuning) or from fresh adapters of `config.lora_rank` on them
    (each seed its own); see [`check_model`][jaxil.algorithms.lm.sft.check_model].
    """
    check_demos(env, demos)
    if heldout is not None:
        check_demos(env, heldout, "heldout demos")
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("sft_program needs at least one seed")
    check_model(env, config, model)
    student = make_student(env, config, model)
    tx = _optimizer(config)
    n_demos = demos.num_episodes
    policy = student.policy(deterministic=config.deterministic_eval)
    eval_key = jax.random.PRNGKey(eval_seed)
    # The pretrained parameters travel as an argument of the compiled
    # programs (as a closure they would be baked into them as constants).
    base = None if model is None else model.params
    adapters = config.lora if model is not None else None

    def weights(params, base):
        """The decoder's parameters of the trained `params`."""
        return params if adapters is None else lora.merge(base, params, adapters)

    def init_one(seed, base):
        if base is None:
            params = initial_params(student, seed)
        elif adapters is None:
            params = base
        else:
            params = lora.init_adapters(base, adapters,
                                        jax.random.split(jax.random.PRNGKey(seed))[0])
        return SFTState(params=params, opt_state=tx.init(params),
                        key=jax.random.split(jax.random.PRNGKey(seed))[1])

    def update(state: SFTState, key: jax.Array, data: TokenEpisodes, base):
        batch = data.take(jax.random.randint(key, (config.batch_episodes,), 0, n_demos))
        loss, grads = jax.value_and_grad(
            lambda p: sft_loss(student, weights(p, base), batch, config.forced_tokens)
        )(state.params)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        return (state.replace(params=optax.apply_updates(state.params, updates),
                              opt_state=opt_state), {"loss": loss})

    def chunk_one(state, data, base):
        return fused_updates(lambda s, k: update(s, k, data, base), state, config.eval_every)

    chunk = jax.jit(jax.vmap(chunk_one, in_axes=(0, None, None)))

    def evaluate_one(params, held, base):
        params = weights(params, base)
        ep = envs.run_episodes(env, policy, params, eval_key, config.eval_episodes)
        out = {"eval_return": ep.episode_return, "eval_win_rate": ep.won.astype(jnp.float32)}
        if held is not None:
            fit = score_demos(student, params, held, config.forced_tokens)
            out.update(eval_nll=fit["nll"], eval_accuracy=fit["accuracy"])
        return out

    evaluate = jax.jit(jax.vmap(evaluate_one, in_axes=(0, None, None)))
    labels = [f"seed {s}" for s in seeds]

    def summarize(rows):
        means = ("eval_nll", "eval_accuracy") if heldout is not None else ()
        step, points = summarize_step(rows, "update", group=lambda r: "sft",
                                      group_name="learner", means=means)
        return {"learner": "sft", "env_id": env.spec.env_id, "update": step, "points": points}

    return engine.Program(
        name=f"SFT on {env.spec.env_id}", step_key="update",
        num_chunks=config.num_updates // config.eval_every,
        steps_per_chunk=config.eval_every, step_unit=config.eval_every,
        run_ids=[dict(run=i, seed=s) for i, s in enumerate(seeds)], run_labels=labels,
        init=lambda: jax.jit(jax.vmap(init_one, in_axes=(0, None)))(
            jnp.asarray(seeds, jnp.int32), base),
        chunk=lambda s, c: chunk(s, demos, base),
        evaluate=lambda s, c: evaluate(s.params, heldout, base),
        eval_at_start=True, summarize=summarize,
        postfix=lambda v: dict(win=f"{np.mean(v['eval_win_rate']):.2f}",
                               loss=f"{np.mean(v.get('loss', np.nan)):.3f}"))


def sft_identity(env: envs.MultiAgentEnv, demos: TokenEpisodes, config: SFTConfig,
                 seeds: Sequence[int], heldout: Optional[TokenEpisodes] = None,
                 eval_seed: int = 10_000, model: Optional[TaskModel] = None) -> dict:
    """What determines an SFT run's result, as its run directory records it
    (`resume` refuses a run whose identity differs). `num_updates` is
    not part of it: a finished run may be resumed with more updates. A
    pretrained model is recorded by its starting parameters' digest and its
    vocabulary's spellings (the checkpoint's path is not part of it)."""
    cfg = dataclasses.asdict(config)
    cfg.pop("num_updates")
    if config.lora_rank is None:  # no adapters: the identity of runs before LoRA existed
        cfg.pop("lora_rank")
        cfg.pop("lora_alpha")
    ident = dict(learner="sft", env_id=env.spec.env_id, spec=env.spec.to_dict(), config=cfg,
                 seeds=[int(s) for s in seeds], eval_seed=eval_seed, demos=demos.digest(),
                 heldout=heldout.digest() if heldout is not None else None)
    if model is not None:
        v = model.vocab
        ident["model"] = dict(params=params_digest(model.params)[:16],
                              spellings=(f"identity:{v.model_vocab_size}" if v.is_identity
                                         else list(v.texts)))
    return ident


def train_sft(env: envs.MultiAgentEnv, demos: TokenEpisodes, config: SFTConfig = SFTConfig(),
              seeds: Sequence[int] = (0,), heldout: Optional[TokenEpisodes] = None, *,
              out_dir: Optional[str | Path] = None, resume: bool = False,
              overwrite: bool = False, eval_seed: int = 10_000,
              progress: bool = False, model: Optional[TaskModel] = None) -> engine.RunResult:
    """Fine-tune one transformer per seed on `demos`
    ([`sft_program`][jaxil.algorithms.lm.sft.sft_program] run by
    [`jaxil.runs.engine.run`][jaxil.runs.engine.run]).

    `out_dir`: the run directory (`run.json`, `metrics.jsonl`, checkpoints
    after every evaluation, `results.json`); `resume` continues a stopped run
    there from its newest checkpoint, reproducing the uninterrupted run
    exactly. Returns the engine's
    [`jaxil.runs.engine.RunResult`][jaxil.runs.engine.RunResult]: `rows` (one
    per evaluation and seed: `update`, `seed`, `loss`, `eval_win_rate`,
    `eval_return`, with `heldout` also `eval_nll`, `eval_accuracy`) and
    `state.params`, the students' parameters stacked `[R]` (act with
    `make_student(env, config).policy()`). With a pretrained `model`
    ([`jaxil.nn.task_vocab.task_decoder`][jaxil.nn.task_vocab.task_decoder])
    the runs fine-tune it, and under LoRA `state.params` are the adapters
    ([`decoder_params`][jaxil.algorithms.lm.sft.decoder_params] gives the
    decoder's parameters).

    Raises:
      ValueError: demonstrations of another environment or configuration, a
        bad setting, or a `resume` with other settings.
      jaxil.runs.guard.NonFiniteError: the loss or the parameters became
        non-finite.
    """
    program = sft_program(env, demos, config, seeds, heldout, eval_seed, model)
    rd = None
    if out_dir is not None:
        rd = engine.open_run(out_dir, sft_identity(env, demos, config, seeds, heldout, eval_seed,
                                                   model),
                             step_key="update", resume=resume, overwrite=overwrite,
                             info=dict(num_updates=config.num_updates))
        if rd.latest is not None and rd.latest > config.num_updates:
            rd.close()
            raise ValueError(f"num_updates {config.num_updates} is less than the {rd.latest} "
                             f"updates already trained in {out_dir}")
    return engine.run(program, rundir=rd, progress=progress)
