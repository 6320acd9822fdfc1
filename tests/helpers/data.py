"""Synthetic datasets shared by several test modules (a helper, not a test module).

- O-MAPL's preference data, ``omapl_dataset`` on ``OMAPL_SPEC`` /
  ``OMAPL_CSPEC``: test_omapl.py, test_phase1_cli.py, test_hardening_cli.py.
- The dataset-format fixtures, ``make_dataset`` / ``make_episodes`` on
  ``FORMAT_SPEC``: test_data_format.py, test_hardening_data.py.
- MisoDICE's fidelity data, ``FIDELITY_DS`` / ``FIDELITY_DATA`` on
  ``FIDELITY_SPEC`` (built by ``fidelity_dataset``): test_misodice_fidelity.py,
  test_misodice_regimes.py.

Everything here is deterministic in its seed: numpy generators only.
"""

from __future__ import annotations

import numpy as np

from jaxil.envs.core import ContinuousActions, DiscreteActions, EnvSpec
from jaxil.envs.rollout import Episodes
from jaxil.data import Dataset, concatenate
from jaxil.algorithms.offline import LearnerData

# ----------------------------------------------------------------------------- O-MAPL

OMAPL_N, OMAPL_O, OMAPL_A, OMAPL_T = 2, 4, 3, 8
OMAPL_SPEC = EnvSpec("synthetic:omapl", num_agents=OMAPL_N, obs_dim=OMAPL_O,
                     state_dim=OMAPL_N * OMAPL_O,
                     action=DiscreteActions(OMAPL_A, noop_action=None), max_steps=OMAPL_T)
OMAPL_CSPEC = EnvSpec("synthetic:omapl-c", num_agents=OMAPL_N, obs_dim=OMAPL_O,
                      state_dim=OMAPL_N * OMAPL_O,
                      action=ContinuousActions(dim=2, low=-1.0, high=1.0), max_steps=OMAPL_T)


