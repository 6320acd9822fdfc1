"""`jaxil eval`, `jaxil plot` and `--labels` under faults a review found: a
damaged newest checkpoint, a run.json edited to another learner or cut in
half, a labels file with a key given twice. Each ends in one line naming
the problem and the fix, and nothing already written is lost."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from jaxil.cli.main import main
from jaxil.data import save

from helpers.mpe_data import poor_and_expert

FAST = ["--updates", "10", "--eval-every", "5", "--eval-episodes", "2", "--batch-size", "16",
        "--hidden", "8", "--no-progress"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished `jaxil train` run with checkpoints at updates 5 and 10."""
    d = tmp_path_factory.mktemp("faults")
    save(poor_and_expert(0), d / "a.npz")
    assert main(["train", "bc_union", "--dataset", str(d / "a.npz"), "--out", str(d / "run"),
                 *FAST]) == 0
    assert sorted(os.listdir(d / "run" / "checkpoints")) == ["10", "5"]
    return d


def _copy(trained, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(trained / "run", out)
    return out


def _one_line(text):
    lines = text.strip().splitlines()
    assert len(lines) == 1, lines[:40]
    return lines[0]


def test_eval_falls_back_past_a_damaged_newest_checkpoint_in_one_line(trained, tmp_path, capsys):
    """`rm checkpoints/10/default/manifest.ocdbt; jaxil eval`: one line on
    stderr saying update 10 cannot be read because a data file is missing,
    and that the intact update 5 is evaluated, which scores what update 5
    alone scores. A real process, because orbax's "Event loop is closed"
    reports reach the process's stderr after the error. Bugs caught: exit 1
    after 163 lines of those reports, no fallback where --resume has one,
    and "_METADATA is missing" for a missing data file."""
    out = _copy(trained, tmp_path)
    (out / "checkpoints" / "10" / "default" / "manifest.ocdbt").unlink()
    p = subprocess.run([sys.executable, "-m", "jaxil.cli.main", "eval", str(out),
                        "--episodes", "2"], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert p.returncode == 0, p.stderr[-3000:]
    line = _one_line(p.stderr)
    assert "checkpoint update 10" in line and "a data file in it is missing" in line, line
    assert "evaluating the intact update 5" in line and "_METADATA" not in line, line
    only5 = _copy(trained, tmp_path / "only5")
    shutil.rmtree(only5 / "checkpoints" / "10")
    capsys.readouterr()
    assert main(["eval", str(only5), "--episodes", "2"]) == 0
    assert p.stdout == capsys.readouterr().out


def test_eval_with_no_readable_checkpoint_is_one_line_with_the_fix(trained, tmp_path, capsys,
                                                                  caplog, monkeypatch):
    """Every checkpoint lacks its data: one line naming the damage, that no
    older checkpoint is intact, and the fix; nothing more when the failed
    reads' leftovers are collected later in the process (what a resume that
    goes on training would print). Bugs caught: a traceback, the blame on
    `_METADATA` (which is intact), and asyncio's "Task exception was never
    retrieved" / "Exception ignored in: <coroutine ...>" tracebacks."""
    import gc
    import logging

    reports = []
    monkeypatch.setattr(sys, "unraisablehook", reports.append)
    out = _copy(trained, tmp_path)
    for step in ("5", "10"):
        (out / "checkpoints" / step / "default" / "manifest.ocdbt").unlink()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        assert main(["eval", str(out), "--episodes", "2"]) == 1
        line = _one_line(capsys.readouterr().err)
        assert main(["eval", str(out), "--episodes", "2"]) == 1  # the first one's leftovers
        time.sleep(0.5)
        gc.collect()
    assert "a data file in it is missing or cut short and no older one is intact" in line, line
    assert "--overwrite" in line and "_METADATA" not in line
    assert not [r.getMessage()[:200] for r in caplog.records if r.name == "asyncio"]
    assert not [(type(r.exc_value).__name__, repr(r.object)[:80]) for r in reports]


@pytest.mark.parametrize("edit", ["learner", "hidden"])
def test_eval_on_an_edited_run_json_blames_run_json_not_the_checkpoint(trained, tmp_path, capsys,
                                                                       edit):
    """run.json edited to another learner (or network width) after training:
    eval says the checkpoint is intact and run.json changed, and tries no
    older checkpoint. Bug caught: "cannot be read: its metadata is
    damaged", which could lead a user to delete good checkpoints."""
    out = _copy(trained, tmp_path)
    doc = json.loads((out / "run.json").read_text())
    if edit == "learner":
        doc["identity"]["learner"] = "misodice"
    else:
        doc["identity"]["config"]["hidden"] = [16]
    (out / "run.json").write_text(json.dumps(doc))
    assert main(["eval", str(out), "--episodes", "2"]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "checkpoints/10 is intact" in line and "run.json was changed" in line, line
    assert "cannot be read" not in line and "keep them" in line
    assert sorted(os.listdir(out / "checkpoints")) == ["10", "5"]


def test_eval_and_plot_on_a_cut_run_json_give_the_reason_and_their_fix(trained, tmp_path, capsys):
    """run.json cut in half: eval and plot each say where the JSON breaks
    and a fix that exists for them; plot, which needs no run.json, works
    once it is moved aside. Bugs caught: eval's "(Unterminated string
    starting at)" with the position cut off and no fix, and plot's advice
    to pass env_name/task_name, which are not its options."""
    out = _copy(trained, tmp_path)
    text = (out / "run.json").read_text()
    (out / "run.json").write_text(text[: len(text) // 2])
    assert main(["eval", str(out)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "run.json is not valid JSON" in line and ": line " in line and "column" in line, line
    assert "restore it" in line and "--overwrite" in line
    assert main(["plot", str(out)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "run.json is not valid JSON" in line and ": line " in line, line
    assert "env_name" not in line and "move it aside" in line, line
    (out / "run.json").rename(out / "run.json.cut")
    assert main(["plot", str(out)]) == 0
    assert (out / "eval_return.png").is_file()


def test_a_labels_file_with_a_key_given_twice_is_refused_naming_it(trained, tmp_path, capsys):
    """A labels JSON with `expert` twice: refused in one line naming the
    key, before any training. Bug caught: json's silent last-one-wins,
    which trains on labels the user may not have meant."""
    from jaxil.data import load

    n = load(trained / "a.npz").num_trajectories
    labels = tmp_path / "a.labels.json"
    flags = json.dumps([True] * n)
    labels.write_text(f'{{"expert": {json.dumps([False] * n)}, "expert": {flags}}}')
    out = tmp_path / "run"
    assert main(["train", "misodice", "--dataset", str(trained / "a.npz"), "--labels",
                 str(labels), "--out", str(out), *FAST]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "gives the key `expert` twice" in line and str(labels) in line, line
    assert not (out / "metrics.jsonl").exists()


def _cut_data_files(step_dir):
    for f in step_dir.rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def test_a_damaged_final_checkpoint_is_written_again_on_resume(tmp_path, capsys):
    """A finished run whose final checkpoint is damaged: --resume falls back
    to the one before, trains the last chunk again and writes the final
    checkpoint anew, which then reads as the uninterrupted run's state. Bug
    caught: the damaged step stayed on disk, so orbax skipped the new save
    at that step ("already saved") and `jaxil eval` kept falling back."""
    import numpy as np

    from jaxil.runs import engine
    from helpers.engine import make_program

    full = engine.run(make_program(eval_every=1), progress=False)
    rd = engine.open_run(tmp_path / "r", {"toy": 1}, step_key="update")
    engine.run(make_program(eval_every=1), rundir=rd, progress=False)
    _cut_data_files(tmp_path / "r" / "checkpoints" / "18")
    capsys.readouterr()
    rd = engine.open_run(tmp_path / "r", {"toy": 1}, step_key="update", resume=True)
    rest = engine.run(make_program(eval_every=1), rundir=rd, progress=False)
    line = _one_line(capsys.readouterr().err)
    assert "update 18" in line and "intact update 15" in line, line
    assert rest.rows == full.rows
    rd = engine.open_run(tmp_path / "r", {"toy": 1}, step_key="update", resume=True)
    got = rd.checkpointer.restore(full.state, 18)
    rd.close()
    np.testing.assert_array_equal(np.asarray(got.x), np.asarray(full.state.x))


def test_a_cut_last_row_of_a_finished_run_is_written_again(tmp_path, capsys):
    """A finished run whose last metrics line is cut (a row of its final
    checkpoint): --resume goes back to the checkpoint before, so the row is
    written again and the rows are the uninterrupted run's. Bug caught: the
    notice said "the resumed run rewrites them" while the run, already at
    its end, ran nothing and the row stayed lost (and results.json was
    computed without it)."""
    from jaxil.runs import engine
    from helpers.engine import make_program

    full = engine.run(make_program(eval_every=1), progress=False)
    out = tmp_path / "r"
    rd = engine.open_run(out, {"toy": 1}, step_key="update")
    engine.run(make_program(eval_every=1), rundir=rd, progress=False)
    text = (out / "metrics.jsonl").read_text()
    (out / "metrics.jsonl").write_text(text[: len(text) - 10])
    capsys.readouterr()
    rd = engine.open_run(out, {"toy": 1}, step_key="update", resume=True)
    rest = engine.run(make_program(eval_every=1), rundir=rd, progress=False)
    err = capsys.readouterr().err
    assert "dropped 1 unreadable line(s)" in err and "resuming from update 15" in err, err
    assert rest.rows == full.rows
    assert [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()] == full.rows
