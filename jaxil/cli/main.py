"""The `jaxil` command line.

Subcommands are contributed by the modules that own them; each module
exposes `register(subparsers)` adding its parsers with `func` defaults.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import sys

from jaxil.cli import stop

# module -> the subcommands it registers
_MODULES = (
    "jaxil.cli.environments",  # envs, quickstart
    "jaxil.cli.data",  # data build/info/validate
    "jaxil.cli.teach",  # teach
    "jaxil.cli.train",  # train, sweep, eval
    "jaxil.cli.label",  # label, pipeline
    "jaxil.cli.interactive",  # interactive
    "jaxil.cli.lm",  # lm sft, lm interactive
    "jaxil.cli.plot",  # plot
    "jaxil.cli.export",  # export marl-eval
    "jaxil.cli.irl",  # irl reward-model, bon, ppo, gail, airl (and the aliases gail, airl)
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jaxil", description="JAX imitation learning for multi-agent systems"
    )
    p.add_argument("--debug", action="store_true",
                   help="show the full traceback of an error instead of one line")
    from jaxil.runs import distributed

    distributed.add_flags(p)
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
    from jaxil.runs import hostmem

    hostmem.retain_at_startup()  # before jax is imported (jaxil.runs.hostmem)
    from jaxil.runs import distributed

    try:  # before build_parser: importing the environments starts JAX
        argv = distributed.initialize_from_argv(sys.argv[1:] if argv is None else list(argv))
    except ValueError as e:
        print(f"jaxil: error: {e}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.debug:
        with stop.sigterm_as_interrupt():
            return _result(args.func(args))
    try:
        with stop.sigterm_as_interrupt():
            out = args.func(args)
    except (ValueError, KeyError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"jaxil {args.command}: error: {msg}", file=sys.stderr)
        return 1
    except OSError as e:  # FileExistsError, PermissionError, IsADirectoryError, disk full ...
        print(f"jaxil {args.command}: error: {_os_message(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (jaxil.cli.stop)
        if hasattr(args, "resume"):
            hint = "a run directory keeps its last checkpoint (continue with --resume)"
        else:
            hint = "nothing was written past the last complete file (rerun the command)"
        print(f"jaxil {args.command}: {stop.what(e)}; {hint}", file=sys.stderr)
        return stop.exit_status(e)
    return _result(out)


def _result(out) -> int:
    return out if isinstance(out, int) else 0


def _os_message(e: OSError) -> str:
    """One line naming the path and the fix (our own errors already do)."""
    if e.filename is None:
        return str(e)
    fix = {
        FileExistsError: "remove it or choose another path",
        PermissionError: "choose a path you can write to, or fix its permissions",
        IsADirectoryError: "pass a file, not a directory",
        NotADirectoryError: "a parent of the path is a file; choose another path",
        FileNotFoundError: "check the path",
    }.get(type(e), "check the path and the disk")
    if e.errno == errno.ENOSPC:
        fix = "free some space or choose another path"
    return f"{e.strerror or e}: {e.filename}; {fix}"


if __name__ == "__main__":
    sys.exit(main())
