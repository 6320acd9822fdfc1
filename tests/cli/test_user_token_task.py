"""A user's own token task (tests/helpers/nav_task.py, written outside
`envs/` with its own words and its own expert) through the public
registration, the task check and `jaxil lm`; and the loading of saved
students (`--expert DIR`, `--sft DIR`), refused in one line when
`students.json` does not describe the parameters.

The full `jaxil lm sft` + `jaxil lm interactive oec` run of the task in a
fresh process is `-m slow` (about two minutes on two cores); the default
suite checks the same wiring piece by piece.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.algorithms.lm import interactive as TI
from jaxil.algorithms.lm import check_token_task
from jaxil.algorithms.lm.sft import TokenEpisodes
from jaxil.cli.main import main
from jaxil.envs import registry, token_tasks
from jaxil.envs.core import DiscreteActions, EnvSpec
from jaxil.envs.tokens import VOCAB, Command, token_specials
from helpers import nav_task
from helpers.nav_task import NavEnv, nav_expert

TESTS = Path(__file__).resolve().parents[1]
#: sha256 of the shipped vocabulary's names joined by spaces (57 tokens).
SHIPPED_VOCAB_DIGEST = "30d263fc6dae9af4"


@pytest.fixture
def private_registry(monkeypatch):
    """Registrations made by a test are undone after it."""
    monkeypatch.setattr(registry, "_FACTORIES", dict(registry._FACTORIES))
    monkeypatch.setattr(token_tasks, "_EXPERTS", dict(token_tasks._EXPERTS))


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# -- the vocabulary is the task's ----------------------------------------------------------


def test_a_task_brings_its_own_words_and_the_shipped_tasks_keep_theirs():
    """`tokens:nav` (7 new words) has 64 tokens, its words after the shipped
    57; defining and building another task with more words changes neither
    `VOCAB` nor `tokens:repair`'s vocabulary, spec or grammar. Kills: a
    vocabulary extended in place (every task gains actions), a spec or a
    grammar sized from the module's VOCAB instead of the task's."""
    repair = envs.make("tokens:repair")
    before = (repair.vocab.names, repair.spec, repair._grammar.copy())

    class Beeper(TokenEnv_with(VOCAB.extend(["BEEP", "BOOP"]))):
        pass

    beeper = Beeper()
    nav = envs.make("tokens:nav")
    after = envs.make("tokens:repair")
    assert (after.vocab.names, after.spec) == before[:2]
    np.testing.assert_array_equal(after._grammar, before[2])
    assert len(VOCAB) == 57 and VOCAB is after.vocab
    assert hashlib.sha256(" ".join(VOCAB.names).encode()).hexdigest()[:16] == SHIPPED_VOCAB_DIGEST
    assert nav.spec.num_actions == len(nav.vocab) == 64
    assert nav.vocab.names[:57] == VOCAB.names and nav.vocab["LOOK"] == 58
    assert beeper.spec.num_actions == 59 and "LOOK" not in beeper.vocab
    assert beeper._first[beeper.vocab["BEEP"]] and not beeper._first[VOCAB["TEST"]]


def TokenEnv_with(vocab):
    """A one-command task class over `vocab` (BEEP <eot>, answered OK)."""
    from jaxil.envs.tokens import Outcome, TokenEnv

    class _Task(TokenEnv):
        def __init__(self):
            super().__init__("tokens:beeper", num_agents=1, prompt_len=1,
                             commands=(Command("BEEP", answer=1),), num_features=1, max_turns=2,
                             score_weight=0.0)

        def _generate(self, key):
            return jnp.int32(0), jnp.full((1, 1), self.vocab["BEEP"], jnp.int32)

        def _features(self, task):
            return jnp.zeros((1, 1), jnp.int32)

        def _execute(self, task, cmd, cmd_len, ended):
            return Outcome(task, jnp.full((1, 1), self.vocab["OK"], jnp.int32), done=ended[0])

    _Task.vocab = vocab
    return _Task


def test_a_command_outside_the_vocabulary_is_refused_with_the_fix():
    """`Command("LOOK")` on the shipped vocabulary is refused when the task
    is built, naming the word and `VOCAB.extend`; so is a lookup of a
    missing word and a vocabulary that does not start with the specials.
    Kills the bare `KeyError: 'LOOK'` that did not say the vocabulary is
    the task's to extend."""
    class Lost(TokenEnv_with(VOCAB)):
        def __init__(self):
            from jaxil.envs.tokens import TokenEnv
            TokenEnv.__init__(self, "tokens:lost", 1, 1, (Command("LOOK"),), 1, 2, 0.0)

    with pytest.raises(ValueError, match=r"command 'LOOK' is not a word .*VOCAB\.extend"):
        Lost()
    with pytest.raises(KeyError, match=r"no token 'LOOK'.*VOCAB\.extend"):
        VOCAB["LOOK"]
    with pytest.raises(ValueError, match="already tokens"):
        VOCAB.extend(["EDIT"])
    from jaxil.envs.tokens import Vocab
    with pytest.raises(ValueError, match="starts with"):
        TokenEnv_with(Vocab(["BEEP", "<pad>", "<bos>", "<eot>", "<wait>", "OK"]))()


