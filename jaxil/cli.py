"""The ``jaxil`` command line.

Subcommands are contributed by the modules that own them; each module
exposes ``register(subparsers)`` adding its parsers with ``func`` defaults.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# module -> the subcommands it registers
_MODULES = (
    "jaxil.cli_envs",  # envs, quickstart
    "jaxil.data.cli",  # data build/info/validate
    "jaxil.teachers.zoo",  # teach
    "jaxil.train",  # train, sweep, eval
    "jaxil.phase1.pipeline",  # label, pipeline
    "jaxil.interactive.cli",  # interactive
    "jaxil.plot",  # plot
    "jaxil.export",  # export marl-eval
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jaxil", description="JAX imitation learning for multi-agent systems"
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _MODULES:
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
            continue
        m.register(sub)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        out = args.func(args)
    except (ValueError, KeyError, FileNotFoundError, FileExistsError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"jaxil {args.command}: error: {msg}", file=sys.stderr)
        return 1
    return out if isinstance(out, int) else 0


if __name__ == "__main__":
    sys.exit(main())
