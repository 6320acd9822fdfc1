"""Training runs: many seeds and a hyper-parameter grid in ONE compiled program.

The offline learners' program
([`offline_program`][jaxil.algorithms.offline.train.offline_program]) vmaps a
learner over R = (grid points × seeds) runs. Each compiled call performs
`eval_every` fused updates for every run (`update_n` inside `vmap`), then one
vmapped evaluation in the real environment.
[`train`][jaxil.algorithms.offline.train.train] hands it to the run engine
([`jaxil.runs.engine`][jaxil.runs.engine]), which owns what happens between
chunks: progress bar, JSONL metrics, an orbax checkpoint of all runs,
`resume=True` (exact: every random key is carried in the state or derived from
the chunk index; settings that differ from the recorded run are refused), and
the guard (a non-finite loss or parameter stops the run before its chunk is
written).

CLI: `jaxil train`, `jaxil sweep`, `jaxil eval`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from pathlib import Path
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxil import envs
from jaxil.envs.core import EnvSpec
from jaxil.runs.checkpoint import Checkpointer
from jaxil.algorithms.offline import LearnerData, update_n_checked
from jaxil.algorithms.offline.base import Learner, check_hparams
from jaxil.runs import engine, loggers as run_loggers
from jaxil.runs.engine import open_run
from jaxil.runs.measure import format_table as fmt_table
from jaxil.runs.summary import mean_std, summarize_step
from jaxil.runs.precision import matmul_precision
from jaxil.runs.sharding import (RUNS, RunsLayout, check_batch_split, constrain_batch, make_mesh,
                            num_devices)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of the grid: its index, seed and hyper-parameter overrides."""

    index: int
    seed: int
    grid: tuple[tuple[str, float], ...]

    @property
    def grid_label(self) -> str:
        return ",".join(f"{k}={v:g}" for k, v in self.grid) or "default"


def expand_grid(grid: dict[str, Sequence[float]], seeds: int) -> list[RunSpec]:
    """The runs of a hyper-parameter sweep: every grid point times `seeds`.

    Each point of the Cartesian product of `grid`'s values (its names in
    sorted order) gets `seeds` runs with seeds `0 … seeds-1`; the runs are
    numbered in that order. [`train`][jaxil.algorithms.offline.train.train]
    runs them all as one `vmap` axis of one compiled program.

    ```python
    expand_grid({}, seeds=4)  # 4 runs of the defaults, seeds 0-3
    expand_grid({"alpha": [0.1, 1.0], "lr": [3e-4]}, seeds=2)
    # 4 runs: (alpha=0.1, lr=3e-4) seeds 0, 1, then (alpha=1, lr=3e-4) seeds 0, 1
    ```

    Args:
        grid: hyper-parameter name -> the values to try (a field of the
            learner's HParams; [`train`][jaxil.algorithms.offline.train.train]
            refuses a name the learner does not have). `{}` runs the defaults.
        seeds: runs per grid point.

    Returns:
        One [`RunSpec`][jaxil.algorithms.offline.train.RunSpec] per run, its
        `grid` the `(name, value)` overrides as floats.
    """
    names = sorted(grid)
    points = list(itertools.product(*(grid[n] for n in names))) if names else [()]
    runs = []
    for point in points:
        for s in range(seeds):
            runs.append(RunSpec(len(runs), s, tuple(zip(names, map(float, point)))))
    return runs


def run_hparams(learner: Learner, runs: list[RunSpec]) -> list[Any]:
    """Each run's hyper-parameters (defaults with its grid overrides),
    range-checked
    ([`jaxil.algorithms.offline.base.check_hparams`][jaxil.algorithms.offline.base.check_hparams])."""
    if not runs:
        raise ValueError("a training run needs at least one run (--seeds >= 1)")
    default = learner.default_hparams()
    fields = {f.name for f in dataclasses.fields(default)}
    for k, _ in runs[0].grid:
        if k not in fields:
            raise ValueError(
                f"{learner.name} has no hyper-parameter {k!r}; sweepable: {', '.join(sorted(fields))}"
            )
    hps = [default.replace(**dict(r.grid)) for r in runs]
    for r, h in zip(runs, hps):
        check_hparams(learner.name, h, f" (grid point {r.grid_label})" if r.grid else "")
    return hps


