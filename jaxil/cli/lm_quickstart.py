"""`jaxil lm quickstart`: tokens in five minutes.

A tiny transformer student (about 115k parameters) on a small
`tokens:repair` (a list of 8 values with 2 faults to find and fix), two
seeds vmapped in one program:

1. SFT: the student starts from behaviour cloning on 200 expert tokens
   (`SFT_TOKENS`) of the scripted expert's demonstrations (about 10
   episodes);
2. then two rounds of an interactive method (OEC by default) against BC, at
   the same budget of 560 expert tokens (`BUDGET`, `--budget`; at least
   the SFT start's 200): BC spends it all on more
   demonstrations, OEC on the expert's corrections of the student's own
   rollouts.

It prints the engine's progress, the table (greedy win rate and return on
64 fixed instances, mean ± population std over seeds) and its wall time.
The same run in Python is on the docs page "Interactive on token tasks".
"""

from __future__ import annotations

import argparse
import time

from jaxil.cli.args import add_progress, nonneg_int, positive_int

TASK = "tokens:repair"
KNOBS = dict(length=8, faults=2, values=16)
SFT_TOKENS = 200
BUDGET = 560
SEEDS = 2


def config():
    """The quickstart's static settings (a
    [TokenInteractiveConfig][jaxil.algorithms.lm.interactive.TokenInteractiveConfig])."""
    from jaxil.algorithms.lm.interactive import TokenInteractiveConfig

    return TokenInteractiveConfig(rounds=2, episodes_per_round=24, updates_per_round=100,
                                  sft_tokens=SFT_TOKENS, sft_updates=150, eval_episodes=64,
                                  learning_rate=3e-3)


def regimes(method: str, budget: int) -> list[tuple[str, dict]]:
    """BC and `method` at `budget` expert tokens, both from the same SFT start."""
    from jaxil.algorithms.lm.interactive import token_regime

    return [(m, token_regime(m, budget, sft_tokens=SFT_TOKENS)) for m in ("bc", method)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from jaxil.algorithms.lm.interactive import TOKEN_METHODS

    p.add_argument("--method", choices=[m for m in TOKEN_METHODS if m != "bc"], default="oec",
                   help="the interactive method set against BC (default oec)")
    p.add_argument("--budget", type=positive_int, default=BUDGET,
                   help=f"expert tokens per run, demonstrations included (at least the SFT "
                        f"start's {SFT_TOKENS}; default {BUDGET})")
    p.add_argument("--seeds", type=positive_int, default=SEEDS)
    p.add_argument("--seed", type=nonneg_int, default=0, help="first seed")
    add_progress(p)


def run(args: argparse.Namespace) -> int:
    from jaxil import envs
    from jaxil.algorithms.lm import interactive as TI
    from jaxil.envs.experts import scripted_expert

    if args.budget < SFT_TOKENS:
        raise ValueError(f"--budget {args.budget} is below the SFT start's {SFT_TOKENS} expert "
                         f"tokens; pass --budget {SFT_TOKENS} or more")
    t0 = time.perf_counter()
    env = envs.make(TASK, **KNOBS)
    knobs = ", ".join(f"{k}={v}" for k, v in KNOBS.items())
    print(f"{TASK} ({knobs}): a tiny transformer, SFT on {SFT_TOKENS} expert tokens, then "
          f"BC vs {args.method} at {args.budget} expert tokens, {args.seeds} seeds")
    result = TI.run(env, scripted_expert(env)[0], None, regimes(args.method, args.budget),
                    seeds=args.seeds, config=config(), base_seed=args.seed,
                    progress=not args.no_progress)
    print(TI.format_table(result.summary))
    print(f"(greedy win rate and return on {config().eval_episodes} fixed instances, mean ± "
          f"population std over seeds) wall time {time.perf_counter() - t0:.0f} s")
    return 0


def register(lsub) -> None:
    """Adds `quickstart` to the `jaxil lm` subcommands."""
    q = lsub.add_parser("quickstart", help="tokens in five minutes: SFT, then BC vs OEC on a "
                                           "small tokens:repair",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(q)
    q.set_defaults(func=run)
