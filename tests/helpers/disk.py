"""A real full disk for fault tests: a small tmpfs, and a filler file."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "4m"):
    """Mount a tmpfs of ``size`` at ``path`` for the block (the test is
    skipped where no tmpfs can be mounted: it needs root)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path, keep: int = 0) -> None:
    """Write a filler file until ``disk`` is full, then free ``keep`` bytes."""
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    os.truncate(disk / "filler", max(0, (disk / "filler").stat().st_size - keep))
