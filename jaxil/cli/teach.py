"""`jaxil teach`: train an IPPO/MAPPO teacher from a preset."""

from __future__ import annotations

from jaxil.teachers.presets import _parse_sets, preset

import argparse
import json
from jaxil.cli.args import (add_env_kwargs, add_loggers, env_kwargs, make_loggers, nonneg_int,
                            positive_int)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", required=True, help="environment id, e.g. smax:3m")
    p.add_argument("--out", default=None,
                   help="output directory (default runs/teachers/<env with : -> _>)")
    add_env_kwargs(p, "environment keyword (JSON value), recorded in teacher.json, e.g. "
                      "iterations=4 for a mamujoco: robot")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--algo", choices=["ippo", "mappo"], default=None)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="override config fields (JSON values), e.g. lr=0.001 ent_coef=0.01")
    p.add_argument("--num-checkpoints", type=positive_int, default=5)
    p.add_argument("--eval-episodes", type=positive_int, default=128)
    p.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in --out (the settings must "
                        "match the run there)")
    p.add_argument("--stop-after-chunks", type=positive_int, default=None)
    p.add_argument("--no-progress", "--quiet", dest="quiet", action="store_true",
                   help="no progress bar")
    add_loggers(p)


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from jaxil.runs.rundir import check_writable
    from jaxil.teachers.io import list_checkpoints
    from jaxil.teachers.train import train_teacher

    kw = env_kwargs(args, args.env)
    overrides = _parse_sets(args.set)
    if args.algo:
        overrides["algo"] = args.algo
    cfg = preset(args.env, **overrides)
    out = args.out or f"runs/teachers/{args.env.replace(':', '_')}"
    check_writable(Path(out))
    logs = make_loggers(args, out)
    if args.resume and not list_checkpoints(out):
        print(f"--resume: {out} holds no checkpoint yet; starting afresh")
    print(f"{args.env}{' ' + json.dumps(kw) if kw else ''} -> {out}: {cfg}")
    print(f"{cfg.num_chunks} chunks x {cfg.updates_per_chunk} updates x {cfg.batch_size} "
          f"steps = {cfg.env_steps} env steps", flush=True)
    doc = train_teacher(
        args.env, cfg, args.seed, out,
        num_checkpoints=args.num_checkpoints, eval_episodes=args.eval_episodes,
        resume=args.resume, stop_after_chunks=args.stop_after_chunks, progress=not args.quiet,
        loggers=logs, env_kwargs=kw,
    )
    for c in doc["checkpoints"]:
        print(json.dumps({"step": c["step"], "stochastic": c["eval_stochastic"],
                          "deterministic": c["eval_deterministic"]}))
    print("random:", json.dumps(doc.get("random_baseline")))
    return 0


def register(sub) -> None:
    """Add the `teach` subcommand to the `jaxil` command line."""
    p = sub.add_parser("teach", help="train an IPPO/MAPPO teacher (checkpoints + evals)",
                       description="Train an IPPO/MAPPO teacher from a preset.")
    _add_arguments(p)
    p.set_defaults(func=_run)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Train an IPPO/MAPPO teacher.")
    _add_arguments(p)
    args = p.parse_args(argv)
    try:
        raise SystemExit(_run(args))
    except (KeyError, ValueError, OSError) as e:
        raise SystemExit(f"error: {e.args[0] if isinstance(e, KeyError) else e}")


if __name__ == "__main__":
    main()
