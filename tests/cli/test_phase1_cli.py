"""`jaxil label` end to end: ground-truth and external (fake LLM) oracles,
the labelled copy, the untouched input, a resumed external labelling job, a
silent or interrupted labeller, the hints' flags, the query budget."""

import argparse
import ast
import hashlib
import json
import re
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest
from helpers.data import omapl_dataset

from jaxil.cli.main import main
from jaxil.data import load, save

FAST = ["--label-updates", "100", "--label-seeds", "1", "--label-hidden", "16",
        "--pairs-per-batch", "8", "--no-progress"]


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("phase1") / "mixed.npz"
    save(omapl_dataset(0), p)
    return p


@pytest.mark.slow  # default-suite time (~15 s); run with -m slow
def test_label_ground_truth_writes_a_labelled_copy(ds_path, tmp_path, capsys):
    before = hashlib.sha256(ds_path.read_bytes()).hexdigest()
    out = tmp_path / "labelled.npz"
    rc = main(["label", str(ds_path), "--queries", "200", "--top-k", "30", "--out", str(out), *FAST])
    assert rc == 0
    assert hashlib.sha256(ds_path.read_bytes()).hexdigest() == before, "input must not change"
    src, lab = load(ds_path), load(out)
    side = json.loads(out.with_suffix(".labels.json").read_text())
    np.testing.assert_array_equal(lab.expert, np.asarray(side["expert"]))
    assert lab.expert.sum() == 30
    np.testing.assert_array_equal(lab.obs, src.obs)
    prov = lab.info.creation_args["phase1"]
    assert prov["ground_truth_expert"] == np.flatnonzero(src.expert).tolist()
    assert prov["oracle"] == "ground_truth" and prov["queries"] == 200
    assert set(side["metrics"]) >= {"precision", "recall", "accuracy", "auc", "spearman"}
    assert "labels vs ground truth" in capsys.readouterr().out
    # the labels file plugs into `jaxil train --labels`
    from jaxil.data.labels import expert_labels

    np.testing.assert_array_equal(expert_labels(src, str(out.with_suffix(".labels.json"))), lab.expert)


def test_label_refuses_to_overwrite_its_input(ds_path, capsys):
    rc = main(["label", str(ds_path), "--top-k", "30", "--out", str(ds_path), *FAST])
    assert rc == 1
    assert "never modifies its input" in capsys.readouterr().err