def config_identity(learner: Learner, spec: EnvSpec) -> dict:
    """The learner's config as its run identity records it. The box head is
    left out on discrete actions, where it does nothing, so run directories
    whose identity names no head still resume. So is a config field while it
    holds the value its class names in `IDENTITY_DEFAULTS`: run directories
    written by a jaxil without that field keep their identity."""
    config = dataclasses.asdict(learner.config)
    if spec.discrete:
        config.pop("box", None)
    for name, value in getattr(type(learner.config), "IDENTITY_DEFAULTS", {}).items():
        if config.get(name) == value:
            config.pop(name)
    return config


def init_runs(learner: Learner, runs: list[RunSpec], base_seed: int):
    """Stacked learner states `[R, ...]`; seed s uses the same key at every
    grid point (common random numbers make grid points comparable)."""
    hps = run_hparams(learner, runs)
    hp = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x, jnp.float32) for x in xs]), *hps)
    keys = jnp.stack([jax.random.PRNGKey(base_seed + r.seed) for r in runs])
    return _init_fn(learner)(keys, hp)


@functools.lru_cache(maxsize=32)
def _init_fn(learner: Learner):
    return jax.jit(jax.vmap(learner.init))


def _sharded(mesh: Optional[Mesh]) -> dict:
    """jit's in/out shardings for `f(per-run [R], shared)` on `mesh` (the
    runs axis split, the shared argument replicated); none without a mesh."""
    if mesh is None:
        return {}
    runs, shared = NamedSharding(mesh, P(RUNS)), NamedSharding(mesh, P())
    return dict(in_shardings=(runs, shared), out_shardings=runs)


@functools.lru_cache(maxsize=32)
def chunk_fn(learner: Learner, k: int, mesh: Optional[Mesh] = None):
    """`(states [R], data) -> (states, last metrics [R], health [R])`: K
    fused updates for every run (data shared), jitted once per (learner, K).
    With a `mesh` each device updates its slice of the runs, and where the
    mesh's `batch` axis has M > 1 devices each run's batch is split over M
    of them ([`jaxil.runs.sharding`][jaxil.runs.sharding])."""
    if mesh is None:
        return jax.jit(jax.vmap(lambda s, d: update_n_checked(learner, s, d, k), in_axes=(0, None)))
    place = functools.partial(constrain_batch, mesh=mesh, batch_size=learner.config.batch_size)
    return jax.jit(jax.vmap(lambda s, d: update_n_checked(learner, s, d, k, place),
                            in_axes=(0, None), spmd_axis_name=RUNS), **_sharded(mesh))


@functools.lru_cache(maxsize=32)
def _compiled(learner: Learner, env, eval_every: int, eval_episodes: int, deterministic: bool,
              mesh: Optional[Mesh] = None):
    """Jitted chunk and evaluation, cached so repeated runs compile once."""
    policy = learner.policy(deterministic)
    chunk = chunk_fn(learner, eval_every) if mesh is None else chunk_fn(learner, eval_every, mesh)
    episodes = lambda p, k: envs.run_episodes(env, policy, p, k, eval_episodes)  # noqa: E731
    evaluate = jax.jit(jax.vmap(episodes, in_axes=(0, None)), **_sharded(mesh))
    return chunk, evaluate


