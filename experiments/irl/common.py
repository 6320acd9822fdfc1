"""The demonstrations of experiments/irl (best-of-N and the adversarial part).

Deliberately suboptimal demonstrators: the zoo's expert with per-agent ε-noise
(:func:`jaxil.collect.zoo.noisy_policy`: each agent acts uniformly at random
with probability ε at every step), collected by the existing data pipeline
(:func:`jaxil.collect.recipes.build`, the ``medium`` tier with its ε set
explicitly):

=============================  ===================================  ====
environment                    expert                               ε
=============================  ===================================  ====
smax:3m                        the shipped MAPPO teacher            0.4
jumanji:LevelBasedForaging-v0  scripted BFS (``lbf-bfs-coop``)      0.7
mpe:simple_spread              scripted assignment (``spread-...``)  0.6
smax:2s3z                      the shipped MAPPO teacher            0.4
=============================  ===================================  ====

smax:2s3z joined after the diagnosis of ``diagnose_sft.py`` (README.md):
its expert, like 3m's, is an MLP policy of each agent's own observation,
the function class BC fits, where BC cannot recover the scripted experts of
LevelBasedForaging and MPE from their noised demonstrations.

(ε as the zoo's medium tier of each environment: ``jaxil.collect.zoo``
``EPSILON`` / ``EPSILON_OVERRIDES``, calibrated in data_report.md.) The
expert of smax:3m (2s3z) is whatever the zoo finds (a local teacher under
``runs/teachers/smax_3m`` overrides the shipped one, with a warning).

Usage::

    from experiments.irl.common import ENVS, demonstrations
    ds, info = demonstrations("smax:3m", num_demos=200, seed=0)
    info["demo_return_mean"], info["expert_return_mean"], info["epsilon"]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from jaxil.data import load
from jaxil.collect import recipes

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = ROOT / "runs" / "experiments" / "irl" / "data"

# env id -> (recipe env short name, ε of the noised expert)
ENVS: dict[str, tuple[str, float]] = {
    "smax:3m": ("smax-3m", 0.4),
    "jumanji:LevelBasedForaging-v0": ("jumanji-LevelBasedForaging-v0", 0.7),
    "mpe:simple_spread": ("mpe-simple_spread", 0.6),
    "smax:2s3z": ("smax-2s3z", 0.4),
}


def demo_path(env_id: str, num_demos: int, seed: int = 0) -> Path:
    short, eps = ENVS[env_id]
    return DATA_DIR / f"{short}-eps{eps}-{num_demos}d-seed{seed}.npz"


def demonstrations(env_id: str, num_demos: int = 200, seed: int = 0,
                   progress: bool = False) -> tuple[Any, dict]:
    """``(dataset, info)``: ``num_demos`` trajectories of the ε-noised expert of
    ``env_id``, built once under runs/experiments/irl/data/ and loaded after.

    ``info``: ``epsilon``, ``source`` (the demonstrator's name),
    ``demo_return_mean/std`` (over the dataset), and the zoo's measurement of
    the demonstrator and of the noise-free expert over 128 other episodes
    (``demonstrator_measured``, ``expert_return_mean``).
    """
    if env_id not in ENVS:
        raise ValueError(f"experiments/irl covers {', '.join(ENVS)}, not {env_id!r}")
    short, eps = ENVS[env_id]
    path = demo_path(env_id, num_demos, seed)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        recipes.build(f"{short}/medium", seed=seed, out_path=path, progress=progress,
                      counts={"medium": int(num_demos)}, epsilons={"medium": eps})
    ds = load(path)
    side = json.loads(recipes.sidecar_path(path).read_text())
    tiers = side["tier_measurements"]["tiers"]
    ret = np.asarray(ds.episode_return, np.float64)
    info = dict(env_id=env_id, epsilon=eps, num_demos=int(num_demos), seed=int(seed),
                path=str(path.relative_to(ROOT)), source=ds.info.source_names[0],
                demo_return_mean=float(ret.mean()), demo_return_std=float(ret.std()),
                demonstrator_measured=tiers["medium"]["mean_return"],
                expert_return_mean=tiers["expert"]["mean_return"],
                random_return_mean=tiers["random"]["mean_return"])
    return ds, info
