"""The ``jaxil`` command's grammar: one tree, shared flags declared once,
sweepable names from the hyper-parameter classes.

Parser-only checks (nothing trains). Plausible bugs they catch: a command
group that re-declares ``--resume`` without the exclusive ``--overwrite``; the
IRL family split again between top-level and nested commands, or an alias
dropped; a new learner hyper-parameter that ``jaxil sweep`` cannot vary
(``nu_gp_coef`` once was); a private argparse API creeping back in.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from jaxil.algorithms.offline import HPARAMS, SWEEPABLE
from jaxil.cli.main import build_parser
from jaxil.cli.train import _parse_grid

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


def test_the_irl_family_lives_under_irl_and_the_old_spellings_still_parse(parser):
    """``jaxil irl gail|airl|ppo`` are the commands; ``jaxil gail|airl`` parse
    to the same settings."""
    argv = ["--env", "mpe:simple_spread", "--demos", "d.npz", "--seeds", "3", "--out", "o"]
    nested = parser.parse_args(["irl", "gail", *argv])
    alias = parser.parse_args(["gail", *argv])
    drop = {"command", "irl_command", "func"}
    assert {k: v for k, v in vars(nested).items() if k not in drop} == \
        {k: v for k, v in vars(alias).items() if k not in drop}
    assert nested.method == "gail" and nested.seeds == 3
    ppo = parser.parse_args(["irl", "ppo", "--env", "mpe:simple_spread", "--reward-model", "r"])
    assert ppo.method == "ppo"
    assert parser.parse_args(["irl", "airl", *argv]).reward_form == "logit"


@pytest.mark.parametrize("argv", [
    ["train", "bc_union", "--dataset", "d"],
    ["interactive", "dagger", "--env", "e", "--budget", "10"],
    ["irl", "reward-model", "--dataset", "d", "--out", "o"],
    ["irl", "gail", "--env", "e", "--demos", "d"],
])
def test_run_directory_flags_read_alike_and_exclude_each_other(parser, argv, capsys):
    """Every command with a run directory takes ``--resume`` and
    ``--overwrite`` from the one declaration, and refuses both at once."""
    args = parser.parse_args(argv + ["--resume", "--no-progress"])
    assert args.resume and not args.overwrite and args.no_progress
    with pytest.raises(SystemExit) as e:
        parser.parse_args(argv + ["--resume", "--overwrite"])
    assert e.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_sweep_offers_every_hyper_parameter_of_every_learner(parser):
    """The sweep flags are the fields of the HParams classes, and a grid of
    ``nu_gp_coef`` parses."""
    fields = {f.name for cls in HPARAMS for f in dataclasses.fields(cls)}
    assert set(SWEEPABLE) == fields and "nu_gp_coef" in fields
    args = parser.parse_args(["sweep", "misodice", "--dataset", "d", "--nu-gp-coef", "0,1e-4",
                              "--alpha", "0.05"])
    assert _parse_grid(args) == {"alpha": [0.05], "nu_gp_coef": [0.0, 1e-4]}


def test_no_private_argparse_api_in_the_cli():
    """``argparse._SubParsersAction`` and friends are private."""
    bad = [f"{f.relative_to(ROOT)}" for f in (ROOT / "jaxil" / "cli").glob("*.py")
           if "argparse._" in f.read_text()]
    assert not bad, bad
