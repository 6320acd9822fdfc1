"""One interactive round as a pure function, and the program that runs many.

A round, for every run (regime × seed) at once (`vmap`), in ONE compiled
program:

```text
shared-control rollouts (envs_per_round episodes)        rollout.mixed_episodes
  → targets, loss mask, labels spent                     labels.*
  → verifier, repetition filter, budget allowance        labels.*
  → append kept steps to the on-device ring buffer       buffer.insert
  → K fused student updates on demos ∪ buffer            the BC learner's update
```

The student is a BC learner
([`jaxil.algorithms.offline.make_bc`][jaxil.algorithms.offline.bc.make_bc]),
first trained on the SFT demonstration set; every run of a seed starts from the
same SFT weights. [`run`][jaxil.algorithms.interactive.loop.run] hands the
rounds to the run engine ([`jaxil.runs.engine`][jaxil.runs.engine]), which
evaluates every `eval_every` rounds on fixed start states, writes
`metrics.jsonl` and an orbax checkpoint, and `resume=True` continues a killed
run and reproduces the uninterrupted one (all randomness is in the state or
derived from the round index).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxil import envs
from jaxil.envs.core import EnvSpec, MultiAgentEnv
from jaxil.runs import guard
from jaxil.algorithms.interactive import labels as L
from jaxil.algorithms.interactive.buffer import StepBuffer, empty_buffer, insert, mixed_draw
from jaxil.algorithms.interactive.config import (STUDENTS, InteractiveConfig, RegimeHParams,
                                                check_regime, resolve_auto, stack_regimes)
from jaxil.algorithms.interactive.rollout import SwitchRule, mixed_episodes
from jaxil.algorithms.interactive.schedule import expert_probability
from jaxil.algorithms.offline.base import Learner, LearnerState, with_learning_rate
from jaxil.algorithms.offline.bc import BCBatch, BCConfig, BCHParams, make_bc
from jaxil.nn.policy import PolicyNet
from jaxil.runs.rundir import check_run_dir
from jaxil.runs import engine, loggers as run_loggers
from jaxil.runs.updates import fused_updates
from jaxil.runs.engine import open_run
from jaxil.runs.measure import format_table as fmt_table
from jaxil.runs.summary import mean_std, summarize_step
from jaxil.algorithms.interactive.diagnostics import disagreement_by_t, mmd2_by_t, twin_policy


@struct.dataclass
class Batch:
    """What the BC update reads: `obs [B, N, O]`, `avail [B, N, A]`, `actions`."""

    obs: jax.Array
    avail: jax.Array
    actions: jax.Array


@struct.dataclass
class Demos:
    """Expert demonstration steps in episode order (shared by all runs);
    a run uses the first `demo_steps` of them."""

    obs: jax.Array
    avail: jax.Array
    actions: jax.Array


@struct.dataclass
class InteractiveState:
    student: LearnerState
    buffer: StepBuffer
    hp: RegimeHParams
    labels: jax.Array  # expert labels spent interactively so far
    env_steps: jax.Array  # environment steps of the rollouts kept within budget
    round: jax.Array
    demo_steps: jax.Array  # demos this run may use (from hp.demo_labels)
    init_key: jax.Array  # a fresh student initialisation (scratch retraining)
    key: jax.Array


def student_net(spec: EnvSpec, config: InteractiveConfig) -> PolicyNet:
    """The student's network: `config.hidden` widths, the rest from
    `STUDENTS[config.student]`."""
    return PolicyNet(spec, tuple(config.hidden), config.shared, **STUDENTS[config.student])


@functools.lru_cache(maxsize=16)
def make_student(env: MultiAgentEnv, config: InteractiveConfig) -> Learner:
    """The student: a BC learner on
    [`student_net`][jaxil.algorithms.interactive.loop.student_net] (cached, so
    repeated runs share compiled programs)."""
    return make_bc(env.spec, BCConfig(hidden=tuple(config.hidden), shared=config.shared,
                                      batch_size=config.batch_size,
                                      max_grad_norm=config.max_grad_norm), beta=0.0,
                   policy=student_net(env.spec, config))


def with_demo_stats(params: Any, net: PolicyNet, demos: Demos, steps: int) -> Any:
    """The student's parameters with the observation statistics of the first
    `steps` demonstration steps, for a network that standardises its
    observations (else `params` unchanged)."""
    if not net.obs_norm:
        return params
    return dict(params, policy=net.with_obs_stats(params["policy"], demos.obs[:steps]))


def _flat(x: jax.Array) -> jax.Array:
    """`[E, T, ...] -> [E·T, ...]` (explicit: box actions have `avail [.., 0]`)."""
    return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def sample_batch(key: jax.Array, state: InteractiveState, demos: Demos, batch_size: int) -> Batch:
    """`batch_size` steps: each from the demos with probability ρ
    (`hp.demo_ratio`, or `demo_steps / (demo_steps + buffer.size)` when
    it is −1, i.e. uniform over the union), else from the buffer; all from
    the demos while the buffer is empty."""
    i_d, i_b, take_d = mixed_draw(key, state.demo_steps, state.buffer.size, state.hp.demo_ratio,
                                  batch_size)
    pick = lambda d, b: jnp.where(take_d.reshape((-1,) + (1,) * (d.ndim - 1)), d[i_d], b[i_b])
    buf = state.buffer
    return Batch(obs=pick(demos.obs, buf.obs), avail=pick(demos.avail, buf.avail),
                 actions=pick(demos.actions, buf.actions.astype(demos.actions.dtype)))


def train_student(student: Learner, state: InteractiveState, demos: Demos, k: int,
                  batch_size: int) -> tuple[InteractiveState, jax.Array, guard.Health]:
    """K fused BC updates on demos ∪ buffer; returns the last loss and the
    chunk's [`jaxil.runs.guard.Health`][jaxil.runs.guard.Health]."""

    def one(s: InteractiveState, key: jax.Array):
        ls, m = student.update(s.student, BCBatch(sample_batch(key, s, demos, batch_size)))
        return s.replace(student=ls), {"bc_loss": m["bc_loss"]}

    state, last, health = fused_updates(one, state, k, lambda s: s.student.params)
    return state, last["bc_loss"], health


