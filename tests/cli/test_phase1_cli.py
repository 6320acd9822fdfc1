"""`jaxil label` end to end: ground-truth and external (fake LLM) oracles,
the labelled copy, the untouched input, a resumed external labelling job."""

import hashlib
import json
import sys
import types

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
