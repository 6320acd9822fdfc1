"""Loggers: where the run engine sends every metrics row besides ``metrics.jsonl``.

A :class:`Logger` has ``write(rows)`` and ``close()``; the engine
(:func:`jaxil.runs.engine.run`) builds each from a :data:`LoggerFactory`,
``factory(run_names, step_key, resume_from) -> Logger``, once it knows the
step a resumed run continues from.

TensorBoard (``--tensorboard DIR``, :func:`tensorboard`): the metrics rows that a loop appends to ``metrics.jsonl`` are also written as
scalars, one TensorBoard run (sub-directory) per jaxil run, e.g.
``DIR/run3-seed1-alpha=0.1``, so TensorBoard's run selector filters seeds and
grid points. tensorboardX is the writer (extra ``jaxil[tensorboard]``); it
needs neither TensorFlow nor PyTorch.

A resumed run purges the events past the step it resumes from, so curves do
not double back.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence


class Logger(Protocol):
    """Receives the engine's metrics rows (each with ``run`` and the step field)."""

    def write(self, rows: Sequence[dict]) -> None: ...

    def close(self) -> None: ...


#: ``(run_names, step_key, resume_from) -> Logger``; ``resume_from`` is the
#: step a resumed run continues from (None for a fresh run).
LoggerFactory = Callable[[Sequence[str], str, Optional[int]], Logger]

_SKIP = {"run", "seed", "grid", "regime", "round", "update"}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=,+-]+", "_", name)


class TensorBoard:
    """One ``SummaryWriter`` per run; ``write(rows)`` adds every numeric
    field of each row at ``row[step_key]``."""

    def __init__(self, logdir: str | Path, run_names: Sequence[str], step_key: str = "update",
                 resume_from: Optional[int] = None):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise ValueError('--tensorboard needs tensorboardX: pip install "jaxil[tensorboard]"'
                             ) from None
        purge = None if resume_from is None else resume_from + 1
        self.step_key = step_key
        self.writers = [SummaryWriter(str(Path(logdir) / _safe(n)), purge_step=purge, flush_secs=30)
                        for n in run_names]

    def write(self, rows: Sequence[dict]) -> None:
        for row in rows:
            w, step = self.writers[row["run"]], int(row[self.step_key])
            for k, v in row.items():
                if k not in _SKIP and isinstance(v, (int, float)) and not isinstance(v, bool):
                    w.add_scalar(k, v, step)

    def close(self) -> None:
        for w in self.writers:
            w.close()


def tensorboard(logdir: str | Path) -> LoggerFactory:
    """A :data:`LoggerFactory` of TensorBoard scalars under ``logdir``."""
    def make(names: Sequence[str], step_key: str, resume_from: Optional[int]) -> TensorBoard:
        return TensorBoard(logdir, names, step_key=step_key, resume_from=resume_from)

    return make
