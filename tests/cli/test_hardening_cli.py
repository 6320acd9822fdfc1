"""Runs that cannot lie, for the rest of the command line: ``jaxil teach``,
``jaxil data build``, ``jaxil label`` / ``jaxil pipeline`` and the external
labeller's answer cache.

Each test drives the CLI in-process (``jaxil.cli.main.main``) and checks the
one-line message and the exit status. Unwritable paths are simulated with a
path under a regular file (we may run as root, for whom ``chmod`` stops
nothing); "no work was done" is proven by making the first expensive step
(the dataset load, the zoo, the trainer) fail the test if it is reached.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.fast_compile import FAST_COMPILE
from helpers.data import omapl_dataset

from jaxil import envs
from jaxil.envs.core import DiscreteActions, EnvSpec, MultiAgentEnv, Step
from jaxil.cli.main import main

ENV = "toy:hardening"


class _Pick(MultiAgentEnv):
    """Each agent sees a one-hot target and is rewarded for picking it."""

    def __init__(self, num_agents=2, num_actions=3, max_steps=4):
        self.n, self.a, self.T = num_agents, num_actions, max_steps
        self.spec = EnvSpec(env_id=ENV, num_agents=num_agents, obs_dim=num_actions + 1,
                            state_dim=num_agents * num_actions,
                            action=DiscreteActions(num_actions, noop_action=None),
                            max_steps=max_steps, has_win=False)

    def _draw(self, key, t, reward=0.0):
        target = jax.random.randint(key, (self.n,), 0, self.a)
        onehot = jax.nn.one_hot(target, self.a)
        return Step(inner=dict(t=jnp.int32(t), target=target),
                    obs=jnp.concatenate([onehot, jnp.full((self.n, 1), t / self.T)], -1),
                    global_state=onehot.reshape(-1),
                    avail_actions=jnp.ones((self.n, self.a), bool),
                    reward=reward, truncated=t >= self.T)

    def _reset(self, key):
        return self._draw(key, 0)

    def _step(self, key, inner, actions):
        hit = (actions == inner["target"]).astype(jnp.float32)
        return self._draw(key, inner["t"] + 1, hit.mean())


envs.register(ENV, _Pick)


def _diverging_config():
    from jaxil.algorithms.rl.config import PPOConfig

    # One Adam step of a learning rate of 1e30 moves every weight by ~1e30:
    # update 1 is computed from the initial weights (finite), update 2's
    # forward pass overflows (inf logits -> NaN losses).
    return PPOConfig(algo="mappo", total_timesteps=3 * 16, num_envs=4, num_steps=4,
                     update_epochs=1, num_minibatches=1, lr=1e30, anneal_lr=False,
                     hidden_sizes=(8,), updates_per_chunk=1)


TEACH = ["teach", "--env", ENV, "--num-checkpoints", "3", "--eval-episodes", "4", "--quiet"]


@pytest.fixture(scope="module")
def teach_preset():
    """``jaxil teach --env toy:hardening`` trains the diverging preset
    (compiled at XLA level 0: fast_compile.py)."""
    from jaxil.teachers import train as teacher_train
    from jaxil.teachers import presets as zoo

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(zoo.PRESETS, ENV, _diverging_config())
        mp.setattr(teacher_train, "train_teacher",
                   functools.partial(teacher_train.train_teacher, compiler_options=FAST_COMPILE))
        yield


@pytest.fixture(scope="module")
def diverged(teach_preset, tmp_path_factory):
    """One diverging ``jaxil teach`` run: (out dir, exit status, stderr)."""
    out = tmp_path_factory.mktemp("teach") / "teacher"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main([*TEACH, "--out", str(out)])
    return out, rc, err.getvalue()


@pytest.fixture
def no_training(monkeypatch):
    """Make reaching the teacher trainer fail the test."""
    from jaxil.teachers import train as teacher_train

    def reached(*a, **k):
        raise AssertionError("the teacher started training")

    monkeypatch.setattr(teacher_train, "train_teacher", reached)


def _err_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# ------------------------------------------------------------------- jaxil teach


def test_teach_stops_a_diverging_teacher_and_keeps_its_last_good_checkpoint(diverged):
    """Bug caught: the PPO loop has no non-finite guard, so a teacher whose
    losses turn NaN trains on, checkpoints NaN actors (evaluating NaN logits
    still "works"), `jaxil teach` exits 0 and the datasets built from it are
    junk; or the guard fires after the bad chunk's checkpoint was written."""
    from jaxil.teachers import load_teacher
    from jaxil.teachers.io import list_checkpoints

    out, rc, err = diverged
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1, err
    msg = lines[0]
    assert msg.startswith("jaxil teach: error: the MAPPO teacher of toy:hardening diverged")
    assert "seed 0" in msg and "update 2" in msg and "value_loss = nan" in msg, msg
    assert "last good checkpoint (env step 16, update 1)" in msg and str(out) in msg
    assert list_checkpoints(out) == [16]  # chunk 1's; none of the diverged chunk
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["chunk"] for r in rows] == [1]
    assert not json.loads((out / "teacher.json").read_text())["complete"]
    _, params, _ = load_teacher(str(out))
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


