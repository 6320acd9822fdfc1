"""Range-checked argument types and the shared flag groups of the `jaxil` command line.

`type=positive_int` and friends make argparse refuse a bad value at parse
time with the allowed range in its one-line message (exit status 2), before
any data is loaded or built. The flags that several commands share
(`--out`/`--resume`/`--overwrite`, `--seeds`/`--seed`,
`--hidden`, `--no-progress`, the loggers `--tensorboard` and
`--wandb`) are declared once here, so they read and check alike
everywhere.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Callable, Optional

from jaxil.runs import loggers as L


def _number(kind: type, lo: float, hi: float, lo_open: bool, hi_open: bool) -> Callable:
    lo_s = "(" if lo_open or lo == -math.inf else "["
    hi_s = ")" if hi_open or hi == math.inf else "]"
    allowed = f"{lo_s}{lo:g}, {hi:g}{hi_s}"
    name = "an integer" if kind is int else "a number"

    def parse(text: str):
        try:
            x = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {name} in {allowed}, got {text!r}") from None
        ok = (x > lo if lo_open else x >= lo) and (x < hi if hi_open else x <= hi)
        if not ok:  # NaN fails both comparisons
            raise argparse.ArgumentTypeError(f"must be in {allowed}, got {text}")
        return x

    parse.__name__ = f"{kind.__name__} in {allowed}"
    return parse


positive_int = _number(int, 1, math.inf, False, False)
nonneg_int = _number(int, 0, math.inf, False, False)
positive_float = _number(float, 0.0, math.inf, True, False)
nonneg_float = _number(float, 0.0, math.inf, False, False)
probability = _number(float, 0.0, 1.0, False, False)
discount = _number(float, 0.0, 1.0, False, True)


def key_value(item: str) -> tuple[str, Any]:
    """`KEY=VALUE` with a JSON value, or the bare string when it is not JSON
    (`--env-kwarg iterations=4 integrator=euler`)."""
    if "=" not in item:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {item!r}")
    k, v = item.split("=", 1)
    try:
        return k, json.loads(v)
    except json.JSONDecodeError:
        return k, v


def add_env_kwargs(p, help: str = "environment keyword (JSON value), e.g. max_steps=50"
                   ) -> None:
    """`--env-kwarg KEY=VALUE`, repeatable: keywords of
    [`envs.make`][jaxil.envs.registry.make]; read them with
    [`env_kwargs`][jaxil.cli.args.env_kwargs]."""
    p.add_argument("--env-kwarg", type=key_value, action="append", metavar="KEY=VALUE",
                   help=help + "; repeat the flag for several")


def env_kwargs(args, env_id: str) -> dict[str, Any]:
    """The `--env-kwarg` keywords of `args` as a dict, checked by making
    `env_id` with them: a keyword the environment does not take is a one-line
    `ValueError` before any work, not a traceback from inside it."""
    kw = dict(getattr(args, "env_kwarg", None) or [])
    if kw:
        from jaxil import envs

        try:
            envs.make(env_id, **kw)
        except TypeError as e:
            raise ValueError(f"--env-kwarg: {e}; give only keywords {env_id} takes") from None
    return kw


def add_run_dir(p, out_help: str = "run directory (metrics, checkpoints)",
                required: bool = False) -> None:
    """`--out` and the exclusive `--resume` / `--overwrite` of a run
    directory (`jaxil.runs.rundir`)."""
    p.add_argument("--out", default=None, required=required, help=out_help)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true",
                   help="continue the run in --out (refused if any setting differs)")
    g.add_argument("--overwrite", action="store_true",
                   help="delete the run in --out and start afresh")


def add_seeds(p, default: int = 1) -> None:
    """`--seeds` (runs vmapped in one program) and `--seed` (the base seed)."""
    p.add_argument("--seeds", type=positive_int, default=default,
                   help=f"seeds trained together in one program (default: {default})")
    p.add_argument("--seed", type=nonneg_int, default=0, help="base seed")


def add_hidden(p, default, flag: str = "--hidden", help: str = "hidden layer widths") -> None:
    """A network's hidden layer widths (`--hidden 256 256`)."""
    p.add_argument(flag, type=positive_int, nargs="+", default=list(default),
                   help=f"{help} (default: {' '.join(map(str, default))})")


def add_progress(p) -> None:
    """`--no-progress`: no progress bar."""
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


_LOGGER_FLAGS = ("tensorboard", "wandb", "wandb_entity", "wandb_group", "wandb_mode")


def add_loggers(p) -> None:
    """`--tensorboard DIR` and `--wandb PROJECT` (with `--wandb-entity`,
    `--wandb-group`, `--wandb-mode`): where the metrics rows go besides
    `metrics.jsonl` (`jaxil.runs.loggers`); `make_loggers` turns
    them into logger factories."""
    g = p.add_argument_group("loggers (besides metrics.jsonl)")
    g.add_argument("--tensorboard", default=None, metavar="DIR",
                   help="also write the metrics as TensorBoard scalars under DIR (one run each)")
    g.add_argument("--wandb", default=None, metavar="PROJECT",
                   help="also log the metrics to the Weights & Biases project PROJECT (one W&B "
                        "run each, all in one group; needs jaxil[wandb])")
    g.add_argument("--wandb-entity", default=None, metavar="ENTITY",
                   help="W&B user or team of the project (default: wandb's)")
    g.add_argument("--wandb-group", default=None, metavar="GROUP",
                   help="W&B group of the runs (default: the --out directory's name)")
    g.add_argument("--wandb-mode", choices=L.WANDB_MODES, default=None,
                   help="online (default), offline (upload later with `wandb sync`) or disabled")


def make_loggers(args, run_dir: Optional[str | Path] = None) -> list[L.LoggerFactory]:
    """The logger factories of `add_loggers`' flags, for a run in
    `run_dir` (the directory whose name groups the W&B runs and which keeps
    their ids for `--resume`). Every other flag goes into the W&B config.
    Refuses a missing wandb, or a `--wandb-*` flag without `--wandb`,
    before any work."""
    out: list[L.LoggerFactory] = []
    if args.tensorboard:
        out.append(L.tensorboard(args.tensorboard))
    if args.wandb:
        config = {k: v for k, v in vars(args).items()
                  if k not in _LOGGER_FLAGS and not callable(v)}
        out.append(L.wandb(args.wandb, entity=args.wandb_entity, group=args.wandb_group,
                           mode=args.wandb_mode, run_dir=run_dir, config=config))
    else:
        given = [f for f in _LOGGER_FLAGS[2:] if getattr(args, f) is not None]
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')} applies to W&B logging; add "
                             "--wandb PROJECT")
    return out
