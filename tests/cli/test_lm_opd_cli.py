"""`jaxil lm interactive opd`: what the command hands the interactive
program (the expert LM's distribution, GKD's beta) and its one-line
refusals. Nothing here compiles a round."""

import jax
import pytest

from jaxil import envs
from jaxil.algorithms.lm import interactive as TI
from jaxil.cli.main import main
from jaxil.nn.transformer import TransformerPolicy, config_for_env

from helpers.fast_compile import fast_call

ARITH = ["--env", "tokens:arith", "--task-knob", "num_ops=1", "--budget", "2000",
         "--no-progress"]


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("kind", ["scripted", "transcript"])
def test_opd_with_an_expert_that_only_acts_is_refused_in_one_line(tmp_path, capsys, kind):
    """`opd --expert scripted` (or `transcript`) exits 1 with check_expert_lm's
    one line and leaves no run directory. Kills `opd` running against an
    expert with no distribution (a crash deep in the compiled round, or a
    silent fallback to its actions as one-hot targets), and a refusal that
    comes only after the run directory is opened."""
    out = tmp_path / "run"
    assert main(["lm", "interactive", "opd", *ARITH, "--expert", kind, "--out", str(out)]) == 1
    line = _one_error_line(capsys)
    assert "needs an expert LM" in line and "--expert SFT_DIR" in line, line
    assert not out.exists()


class _Called(Exception):
    pass


@pytest.fixture(scope="module")
def students(tmp_path_factory):
    """A `jaxil lm sft --out` directory holding one random tiny student of
    `tokens:arith` with one operation."""
    from jaxil.algorithms.lm.sft import SFTConfig
    from jaxil.cli.lm import _save_students

    env = envs.make("tokens:arith", num_ops=1)
    policy = TransformerPolicy(config_for_env(env, "tiny"))
    params = fast_call(jax.vmap(policy.init), jax.random.split(jax.random.PRNGKey(0), 1))
    out = tmp_path_factory.mktemp("opd") / "expert"
    _save_students(str(out), env.spec.env_id, {"num_ops": 1}, SFTConfig(), [0], params)
    return str(out)


@pytest.mark.parametrize("flag, beta", [([], 1.0), (["--beta", "0.3"], 0.3)])
def test_opd_hands_the_program_the_expert_lm_and_gkd_beta(monkeypatch, students, flag, beta):
    """`opd --expert SFT_DIR [--beta B]` hands `run` the expert as a
    TransformerPolicy (a distribution, which `check_expert_lm` accepts) and
    one opd regime with GKD's beta B (default 1, the reverse KL). Kills a
    `--beta` that is parsed but not passed, a default other than the
    reverse KL, and the expert LM handed over as its greedy policy (which
    only acts)."""
    seen = {}

    def fake_run(env, expert, expert_params, regimes, **kw):
        seen.update(expert=expert, regimes=regimes, name=kw.get("expert_name"))
        raise _Called

    monkeypatch.setattr(TI, "run", fake_run)
    with pytest.raises(_Called):
        main(["lm", "interactive", "opd", *ARITH, "--expert", students, *flag])
    assert isinstance(seen["expert"], TransformerPolicy)
    [(name, regime)] = seen["regimes"]
    assert name == "opd@2000" and regime[TI.DISTILL_BETA] == beta
    assert seen["name"].startswith("lm:tiny:")


def test_beta_of_another_method_or_out_of_range_is_refused_in_one_line(capsys):
    """`--beta` with DAgger (whose expert probability is `--beta0`) and a
    method knob with `opd` (which has no switch) exit 1 in one line; a beta
    outside [0, 1] exits 2 at parsing. Kills a `--beta` silently ignored by
    the other methods and OPD silently dropping the knobs it has no use for."""
    assert main(["lm", "interactive", "dagger", *ARITH, "--beta", "0.5"]) == 1
    assert "--beta0" in _one_error_line(capsys)
    assert main(["lm", "interactive", "opd", *ARITH, "--switch", "fixed"]) == 1
    assert "opd takes no switch_kind" in _one_error_line(capsys)
    with pytest.raises(SystemExit) as info:
        main(["lm", "interactive", "opd", *ARITH, "--beta", "1.5"])
    assert info.value.code == 2


def test_lr_sets_the_sft_start_and_the_rounds(monkeypatch):
    """`jaxil lm interactive --lr X` hands `run` a configuration whose
    learning rate (the SFT start's) is X and a regime whose `lr` (the
    rounds') is X; without `--lr` both are the defaults. Kills an `--lr`
    that reaches the regime only, which fine-tuned a pretrained student's
    SFT start at the from-scratch default (1e-3)."""
    seen = {}

    def fake_run(env, expert, expert_params, regimes, **kw):
        seen.update(config=kw["config"], regimes=regimes)
        raise _Called

    monkeypatch.setattr(TI, "run", fake_run)
    with pytest.raises(_Called):
        main(["lm", "interactive", "bc", *ARITH, "--lr", "0.0002"])
    [(_, regime)] = seen["regimes"]
    assert seen["config"].learning_rate == 0.0002 and regime["lr"] == 0.0002
    with pytest.raises(_Called):
        main(["lm", "interactive", "bc", *ARITH])
    [(_, regime)] = seen["regimes"]
    assert seen["config"].learning_rate == TI.TokenInteractiveConfig().learning_rate
    assert regime["lr"] == TI.TokenInteractiveConfig().learning_rate
