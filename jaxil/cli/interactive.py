"""`jaxil interactive`: BC, DAgger, OEC and on-policy rejection sampling.

    jaxil interactive oec --env smax:3m --budget 3000 --seeds 4 --out runs/oec-3m
    jaxil interactive dagger --env jumanji:LevelBasedForaging-v0 --budget 4000 \\
        --beta-schedule linear --beta-rate 0.125
    jaxil interactive oec --env smax:3m --budget 3000 --out runs/oec-3m --resume

The expert is the zoo's (a trained teacher under `runs/teachers`, else a
teacher shipped with jaxil, else the scripted expert; `--expert scripted`
forces the last, `--expert DIR` takes a teacher run directory). A teacher
samples its actions, as its zoo tier does; `--expert-greedy` makes it act on
its greedy / mean action instead. Seeds run
vmapped in one program per round; the run directory holds `run.json`,
`metrics.jsonl`, orbax checkpoints (one per evaluation) and `results.json`
with the covariate-shift diagnostic.
"""

from __future__ import annotations

import argparse
from typing import Any, Optional

from jaxil.cli.args import (add_env_kwargs, add_hidden, add_loggers, add_progress, add_run_dir,
                            add_seeds, env_kwargs, make_loggers, nonneg_int, positive_float,
                            positive_int, probability)
from jaxil.algorithms.interactive.config import METHODS, STUDENTS, InteractiveConfig, regime
from jaxil.algorithms.interactive.labels import VERIFIERS
from jaxil.algorithms.interactive.schedule import BETA_SCHEDULES, SWITCHES


def load_expert(env_id: str, expert: str, env_kwargs: Optional[dict] = None,
                greedy: bool = False) -> tuple[Any, Any, Any, str]:
    """`(env, policy, params, source)` of the zoo expert of `env_id`, in the
    environment made with `env_kwargs`.

    `greedy`: a teacher expert acts on its greedy / mean action instead of
    sampling, for its demonstrations and its labels (the source then ends in
    " (greedy)"). Raises ValueError when the expert is not a teacher."""
    from jaxil.collect.zoo import make_zoo

    kw: dict[str, Any] = dict(env_kwargs=env_kwargs)
    if expert == "scripted":
        kw["discover"] = False
    elif expert != "zoo":
        kw["teacher_dir"] = expert
    tier = make_zoo(env_id, **kw)["expert"]
    if greedy and tier.details.get("teacher_dir") is None:
        raise ValueError(f"--expert-greedy needs a teacher expert, but the expert of {env_id} is "
                         f"{tier.source}; give --expert a teacher run directory or drop "
                         f"--expert-greedy")
    zoo = make_zoo(env_id, greedy_expert=greedy, **kw)
    tier = zoo["expert"]
    return zoo.env, tier.policy, tier.params, tier.source


def knob_overrides(args, spec) -> dict[str, Any]:
    """The regime knobs given on the command line (`add_method_knobs`)."""
    over = {}
    for flag, name in (("beta0", "beta0"), ("beta_schedule", "beta_kind"),
                       ("beta_rate", "beta_rate"), ("switch", "switch_kind"),
                       ("switch_p", "switch_p"), ("verifier", "verifier"),
                       ("return_threshold", "return_threshold"),
                       ("repeat_limit", "repeat_limit"), ("demo_ratio", "demo_ratio"),
                       ("demo_labels", "demo_labels"), ("lr", "lr")):
        v = getattr(args, flag)
        if v is not None:
            over[name] = v
    if args.switch_range is not None:
        over["switch_lo"], over["switch_hi"] = args.switch_range
    if args.no_mask:
        over["mask_prefix"] = False
    if getattr(args, "scratch", False):
        over["scratch"] = True
    if over.get("verifier") == "auto":
        over["verifier"] = "win" if spec.has_win else "return"
    return over


def _knobs(args, spec) -> dict[str, Any]:
    """The method's preset, with every knob given on the command line."""
    return regime(args.method, args.budget, sft_labels=args.sft_labels, has_win=spec.has_win,
                  **knob_overrides(args, spec))