def make_round(env: MultiAgentEnv, student: Learner, expert: Any, config: InteractiveConfig):
    """`round(state, demos, expert_params) -> (state, metrics, health)` for ONE run."""
    spec = env.spec
    n = spec.num_agents
    spolicy = student.policy(False)
    net = student_net(spec, config)

    def round_fn(state: InteractiveState, demos: Demos, expert_params: Any):
        hp = state.hp
        r = state.round
        key, k_roll, _ = jax.random.split(state.key, 3)
        beta = expert_probability(r, hp.beta0, hp.beta_kind, hp.beta_rate)
        rule = SwitchRule(hp.switch_kind, hp.switch_lo, hp.switch_hi, hp.switch_p, beta)
        ep = mixed_episodes(env, spolicy, expert, state.student.params, expert_params, rule,
                            k_roll, config.envs_per_round)
        info = ep.carry
        valid = ep.mask
        T = valid.shape[1]
        spent = L.labels_spent(valid, info.expert_acted, hp.use_label, n)
        interactive = hp.budget - hp.demo_labels
        allowance = (interactive * (r + 1)) // config.rounds - state.labels
        within = L.within_allowance(spent, allowance)
        accepted = L.verify(ep.won, ep.episode_return, hp.verifier, hp.return_threshold)
        # Agents with no choice (a dead SMAX unit can only no-op) repeat
        # themselves without being stuck: the filter skips them.
        choice = jnp.sum(ep.avail_actions[:, :T], axis=-1) > 1 if spec.discrete else None
        accepted &= L.passes_repetition(ep.obs[:, :T], ep.actions, valid, hp.repeat_limit, choice)
        kept = within & accepted
        mask = L.loss_mask(valid, info.expert_acted, hp.mask_prefix, kept)
        targets = L.training_targets(info.label, ep.actions, hp.use_label)
        buf = insert(state.buffer, _flat(ep.obs[:, :T]), _flat(ep.avail_actions[:, :T]),
                     _flat(targets), _flat(mask))
        fresh = student.init(state.init_key, state.student.hparams)
        if net.obs_norm:  # a fresh start keeps the SFT demonstrations' statistics
            fresh = fresh.replace(params=dict(fresh.params, policy=dict(
                fresh.params["policy"], obs_stats=state.student.params["policy"]["obs_stats"])))
        learner = jax.tree.map(lambda a, b: jnp.where(hp.scratch, a, b), fresh, state.student)
        learner = learner.replace(key=state.student.key)
        new = state.replace(
            student=learner, buffer=buf, key=key, round=r + 1,
            labels=state.labels + jnp.sum(jnp.where(within, spent, 0)),
            env_steps=state.env_steps + jnp.sum(jnp.where(within[:, None], valid, False)),
        )
        new, loss, health = train_student(student, new, demos, config.updates_per_round,
                                          config.batch_size)
        n_within = jnp.maximum(jnp.sum(within), 1)
        metrics = dict(
            labels=new.labels + hp.demo_labels, interactive_labels=new.labels,
            env_steps=new.env_steps, beta=beta, bc_loss=loss, buffer_size=buf.size,
            episodes_within_budget=jnp.sum(within), episodes_kept=jnp.sum(kept),
            accept_rate=jnp.sum(within & accepted) / n_within,
            rollout_return=jnp.sum(jnp.where(within, ep.episode_return, 0.0)) / n_within,
            trained_steps=jnp.sum(mask),
        )
        return new, metrics, health

    return round_fn


