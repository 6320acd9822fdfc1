"""Stop a ``jaxil`` CLI run with a signal after a checkpoint, then resume it:
the shared body of the CLI kill-and-resume tests."""

import os
import signal
import subprocess
import time
from pathlib import Path


def stop_after_checkpoint(args: list[str], out: Path, *, min_step: int, max_step: int,
                          sig: int = signal.SIGKILL, timeout_s: float = 600,
                          stage: str = "") -> tuple[int, str]:
    """Run ``args --out out`` in a subprocess, send it ``sig`` once a
    checkpoint of step >= ``min_step`` exists in the run directory (its
    subdirectory ``stage`` for a command with several stages), asserting it
    had not finished and stopped before ``max_step``. Returns its exit status
    and standard error."""
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    log = out.parent / f"{out.name}.stderr"  # a file: a pipe left unread could block the run
    with open(log, "w") as f:
        p = subprocess.Popen(args + ["--out", str(out)], env=env, stdout=subprocess.DEVNULL,
                             stderr=f)
    ckpt = out / stage / "checkpoints"
    deadline = time.time() + timeout_s
    while time.time() < deadline and p.poll() is None:
        if ckpt.exists() and any(c.name.isdigit() and int(c.name) >= min_step
                                 for c in ckpt.iterdir()):
            break
        time.sleep(0.05)
    assert p.poll() is None, "the run finished before it could be stopped; give it more steps"
    os.kill(p.pid, sig)
    p.wait(timeout=120)
    done = [int(c.name) for c in ckpt.iterdir() if c.name.isdigit()]
    assert done and max(done) < max_step, done
    return p.returncode, log.read_text()


def kill_then_resume(args: list[str], tmp_path: Path, *, min_step: int, max_step: int,
                     timeout_s: float = 600, stage: str = "") -> tuple[Path, Path]:
    """Run ``args`` to the end in ``tmp_path/full``; run it again in
    ``tmp_path/killed``, SIGKILL it once a checkpoint of step >= ``min_step``
    exists (see ``stop_after_checkpoint``), then ``--resume`` it there.
    Returns the two ``--out`` directories."""
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(args + ["--out", str(full)], check=True, env=env, capture_output=True)
    stop_after_checkpoint(args, killed, min_step=min_step, max_step=max_step,
                          timeout_s=timeout_s, stage=stage)
    subprocess.run(args + ["--out", str(killed), "--resume"], check=True, env=env,
                   capture_output=True)
    return full, killed