def train(
    learner: Learner,
    env: envs.MultiAgentEnv,
    data: LearnerData,
    *,
    runs: list[RunSpec],
    num_updates: int,
    eval_every: int,
    eval_episodes: int = 32,
    out_dir: Optional[str | Path] = None,
    resume: bool = False,
    overwrite: bool = False,
    base_seed: int = 0,
    deterministic_eval: bool = False,
    progress: bool = True,
    profile_dir: Optional[str] = None,
    run_info: Optional[dict] = None,
    data_identity: Optional[dict] = None,
    tensorboard: Optional[str | Path] = None,
    loggers: Sequence[run_loggers.LoggerFactory] = (),
    devices: Optional[int] = None,
    batch_devices: int = 1,
    precision: str = "default",
) -> dict:
    """Train R runs together; returns the summary written to `results.json`
    (and the final stacked `states`).

    The offline program
    ([`offline_program`][jaxil.algorithms.offline.train.offline_program]) run
    by the engine ([`jaxil.runs.engine.run`][jaxil.runs.engine.run]).
    `data_identity` (JSON-able: e.g. the dataset's content id and the labels'
    digest) joins the run's identity, so `resume` refuses other data;
    `run_info` is recorded in `run.json` without being compared. `loggers`:
    where the metrics rows go besides `metrics.jsonl`
    ([`jaxil.runs.loggers`][jaxil.runs.loggers], e.g.
    `[loggers.wandb("project", run_dir=out_dir)]`); `tensorboard`: also write
    the metrics as TensorBoard scalars there. `devices`: split the runs over
    this many devices (default: all, at most one per run;
    [`jaxil.runs.sharding`][jaxil.runs.sharding]). One device is the unsharded
    program; checkpoints and metrics do not depend on the count.
    `batch_devices`: split each run's batch over this many devices as well
    (data-parallel; the batch size must divide by it), on a mesh of
    `devices × batch_devices`. `precision`: the matmul precision of every
    update and evaluation (`default`, `fp32`, `tf32`, `bf16`;
    [`jaxil.runs.precision`][jaxil.runs.precision]).
    """
    run_hparams(learner, runs)  # refuse bad settings before the run directory is touched
    precision_ctx = matmul_precision(precision)
    if num_updates <= 0 or eval_every <= 0:
        raise ValueError(f"--updates and --eval-every must be positive, got {num_updates} "
                         f"and {eval_every}")
    if num_updates % eval_every:
        raise ValueError(
            f"--updates ({num_updates}) must be a multiple of --eval-every ({eval_every})"
        )
    if eval_episodes < 1:
        raise ValueError(f"--eval-episodes must be >= 1, got {eval_episodes}")
    if batch_devices > 1:
        check_batch_split(learner.config.batch_size, batch_devices)
    n_dev = num_devices(devices, len(runs), batch_devices)
    # In a multi-process run (jaxil.runs.distributed) process 0 alone writes the
    # run directory; the others only take part in orbax's collective checkpoints.
    writer = jax.process_index() == 0
    rd, ckpt, latest = None, None, None
    if out_dir:
        # --updates is not part of the identity: a finished run may be resumed
        # with more updates to train on (the first N do not depend on it).
        identity = dict(learner=learner.name, config=config_identity(learner, env.spec),
                        runs=[dataclasses.asdict(r) for r in runs], eval_every=eval_every,
                        eval_episodes=eval_episodes, base_seed=base_seed,
                        deterministic_eval=deterministic_eval, env_id=env.spec.env_id,
                        spec=env.spec.to_dict(), data=data_identity or {})
        if precision != "default":  # identities without a precision stay valid
            identity["precision"] = precision
        if writer:
            rd = open_run(out_dir, identity, step_key="update", resume=resume,
                          overwrite=overwrite, info=dict(run_info or {}, num_updates=num_updates))
            ckpt, latest = rd.checkpointer, rd.latest
        else:  # meets process 0's Checkpointer (orbax's barrier) after its overwrite
            ckpt = Checkpointer(Path(out_dir) / "checkpoints")
            latest = ckpt.latest_step() if resume else None
        if latest is not None and latest > num_updates:
            ckpt.close()
            raise ValueError(f"--updates {num_updates} is less than the {latest} updates "
                             f"already trained in {out_dir}; pass --updates >= {latest}")
    lay = (RunsLayout(make_mesh(n_dev, batch_devices), len(runs))
           if n_dev > 1 or batch_devices > 1 else None)
    program = offline_program(learner, env, data, runs=runs, num_updates=num_updates,
                              eval_every=eval_every, eval_episodes=eval_episodes,
                              base_seed=base_seed, deterministic_eval=deterministic_eval,
                              layout=lay)
    with precision_ctx:
        result = engine.run(program, rundir=rd, checkpointer=None if writer else ckpt,
                            resume_step=latest, progress=progress and writer,
                            loggers=[*loggers, *([run_loggers.tensorboard(tensorboard)]
                                                 if tensorboard else [])],
                            log_names=[f"run{r.index}-seed{r.seed}-{r.grid_label}" for r in runs],
                            profile_dir=profile_dir)
    summary = dict(result.summary)
    summary["states"] = lay.checkpoint_view(result.state) if lay else result.state
    return summary


