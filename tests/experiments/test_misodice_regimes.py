"""The regimes study's helpers (experiments/misodice_regimes/run.py).

Each test names the bug it kills. The study's claims rest on three things:
each cell holds exactly the expert trajectories it says (nested across
counts, the others all from one source); its learners are the library's
defaults (s0 uniform over trajectories, ...); and its weight / AUC
diagnostics measure what the learner's update uses.
"""

import dataclasses

import numpy as np
import pytest

from experiments.misodice_regimes.run import (DICE, VARIANTS, cell_indices, main,  # noqa: E402
                                              make_cell_learner, plan, reuse_rows, row_key)
from jaxil.runs.result_cache import ResultCache  # noqa: E402
from jaxil.algorithms.offline import make_learner  # noqa: E402

from helpers.data import FIDELITY_SPEC as SPEC  # noqa: E402

GROUPS = dict(expert=list(range(100, 300)), noisy=list(range(300, 1300)),
              teacher=list(range(1300, 2300)), random=list(range(2300, 3300)))


@pytest.mark.parametrize("source", ["noisy", "teacher", "random"])
def test_cell_holds_exactly_its_experts_and_one_source(source):
    """Kills a wrong expert subsample count (n ± 1, all 200, or a draw with
    replacement that repeats a trajectory), cells that are not nested
    (10 ⊄ 25: the counts would compare different experts), others taken
    from the wrong source or only partly, and a subsample that ignores
    the data seed."""
    prev = set()
    for n in (10, 25, 50, 100, 200):
        idx = cell_indices(GROUPS, n, source, data_seed=0)
        assert len(idx) == len(set(idx.tolist())) == n + 1000
        experts = set(idx.tolist()) & set(GROUPS["expert"])
        assert len(experts) == n
        assert set(idx.tolist()) - experts == set(GROUPS[source])
        assert prev <= experts  # nested
        prev = experts
        np.testing.assert_array_equal(idx, cell_indices(GROUPS, n, source, data_seed=0))
    other = set(cell_indices(GROUPS, 10, source, data_seed=1).tolist()) & set(GROUPS["expert"])
    assert other != set(cell_indices(GROUPS, 10, source, 0).tolist()) & set(GROUPS["expert"])
    # The same expert set for every source (BC(D_E) is shared between them).
    assert experts == set(cell_indices(GROUPS, 200, "random", 0).tolist()) & set(GROUPS["expert"])


@pytest.mark.parametrize("algo", ["bc_union", "bc_expert", *(a for a in DICE if a not in VARIANTS)])
def test_cell_learners_are_the_library_defaults(algo):
    """Kills the study overriding a default it claims to run: the s0 source
    (``init_sampling="transition"``, the length-weighted draw), the reward,
    the ν penalty, INDD's parameter sharing, the mixer size. Only the size
    settings (hidden, batch) may differ from ``make_learner``'s."""
    args = type("Args", (), dict(hidden=[16], batch_size=32))()
    got = make_cell_learner(algo, SPEC, args)
    want = make_learner(algo, SPEC)
    assert got.config == dataclasses.replace(want.config, hidden=(16,), batch_size=32)
    if algo in DICE:
        assert got.config.init_sampling == "trajectory"


@pytest.mark.parametrize("algo", sorted(VARIANTS))
def test_intervention_variants_change_one_setting(algo):
    """Kills an intervention row that changes more than it says (or
    nothing): a variant's config is its base learner's study config with
    only the named setting changed."""
    args = type("Args", (), dict(hidden=[16], batch_size=32))()
    base, changed, _ = VARIANTS[algo]
    got = make_cell_learner(algo, SPEC, args).config
    want = make_cell_learner(base, SPEC, args).config
    assert got != want
    assert got == dataclasses.replace(want, **changed)


