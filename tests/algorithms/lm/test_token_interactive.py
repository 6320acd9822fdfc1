"""The interactive token program (:mod:`jaxil.algorithms.lm.interactive`):
its update learns the labels (and a flipped objective unlearns them), every
regime keeps to its expert-token budget, a stopped run resumes to the
uninterrupted rows, and bad settings fail in one line.

The program-level tests (slow: about a minute of compiling) share one
module-scoped run of four regimes on ``tokens:arith`` with two operations."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.algorithms.lm import interactive as TI
from jaxil.envs.experts import scripted_expert

CFG = TI.TokenInteractiveConfig(rounds=2, episodes_per_round=8, updates_per_round=10,
                                sft_tokens=150, sft_updates=20, eval_episodes=8,
                                batch_episodes=8, learning_rate=3e-3)
BUDGET = 400


@pytest.fixture(scope="module")
def env():
    return envs.make("tokens:arith", num_ops=2)


@pytest.fixture(scope="module")
def expert(env):
    return scripted_expert(env)[0]


def _regimes():
    return [(m, TI.token_regime(m, BUDGET, sft_tokens=CFG.sft_tokens))
            for m in ("bc", "dagger", "oec", "onpolicy")]


@pytest.fixture(scope="module")
def full(env, expert, tmp_path_factory):
    out = tmp_path_factory.mktemp("ti") / "full"
    return TI.run(env, expert, None, _regimes(), seeds=1, config=CFG, out_dir=out)


def _at(rows, regime, rnd):
    (row,) = [r for r in rows if r["regime"] == regime and r["round"] == rnd]
    return row


@pytest.mark.slow
def test_every_regime_keeps_to_its_expert_token_budget(full):
    """Each regime's expert tokens (demonstrations included) stay within
    the budget; BC buys demonstrations only, rejection sampling asks the
    expert nothing interactively, DAgger and OEC buy interactive tokens.
    Kills an allowance that ignores the tokens already spent, DAgger not
    paying for the labels of the student's tokens, and on-policy sampling
    charged for its own tokens."""
    rows = full.rows
    for name in ("bc", "dagger", "oec", "onpolicy"):
        for rnd in (0, 1, 2):
            assert _at(rows, name, rnd)["expert_tokens"] <= BUDGET
    assert _at(rows, "bc", 2)["interactive_tokens"] == 0
    assert _at(rows, "onpolicy", 2)["interactive_tokens"] == 0
    assert _at(rows, "dagger", 2)["interactive_tokens"] > 0
    assert _at(rows, "oec", 2)["interactive_tokens"] > 0
    # DAgger pays for every token of its kept episodes; OEC only for the expert's.
    assert _at(rows, "dagger", 2)["expert_share"] < 1.0
    assert _at(rows, "bc", 0)["expert_tokens"] > _at(rows, "oec", 0)["expert_tokens"]


@pytest.mark.slow
def test_a_stopped_run_resumes_to_the_uninterrupted_rows(env, expert, full, tmp_path):
    """Stopped after the first of two rounds (as a kill would) and resumed,
    the run repeats the uninterrupted rows exactly; a resume with another
    budget is refused. Kills a rollout or minibatch key not carried in the
    checkpointed state, a buffer or spent-token count left out of the
    checkpoint, and an evaluation key that depends on the session."""
    stopped = TI.run(env, expert, None, _regimes(), seeds=1, config=CFG, out_dir=tmp_path,
                     stop_after_rounds=1)
    assert not stopped.summary["complete"]
    resumed = TI.run(env, expert, None, _regimes(), seeds=1, config=CFG, out_dir=tmp_path,
                     resume=True)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("chunk_time_s", "wall_time_s")}
                          for r in rows]
    assert strip(resumed.rows) == strip(full.rows)
    other = [(n, dict(h, budget=BUDGET + 10)) for n, h in _regimes()]
    with pytest.raises(ValueError, match="differ"):
        TI.run(env, expert, None, other, seeds=1, config=CFG, out_dir=tmp_path, resume=True)


def _nll_after_updates(env, expert, sign):
    """The demonstrations' token NLL before and after 30 updates of the
    interactive student's training step (on demonstrations only)."""
    demos = TI._demos_for(env, expert, None, jax.random.PRNGKey(5), 600)
    student = TI.make_student(env, CFG)
    tx = TI._optimizer(CFG)
    hp = TI.stack_regimes([TI.resolve_auto(TI.token_regime("bc", 600, sft_tokens=150), 1, 1)])
    params = student.init(jax.random.PRNGKey(0))
    state = TI.TokenRunState(
        params=params, opt_state=tx.init(params), hp=jax.tree.map(lambda x: x[0], hp),
        buffer=TI.empty_buffer(env, 4), spent=jnp.int32(0), expert_turns=jnp.int32(0),
        expert_episodes=jnp.int32(0), demo_eps=jnp.int32(demos.episodes.num_episodes),
        round=jnp.int32(0), key=jax.random.PRNGKey(1))
    ep = demos.episodes
    nll = lambda p: float(TI.token_nll(student, p, ep.obs, ep.avail, ep.actions, demos.mask))
    before = nll(params)
    orig = TI.token_nll
    try:
        TI.token_nll = lambda *a: sign * orig(*a)
        after_state, _, _ = jax.jit(lambda s: TI._train(student, tx, s, demos, 30, 8))(state)
    finally:
        TI.token_nll = orig
    return before, nll(after_state.params)


