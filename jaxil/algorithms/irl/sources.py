"""The sample sources of a reward model: π_0, π_SFT and the demonstrations.

- π_SFT is BC on the demonstrations (the `bc_union` learner trained by
  [`jaxil.algorithms.offline.train.train`][jaxil.algorithms.offline.train.train],
  seeds vmapped, with its run directory, checkpoints and `--resume`); π_0 is
  the same network at its initialisation (seed s's initial state,
  [`jaxil.algorithms.offline.train.init_runs`][jaxil.algorithms.offline.train.init_runs]).
- [`rollouts`][jaxil.algorithms.irl.sources.rollouts] plays complete episodes
  of a policy for every seed in one vmapped program
  ([`envs.run_episodes`][jaxil.envs.rollout.run_episodes]).
- [`source_data`][jaxil.algorithms.irl.sources.source_data] turns per-seed
  episodes or the demonstrations into the stacked
  [`jaxil.algorithms.irl.reward_model.RewardData`][jaxil.algorithms.irl.reward_model.RewardData]
  of a source pair (each seed's steps padded to one size with zero sampling
  weight).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxil import envs
from jaxil.data.environment import dataset_env
from jaxil.data.format import Dataset
from jaxil.data.sampling import flatten_transitions
from jaxil.algorithms.irl.reward_model import RewardData, pad_transitions, source_roles
from jaxil.algorithms.offline import LearnerData, make_learner
from jaxil.algorithms.offline.base import Learner
from jaxil.algorithms.offline.train import expand_grid, init_runs, train
from jaxil.runs import engine
from jaxil.runs.engine import open_run
from jaxil.runs.loggers import LoggerFactory


@dataclasses.dataclass(frozen=True)
class SFT:
    """π_SFT and π_0 for R seeds: `learner` (bc_union), stacked parameters
    `[R, ...]` of each, and the seeds."""

    learner: Learner
    sft_params: Any
    init_params: Any
    seeds: tuple[int, ...]
    summary: dict

    def policy(self, deterministic: bool = False):
        return self.learner.policy(deterministic)


def fit_sft(dataset: Dataset, *, seeds: int, base_seed: int = 0, hidden: Sequence[int] = (256, 256),
            batch_size: int = 512, updates: int = 2000, eval_every: int = 500,
            lr: Optional[float] = None,
            eval_episodes: int = 32, out_dir: Optional[str | Path] = None, resume: bool = False,
            overwrite: bool = False, progress: bool = True, data_identity: Optional[dict] = None,
            loggers: Sequence[LoggerFactory] = ()) -> SFT:
    """BC on every trajectory of `dataset` for `seeds` seeds (one program);
    `lr`: Adam's learning rate (None: the BC learner's default); `loggers`:
    where the metrics rows go besides `metrics.jsonl`
    ([`jaxil.runs.loggers`][jaxil.runs.loggers])."""

    spec = dataset.spec
    env = dataset_env(dataset)
    learner = make_learner("bc_union", spec, hidden=tuple(hidden), batch_size=batch_size)
    runs = expand_grid({} if lr is None else {"lr": [float(lr)]}, seeds)
    data = LearnerData.from_dataset(dataset, None)
    summary = train(learner, env, data, runs=runs, num_updates=updates, eval_every=eval_every,
                    eval_episodes=eval_episodes, out_dir=out_dir, resume=resume,
                    overwrite=overwrite, base_seed=base_seed, progress=progress,
                    data_identity=data_identity, run_info=dict(role="pi_SFT"), loggers=loggers)
    states = summary.pop("states")
    init = init_runs(learner, runs, base_seed)
    return SFT(learner, states.params, init.params, tuple(r.seed for r in runs), summary)


def rollouts(env: envs.MultiAgentEnv, policy: Any, params: Any, key: jax.Array,
             num_episodes: int) -> Any:
    """`num_episodes` complete episodes per seed: `Episodes [R, E, ...]` for
    stacked `params [R, ...]` (seed r uses `fold_in(key, r)`)."""
    r = jax.tree.leaves(params)[0].shape[0]
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(r))
    fn = jax.jit(jax.vmap(lambda p, k: envs.run_episodes(env, policy, p, k, num_episodes)))
    return fn(params, keys)


def _episodes_transitions(episodes: Any, spec) -> Any:
    ds = Dataset.from_episodes(jax.device_get(episodes), spec, tier="rollout", source="policy",
                               seed=0, check=False)
    return flatten_transitions(ds)


def source_data(source: str, spec, demos: Dataset, samples: dict[str, Any]) -> RewardData:
    """Stacked `RewardData [R, ...]` of `source` (e.g. `"init-sft"`): `samples`
    maps `"init"`/`"sft"` to `Episodes [R, E, ...]`
    ([`rollouts`][jaxil.algorithms.irl.sources.rollouts]); `"demo"` is `demos`,
    the same for every seed."""
    neg_role, pos_role = source_roles(source)
    r = None
    per_role = {}
    for role in (neg_role, pos_role):
        if role == "demo":
            per_role[role] = None
            continue
        if role not in samples:
            raise ValueError(f"source {source} needs rollouts of {role!r}")
        eps = samples[role]
        r = jax.tree.leaves(eps)[0].shape[0]
        per_role[role] = [_episodes_transitions(jax.tree.map(lambda x, i=i: x[i], eps), spec)
                          for i in range(r)]
    demo_t = flatten_transitions(demos)
    for role in per_role:
        if per_role[role] is None:
            per_role[role] = [demo_t] * r

    def stack(ts):
        size = max(int(t.reward.shape[0]) for t in ts)
        padded = [pad_transitions(t, size) for t in ts]
        trans = jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *[p[0] for p in padded])
        return trans, jnp.asarray(np.stack([p[1] for p in padded]))

    pos, pos_w = stack(per_role[pos_role])
    neg, neg_w = stack(per_role[neg_role])
    return RewardData(pos, pos_w, neg, neg_w)


def init_reward_states(rm, seeds: Sequence[int], base_seed: int = 0, hparams: Any = None):
    """Stacked `RewardModelState` `[R]`; seed s starts from
    `fold_in(PRNGKey(base_seed + s), 0x726D)` (another stream than π_SFT's)."""
    hp = rm.default_hparams() if hparams is None else hparams
    rm.check_hparams(hp)
    keys = jnp.stack([jax.random.fold_in(jax.random.PRNGKey(base_seed + s), 0x726D) for s in seeds])
    return jax.jit(jax.vmap(lambda k: rm.init_state(k, hp)))(keys)


def fit_reward_model(rm, data: RewardData, *, seeds: Sequence[int], base_seed: int = 0,
                     hparams: Any = None, updates: int = 2000, eval_every: int = 500,
                     out_dir: Optional[str | Path] = None, resume: bool = False,
                     overwrite: bool = False, progress: bool = True,
                     identity: Optional[dict] = None, info: Optional[dict] = None,
                     evaluate: Any = None, label: str = "reward model",
                     loggers: Sequence[LoggerFactory] = ()):
    """Train one reward model per seed on stacked `data [R]` in one program.

    Each chunk is `eval_every` fused updates (`RewardModel.update_n`, vmapped
    over seeds), then the NaN guard ([`jaxil.runs.guard`][jaxil.runs.guard];
    the chunk is dropped and the last good checkpoint kept), one metrics row
    per seed (the chunk's last update's metrics, plus
    `evaluate(params [R]) -> {name: [R]}` if given), an orbax checkpoint of the
    stacked state. With `out_dir` the run directory of
    [`jaxil.runs.rundir`][jaxil.runs.rundir] (identity = `identity` plus the
    model config, seeds, `eval_every`; `resume` continues from the newest
    checkpoint and reproduces the uninterrupted run). `loggers`: where the
    metrics rows go besides `metrics.jsonl`
    ([`jaxil.runs.loggers`][jaxil.runs.loggers]; runs named `run<i>-seed<s>`).

    Returns `(states [R], rows)`.
    """

    if updates < 1 or eval_every < 1 or updates % eval_every:
        raise ValueError(f"--updates ({updates}) must be a positive multiple of --eval-every "
                         f"({eval_every})")
    seeds = list(seeds)
    rd = None
    if out_dir:
        ident = dict(identity or {}, config=dataclasses.asdict(rm.config), seeds=seeds,
                     base_seed=base_seed, eval_every=eval_every, env_id=rm.spec.env_id,
                     hparams={k: float(v) for k, v in dataclasses.asdict(
                         rm.default_hparams() if hparams is None else hparams).items()})
        rd = open_run(out_dir, ident, step_key="update", resume=resume, overwrite=overwrite,
                      info=dict(info or {}, updates=updates))
        if rd.latest is not None and rd.latest > updates:
            rd.close()
            raise ValueError(f"--updates {updates} is less than the {rd.latest} updates "
                             f"already trained in {out_dir}")
    chunk = jax.jit(jax.vmap(lambda s, d: rm.update_n(s, d, eval_every)))

    def postfix(v):
        return dict(loss=f"{v['loss'].mean():.3f}", acc=f"{v['accuracy'].mean():.3f}")

    program = engine.Program(
        name=label, step_key="update", num_chunks=updates // eval_every,
        steps_per_chunk=eval_every, step_unit=eval_every,
        run_ids=[dict(run=i, seed=s) for i, s in enumerate(seeds)],
        run_labels=[f"seed {s}" for s in seeds],
        init=lambda: init_reward_states(rm, seeds, base_seed, hparams),
        chunk=lambda st, c: chunk(st, data),
        evaluate=lambda st, c: {} if evaluate is None else evaluate(st.params),
        postfix=postfix)
    result = engine.run(program, rundir=rd, progress=progress, loggers=loggers,
                        log_names=[f"run{i}-seed{s}" for i, s in enumerate(seeds)])
    return result.state, result.rows