def _omapl_episodes(rng, skill: np.ndarray, spec=OMAPL_SPEC) -> Episodes:
    """Agents act a_i = argmax(o_i[:A]) with probability ``skill`` (per
    trajectory), else uniformly; reward = fraction of agents acting right.
    Episodes have random lengths (masking is exercised)."""
    N, O, A, T = OMAPL_N, OMAPL_O, OMAPL_A, OMAPL_T
    M = skill.shape[0]
    obs = rng.normal(size=(M, T + 1, N, O)).astype(np.float32)
    length = rng.integers(T // 2, T + 1, M).astype(np.int32)
    steps = np.arange(T)[None] < length[:, None]
    entries = np.arange(T + 1)[None] <= length[:, None]
    obs *= entries[..., None, None]
    good = obs[:, :T, :, :A].argmax(-1)
    if spec.discrete:
        rand = rng.integers(0, A, (M, T, N))
        actions = np.where(rng.random((M, T, N)) < skill[:, None, None], good, rand).astype(np.int32)
        reward = (actions == good).mean(-1).astype(np.float32) * steps
        actions *= steps[..., None]
        avail = np.ones((M, T + 1, N, A), bool) & entries[..., None, None]
    else:
        target = np.tanh(obs[:, :T, :, :2])
        noise = rng.normal(size=(M, T, N, 2)) * (1.5 * (1 - skill))[:, None, None, None]
        actions = np.clip(target + noise, -1, 1).astype(np.float32) * steps[..., None, None]
        reward = (-np.abs(actions - target).sum((-1, -2)) / N).astype(np.float32) * steps
        avail = np.zeros((M, T + 1, N, 0), bool)
    last = np.arange(T)[None] == (length[:, None] - 1)
    ret = np.zeros(M, np.float32)
    for t in range(T):
        ret = (ret + reward[:, t]).astype(np.float32)
    return Episodes(obs=obs, global_state=obs.reshape(M, T + 1, N * O), avail_actions=avail,
                    actions=actions, reward=reward, done=last, truncated=np.zeros_like(last),
                    mask=steps, episode_return=ret, length=length, won=np.zeros(M, bool))


def omapl_dataset(seed=0, n_expert=30, n_poor=90, spec=OMAPL_SPEC) -> Dataset:
    """``n_expert`` expert trajectories (skill 0.95) and ``n_poor`` poor ones
    (skill uniform in [0, 0.6]), shuffled with ``seed``."""
    rng = np.random.default_rng(seed)
    parts = [
        Dataset.from_episodes(_omapl_episodes(rng, np.full(n_expert, 0.95), spec), spec,
                              tier="expert", source="rule", seed=seed, expert=True),
        Dataset.from_episodes(_omapl_episodes(rng, rng.uniform(0.0, 0.6, n_poor), spec), spec,
                              tier="poor", source="noisy", seed=seed, expert=False),
    ]
    return concatenate(parts).shuffle(seed)


# ----------------------------------------------------------------------------- dataset format

FORMAT_SPEC = EnvSpec("test:disc", num_agents=2, obs_dim=3, state_dim=4,
                      action=DiscreteActions(num_actions=4, noop_action=0), max_steps=6,
                      has_win=True)


def make_episodes(spec: EnvSpec, num: int, seed: int = 0, T: int | None = None) -> Episodes:
    """Random episodes that follow run_episodes' conventions (zero padding,
    legal actions, one end flag or none when cut at T)."""
    rng = np.random.default_rng(seed)
    n, T = spec.num_agents, T or spec.max_steps
    length = rng.integers(1, T + 1, num).astype(np.int32)
    length[0] = T  # at least one trajectory fills the time axis
    steps = np.arange(T)[None] < length[:, None]
    entries = np.arange(T + 1)[None] <= length[:, None]
    obs = rng.normal(size=(num, T + 1, n, spec.obs_dim)).astype(np.float32) * entries[..., None, None]
    state = rng.normal(size=(num, T + 1, spec.state_dim)).astype(np.float32) * entries[..., None]
    if spec.discrete:
        avail = rng.random((num, T + 1, n, spec.num_actions)) < 0.6
        avail[..., 0] = True
        avail &= entries[..., None, None]
        logits = np.where(avail[:, :T], rng.random(avail[:, :T].shape), -1.0)
        actions = logits.argmax(-1).astype(np.int32) * steps[..., None]
    else:
        avail = np.zeros((num, T + 1, n, 0), bool)
        actions = rng.uniform(-1, 1, (num, T, n, spec.action.dim)).astype(np.float32)
        actions *= steps[..., None, None]
    reward = rng.normal(size=(num, T)).astype(np.float32) * steps
    last = np.arange(T)[None] == (length[:, None] - 1)
    kind = np.arange(num) % 3  # 0 terminal, 1 truncated, 2 cut by the horizon
    done = last & (kind == 0)[:, None]
    truncated = last & (kind == 1)[:, None]
    ret = np.zeros(num, np.float32)
    for t in range(T):  # float32 accumulation, like the environment
        ret = (ret + reward[:, t]).astype(np.float32)
    return Episodes(obs=obs, global_state=state, avail_actions=avail, actions=actions,
                    reward=reward, done=done, truncated=truncated, mask=steps,
                    episode_return=ret, length=length, won=done.any(1) & (rng.random(num) < 0.5))


def make_dataset(spec: EnvSpec = FORMAT_SPEC, num: int = 7, seed: int = 0, tier: str = "poor",
                 source: str = "random", expert: bool = False) -> Dataset:
    return Dataset.from_episodes(make_episodes(spec, num, seed), spec, tier=tier, source=source,
                                 seed=seed, expert=expert, recipe="unit",
                                 creation_args={"num": num, "seed": seed})


# ----------------------------------------------------------------------------- MisoDICE fidelity

FIDELITY_N, FIDELITY_O, FIDELITY_S, FIDELITY_A, FIDELITY_T = 3, 4, 6, 4, 12
FIDELITY_SPEC = EnvSpec("synthetic:fidelity", num_agents=FIDELITY_N, obs_dim=FIDELITY_O,
                        state_dim=FIDELITY_S, action=DiscreteActions(FIDELITY_A, noop_action=0),
                        max_steps=FIDELITY_T)


def fidelity_dataset(seed=0, num=24) -> Dataset:
    """``num`` trajectories: every third one T steps long, the others 1–3, so
    a transition-uniform draw of s0 favours the long ones about 5:1. Expert
    trajectories (every fourth) act a_i = argmax(o_i), the rest uniformly;
    even trajectories end terminal (``done``), odd ones truncated. Some
    actions are unavailable at each step (never the recorded one)."""
    N, O, S, A, T = FIDELITY_N, FIDELITY_O, FIDELITY_S, FIDELITY_A, FIDELITY_T
    rng = np.random.default_rng(seed)
    length = np.where(np.arange(num) % 3 == 0, T, rng.integers(1, 4, num)).astype(np.int32)
    steps = np.arange(T)[None] < length[:, None]
    entries = np.arange(T + 1)[None] <= length[:, None]
    obs = rng.normal(size=(num, T + 1, N, O)).astype(np.float32) * entries[..., None, None]
    state = rng.normal(size=(num, T + 1, S)).astype(np.float32) * entries[..., None]
    expert = np.arange(num) % 4 == 0
    good = obs[:, :T].argmax(-1)
    actions = np.where(expert[:, None, None], good, rng.integers(0, A, (num, T, N)))
    actions = (actions * steps[..., None]).astype(np.int32)
    reward = np.zeros((num, T), np.float32)
    last = np.arange(T)[None] == (length[:, None] - 1)
    done = last & (np.arange(num) % 2 == 0)[:, None]
    # About a third of the actions unavailable at each step (the no-op and
    # the recorded action always legal; drawn last, so the draws above are
    # those of the all-legal data this had before): a policy loss that drops
    # the mask scores other numbers.
    legal = rng.random((num, T + 1, N, A)) < 0.6
    legal[..., 0] = True
    np.put_along_axis(legal[:, :T], actions[..., None], True, -1)
    avail = legal & entries[..., None, None]
    ep = Episodes(obs=obs, global_state=state, avail_actions=avail, actions=actions, reward=reward,
                  done=done, truncated=last & ~done, mask=steps, episode_return=reward.sum(1),
                  length=length, won=done.any(1))
    return Dataset.from_episodes(ep, FIDELITY_SPEC, tier="mixed", source="synthetic", seed=seed,
                                 expert=expert)


FIDELITY_DS = fidelity_dataset()
FIDELITY_DATA = LearnerData.from_dataset(FIDELITY_DS, FIDELITY_DS.expert)


def assert_same(a: Dataset, b: Dataset) -> None:
    """Two datasets hold the same info and every array with the same dtype,
    shape and values."""
    assert a.info == b.info
    for k, v in a.arrays().items():
        w = getattr(b, k)
        assert v.dtype == w.dtype and v.shape == w.shape, k
        np.testing.assert_array_equal(v, w, err_msg=k)
