"""Standardised observations: a dataset's statistics (`observation_stats`),
the standardised dataset (`standardize`) and the environment wrapper that
applies the same statistics (`envs.StandardizeObservations`)."""

import jax
import numpy as np
import pytest

from jaxil import envs
from jaxil.data.standardize import observation_stats, standardize

from helpers.data import FORMAT_SPEC, make_dataset


def _reference(ds):
    """float64 loops: every observation entry 0 … length of every
    trajectory, agents pooled; padding never read."""
    obs, gs, length = np.asarray(ds.obs, np.float64), np.asarray(ds.global_state, np.float64), \
        np.asarray(ds.length)
    o = [obs[b, t, i] for b in range(len(length)) for t in range(length[b] + 1)
         for i in range(obs.shape[2])]
    s = [gs[b, t] for b in range(len(length)) for t in range(length[b] + 1)]
    return np.mean(o, 0), np.std(o, 0), np.mean(s, 0), np.std(s, 0)


def test_stats_match_a_float64_reference_over_the_real_entries_only():
    """Padding (zeros) in the statistics pulls the mean towards 0, and
    leaving out the final next observation shifts both: either fails."""
    ds = make_dataset(FORMAT_SPEC, num=9, seed=3)
    assert (np.asarray(ds.length) < FORMAT_SPEC.max_steps).any()  # there is padding to skip
    st = observation_stats(ds)
    for got, want in zip((st["obs_mean"], st["obs_std"], st["state_mean"], st["state_std"]),
                         _reference(ds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_standardize_maps_real_entries_and_keeps_padding_zero():
    """Each real entry becomes (x − mean) / std and the padding stays 0, so
    the standardised data have mean 0 and std 1 over their real entries (a
    transform applied to the padding too, or with the std and mean swapped,
    fails)."""
    ds = make_dataset(FORMAT_SPEC, num=9, seed=4)
    st = observation_stats(ds)
    out = standardize(ds, st)
    e = np.arange(ds.obs.shape[1])[None] <= np.asarray(ds.length)[:, None]
    obs, new = np.asarray(ds.obs), np.asarray(out.obs)
    np.testing.assert_allclose(new[e], (obs[e] - st["obs_mean"]) / st["obs_std"], rtol=1e-5, atol=1e-5)
    assert not new[~e].any() and not np.asarray(out.global_state)[~e].any()
    again = observation_stats(out)
    np.testing.assert_allclose(again["obs_mean"], 0, atol=1e-5)
    np.testing.assert_allclose(again["obs_std"], 1, atol=1e-4)
    np.testing.assert_allclose(again["state_mean"], 0, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out.actions), np.asarray(ds.actions))


@pytest.mark.parametrize("jit", [False, True])
def test_the_wrapper_standardises_what_the_environment_returns(jit):
    """Reset and step observations and states are the raw environment's,
    standardised with the given statistics; rewards and ends unchanged."""
    raw = envs.make("mpe:simple_spread")
    spec = raw.spec
    rng = np.random.default_rng(0)
    st = dict(obs_mean=rng.normal(size=spec.obs_dim), obs_std=rng.uniform(0.5, 2, spec.obs_dim),
              state_mean=rng.normal(size=spec.state_dim),
              state_std=rng.uniform(0.5, 2, spec.state_dim))
    env = envs.StandardizeObservations(raw, **st)
    key = jax.random.PRNGKey(1)
    actions = np.full((spec.num_agents,), 2, np.int32)

    def both(e):
        s, ts0 = e.reset(key)
        _, ts1 = e.step(s, actions)
        return ts0, ts1

    f = jax.jit(both, static_argnums=0) if jit else both
    for a, b in zip(f(raw), f(env)):
        np.testing.assert_allclose(b.obs, (np.asarray(a.obs) - st["obs_mean"]) / st["obs_std"],
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(b.global_state,
                                   (np.asarray(a.global_state) - st["state_mean"]) / st["state_std"],
                                   rtol=1e-5, atol=1e-5)
        assert float(a.reward) == float(b.reward) and bool(a.done) == bool(b.done)


def test_bad_statistics_are_refused():
    ds = make_dataset(FORMAT_SPEC, num=3)
    st = observation_stats(ds)
    with pytest.raises(ValueError, match="obs_mean has shape"):
        standardize(ds, dict(st, obs_mean=np.zeros(FORMAT_SPEC.obs_dim + 1)))
    with pytest.raises(ValueError, match="state_std must be finite and > 0"):
        standardize(ds, dict(st, state_std=np.zeros(FORMAT_SPEC.state_dim)))
    raw = envs.make("mpe:simple_spread")
    with pytest.raises(ValueError, match="obs_std must be finite and > 0"):
        envs.StandardizeObservations(raw, np.zeros(raw.spec.obs_dim), np.full(raw.spec.obs_dim, np.nan),
                                     np.zeros(raw.spec.state_dim), np.ones(raw.spec.state_dim))