def _run(args) -> int:
    from jaxil.algorithms.interactive.loop import format_table, run

    logs = make_loggers(args, args.out)
    kw = env_kwargs(args, args.env)
    env, policy, params, source = load_expert(args.env, args.expert, kw, args.expert_greedy)
    config = InteractiveConfig(
        hidden=tuple(args.hidden), batch_size=args.batch_size, rounds=args.rounds,
        envs_per_round=args.envs_per_round, updates_per_round=args.updates_per_round,
        sft_labels=args.sft_labels, sft_updates=args.sft_updates, capacity=args.capacity,
        eval_episodes=args.eval_episodes, deterministic_eval=args.deterministic_eval,
        student=args.student)
    knobs = _knobs(args, env.spec)
    name = args.name or f"{args.method}@{args.budget}"
    summary = run(env, policy, params, [(name, knobs)], seeds=args.seeds, config=config,
                  base_seed=args.seed, out_dir=args.out, resume=args.resume,
                  overwrite=args.overwrite, loggers=logs,
                  eval_every=args.eval_every, progress=not args.no_progress,
                  diagnostics=not args.no_diagnostics,
                  run_info=dict(method=args.method, expert=source, budget=args.budget,
                                # only when set: runs on default environments keep their identity
                                **({"env_kwargs": kw} if kw else {})))
    print(f"expert: {source} (demonstrations: return {summary['demos']['return_mean']:.3f}, "
          f"win {summary['demos']['win_rate']:.3f})")
    print(format_table(summary))
    print(f"wall time {summary['wall_seconds']:.1f}s" + (f"; results in {args.out}" if args.out else ""))
    return 0


def register(sub) -> None:
    p = sub.add_parser("interactive", help="interactive imitation: bc, dagger, oec, onpolicy",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("method", choices=METHODS)
    p.add_argument("--env", required=True, help="environment id, e.g. smax:3m")
    p.add_argument("--expert", default="zoo", help="zoo | scripted | a teacher run directory")
    p.add_argument("--expert-greedy", action="store_true",
                   help="a teacher expert demonstrates and labels with its greedy / mean action "
                        "instead of sampling (the label imitation's DAgger asks for)")
    add_env_kwargs(p, "environment keyword (JSON value), recorded in run.json, e.g. "
                      "iterations=4 for a mamujoco: robot")
    p.add_argument("--budget", type=positive_int, required=True,
                   help="total expert labels (agent-steps), demonstrations included")
    add_seeds(p)
    p.add_argument("--name", default=None, help="regime label in metrics (default METHOD@BUDGET)")
    d = InteractiveConfig()
    p.add_argument("--rounds", type=positive_int, default=d.rounds)
    p.add_argument("--envs-per-round", type=positive_int, default=d.envs_per_round)
    p.add_argument("--updates-per-round", type=positive_int, default=d.updates_per_round)
    p.add_argument("--sft-labels", type=positive_int, default=d.sft_labels)
    p.add_argument("--sft-updates", type=positive_int, default=d.sft_updates)
    p.add_argument("--capacity", type=positive_int, default=d.capacity, help="buffer steps (ring)")
    add_hidden(p, d.hidden)
    p.add_argument("--batch-size", type=positive_int, default=d.batch_size)
    p.add_argument("--lr", type=positive_float, default=None)
    p.add_argument("--eval-episodes", type=positive_int, default=d.eval_episodes)
    p.add_argument("--eval-every", type=positive_int, default=1, help="rounds between evaluations")
    p.add_argument("--deterministic-eval", action="store_true")
    p.add_argument("--student", choices=tuple(STUDENTS), default="bc",
                   help="the student's network: bc (relu) or ppo (the PPO actor's: tanh, "
                        "a tanh-Gaussian head, observations standardised by the SFT "
                        "demonstrations)")
    k = add_method_knobs(p)
    k.add_argument("--scratch", action="store_true", help="retrain from scratch every round")
    add_run_dir(p)
    add_loggers(p)
    add_progress(p)
    p.add_argument("--no-diagnostics", action="store_true", help="skip the covariate-shift report")
    p.set_defaults(func=_run)


def add_method_knobs(p, steps: str = "steps"):
    """The regime knobs shared by `jaxil interactive` and `jaxil lm
    interactive` (defaults: the method's preset); returns the group.
    `steps`: the unit of the switch range (steps, or turns on token tasks)."""
    k = p.add_argument_group("method knobs (defaults: the method's preset)")
    k.add_argument("--beta0", type=probability, default=None,
                   help="DAgger expert probability, round 0")
    k.add_argument("--beta-schedule", choices=BETA_SCHEDULES, default=None)
    k.add_argument("--beta-rate", type=float, default=None)
    k.add_argument("--switch", choices=SWITCHES, default=None, help="OEC switch distribution")
    k.add_argument("--switch-range", type=nonneg_int, nargs=2, metavar=("LO", "HI"), default=None,
                   help=f"OEC switch range in {steps}")
    k.add_argument("--switch-p", type=probability, default=None,
                   help="geometric switch probability")
    k.add_argument("--no-mask", action="store_true", help="train on the student's prefix too")
    k.add_argument("--verifier", choices=VERIFIERS + ("auto",), default=None)
    k.add_argument("--return-threshold", type=float, default=None)
    k.add_argument("--repeat-limit", type=nonneg_int, default=None,
                   help="repetition filter R (0: off)")
    k.add_argument("--demo-ratio", type=float, default=None,
                   help="share of each batch from demonstrations (-1: in proportion)")
    k.add_argument("--demo-labels", type=nonneg_int, default=None,
                   help="labels of the budget spent on demonstrations")
    return k