def test_label_bad_oracle_arguments(ds_path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # without --out, `jaxil label` makes runs/labels/ here
    assert main(["label", str(ds_path), "--oracle", "external", *FAST]) == 1
    assert "--external MODULE:FUNCTION" in capsys.readouterr().err
    assert main(["label", str(ds_path), "--oracle", "external", "--external", "nomodule_xyz:f",
                 *FAST]) == 1
    assert "nomodule_xyz" in capsys.readouterr().err
    assert main(["label", str(ds_path), "--oracle", "semantic", *FAST]) == 1
    assert "smax" in capsys.readouterr().err.lower()


@pytest.mark.slow  # default-suite time; run with -m slow; the labeller's rerun-reuses-the-cache test stays
def test_external_labeler_end_to_end_with_resume(ds_path, tmp_path, monkeypatch, capsys):
    """A fake LLM answers '#1'/'#2' by a hash of the prompt, but 'not sure'
    to a fifth of them: those are reported unparseable and left out; a second
    run with the same cache asks only about the pairs still unanswered."""
    calls = []

    def fake(prompt: str) -> str:
        calls.append(prompt)
        h = int(hashlib.md5(prompt.encode()).hexdigest(), 16)
        return "not sure" if h % 5 == 0 else ("#1" if h % 2 else "Trajectory #2 is better")

    monkeypatch.setitem(sys.modules, "fake_llm", types.SimpleNamespace(ask=fake))
    cache = tmp_path / "answers.jsonl"
    args = ["label", str(ds_path), "--oracle", "external", "--external", "fake_llm:ask",
            "--cache", str(cache), "--queries", "60", "--top-k", "30", *FAST]
    assert main([*args, "--out", str(tmp_path / "a.npz")]) == 0
    first = len(calls)
    out = capsys.readouterr().out
    side = json.loads((tmp_path / "a.labels.json").read_text())
    rep = side["oracle"]["report"]
    assert rep["num_failed"] > 0
    assert rep["parsed"] + rep["cached"] + rep["num_failed"] == 60
    # the fake is deterministic: each failed query was asked 1 + max_retries (2) times
    assert rep["unparseable"] == 3 * rep["num_failed"] and first == rep["asked"]
    assert side["oracle"]["answered"] == 60 - rep["num_failed"]
    assert "unparseable" in out
    cached = [json.loads(x) for x in cache.read_text().splitlines()]
    assert len(cached) == rep["parsed"]
    calls.clear()
    assert main([*args, "--out", str(tmp_path / "b.npz")]) == 0
    rep2 = json.loads((tmp_path / "b.labels.json").read_text())["oracle"]["report"]
    # answered pairs come from the cache; only the unanswered ones are asked again
    assert rep2["cached"] == 60 - rep["num_failed"] and rep2["parsed"] == 0
    assert len(calls) == 3 * rep["num_failed"]


@pytest.mark.slow
def test_pipeline_end_to_end(tmp_path):
    """`jaxil pipeline` on a small scripted-expert MPE dataset: Phase 1, then
    MisoDICE with Phase-1 labels, ground-truth labels and no Phase 1."""
    from jaxil.collect import recipes as rc

    path = tmp_path / "spread.npz"
    rc.build("mpe-simple_spread_continuous/misodice-200e-1000p", 0, path,
             counts={"expert": 8, "poor": 32}, discover_teachers=False, measure_episodes=0,
             progress=False)
    rc_ = main(["pipeline", "mpe:simple_spread_continuous", "--dataset", str(path), "--seeds", "2",
                "--updates", "40", "--evals", "1", "--eval-episodes", "4", "--hidden", "16",
                "--batch-size", "32", "--queries", "100", "--top-k", "8", "--out", str(tmp_path),
                *FAST])
    assert rc_ == 0
    summary = json.loads((tmp_path / "pipeline.json").read_text())
    assert set(summary["phase2"]) == {"phase1", "ground_truth", "no_phase1"}
    assert all(np.isfinite(r["return_mean"]) for r in summary["phase2"].values())
    assert summary["labelling"]["num_labelled"] == 8
    assert summary["oracle"]["answered"] == 100 and summary["env"] == "mpe:simple_spread_continuous"


# -- the external labeller: time limit, Ctrl-C, hints, the query budget -------------------


@pytest.fixture(scope="module")
def small_path(tmp_path_factory):
    """12 trajectories (4 expert): 66 distinct pairs of whole trajectories."""
    p = tmp_path_factory.mktemp("phase1-small") / "small.npz"
    save(omapl_dataset(0, n_expert=4, n_poor=8), p)
    return p


SMALL = ["--top-k", "4", *FAST]


@pytest.fixture
def no_fit(monkeypatch):
    """Phase 1 without O-MAPL: random scores instead of a fit (these tests
    are about the queries; the fit is tested above and in test_omapl.py).
    Returns the query sets the fit was given."""
    from jaxil.algorithms.labelling import pipeline
    from jaxil.algorithms.labelling.label import PreferenceFit

    given = []

    def fit(dataset, pairs, prefs, *, seeds=1, **_):
        given.append(pairs)
        scores = np.random.default_rng(0).normal(size=(seeds, dataset.num_trajectories))
        return PreferenceFit(None, None, scores, [], len(pairs), 0.0)

    monkeypatch.setattr(pipeline, "fit_preferences", fit)
    return given


class Labeller:
    """'#1' or '#2' by a hash of the prompt for the first ``answers`` calls;
    then it hangs (until the test releases it) or, with ``interrupt``,
    raises KeyboardInterrupt as Ctrl-C during a query does."""

    def __init__(self, answers: int = 10**9, interrupt: bool = False):
        self.answers, self.interrupt, self.calls = answers, interrupt, 0
        self.release = threading.Event()

    def __call__(self, prompt: str) -> str:
        if self.calls >= self.answers:
            if self.interrupt:
                raise KeyboardInterrupt
            self.release.wait(30)
        self.calls += 1
        return "#1" if int(hashlib.md5(prompt.encode()).hexdigest(), 16) % 2 else "#2"


def _label_parsers():
    """The `label` and `pipeline` parsers, without importing every command."""
    from jaxil.cli.label import register

    sub = argparse.ArgumentParser().add_subparsers()
    register(sub)
    return sub.choices["label"], sub.choices["pipeline"]


_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _unknown_flags(text: str, parsers) -> set:
    """The ``--flags`` named in ``text`` that none of ``parsers`` accepts."""
    helps = [p.format_help() for p in parsers]
    return {f for f in _FLAG.findall(text)
            if not any(re.search(rf"(?<![\w-]){f}(?![\w-])", h) for h in helps)}


def _external(ds_path, labeller, monkeypatch, cache, *extra):
    monkeypatch.setitem(sys.modules, "test_labeller", types.SimpleNamespace(ask=labeller))
    return ["label", str(ds_path), "--oracle", "external", "--external", "test_labeller:ask",
            "--cache", str(cache), *extra, *SMALL]


def test_label_stops_on_a_silent_labeller_and_a_rerun_reuses_its_answers(
        small_path, tmp_path, monkeypatch, capsys, no_fit):
    """Plausible bugs: no --timeout (the run waits for the labeller: 30 s,
    then rc 0); the timeout escaping as a traceback or a bare
    'TimeoutError'; the answers before the silent query lost (the partial
    batch not flushed, so the rerun asks them again); a hint naming a flag
    that does not exist."""
    cache = tmp_path / "answers.jsonl"
    hung = Labeller(answers=3)
    argv = _external(small_path, hung, monkeypatch, cache, "--queries", "66", "--timeout", "0.5")
    try:
        rc = main([*argv, "--out", str(tmp_path / "a.npz")])
    finally:
        hung.release.set()
    err = capsys.readouterr().err
    assert rc == 1
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("jaxil label: error: the external labeller gave no reply to query ")
    assert "of 66 within 0.5 s; this run's 3 answers are saved in" in err
    assert "--timeout SECONDS" in err and f"--cache {cache}" in err
    assert not _unknown_flags(err, _label_parsers()[:1])
    assert len(cache.read_text().splitlines()) == 3
    assert not (tmp_path / "a.npz").exists()
    rerun = Labeller()
    argv = _external(small_path, rerun, monkeypatch, cache, "--queries", "66")
    assert main([*argv, "--out", str(tmp_path / "b.npz")]) == 0
    assert rerun.calls == 66 - 3  # the 3 cached answers are not asked again
    rep = json.loads((tmp_path / "b.labels.json").read_text())["oracle"]["report"]
    assert rep["cached"] == 3 and rep["parsed"] == 63


def test_label_ctrl_c_keeps_the_cache_and_prints_one_line(small_path, tmp_path, monkeypatch,
                                                          capsys):
    """Plausible bugs: the generic hint 'continue with --resume' (label has
    no --resume: a plain rerun with the same --cache continues); a
    traceback; the answers of the interrupted batch lost."""
    cache = tmp_path / "answers.jsonl"
    argv = _external(small_path, Labeller(answers=5, interrupt=True), monkeypatch, cache,
                     "--queries", "20")
    assert main([*argv, "--out", str(tmp_path / "a.npz")]) == 130
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("jaxil label: interrupted;") and "--resume" not in err
    assert f"holds 5 answers; rerun the same command (with --cache {cache})" in err
    assert not _unknown_flags(err, _label_parsers()[:1])
    assert len(cache.read_text().splitlines()) == 5


def _strings(path: Path) -> list[str]:
    """The string constants of a module, docstrings left out."""
    tree = ast.parse(path.read_text())
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and id(n) not in docs]


