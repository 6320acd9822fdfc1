"""`jaxil lm sft --expert scripted|transcript`: which expert demonstrates.
Nothing here compiles: the demonstrations are intercepted."""

import pytest

from jaxil import envs
from jaxil.algorithms.lm import sft
from jaxil.cli.main import main


class _Called(Exception):
    pass


@pytest.mark.parametrize("flag, kind", [([], "scripted"), (["--expert", "transcript"],
                                                          "transcript")])
def test_the_demonstrations_come_from_the_named_expert(monkeypatch, flag, kind):
    """The policy handed to `collect_demos` is `token_expert(env, kind)`'s,
    scripted by default. Catches `--expert` parsed but not passed on (the
    transcript expert's demonstrations silently the privileged ones), and
    the two kinds swapped."""
    made = {}
    real = envs.token_expert

    def token_expert(env, kind="scripted"):
        made[kind] = real(env, kind)[0]
        return made[kind], *real(env, kind)[1:]

    def collect_demos(env, policy, params, key, n):
        made["demonstrator"] = policy
        raise _Called

    monkeypatch.setattr(envs, "token_expert", token_expert)
    monkeypatch.setattr(sft, "collect_demos", collect_demos)
    with pytest.raises(_Called):
        main(["lm", "sft", "--env", "tokens:arith", "--task-knob", "num_ops=1", *flag,
              "--no-progress"])
    assert made["demonstrator"] is made[kind]