# ----------------------------------------------------------------------------- setup


def collect_demos(env: MultiAgentEnv, expert: Any, expert_params: Any, key: jax.Array,
                  num_episodes: int) -> tuple[Demos, np.ndarray, dict]:
    """Expert episodes from `key`, flattened to steps in episode order;
    also the cumulative expert labels after each episode and a summary."""
    ep = jax.device_get(_expert_episodes(env, expert, num_episodes)(expert_params, key))
    T = ep.mask.shape[1]
    e, t = np.nonzero(np.asarray(ep.mask))
    demos = Demos(obs=jnp.asarray(ep.obs[:, :T][e, t]), avail=jnp.asarray(ep.avail_actions[:, :T][e, t]),
                  actions=jnp.asarray(ep.actions[e, t]))
    lengths = np.asarray(ep.length, np.int64)
    cum = np.cumsum(lengths * env.spec.num_agents)
    summary = dict(episodes=int(num_episodes), return_mean=float(np.mean(ep.episode_return)),
                   win_rate=float(np.mean(ep.won)), length_mean=float(lengths.mean()),
                   return_q25=float(np.quantile(ep.episode_return, 0.25)))
    return demos, cum, summary


@functools.lru_cache(maxsize=16)
def _expert_episodes(env: MultiAgentEnv, expert: Any, num_episodes: int):
    return jax.jit(lambda p, k: envs.run_episodes(env, expert, p, k, num_episodes))


def demo_steps_for(labels: int, cum_labels: np.ndarray, lengths_cum: np.ndarray) -> int:
    """Steps of the longest prefix of whole demo episodes costing ≤ `labels`."""
    k = int(np.searchsorted(cum_labels, labels, side="right"))
    return int(lengths_cum[k - 1]) if k else 0


# ----------------------------------------------------------------------------- the program


@dataclasses.dataclass(frozen=True)
class Run:
    index: int
    name: str  # the regime's label, e.g. "oec@4000"
    seed: int


@functools.lru_cache(maxsize=8)
def _programs(env, student: Learner, expert: Any, config: InteractiveConfig):
    round_fn = make_round(env, student, expert, config)
    rounds = jax.jit(jax.vmap(round_fn, in_axes=(0, None, None)))

    def evaluate(params, key):
        return envs.run_episodes(env, student.policy(config.deterministic_eval), params, key,
                                 config.eval_episodes)

    def sft(state, demos):
        return train_student(student, state, demos, config.sft_updates, config.batch_size)

    return rounds, jax.jit(jax.vmap(evaluate, in_axes=(0, None))), jax.jit(jax.vmap(sft, in_axes=(0, None)))


