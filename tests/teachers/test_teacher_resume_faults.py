"""A teacher run under faults: its newest checkpoint deleted or damaged, and
the last metrics line of a finished run cut short. Each test resumes and
ends with the uninterrupted run's rows and checkpoints.

The tiny configuration (4 chunks of 2 updates on `toy:masked`, a checkpoint
after every chunk) is the one test_teachers.py compiles, so the two modules
share one compiled program per process.
"""

from __future__ import annotations

import json
import shutil

import pytest

from jaxil.teachers import train_teacher

from helpers.fast_compile import FAST_COMPILE
from helpers.teachers import TINY  # registers toy:masked

KW = dict(seed=3, num_checkpoints=4, eval_episodes=64, progress=False,
          compiler_options=FAST_COMPILE)


def _rows(out):
    """The metrics rows without their timings (which differ between runs)."""
    strip = lambda r: {k: v for k, v in r.items() if "time" not in k and not k.endswith("_s")}
    return [strip(json.loads(x)) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _evals(doc):
    return [(c["step"], c["eval_stochastic"], c["eval_deterministic"]) for c in doc["checkpoints"]]


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher_faults") / "full"
    doc = train_teacher("toy:masked", TINY, out_dir=str(out), **KW)
    return out, doc


def _copy(full, tmp_path):
    out = tmp_path / "teacher"
    shutil.copytree(full[0], out)
    return out


def test_a_deleted_newest_checkpoint_resumes_from_the_one_before(full, tmp_path, capsys):
    """`rm -rf checkpoints/<newest>; --resume`: the run continues from the
    previous checkpoint's runner state and ends with the uninterrupted run's
    rows, evaluations and checkpoints. Bug caught: only the newest
    checkpoint kept the runner state, so the resume was refused with "no
    runner state to resume from" while three intact checkpoints remained."""
    out = _copy(full, tmp_path)
    newest = max(int(p.name) for p in (out / "checkpoints").iterdir())
    shutil.rmtree(out / "checkpoints" / str(newest))
    doc = train_teacher("toy:masked", TINY, out_dir=str(out), resume=True, **KW)
    assert doc["complete"] and _evals(doc) == _evals(full[1])
    assert _rows(out) == _rows(full[0])
    assert (out / "checkpoints" / str(newest) / "runner").is_dir()


def test_a_damaged_newest_runner_state_falls_back_in_one_line(full, tmp_path, capsys):
    """Cut every data file of the newest runner state in half: --resume says
    in one line which checkpoint it could not read, why, and which one it
    took, then rewrites the rest exactly. Bug caught: the teacher tried its
    newest checkpoint only, and the damage read as "written with another
    config or env"."""
    out = _copy(full, tmp_path)
    newest = max(int(p.name) for p in (out / "checkpoints").iterdir())
    for f in (out / "checkpoints" / str(newest) / "runner").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    capsys.readouterr()
    doc = train_teacher("toy:masked", TINY, out_dir=str(out), resume=True, **KW)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"env step {newest}" in err[0] and "missing or cut short" in err[0], err
    assert f"intact env step {newest // 4 * 3}" in err[0], err
    assert _evals(doc) == _evals(full[1]) and _rows(out) == _rows(full[0])


def test_a_cut_last_row_of_a_finished_run_is_written_again(full, tmp_path, capsys):
    """A finished run whose last metrics line was cut short: --resume goes
    back to the checkpoint before that row and writes it again, so the
    directory ends with every row of the uninterrupted run. Bug caught: the
    notice said "the resumed run rewrites them", but the run was already at
    its end, so nothing ran and the row stayed lost."""
    out = _copy(full, tmp_path)
    text = (out / "metrics.jsonl").read_text()
    last = text.rstrip("\n").rsplit("\n", 1)[-1]
    (out / "metrics.jsonl").write_text(text[: len(text) - len(last) - 1] + last[:20])
    capsys.readouterr()
    doc = train_teacher("toy:masked", TINY, out_dir=str(out), resume=True, **KW)
    err = capsys.readouterr().err
    assert "dropped 1 unreadable line(s)" in err and "resuming from env step" in err, err
    assert doc["complete"] and _evals(doc) == _evals(full[1])
    assert _rows(out) == _rows(full[0])
