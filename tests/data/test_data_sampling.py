"""On-device samplers: every sampled entry matches the dataset entry it indexes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.fast_compile import fast_call, fast_compile

from jaxil.envs.core import ContinuousActions, DiscreteActions, EnvSpec
from jaxil.envs.rollout import Episodes
from jaxil.data import (
    Dataset,
    flatten_transitions,
    sample_segment_pairs,
    sample_transitions,
    sample_where,
    trajectory_arrays,
)
from jaxil.data.sampling import initial_state_mask, sample_initial_states

SPEC = EnvSpec("test:disc", num_agents=2, obs_dim=3, state_dim=4,
               action=DiscreteActions(num_actions=4, noop_action=0), max_steps=7)
CSPEC = EnvSpec("test:cont", num_agents=2, obs_dim=3, state_dim=4,
                action=ContinuousActions(dim=2), max_steps=7)


def make_dataset(spec: EnvSpec = SPEC, num: int = 9, seed: int = 0) -> Dataset:
    """Random valid trajectories; values are distinct so a gather that picks
    the wrong entry cannot match by accident."""
    rng = np.random.default_rng(seed)
    n, T = spec.num_agents, spec.max_steps
    length = rng.integers(1, T + 1, num).astype(np.int32)
    length[:2] = [T, 2]
    steps = np.arange(T)[None] < length[:, None]
    entries = np.arange(T + 1)[None] <= length[:, None]
    obs = (rng.random((num, T + 1, n, spec.obs_dim)) + 1).astype(np.float32) * entries[..., None, None]
    state = (rng.random((num, T + 1, spec.state_dim)) + 1).astype(np.float32) * entries[..., None]
    if spec.discrete:
        avail = np.ones((num, T + 1, n, spec.num_actions), bool) & entries[..., None, None]
        actions = rng.integers(0, spec.num_actions, (num, T, n)).astype(np.int32) * steps[..., None]
    else:
        avail = np.zeros((num, T + 1, n, 0), bool)
        actions = rng.uniform(-1, 1, (num, T, n, spec.action.dim)).astype(np.float32) * steps[..., None, None]
    reward = (rng.random((num, T)) + 1).astype(np.float32) * steps
    last = np.arange(T)[None] == (length[:, None] - 1)
    done = last & (np.arange(num) % 2 == 0)[:, None]
    truncated = last & (np.arange(num) % 2 == 1)[:, None]
    ep = Episodes(obs=obs, global_state=state, avail_actions=avail, actions=actions, reward=reward,
                  done=done, truncated=truncated, mask=steps, episode_return=reward.sum(1),
                  length=length, won=done.any(1))
    return Dataset.from_episodes(ep, spec, tier="mixed", source="synthetic", seed=seed,
                                 expert=np.arange(num) % 3 == 0)


def test_flatten_transitions_matches_dataset():
    ds = make_dataset()
    tr = flatten_transitions(ds, expert_flags=ds.expert)
    assert tr.num_transitions == ds.num_transitions
    assert isinstance(tr.obs, jax.Array)
    t = jax.tree.map(np.asarray, tr)
    for k in range(tr.num_transitions):
        m, s = int(t.traj_index[k]), int(t.step[k])
        assert s < ds.length[m]  # never a padded step
        np.testing.assert_array_equal(t.obs[k], ds.obs[m, s])
        np.testing.assert_array_equal(t.next_obs[k], ds.obs[m, s + 1])
        np.testing.assert_array_equal(t.next_global_state[k], ds.global_state[m, s + 1])
        np.testing.assert_array_equal(t.next_avail[k], ds.avail_actions[m, s + 1])
        np.testing.assert_array_equal(t.init_obs[k], ds.obs[m, 0])
        np.testing.assert_array_equal(t.init_global_state[k], ds.global_state[m, 0])
        np.testing.assert_array_equal(t.actions[k], ds.actions[m, s])
        assert t.reward[k] == ds.reward[m, s]
        assert t.done[k] == ds.done[m, s]
        assert t.expert[k] == ds.expert[m]
    # truncated last steps are not terminal
    trunc_last = ds.truncated[t.traj_index, t.step]
    assert trunc_last.any() and not t.done[trunc_last].any()
    assert flatten_transitions(ds).expert is None  # unlabelled by default


@pytest.mark.parametrize("spec", [SPEC, CSPEC], ids=["discrete", "continuous"])
def test_sample_transitions_jit_determinism_and_no_padding(spec):
    ds = make_dataset(spec)
    tr = flatten_transitions(ds)
    # One jitted program (XLA level 0: a gather, nothing to optimise), called three times.
    sample = fast_compile(functools.partial(sample_transitions, batch_size=64), jax.random.PRNGKey(0), tr)
    b1 = sample(jax.random.PRNGKey(0), tr)
    b2 = sample(jax.random.PRNGKey(0), tr)
    b3 = sample(jax.random.PRNGKey(1), tr)
    jax.tree.map(np.testing.assert_array_equal, b1, b2)
    assert not np.array_equal(b1.traj_index, b3.traj_index)
    assert b1.obs.shape == (64, 2, 3)
    m, s = np.asarray(b1.traj_index), np.asarray(b1.step)
    assert (s < ds.length[m]).all()
    np.testing.assert_array_equal(b1.obs, ds.obs[m, s])
    np.testing.assert_array_equal(b1.next_obs, ds.obs[m, s + 1])
    np.testing.assert_array_equal(b1.actions, ds.actions[m, s])
    np.testing.assert_array_equal(b1.init_obs, ds.obs[m, 0])


def test_sample_where_only_returns_masked_transitions():
    ds = make_dataset()
    tr = flatten_transitions(ds, expert_flags=ds.expert)
    w = np.zeros(tr.num_transitions, np.float32)
    w[[0, 5]] = [1.0, 3.0]

    def by_mask_and_by_weights(key_mask, key_weights, tr, w):
        return (sample_where(key_mask, tr, 512, weights_or_mask=tr.expert),
                sample_where(key_weights, tr, 512, weights_or_mask=w))

    # Both draws jitted in one program (XLA level 0: one compile).
    b, b_w = fast_call(by_mask_and_by_weights, jax.random.PRNGKey(3), jax.random.PRNGKey(0), tr, w)
    assert np.asarray(b.expert).all()
    assert set(np.asarray(b.traj_index).tolist()) <= set(np.flatnonzero(ds.expert).tolist())
    # weights: proportional sampling, zero weight never drawn
    idx = np.asarray(b_w.traj_index) * 100 + np.asarray(b_w.step)
    key0 = int(tr.traj_index[0]) * 100 + int(tr.step[0])
    key5 = int(tr.traj_index[5]) * 100 + int(tr.step[5])
    assert set(idx.tolist()) <= {key0, key5}
    assert abs((idx == key5).mean() - 0.75) < 0.1
    with pytest.raises(ValueError, match="at least one positive"):
        sample_where(jax.random.PRNGKey(0), tr, 4, jnp.zeros(tr.num_transitions, bool))


def test_sample_where_inside_jit_and_vmap_over_seeds():
    ds = make_dataset()
    tr = flatten_transitions(ds, expert_flags=ds.expert)

    def batches(key):
        keys = jax.random.split(key, 4)
        return jax.vmap(lambda k: sample_where(k, tr, 8, tr.expert).traj_index)(keys)

    out = np.asarray(fast_call(batches, jax.random.PRNGKey(0)))  # jitted (XLA level 0)
    assert out.shape == (4, 8) and ds.expert[out].all()


def test_sample_initial_states_uniform_over_trajectories():
    """s0 for DICE: one step-0 transition per trajectory, trajectories drawn
    uniformly (DemoDICE), not in proportion to their length as the
    ``init_obs`` of uniform transitions are. Kills 'wrong s0 source' in the
    sampler (rows past step 0, or length-weighted trajectories)."""
    ds = make_dataset(num=9, seed=3)
    tr = flatten_transitions(ds)

    def draws(key, tr):
        return (initial_state_mask(tr), sample_initial_states(key, tr, 9000),
                sample_transitions(key, tr, 9000).traj_index)

    # Every draw jitted in one program (XLA level 0: one compile).
    mask, b, uniform_traj = jax.tree.map(np.asarray, fast_call(draws, jax.random.PRNGKey(0), tr))
    assert mask.sum() == ds.num_trajectories
    np.testing.assert_array_equal(np.sort(np.asarray(tr.traj_index)[mask]), np.arange(ds.num_trajectories))
    assert (b.step == 0).all()
    np.testing.assert_array_equal(b.init_obs, ds.obs[b.traj_index, 0])
    np.testing.assert_array_equal(b.obs, ds.obs[b.traj_index, 0])
    np.testing.assert_array_equal(b.init_global_state, ds.global_state[b.traj_index, 0])
    counts = np.bincount(b.traj_index, minlength=ds.num_trajectories)
    np.testing.assert_allclose(counts / 9000, 1 / 9, atol=0.02)  # uniform; lengths vary 1..7
    assert ds.length.max() >= 3 * ds.length.min()
    length_weighted = np.bincount(uniform_traj, minlength=ds.num_trajectories) / 9000
    assert np.abs(length_weighted - 1 / 9).max() > 0.05


def test_segment_pairs_match_dataset():
    ds = make_dataset()
    trajs = trajectory_arrays(ds)
    L = 3
    # One jitted program (XLA level 0: gathers, nothing to optimise), called twice.
    sample = fast_compile(functools.partial(sample_segment_pairs, batch_size=32, segment_len=L),
                          jax.random.PRNGKey(0), trajs)
    x, y = sample(jax.random.PRNGKey(0), trajs)
    x2, _ = sample(jax.random.PRNGKey(0), trajs)
    jax.tree.map(np.testing.assert_array_equal, x, x2)
    assert x.obs.shape == (32, L + 1, 2, 3) and x.global_state.shape == (32, L + 1, 4)
    assert x.actions.shape == (32, L, 2) and x.mask.shape == (32, L)
    assert (np.asarray(x.traj_index) != np.asarray(y.traj_index)).all()
    for seg in (x, y):
        seg = jax.tree.map(np.asarray, seg)
        for b in range(32):
            m, s = int(seg.traj_index[b]), int(seg.start[b])
            n = int(ds.length[m])
            assert 0 <= s <= max(n - L, 0)
            np.testing.assert_array_equal(seg.obs[b], ds.obs[m, s:s + L + 1])
            np.testing.assert_array_equal(seg.global_state[b], ds.global_state[m, s:s + L + 1])
            np.testing.assert_array_equal(seg.avail[b], ds.avail_actions[m, s:s + L + 1])
            np.testing.assert_array_equal(seg.actions[b], ds.actions[m, s:s + L])
            np.testing.assert_array_equal(seg.reward[b], ds.reward[m, s:s + L])
            np.testing.assert_array_equal(seg.done[b], ds.done[m, s:s + L])
            np.testing.assert_array_equal(seg.mask[b], np.arange(s, s + L) < n)
    # trajectory 1 has length 2 < L: its segments start at 0 with a masked tail
    short = np.asarray(x.traj_index) == 1
    if short.any():
        assert (np.asarray(x.start)[short] == 0).all()
        assert not np.asarray(x.mask)[short][:, 2:].any()


def test_whole_trajectory_pairs():
    ds = make_dataset()
    # jitted (XLA level 0: gathers, nothing to optimise)
    x, y = fast_call(functools.partial(sample_segment_pairs, batch_size=6, segment_len=None),
                     jax.random.PRNGKey(1), trajectory_arrays(ds))
    T = ds.num_steps
    assert x.obs.shape == (6, T + 1, 2, 3) and x.mask.shape == (6, T)
    assert not np.asarray(x.start).any()
    m = np.asarray(x.traj_index)
    np.testing.assert_array_equal(x.obs, ds.obs[m])
    np.testing.assert_array_equal(x.mask, ds.mask[m])
    np.testing.assert_array_equal(np.asarray(x.mask).sum(1), ds.length[m])
    with pytest.raises(ValueError, match="segment_len"):
        sample_segment_pairs(jax.random.PRNGKey(1), trajectory_arrays(ds), 6, T + 1)


def test_stratified_log_ratio_matches_numpy_and_reweights_to_the_union():
    """``stratified_log_ratio`` equals the float64 formula
    ρ = 1 / (λ·1[E]·K/K_E + 1 − λ), with and without jit, and it turns a
    stratified batch (λB draws from D_E, the rest from D_U) back into D_U:
    the self-normalised mean of f over many such batches equals f's mean over
    all transitions, while the unweighted mean is pulled towards the experts.
    Kills K/K_E inverted, λ and 1 − λ swapped, the ratio applied to the D_U
    half only, or experts in the D_U half given the non-expert ratio (each
    moves the reweighted mean off the union mean by more than the
    tolerance)."""
    from jaxil.data.sampling import sample_transitions_indexed, stratified_log_ratio

    ds = make_dataset(num=40, seed=3)
    flags = np.arange(40) % 8 == 0
    trans = flatten_transitions(ds, flags)
    k, k_e = trans.reward.shape[0], int(np.sum(trans.expert))
    rng = np.random.default_rng(0)
    is_e = rng.random(64) < 0.3
    lams = (0.5, 0.25)
    # Jitted: both λ in one program.
    jitted = jax.jit(lambda is_e, k_e: [stratified_log_ratio(is_e, lam, k_e, k) for lam in lams])(
        jnp.asarray(is_e), jnp.asarray(k_e))
    for lam, got_jit in zip(lams, jitted):
        want = -np.log(lam * is_e.astype(np.float64) * k / k_e + 1 - lam)
        for got in (stratified_log_ratio(jnp.asarray(is_e), lam, jnp.asarray(k_e), k), got_jit):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    with pytest.raises(ValueError, match="expert_share"):
        stratified_log_ratio(jnp.asarray(is_e), 1.0, k_e, k)

    f = np.asarray(trans.obs[:, 0, 0], np.float64) * np.where(np.asarray(trans.expert), 3.0, 1.0)
    half, b = 32, 64

    def one(key):
        ke, ku = jax.random.split(key)
        e = sample_where(ke, trans, half, trans.expert)
        u, idx = sample_transitions_indexed(ku, trans, b - half)
        fe = e.obs[:, 0, 0] * 3.0
        fu = u.obs[:, 0, 0] * jnp.where(trans.expert[idx], 3.0, 1.0)
        lr = stratified_log_ratio(jnp.concatenate([jnp.ones(half, bool), trans.expert[idx]]),
                                  half / b, jnp.sum(trans.expert), k)
        return jnp.concatenate([fe, fu]), jnp.exp(lr)

    # Jitted, the key split included (XLA level 0: one compile).
    vals, rho = map(np.asarray, fast_call(lambda key: jax.vmap(one)(jax.random.split(key, 4000)),
                                          jax.random.PRNGKey(0)))
    vals, rho = vals.astype(np.float64).ravel(), rho.astype(np.float64).ravel()
    union_mean = f.mean()
    reweighted = np.sum(rho * vals) / np.sum(rho)
    assert abs(np.mean(vals) - union_mean) > 0.1  # the raw stratified batch is biased
    assert abs(reweighted - union_mean) < 0.01, (reweighted, union_mean)
