"""Run directories exported for marl-eval, and learning-curve plots.

Two real run directories (``bc_union``: one without a grid, one sweep over
``lr``) are trained once for the module; an interactive directory is written
by hand in the row format of ``jaxil.algorithms.interactive.loop`` (training one costs
minutes). marl-eval itself runs when it is installed (``id-marl-eval``; see
the test docstrings), else those tests are skipped.
"""

import json
import shutil

import numpy as np
import pytest

from jaxil import envs
from jaxil.cli import main as cli

from helpers.mpe_data import poor_and_expert
from jaxil.runs.export import load_run, to_marl_eval
from jaxil.algorithms.offline import LearnerData, make_learner
from jaxil.runs.plot import plot_runs
from jaxil.algorithms.offline.train import expand_grid, train

UPDATES, EVAL_EVERY, SEEDS = 10, 5, 2
LRS = (0.03, 0.3)  # far from the default 3e-4: different policies after 10 updates


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    """``plain``: bc_union × 2 seeds; ``sweep``: bc_union, lr ∈ LRS × 2 seeds."""
    root = tmp_path_factory.mktemp("runs")
    env = envs.make("mpe:simple_spread")
    # the dataset and settings of test_run_integrity.py's two-run `jaxil sweep`: the
    # plain runs' program is that one, compiled once per session (conftest.py)
    ds = poor_and_expert(0)
    data = LearnerData.from_dataset(ds)
    learner = make_learner("bc_union", env.spec, hidden=(8,), batch_size=16)
    for name, grid in (("plain", {}), ("sweep", {"lr": list(LRS)})):
        train(learner, env, data, runs=expand_grid(grid, SEEDS), num_updates=UPDATES,
              eval_every=EVAL_EVERY, eval_episodes=2, out_dir=root / name, progress=False,
              run_info=dict(env_id=env.spec.env_id))  # as `jaxil train` records it
    return root / "plain", root / "sweep"


def _rows(d):
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def interactive_dir(tmp_path):
    """Two regimes × 2 seeds, rounds 0, 2, 4, in the row format of
    jaxil.algorithms.interactive.loop (round 0 carries only ``labels``, as there)."""
    d = tmp_path / "interactive"
    d.mkdir()
    rows, i = [], 0
    for rd in (0, 2, 4):
        for r, (regime, seed) in enumerate([(g, s) for g in ("bc@4", "oec@4") for s in (0, 1)]):
            row = dict(round=rd, run=r, regime=regime, seed=seed, eval_return=float(i),
                       eval_win_rate=i / 100, labels=10.0 * rd)
            if rd:
                row["bc_loss"] = 1.0 / rd
            rows.append(row)
            i += 1
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "run.json").write_text(json.dumps({"env_id": "smax:3m", "seeds": 2}))
    return d


