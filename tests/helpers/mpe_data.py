"""Random-policy ``mpe:simple_spread`` datasets shared by the test modules
that train on a real environment's data (a helper, not a test module):
test_run_integrity.py, test_sharding.py, test_export.py, test_train.py.

Every caller gets episodes from the one rollout program below (one batch
size, one ``jax.jit`` per process), so it is traced once per process and
compiled once per test session: the persistent compilation cache
(conftest.py) hands it to the other xdist worker.
"""

from __future__ import annotations

import functools

import jax

from jaxil import envs
from jaxil.envs.policies import random_policy
from jaxil.data import Dataset, concatenate

ENV_ID = "mpe:simple_spread"
EPISODES = 6  # per call of the rollout program


@functools.lru_cache(maxsize=None)
def _rollout():
    """The environment and its jitted rollout, made once per process: a new
    ``jax.jit`` per call would trace and lower the program again (seconds),
    even when the compiled program comes from the persistent cache."""
    env = envs.make(ENV_ID)
    return env, jax.jit(lambda k: envs.run_episodes(env, random_policy(env.spec), None, k,
                                                    EPISODES))


def random_episodes(seed: int):
    """``EPISODES`` random-policy episodes of ``ENV_ID`` from ``PRNGKey(seed)``."""
    return _rollout()[1](jax.random.PRNGKey(seed))


def random_dataset(seed: int, expert: bool = False, calls: int = 1) -> Dataset:
    """``calls · EPISODES`` random episodes (keys ``seed``, ``seed + 1``, …) as a
    dataset of quality ``"expert"`` or ``"poor"`` with that ``expert`` flag."""
    spec = _rollout()[0].spec
    quality = "expert" if expert else "poor"
    parts = [Dataset.from_episodes(random_episodes(seed + i), spec, quality, "random", seed + i,
                                   expert=expert) for i in range(calls)]
    return parts[0] if calls == 1 else concatenate(parts)


def poor_and_expert(seed: int, calls: int = 1) -> Dataset:
    """A poor half (keys from ``seed``) and an expert-labelled half (keys
    from ``seed + calls``), both random play: the union of the learners' tests."""
    return concatenate([random_dataset(seed, False, calls),
                        random_dataset(seed + calls, True, calls)])
