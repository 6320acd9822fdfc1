"""Training runs: many seeds and a hyper-parameter grid in ONE compiled program.

``train(...)`` vmaps a learner over R = (grid points × seeds) runs. Each
compiled call performs ``eval_every`` fused updates for every run
(``update_n`` inside ``vmap``), then one vmapped evaluation in the real
environment. Python runs only between chunks: progress bar, JSONL metrics,
an orbax checkpoint of all runs. ``resume=True`` restarts from the newest
checkpoint and reproduces the uninterrupted run exactly (every random key is
carried in the state or derived from the chunk index); it refuses settings
that differ from the recorded run (:mod:`jaxil.rundir`). A non-finite loss or
parameter stops the run before its chunk is written (:mod:`jaxil.guard`).

CLI: ``jaxil train``, ``jaxil sweep``, ``jaxil eval``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import envs
from envs.core import EnvSpec
from jaxil import guard
from jaxil.checkpoint import Checkpointer
from jaxil.learners import LEARNERS, LearnerData, make_learner, update_n_checked
from jaxil.learners.base import Learner, check_hparams
from jaxil.cli_args import nonneg_int, positive_int
from jaxil.rundir import check_run_dir, metrics_rows, open_run_dir
from jaxil.policy import BOX_HEADS
from jaxil.precision import PRECISIONS, matmul_precision
from jaxil.sharding import (RUNS, RunsLayout, check_batch_split, constrain_batch, make_mesh,
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
    names = sorted(grid)
    points = list(itertools.product(*(grid[n] for n in names))) if names else [()]
    runs = []
    for point in points:
        for s in range(seeds):
            runs.append(RunSpec(len(runs), s, tuple(zip(names, map(float, point)))))
    return runs


def run_hparams(learner: Learner, runs: list[RunSpec]) -> list[Any]:
    """Each run's hyper-parameters (defaults with its grid overrides),
    range-checked (:func:`jaxil.learners.base.check_hparams`)."""
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
    left out on discrete actions, where it does nothing: runs on discrete
    environments keep the identity they had before the config named a head,
    and still resume. So is a field added later while it holds the value its
    config class names in ``IDENTITY_DEFAULTS`` (the behaviour runs made
    before it had)."""
    config = dataclasses.asdict(learner.config)
    if spec.discrete:
        config.pop("box", None)
    for name, value in getattr(type(learner.config), "IDENTITY_DEFAULTS", {}).items():
        if config.get(name) == value:
            config.pop(name)
    return config


def init_runs(learner: Learner, runs: list[RunSpec], base_seed: int):
    """Stacked learner states ``[R, ...]``; seed s uses the same key at every
    grid point (common random numbers make grid points comparable)."""
    hps = run_hparams(learner, runs)
    hp = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x, jnp.float32) for x in xs]), *hps)
    keys = jnp.stack([jax.random.PRNGKey(base_seed + r.seed) for r in runs])
    return _init_fn(learner)(keys, hp)


@functools.lru_cache(maxsize=32)
def _init_fn(learner: Learner):
    return jax.jit(jax.vmap(learner.init))


def _sharded(mesh: Optional[Mesh]) -> dict:
    """jit's in/out shardings for ``f(per-run [R], shared)`` on ``mesh`` (the
    runs axis split, the shared argument replicated); none without a mesh."""
    if mesh is None:
        return {}
    runs, shared = NamedSharding(mesh, P(RUNS)), NamedSharding(mesh, P())
    return dict(in_shardings=(runs, shared), out_shardings=runs)