@pytest.mark.slow
def test_the_student_update_raises_the_labels_likelihood_and_its_negation_lowers_it(env, expert):
    """30 updates lower the demonstrations' token NLL well below its start;
    with the objective's sign flipped the NLL rises. Kills a flipped loss
    sign, a loss mask that selects no token, and updates that do not reach
    the parameters."""
    before, after = _nll_after_updates(env, expert, +1.0)
    assert after < 0.7 * before
    before_n, after_n = _nll_after_updates(env, expert, -1.0)
    assert after_n > before_n


def test_bad_settings_fail_in_one_line(env, expert, tmp_path):
    """A non-token environment, an unknown method and a regime that cannot
    afford the SFT start are refused before any work."""
    with pytest.raises(ValueError, match="not a token environment"):
        TI.run(envs.make("mpe:simple_spread"), expert, None, _regimes(), seeds=1, config=CFG)
    with pytest.raises(ValueError, match="budget"):
        TI.run(env, expert, None, [("bc", TI.token_regime("bc", 100, sft_tokens=100))], seeds=1,
               config=dataclasses.replace(CFG, sft_tokens=150))
    with pytest.raises(ValueError, match="capacity"):
        TI.TokenInteractiveConfig(capacity=-1)
    with pytest.raises(ValueError, match="size"):
        TI.TokenInteractiveConfig(size="huge")



def test_an_untrained_start_skips_the_sft_and_keeps_the_demos_in_the_budget(env, expert):
    """`sft_updates=0`: every run starts from its seed's initial student
    (the program's state equals `student.init` of the seed's key), and the
    demonstrations are still counted (the BC regime's demo episodes stay
    those of its budget, OEC's those of the SFT start). Catches an SFT
    run anyway (e.g. with a default number of updates) and a start that
    drops the demonstrations from the data. Negative updates are refused."""
    with pytest.raises(ValueError, match="sft_updates must be >= 0"):
        dataclasses.replace(CFG, sft_updates=-1)
    regimes = [(m, TI.token_regime(m, BUDGET, sft_tokens=CFG.sft_tokens)) for m in ("bc", "oec")]
    program = TI._program(env, expert, None, regimes, 1, dataclasses.replace(CFG, sft_updates=0),
                          0, CFG.rounds)
    state = program.init()
    initial = TI.make_student(env, CFG).init(jax.random.split(jax.random.PRNGKey(0))[0])
    same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a)[0], b), state.params, initial)
    assert all(jax.tree.leaves(same))
    assert int(state.demo_eps[0]) > int(state.demo_eps[1]) >= 1