def init_states(env, student: Learner, config: InteractiveConfig, hps: list[dict],
                seeds: Sequence[int], base_seed: int, demo_steps: Sequence[int],
                sft_steps: int, demos: Demos, sft_fn) -> InteractiveState:
    """Stacked states of all runs: each seed's SFT student (trained once per
    seed), its own buffer, keys from `base_seed + seed`."""
    hp = stack_regimes(hps)
    uniq = sorted(set(seeds))
    keys = jnp.stack([jax.random.PRNGKey(base_seed + s) for s in uniq])
    k_init, k_state, k_sft = jax.vmap(lambda k: jax.random.split(k, 3))(keys).transpose(1, 0, 2)

    net = student_net(env.spec, config)

    def one(ki, ks, lr):
        ls = student.init(ki, BCHParams(beta=jnp.float32(0.0), lr=lr))
        ls = ls.replace(params=with_demo_stats(ls.params, net, demos, sft_steps))
        return InteractiveState(student=ls, buffer=empty_buffer(env.spec, config.capacity),
                                hp=jax.tree.map(lambda x: x[0], hp), labels=jnp.int32(0),
                                env_steps=jnp.int32(0), round=jnp.int32(0),
                                demo_steps=jnp.int32(sft_steps), init_key=ki, key=ks)

    # SFT per seed (at the first run's lr of that seed).
    lr0 = jnp.asarray([hps[list(seeds).index(s)]["lr"] for s in uniq], jnp.float32)
    base = jax.vmap(one)(k_init, k_sft, lr0)
    base, _, health = sft_fn(base, demos)
    guard.check(jax.device_get(health), learner="interactive student (SFT)",
                run_labels=[f"seed {s}" for s in uniq], first_step=1,
                chunk_len=config.sft_updates)
    pick = jnp.asarray([uniq.index(s) for s in seeds])
    states = jax.tree.map(lambda x: x[pick], base)
    lr = hp.lr
    opt = states.student.opt_state
    opt = dict(opt, policy=with_learning_rate(opt["policy"], lr))
    student_state = states.student.replace(
        hparams=states.student.hparams.replace(lr=lr), opt_state=opt,
        key=jax.vmap(lambda k: jax.random.fold_in(k, 1))(k_state[pick]))
    return states.replace(student=student_state, hp=hp,
                          demo_steps=jnp.asarray(demo_steps, jnp.int32),
                          key=jax.vmap(lambda k: jax.random.fold_in(k, 2))(k_state[pick]))


