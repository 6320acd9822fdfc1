"""`jaxil quickstart` and `jaxil lm quickstart`.

The default suite runs the SMAX quickstart's learning demo on a handful of
episodes with its training stubbed (the wiring: three learners, their labels,
the line that says what the table means); a slow test trains them for real on a
handful of episodes and updates. It also checks the LM quickstart's settings
and its refusal of a budget below the SFT start without training. The full
runs, a few minutes each, are marked slow.
"""

from __future__ import annotations

import re

import pytest

from jaxil.cli import lm_quickstart, quickstart
from jaxil.cli.main import main
from tests.helpers.data import make_episodes

ROW = r"^{}\s+{}\s+(-?\d+\.\d+) ± (\d+\.\d+)\s+(\d+\.\d+) ± (\d+\.\d+)"


def test_the_learning_demo_prints_bc_on_the_experts_beside_bc_and_misodice(capsys,
                                                                           monkeypatch):
    """The demo's table and closing line, its rollouts replaced by random
    episodes and its training by a stub that records each learner (each its own
    score) and the data: the real runs are the slow tests below. Bugs caught:
    BC(D_E) left out of the table (the reference the comparison needs), BC(D_E)
    trained on all the data, a learner printed under another's label, and the
    meaning line dropped or naming the wrong expert count."""
    import jaxil.algorithms.offline as O
    import jaxil.algorithms.offline.train as T

    made, trained, real = {}, [], O.make_learner

    def make(name, spec, **kw):
        learner = real(name, spec, **kw)
        made[id(learner)] = name
        return learner

    def stub(learner, env, data, *, runs, **kw):
        trained.append((made[id(learner)], data))
        score = float(len(trained))
        return {"points": [dict(grid={}, return_mean=score, return_std=0.5, win_mean=score / 10,
                                win_std=0.0)], "wall_seconds": 1.0}

    monkeypatch.setattr(O, "make_learner", make)
    monkeypatch.setattr(T, "train", stub)
    monkeypatch.setattr(quickstart.envs, "run_episodes",
                        lambda env, pol, params, key, n: make_episodes(env.spec, n, seed=n))
    rows = quickstart.learning_demo(2, 1, 0, expert_episodes=3, poor_episodes=3,
                                    eval_episodes=2)
    out = capsys.readouterr().out
    assert [name for name, _ in trained] == ["bc_union", "misodice", "bc_expert"]
    assert trained[0][1] is trained[2][1]  # one dataset: D_E is its expert-labelled part
    assert re.search(r"^BC\(D_E\)\s+1\s+3\.000 ± 0\.500\s+0\.300 ± 0\.000", out, re.M), out
    assert [r["policy"] for r in rows] == ["bc_union", "misodice", "bc_expert"]
    for label in ("BC\\(D_U\\)", "MisoDICE", "BC\\(D_E\\)"):
        assert re.search(ROW.format(label, 1), out, re.M), (label, out)
    assert "3 expert + 3 poor episodes" in out
    assert out.strip().splitlines()[-1] == (
        "(± is the population std over seeds.) BC(D_E), BC on the 3 clean expert episodes "
        "alone, is the reference: with clean expert labels, use them; MisoDICE is the tool "
        "when expert labels are few or the mixed data is all you have.")


def test_the_lm_quickstart_settings_and_its_budget_error(capsys):
    """No training. Bugs caught: quickstart settings the regime check
    refuses (the command would fail after its compile), BC missing from the
    comparison, and a budget below the SFT start reaching the engine
    instead of a one-line error with the fix."""
    from jaxil.algorithms.interactive.config import check_regime

    regimes = lm_quickstart.regimes("oec", lm_quickstart.BUDGET)
    assert [n for n, _ in regimes] == ["bc", "oec"]
    for _, h in regimes:
        check_regime(h, lm_quickstart.config().sft_tokens)
    assert main(["lm", "quickstart", "--budget", "100"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["jaxil lm: error: --budget 100 is below the SFT start's 200 expert tokens; "
                   "pass --budget 200 or more"]


@pytest.mark.slow
def test_the_learning_demo_trains_the_three_learners(capsys):
    """The demo on 3 + 3 episodes and 2 real updates. Bug caught: a learner
    name or keyword the offline trainer no longer accepts."""
    rows = quickstart.learning_demo(2, 1, 0, expert_episodes=3, poor_episodes=3,
                                    eval_episodes=2)
    assert [r["policy"] for r in rows] == ["bc_union", "misodice", "bc_expert"]
    out = capsys.readouterr().out
    for label in ("BC\\(D_U\\)", "MisoDICE", "BC\\(D_E\\)"):
        assert re.search(ROW.format(label, 1), out, re.M), (label, out)


@pytest.mark.slow
def test_the_lm_quickstart_runs(capsys):
    """The whole `jaxil lm quickstart` (about 2–3 minutes on 2 CPU cores).
    Bug caught: a quickstart that no longer runs, or whose table lost a
    regime or its wall time."""
    assert main(["lm", "quickstart", "--no-progress"]) == 0
    out = capsys.readouterr().out
    for name in ("bc", "oec"):
        assert re.search(rf"^{name}\s+2\s+\d+\.\d+\s+\d\.\d+ ± \d\.\d+", out, re.M), out
    assert re.search(r"wall time \d+ s$", out.strip()), out


@pytest.mark.slow
def test_the_quickstart_runs(capsys):
    """The whole `jaxil quickstart` (a few minutes). Bug caught: the
    documented command fails, or its table lost BC(D_E)."""
    assert main(["quickstart"]) == 0
    out = capsys.readouterr().out
    assert re.search(ROW.format("BC\\(D_E\\)", 4), out, re.M), out