def test_the_docs_page_shows_this_task_verbatim():
    """The complete example of docs/concepts/custom-token-tasks.md is this
    helper's code, line for line (the page's snippet test runs it; these
    tests run it through the learners). Kills a docs example that drifts
    from the task the tests check."""
    page = (TESTS.parent / "docs" / "concepts" / "custom-token-tasks.md").read_text()
    start = page.index("```python\n") + len("```python\n")
    block = page[start:page.index("```\n", start)]
    helper = Path(nav_task.__file__).read_text()
    assert block == helper[helper.index("import jax\n"):]


# -- one registration, found by a fresh process ------------------------------------------


def test_the_task_is_found_by_its_id_and_by_module_callable():
    """The helper's one `register_token_task` call makes `tokens:nav` and its
    expert known; `helpers.nav_task:make_nav` builds it with knobs and its
    expert is found by the id it reports; a callable that builds something
    else is refused. Kills a registration that forgets the expert, and a
    `module:callable` id that drops the knobs."""
    env = envs.make("tokens:nav")
    policy, source, _ = envs.token_expert(env)
    assert source == "nav-look-go" and policy is not None
    small = envs.make("helpers.nav_task:make_nav", size=6)
    assert isinstance(small, NavEnv) and small.size == 6
    assert envs.token_expert(small)[1] == "nav-look-go"
    with pytest.raises(KeyError, match="has no 'make_nothing'"):
        envs.make("helpers.nav_task:make_nothing")
    with pytest.raises(ValueError, match="returned a JSONDecoder, not an environment"):
        envs.make("json:JSONDecoder")


def test_an_entry_point_plugin_registers_its_tasks(tmp_path, monkeypatch, private_registry):
    """A package that lists a module under the `jaxil.envs` entry points has
    its tasks found by id in a registry that never imported it. Kills a
    registry that reads no entry points (the id is unknown in a fresh
    process)."""
    (tmp_path / "navplugin.py").write_text(textwrap.dedent("""
        import functools
        from jaxil import envs
        from helpers.nav_task import NavEnv, nav_expert
        envs.register_token_task("plug:nav", functools.partial(NavEnv, env_id="plug:nav"),
                                 expert=nav_expert, source="plug-nav")
    """))
    dist = tmp_path / "navplugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: navplugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[jaxil.envs]\nnav = navplugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    monkeypatch.delitem(sys.modules, "navplugin", raising=False)
    env = envs.make("plug:nav")
    assert env.spec.env_id == "plug:nav" and envs.token_expert(env)[1] == "plug-nav"


def test_a_task_without_an_expert_is_refused_in_one_line(capsys, private_registry):
    """A token env registered without an expert: `jaxil lm sft` exits 1 with
    one line saying how to register one. Kills the `'NoneType' object is
    not subscriptable` crash of an expert lookup that returns None."""
    envs.register("tokens:bare", functools.partial(NavEnv, env_id="tokens:bare"))
    rc = main(["lm", "sft", "--env", "tokens:bare", "--demos", "4", "--no-progress"])
    assert rc == 1
    line = _one_error_line(capsys)
    assert "tokens:bare has no expert: register one with" in line
    assert "register_token_task" in line


# -- the learners read <eot> / <wait> from the environment ----------------------------------