def run(
    env: MultiAgentEnv,
    expert: Any,
    expert_params: Any,
    regimes: Sequence[tuple[str, dict]],
    *,
    seeds: int,
    config: InteractiveConfig = InteractiveConfig(),
    base_seed: int = 0,
    out_dir: Optional[str | Path] = None,
    resume: bool = False,
    overwrite: bool = False,
    eval_every: int = 1,
    progress: bool = True,
    diagnostics: bool = True,
    run_info: Optional[dict] = None,
    tensorboard: Optional[str | Path] = None,
    loggers: Sequence[run_loggers.LoggerFactory] = (),
) -> dict:
    """Run every regime × `seeds` seeds together; returns the summary
    (also `results.json` in `out_dir`) and the final `states`.

    `regimes`: `(name, knobs)` pairs, knobs from
    [`jaxil.algorithms.interactive.config.regime`][jaxil.algorithms.interactive.config.regime].
    Every run is evaluated on the same `config.eval_episodes` start states (one
    fixed reset key). The run directory (`out_dir`) has the identity, resume
    and overwrite rules of [`jaxil.runs.rundir`][jaxil.runs.rundir]; a
    non-finite loss or parameter stops the run before its round is recorded
    ([`jaxil.runs.guard`][jaxil.runs.guard]). `loggers`: where the metrics rows
    go besides `metrics.jsonl` ([`jaxil.runs.loggers`][jaxil.runs.loggers]);
    `tensorboard`: also write them as TensorBoard scalars there.
    """
    if out_dir:  # refuse a bad --out before the demonstrations and the SFT

        check_run_dir(out_dir, resume=resume, overwrite=overwrite)
    if not regimes:
        raise ValueError("interactive run needs at least one regime")
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    if not 1 <= eval_every <= config.rounds or config.rounds % eval_every:
        raise ValueError(f"eval_every must divide the {config.rounds} rounds, got {eval_every}")
    for _, h in regimes:
        check_regime(h, config.sft_labels)
        if h.get("entropy_gate", -1.0) >= 0:
            raise ValueError("the entropy-gated switch (entropy_gate) needs a token environment "
                             "and a transformer student (jaxil lm interactive); set it to -1 here")
    names = [n for n, _ in regimes]
    if len(set(names)) != len(names):
        raise ValueError(f"regime names must be unique, got {names}")
    spec = env.spec
    n = spec.num_agents

    # Demonstrations: enough expert episodes for the largest demo share.
    need = max(int(h["demo_labels"]) for _, h in regimes)
    n_demo = 64
    while True:
        demos, cum, demo_summary = collect_demos(env, expert, expert_params,
                                                 jax.random.PRNGKey(base_seed + 777_777), n_demo)
        if cum[-1] >= need:
            break
        n_demo = int(np.ceil(n_demo * need / cum[-1] * 1.1)) + 8
    steps_cum = cum // n
    sft_steps = demo_steps_for(config.sft_labels, cum, steps_cum)
    if sft_steps == 0:
        raise ValueError(f"sft_labels={config.sft_labels} is less than one expert episode "
                         f"({int(cum[0])} labels); raise --sft-labels")
    max_interactive = max(int(h["budget"]) - int(h["demo_labels"]) for _, h in regimes)
    if config.capacity * n < max_interactive:
        raise ValueError(
            f"buffer capacity {config.capacity} steps holds {config.capacity * n} labels, less "
            f"than the {max_interactive} a regime may buy; raise --capacity to at least "
            f"{-(-max_interactive // n)}")

    regimes = [(nm, resolve_auto(h, demo_summary["length_mean"], demo_summary["return_q25"]))
               for nm, h in regimes]
    for _, h in regimes:
        check_regime(h, config.sft_labels)
    runs = [Run(i * seeds + s, name, s) for i, (name, _) in enumerate(regimes) for s in range(seeds)]
    hps = [dict(regimes[i][1]) for i in range(len(regimes)) for _ in range(seeds)]
    demo_steps = [demo_steps_for(int(h["demo_labels"]), cum, steps_cum) for h in hps]
    student = make_student(env, config)
    rounds_fn, evaluate, sft_fn = _programs(env, student, expert, config)
    states = init_states(env, student, config, hps, [r.seed for r in runs], base_seed,
                         demo_steps, sft_steps, demos, sft_fn)
    eval_key = jax.random.PRNGKey(base_seed + 10_000)

    info = dict(run_info or {}, env_id=spec.env_id, config=config.to_dict(),
                regimes=[dict(name=nm, **{k: v for k, v in h.items()}) for nm, h in regimes],
                seeds=seeds, base_seed=base_seed, eval_every=eval_every,
                demos=dict(demo_summary, sft_steps=sft_steps))
    rd = open_run(out_dir, info, step_key="round", resume=resume,
                  overwrite=overwrite) if out_dir else None

    def postfix(v):
        return dict(ret=f"{v['eval_return'].mean():.3f}", labels=f"{v['labels'].mean():.0f}")

    program = engine.Program(
        name="interactive student", step_key="round", num_chunks=config.rounds,
        steps_per_chunk=config.updates_per_round, eval_every=eval_every, eval_at_start=True,
        run_ids=[dict(run=r.index, regime=r.name, seed=r.seed) for r in runs],
        run_labels=[f"run {r.index} ({r.name}, seed {r.seed})" for r in runs],
        init=lambda: states,
        chunk=lambda s, c: rounds_fn(s, demos, expert_params),
        evaluate=lambda s, c: _returns(evaluate(s.student.params, eval_key)),
        initial_metrics=lambda s: dict(labels=np.asarray([config.sft_labels] * len(runs),
                                                         np.float64)),
        summarize=lambda rows: dict(summarize(rows, runs), demos=info["demos"]),
        postfix=postfix)
    result = engine.run(program, rundir=rd, progress=progress,
                        loggers=[*loggers, *([run_loggers.tensorboard(tensorboard)]
                                             if tensorboard else [])],
                        log_names=[f"run{r.index}-{r.name}-seed{r.seed}" for r in runs])
    summary, states = result.summary, result.state
    if diagnostics:  # after results.json is written, so that its failure loses no result
        summary["shift"] = shift_diagnostic(env, student, expert, expert_params, states, runs,
                                            eval_key, config.eval_episodes)
        if rd:
            rd.write_results(summary)
    summary["states"] = states
    return summary


def _returns(ep: Any) -> dict:
    return {"eval_return": ep.episode_return, "eval_win_rate": ep.won,
            "eval_length": ep.length.astype(jnp.float32)}


def summarize(rows: list[dict], runs: list[Run]) -> dict:
    """Final evaluation per regime: mean ± std over seeds, labels used."""
    step, table = summarize_step(rows, "round", group=lambda r: r["regime"],
                                 group_name="regime", order=[r.name for r in runs],
                                 means=("labels",))
    if step is None:
        return {"regimes": []}
    return {"round": step, "regimes": table}


