"""The regimes study's helpers (experiments/misodice_regimes/run.py).

Each test names the bug it kills. The study's claims rest on three things:
each cell holds exactly the expert trajectories it says (nested across
counts, the others all from one source); its learners are the library's
defaults (s0 uniform over trajectories, ...); and its weight / AUC
diagnostics measure what the learner's update uses.
"""

import dataclasses
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.misodice_regimes.run import (DICE, VARIANTS, auc, cell_indices, dice_weight_fn,  # noqa: E402
                                              make_cell_learner, weight_stats)
from jaxil.learners import make_learner  # noqa: E402

from fast_compile import fast_call  # noqa: E402
from test_misodice_fidelity import DATA, SPEC  # noqa: E402

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


def test_weight_stats_and_auc_by_hand():
    """Kills an ESS without the square of the sum, an expert share over the
    count instead of the weight, a max over all batches instead of the
    median per batch, and an AUC with the classes swapped."""
    w = np.array([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0], [2.0, 2.0, 0.0, 0.0]])
    truth = np.array([[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0]], bool)
    s = weight_stats(w, truth)
    assert s["weight_max"] == pytest.approx(2.0)  # median of 1, 4, 2
    assert s["ess"] == pytest.approx((1.0 + 0.25 + 0.5) / 3)
    assert s["expert_share"] == pytest.approx((0.25 + 1.0 + 0.5) / 3)
    assert s["expert_fraction"] == pytest.approx(0.25)
    per_agent = weight_stats(np.stack([w, w], -1), truth)
    assert per_agent == pytest.approx(s)
    assert auc(np.array([3.0, 1.0, 2.0, 0.0]), np.array([1, 0, 1, 0], bool)) == 1.0
    assert auc(np.array([3.0, 1.0, 2.0, 0.0]), np.array([0, 1, 0, 1], bool)) == 0.0
    assert auc(np.array([1.0, 1.0]), np.array([1, 0], bool)) == 0.5


@pytest.mark.slow  # four XLA compiles: over the default suite's few seconds on 2 cores
@pytest.mark.parametrize("algo", ["misodice", "indd"])
def test_diagnostic_weights_are_the_updates_weights(algo):
    """Kills diagnostics that drift from the learner: weights from the wrong
    sign of the reward, without the ``done`` mask, from the local values
    instead of the mixed ones (MisoDICE), or from a team sum for INDD. The
    largest weight and the mean union reward must equal the metrics the
    learner's own update reports on the same batch."""
    learner = make_learner(algo, SPEC, hidden=(8,), mixer_hidden=4, batch_size=64)
    state = learner.init(jax.random.PRNGKey(1))
    batch = learner.sample(jax.random.PRNGKey(2), DATA)
    _, metrics = fast_call(learner.update, state, batch)
    u = batch[1]
    one = jax.tree.map(lambda x: x[None], u)  # one group [1, B, ...]
    logit, w = fast_call(dice_weight_fn(learner, SPEC), state.params, state.hparams, one)
    np.testing.assert_allclose(np.max(w), metrics["weight_max"], rtol=1e-5)
    np.testing.assert_allclose(np.mean(logit), metrics["reward_union"], rtol=1e-5, atol=1e-6)
    assert np.asarray(w).shape == ((1, 64, SPEC.num_agents) if algo == "indd" else (1, 64))


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
