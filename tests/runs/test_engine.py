"""The run engine (:mod:`jaxil.runs.engine`) on a small pure program.

The program's state is a vector per run that a chunk moves by a key-drawn
step; its evaluation is the state's mean. Nothing here depends on an
environment, so each test names the engine behaviour it pins and the bug
that breaks it.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil.runs import engine, guard
from jaxil.runs.measure import format_table
from jaxil.runs.summary import mean_std, summarize_step
from jaxil.runs.updates import scan_updates

from helpers.engine import Toy, make_program, one_update as _one


def test_scan_updates_matches_a_python_loop_of_split_keys():
    """The one scan: each update gets ``split(state.key)[1]`` and the state
    carries ``split(state.key)[0]``. Fails if the halves are swapped or the
    key is not advanced (every update would draw the same step)."""
    s0 = Toy(x=jnp.zeros(3), key=jax.random.PRNGKey(7))
    got, metrics = jax.jit(lambda s: scan_updates(_one, s, 4))(s0)
    x, key = np.zeros(3), jax.random.PRNGKey(7)
    for _ in range(4):
        key, sub = jax.random.split(key)
        x = x + np.asarray(jax.random.normal(sub, (3,)))
    np.testing.assert_allclose(np.asarray(got.x), x, rtol=1e-6)
    assert metrics["loss"].shape == (4,)
    with pytest.raises(ValueError, match="k .* >= 1"):
        scan_updates(_one, s0, 0)


def test_rows_cadence_and_results(tmp_path):
    """Rows at every ``eval_every`` chunks, keyed by ``chunks · step_unit``;
    each holds the mean of its run's values; ``results.json`` has the
    program's summary. Fails on an off-by-one in the cadence or a row keyed
    by the chunk index instead of the update."""
    rd = engine.open_run(tmp_path / "r", {"toy": 1}, step_key="update")
    out = engine.run(make_program(), rundir=rd, progress=False)
    assert [r["update"] for r in out.rows] == [6, 6, 12, 12, 18, 18]
    assert [r["run"] for r in out.rows[:2]] == [0, 1]
    final_x = np.asarray(out.state.x)
    assert out.rows[-1]["eval_return"] == pytest.approx(float(final_x[1].mean()), rel=1e-6)
    res = json.loads((tmp_path / "r" / "results.json").read_text())
    assert res["last"] == 18 and res["complete"] is True
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == out.rows


def test_resume_after_a_stop_reproduces_the_uninterrupted_run(tmp_path):
    """Stop after 2 of 6 chunks (as a kill would, between evaluations), then
    resume: the rows and the final state equal one uninterrupted run's.
    Fails if restore starts from the wrong chunk, or rows past the last
    checkpoint are kept twice."""
    full = engine.run(make_program(), progress=False)
    rd = engine.open_run(tmp_path / "r", {"toy": 1}, step_key="update")
    part = engine.run(make_program(), rundir=rd, progress=False, stop_after_chunks=3)
    assert part.summary["complete"] is False and [r["update"] for r in part.rows] == [6, 6]
    rd = engine.open_run(tmp_path / "r", {"toy": 1}, step_key="update", resume=True)
    assert rd.latest == 6
    rest = engine.run(make_program(), rundir=rd, progress=False)
    assert rest.rows == full.rows
    np.testing.assert_array_equal(np.asarray(rest.state.x), np.asarray(full.state.x))


def test_the_guard_stops_before_the_chunk_is_written(tmp_path):
    """A NaN in chunk 3 (0-based): the error names the update and the last
    good checkpoint (update 6 is the newest: chunk 3 is not an evaluation
    chunk), and nothing of chunks 2-3 is written. Fails if the guard runs
    after the rows or the checkpoint."""
    rd = engine.open_run(tmp_path / "r", {"toy": 1}, step_key="update")
    with pytest.raises(guard.NonFiniteError, match=r"update 10.*update 6\) is kept in"):
        engine.run(make_program(nan_at=3), rundir=rd, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert {r["update"] for r in rows} == {6}
    assert rd.checkpointer.latest_step() == 6


def test_initial_row_loggers_and_no_results_without_summarize(tmp_path):
    """``eval_at_start`` writes a row at step 0 with ``initial_metrics``;
    every row reaches each logger once; a program without ``summarize``
    leaves ``results.json`` to its caller. Fails if row 0 is skipped or a
    logger misses the last rows."""
    seen = []

    class Log:
        def __init__(self, names, step_key, resume_from):
            assert names == ["a", "b"] and step_key == "update" and resume_from is None

        def write(self, rows):
            seen.extend(rows)

        def close(self):
            seen.append("closed")

    prog = make_program(eval_at_start=True, initial_metrics=lambda s: {"loss": np.ones(2)})
    prog.summarize = None
    rd = engine.open_run(tmp_path / "r", {"toy": 1}, step_key="update")
    out = engine.run(prog, rundir=rd, progress=False, loggers=[Log], log_names=["a", "b"])
    assert [r["update"] for r in out.rows] == [0, 0, 6, 6, 12, 12, 18, 18]
    assert out.rows[0]["loss"] == 1.0
    assert seen[:-1] == out.rows and seen[-1] == "closed"
    assert not (tmp_path / "r" / "results.json").exists()


def test_a_program_refuses_an_eval_cadence_that_does_not_divide_the_run():
    with pytest.raises(ValueError, match="eval_every must divide the run's 6 chunks, got 4"):
        make_program(eval_every=4)


def test_rows_every_chunk_with_uneven_checkpoints_and_timing_over_a_resume(tmp_path):
    """``row_every_chunk`` writes a row per chunk, the evaluation only on the
    chunks of ``eval_chunks`` (where the checkpoints are); ``timed`` rows
    carry ``wall_time_s`` continued from the kept rows after a resume;
    ``derive`` fields are computed from the finished row, whose step field
    stays the engine's even when a metric has the same name. Fails if the
    evaluation leaks into other rows, a checkpoint lands on an unevaluated
    chunk, the wall clock restarts at zero on resume, or a metric overwrites
    the step."""
    kw = dict(eval_chunks=[2, 5, 6], row_every_chunk=True, timed=True,
              derive=lambda r: {"chunk": r["update"] // 3})

    def prog():
        p = make_program(**kw)
        chunk = p.chunk
        p.chunk = lambda s, c: (lambda out: (out[0], dict(out[1], update=jnp.full(2, -1.0)),
                                             out[2]))(chunk(s, c))
        return p

    full = engine.run(prog(), progress=False)
    assert [r["chunk"] for r in full.rows[::2]] == [1, 2, 3, 4, 5, 6]
    assert [r["update"] for r in full.rows[::2]] == [3, 6, 9, 12, 15, 18]
    assert ["eval_return" in r for r in full.rows[::2]] == [False, True, False, False, True, True]
    rd = engine.open_run(tmp_path / "r", {"toy": 1}, step_key="update")
    engine.run(prog(), rundir=rd, progress=False, stop_after_chunks=4)
    assert rd.checkpointer.latest_step() == 6
    rd = engine.open_run(tmp_path / "r", {"toy": 1}, step_key="update", resume=True)
    kept_wall = rd.rows[-1]["wall_time_s"]
    assert [r["chunk"] for r in rd.rows[::2]] == [1, 2] and kept_wall > 0
    rest = engine.run(prog(), rundir=rd, progress=False)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.endswith("time_s")} for r in rows]
    assert strip(rest.rows) == strip(full.rows)
    walls = [r["wall_time_s"] for r in rest.rows[::2]]
    assert walls == sorted(walls) and walls[2] > kept_wall
    with pytest.raises(ValueError, match="eval_chunks must increase"):
        make_program(eval_chunks=[2, 4])


def test_summarize_step_groups_in_run_order_and_formats():
    """Groups by label in the given order with mean and population std over
    their runs. Fails if the std is the sample std (ddof=1) or the groups
    come out in another order than the runs'."""
    rows = [dict(update=u, run=i, g=("b" if i < 2 else "a"), eval_return=float(i + u),
                 eval_win_rate=0.5, labels=10.0 * i)
            for u in (1, 2) for i in range(4)]
    step, groups = summarize_step(rows, "update", group=lambda r: r["g"], group_name="grid",
                                  order=["b", "a"], means=("labels",))
    assert step == 2 and [g["grid"] for g in groups] == ["b", "a"]
    assert groups[0]["return_mean"] == 2.5 and groups[0]["return_std"] == 0.5
    assert groups[1]["labels_mean"] == 25.0 and groups[1]["returns"] == [4.0, 5.0]
    table = format_table(groups, [("grid", "grid", "{}", "<"), ("seeds", "seeds", "{}"),
                                  mean_std("return", "return")])
    # header, rule, then the groups
    assert table.splitlines()[2].split() == ["b", "2", "2.500", "±", "0.500"]