class _ForeignTokenEnv:
    """A token environment not built on TokenEnv: `<eot>` is token 5."""

    token_width, max_context, cmd_width = 2, 16, 2

    def __init__(self, eot_token=5, wait_token=6):
        self.spec = EnvSpec(env_id="foreign:tokens", num_agents=1, obs_dim=2, state_dim=1,
                            action=DiscreteActions(num_actions=8), max_steps=6, has_win=True)
        if eot_token is not None:
            self.eot_token, self.wait_token = eot_token, wait_token


def test_turns_are_counted_with_the_environments_eot():
    """On an environment whose `<eot>` is 5 (not the shipped 2), the expert
    cost accounting counts turns at the 5s; one without `eot_token` is
    refused by the type check in one line. Kills an algorithm that reads
    `<eot>` from the module (3 turns counted at the 2s instead of 2)."""
    env = _ForeignTokenEnv()
    actions = np.array([[[4], [5], [2], [2], [5], [2]]], np.int32)  # [E=1, T=6, N=1]
    demos = TokenEpisodes(
        obs=jnp.zeros((1, 6, 1, 2)), avail=jnp.ones((1, 6, 1, 8), bool),
        actions=jnp.asarray(actions), mask=jnp.ones((1, 6), bool), won=jnp.ones((1,)),
        episode_return=jnp.ones((1,)), env_id="foreign:tokens", eot=5, wait=6)
    acc = TI.demo_accounting(env, demos)
    assert int(acc["turns"][-1]) == 2 and int(acc["tokens"][-1]) == 6
    with pytest.raises(ValueError, match=r"foreign:tokens has no valid `eot_token`"):
        token_specials(_ForeignTokenEnv(eot_token=None))
    with pytest.raises(ValueError, match="both 5"):
        token_specials(_ForeignTokenEnv(eot_token=5, wait_token=5))
    with pytest.raises(ValueError, match="no valid `eot_token`"):
        TI.run(_ForeignTokenEnv(eot_token=None), None, None, [("bc", {})], seeds=1)


# -- the task check ---------------------------------------------------------------------


def test_check_token_task_passes_nav_and_names_a_broken_expert():
    """`check_token_task` passes `tokens:nav` (expert ≥ 0.95, random ≤ 0.1,
    takeover ≥ 0.9, a good share of switches mid-command) and lists the
    failure of an expert that STOPs at once (the start is never the
    target, so it never wins). Kills a check that does not look at the
    expert's own wins or never hands over mid-command. (One compiled
    program: the broken expert is the same function with `params` True.)"""
    env = envs.make("tokens:nav")
    good = nav_expert(env)

    def expert(broken, obs, avail, key):
        p = env.privileged(obs)
        stop = jnp.where(p.cmd_len == 0, nav_task.STOP, env.eot_token)
        return jnp.where(broken, stop, good.act(None, obs, avail, key, None)[0]).astype(jnp.int32)

    check = functools.partial(check_token_task, env, expert, episodes=150,
                              final_words=("STOP",))
    report = check(jnp.bool_(False))
    assert report.ok, str(report)
    assert report.expert_success >= 0.95 and report.random_success <= 0.1
    assert report.takeover_success >= 0.9 and report.takeover_episodes > 20
    assert report.mid_command > 0.2 and report.illegal_expert_tokens == 0
    assert 0 < report.max_context_used <= env.max_context

    bad = check(jnp.bool_(True))
    assert not bad.ok and bad.expert_success == 0.0
    assert any("the expert wins 0.000" in p for p in bad.problems), bad.problems


# -- budgets ----------------------------------------------------------------------------------


def test_a_regime_below_its_budget_gets_one_warning_with_the_numbers():
    """772 of 900 tokens with 20-token episodes is warned about in one line
    naming both numbers and --episodes-per-round; 890 of 900 (less than an
    episode short) is not. Kills a warning that never fires, or fires on
    the rounding of whole episodes."""
    table = [dict(regime="oec@900", seeds=4, expert_tokens_mean=772.0),
             dict(regime="bc@900", seeds=4, expert_tokens_mean=890.0)]
    lines = TI.budget_warnings(table, {"oec@900": 900, "bc@900": 900}, 20.0,
                               TI.TokenInteractiveConfig())
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "oec@900 spent 772 of its 900" in lines[0] and "--episodes-per-round" in lines[0]
    text = TI.format_table({"regimes": table, "budget_warnings": lines, "reference": []})
    assert text.splitlines()[-1].startswith("warning: oec@900 spent 772")


