"""Run directories under faults: a second process, a killed holder, a cut
metrics line, another library version, and `jaxil eval` on a directory of
another kind. Each test names the fault it reproduces and the bug it
catches."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys

import pytest

from jaxil.runs import rundir as R
from helpers.disk import fill, small_tmpfs


# Another process's side of the lock protocol, in plain Python (no JAX import,
# so each costs milliseconds): ``flock`` on ``.lock``, as jaxil takes it.
_HOLD = """
import fcntl, os, sys, time
f = open(os.path.join(sys.argv[1], ".lock"), "a+")
fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
f.seek(0); f.truncate(); f.write(f"process {os.getpid()} on testhost (jaxil train)"); f.flush()
print("locked", flush=True)
time.sleep(600)
"""
_TRY = """
import fcntl, os, sys
f = open(os.path.join(sys.argv[1], ".lock"), "a+")
try:
    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    print("held"); sys.exit(3)
print("free")
"""


def test_a_second_run_is_refused_while_another_process_holds_the_directory(tmp_path):
    """Two runs on one --out: while another process holds the directory, a
    run is refused in one line naming the holder and nothing is written;
    SIGKILL that process and its lock is gone, so --resume takes the
    directory over (the .lock file left behind does not block). Bugs
    caught: no lock (both runs write one metrics.jsonl), or a lock by file
    existence that blocks every resume after a crash."""
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(R.RunDirInUse, match=f"in use by process {holder.pid} on testhost "
                                                r"\(jaxil train\); wait"):
            R.open_run_dir(out, {"a": 1})
        assert sorted(p.name for p in out.iterdir()) == [R.LOCK_FILE]
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=60)
    rd = R.open_run_dir(out, {"a": 1}, resume=True)
    assert "process" in (out / R.LOCK_FILE).read_text()
    rd.close()


def test_the_directory_is_held_until_the_run_closes(tmp_path):
    """The lock is held from the --out check across the work to RunDir.close
    (and released then), so another process can neither start a run in the
    middle nor be blocked after it. Bug caught: a lock taken only when
    run.json is written (the window across a dataset build), or never
    released."""
    out = tmp_path / "run"
    R.check_run_dir(out)  # before the expensive work (a dataset build)
    held = lambda: subprocess.run([sys.executable, "-c", _TRY, str(out)], capture_output=True,
                                  text=True, timeout=60).stdout.strip()
    assert held() == "held"
    rd = R.open_run_dir(out, {"a": 1})
    assert held() == "held"
    rd.close()
    assert held() == "free"


def test_a_cut_metrics_line_is_dropped_and_reported_on_resume(tmp_path, capsys):
    """A kill mid-append leaves half a JSON line: resume drops it, says so on
    stderr, and keeps the complete rows. Bug caught: a JSON error that blocks
    the resume for good, or a silent repair."""
    out = tmp_path / "run"
    rd = R.open_run_dir(out, {"a": 1})
    rd.checkpointer.save(2, {"x": __import__("numpy").zeros(2)})
    rd.append([{"update": 1, "run": 0}, {"update": 2, "run": 0}])
    rd.close()
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"update": 3, "ru')
    rd = R.open_run_dir(out, {"a": 1}, resume=True)
    rd.close()
    assert [r["update"] for r in rd.rows] == [1, 2]
    err = capsys.readouterr().err
    assert "dropped 1 unreadable line(s) after row 2" in err and "metrics.jsonl" in err
    assert (out / "metrics.jsonl").read_text().count("\n") == 2


def test_run_json_records_versions_and_a_resume_under_others_warns(tmp_path, capsys):
    """run.json names the versions that wrote it; resuming a run written
    under another JAX says so in one line and goes on. Bug caught: a resume
    under another version that is silent, or one that is refused."""
    out = tmp_path / "run"
    R.open_run_dir(out, {"a": 1}).close()
    doc = json.loads((out / "run.json").read_text())
    assert doc["versions"]["jax"] and doc["versions"]["jaxil"]
    doc["versions"]["jax"] = "0.0.1"
    (out / "run.json").write_text(json.dumps(doc))
    capsys.readouterr()
    R.open_run_dir(out, {"a": 1}, resume=True).close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "other library versions" in err[0] and "jax 0.0.1 ->" in err[0]
    assert json.loads((out / "run.json").read_text())["versions"]["jax"] != "0.0.1"


@pytest.mark.parametrize("identity,kind", [
    ({"regimes": [], "method": "oec", "env_id": "mpe:simple_spread"}, "`jaxil interactive`"),
    ({"ppo": {}, "method": "gail", "env_id": "mpe:simple_spread"}, "`jaxil irl gail`"),
    ({"source": "init-sft", "sft": {}, "env_id": "mpe:simple_spread"}, "`jaxil irl reward-model`"),
])
def test_eval_names_the_kind_of_run_directory_it_was_given(tmp_path, capsys, identity, kind):
    """`jaxil eval` on an interactive or adversarial run directory says what
    it was given and what it accepts. Bug caught: "error: spec" (a KeyError
    on a field only `jaxil train` records)."""
    from jaxil.cli.main import main

    (tmp_path / "run.json").write_text(json.dumps({"identity": identity}))
    assert main(["eval", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and kind in err[0] and "jaxil train" in err[0], err


def _damage_newest(ckpt_dir, part: str = "data") -> int:
    """Cut files of the newest checkpoint in half (a crash or a full disk
    mid-write): its array data files (``part="data"``) or its ``_METADATA``
    (``"metadata"``). Returns that step."""
    newest = max(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit())
    if part == "data":  # every array data file of the step
        victims = [f for f in (ckpt_dir / str(newest)).rglob("*")
                   if f.is_file() and f.parent.name == "d"]
    else:
        victims = [ckpt_dir / str(newest) / "default" / "_METADATA"]
    for f in victims:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return newest


def test_a_damaged_newest_checkpoint_falls_back_to_the_intact_one(tmp_path, capsys):
    """Cut a file of the newest checkpoint: --resume says in one line which
    step it could not read and which it took, and the resumed run ends with
    the uninterrupted run's rows. Bug caught: a 145-line orbax traceback and
    a run that cannot be resumed although the previous checkpoint is intact."""
    from jaxil.runs import engine
    from helpers.engine import make_program

    full = engine.run(make_program(eval_every=1), progress=False)
    rd = engine.open_run(tmp_path / "r", {"toy": 1}, step_key="update")
    engine.run(make_program(eval_every=1), rundir=rd, progress=False, stop_after_chunks=4)
    newest = _damage_newest(tmp_path / "r" / "checkpoints")
    assert newest == 12
    capsys.readouterr()
    rd = engine.open_run(tmp_path / "r", {"toy": 1}, step_key="update", resume=True)
    rest = engine.run(make_program(eval_every=1), rundir=rd, progress=False)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "update 12" in err[0] and "intact update 9" in err[0], err
    assert rest.rows == full.rows


@pytest.mark.parametrize("part,why", [("data", "a data file in it is missing or cut short"),
                                       ("metadata", "its metadata (_METADATA) is missing")])
def test_no_readable_checkpoint_is_one_line_that_says_it_is_damaged(tmp_path, part, why):
    """Every checkpoint damaged: one ValueError that names the directory, the
    damage and the fix. Bug caught: orbax's traceback, or the misleading
    "written with another learner" for a file cut short."""
    from jaxil.runs import engine
    from helpers.engine import make_program

    rd = engine.open_run(tmp_path / "r", {"toy": 1}, step_key="update")
    engine.run(make_program(eval_every=1), rundir=rd, progress=False, stop_after_chunks=1)
    _damage_newest(tmp_path / "r" / "checkpoints", part)
    rd = engine.open_run(tmp_path / "r", {"toy": 1}, step_key="update", resume=True)
    with pytest.raises(ValueError, match="cannot be read") as e:
        engine.run(make_program(eval_every=1), rundir=rd, progress=False)
    msg = str(e.value)
    assert "\n" not in msg and "checkpoints/3" in msg and why in msg, msg
    assert "another learner" not in msg


@pytest.fixture
def small_disk(tmp_path):
    with small_tmpfs(tmp_path / "disk") as disk:
        yield disk


def test_a_full_disk_during_a_save_is_one_line_and_the_run_resumes_exactly(small_disk, capfd,
                                                                          caplog, monkeypatch):
    """Fill the disk between two checkpoints: the next save raises one
    CheckpointWriteError naming the step, the directory and the fix, orbax's
    background threads print nothing, and after space is freed --resume ends
    with the uninterrupted run's rows. Bugs caught: the ~300 lines of thread
    tracebacks around the real error, a lost or half-written checkpoint that
    blocks the resume."""
    from jaxil.runs import checkpoint, engine
    from helpers.engine import make_program

    # the toy state is a few bytes: let the up-front space check pass
    monkeypatch.setattr(checkpoint, "SPACE_MARGIN_BYTES", 0)
    full = engine.run(make_program(eval_every=1), progress=False)
    out = small_disk / "r"
    rd = engine.open_run(out, {"toy": 1}, step_key="update")
    engine.run(make_program(eval_every=1), rundir=rd, progress=False, stop_after_chunks=2)
    capfd.readouterr()
    rd = engine.open_run(out, {"toy": 1}, step_key="update", resume=True)
    fill(small_disk, keep=4096)
    with pytest.raises(checkpoint.CheckpointWriteError) as e:
        engine.run(make_program(eval_every=1), rundir=rd, progress=False)
    msg = str(e.value)
    assert "\n" not in msg and "checkpoint 9" in msg and "disk is full" in msg, msg
    assert str(out / "checkpoints") in msg and "--resume" in msg
    printed = capfd.readouterr()
    assert "Traceback" not in printed.err + printed.out, printed.err[:2000]
    logged = [r.getMessage()[:200] for r in caplog.records if r.levelno >= logging.ERROR]
    assert not logged, logged
    (small_disk / "filler").unlink()
    rd = engine.open_run(out, {"toy": 1}, step_key="update", resume=True)
    assert rd.latest == 6
    rest = engine.run(make_program(eval_every=1), rundir=rd, progress=False)
    assert rest.rows == full.rows


def test_a_failed_writes_unretrieved_future_reports_nothing_when_collected(tmp_path, caplog):
    """A failed orbax write leaves futures whose exception nobody retrieved;
    asyncio logs each, with its traceback, whenever it is collected. That
    came long after the one-line error, and once inside griffe's `compile()`
    in a later test, which Python 3.11 then failed with `SystemError: AST
    constructor recursion depth mismatch`. After a failed save a future
    whose exception orbax's code raised reports nothing, and any other
    future still reports. Bugs caught: a filter that reads only the message
    (a future's repr names no orbax object), one installed only by failed
    reads, and one that drops every report."""
    import asyncio
    import gc
    import jax.numpy as jnp
    from etils import epath
    from orbax.checkpoint._src.path import async_path
    from jaxil.runs import checkpoint

    log = logging.getLogger("asyncio")
    log.removeFilter(checkpoint._TASK_FILTER)
    (tmp_path / "a_file").write_text("not a directory")
    with pytest.raises(checkpoint.CheckpointWriteError):
        checkpoint.save_tree(tmp_path / "a_file" / "tree", {"w": jnp.ones(3)})

    def unretrieved(make_error):
        """The error `make_error` raises, set on a future nobody reads, and
        the asyncio records that collecting it logs."""
        caplog.clear()
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(make_error())
        except OSError as e:
            error = e
            loop.create_future().set_exception(e)
        finally:
            loop.close()
        gc.collect()
        return [r.getMessage() for r in caplog.records
                if r.name == "asyncio" and r.exc_info and r.exc_info[1] is error]

    async def in_orbax():
        await async_path.write_text(epath.Path(tmp_path / "missing" / "f"), "x")

    async def in_user_code():
        raise OSError("the user's own failure")

    assert unretrieved(in_orbax) == []
    reported = unretrieved(in_user_code)
    assert len(reported) == 1 and "never retrieved" in reported[0], reported


_UNWRITABLE = """
import shutil, sys
import jax.numpy as jnp
from jaxil.runs import checkpoint
root = sys.argv[1]
open(root + "/a_file", "w").write("in the way")
try:
    checkpoint.save_tree(root + "/a_file/tree", {"w": jnp.ones(3)})
except checkpoint.CheckpointWriteError as e:
    print("save_tree:", e)
c = checkpoint.Checkpointer(root + "/run")
c.save(1, {"w": jnp.ones(3)})
shutil.rmtree(root + "/run")
open(root + "/run", "w").write("in the way")
try:
    c.save(2, {"w": jnp.ones(3)})
except checkpoint.CheckpointWriteError as e:
    print("Checkpointer:", e)
"""


def test_a_save_whose_directory_cannot_be_made_exits_at_once(tmp_path):
    """A file where the checkpoint's directory must go (as a permission
    change or a full disk at `mkdir` would do): both savers raise their one
    line and the process exits at once, printing no traceback. Bug caught:
    orbax's asynchronous savers left threads waiting for the directory that
    held the exiting process for 300 s, then printed their tracebacks."""
    done = subprocess.run([sys.executable, "-c", _UNWRITABLE, str(tmp_path)],
                          capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["save_tree", "Checkpointer"], done.stdout
    assert all("Not a directory" in line for line in lines), done.stdout
    assert "Traceback" not in done.stderr, done.stderr[-2000:]


def test_a_run_that_cannot_fit_one_checkpoint_is_refused_before_any_work(tmp_path, monkeypatch):
    """Free space below one checkpoint's bytes: the run stops before its
    first chunk with the sizes, the directory and the fix, and writes no
    row. Bug caught: hours of work before the first save finds the disk full."""
    import shutil
    from jaxil.runs import checkpoint, engine
    from helpers.engine import make_program

    real = shutil.disk_usage
    monkeypatch.setattr(checkpoint.shutil, "disk_usage",
                        lambda p: real(p)._replace(free=checkpoint.SPACE_MARGIN_BYTES // 2))
    rd = engine.open_run(tmp_path / "r", {"toy": 1}, step_key="update")
    with pytest.raises(checkpoint.CheckpointWriteError, match="not enough free space") as e:
        engine.run(make_program(eval_every=1), rundir=rd, progress=False)
    assert "\n" not in str(e.value) and "--out" in str(e.value)
    assert not (tmp_path / "r" / "metrics.jsonl").exists() or not (
        tmp_path / "r" / "metrics.jsonl").read_text().strip()
