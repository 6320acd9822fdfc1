"""The MisoDICE table's per-row settings (experiments/misodice_table/run.py).

A row that departs from the table's recipe, budget or observation scaling
must say so under the table, and every per-row override must name an
environment the recipes know, or it silently never applies.
"""

from experiments.misodice_table.run import KIND, ROW_OVERRIDES, own_rows, row_setting
from jaxil.collect.recipes import RECIPE_ENVS


def _row(env, kind=KIND, updates=2000, **extra):
    return dict(env=env, recipe=f"{env.replace(':', '-')}/{kind}", updates=updates, **extra)


def test_every_override_names_a_recipe_environment():
    """Kills a misspelt key in ROW_OVERRIDES (e.g. 'mamujoco-hopper3x1'):
    its row would run unstandardised, or on the plain recipe, without a
    word."""
    assert set(ROW_OVERRIDES) <= set(RECIPE_ENVS)
    for name in ("mamujoco-hopper_3x1", "mamujoco-halfcheetah_6x1"):
        assert ROW_OVERRIDES[name]["standardize_obs"] is True


def test_standardised_and_other_recipe_rows_are_named_under_the_table():
    """Kills a footer that omits a standardised MaMuJoCo row (the condition
    on the recipe alone), one that names rows standardised only by a global
    ``--standardize-obs`` as the row's own setting, and a budget printed
    for a row on the table's recipe."""
    hopper = _row("mamujoco:hopper_3x1", standardize_obs=True)
    mpe = _row("mpe:simple_spread_continuous", kind="mix-1000e-5000p-dart0.8", updates=20000)
    plain_mpe = _row("mpe:simple_spread_continuous")
    smax = _row("smax:3m", standardize_obs=True)   # a global --standardize-obs
    raw_hopper = _row("mamujoco:hopper_3x1")        # --plain-rows
    named = {e: r for e, r, _ in own_rows([hopper, mpe, smax, raw_hopper, plain_mpe])}
    assert set(named) == {"mamujoco:hopper_3x1", "mpe:simple_spread_continuous"}
    assert row_setting(hopper) == "observations standardised"
    assert row_setting(hopper, short=True) == "standardised"
    assert row_setting(mpe) == "dataset `mpe-simple_spread_continuous/mix-1000e-5000p-dart0.8`, 20000 updates"
    assert own_rows([raw_hopper, plain_mpe, smax]) == []


def test_rows_changed_alike_are_named_once():
    """Kills a footer that repeats the same reason for every MaMuJoCo row, or
    one that merges rows changed in different ways."""
    from experiments.misodice_table.run import _group_own_rows

    rows = [_row("mamujoco:hopper_3x1", standardize_obs=True),
            _row("mamujoco:halfcheetah_6x1", standardize_obs=True),
            _row("mpe:simple_spread_continuous", kind="mix-1000e-5000p-dart0.8", updates=20000)]
    groups = _group_own_rows(rows)
    assert sorted(groups.values()) == [["mamujoco:hopper_3x1", "mamujoco:halfcheetah_6x1"],
                                       ["mpe:simple_spread_continuous"]]