@functools.lru_cache(maxsize=32)
def chunk_fn(learner: Learner, k: int, mesh: Optional[Mesh] = None):
    """``(states [R], data) -> (states, last metrics [R], health [R])``: K
    fused updates for every run (data shared), jitted once per (learner, K).
    With a ``mesh`` each device updates its slice of the runs, and where the
    mesh's ``batch`` axis has M > 1 devices each run's batch is split over M
    of them (:mod:`jaxil.sharding`)."""
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
    devices: Optional[int] = None,
    batch_devices: int = 1,
    precision: str = "default",
) -> dict:
    """Train R runs together; returns the summary written to ``results.json``.

    ``data_identity`` (JSON-able: e.g. the dataset's content id and the
    labels' digest) joins the run's identity, so ``resume`` refuses other
    data; ``run_info`` is recorded in ``run.json`` without being compared.
    ``tensorboard``: also write the metrics as TensorBoard scalars there.
    ``devices``: split the runs over this many devices (default: all, at
    most one per run; :mod:`jaxil.sharding`). One device is the unsharded
    program; checkpoints and metrics do not depend on the count.
    ``batch_devices``: split each run's batch over this many devices as
    well (data-parallel; the batch size must divide by it), on a mesh of
    ``devices × batch_devices``.
    ``precision``: the matmul precision of every update and evaluation
    (``default``, ``fp32``, ``tf32``, ``bf16``; :mod:`jaxil.precision`).
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
    n_chunks = num_updates // eval_every
    # In a multi-process run (jaxil.distributed) process 0 alone writes the run
    # directory; the others only take part in orbax's collective checkpoints.
    writer = jax.process_index() == 0
    rd, ckpt, latest, rows, start = None, None, None, [], 0
    if out_dir:
        # --updates is not part of the identity: a finished run may be resumed
        # with more updates to train on (the first N do not depend on it).
        identity = dict(learner=learner.name, config=config_identity(learner, env.spec),
                        runs=[dataclasses.asdict(r) for r in runs], eval_every=eval_every, eval_episodes=eval_episodes, base_seed=base_seed,
                        deterministic_eval=deterministic_eval, env_id=env.spec.env_id,
                        spec=env.spec.to_dict(), data=data_identity or {})
        if precision != "default":  # runs from before --precision keep their identity
            identity["precision"] = precision
        if writer:
            rd = open_run_dir(out_dir, identity, resume=resume, overwrite=overwrite,
                              info=dict(run_info or {}, num_updates=num_updates))
            ckpt, latest, rows = rd.checkpointer, rd.latest, rd.rows
        else:  # meets process 0's Checkpointer (orbax's barrier) after its overwrite
            ckpt = Checkpointer(Path(out_dir) / "checkpoints")
            latest = ckpt.latest_step() if resume else None
        if latest is not None and latest > num_updates:
            ckpt.close()
            raise ValueError(f"--updates {num_updates} is less than the {latest} updates "
                             f"already trained in {out_dir}; pass --updates >= {latest}")
    states = init_runs(learner, runs, base_seed)
    lay = (RunsLayout(make_mesh(n_dev, batch_devices), len(runs))
           if n_dev > 1 or batch_devices > 1 else None)
    if latest is not None:
        if lay:
            states = lay.from_checkpoint(ckpt.restore(states, latest,
                                                      sharding=lay.checkpoint_sharding))
        else:
            states = ckpt.restore(states, latest)
        start = latest // eval_every
    elif lay:
        states = lay.place(states)
    if lay:
        data = lay.replicate(data)
    # Without a mesh, device_get and np.asarray are today's unsharded path.
    fetch = lay.gather if lay else jax.device_get
    chunk, evaluate = _compiled(learner, env, eval_every, eval_episodes, deterministic_eval,
                                lay.mesh if lay else None)
    labels = [f"run {r.index} (seed {r.seed}, {r.grid_label})" for r in runs]

    tb = None
    if tensorboard and writer:
        from jaxil.tensorboard import TensorBoard

        tb = TensorBoard(tensorboard, [f"run{r.index}-seed{r.seed}-{r.grid_label}" for r in runs],
                         resume_from=start * eval_every if start else None)
    bar = None
    if progress and writer:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_updates, initial=start * eval_every, unit="upd",
                   desc=f"{learner.name} ×{len(runs)}")
    t_start = time.perf_counter()
    try:
        with precision_ctx:
            for c in range(start, n_chunks):
                t0 = time.perf_counter()
                if profile_dir and c == start + 1:  # after compilation
                    with jax.profiler.trace(profile_dir):
                        states, metrics, health = jax.block_until_ready(chunk(states, data))
                else:
                    states, metrics, health = chunk(states, data)
                kept = (f"the last good checkpoint (update {c * eval_every}) is kept in {Path(out_dir)}"
                        if out_dir and c > 0 else "no checkpoint was written")
                guard.check(fetch(health), learner=learner.name, run_labels=labels,
                            first_step=c * eval_every + 1, chunk_len=eval_every, kept=kept)
                eval_key = jax.random.fold_in(jax.random.PRNGKey(base_seed + 10_000), c)
                if lay:
                    eval_key = lay.replicate(eval_key)
                ep = evaluate(states.params, eval_key)
                ret, won = fetch((ep.episode_return, ep.won))
                ret, won = np.asarray(ret), np.asarray(won)
                metrics = jax.tree.map(np.asarray, fetch(metrics))
                dt = time.perf_counter() - t0
                update = (c + 1) * eval_every
                new = metrics_rows(dict(update=update),
                                   [dict(run=r.index, seed=r.seed, grid=dict(r.grid)) for r in runs],
                                   ret, won, metrics)
                rows.extend(new)
                if rd:
                    rd.append(new)
                if ckpt:
                    ckpt.save(update, lay.checkpoint_view(states) if lay else states)
                if tb:
                    tb.write(new)
                if bar:
                    bar.update(eval_every)
                    bar.set_postfix(ret=f"{ret.mean():.3f}", win=f"{won.mean():.2f}",
                                    ups=f"{eval_every * len(runs) / dt:.0f}")
    finally:
        if tb:
            tb.close()
    if bar:
        bar.close()
    summary = summarize(rows, runs, learner.name)
    summary["wall_seconds"] = time.perf_counter() - t_start
    if rd:
        rd.write_results(summary)
    if ckpt:
        ckpt.close()
    summary["states"] = lay.checkpoint_view(states) if lay else states
    return summary


def summarize(rows: list[dict], runs: list[RunSpec], name: str) -> dict:
    """Final-evaluation mean ± std over seeds, per grid point."""
    if not rows:
        return {"learner": name, "points": []}
    last = max(r["update"] for r in rows)
    final = {r["run"]: r for r in rows if r["update"] == last}
    points = {}
    for r in runs:
        points.setdefault(r.grid_label, []).append(final[r.index])
    table = []
    for label, rs in points.items():
        ret = np.array([x["eval_return"] for x in rs])
        win = np.array([x["eval_win_rate"] for x in rs])
        table.append(dict(grid=label, seeds=len(rs), return_mean=float(ret.mean()),
                          return_std=float(ret.std()), win_mean=float(win.mean()),
                          win_std=float(win.std()), returns=ret.tolist()))
    return {"learner": name, "update": last, "points": table}


def format_table(summary: dict) -> str:
    lines = [f"{'learner':<14}{'grid':<28}{'seeds':>6}{'return':>18}{'win rate':>16}"]
    for p in summary["points"]:
        lines.append(
            f"{summary['learner']:<14}{p['grid']:<28}{p['seeds']:>6}"
            f"{p['return_mean']:>10.3f} ± {p['return_std']:<5.3f}"
            f"{p['win_mean']:>9.3f} ± {p['win_std']:<5.3f}"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- data


def load_dataset(arg: str, seed: int = 0):
    """A dataset path, or a recipe name that is built (once) under runs/data/."""
    from jaxil.data import load

    from jaxil.data import recipes

    path = dataset_path(arg, seed)
    if not path.exists():
        recipes.build(recipes.get_recipe(arg), seed=seed, out_path=path)
    return load(path)


def dataset_path(arg: str, seed: int = 0) -> Path:
    """Where ``load_dataset(arg, seed)`` reads: ``arg`` itself when it is a
    file, else the recipe's file under runs/data/ (which may not exist yet)."""
    from jaxil.data import recipes

    p = Path(arg)
    if p.exists():
        return p
    try:
        recipe = recipes.get_recipe(arg)
    except KeyError as e:
        raise FileNotFoundError(f"--dataset {arg!r} is not a file, and {e.args[0]}") from None
    return recipe.default_path(seed)