def test_teach_resume_refuses_other_settings_and_foreign_run_dirs(diverged, teach_preset,
                                                                  tmp_path, capsys):
    """Bugs caught: `--resume` with another --eval-episodes silently mixes
    checkpoints evaluated on different episode counts under one
    teacher.json; `jaxil teach --out` pointed at a `jaxil train` run
    directory deletes its metrics.jsonl and writes a teacher into it."""
    out, _, _ = diverged
    before = (out / "teacher.json").read_text()
    assert main([*TEACH, "--out", str(out), "--resume", "--eval-episodes", "8"]) == 1
    msg = _err_line(capsys)
    assert "cannot resume" in msg and "eval_episodes is 4" in msg and "8" in msg, msg
    assert (out / "teacher.json").read_text() == before

    run = tmp_path / "a_train_run"
    (run / "checkpoints" / "100").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    (run / "metrics.jsonl").write_text('{"update": 100}\n')
    for extra in ([], ["--resume"]):
        assert main([*TEACH, "--out", str(run), *extra]) == 1
        msg = _err_line(capsys)
        assert "another kind of run" in msg and "run.json" in msg, msg
    assert (run / "metrics.jsonl").read_text() == '{"update": 100}\n'
    assert not (run / "teacher.json").exists()


@pytest.mark.parametrize("argv,allowed", [
    (["--seed", "-1"], "[0, inf)"),
    (["--num-checkpoints", "0"], "[1, inf)"),
    (["--eval-episodes", "0"], "[1, inf)"),
    (["--stop-after-chunks", "0"], "[1, inf)"),
])
def test_teach_arguments_are_range_checked_at_parse_time(argv, allowed, teach_preset,
                                                         no_training, tmp_path, capsys):
    """Bug caught: `--stop-after-chunks 0` trains nothing and exits 0 with an
    empty teacher; `--seed -1` is taken as a seed; counts of 0 fail only
    inside the trainer. Each is refused by argparse (exit 2) with the range."""
    with pytest.raises(SystemExit) as e:
        main([*TEACH, "--out", str(tmp_path / "t"), *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert argv[0] in err and allowed in err, err


@pytest.mark.parametrize("item,message", [
    ("lr=true", "PPOConfig.lr=True: must be a finite number > 0"),
    ("gamma=true", "PPOConfig.gamma=True: must be a number in [0, 1]"),
    ("clip_eps=0", "PPOConfig.clip_eps=0.0: must be a finite number > 0"),
    ("gae_lambda=1.5", "PPOConfig.gae_lambda=1.5: must be a number in [0, 1]"),
    ("update_epochs=0", "PPOConfig.update_epochs=0: must be an integer >= 1"),
    ("hidden_sizes=3.5", "hidden_sizes takes a JSON list"),
    ("learning_rate=0.1", "unknown config field 'learning_rate'"),
])
def test_teach_config_fields_are_range_checked(item, message, teach_preset, no_training,
                                               tmp_path, capsys):
    """Bug caught: `--set lr=true` (JSON true) passes as a learning rate of 1
    and `gamma=true` as a discount; `--set hidden_sizes=3.5` dies with a
    TypeError traceback. Each is one line, exit 1, before any training."""
    assert main([*TEACH, "--out", str(tmp_path / "t"), "--set", item]) == 1
    assert message in _err_line(capsys)


# --------------------------------------------------------------- jaxil data build


@pytest.fixture
def no_build(monkeypatch):
    """Make reaching the collection fail the test."""
    from jaxil.collect import recipes
    from jaxil.collect import zoo

    def reached(*a, **k):
        raise AssertionError("the build started")

    monkeypatch.setattr(recipes, "make_zoo", reached)
    monkeypatch.setattr(zoo, "make_zoo", reached)


def test_data_build_refuses_an_unwritable_out_before_collecting(tmp_path, no_build, capsys):
    """Bug caught: `jaxil data build --out` under a file (or an existing
    directory) is found only when the finished dataset is saved, after every
    episode was collected."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    for out in (blocker / "sub" / "d.npz", tmp_path):
        assert main(["data", "build", "smax-3m/expert", "--out", str(out), "--quiet"]) == 1
        msg = _err_line(capsys)
        assert msg.startswith("jaxil data: error: --out ") and str(out) in msg, msg
        assert "not writable" in msg or "is a directory" in msg, msg


@pytest.mark.parametrize("argv,allowed", [
    (["--seed", "-1"], "[0, inf)"),
    (["--scale", "0"], "(0, inf)"),
    (["--n-expert", "-2"], "[0, inf)"),
    (["--chunk-size", "0"], "[1, inf)"),
    (["--measure-episodes", "-1"], "[0, inf)"),
    (["--epsilon", "medium=1.5"], "[0, 1]"),
])
def test_data_build_arguments_are_range_checked(argv, allowed, no_build, tmp_path, capsys):
    """Bug caught: `--chunk-size 0` or `--seed -1` fail only inside the
    build, a negative count or ε > 1 deep in the zoo; each is an argparse
    error (exit 2) naming the allowed range."""
    with pytest.raises(SystemExit) as e:
        main(["data", "build", "smax-3m/expert", "--out", str(tmp_path / "d.npz"), "--quiet",
              *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert argv[0] in err and allowed in err, err


# ------------------------------------------------------------ --env-kwarg


@pytest.fixture
def no_interactive(monkeypatch):
    """Make reaching the zoo of `jaxil interactive` fail the test."""
    from jaxil.collect import zoo

    def reached(*a, **k):
        raise AssertionError("the expert was loaded")

    monkeypatch.setattr(zoo, "make_zoo", reached)


@pytest.mark.parametrize("argv", [
    ["data", "build", "smax-3m/expert", "--quiet"],
    ["interactive", "dagger", "--env", "smax:3m", "--budget", "100"],
    TEACH,
])
def test_an_env_kwarg_the_environment_does_not_take_is_one_line(argv, tmp_path, capsys,
                                                              no_build, no_interactive,
                                                              no_training, teach_preset):
    """Bug caught: `--env-kwarg bogus=1` reached the environment's constructor
    inside the zoo and ended in a TypeError traceback (`jaxil data build`);
    each command now names the flag and the keyword, exits 1 and starts no
    work (the fixtures fail the test if the zoo or the trainer is reached)."""
    out = tmp_path / ("d.npz" if argv[0] == "data" else "run")
    assert main([*argv, "--out", str(out), "--env-kwarg", "bogus=1"]) == 1
    msg = _err_line(capsys)
    assert "--env-kwarg" in msg and "bogus" in msg, msg
    assert not out.exists()


def test_interactive_runs_in_the_env_kwarg_environment_and_records_it(monkeypatch, tmp_path):
    """`jaxil interactive --env-kwarg max_steps=3` builds the expert's zoo,
    and so the environment every round and evaluation runs in, with the
    keyword, and puts it in the run's identity (a resume with another value
    is then refused by the run directory). Bugs caught: the flag parsed but
    not passed to the zoo (the default episodes), or left out of
    `run_info`."""
    from jaxil.algorithms.interactive import loop

    seen = {}

    class Reached(Exception):
        pass

    def fake_run(env, expert, expert_params, regimes, **kw):
        seen.update(env=env, run_info=kw["run_info"])
        raise Reached

    monkeypatch.setattr(loop, "run", fake_run)
    with pytest.raises(Reached):
        main(["interactive", "bc", "--env", "mpe:simple_spread", "--expert", "scripted",
              "--budget", "1000", "--env-kwarg", "max_steps=3", "--out", str(tmp_path / "r")])
    short = envs.make("mpe:simple_spread", max_steps=3).spec
    assert short != envs.make("mpe:simple_spread").spec
    assert seen["env"].spec == short
    assert seen["run_info"]["env_kwargs"] == {"max_steps": 3}
    seen.clear()
    with pytest.raises(Reached):
        main(["interactive", "bc", "--env", "mpe:simple_spread", "--expert", "scripted",
              "--budget", "1000", "--out", str(tmp_path / "r2")])
    assert seen["env"].spec == envs.make("mpe:simple_spread").spec
    assert "env_kwargs" not in seen["run_info"]


# ------------------------------------------------------- jaxil label / pipeline


@pytest.fixture
def no_load(monkeypatch):
    """Make reaching the dataset load (or build) fail the test."""
    import jaxil.collect.recipes

    def reached(*a, **k):
        raise AssertionError("the dataset was loaded")

    monkeypatch.setattr(jaxil.collect.recipes, "load_dataset", reached)


def test_label_and_pipeline_refuse_an_unwritable_out_before_the_work(tmp_path, no_load, capsys):
    """Bugs caught: `jaxil label --out DIR` (an existing directory) fails
    only when saving, after the oracle was asked and O-MAPL fitted;
    `jaxil pipeline --out` under a file fails after Phase 1 and every
    training run."""
    src = tmp_path / "in.npz"
    src.write_text("")  # never read: the check comes first
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    for out in (tmp_path / "existing_dir", blocker / "sub" / "l.npz"):
        (tmp_path / "existing_dir").mkdir(exist_ok=True)
        assert main(["label", str(src), "--out", str(out), "--top-k", "3"]) == 1
        msg = _err_line(capsys)
        assert msg.startswith("jaxil label: error: --out ") and str(out) in msg, msg
    assert main(["pipeline", "smax:3m", "--out", str(blocker / "p"), "--top-k", "3"]) == 1
    msg = _err_line(capsys)
    assert msg.startswith("jaxil pipeline: error: --out ") and "not writable" in msg, msg


@pytest.mark.parametrize("command", ["label", "pipeline"])
@pytest.mark.parametrize("argv,allowed", [
    (["--queries", "0"], "[1, inf)"),
    (["--flip-rate", "0.7"], "[0, 0.5]"),
    (["--flip-rate", "-0.1"], "[0, 1]"),
    (["--top-k", "0"], "[1, inf)"),
    (["--top-frac", "0"], "(0, inf)"),
    (["--top-frac", "1.5"], "(0, 1]"),
    (["--label-updates", "0"], "[1, inf)"),
    (["--label-seeds", "0"], "[1, inf)"),
    (["--segment-len", "0"], "[1, inf)"),
    (["--seed", "-1"], "[0, inf)"),
])
def test_label_and_pipeline_arguments_are_range_checked(command, argv, allowed, no_load,
                                                        tmp_path, capsys):
    """Bug caught: `--queries 0`, `--top-frac 1.5`, `--label-seeds 0` or a
    flip rate above 0.5 are taken (or fail deep inside O-MAPL, after the
    dataset build); each is an argparse error (exit 2) with the range."""
    target = str(tmp_path / "in.npz") if command == "label" else "smax:3m"
    with pytest.raises(SystemExit) as e:
        main([command, target, *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert argv[0] in err and allowed in err, err


@pytest.mark.parametrize("argv,allowed", [
    (["--seeds", "0"], "[1, inf)"),
    (["--updates", "0"], "[1, inf)"),
    (["--evals", "0"], "[1, inf)"),
    (["--eval-episodes", "0"], "[1, inf)"),
    (["--batch-size", "0"], "[1, inf)"),
])
def test_pipeline_training_arguments_are_range_checked(argv, allowed, no_load, capsys):
    """Bug caught: `jaxil pipeline --seeds 0` trains no run and `--evals 0`
    divides by zero after Phase 1; each is refused at parse time."""
    with pytest.raises(SystemExit) as e:
        main(["pipeline", "smax:3m", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert argv[0] in err and allowed in err, err


# ------------------------------------------------- the external labeller's cache


def test_a_read_only_cache_is_refused_before_the_first_query(tmp_path, no_load, monkeypatch,
                                                             capsys):
    """Bug caught: an answer cache that cannot be written is discovered when
    the first batch of answers is appended, after the labeller (an LLM,
    paid per query) answered them: the answers are lost. `jaxil label`
    refuses it before loading the data, and the oracle itself before its
    first query."""
    from jaxil.algorithms.labelling.oracles import ExternalOracle
    from jaxil.data.preferences import sample_query_pairs

    calls = []

    def judge(prompt: str) -> str:
        calls.append(prompt)
        return "#1"

    monkeypatch.setitem(sys.modules, "fake_judge", types.SimpleNamespace(ask=judge))
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    cache = blocker / "answers.jsonl"
    src = tmp_path / "in.npz"
    src.write_text("")
    assert main(["label", str(src), "--out", str(tmp_path / "l.npz"), "--oracle", "external",
                 "--external", "fake_judge:ask", "--cache", str(cache), "--top-k", "3"]) == 1
    msg = _err_line(capsys)
    assert msg.startswith(f"jaxil label: error: answer cache {cache} is not writable"), msg
    assert "--cache" in msg

    ds = omapl_dataset(0, 4, 4)
    pairs = sample_query_pairs(ds, 6, None, seed=0)
    with pytest.raises(PermissionError, match="answer cache .* is not writable"):
        ExternalOracle(judge, cache_path=cache, progress=False)(ds, pairs)
    assert calls == []
    # A cache directory that is a directory is refused too, with the fix.
    with pytest.raises(IsADirectoryError, match="pass --cache a file"):
        ExternalOracle(judge, cache_path=tmp_path, progress=False)(ds, pairs)
    assert calls == []


@pytest.mark.parametrize("argv,hint", [(["data", "info", "x.npz"], "rerun the command"),
                                       (["train", "bc_union", "--dataset", "x.npz"], "--resume")])
def test_ctrl_c_hint_names_resume_only_where_the_command_has_it(argv, hint, monkeypatch, capsys):
    """Ctrl-C prints one line whose hint fits the command: `--resume` only
    for commands that accept it. Bug caught: "continue with --resume" after
    `jaxil label` or `data info`, which have no such flag."""
    from jaxil.cli import data as data_cli, train as train_cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(data_cli, "_info", interrupted)
    monkeypatch.setattr(train_cli, "_run", interrupted)
    assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted" in err[0] and hint in err[0], err
    if hint != "--resume":
        assert "--resume" not in err[0]
