"""Standardised observations: a dataset's per-feature statistics, and the
dataset with its observations and global states standardised by them.

D4RL-style offline learners (TD3+BC, IQL in CORL) train on states standardised
by the dataset's own mean and std and act through an environment wrapped with
the same statistics. jaxil does the same:
[`observation_stats`][jaxil.data.standardize.observation_stats] measures them
over every real entry of the dataset (each step's observation and the final
next observation, padding excluded),
[`standardize`][jaxil.data.standardize.standardize] applies them (padding stays
zero), and
[`envs.StandardizeObservations`][jaxil.envs.wrappers.StandardizeObservations]
applies them in the environment:

```python
stats = observation_stats(ds)
train_ds = standardize(ds, stats)
env = envs.StandardizeObservations(dataset_env(ds), **stats)
```

MuJoCo observations mix heights near 1, angles, and velocities up to ±10;
unstandardised, a small MLP clones the hopper's expert far more slowly
(`experiments/misodice_table/MAMUJOCO.md`).
"""

from __future__ import annotations

import numpy as np

from jaxil.data.format import Dataset

#: Added to every std, so that a constant feature maps to 0 instead of NaN.
MIN_STD = 1e-6


def _entries(ds: Dataset) -> np.ndarray:
    """`[B, T + 1]` bool: the observation entries that are real (steps
    `0 … length`, the last one the final next observation)."""
    length = np.asarray(ds.length)
    T1 = np.asarray(ds.obs).shape[1]
    return np.arange(T1)[None] <= length[:, None]


def observation_stats(ds: Dataset) -> dict[str, np.ndarray]:
    """`{"obs_mean", "obs_std", "state_mean", "state_std"}` (float32) over
    every real entry of `ds`, pooled over agents for the observations
    (agents share the observation layout), computed in float64."""
    e = _entries(ds)
    obs = np.asarray(ds.obs, np.float64)[e]  # [K, N, O]
    obs = obs.reshape(-1, obs.shape[-1])
    state = np.asarray(ds.global_state, np.float64)[e]  # [K, S]
    if obs.shape[0] == 0:
        raise ValueError("observation_stats: the dataset has no observation entries")
    out = dict(obs_mean=obs.mean(0), obs_std=obs.std(0) + MIN_STD,
               state_mean=state.mean(0), state_std=state.std(0) + MIN_STD)
    return {k: v.astype(np.float32) for k, v in out.items()}


def standardize(ds: Dataset, stats: dict[str, np.ndarray]) -> Dataset:
    """`ds` with `(obs − obs_mean) / obs_std` and `(state − state_mean) /
    state_std` at every real entry, padding left at zero."""
    spec = ds.spec
    for name, dim in (("obs_mean", spec.obs_dim), ("obs_std", spec.obs_dim),
                      ("state_mean", spec.state_dim), ("state_std", spec.state_dim)):
        x = np.asarray(stats[name])
        if x.shape != (dim,):
            raise ValueError(f"standardize: {name} has shape {x.shape}, this dataset needs ({dim},)")
        if not np.all(np.isfinite(x)) or (name.endswith("std") and not np.all(x > 0)):
            raise ValueError(f"standardize: {name} must be finite"
                             f"{' and > 0' if name.endswith('std') else ''}")
    e = _entries(ds)
    obs = (np.asarray(ds.obs, np.float32) - stats["obs_mean"]) / stats["obs_std"]
    state = (np.asarray(ds.global_state, np.float32) - stats["state_mean"]) / stats["state_std"]
    return ds.replace(obs=(obs * e[..., None, None]).astype(np.float32),
                      global_state=(state * e[..., None]).astype(np.float32))