def expert_labels(dataset, labels: str) -> Optional[np.ndarray]:
    """Per-trajectory expert flags: ground truth, none, all, or a file.

    A file is the ``.labels.json`` sidecar of ``jaxil label`` (its
    ``source_id`` must be this dataset's) or a ``.npy`` array; either holds
    one boolean (or 0/1) per trajectory.
    """
    m = dataset.num_trajectories
    if labels == "ground_truth":
        return np.asarray(dataset.expert, bool)
    if labels == "none":
        return None
    if labels == "all":  # the no-Phase-1 ablation: everything counts as expert
        return np.ones(m, bool)
    path = Path(labels)
    if not path.is_file():
        raise FileNotFoundError(f"--labels {labels!r}: use ground_truth, none, all or a "
                                ".labels.json / .npy file")
    if path.suffix == ".json":
        raw = _labels_json(path, dataset)
    elif path.suffix == ".npy":
        try:
            raw = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise ValueError(f"--labels {path} is not a readable .npy array ({e})") from None
    else:
        raise ValueError(f"--labels {path}: expected the .labels.json of `jaxil label` or a "
                         f".npy array of booleans, not a {path.suffix or 'suffix-less'} file")
    try:
        arr = np.asarray(raw)
    except ValueError:
        raise ValueError(f"--labels {path}: the labels must be a flat list of booleans, one "
                         "per trajectory") from None
    if arr.dtype != bool:
        if arr.dtype.kind not in "iuf":
            raise ValueError(f"--labels {path}: labels must be true/false (or 0/1), found "
                             f"values of type {arr.dtype}")
        off = arr[(arr != 0) & (arr != 1)]
        if off.size:
            raise ValueError(f"--labels {path}: labels must be true/false (or 0/1), found "
                             f"{off.reshape(-1)[0].item()!r}")
    if arr.shape != (m,):
        raise ValueError(f"--labels {path} has shape {arr.shape}; the dataset has {m} trajectories")
    return arr.astype(bool)


