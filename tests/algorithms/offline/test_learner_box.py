"""The box head is part of a learner's config and of its run's identity.

Before, the head of a learner's policy on box actions was a module default
(``jaxil.nn.policy.DEFAULT_BOX``): it was in no config, no ``run.json``, and a
checkpoint trained under the tanh-Gaussian silently acted under the censored
Gaussian once the default changed."""

import json

import jax
import numpy as np
import pytest

from jaxil import envs
from jaxil.envs.policies import random_policy
from jaxil.cli.main import main
from jaxil.data import Dataset, concatenate, save
from jaxil.algorithms.offline import make_learner
from jaxil.nn.policy import DEFAULT_BOX, PolicyNet

pytestmark = pytest.mark.xdist_group("run_integrity")

CONTINUOUS = "mpe:simple_spread_continuous"
FAST = ["--updates", "5", "--eval-every", "5", "--eval-episodes", "1", "--batch-size", "16",
        "--hidden", "8", "--no-progress"]


@pytest.mark.parametrize("algo,box", [("bc_expert", "tanh_gaussian"), ("bc_expert", "beta"),
                                      ("misodice", "beta"), ("omapl", "beta")])
def test_the_configs_box_head_is_the_policys(algo, box):
    """Every learner family scores actions with the head its config names:
    the learner's policy log-probabilities equal a PolicyNet of that head on
    the same parameters. Breaks if a learner builds its PolicyNet without
    ``config.box`` (it would score with the default head for every box)."""
    spec = envs.make(CONTINUOUS).spec
    learner = make_learner(algo, spec, hidden=(8,), batch_size=4, box=box)
    assert learner.config.box == box
    state = learner.init(jax.random.PRNGKey(0), learner.default_hparams())
    params = state.params["policy"]
    obs = jax.random.normal(jax.random.PRNGKey(1), (5, spec.num_agents, spec.obs_dim))
    a = spec.action
    u = jax.random.uniform(jax.random.PRNGKey(2), (5, spec.num_agents, a.dim))
    actions = a.low + (a.high - a.low) * (0.05 + 0.9 * u)
    got = learner.policy(False).log_prob(state.params, obs, None, actions)
    want = PolicyNet(spec, (8,), True, box=box).log_prob(params, obs, None, actions)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    assert box != DEFAULT_BOX["state"]  # the heads differ, so the check above can fail:
    other = PolicyNet(spec, (8,), True).log_prob(params, obs, None, actions)
    assert np.abs(np.asarray(other) - np.asarray(want)).max() > 1e-3


def test_an_unknown_box_head_is_refused_by_name():
    """A misspelt head fails at config time with the choices, not as a
    KeyError deep inside the policy."""
    spec = envs.make(CONTINUOUS).spec
    with pytest.raises(ValueError, match="box must be one of"):
        make_learner("bc_expert", spec, hidden=(8,), box="gaussian")


def _dataset(env_id, seed):
    env = envs.make(env_id)
    spec = env.spec
    ep = jax.jit(lambda k: envs.run_episodes(env, random_policy(spec), None, k, 4))(
        jax.random.PRNGKey(seed))
    a = Dataset.from_episodes(ep, spec, "poor", "random", seed, expert=False)
    b = Dataset.from_episodes(ep, spec, "expert", "random", seed + 1, expert=True)
    return concatenate([a, b])


def _err(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


@pytest.mark.slow  # default-suite time (~28 s: three CLI trainings); run with -m slow
def test_box_head_is_recorded_resumed_and_required_on_eval(tmp_path, capsys):
    """``jaxil train --box`` records the head in run.json:
    - resuming with another head is refused, naming the config;
    - `jaxil eval` of a box-action run whose run.json names no head (written
      before the field existed) is refused in one line instead of acting
      under whatever the default is now;
    - `--box` on a discrete environment is refused (the head would be ignored),
      and a discrete run's identity has no box entry, so runs from before the
      field still resume.
    Breaks if the head is left out of the identity, if eval falls back to the
    current default, or if discrete identities change."""
    save(_dataset(CONTINUOUS, 0), tmp_path / "c.npz")
    out = tmp_path / "run"
    base = ["train", "bc_expert", "--dataset", str(tmp_path / "c.npz"), "--out", str(out), *FAST]
    assert main(base + ["--box", "tanh_gaussian"]) == 0
    capsys.readouterr()
    doc = json.loads((out / "run.json").read_text())
    assert doc["identity"]["config"]["box"] == "tanh_gaussian"
    assert main(base + ["--resume"]) == 1  # the default head is another one
    msg = _err(capsys)
    assert "differ" in msg and "config" in msg, msg
    assert main(base + ["--resume", "--box", "tanh_gaussian"]) == 0
    capsys.readouterr()
    assert main(["eval", str(out), "--episodes", "1"]) == 0
    capsys.readouterr()
    del doc["identity"]["config"]["box"]
    (out / "run.json").write_text(json.dumps(doc))
    assert main(["eval", str(out), "--episodes", "1"]) == 1
    msg = _err(capsys)
    assert "box head" in msg and "tanh_gaussian" in msg, msg

    save(_dataset("mpe:simple_spread", 0), tmp_path / "d.npz")
    disc = ["train", "bc_expert", "--dataset", str(tmp_path / "d.npz"), *FAST]
    assert main(disc + ["--box", "beta"]) == 1
    assert "discrete" in _err(capsys)


def test_discrete_identities_name_no_box_head():
    """A run on discrete actions records the same config as before the field
    existed (its old run.json still resumes); a box-action run records its
    head. Breaks if the identity keeps the ignored field on discrete actions
    or drops the used one on box actions."""
    from jaxil.algorithms.offline.train import config_identity

    disc, cont = envs.make("mpe:simple_spread").spec, envs.make(CONTINUOUS).spec
    for algo in ("bc_expert", "misodice"):
        assert "box" not in config_identity(make_learner(algo, disc, hidden=(8,)), disc)
        got = config_identity(make_learner(algo, cont, hidden=(8,), box="beta"), cont)
        assert got["box"] == "beta"