def offline_program(learner: Learner, env: envs.MultiAgentEnv, data: LearnerData, *,
                    runs: list[RunSpec], num_updates: int, eval_every: int,
                    eval_episodes: int = 32, base_seed: int = 0,
                    deterministic_eval: bool = False,
                    layout: Optional[RunsLayout] = None) -> engine.Program:
    """The offline learners'
    [`jaxil.runs.engine.Program`][jaxil.runs.engine.Program]: R runs (grid
    points × seeds) stacked; a chunk is `eval_every` fused updates of every
    run, then one vmapped evaluation in the environment (the evaluation key
    folds in the chunk index). `layout` splits the runs (and batches) over
    devices."""
    lay = layout
    if lay:
        data = lay.replicate(data)
    chunk, evaluate = _compiled(learner, env, eval_every, eval_episodes, deterministic_eval,
                                lay.mesh if lay else None)

    def init():
        states = init_runs(learner, runs, base_seed)
        return states if lay is None else lay.place(states)

    def restore(ckpt, like, step):
        if lay:  # a checkpoint holds the R real runs of the padded state
            real = jax.eval_shape(lay.checkpoint_view, like)
            return lay.from_checkpoint(ckpt.restore(real, step, sharding=lay.checkpoint_sharding))
        return ckpt.restore(like, step)

    def eval_fn(states, c):
        eval_key = jax.random.fold_in(jax.random.PRNGKey(base_seed + 10_000), c)
        if lay:
            eval_key = lay.replicate(eval_key)
        ep = evaluate(states.params, eval_key)
        return {"eval_return": ep.episode_return, "eval_win_rate": ep.won}

    def postfix(v):
        return dict(ret=f"{v['eval_return'].mean():.3f}", win=f"{v['eval_win_rate'].mean():.2f}")

    return engine.Program(
        name=learner.name, step_key="update", num_chunks=num_updates // eval_every,
        steps_per_chunk=eval_every, step_unit=eval_every,
        run_ids=[dict(run=r.index, seed=r.seed, grid=dict(r.grid)) for r in runs],
        run_labels=[f"run {r.index} (seed {r.seed}, {r.grid_label})" for r in runs],
        init=init, chunk=lambda s, c: chunk(s, data), evaluate=eval_fn,
        summarize=lambda rows: summarize(rows, runs, learner.name), postfix=postfix,
        fetch=lay.gather if lay else jax.device_get, restore=restore,
        checkpoint_view=lay.checkpoint_view if lay else (lambda s: s))


def summarize(rows: list[dict], runs: list[RunSpec], name: str) -> dict:
    """Final-evaluation mean ± std over seeds, per grid point."""
    step, points = summarize_step(rows, "update", group=lambda r: _grid_label(r["grid"]),
                                  group_name="grid", order=[r.grid_label for r in runs])
    if step is None:
        return {"learner": name, "points": []}
    return {"learner": name, "update": step, "points": points}


def _grid_label(grid: dict) -> str:
    return ",".join(f"{k}={v:g}" for k, v in grid.items()) or "default"


def format_table(summary: dict) -> str:
    """The results table of [`train`][jaxil.algorithms.offline.train.train]:
    one line per grid point."""
    groups = [dict(p, learner=summary["learner"]) for p in summary["points"]]
    return fmt_table(groups, [("learner", "learner", "{}", "<"), ("grid", "grid", "{}", "<"),
                              ("seeds", "seeds", "{}"), mean_std("return", "return"),
                              mean_std("win", "win rate")])


# ----------------------------------------------------------------------------- data


# ----------------------------------------------------------------------------- CLI