def _labels_json(path: Path, dataset) -> Any:
    from jaxil.phase1.pairs import dataset_id

    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--labels {path} is not valid JSON ({e.msg} at line {e.lineno}); "
                         "pass the .labels.json that `jaxil label` wrote") from None
    if not isinstance(doc, dict) or "expert" not in doc:
        raise ValueError(f"--labels {path} has no `expert` key (it holds a JSON "
                         f"{type(doc).__name__}); expected the .labels.json of `jaxil label`: "
                         '{"source_id": ..., "expert": [true, false, ...]}')
    src, want = doc.get("source_id"), dataset_id(dataset)
    if src is not None and src != want:
        raise ValueError(f"--labels {path} were made for dataset {src}, but --dataset is "
                         f"{want}; label this dataset with `jaxil label`")
    return doc["expert"]


def labels_digest(flags: Optional[np.ndarray]) -> Optional[str]:
    """A short digest of the expert flags a run trains with (part of its identity)."""
    if flags is None:
        return None
    import hashlib

    return hashlib.sha256(np.packbits(np.asarray(flags, bool)).tobytes()
                          + str(len(flags)).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- CLI


def _parse_grid(args) -> dict[str, list[float]]:
    grid = {}
    for name in ("alpha", "gamma", "beta", "lr", "lr_actor", "lr_critic", "lr_disc", "gp_coef"):
        v = getattr(args, name, None)
        if v:
            try:
                grid[name] = [float(x) for x in v.split(",")]
            except ValueError:
                raise ValueError(f"--{name.replace('_', '-')} takes comma-separated numbers, got {v!r}")
    return grid


def _run(args, sweep: bool) -> int:
    from jaxil import distributed

    grid = _parse_grid(args)
    if grid and not sweep:
        raise ValueError("hyper-parameter lists belong to `jaxil sweep`")
    if args.updates % args.eval_every:
        raise ValueError(f"--updates ({args.updates}) must be a multiple of --eval-every "
                         f"({args.eval_every})")
    writer = distributed.is_writer()  # jax.distributed is set up before the CLI imports envs
    if args.out and writer:  # before any work: a bad --out must not cost a dataset build
        check_run_dir(args.out, resume=args.resume, overwrite=args.overwrite)
    if not writer:  # process 0 builds a missing recipe dataset
        distributed.barrier("jaxil dataset")
    ds = load_dataset(args.dataset, args.data_seed)
    if writer:
        distributed.barrier("jaxil dataset")
    spec = ds.spec
    env = envs.make(spec.env_id)
    if env.spec != spec:
        raise ValueError(f"dataset spec {spec} does not match environment {env.spec}")
    box = {}
    if args.box is not None:
        if spec.discrete:
            raise ValueError(f"--box chooses the head of box actions; {spec.env_id} has discrete "
                             "actions: leave --box out")
        box = dict(box=args.box)
    learner = make_learner(args.algo, spec, hidden=tuple(args.hidden), batch_size=args.batch_size,
                           **box)
    needs_labels = args.algo != "bc_union"
    labels = expert_labels(ds, args.labels if needs_labels else "none")
    if needs_labels and not labels.any():
        raise ValueError(f"--labels {args.labels} marks no trajectory as expert, but {args.algo} "
                         "learns from D_E; label some trajectories (jaxil label) or use bc_union")
    data = LearnerData.from_dataset(ds, labels)
    runs = expand_grid(grid, args.seeds)
    from jaxil.phase1.pairs import dataset_id

    summary = train(
        learner, env, data, runs=runs, num_updates=args.updates, eval_every=args.eval_every,
        eval_episodes=args.eval_episodes, out_dir=args.out, resume=args.resume,
        overwrite=args.overwrite, base_seed=args.seed, progress=not args.no_progress,
        profile_dir=args.profile, run_info=dict(dataset=args.dataset, labels=args.labels),
        data_identity=dict(dataset_id=dataset_id(ds), labels=labels_digest(labels)),
        tensorboard=args.tensorboard, devices=args.devices, batch_devices=args.batch_devices,
        precision=args.precision,
    )
    if not writer:
        return 0
    print(format_table(summary))
    print(f"wall time {summary['wall_seconds']:.1f}s" + (f"; results in {args.out}" if args.out else ""))
    return 0


def _eval(args) -> int:
    out = Path(args.run)
    try:
        doc = json.loads((out / "run.json").read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{out} holds no run.json: pass a directory written by "
                                "`jaxil train --out` or `jaxil sweep --out`") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{out / 'run.json'} is not valid JSON ({e.msg})") from None
    info = doc.get("identity")
    if info is None:
        raise ValueError(f"{out / 'run.json'} records no identity (written by an older jaxil); "
                         "retrain the run")
    env = envs.make(info["env_id"])
    spec = env.spec
    recorded = EnvSpec.from_dict(info["spec"])
    if recorded != spec:
        diff = ", ".join(f"{k} {getattr(recorded, k)} -> {getattr(spec, k)}"
                         for k in ("num_agents", "obs_dim", "state_dim", "action", "max_steps")
                         if getattr(recorded, k) != getattr(spec, k))
        raise ValueError(f"the environment {info['env_id']} no longer matches the one {out} was "
                         f"trained on ({diff}); its checkpoint cannot act in it. Evaluate with "
                         "the jaxil/environment version that trained it, or retrain")
    cfg = dict(info["config"])
    cfg.pop("mixing", None)
    if not spec.discrete and "box" not in cfg:
        raise ValueError(
            f"{out / 'run.json'} names no box head (written before jaxil recorded it), so its "
            "checkpoint cannot be scored under the right one; add \"box\": \"tanh_gaussian\" "
            "(runs before the censored default) or \"censored_gaussian\" to identity.config")
    cfg["hidden"] = tuple(cfg["hidden"])
    learner = make_learner(info["learner"], spec, **cfg)
    runs = [RunSpec(r["index"], r["seed"], tuple(map(tuple, r["grid"]))) for r in info["runs"]]
    like = init_runs(learner, runs, info["base_seed"])
    ckpt = Checkpointer(out / "checkpoints")
    states = ckpt.restore(like)
    ev = jax.jit(jax.vmap(lambda p, k: envs.run_episodes(
        env, learner.policy(args.deterministic), p, k, args.episodes), in_axes=(0, None)))
    ep = ev(states.params, jax.random.PRNGKey(args.seed))
    ret, won = np.asarray(ep.episode_return), np.asarray(ep.won)
    for r in runs:
        print(f"run {r.index} seed {r.seed} {r.grid_label}: return {ret[r.index].mean():.3f} "
              f"win {won[r.index].mean():.3f}")
    print(f"all: return {ret.mean():.3f} ± {ret.mean(1).std():.3f}, win {won.mean():.3f}")
    return 0


def _common(p: argparse.ArgumentParser, sweep: bool) -> None:
    p.add_argument("algo", choices=LEARNERS)
    p.add_argument("--dataset", required=True, help="dataset file or recipe name")
    p.add_argument("--data-seed", type=nonneg_int, default=0, help="seed when building a recipe")
    p.add_argument("--labels", default="ground_truth",
                   help="expert labels: ground_truth | all | none | path (.npy/.json)")
    p.add_argument("--seeds", type=positive_int, default=1 if not sweep else 4)
    p.add_argument("--seed", type=nonneg_int, default=0, help="base seed")
    p.add_argument("--updates", type=positive_int, default=2000)
    p.add_argument("--eval-every", type=positive_int, default=500)
    p.add_argument("--eval-episodes", type=positive_int, default=32)
    p.add_argument("--batch-size", type=positive_int, default=512)
    p.add_argument("--hidden", type=positive_int, nargs="+", default=[256, 256])
    p.add_argument("--out", default=None, help="run directory (metrics, checkpoints)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true",
                   help="continue the run in --out (refused if any setting differs)")
    g.add_argument("--overwrite", action="store_true",
                   help="delete the run in --out and start afresh")
    p.add_argument("--profile", default=None, help="write a jax.profiler trace here")
    p.add_argument("--tensorboard", default=None, metavar="DIR",
                   help="also write the metrics as TensorBoard scalars under DIR (one run each)")
    p.add_argument("--devices", type=positive_int, default=None, metavar="N",
                   help="split the runs over N devices (default: all, at most one per run); "
                        "results agree with one device's to float32 round-off")
    p.add_argument("--batch-devices", type=positive_int, default=1, metavar="M",
                   help="also split each run's batch over M devices (data-parallel, for one "
                        "large run; --batch-size must divide by M; default: 1)")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default="default",
                   help="matmul precision: default (XLA's: fp32 on CPU, TF32 on recent NVIDIA "
                        "GPUs), fp32, tf32 or bf16 operands (jaxil.precision)")
    p.add_argument("--box", choices=BOX_HEADS, default=None,
                   help="the policy's head on box actions (default: censored_gaussian; "
                        "jaxil.policy): censored_gaussian, tanh_gaussian or beta")
    p.add_argument("--no-progress", action="store_true")
    if sweep:
        for name in ("alpha", "gamma", "beta", "lr", "lr-actor", "lr-critic", "lr-disc", "gp-coef"):
            p.add_argument(f"--{name}", default=None, help="comma-separated values")


def register(sub) -> None:
    p = sub.add_parser("train", help="train a learner (seeds vmapped in one program)")
    _common(p, sweep=False)
    p.set_defaults(func=lambda a: _run(a, sweep=False))
    s = sub.add_parser("sweep", help="train a hyper-parameter grid × seeds in one program")
    _common(s, sweep=True)
    s.set_defaults(func=lambda a: _run(a, sweep=True))
    e = sub.add_parser("eval", help="evaluate the newest checkpoint of a run directory")
    e.add_argument("run")
    e.add_argument("--episodes", type=positive_int, default=32)
    e.add_argument("--seed", type=nonneg_int, default=123)
    e.add_argument("--deterministic", action="store_true")
    e.set_defaults(func=_eval)
