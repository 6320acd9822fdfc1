"""DICE weight diagnostics (:mod:`jaxil.algorithms.offline.diagnostics`).

Each test names the bug it kills: the statistics by hand, and the weights
the learner's own update uses.
"""

import jax
import numpy as np
import pytest

from jaxil.algorithms.offline import make_learner
from jaxil.algorithms.offline.diagnostics import (auc, dice_diagnostics, diagnostic_batches,
                                                  weight_stats)

from helpers.fast_compile import fast_call, fast_compile
from helpers.data import FIDELITY_DATA as DATA, FIDELITY_SPEC as SPEC


def _random_params(learner, seed):
    """Random float32 parameters in the tree of ``learner.init``'s (shapes from
    ``jax.eval_shape``): kernels N(0, 1/fan_in), the rest N(0, 0.1²)."""
    rng = np.random.default_rng(seed)

    def draw(path, x):
        kernel = "kernel" in jax.tree_util.keystr(path)
        scale = 1.0 / np.sqrt(x.shape[-2]) if kernel else 0.1
        return (scale * rng.normal(size=x.shape)).astype(np.float32)

    shapes = jax.eval_shape(learner.init, jax.random.PRNGKey(0)).params
    return jax.tree_util.tree_map_with_path(draw, shapes)


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
    u = batch.union
    logit, w = fast_call(learner.weigh, state.params, state.hparams, u)
    np.testing.assert_allclose(np.max(w), metrics["weight_max"], rtol=1e-5)
    np.testing.assert_allclose(np.mean(logit), metrics["reward_union"], rtol=1e-5, atol=1e-6)
    assert np.asarray(w).shape == ((64, SPEC.num_agents) if algo == "indd" else (64,))


def test_dice_diagnostics_per_run_match_the_statistics_of_each_runs_weights():
    """Two runs stacked: each run's row is :func:`weight_stats` and
    :func:`auc` of its own weights and logits on the fixed batches. Kills
    runs read from the wrong index (both rows from run 0), the AUC taken
    over the weights instead of the logits, and batches that ignore the
    expert flags' order."""
    learner = make_learner("misodice", SPEC, hidden=(8,), mixer_hidden=4, batch_size=16)
    # Two runs' parameters: random, in the tree of the learner's (nothing to
    # compile: an eager init draws every layer op by op); hparams the defaults.
    runs = [_random_params(learner, seed) for seed in (1, 2)]
    hp = learner.default_hparams()
    stack = lambda *x: np.stack(x)  # noqa: E731
    params, hparams = jax.tree.map(stack, *runs), jax.tree.map(stack, hp, hp)
    k = int(DATA.union.reward.shape[0])
    truth = np.random.default_rng(0).uniform(size=k) < 0.3
    batches, btruth = diagnostic_batches(DATA, truth, groups=3, batch=16)
    assert btruth.shape == (3, 16)
    got = dice_diagnostics(learner, params, hparams, batches, btruth)
    # each run's own weights: the learner's weigh per batch, compiled once for both runs
    weigh = fast_compile(jax.vmap(learner.weigh, in_axes=(None, None, 0)), runs[0], hp, batches)
    for r, p in enumerate(runs):
        logit, w = weigh(p, hp, batches)
        want = weight_stats(np.asarray(w), btruth)
        for name, v in want.items():
            assert got[name][r] == pytest.approx(v, rel=1e-5), name
        assert got["disc_auc"][r] == pytest.approx(auc(np.asarray(logit), btruth), rel=1e-6)
    assert got["disc_auc"][0] != got["disc_auc"][1]
    with pytest.raises(ValueError, match="one flag per union transition"):
        diagnostic_batches(DATA, truth[:-1], groups=3, batch=16)