def test_a_regime_whose_rounds_bought_nothing_is_named_with_its_allowance():
    """OPD at a budget of 2 expert episodes: the 28-token demonstration is all
    it spent, though 28 more were left for its 2 rounds (14 a round), less
    than one expert episode short, so the shortfall warning stays silent.
    The run must still say its rounds bought nothing, with the allowance
    and the fix; a regime that bought something past its demonstration, or
    one whose budget is only its demonstration, gets no such line, nor does
    BC, whose rounds have no allowance. Kills a check that compares against
    the budget instead of the demonstrations' cost, that ignores the
    demonstration cost, or that ignores the rounds' allowance."""
    table = [dict(regime="opd-x2", seeds=1, expert_tokens_mean=28.0),
             dict(regime="bc-x2", seeds=1, expert_tokens_mean=54.0),
             dict(regime="bc-x1", seeds=1, expert_tokens_mean=28.0)]
    budgets = {"opd-x2": 56, "bc-x2": 56, "bc-x1": 28}
    cfg = TI.TokenInteractiveConfig(rounds=2)
    assert TI.budget_warnings(table, budgets, 28.0, cfg) == []
    lines = TI.budget_warnings(table, budgets, 28.0, cfg,
                               {"opd-x2": 28.0, "bc-x2": 28.0, "bc-x1": 28.0})
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith("opd-x2 bought no expert tokens in its rounds")
    assert "cost 28 of its 56" in lines[0] and "about 14 tokens" in lines[0]
    assert "--rounds" in lines[0]
    # BC buys its whole budget as demonstrations: whole episodes cost 107 of
    # its 112 and its rounds have nothing to buy with, so no line (a false
    # alarm on every BC run before the rounds' allowance was consulted).
    bc = [dict(regime="bc-x4", seeds=4, expert_tokens_mean=107.0)]
    assert TI.budget_warnings(bc, {"bc-x4": 112}, 28.0, cfg, {"bc-x4": 107.0},
                              {"bc-x4": 0}) == []
    assert len(TI.budget_warnings(bc, {"bc-x4": 112}, 28.0, cfg, {"bc-x4": 107.0},
                                  {"bc-x4": 84})) == 1


# -- loading saved students (--expert DIR, --sft DIR) -----------------------------------------


def _students(tmp_path, env_id="tokens:repair", knobs=None, seeds=(0,), edit=None):
    """A students directory as `jaxil lm sft --out` writes it, from freshly
    initialised parameters of `env_id` at its default knobs; `edit` then
    changes students.json."""
    from jaxil.cli.lm import _save_students
    from jaxil.algorithms.lm.sft import SFTConfig
    from jaxil.nn.transformer import TransformerPolicy, config_for_env

    env = envs.make(env_id)
    policy = TransformerPolicy(config_for_env(env, "tiny"))
    params = jax.vmap(policy.init)(jax.random.split(jax.random.PRNGKey(0), len(seeds)))
    out = tmp_path / "S1"
    _save_students(str(out), env_id, knobs or {}, SFTConfig(), list(seeds), params)
    if edit is not None:
        meta = json.loads((out / "students.json").read_text())
        edit(meta)
        (out / "students.json").write_text(json.dumps(meta))
    return str(out)


def _interactive_bc(s1, *extra):
    return main(["lm", "interactive", "bc", "--env", "tokens:repair", "--budget", "2000",
                 "--expert", s1, "--no-progress", *extra])


def test_students_of_another_shape_are_refused_in_one_line(tmp_path, capsys):
    """Students trained at the default knobs whose students.json was edited
    to `faults=5`: `--expert` exits 1 with one line naming `pos_embed` and
    both shapes. Kills the 49-line ScopeParamShapeError of loading
    parameters without checking them against the config."""
    s1 = _students(tmp_path, edit=lambda m: m.update(knobs={"faults": 5}))
    assert _interactive_bc(s1, "--task-knob", "faults=5") == 1
    line = _one_error_line(capsys)
    assert "pos_embed" in line and "(162, 64)" in line and "(226, 64)" in line, line