def _reuse_fixture(tmp_path):
    """An earlier run's ``results.json`` (two settings, three rows of one
    environment, as ``Env.row`` writes them) and the matching cache."""
    settings = dict(seeds=4, points=[250, 500, 1000], hidden=[64, 64], pool="abc")
    args = type("Args", (), dict(long_cell=("teacher", 10), sources=["noisy", "teacher", "random"]))()
    rows = [
        dict(curve=[1], seconds=1.0, env="smax:3m", source="teacher", experts=10,
             labels="ground_truth", algo="misodice", shared_from=None, long=True),
        dict(curve=[2], seconds=2.0, env="smax:3m", source="noisy", experts=25,
             labels="ground_truth", algo="bc_expert", shared_from="teacher", long=False),
        dict(curve=[3], seconds=3.0, env="smax:3m", source="teacher", experts=10,
             labels="phase1", algo="misodice", shared_from=None, long=False,
             phase1=dict(metrics=dict(precision=0.1), per_seed=[], seconds=9.0)),
    ]
    prev = dict(seeds=4, points=[250, 500, 1000], hidden=[64, 64],
                envs={"smax-3m": dict(pool_id="abc", rows=rows)})
    cache = ResultCache(tmp_path / "cache.json", settings, {"row:": tuple(settings)})
    return prev, cache, settings, args


def test_reuse_puts_rows_under_the_keys_the_plan_reads(tmp_path):
    """Kills ``--reuse`` keying a long row without ``+long`` (the 4000-update
    curve would stand in for the 1000-update row, or be trained again), the
    shared BC(D_E) keyed by the source that read it instead of its owner
    (the plan would train it again), overwriting a row the cache already
    holds, the ``Env.row`` fields left in the cached value, and Phase-1
    metrics passed off as labels (a new row on that cell would then train
    on no labels instead of fitting Phase 1 again)."""
    prev, cache, settings, args = _reuse_fixture(tmp_path)
    mine = row_key(args, "teacher", 10, "phase1", "misodice")
    cache.put(mine, dict(curve=["fresh"], seconds=0.0))
    assert reuse_rows(cache, prev, "smax-3m", "abc", settings, args) == 2
    assert cache.get("row:teacher:10:ground_truth+long:misodice") == dict(curve=[1], seconds=1.0)
    assert cache.get("row:teacher:25:ground_truth:bc_expert") == dict(curve=[2], seconds=2.0)
    assert row_key(args, "random", 25, "ground_truth", "bc_expert") == "row:teacher:25:ground_truth:bc_expert"
    assert cache.get(mine)["curve"] == ["fresh"]
    assert "labels" not in cache.get("p1:teacher:10")
    assert reuse_rows(cache, prev, "smax-2s3z", "abc", settings, args) == 0  # not in the file


def test_reuse_refuses_other_settings_and_files(tmp_path, capsys):
    """Kills ``--reuse`` mixing rows of another pool or other settings into
    the grid silently (a 2-seed row beside 4-seed ones), and a corrupt or
    foreign file ending in a traceback instead of one line."""
    prev, cache, settings, args = _reuse_fixture(tmp_path)
    with pytest.raises(SystemExit, match="pool"):
        reuse_rows(cache, prev, "smax-3m", "other", dict(settings, pool="other"), args)
    with pytest.raises(SystemExit, match="used seeds 4, this one 2"):
        reuse_rows(cache, prev, "smax-3m", "abc", dict(settings, seeds=2), args)
    assert [k for k in cache.data if k.startswith("row:")] == []  # nothing half taken
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit, match="cannot read it as JSON"):
        main(["--reuse", str(bad)])
    bad.write_text("[]")
    with pytest.raises(SystemExit, match="has no 'envs'"):
        main(["--reuse", str(bad)])


def test_plan_runs_the_papers_setting_first_in_tier_d():
    """Kills a tier-D order that leaves the 200-expert cells (the paper's
    own 200 + 1000 setting) to the end of a ``--budget-min`` cut, and a plan
    that drops or repeats a row."""
    args = type("Args", (), dict(expert_counts=[10, 25, 50, 100, 200], intervention=False,
                                 sources=["noisy", "teacher", "random"], long_cell=("teacher", 10),
                                 envs=["a", "b"], p1_cells=[("teacher", 10)]))()
    tasks = plan(args)
    assert len(tasks) == len(set(tasks))
    d = [t for t in tasks if t[0] == "D"]
    assert [t[3] for t in d[:18]] == [200] * 18  # 3 sources × 2 envs × 3 learners
    assert {t[5] for t in d[:18]} == {"bc_union", "misodice_vdn", "indd"}
    assert [t[4] for t in d[-4:]] == ["phase1"] * 4
    c = [t for t in tasks if t[0] == "C"]
    assert len(c) == 2 * 2 * (15 - 2)  # every non-A cell, MisoDICE and BC(D_E), both envs
