"""How a command stops when it is asked to: Ctrl-C (SIGINT) and SIGTERM alike.

SIGTERM is what a scheduler sends before it takes the machine back (SLURM
at the end of a job's time, Kubernetes when it evicts a pod, a cloud's
preemption notice). Left to Python's default it ends the process at once,
with exit status 143 and not a word. Under
[`sigterm_as_interrupt`][jaxil.cli.stop.sigterm_as_interrupt] it raises
[`Terminated`][jaxil.cli.stop.Terminated], a `KeyboardInterrupt`, so every
path that handles Ctrl-C handles it the same way: the run engine releases
the run directory (its checkpoints and complete metrics rows stay), and the
command prints one line with what was kept and how to go on.

Exit statuses follow the shell's convention of 128 + the signal's number:
130 after Ctrl-C, 143 after SIGTERM.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM."""


def exit_status(e: BaseException) -> int:
    """130 after Ctrl-C, 143 after SIGTERM."""
    return 128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)


def what(e: BaseException) -> str:
    """How a command's one line names the stop: `interrupted` or
    `stopped by SIGTERM`."""
    return "stopped by SIGTERM" if isinstance(e, Terminated) else "interrupted"


def _raise_terminated(signum, frame) -> None:
    # A second SIGTERM (a scheduler that will not wait) ends the process at once.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises [`Terminated`][jaxil.cli.stop.Terminated]
    in the main thread; the previous handler comes back after it. Outside
    the main thread (where Python cannot set handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
