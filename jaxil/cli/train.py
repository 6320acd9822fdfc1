"""`jaxil train`, `jaxil sweep` and `jaxil eval`."""

from __future__ import annotations

from jaxil.algorithms.offline import SWEEPABLE

from jaxil.collect.recipes import load_dataset
from jaxil.data.environment import dataset_env
from jaxil.data.labels import expert_labels, labels_digest

from jaxil.algorithms.offline.train import RunSpec, expand_grid, format_table, init_runs, train

import argparse
import json
from pathlib import Path
import jax
import numpy as np
from jaxil import envs
from jaxil.envs.core import EnvSpec
from jaxil.runs.checkpoint import Checkpointer, restore_newest_intact
from jaxil.algorithms.offline import LEARNERS, LearnerData, make_learner
from jaxil.cli.args import (add_hidden, add_loggers, add_progress, add_run_dir, add_seeds,
                            make_loggers, nonneg_int, positive_int)
from jaxil.runs.rundir import check_run_dir, note
from jaxil.nn.policy import BOX_HEADS
from jaxil.runs.precision import PRECISIONS


def _parse_grid(args) -> dict[str, list[float]]:
    grid = {}
    for name in SWEEPABLE:
        v = getattr(args, name, None)
        if v:
            try:
                grid[name] = [float(x) for x in v.split(",")]
            except ValueError:
                raise ValueError(f"--{name.replace('_', '-')} takes comma-separated numbers, got {v!r}")
    return grid


def _run(args, sweep: bool) -> int:
    from jaxil.runs import distributed

    grid = _parse_grid(args)
    if grid and not sweep:
        raise ValueError("hyper-parameter lists belong to `jaxil sweep`")
    if args.updates % args.eval_every:
        raise ValueError(f"--updates ({args.updates}) must be a multiple of --eval-every "
                         f"({args.eval_every})")
    logs = make_loggers(args, args.out)
    writer = distributed.is_writer()  # jax.distributed is set up before the CLI imports envs
    if args.out and writer:  # before any work: a bad --out must not cost a dataset build
        check_run_dir(args.out, resume=args.resume, overwrite=args.overwrite)
    if not writer:  # process 0 builds a missing recipe dataset
        distributed.barrier("jaxil dataset")
    ds = load_dataset(args.dataset, args.data_seed)
    if writer:
        distributed.barrier("jaxil dataset")
    spec = ds.spec
    env = dataset_env(ds)
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
    from jaxil.data.preferences import dataset_id

    summary = train(
        learner, env, data, runs=runs, num_updates=args.updates, eval_every=args.eval_every,
        eval_episodes=args.eval_episodes, out_dir=args.out, resume=args.resume,
        overwrite=args.overwrite, base_seed=args.seed, progress=not args.no_progress,
        profile_dir=args.profile, run_info=dict(dataset=args.dataset, labels=args.labels),
        data_identity=dict(dataset_id=dataset_id(ds), labels=labels_digest(labels),
                           # only when set: runs on default environments keep their identity
                           **({"env_kwargs": ds.info.env_kwargs} if ds.info.env_kwargs else {})),
        loggers=logs, devices=args.devices, batch_devices=args.batch_devices,
        precision=args.precision,
    )
    if not writer:
        return 0
    print(format_table(summary))
    print(f"wall time {summary['wall_seconds']:.1f}s" + (f"; results in {args.out}" if args.out else ""))
    return 0


def _run_kind(identity: dict) -> str:
    """Which command wrote a run directory, from its identity's keys."""
    if "regimes" in identity:
        return "a `jaxil interactive`"
    if "ppo" in identity and "method" in identity:
        return f"a `jaxil irl {identity['method']}`"
    if "source" in identity and "sft" in identity:
        return "a `jaxil irl reward-model`"
    return "another kind of"


def _eval(args) -> int:
    out = Path(args.run)
    try:
        doc = json.loads((out / "run.json").read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{out} holds no run.json: pass a directory written by "
                                "`jaxil train --out` or `jaxil sweep --out`") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{out / 'run.json'} is not valid JSON ({e}): it was cut short or "
                         "edited; restore it from a copy of the run, or retrain the run with "
                         "--overwrite") from None
    info = doc.get("identity")
    if info is None:
        raise ValueError(f"{out / 'run.json'} records no identity (written by an older jaxil); "
                         "retrain the run")
    if "learner" not in info or "runs" not in info:
        raise ValueError(f"{out} is {_run_kind(info)} run directory; `jaxil eval` evaluates the "
                         "runs of `jaxil train` and `jaxil sweep` (their results.json has the "
                         "others' final evaluation)")
    env = envs.make(info["env_id"], **(info.get("data") or {}).get("env_kwargs", {}))
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
    latest = ckpt.latest_step()
    if latest is None:
        raise FileNotFoundError(f"{out} holds no checkpoint yet: wait for the run's first "
                                "evaluation (--eval-every), or pass another run directory")
    states, _, notice = restore_newest_intact(
        ckpt, lambda step: ckpt.restore(like, step), latest,
        describe=lambda step: f"update {step}", using="evaluating",
        fix="retrain the run with --overwrite")
    if notice:
        note(notice)
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
    add_seeds(p, 1 if not sweep else 4)
    p.add_argument("--updates", type=positive_int, default=2000)
    p.add_argument("--eval-every", type=positive_int, default=500)
    p.add_argument("--eval-episodes", type=positive_int, default=32)
    p.add_argument("--batch-size", type=positive_int, default=512)
    add_hidden(p, (256, 256))
    add_run_dir(p)
    p.add_argument("--profile", default=None, help="write a jax.profiler trace here")
    p.add_argument("--devices", type=positive_int, default=None, metavar="N",
                   help="split the runs over N devices (default: all, at most one per run); "
                        "results agree with one device's to float32 round-off")
    p.add_argument("--batch-devices", type=positive_int, default=1, metavar="M",
                   help="also split each run's batch over M devices (data-parallel, for one "
                        "large run; --batch-size must divide by M; default: 1)")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default="default",
                   help="matmul precision: default (XLA's: fp32 on CPU, TF32 on recent NVIDIA "
                        "GPUs), fp32, tf32 or bf16 operands (jaxil.runs.precision)")
    p.add_argument("--box", choices=BOX_HEADS, default=None,
                   help="the policy's head on box actions (default: censored_gaussian; "
                        "jaxil.nn.policy): censored_gaussian, tanh_gaussian or beta")
    add_loggers(p)
    add_progress(p)
    if sweep:
        for name in SWEEPABLE:
            p.add_argument(f"--{name.replace('_', '-')}", default=None,
                           help="comma-separated values")


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
