"""A dataset's environment keywords: recorded by the recipe builder, read
back by `DatasetInfo.env_kwargs`, and used by `dataset_env` (and so by
`jaxil train`, `jaxil eval`, `jaxil label` and `jaxil irl`) to evaluate a
learner in the environment its data came from."""

import dataclasses
import json

import numpy as np

import pytest

from jaxil import envs
from jaxil.cli.main import main
from jaxil.data.environment import dataset_env
from jaxil.data import save
from jaxil.data.format import Dataset, concatenate

from helpers.data import make_episodes

ENV = "mpe:simple_spread"


def _dataset(env_kwargs, seed=0, num=3):
    spec = envs.make(ENV, **env_kwargs).spec
    args = {"env_kwargs": env_kwargs} if env_kwargs else {"num": num}
    return Dataset.from_episodes(make_episodes(spec, num, seed), spec, tier="poor",
                                 source="random", seed=seed, recipe="unit", creation_args=args)


def test_dataset_env_is_made_with_the_recorded_keywords():
    """A dataset recorded at max_steps=7 gives that environment (a
    `dataset_env` that drops the keywords makes the default one, of another
    length, and fails its own spec check); a dataset without keywords gives the
    default."""
    ds = _dataset({"max_steps": 7})
    assert ds.info.env_kwargs == {"max_steps": 7}
    assert ds.spec.max_steps != envs.make(ENV).spec.max_steps
    assert dataset_env(ds).spec == ds.spec
    plain = _dataset({})
    assert plain.info.env_kwargs == {}
    assert dataset_env(plain).spec == envs.make(ENV).spec


def test_a_concatenation_keeps_its_parts_keywords_and_refuses_a_mix():
    """Nested concatenations read their leaves' keywords (a reader of the top
    level only returns {} and builds the default environment); parts recorded
    with other keywords are refused with a one-line reason."""
    a, b = _dataset({"max_steps": 7}, 0), _dataset({"max_steps": 7}, 1)
    both = concatenate([concatenate([a, b]), a])
    assert both.info.env_kwargs == {"max_steps": 7}
    assert dataset_env(both).spec == a.spec
    other = _dataset({"max_steps": 7, "local_ratio": 0.25}, 2)
    with pytest.raises(ValueError, match="different environment keywords"):
        concatenate([a, other]).info.env_kwargs


def test_a_spec_that_the_keywords_do_not_explain_is_named():
    """Data whose spec differs from the environment its keywords make (here
    recorded at 7 steps, recording no keywords) is refused, not evaluated in
    another environment."""
    ds = _dataset({"max_steps": 7})
    ds = ds.replace(info=dataclasses.replace(ds.info, creation_args_json="{}"))
    with pytest.raises(ValueError, match="does not match environment"):
        dataset_env(ds)


@pytest.mark.slow  # two CLI trainings; the keyword path itself is tested above by default
def test_train_and_eval_run_in_the_datasets_environment(tmp_path, capsys):
    """`jaxil train` records a dataset's keywords in its identity and `jaxil
    eval` rebuilds that environment (an eval that made the default one would
    refuse the run: its recorded max_steps no longer matches the default)."""
    path = save(_dataset({"max_steps": 7}, num=6), tmp_path / "d.npz")
    out = tmp_path / "run"
    assert main(["train", "bc_union", "--dataset", str(path), "--out", str(out), "--updates", "4",
                 "--eval-every", "2", "--eval-episodes", "2", "--batch-size", "8", "--hidden", "8",
                 "--no-progress"]) == 0
    doc = json.loads((out / "run.json").read_text())
    assert doc["identity"]["data"]["env_kwargs"] == {"max_steps": 7}
    assert main(["eval", str(out), "--episodes", "2"]) == 0


@pytest.mark.slow  # a BC training and evaluation (about 25 s); dataset_env itself is tested above
def test_reward_learning_sft_runs_in_the_datasets_environment():
    """`jaxil irl`'s π_SFT (`fit_sft`) trains and evaluates in the dataset's
    environment: a dataset recorded at another episode length is accepted
    (the default environment's spec check refused it) and evaluated."""
    from jaxil.algorithms.irl.sources import fit_sft

    ds = _dataset({"max_steps": 7}, num=6)
    sft = fit_sft(ds, seeds=1, hidden=(8,), batch_size=8, updates=2, eval_every=2,
                  eval_episodes=2, progress=False)
    points = sft.summary["points"]
    assert points and all(np.isfinite(p["return_mean"]) for p in points), points
