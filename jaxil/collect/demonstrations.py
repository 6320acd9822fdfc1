"""Demonstrations of ε-noised experts, built once and loaded after.

A deliberately suboptimal demonstrator: the zoo's expert with per-agent ε-noise
([`jaxil.collect.zoo.noisy_policy`][jaxil.collect.zoo.noisy_policy]: each agent
acts uniformly at random with probability ε at every step), collected by
[`jaxil.collect.recipes.build`][jaxil.collect.recipes.build] as the `medium`
tier with its ε set explicitly (`NOISED_EXPERTS`):

| environment                   | expert                             | ε   |
|-------------------------------|------------------------------------|-----|
| smax:3m                       | the shipped MAPPO teacher          | 0.4 |
| jumanji:LevelBasedForaging-v0 | scripted BFS (`lbf-bfs-coop`)      | 0.7 |
| mpe:simple_spread             | scripted assignment (`spread-...`) | 0.6 |
| smax:2s3z                     | the shipped MAPPO teacher          | 0.4 |

The ε are the zoo's medium tier of each environment
(`jaxil.collect.zoo.EPSILON` / `EPSILON_OVERRIDES`, calibrated in
data_report.md), written out here so that a set keeps its file and its
contents. The expert is whatever the zoo finds (a local teacher under
`runs/teachers/smax_3m` overrides the shipped one, with a warning). The
reward-learning studies of experiments/irl learn from these sets (their
README says why smax:2s3z joined the other three).

`epsilon=0` asks for the noise-free expert instead (the recipe's `expert`
tier), on any environment with recipes, e.g. the box-action
`mpe:simple_spread_continuous`.

Usage:

```python
from jaxil.collect.demonstrations import NOISED_EXPERTS, demonstrations
ds, info = demonstrations("smax:3m", num_demos=200, seed=0)
info["demo_return_mean"], info["expert_return_mean"], info["epsilon"]
ds, info = demonstrations("mpe:simple_spread_continuous", num_demos=800, epsilon=0)
```
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from jaxil.data import load
from jaxil.collect import recipes
from jaxil.collect.comparison import tier_returns

#: Where `demonstrations` builds its sets (relative to the working directory).
DATA_DIR = Path("runs") / "experiments" / "irl" / "data"

#: env id -> (recipe env short name, ε of the noised expert)
NOISED_EXPERTS: dict[str, tuple[str, float]] = {
    "smax:3m": ("smax-3m", 0.4),
    "jumanji:LevelBasedForaging-v0": ("jumanji-LevelBasedForaging-v0", 0.7),
    "mpe:simple_spread": ("mpe-simple_spread", 0.6),
    "smax:2s3z": ("smax-2s3z", 0.4),
}


def _demonstrator(env_id: str, epsilon: Optional[float]) -> tuple[str, float]:
    """`(recipe env short name, ε)` of `env_id`'s demonstrator."""
    if epsilon is None:
        if env_id not in NOISED_EXPERTS:
            raise ValueError(f"noised-expert demonstrations cover {', '.join(NOISED_EXPERTS)}, "
                             f"not {env_id!r}; pass epsilon=0 for the noise-free expert")
        return NOISED_EXPERTS[env_id]
    if epsilon != 0:
        raise ValueError(f"epsilon is None (the ε of NOISED_EXPERTS) or 0 (the noise-free "
                         f"expert), got {epsilon}")
    short = {v: k for k, v in recipes.RECIPE_ENVS.items()}.get(env_id)
    if short is None:
        raise ValueError(f"no recipes for {env_id!r}: expert demonstrations cover "
                         f"{', '.join(sorted(recipes.RECIPE_ENVS.values()))}")
    return short, 0.0


def demo_path(env_id: str, num_demos: int, seed: int = 0,
              data_dir: Union[str, os.PathLike] = DATA_DIR,
              epsilon: Optional[float] = None) -> Path:
    """`<data_dir>/<env-short>-eps<ε>-<num_demos>d-seed<seed>.npz`."""
    short, eps = _demonstrator(env_id, epsilon)
    return Path(data_dir) / f"{short}-eps{eps}-{num_demos}d-seed{seed}.npz"


def demonstrations(env_id: str, num_demos: int = 200, seed: int = 0, progress: bool = False,
                   data_dir: Union[str, os.PathLike] = DATA_DIR,
                   epsilon: Optional[float] = None) -> tuple[Any, dict]:
    """`(dataset, info)`: `num_demos` trajectories of the ε-noised expert of
    `env_id` (`epsilon=None`: `NOISED_EXPERTS`' ε; `0`: the
    noise-free expert), built once under `data_dir` and loaded after.

    `info`: `epsilon`, `source` (the demonstrator's name),
    `demo_return_mean/std` (over the dataset), and the zoo's measurement of
    the demonstrator, of the noise-free expert and of the random policy over
    128 other episodes (`demonstrator_measured`, `expert_return_mean`,
    `random_return_mean`).
    """
    short, eps = _demonstrator(env_id, epsilon)
    tier = "medium" if eps else "expert"
    path = demo_path(env_id, num_demos, seed, data_dir, epsilon)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        recipes.build(f"{short}/{tier}", seed=seed, out_path=path, progress=progress,
                      counts={tier: int(num_demos)}, epsilons={"medium": eps} if eps else None)
    ds = load(path)
    tiers = tier_returns(path)
    ret = np.asarray(ds.episode_return, np.float64)
    info = dict(env_id=env_id, epsilon=eps, num_demos=int(num_demos), seed=int(seed),
                path=str(path), source=ds.info.source_names[0],
                demo_return_mean=float(ret.mean()), demo_return_std=float(ret.std()),
                demonstrator_measured=tiers[tier],
                expert_return_mean=tiers["expert"],
                random_return_mean=tiers["random"])
    return ds, info