@pytest.mark.parametrize("field", ["knobs", "size", "seeds"])
def test_a_students_json_field_missing_or_wrong_is_refused_in_one_line(tmp_path, capsys, field):
    """students.json without a field, or with one of the wrong kind, is
    refused in one line naming the file and the field, by `--expert` and
    by `align --sft`. Kills `jaxil lm: error: knobs` (a bare KeyError)."""
    s1 = _students(tmp_path, edit=lambda m: m.pop(field))
    assert _interactive_bc(s1) == 1
    line = _one_error_line(capsys)
    assert f"students.json has no {field}" in line and "jaxil lm sft" in line, line
    rc = main(["lm", "align", "--env", "tokens:repair", "--sft", s1, "--reward", "r_c",
               "--no-progress"])
    assert rc == 1 and f"has no {field}" in _one_error_line(capsys)
    wrong = {"knobs": [5], "size": "huge", "seeds": []}[field]
    s2 = _students(tmp_path / "b", edit=lambda m: m.update({field: wrong}))
    assert _interactive_bc(s2) == 1
    assert f"field `{field}` is {wrong!r}" in _one_error_line(capsys)


def test_an_expert_seed_past_the_students_is_refused(tmp_path, capsys):
    """`--expert-seed 2` on a file of one student exits 1 in one line; so
    does a students.json that lists more seeds than the parameters hold.
    Kills training against a student that does not exist."""
    s1 = _students(tmp_path)
    assert _interactive_bc(s1, "--expert-seed", "2") == 1
    assert "--expert-seed 2" in _one_error_line(capsys)
    s2 = _students(tmp_path / "b", edit=lambda m: m.update(seeds=[0, 1, 2]))
    assert _interactive_bc(s2, "--expert-seed", "2") == 1
    line = _one_error_line(capsys)
    assert "(1 vs 3 students)" in line, line


# -- the whole path in a fresh process ---------------------------------------------------


@pytest.mark.slow
def test_jaxil_lm_runs_a_users_task_in_a_fresh_process(tmp_path):
    """`jaxil lm sft` and `jaxil lm interactive oec` on
    `helpers.nav_task:make_nav` in new processes: both exit 0, the
    students are saved, and the results table has the untrained-student
    and SFT-start rows and the regime (XLA level 0, tiny sizes). Kills a
    CLI that knows only the shipped ids or crashes on the task's words."""
    env = dict(os.environ, PYTHONPATH=str(TESTS),
               XLA_FLAGS="--xla_backend_optimization_level=0")
    run = lambda *a: subprocess.run([sys.executable, "-m", "jaxil.cli", "lm", *a, "--no-progress"],
                                    env=env, capture_output=True, text=True, timeout=600)
    sft = run("sft", "--env", "helpers.nav_task:make_nav", "--demos", "16", "--heldout", "4",
              "--updates", "4", "--eval-every", "4", "--eval-episodes", "4",
              "--batch-episodes", "4", "--out", str(tmp_path / "sft"))
    assert sft.returncode == 0, sft.stderr
    assert (tmp_path / "sft" / "students.json").is_file()
    oec = run("interactive", "oec", "--env", "helpers.nav_task:make_nav", "--budget", "300",
              "--rounds", "1", "--episodes-per-round", "4", "--updates-per-round", "2",
              "--sft-tokens", "60", "--sft-updates", "2", "--batch-episodes", "4",
              "--eval-episodes", "4", "--out", str(tmp_path / "oec"))
    assert oec.returncode == 0, oec.stderr
    lines = oec.stdout.splitlines()
    assert any(line.startswith("untrained student") for line in lines), oec.stdout
    assert any(line.startswith("SFT start (round 0)") for line in lines), oec.stdout
    assert any(line.startswith("oec@300") for line in lines), oec.stdout


@pytest.mark.slow
@pytest.mark.parametrize("eid", ["tokens:repair", "tokens:arith", "tokens:exchange"])
def test_the_shipped_tasks_pass_the_public_check(eid):
    """The shipped tasks and their registered experts pass `check_token_task`
    at its defaults (tests/envs/test_token_envs.py checks the same on its own
    shared program, cheaper). Kills a shipped expert or task that breaks
    the contract a user's task is held to."""
    env = envs.make(eid)
    report = check_token_task(env, envs.token_expert(env)[0])
    assert report.ok, str(report)