@pytest.mark.slow
def test_cli_run_killed_with_sigkill_resumes_exactly(tmp_path):
    """``jaxil lm interactive`` killed by SIGKILL once its first checkpoint
    exists, then ``--resume``, writes the uninterrupted run's metrics line
    for line (kills a resume that restarts the round count, redraws the
    rollout keys, loses the buffer, or keeps rows of an uncommitted round)."""
    import json
    import sys

    from helpers.cli_kill import kill_then_resume

    args = [sys.executable, "-m", "jaxil.cli.main", "lm", "interactive", "oec", "--env",
            "tokens:arith", "--task-knob", "num_ops=2", "--budget", "400", "--sft-tokens", "150",
            "--sft-updates", "20", "--rounds", "6", "--episodes-per-round", "8",
            "--updates-per-round", "40", "--batch-episodes", "8", "--eval-episodes", "8",
            "--seeds", "2", "--no-progress"]
    kill_then_resume(args, tmp_path, min_step=1, max_step=6, timeout_s=300)
    a = (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
    b = (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in a] == [json.loads(x) for x in b]


def test_cli_refuses_a_bad_expert_or_task_in_one_line(tmp_path, capsys):
    """``jaxil lm interactive`` with a directory that holds no expert LM, a
    task knob that is not NAME=VALUE, or a non-token environment exits 1
    with one line naming the fix (no traceback, no work)."""
    from jaxil.cli.main import main

    base = ["lm", "interactive", "oec", "--budget", "300", "--no-progress"]
    for extra, needle in (
            (["--env", "tokens:arith", "--expert", str(tmp_path)], "no students.json there"),
            (["--env", "tokens:arith", "--task-knob", "faults"], "is not NAME=VALUE"),
            (["--env", "mpe:simple_spread"], "is not a token task")):
        assert main(base + extra) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err


def _fake_state(w):
    return TI.TokenRunState(params={"w": jnp.asarray(w, jnp.float32)}, opt_state=(),
                            hp={"demo_ratio": jnp.float32(0.5)}, buffer=(), spent=jnp.int32(0),
                            expert_turns=jnp.int32(0), expert_episodes=jnp.int32(0),
                            demo_eps=jnp.int32(1), round=jnp.int32(0),
                            key=jax.random.PRNGKey(0))


def test_the_sft_start_key_follows_the_demos_and_settings_not_the_regime(env):
    """The cache key of an SFT start changes with the students before SFT,
    the demonstrations and any setting, and not with a regime's knobs
    (which SFT does not read). Catches a key that leaves out the demos or
    the configuration (a start trained on other data or at another step
    size read back as this one) and a key that includes the regime (no
    sharing between the programs of one sweep)."""
    student = TI.make_student(env, CFG)
    demos = {"obs": jnp.arange(6)}
    key = TI.sft_start_key(CFG, student, _fake_state([1.0, 2.0]), demos)
    other_hp = _fake_state([1.0, 2.0]).replace(hp={"demo_ratio": jnp.float32(0.9)})
    assert TI.sft_start_key(CFG, student, other_hp, demos) == key
    assert TI.sft_start_key(CFG, student, _fake_state([1.0, 2.5]), demos) != key
    assert TI.sft_start_key(CFG, student, _fake_state([1.0, 2.0]),
                            {"obs": jnp.arange(1, 7)}) != key
    assert TI.sft_start_key(dataclasses.replace(CFG, learning_rate=1e-3), student,
                            _fake_state([1.0, 2.0]), demos) != key


def test_a_cached_sft_start_is_read_back_and_a_failed_one_is_never_written(tmp_path):
    """`_cached_sft` trains and writes a start once, then reads it back
    without training (a start edited on disk is what comes back, so it is
    read, not recomputed); a start whose health check fails is not written;
    a file of other shapes is refused in one line. Catches a cache that is
    never read, leaves in another order, and a non-finite start kept for
    the next program."""
    calls = []

    def train(s):
        calls.append(1)
        return s.replace(params={"w": s.params["w"] + 1.0}), None, {"ok": True}

    def check(health):
        if not health["ok"]:
            raise ValueError("non-finite")

    state = _fake_state([1.0, 2.0])
    got = TI._cached_sft(train, check, state, "k1", tmp_path)
    (path,) = tmp_path.glob("sft-start-k1.npz")
    assert len(calls) == 1 and list(got.params["w"]) == [2.0, 3.0]
    arrays = dict(np.load(path))
    i = [k for k, a in arrays.items() if a.dtype == np.float32 and a.shape == (2,)][0]
    arrays[i] = arrays[i] + 10.0
    np.savez(path, **arrays)
    again = TI._cached_sft(train, check, state, "k1", tmp_path)
    assert len(calls) == 1 and list(again.params["w"]) == [12.0, 13.0]
    bad = lambda s: (s, None, {"ok": False})
    with pytest.raises(ValueError, match="non-finite"):
        TI._cached_sft(bad, check, state, "k2", tmp_path)
    assert not list(tmp_path.glob("sft-start-k2*"))
    with pytest.raises(ValueError, match="delete it and run again"):
        TI._cached_sft(train, check, _fake_state([1.0, 2.0, 3.0]), "k1", tmp_path)
    assert TI._cached_sft(train, check, state, None, None).params["w"][0] == 2.0


@pytest.mark.slow
def test_programs_of_one_sweep_share_the_cached_sft_start(env, expert, tmp_path):
    """A BC program with `start_cache` trains the SFT start and writes it;
    a DAgger program of the same sweep reads it back (an edit on disk
    shows in its start) and one at another step size trains its own.
    Catches `run` not passing the cache on, the key computed after the
    regime's knobs are set, and the start read for other settings."""
    cfg = dataclasses.replace(CFG, sft_updates=3)
    make = lambda m, c: TI._program(env, expert, None,
                                    [(m, TI.token_regime(m, BUDGET, sft_tokens=c.sft_tokens))],
                                    1, c, 0, c.rounds, start_cache=tmp_path).init()
    bc = make("bc", cfg)
    (path,) = tmp_path.glob("sft-start-*.npz")
    arrays = dict(np.load(path))
    leaves = jax.tree.leaves(bc.params)
    i = next(k for k, a in arrays.items() if a.shape == leaves[0].shape
             and np.array_equal(a, np.asarray(leaves[0])))
    arrays[i] = arrays[i] + 1.0
    np.savez(path, **arrays)
    dagger = make("dagger", cfg)
    np.testing.assert_allclose(jax.tree.leaves(dagger.params)[0], leaves[0] + 1.0)
    other = make("dagger", dataclasses.replace(cfg, learning_rate=1e-3))
    assert len(list(tmp_path.glob("sft-start-*.npz"))) == 2
    assert not np.allclose(jax.tree.leaves(other.params)[0], leaves[0] + 1.0)