def format_table(summary: dict) -> str:
    """The results table of [`run`][jaxil.algorithms.interactive.loop.run]: one
    line per regime."""
    return fmt_table(summary["regimes"], [("regime", "regime", "{}", "<"),
                                          ("seeds", "seeds", "{}"),
                                          ("labels_mean", "labels", "{:.0f}"),
                                          mean_std("return", "return"),
                                          mean_std("win", "win rate")])


def shift_diagnostic(env, student: Learner, expert: Any, expert_params: Any,
                     states: InteractiveState, runs: list[Run], key: jax.Array,
                     num_episodes: int, num_bins: int = 8) -> dict:
    """Covariate shift of each run's student on the fixed start states, as a
    function of t:

    - `disagreement[t]`: how often the student's action differs from the
      expert's label on the states the STUDENT visits (discrete: the share
      of agents with a choice — more than one available action — that
      disagree; box actions: the mean Euclidean distance);
    - `mmd2[b]`: the squared maximum mean discrepancy (unbiased, Gaussian
      kernel, median-heuristic bandwidth) between the global states the
      student and the expert visit in time bin `b`, both from the same
      start states. The bins split `[0, 1.5 × the expert's mean length)`
      into `num_bins` (later steps are rare and would make the kernel
      matrices large);
    - `expert_self[t]`: the disagreement of two independent draws of the expert
      on the same states
      ([`twin_policy`][jaxil.algorithms.interactive.diagnostics.twin_policy]),
      on that student's states; and `expert_self_on_expert[t]` (top level) on
      the expert's own states. A student cannot be expected to disagree less
      than this floor: a sampling teacher or random tie-breaks make labels
      noisy.

    The runs are measured one after another (`lax.map`), so memory does not
    grow with their number.
    """

    spec = env.spec
    never = SwitchRule(0, 0, 0, 1.0, 0.0)
    T = spec.max_steps
    twin = twin_policy(expert, (spec.num_agents,) + spec.action.shape, env.legalize)

    def choice_of(ep):
        return jnp.sum(ep.avail_actions[:, :T], axis=-1) > 1 if spec.discrete else None

    @jax.jit
    def expert_run(k):
        ep = envs.run_episodes(env, twin, expert_params, k, num_episodes, record_carry=True)
        return ep, disagreement_by_t(ep.carry.second, ep.actions, ep.mask, spec.discrete,
                                     choice_of(ep))[0]

    ep_x, self_x = expert_run(key)
    horizon = min(T, max(num_bins, int(np.ceil(1.5 * float(np.mean(ep_x.length))))))
    width = max(1, int(np.ceil(horizon / num_bins)))
    edges = tuple(sorted(set(range(0, horizon, width)) | {horizon}))

    @jax.jit
    def measure(params):
        def one(p):
            ep = mixed_episodes(env, student.policy(False), twin, p, expert_params, never,
                                key, num_episodes)
            choice = choice_of(ep)
            rate, count = disagreement_by_t(ep.carry.student_action, ep.carry.label, ep.mask,
                                            spec.discrete, choice)
            noise = disagreement_by_t(ep.carry.expert_carry.second, ep.carry.label, ep.mask,
                                      spec.discrete, choice)[0]
            mmd = mmd2_by_t(ep.global_state[:, :T], ep.mask, ep_x.global_state[:, :T],
                            ep_x.mask, edges)[0]
            return rate, count, noise, mmd, ep.length

        return jax.lax.map(one, params)

    rate, count, noise, mmd, length = map(np.asarray, measure(states.student.params))
    clean = lambda xs: [None if not np.isfinite(x) else float(x) for x in xs]
    out = {"bin_edges": list(edges), "expert_length_mean": float(np.mean(ep_x.length)),
           "expert_self_on_expert": clean(np.asarray(self_x)), "runs": []}
    for r in runs:
        out["runs"].append(dict(
            run=r.index, regime=r.name, seed=r.seed, disagreement=clean(rate[r.index]),
            count=count[r.index].astype(int).tolist(), expert_self=clean(noise[r.index]),
            mmd2=clean(mmd[r.index]), student_length_mean=float(np.mean(length[r.index]))))
    return out