def test_marl_eval_layout_matches_the_rows(run_dirs):
    """The layout of marl-eval's README and data_processing_utils.py (0.0.4):
    env -> task -> algorithm -> run_<seed> -> step_<i> {step_count, metric:
    [values]} + absolute_metrics, every value traced back to its
    metrics.jsonl row. Catches seeds mixed across algorithms (run_1 of
    lr=0.3 holding another grid point's or seed's row), steps misordered
    (step_0 not the first evaluation, absolute_metrics not the last), a metric
    from the wrong key (return from eval_win_rate), and env/task not split
    from env_id."""
    plain, sweep = run_dirs
    out = to_marl_eval([plain, sweep])
    assert json.loads(json.dumps(out)) == out
    assert list(out) == ["mpe"] and list(out["mpe"]) == ["simple_spread"]
    algos = out["mpe"]["simple_spread"]
    assert list(algos) == ["bc_union", "bc_union[lr=0.03]", "bc_union[lr=0.3]"]
    want = {"bc_union": (plain, {}), "bc_union[lr=0.03]": (sweep, {"lr": LRS[0]}),
            "bc_union[lr=0.3]": (sweep, {"lr": LRS[1]})}
    for name, (d, grid) in want.items():
        runs = algos[name]
        assert list(runs) == [f"run_{s}" for s in range(SEEDS)]
        for s in range(SEEDS):
            mine = sorted((r for r in _rows(d) if r["grid"] == grid and r["seed"] == s),
                          key=lambda r: r["update"])
            entry = runs[f"run_{s}"]
            steps = [k for k in entry if k != "absolute_metrics"]
            assert steps == [f"step_{i}" for i in range(UPDATES // EVAL_EVERY)]
            assert list(entry)[-1] == "absolute_metrics"
            for k, row in zip(steps, mine):
                assert entry[k] == {"step_count": row["update"], "return": [row["eval_return"]],
                                    "win_rate": [row["eval_win_rate"]]}
            assert entry["absolute_metrics"] == {"return": [mine[-1]["eval_return"]],
                                                 "win_rate": [mine[-1]["eval_win_rate"]]}
    # every (algorithm, seed) ends elsewhere, so a mix-up cannot hide behind equal values
    finals = [r["absolute_metrics"]["return"][0] for a in algos.values() for r in a.values()]
    assert len(set(finals)) == 3 * SEEDS


def test_marl_eval_names_metrics_and_interactive_regimes(run_dirs, interactive_dir):
    """Interactive regimes become algorithms and round 0 is step_0; names and
    metrics can be chosen. Catches the SFT start (round 0) dropped or placed
    last, a --name list applied to the wrong directory, and a renamed metric
    read from the wrong key."""
    out = to_marl_eval([interactive_dir], metrics={"eval_win_rate": "win_rate", "labels": "labels"})
    algos = out["smax"]["3m"]
    assert list(algos) == ["bc@4", "oec@4"]
    r1 = algos["oec@4"]["run_1"]
    assert [r1[f"step_{i}"]["step_count"] for i in range(3)] == [0, 2, 4]
    # oec@4 seed 1 is row 3 of each round: eval_return i = 4 * round_index + 3
    assert [r1[f"step_{i}"]["win_rate"] for i in range(3)] == [[0.03], [0.07], [0.11]]
    assert [r1[f"step_{i}"]["labels"] for i in range(3)] == [[0.0], [20.0], [40.0]]
    assert r1["absolute_metrics"] == {"win_rate": [0.11], "labels": [40.0]}

    plain, sweep = run_dirs
    named = to_marl_eval([plain, sweep], env_name="MPE", task_name="spread",
                         algorithm_names=["BC", "BC-lr"])
    assert list(named["MPE"]["spread"]) == ["BC", "BC-lr[lr=0.03]", "BC-lr[lr=0.3]"]
    mapped = to_marl_eval([plain], algorithm_names={"bc_union": "union"})
    assert list(mapped["mpe"]["simple_spread"]) == ["union"]
    with pytest.raises(ValueError, match="missing at round 0"):
        to_marl_eval([interactive_dir], metrics=["bc_loss"])


def test_marl_eval_refuses_what_marl_eval_cannot_pair(run_dirs, tmp_path):
    """marl-eval indexes every algorithm by the first one's run and step
    names (and lower-cases them). Catches two directories silently merged
    under one algorithm name, an interrupted run (fewer evaluations) or a
    run with fewer seeds exported as if it were comparable."""
    plain, sweep = run_dirs
    with pytest.raises(ValueError, match="both give algorithm 'bc_union'.*--name"):
        to_marl_eval([plain, plain])
    with pytest.raises(ValueError, match="one per directory"):
        to_marl_eval([plain, sweep], algorithm_names=["x"])
    with pytest.raises(ValueError, match="comma"):
        to_marl_eval([plain], algorithm_names=["a,b"])

    cut = tmp_path / "cut"
    shutil.copytree(plain, cut, ignore=shutil.ignore_patterns("checkpoints"))
    rows = [r for r in _rows(plain) if not (r["seed"] == 1 and r["update"] == UPDATES)]
    (cut / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"run_1 is evaluated at \[5\] but 'bc_union' at \[5, "):
        to_marl_eval([plain, cut], algorithm_names=["bc_union", "cut"])

    one = tmp_path / "one_seed"
    shutil.copytree(plain, one, ignore=shutil.ignore_patterns("checkpoints"))
    rows = [r for r in _rows(plain) if r["seed"] == 0]
    (one / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="same seeds"):
        to_marl_eval([plain, one], algorithm_names=["bc_union", "one"])


def _normalised_finals(run_dirs):
    """Per algorithm, per seed: the final eval_return min-max normalised over
    every evaluation of every algorithm of the task (marl-eval's rule), and
    the normalised curve [S, T]."""
    plain, sweep = run_dirs
    groups = {"bc_union": (plain, {}), "bc_union[lr=0.03]": (sweep, {"lr": LRS[0]}),
              "bc_union[lr=0.3]": (sweep, {"lr": LRS[1]})}
    curves = {}
    for name, (d, grid) in groups.items():
        curves[name] = np.array([[r["eval_return"] for r in sorted(
            (r for r in _rows(d) if r["grid"] == grid and r["seed"] == s),
            key=lambda r: r["update"])] for s in range(SEEDS)])
    lo = min(c.min() for c in curves.values())
    hi = max(c.max() for c in curves.values())
    return {n: (c - lo) / (hi - lo + 1e-6) for n, c in curves.items()}


def test_marl_eval_aggregation_runs_on_the_export(run_dirs):
    """marl-eval's data_process_pipeline and create_matrices_for_rliable on
    the exported JSON give, per algorithm, the [runs, tasks] matrix of final
    normalised returns and the [runs, tasks, steps] curves computed here from
    metrics.jsonl. Catches a layout marl-eval misreads (its pipeline prints
    and returns the raw data instead of raising), seeds mixed across
    algorithms and steps misordered.

    Needs: pip install "pandas>=2.2,<3" rliable colorcet colorama;
    pip install --no-deps id-marl-eval==0.0.4."""
    pytest.importorskip("marl_eval")
    from marl_eval.utils.data_processing_utils import (create_matrices_for_rliable,
                                                       data_process_pipeline)

    raw = to_marl_eval(list(run_dirs))
    processed = data_process_pipeline(raw_data=raw, metrics_to_normalize=["return"])
    assert "extra" in processed, "marl-eval did not accept the layout"
    assert processed["extra"]["number_of_runs"] == SEEDS
    assert processed["extra"]["number_of_steps"] == UPDATES // EVAL_EVERY
    finals, curves = create_matrices_for_rliable(
        data_dictionary=processed, environment_name="mpe", metrics_to_normalize=["return"])
    want = _normalised_finals(run_dirs)
    assert set(finals) == {"mean_norm_return", "mean_win_rate"}
    for name, c in want.items():
        np.testing.assert_allclose(finals["mean_norm_return"][name], c[:, -1:], rtol=1e-6)
        np.testing.assert_allclose(curves["mean_norm_return"][name], c[:, None, :], rtol=1e-6)


def test_marl_eval_plotting_tools_run_on_the_export(run_dirs, monkeypatch, tmp_path):
    """marl-eval's aggregate_scores and probability_of_improvement (rliable
    bootstraps) run on the export; the mean aggregate is the mean of the
    final normalised returns. Catches algorithm names marl-eval's plotting
    rejects (commas, which it splits pairs on) and a final step that is not
    the last evaluation. The bootstrap is cut to 200 resamples (marl-eval
    hard-codes 50,000: a minute here), which changes only its intervals.

    Needs rliable < the arch 8 API and pandas < 3 (arch < 8 calls a private
    pandas decorator whose signature pandas 3 changed)."""
    pytest.importorskip("marl_eval")
    from marl_eval.plotting_tools import plotting
    from marl_eval.utils.data_processing_utils import (create_matrices_for_rliable,
                                                       data_process_pipeline)

    estimate = plotting.rly.get_interval_estimates
    monkeypatch.setattr(plotting.rly, "get_interval_estimates",
                        lambda *a, **k: estimate(*a, **dict(k, reps=200)))
    processed = data_process_pipeline(raw_data=to_marl_eval(list(run_dirs)),
                                      metrics_to_normalize=["return"])
    finals, _ = create_matrices_for_rliable(processed, "mpe", ["return"])
    want = _normalised_finals(run_dirs)
    fig, scores, _ = plotting.aggregate_scores(
        finals, metric_name="return", metrics_to_normalize=["return"],
        tabular_results_file_path=str(tmp_path / "agg"))
    assert (tmp_path / "agg_return.csv").exists()
    # marl-eval upper-cases names and (mutating its own dict) returns "value [ci]" strings
    for name, c in want.items():
        mean = scores[name.upper()]["Mean"]
        mean = float(mean.split()[0]) if isinstance(mean, str) else float(mean)
        assert mean == pytest.approx(c[:, -1].mean(), abs=0.006)
    fig = plotting.probability_of_improvement(
        finals, metric_name="return", metrics_to_normalize=["return"],
        algorithms_to_compare=[["bc_union[lr=0.3]", "bc_union"]])
    assert fig is not None


def test_plot_runs_draws_one_line_per_grid_point(run_dirs, tmp_path):
    """One line per grid point (3 over both directories), each the mean over
    seeds with a ±1 std band, x = update; --by dir pools each directory.
    Catches seeds plotted as separate lines, grid points pooled, an x axis
    out of update order, and the band drawn from the wrong statistic."""
    plain, sweep = run_dirs
    fig = plot_runs([plain, sweep], metric="eval_return", out=tmp_path / "f.png")
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert [ln.get_label() for ln in lines] == [
        "bc_union (2 seeds)", "bc_union[lr=0.03] (2 seeds)", "bc_union[lr=0.3] (2 seeds)"]
    assert len(ax.collections) == 3  # the bands
    assert ax.get_xlabel() == "update"
    rows = [r for r in _rows(sweep) if r["grid"] == {"lr": LRS[1]}]
    x, y = lines[2].get_data()
    np.testing.assert_array_equal(x, [5, 10])
    for xi, yi in zip(x, y):
        vals = [r["eval_return"] for r in rows if r["update"] == xi]
        assert len(vals) == SEEDS and yi == pytest.approx(np.mean(vals))
    band = ax.collections[2].get_paths()[0].vertices[:, 1]  # mean ± std at each x
    for edge in (np.mean(vals) + np.std(vals), np.mean(vals) - np.std(vals)):
        assert np.isclose(band, edge, rtol=1e-6).any()

    pooled = plot_runs([plain, sweep], metric="eval_win_rate", by="dir")
    assert [ln.get_label() for ln in pooled.axes[0].get_lines()] == [
        "plain (2 seeds)", "sweep (4 seeds)"]


def test_plot_and_export_cli(run_dirs, interactive_dir, tmp_path, capsys):
    """``jaxil plot`` and ``jaxil export marl-eval`` are registered and write
    their files; an interactive directory plots by regime over rounds.
    Catches a subcommand missing from jaxil.cli.main._MODULES and --name not
    reaching the export."""
    plain, sweep = run_dirs
    png = tmp_path / "curves.png"
    assert cli.main(["plot", str(interactive_dir), "--metric", "eval_win_rate",
                     "--out", str(png)]) == 0
    assert png.exists() and "2 curve(s)" in capsys.readouterr().out
    fig = plot_runs([interactive_dir], metric="bc_loss")  # round 0 has no bc_loss: skipped
    assert fig.axes[0].get_xlabel() == "round"
    np.testing.assert_array_equal(fig.axes[0].get_lines()[0].get_xdata(), [2, 4])

    js = tmp_path / "me.json"
    assert cli.main(["export", "marl-eval", str(plain), str(sweep), "--out", str(js),
                     "--name", "a", "--name", "b"]) == 0
    assert list(json.loads(js.read_text())["mpe"]["simple_spread"]) == [
        "a", "b[lr=0.03]", "b[lr=0.3]"]


def test_bad_input_names_the_path_and_the_fix(run_dirs, tmp_path, capsys):
    """A directory without metrics.jsonl, an empty metrics.jsonl, an unknown
    metric (the available ones listed) and --by that does not fit: each one
    line naming the path and what to do. Catches a bare KeyError/traceback
    or a message without the path."""
    plain, _ = run_dirs
    with pytest.raises(FileNotFoundError, match=r"nowhere/metrics.jsonl not found.*jaxil train"):
        load_run(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"empty/metrics.jsonl holds no evaluation"):
        to_marl_eval([tmp_path / "empty"])
    with pytest.raises(ValueError, match=r"'eval_retrun' is not in .*available: .*eval_return"):
        plot_runs([plain], metric="eval_retrun")
    with pytest.raises(ValueError, match=r"'nope' is not in .*available: .*eval_win_rate"):
        to_marl_eval([plain], metrics=["nope"])
    with pytest.raises(ValueError, match="--by grid"):
        plot_runs([plain], by="regime")
    assert cli.main(["plot", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nowhere/metrics.jsonl not found" in err
