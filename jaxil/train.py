"""Training runs: many seeds and a hyper-parameter grid in ONE compiled program.

``train(...)`` vmaps a learner over R = (grid points × seeds) runs. Each
compiled call performs ``eval_every`` fused updates for every run
(``update_n`` inside ``vmap``), then one vmapped evaluation in the real
environment. Python runs only between chunks: progress bar, JSONL metrics,
an orbax checkpoint of all runs. ``resume=True`` restarts from the newest
checkpoint and reproduces the uninterrupted run exactly (every random key is
carried in the state or derived from the chunk index).

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

import envs
from jaxil.checkpoint import Checkpointer
from jaxil.learners import LEARNERS, LearnerData, make_learner, update_n
from jaxil.learners.base import Learner


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


def init_runs(learner: Learner, runs: list[RunSpec], base_seed: int):
    """Stacked learner states ``[R, ...]``; seed s uses the same key at every
    grid point (common random numbers make grid points comparable)."""
    default = learner.default_hparams()
    fields = {f.name for f in dataclasses.fields(default)}
    for k, _ in runs[0].grid:
        if k not in fields:
            raise ValueError(
                f"{learner.name} has no hyper-parameter {k!r}; sweepable: {', '.join(sorted(fields))}"
            )
    hps = [default.replace(**dict(r.grid)) for r in runs]
    hp = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x, jnp.float32) for x in xs]), *hps)
    keys = jnp.stack([jax.random.PRNGKey(base_seed + r.seed) for r in runs])
    return _init_fn(learner)(keys, hp)


@functools.lru_cache(maxsize=32)
def _init_fn(learner: Learner):
    return jax.jit(jax.vmap(learner.init))


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill
            break
    return rows


def _write_jsonl_atomic(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


@functools.lru_cache(maxsize=32)
def chunk_fn(learner: Learner, k: int):
    """``(states [R], data) -> (states, last metrics [R])``: K fused updates
    for every run (data shared), jitted once per (learner, K)."""
    return jax.jit(jax.vmap(lambda s, d: update_n(learner, s, d, k), in_axes=(0, None)))


@functools.lru_cache(maxsize=32)
def _compiled(learner: Learner, env, eval_every: int, eval_episodes: int, deterministic: bool):
    """Jitted chunk and evaluation, cached so repeated runs compile once."""
    policy = learner.policy(deterministic)
    chunk = chunk_fn(learner, eval_every)
    evaluate = jax.jit(
        jax.vmap(lambda p, k: envs.run_episodes(env, policy, p, k, eval_episodes), in_axes=(0, None))
    )
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
    base_seed: int = 0,
    deterministic_eval: bool = False,
    progress: bool = True,
    profile_dir: Optional[str] = None,
    run_info: Optional[dict] = None,
) -> dict:
    """Train R runs together; returns the summary written to ``results.json``."""
    if num_updates <= 0 or eval_every <= 0:
        raise ValueError("num_updates and eval_every must be positive")
    if num_updates % eval_every:
        raise ValueError(
            f"num_updates ({num_updates}) must be a multiple of eval_every ({eval_every})"
        )
    n_chunks = num_updates // eval_every
    states = init_runs(learner, runs, base_seed)

    chunk, evaluate = _compiled(learner, env, eval_every, eval_episodes, deterministic_eval)

    out = Path(out_dir) if out_dir else None
    ckpt, rows, start = None, [], 0
    if out:
        out.mkdir(parents=True, exist_ok=True)
        ckpt = Checkpointer(out / "checkpoints")
        metrics_path = out / "metrics.jsonl"
        latest = ckpt.latest_step()
        if latest is not None and not resume:
            raise FileExistsError(
                f"{out} already holds a run (checkpoint at update {latest}); "
                "pass --resume to continue it or choose another --out"
            )
        if latest is not None:
            states = ckpt.restore(states, latest)
            start = latest // eval_every
            rows = [r for r in _read_jsonl(metrics_path) if r["update"] <= latest]
            _write_jsonl_atomic(metrics_path, rows)
        info = dict(run_info or {}, learner=learner.name, config=dataclasses.asdict(learner.config),
                    runs=[dataclasses.asdict(r) for r in runs], num_updates=num_updates,
                    eval_every=eval_every, eval_episodes=eval_episodes, base_seed=base_seed)
        (out / "run.json").write_text(json.dumps(info, indent=2, default=str))

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_updates, initial=start * eval_every, unit="upd",
                   desc=f"{learner.name} ×{len(runs)}")
    t_start = time.perf_counter()
    for c in range(start, n_chunks):
        t0 = time.perf_counter()
        if profile_dir and c == start + 1:  # after compilation
            with jax.profiler.trace(profile_dir):
                states, metrics = jax.block_until_ready(chunk(states, data))
        else:
            states, metrics = chunk(states, data)
        ep = evaluate(states.params, jax.random.fold_in(jax.random.PRNGKey(base_seed + 10_000), c))
        ret = np.asarray(ep.episode_return)
        won = np.asarray(ep.won)
        metrics = jax.tree.map(np.asarray, metrics)
        dt = time.perf_counter() - t0
        update = (c + 1) * eval_every
        for r in runs:
            row = dict(update=update, run=r.index, seed=r.seed, grid=dict(r.grid),
                       eval_return=float(ret[r.index].mean()),
                       eval_win_rate=float(won[r.index].mean()))
            row.update({k: float(v[r.index]) for k, v in metrics.items()})
            rows.append(row)
        if out:
            with open(out / "metrics.jsonl", "a") as f:
                for row in rows[-len(runs):]:
                    f.write(json.dumps(row) + "\n")
            ckpt.save(update, states)
        if bar:
            bar.update(eval_every)
            bar.set_postfix(ret=f"{ret.mean():.3f}", win=f"{won.mean():.2f}",
                            ups=f"{eval_every * len(runs) / dt:.0f}")
    if bar:
        bar.close()
    summary = summarize(rows, runs, learner.name)
    summary["wall_seconds"] = time.perf_counter() - t_start
    if out:
        (out / "results.json").write_text(json.dumps(summary, indent=2))
        ckpt.close()
    summary["states"] = states
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
    """Per-trajectory expert flags: ground truth, none, all, or a file."""
    m = dataset.num_trajectories
    if labels == "ground_truth":
        return np.asarray(dataset.expert, bool)
    if labels == "none":
        return None
    if labels == "all":  # the no-Phase-1 ablation: everything counts as expert
        return np.ones(m, bool)
    path = Path(labels)
    if not path.exists():
        raise FileNotFoundError(f"--labels {labels!r}: use ground_truth, none, all or a file")
    flags = np.asarray(json.loads(path.read_text())["expert"] if path.suffix == ".json"
                       else np.load(path), bool)
    if flags.shape != (m,):
        raise ValueError(f"labels in {path} have shape {flags.shape}; the dataset has {m} trajectories")
    return flags


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
    ds = load_dataset(args.dataset, args.data_seed)
    spec = ds.spec
    env = envs.make(spec.env_id)
    if env.spec != spec:
        raise ValueError(f"dataset spec {spec} does not match environment {env.spec}")
    learner = make_learner(args.algo, spec, hidden=tuple(args.hidden), batch_size=args.batch_size)
    needs_labels = args.algo != "bc_union"
    labels = expert_labels(ds, args.labels if needs_labels else "none")
    data = LearnerData.from_dataset(ds, labels)
    grid = _parse_grid(args)
    if grid and not sweep:
        raise ValueError("hyper-parameter lists belong to `jaxil sweep`")
    runs = expand_grid(grid, args.seeds)
    summary = train(
        learner, env, data, runs=runs, num_updates=args.updates, eval_every=args.eval_every,
        eval_episodes=args.eval_episodes, out_dir=args.out, resume=args.resume,
        base_seed=args.seed, progress=not args.no_progress, profile_dir=args.profile,
        run_info=dict(dataset=args.dataset, labels=args.labels, env_id=spec.env_id),
    )
    print(format_table(summary))
    print(f"wall time {summary['wall_seconds']:.1f}s" + (f"; results in {args.out}" if args.out else ""))
    return 0


def _eval(args) -> int:
    out = Path(args.run)
    info = json.loads((out / "run.json").read_text())
    spec = envs.make(info["env_id"]).spec
    env = envs.make(info["env_id"])
    cfg = dict(info["config"])
    cfg.pop("mixing", None)
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
    p.add_argument("--data-seed", type=int, default=0, help="seed when building a recipe")
    p.add_argument("--labels", default="ground_truth",
                   help="expert labels: ground_truth | all | none | path (.npy/.json)")
    p.add_argument("--seeds", type=int, default=1 if not sweep else 4)
    p.add_argument("--seed", type=int, default=0, help="base seed")
    p.add_argument("--updates", type=int, default=2000)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-episodes", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    p.add_argument("--out", default=None, help="run directory (metrics, checkpoints)")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--profile", default=None, help="write a jax.profiler trace here")
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
    e.add_argument("--episodes", type=int, default=32)
    e.add_argument("--seed", type=int, default=123)
    e.add_argument("--deterministic", action="store_true")
    e.set_defaults(func=_eval)