def test_every_flag_the_label_messages_name_exists():
    """Every ``--flag`` in a string of the `label` / `pipeline` commands and
    the labelling modules (hints, errors, notices) is a flag of those
    commands. Plausible bug: a hint that tells the user to pass a flag the
    command does not have ('--resume')."""
    root = Path(__file__).resolve().parents[2]
    files = [root / "jaxil" / "cli" / "label.py",
             *sorted((root / "jaxil" / "algorithms" / "labelling").glob("*.py"))]
    parsers = _label_parsers()
    named = {}
    for f in files:
        for s in _strings(f):
            for flag in _unknown_flags(s, parsers):
                named.setdefault(flag, []).append(f"{f.name}: {s!r}")
    assert not named, named
    assert not _unknown_flags("--cache --timeout --queries --external", parsers[:1])
    assert _unknown_flags("--resume", parsers) == {"--resume"}  # the check can fail


def test_label_caps_queries_at_the_distinct_pairs(small_path, tmp_path, monkeypatch, capsys,
                                                 no_fit):
    """Plausible bugs: pairs drawn with replacement, so '500/500 answered'
    after asking 66 distinct pairs (or fewer: repeats); no notice of the
    cap; the count reported against the budget instead of the pairs
    asked."""
    counting = Labeller()
    argv = _external(small_path, counting, monkeypatch, tmp_path / "c.jsonl", "--queries", "500")
    assert main([*argv, "--out", str(tmp_path / "a.npz")]) == 0
    out = capsys.readouterr().out
    assert ("--queries 500 exceeds the 66 distinct pairs of this dataset; asking 66\n") in out
    assert "oracle external(Labeller): 66/66 distinct pairs answered\n" in out
    assert counting.calls == 66
    (pairs,) = no_fit
    assert len({frozenset({(a, sa), (b, sb)}) for a, sa, b, sb in zip(
        pairs.traj_x.tolist(), pairs.start_x.tolist(), pairs.traj_y.tolist(),
        pairs.start_y.tolist())}) == len(pairs) == 66  # each pair once
    oracle = json.loads((tmp_path / "a.labels.json").read_text())["oracle"]
    assert (oracle["queries"], oracle["requested"], oracle["answered"]) == (66, 500, 66)
    assert oracle["report"]["parsed"] == 66 and oracle["report"]["cached"] == 0


def test_timeout_is_checked(small_path, tmp_path, capsys):
    """Plausible bugs: `--timeout 0` (or a negative or NaN one) taken, so
    every call times out at once; `--timeout` with another oracle silently
    ignored."""
    for bad in ("0", "-1", "nan"):
        with pytest.raises(SystemExit) as e:
            main(["label", str(small_path), "--oracle", "external", "--external", "m:f",
                  "--timeout", bad])
        assert e.value.code == 2 and "(0, inf)" in capsys.readouterr().err
    assert main(["label", str(small_path), "--out", str(tmp_path / "a.npz"), "--timeout", "5",
                 *SMALL]) == 1
    assert "--timeout apply to the external oracle only" in capsys.readouterr().err
