"""Orbax checkpoints of whole learner states (all seeds / grid points at once).

A run directory keeps ``checkpoints/<update>/``; the manager keeps the newest
few. Orbax writes each step into a temporary directory and renames it when
complete, so a kill mid-save leaves the previous checkpoint loadable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp


class Checkpointer:
    def __init__(self, directory: str | Path, max_to_keep: int = 2):
        self.directory = Path(directory).absolute()
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        )

    def latest_step(self) -> Optional[int]:
        return self.manager.latest_step()

    def save(self, step: int, state: Any) -> None:
        self.manager.save(step, args=ocp.args.StandardSave(state))
        self.manager.wait_until_finished()

    def restore(self, like: Any, step: Optional[int] = None) -> Any:
        """Restore into the structure, shapes and dtypes of ``like``."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        return self.manager.restore(step, args=ocp.args.StandardRestore(abstract))

    def close(self) -> None:
        self.manager.close()
