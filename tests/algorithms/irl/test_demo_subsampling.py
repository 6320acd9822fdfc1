"""Subsampled demonstrations (`demos_from_dataset(subsample=k)`): every k-th
step of each trajectory from a per-trajectory random offset, the setting of
GAIL's original MuJoCo pipeline."""

import numpy as np
import pytest

from jaxil.algorithms.irl.adversarial import demos_from_dataset
from jaxil.data.format import Dataset
from jaxil.envs.core import DiscreteActions, EnvSpec

from helpers.data import make_episodes

SPEC = EnvSpec("test:subsample", num_agents=2, obs_dim=3, state_dim=4,
               action=DiscreteActions(num_actions=4, noop_action=0), max_steps=47)


def _dataset(num=9, seed=0):
    return Dataset.from_episodes(make_episodes(SPEC, num, seed), SPEC, tier="expert",
                                 source="unit", seed=seed, expert=True, recipe="unit")


def _kept(ds, demos):
    """(trajectory, step) of every real demonstration step, found by its
    reward (random floats, unique within the dataset)."""
    reward = np.asarray(ds.reward)
    w = np.asarray(demos.weight) > 0
    out = []
    for r in np.asarray(demos.reward)[w]:
        hits = np.argwhere(reward == r)
        assert len(hits) == 1
        out.append((int(hits[0][0]), int(hits[0][1])))
    return out


@pytest.mark.parametrize("k", [1, 5, 20])
def test_every_kth_step_from_one_offset_per_trajectory(k):
    """The kept steps of each trajectory are exactly {o, o+k, ...} below its
    length for one o in [0, k) (a mask taken modulo the absolute step, an
    offset shared by all trajectories, or steps past the end fail this), and
    each step's observation, next observation and end flag are its own."""
    ds = _dataset()
    demos = demos_from_dataset(ds, subsample=k, subsample_seed=3)
    kept = _kept(ds, demos)
    length = np.asarray(ds.length)
    offsets = np.random.default_rng(3).integers(0, k, len(length)) if k > 1 else np.zeros(len(length), int)
    expected = sorted((t, s) for t in range(len(length)) for s in range(offsets[t], length[t], k))
    assert sorted(kept) == expected
    if k == 20:
        assert len({offsets[t] for t in range(len(length))}) > 1  # the offsets do differ
    w = np.asarray(demos.weight) > 0
    obs = np.asarray(ds.obs)
    for row, (t, s) in enumerate(kept):
        assert np.array_equal(np.asarray(demos.obs)[w][row], obs[t, s])
        assert np.array_equal(np.asarray(demos.next_obs)[w][row], obs[t, s + 1])
        assert bool(np.asarray(demos.last)[w][row]) == (s + 1 == length[t])


def test_the_seed_chooses_the_offsets_and_k1_is_every_step():
    """Same seed, same steps; another seed, other steps; subsample=1 is the
    plain call (a subsample that ignored its seed, or dropped steps at k=1,
    fails)."""
    ds = _dataset()
    a = _kept(ds, demos_from_dataset(ds, subsample=20, subsample_seed=0))
    assert a == _kept(ds, demos_from_dataset(ds, subsample=20, subsample_seed=0))
    assert a != _kept(ds, demos_from_dataset(ds, subsample=20, subsample_seed=1))
    assert _kept(ds, demos_from_dataset(ds, subsample=1)) == _kept(ds, demos_from_dataset(ds))
    assert len(_kept(ds, demos_from_dataset(ds))) == int(np.asarray(ds.length).sum())


@pytest.mark.parametrize("bad", [0, -2, 2.5, True])
def test_a_bad_subsample_is_refused(bad):
    with pytest.raises(ValueError, match="subsample must be an integer >= 1"):
        demos_from_dataset(_dataset(), subsample=bad)
