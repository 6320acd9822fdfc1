"""SIGTERM, what SLURM, Kubernetes and preemption send, stops a command as
Ctrl-C does: one line naming the stop and how to go on, exit status 143,
and a run directory that `--resume` continues to the uninterrupted result."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys

import pytest

from jaxil.cli.main import main
from jaxil.data import save

from helpers.cli_kill import stop_after_checkpoint
from helpers.mpe_data import poor_and_expert

TRAIN = ["train", "bc_union", "--updates", "200", "--eval-every", "10", "--eval-episodes", "2",
         "--batch-size", "16", "--hidden", "8", "--no-progress"]


def _rows(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # three jaxil trains, one a subprocess (~30 s); the two tests below keep the wiring
def test_sigterm_stops_train_in_one_line_and_resume_matches(tmp_path, capsys):
    """A `jaxil train` process gets SIGTERM after its first checkpoint: it
    exits 143 with one line that names the stop and `--resume`, and the
    resumed run ends with the uninterrupted run's rows. Bug caught:
    Python's default SIGTERM, which ends the process with no word (and,
    were the handler to swallow it, a run that goes on or exits 0)."""
    data = tmp_path / "d.npz"
    save(poor_and_expert(0), data)
    args = [*TRAIN, "--dataset", str(data)]
    stopped = tmp_path / "stopped"
    rc, err = stop_after_checkpoint([sys.executable, "-m", "jaxil.cli.main", *args], stopped,
                                    min_step=10, max_step=200, sig=signal.SIGTERM, timeout_s=300)
    lines = err.strip().splitlines()
    assert rc == 143, err[-2000:]
    assert len(lines) == 1 and "stopped by SIGTERM" in lines[0] and "--resume" in lines[0], lines
    assert main([*args, "--out", str(tmp_path / "full")]) == 0
    assert main([*args, "--out", str(stopped), "--resume"]) == 0
    assert _rows(stopped) == _rows(tmp_path / "full")


def _terminate(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    raise AssertionError("SIGTERM did not stop the command")


@pytest.mark.parametrize("command", ["teach", "data build", "label"])
def test_sigterm_is_one_line_with_the_commands_hint(command, tmp_path, monkeypatch, capsys):
    """`teach`, `data build` and `label` under SIGTERM: exit 143, one line
    whose hint fits the command (`--resume` only where it exists), and the
    process's own SIGTERM handler is back afterwards. Bug caught: a handler
    installed for `train` alone, one that turns 143 into Ctrl-C's 130 or
    into 0, or one left installed after the command returns."""
    from jaxil.cli import data as data_cli, label as label_cli
    from jaxil.teachers import train as teacher_train

    argv = {"teach": ["teach", "--env", "smax:3m", "--out", str(tmp_path / "t")],
            "data build": ["data", "build", "mpe-simple_spread/misodice-200e-1000p",
                           "--out", str(tmp_path / "d.npz")],
            "label": ["label", "x.npz", "--out", str(tmp_path / "l.npz")]}[command]
    monkeypatch.setattr(teacher_train, "train_teacher", _terminate)
    monkeypatch.setattr(data_cli, "_build", _terminate)
    monkeypatch.setattr(label_cli, "_label", _terminate)
    before = signal.getsignal(signal.SIGTERM)
    assert main(argv) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"jaxil {argv[0]}: stopped by SIGTERM"), err
    assert ("--resume" in err[0]) == (command == "teach"), err
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_mid_run_keeps_a_directory_that_resumes_exactly(tmp_path):
    """SIGTERM between two chunks of an engine run (under the CLI's handler):
    the run stops with `Terminated`, a `KeyboardInterrupt`, releases its
    directory, and `--resume` ends with the uninterrupted run's rows. Bug
    caught: a SIGTERM handler that leaves the lock held or the rows of an
    unsaved chunk behind, so the resume is refused or writes them twice."""
    import jax.numpy as jnp

    from jaxil.cli import stop
    from jaxil.runs import engine
    from helpers.engine import make_program

    full = engine.run(make_program(eval_every=1), progress=False)
    prog = make_program(eval_every=1)
    chunk = prog.chunk

    def terminated_at_4(state, c):
        if c == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        return chunk(state, c)

    rd = engine.open_run(tmp_path / "r", {"toy": 1}, step_key="update")
    with pytest.raises(stop.Terminated), stop.sigterm_as_interrupt():
        engine.run(dataclasses.replace(prog, chunk=terminated_at_4), rundir=rd, progress=False)
    assert [r["update"] for r in _rows(tmp_path / "r")][-1] == 12  # chunks 0-3 kept
    rd = engine.open_run(tmp_path / "r", {"toy": 1}, step_key="update", resume=True)
    rest = engine.run(make_program(eval_every=1), rundir=rd, progress=False)
    assert rest.rows == full.rows
    assert jnp.array_equal(rest.state.x, full.state.x)
