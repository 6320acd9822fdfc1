"""The training loop: seeds × grid in one program, JSONL, checkpoints, resume."""

import json

import jax
import numpy as np
import pytest

from jaxil import envs
from jaxil.algorithms.offline import LearnerData, make_learner
from jaxil.algorithms.offline.train import expand_grid, train

from helpers.mpe_data import poor_and_expert


@pytest.fixture(scope="module")
def spread():
    env = envs.make("mpe:simple_spread")
    ds = poor_and_expert(0, calls=2)  # 12 poor and 12 expert-labelled random episodes
    return env, ds


def _train(env, ds, algo, out, updates, resume=False, grid=None, seeds=2):
    learner = make_learner(algo, env.spec, hidden=(16,), batch_size=32)
    data = LearnerData.from_dataset(ds, np.asarray(ds.expert))
    return train(learner, env, data, runs=expand_grid(grid or {}, seeds), num_updates=updates,
                 eval_every=5, eval_episodes=4, out_dir=out, resume=resume, progress=False)


@pytest.mark.slow  # about 55 s; test_run_integrity's kill-before-checkpoint test resumes exactly by default
def test_resume_reproduces_uninterrupted_run(spread, tmp_path):
    env, ds = spread
    full = _train(env, ds, "misodice", tmp_path / "full", 20)
    _train(env, ds, "misodice", tmp_path / "killed", 10)
    # a half-written metrics line, as after a kill mid-write
    with open(tmp_path / "killed" / "metrics.jsonl", "a") as f:
        f.write('{"update": 15, "ru')
    resumed = _train(env, ds, "misodice", tmp_path / "killed", 20, resume=True)
    a = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert a == b
    for x, y in zip(jax.tree.leaves(full["states"]), jax.tree.leaves(resumed["states"])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow  # its own misodice compile; run_integrity's reuse test covers the refusal by default
def test_existing_run_needs_resume(spread, tmp_path):
    env, ds = spread
    # test_resume_reproduces_uninterrupted_run's learner and seeds: its compiled
    # programs are reused (the refusal does not depend on the learner)
    _train(env, ds, "misodice", tmp_path / "r", 5)
    with pytest.raises(FileExistsError, match="--resume"):
        _train(env, ds, "misodice", tmp_path / "r", 5)


@pytest.mark.slow  # default-suite time (~30 s of compile); run with -m slow
def test_grid_is_one_program_with_per_run_hparams(spread, tmp_path):
    env, ds = spread
    out = _train(env, ds, "misodice", None, 5, grid={"alpha": [0.01, 1.0]}, seeds=1)
    st = out["states"]
    np.testing.assert_allclose(np.asarray(st.hparams.alpha), [0.01, 1.0])
    labels = [p["grid"] for p in out["points"]]
    assert labels == ["alpha=0.01", "alpha=1"]
    lr = np.asarray(st.opt_state["policy"][1].hyperparams["learning_rate"])
    assert lr.shape == (2,)
    with pytest.raises(ValueError, match="no hyper-parameter"):
        _train(env, ds, "bc_union", None, 5, grid={"alpha": [0.1]})


def test_bad_schedule_is_refused():
    """Refused before the data is touched (no data is given: a check moved
    after the first use of the data fails on ``None`` instead)."""
    env = envs.make("mpe:simple_spread")
    learner = make_learner("bc_union", env.spec, hidden=(8,), batch_size=8)
    with pytest.raises(ValueError, match="multiple of --eval-every"):
        train(learner, env, None, runs=expand_grid({}, 1), num_updates=7, eval_every=5,
              progress=False)
