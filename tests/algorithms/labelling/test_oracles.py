"""Preference queries and oracles: ground truth, SMAX semantics, external judges."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest

from jaxil.envs.core import DiscreteActions, EnvSpec
from jaxil.envs.rollout import Episodes
from jaxil.data import Dataset
from jaxil.algorithms.labelling.oracles import (
    ExternalOracle,
    GroundTruthOracle,
    SMAXSemanticOracle,
    label_agreement,
    parse_choice,
    query_uniforms,
    true_returns,
)
from jaxil.data.preferences import (
    QueryPairs,
    dataset_id,
    pair_segments,
    sample_query_pairs,
    segment_returns,
)
from jaxil.algorithms.labelling.render import render_pair
from jaxil.algorithms.labelling.smax_state import smax_health, smax_layout

SPEC = EnvSpec("test:disc", num_agents=2, obs_dim=3, state_dim=4,
               action=DiscreteActions(num_actions=4, noop_action=0), max_steps=9, has_win=True)


def make_dataset(num=40, seed=0, integer_rewards=False, spec=SPEC):
    """Random valid trajectories of random lengths (the first two: T and 2)."""
    rng = np.random.default_rng(seed)
    n, T = spec.num_agents, spec.max_steps
    length = rng.integers(1, T + 1, num).astype(np.int32)
    length[:2] = [T, 2]
    steps = np.arange(T)[None] < length[:, None]
    entries = np.arange(T + 1)[None] <= length[:, None]
    obs = rng.random((num, T + 1, n, spec.obs_dim)).astype(np.float32) * entries[..., None, None]
    state = rng.random((num, T + 1, spec.state_dim)).astype(np.float32) * entries[..., None]
    avail = np.ones((num, T + 1, n, spec.num_actions), bool) & entries[..., None, None]
    actions = rng.integers(0, spec.num_actions, (num, T, n)).astype(np.int32) * steps[..., None]
    if integer_rewards:
        reward = rng.integers(0, 4, (num, T)).astype(np.float32) * steps
    else:
        reward = rng.random((num, T)).astype(np.float32) * steps
    last = np.arange(T)[None] == (length[:, None] - 1)
    done = last & (np.arange(num) % 2 == 0)[:, None]
    ep = Episodes(obs=obs, global_state=state, avail_actions=avail, actions=actions,
                  reward=reward, done=done, truncated=last & ~done, mask=steps,
                  episode_return=reward.sum(1), length=length, won=done.any(1))
    return Dataset.from_episodes(ep, spec, tier="mixed", source="synthetic", seed=seed)


def reference_returns(ds, traj, start, L):
    out = np.zeros(len(traj))
    for q, (t, s) in enumerate(zip(traj, start)):
        n = ds.num_steps if L is None else L
        for k in range(s, min(s + n, ds.num_steps)):
            if ds.mask[t, k]:
                out[q] += ds.reward[t, k]
    return out


# -- pairs --------------------------------------------------------------------------


def test_sample_query_pairs_deterministic_distinct_and_inside_episodes():
    ds = make_dataset()
    a = sample_query_pairs(ds, 500, segment_len=4, seed=3)
    b = sample_query_pairs(ds, 500, segment_len=4, seed=3)
    c = sample_query_pairs(ds, 500, segment_len=4, seed=4)
    for f in ("traj_x", "traj_y", "start_x", "start_y"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert a.keys() == b.keys() and a.keys() != c.keys()
    assert len(a) == 500 and a.segment_len == 4
    assert np.all(a.traj_x != a.traj_y)
    for t, s in ((a.traj_x, a.start_x), (a.traj_y, a.start_y)):
        assert t.min() >= 0 and t.max() < ds.num_trajectories
        long = ds.length[t] >= 4
        assert np.all(s[long] + 4 <= ds.length[t][long])  # inside the episode
        assert np.all(s[~long] == 0)
        assert (~long).any() and (s > 0).any()  # both cases exercised
    whole = sample_query_pairs(ds, 50, None, seed=0)
    assert whole.segment_len is None and not whole.start_x.any() and not whole.start_y.any()
    assert whole.keys("ds")[0].startswith("ds|") and whole.keys("ds")[0].endswith("|all")


@pytest.mark.parametrize("L", [None, 1, 3, 9])
def test_segment_returns_match_loop_reference(L):
    ds = make_dataset()
    p = sample_query_pairs(ds, 200, L, seed=1)
    rx, ry = segment_returns(ds, p)
    np.testing.assert_allclose(rx, reference_returns(ds, p.traj_x, p.start_x, L), rtol=1e-5)
    np.testing.assert_allclose(ry, reference_returns(ds, p.traj_y, p.start_y, L), rtol=1e-5)
    fx, fy = true_returns(ds, p)  # the oracles' lightweight version
    np.testing.assert_allclose(fx, rx, rtol=1e-5)
    np.testing.assert_allclose(fy, ry, rtol=1e-5)
    x, y = pair_segments(ds, p)
    n = ds.num_steps if L is None else L
    assert x.reward.shape == (200, n) and x.global_state.shape == (200, n + 1, 4)
    np.testing.assert_array_equal(x.traj_index, p.traj_x)


def test_pairs_errors():
    ds = make_dataset()
    for L in (0, ds.num_steps + 1):
        with pytest.raises(ValueError, match="segment_len must be in"):
            sample_query_pairs(ds, 10, L)
    with pytest.raises(ValueError, match="num_queries"):
        sample_query_pairs(ds, 0)
    with pytest.raises(ValueError, match="at least 2 trajectories"):
        sample_query_pairs(ds.select([0]), 10)
    with pytest.raises(ValueError, match="itself"):
        QueryPairs(np.array([1]), np.array([1]), np.array([0]), np.array([0]))
    p = sample_query_pairs(ds, 10, seed=0)
    with pytest.raises(IndexError, match="another dataset"):
        pair_segments(ds.select(np.arange(3)), QueryPairs(
            np.array([0]), np.array([5]), np.array([0]), np.array([0])))
    assert dataset_id(ds) == dataset_id(make_dataset()) != dataset_id(make_dataset(seed=1))
    assert len(p.take([0, 2])) == 2


# -- ground truth -------------------------------------------------------------------


def test_ground_truth_matches_numpy_reference_and_ties():
    ds = make_dataset(num=30, integer_rewards=True)
    for L in (None, 3):
        p = sample_query_pairs(ds, 600, L, seed=2)
        labels = GroundTruthOracle()(ds, p)
        rx = reference_returns(ds, p.traj_x, p.start_x, L)
        ry = reference_returns(ds, p.traj_y, p.start_y, L)
        want = np.where(rx > ry, 1.0, np.where(rx < ry, 0.0, 0.5))
        assert labels.dtype == np.float32 and labels.shape == (600,)
        np.testing.assert_array_equal(labels, want)
        assert (labels == 0.5).any()  # integer rewards tie often
        # ties survive any flip rate
        flipped = GroundTruthOracle(flip_rate=0.5, seed=1)(ds, p)
        np.testing.assert_array_equal(flipped[want == 0.5], 0.5)
    assert GroundTruthOracle(0.1).name == "ground_truth(flip=0.1)"


def test_ground_truth_flip_statistics_and_determinism():
    ds = make_dataset(num=300, seed=5)
    p = sample_query_pairs(ds, 4000, None, seed=0)
    clean = GroundTruthOracle()(ds, p)
    assert not (clean == 0.5).any()
    np.testing.assert_array_equal(GroundTruthOracle(0.0, seed=9)(ds, p), clean)
    noisy = GroundTruthOracle(0.3, seed=7)(ds, p)
    assert set(np.unique(noisy)) <= {0.0, 1.0}
    assert abs(np.mean(noisy != clean) - 0.3) < 0.03
    np.testing.assert_array_equal(GroundTruthOracle(0.3, seed=7)(ds, p), noisy)
    other = GroundTruthOracle(0.3, seed=8)(ds, p)
    assert np.mean(other != noisy) > 0.3  # independent flips: ~2·0.3·0.7
    # a query's label depends on the query, not on the order or the rest of the set
    perm = np.random.default_rng(0).permutation(len(p))
    np.testing.assert_array_equal(GroundTruthOracle(0.3, seed=7)(ds, p.take(perm)), noisy[perm])
    np.testing.assert_array_equal(GroundTruthOracle(0.3, seed=7)(ds, p.take(perm[:50])),
                                  noisy[perm[:50]])
    u = query_uniforms(p, 0)
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.02


@pytest.mark.parametrize("bad", [-0.1, 0.51, 1.0])
def test_ground_truth_bad_flip_rate(bad):
    with pytest.raises(ValueError, match=r"flip_rate must be in \[0, 0.5\].*swap"):
        GroundTruthOracle(flip_rate=bad)


def test_label_agreement():
    a = np.array([1, 0, 0.5, np.nan, 1], np.float32)
    b = np.array([1, 1, 0.5, 1, np.nan], np.float32)
    assert label_agreement(a, b) == pytest.approx(2 / 3)
    assert np.isnan(label_agreement(a[3:4], b[3:4]))


# -- SMAX semantics: hand-built world states -------------------------------------------

SMAX_SPEC = EnvSpec("smax:3m", num_agents=3, obs_dim=5, state_dim=72,
                    action=DiscreteActions(num_actions=9, noop_action=4), max_steps=8,
                    has_win=True)


def smax_state(ally, enemy):
    """A 3m world state: 6 marines (type 0), allies first, given health fractions."""
    health = np.r_[ally, enemy].astype(np.float32)
    units = np.zeros((6, 10), np.float32)
    units[:, 0] = health
    units[:, 1:3] = 16.0
    units[:, 4] = 1.0  # marine one-hot
    units[health <= 0] = 0.0  # dead units are all zeros
    teams = np.r_[np.zeros(3), np.ones(3)]
    return np.concatenate([units.reshape(-1), teams, np.zeros(6)]).astype(np.float32)


# (ally health, enemy health) after each step; the first entry is the reset state.
FULL = ([1, 1, 1], [1, 1, 1])
BATTLES = {
    "fast_win": [FULL, ([1, 1, 1], [0, 0.5, 0.5]), ([1, 1, 1], [0, 0, 0])],
    "slow_win": [FULL, ([1, 1, 1], [1, 0.5, 0.5]), ([1, 1, 1], [0.5, 0.5, 0]),
                 ([1, 1, 1], [0.5, 0, 0]), ([1, 1, 1], [0, 0, 0])],
    "lost": [FULL, ([1, 0.5, 0.5], [1, 1, 0.5]), ([0.5, 0, 0], [1, 0.5, 0.5]),
             ([0, 0, 0], [1, 0.5, 0])],
    "held": [FULL, ([1, 1, 0.5], [1, 1, 0.5]), ([1, 1, 0.5], [1, 0.5, 0.5]),
             ([1, 1, 0.5], [1, 0.5, 0])],  # same damage as "lost", fewer losses
    "costly_win": [FULL, ([0.2, 0, 0], [0, 0, 0])],
}
NAMES = list(BATTLES)


def hand_built_smax():
    """The BATTLES as a 5-trajectory smax:3m dataset whose rewards mislead:
    the worst battle ("lost") earns by far the most reward."""
    T, M = SMAX_SPEC.max_steps, len(NAMES)
    length = np.array([len(BATTLES[n]) - 1 for n in NAMES], np.int32)
    steps = np.arange(T)[None] < length[:, None]
    entries = np.arange(T + 1)[None] <= length[:, None]
    states = np.zeros((M, T + 1, 72), np.float32)
    for m, name in enumerate(NAMES):
        for t, (a, e) in enumerate(BATTLES[name]):
            states[m, t] = smax_state(a, e)
    reward = np.array([0.1, 0.2, 3.0, 0.3, 0.05], np.float32)[:, None] * steps
    last = np.arange(T)[None] == (length[:, None] - 1)
    wiped = np.array([1, 1, 1, 0, 1], bool)[:, None]
    ep = Episodes(obs=np.zeros((M, T + 1, 3, 5), np.float32), global_state=states,
                  avail_actions=np.ones((M, T + 1, 3, 9), bool) & entries[..., None, None],
                  actions=np.zeros((M, T, 3), np.int32), reward=reward, done=last & wiped,
                  truncated=last & ~wiped, mask=steps, episode_return=reward.sum(1),
                  length=length, won=np.array([1, 1, 0, 0, 1], bool))
    return Dataset.from_episodes(ep, SMAX_SPEC, tier="hand", source="hand", seed=0)


def query(a, b, start_a=0, start_b=0, L=None):
    i, j = NAMES.index(a), NAMES.index(b)
    return QueryPairs(np.array([i]), np.array([j]), np.array([start_a]), np.array([start_b]), L)


def test_smax_layout_and_health_parser():
    lay = smax_layout(SMAX_SPEC)
    assert (lay.num_allies, lay.num_enemies, lay.unit_features) == (3, 3, 10)
    a, e = smax_health(np.stack([smax_state([1, 0.5, 0], [0.25, 0, 1])] * 2), lay)
    np.testing.assert_allclose(a, [[1, 0.5, 0]] * 2)
    np.testing.assert_allclose(e, [[0.25, 0, 1]] * 2)
    with pytest.raises(ValueError, match="not a SMAX environment"):
        smax_layout(SPEC)
    with pytest.raises(ValueError, match="state_dim"):
        smax_layout(EnvSpec("smax:3m", 3, 5, 70, DiscreteActions(9, 4), 8))


@pytest.mark.parametrize("better,worse", [
    ("fast_win", "slow_win"),    # a quicker win
    ("held", "lost"),            # same damage dealt, less health lost
    ("slow_win", "held"),        # a win beats no win
    ("costly_win", "held"),      # ... even a costly one
    ("fast_win", "costly_win"),  # allies kept
])
def test_smax_semantic_obvious_pairs(better, worse):
    ds = hand_built_smax()
    oracle = SMAXSemanticOracle()
    assert oracle(ds, query(better, worse))[0] == 1.0
    assert oracle(ds, query(worse, better))[0] == 0.0
    assert oracle.name == "smax_semantic"


def test_smax_semantic_ignores_reward_segments_and_empty():
    ds = hand_built_smax()
    oracle = SMAXSemanticOracle()
    # the misleading rewards make ground truth prefer losing
    assert GroundTruthOracle()(ds, query("held", "lost"))[0] == 0.0
    sx, sy = oracle.scores(ds, query("held", "lost"))
    # damage − ally_loss (see the docstring)
    assert sx[0] == pytest.approx(1.5 / 3 - 0.5 / 3) and sy[0] == pytest.approx(1.5 / 3 - 3 / 3)
    sx, _ = oracle.scores(ds, query("fast_win", "lost"))
    assert sx[0] == pytest.approx(1 + 1 + 0.5 * (1 - 2 / 8))
    # one-step segments from step 1: slow_win deals 1/3 at no cost, lost deals
    # 0.5/3 and loses 1.5/3 ally health
    assert oracle(ds, query("slow_win", "lost", 1, 1, L=1))[0] == 1.0
    # from step 2 both deal 0.5/3 at no cost: a tie
    assert oracle(ds, query("held", "slow_win", 2, 2, L=1))[0] == 0.5
    # a segment starting after its episode ended cannot be judged
    assert np.isnan(oracle(ds, query("costly_win", "slow_win", 3, 0, L=2))[0])
    with pytest.raises(ValueError, match="GroundTruthOracle or ExternalOracle"):
        oracle(make_dataset(), sample_query_pairs(make_dataset(), 5))


# -- rendering ------------------------------------------------------------------------


def test_render_smax_and_generic():
    ds = hand_built_smax()
    text = render_pair(ds, query("fast_win", "lost"), 0)
    assert "Answer with exactly one of: #1 or #2" in text
    assert "Trajectory #1:" in text and "Trajectory #2:" in text
    one, two = text.split("Trajectory #2:")
    assert "allies 3/3 alive, health 100% | enemies 3/3 alive, health 100%" in one
    assert "enemies 0/3 alive, health 0%" in one and "WON" in one
    assert "allies 0/3 alive, health 0%" in two and "LOST" in two
    assert "reward so far 9.00" in two

    gen = make_dataset()
    p = sample_query_pairs(gen, 20, None, seed=0)
    for i in range(len(p)):
        t = render_pair(gen, p, i, max_lines=4)
        blocks = t.split("Trajectory #")[1:]
        assert len(blocks) == 2
        for b in blocks:
            assert 2 <= sum(line.startswith("  step") for line in b.splitlines()) <= 4
        assert "test:disc" in t and "outcome:" in t
    seg = sample_query_pairs(gen, 5, 3, seed=0)
    assert "segments of at most 3 steps" in render_pair(gen, seg, 0)
    with pytest.raises(IndexError):
        render_pair(gen, p, 20)


# -- SMAX semantics on real rollouts -----------------------------------------------------


@pytest.fixture(scope="module")
def smax_rollouts():
    """48 short 3m battles, half by the scripted heuristic, half random (one
    compile)."""
    import jax
    import jax.numpy as jnp

    from jaxil import envs
    from jaxil.envs.policies import Policy, random_policy
    from jaxil.envs.smax import heuristic_policy

    env = envs.make("smax:3m", max_steps=40)
    h, r = heuristic_policy(env), random_policy(env.spec)

    def init(key, n):
        k1, k2 = jax.random.split(key)
        return h.init(k1, n), jax.random.bernoulli(k2, 0.5)

    def act(params, obs, avail, key, carry):
        hc, use_h = carry
        k1, k2 = jax.random.split(key)
        a, hc = h.act(params, obs, avail, k1, hc)
        return jnp.where(use_h, a, r(params, obs, avail, k2)), (hc, use_h)

    from helpers.fast_compile import fast_call  # XLA level 0: compiling is most of this fixture

    ep = fast_call(lambda key: envs.run_episodes(env, Policy(init, act), None, key, 48),
                   jax.random.PRNGKey(0))
    return Dataset.from_episodes(jax.tree.map(np.asarray, ep), env.spec, "mixed", "mixed", 0)


def test_smax_semantic_agrees_with_ground_truth_on_rollouts(smax_rollouts):
    ds = smax_rollouts
    lay = smax_layout(ds.spec)
    a, e = smax_health(ds.global_state[np.arange(len(ds)), ds.length], lay)
    won = ~(e > 0).any(-1) & (a > 0).any(-1)
    np.testing.assert_array_equal(won, ds.success)  # the parser reads the real layout
    assert 0 < ds.success.sum() < len(ds)
    p = sample_query_pairs(ds, 600, None, seed=0)
    gt, sem = GroundTruthOracle()(ds, p), SMAXSemanticOracle()(ds, p)
    assert not np.isnan(sem).any()
    assert label_agreement(gt, sem) >= 0.8
    decisive = gt != 0.5
    assert label_agreement(gt[decisive], sem[decisive]) >= 0.9
    assert "allies 3/3 alive" in render_pair(ds, p, 0)


# -- external oracle -------------------------------------------------------------------


@pytest.mark.parametrize("answer,want", [
    ("#1", 1), ("#2", 2), ("  # 2 \n", 2), ("Trajectory #1", 1), ("trajectory #2.", 2),
    ("1", 1), ("2", 2), ("I prefer trajectory 2.", 2), ("TRAJECTORY #1 is better", 1),
    ("#1 (it keeps 2 allies alive)", 1), ("#1 or #2", None), ("1 and 2", None),
    ("neither", None), ("", None), ("12", None), ("0.2", None), (None, None), (3, None),
])
def test_parse_choice(answer, want):
    assert parse_choice(answer) == want


def returns_from_prompt(prompt):
    """A fake judge: the last 'reward so far' of each trajectory block."""
    one, two = prompt.split("Trajectory #2:")
    last = [float(re.findall(r"reward so far (-?\d+\.\d+)", b)[-1]) for b in (one, two)]
    return last


def fair_judge(prompt):
    rx, ry = returns_from_prompt(prompt)
    return "Trajectory #1" if rx > ry else "#2"


class Counting:
    def __init__(self, fn, stop_after=None):
        self.fn, self.calls, self.stop_after = fn, 0, stop_after

    def __call__(self, prompt):
        if self.stop_after is not None and self.calls >= self.stop_after:
            raise KeyboardInterrupt
        self.calls += 1
        return self.fn(prompt)


def external_setup(num=24, seed=0):
    ds = make_dataset(num=30, integer_rewards=True)
    p = sample_query_pairs(ds, num, 3, seed=seed)
    return ds, p, GroundTruthOracle()(ds, p)


def test_external_fair_judge_agrees_with_ground_truth(tmp_path):
    ds, p, gt = external_setup(num=60)
    judge = Counting(fair_judge)
    oracle = ExternalOracle(judge, cache_path=tmp_path / "c.jsonl", batch_size=7, progress=False)
    labels = oracle(ds, p)
    dec = gt != 0.5
    assert dec.sum() > 30
    np.testing.assert_array_equal(labels[dec], gt[dec])
    unique = len(set(p.keys()))
    assert judge.calls == unique
    r = oracle.report
    assert r["asked"] == unique and r["parsed"] == unique and r["num_failed"] == 0
    assert r["cached"] == len(p) - unique and r["unparseable"] == 0 and r["errors"] == 0
    assert oracle.name == "external(Counting)"
    # a second oracle on the same cache asks nothing
    again = Counting(fair_judge)
    o2 = ExternalOracle(again, cache_path=tmp_path / "c.jsonl", progress=False)
    np.testing.assert_array_equal(o2(ds, p), labels)
    assert again.calls == 0 and o2.report["cached"] == len(p)
    keys = {json.loads(l)["key"] for l in (tmp_path / "c.jsonl").read_text().splitlines()}
    assert keys == set(p.keys(dataset_id(ds)))


def test_external_garbage_and_exceptions_are_retried_then_nan():
    ds, p, gt = external_setup(num=30)
    prompts = [render_pair(ds, p, i) for i in range(len(p))]
    keys = p.keys()
    bad = {prompts[i] for i in (1, 4, 9)}
    nbad = sum(pr in bad for pr in prompts)
    bad_keys = {k for k, pr in zip(keys, prompts) if pr in bad}

    def sometimes_garbage(prompt):
        return "I cannot tell" if prompt in bad else fair_judge(prompt)

    judge = Counting(sometimes_garbage)
    oracle = ExternalOracle(judge, max_retries=2, progress=False)
    labels = oracle(ds, p)
    assert np.isnan(labels).sum() == nbad
    assert all(np.isnan(labels[i]) == (prompts[i] in bad) for i in range(len(p)))
    r = oracle.report
    assert r["unparseable"] == 3 * len(bad_keys) and r["num_failed"] == nbad
    assert judge.calls == r["asked"] == len(set(keys)) + 2 * len(bad_keys)
    assert r["failed"][0]["answers"] == ["I cannot tell"] * 3

    def always_raises(prompt):
        raise RuntimeError("rate limited")

    oracle = ExternalOracle(Counting(always_raises), max_retries=1, progress=False)
    labels = oracle(ds, p)
    assert np.isnan(labels).all()
    assert oracle.report["errors"] == oracle.report["asked"] == 2 * len(set(p.keys()))
    assert "RuntimeError: rate limited" in oracle.report["failed"][0]["answers"][0]
    assert len(oracle.report["failed"]) == 5  # a few examples only

    seen = set()

    def flaky(prompt):  # fails the first time it sees a prompt
        if prompt not in seen:
            seen.add(prompt)
            raise TimeoutError
        return fair_judge(prompt)

    labels = ExternalOracle(flaky, max_retries=1, progress=False)(ds, p)
    dec = gt != 0.5
    np.testing.assert_array_equal(labels[dec], gt[dec])
    seen.clear()  # max_retries=0: one attempt, which fails
    assert np.isnan(ExternalOracle(flaky, max_retries=0, progress=False)(ds, p)).all()
    with pytest.raises(ValueError, match="max_retries"):
        ExternalOracle(fair_judge, max_retries=-1)
    with pytest.raises(TypeError, match="callable"):
        ExternalOracle("not a function")


def test_external_resumes_after_a_kill(tmp_path):
    ds, p, gt = external_setup(num=20)
    unique = len(set(p.keys()))
    cache = tmp_path / "labels" / "cache.jsonl"
    killed = Counting(fair_judge, stop_after=10)
    with pytest.raises(KeyboardInterrupt):
        ExternalOracle(killed, cache_path=cache, batch_size=4, progress=False)(ds, p)
    assert len(cache.read_text().splitlines()) == 10  # 2 full batches + the partial one
    resumed = Counting(fair_judge)
    oracle = ExternalOracle(resumed, cache_path=cache, batch_size=4)  # with a tqdm bar
    labels = oracle(ds, p)
    assert resumed.calls == unique - 10  # answered pairs are not asked again
    full = ExternalOracle(fair_judge, progress=False)(ds, p)
    np.testing.assert_array_equal(labels, full)
    assert oracle.report["asked"] == unique - 10


def test_external_tolerates_corrupt_cache_lines(tmp_path):
    ds, p, _ = external_setup(num=12)
    cache = tmp_path / "cache.jsonl"
    first = ExternalOracle(fair_judge, cache_path=cache, progress=False)
    labels = first(ds, p)
    lines = cache.read_text().splitlines(keepends=True)
    n = len(lines)
    # a kill mid-write: the last line is cut in half, no newline
    cache.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    judge = Counting(fair_judge)
    with pytest.warns(UserWarning, match="corrupt cache line"):
        again = ExternalOracle(judge, cache_path=cache, progress=False)(ds, p)
    np.testing.assert_array_equal(again, labels)
    assert judge.calls == 1  # only the lost answer is asked again
    # the broken fragment was cut off before appending: the file is clean again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(ExternalOracle(fair_judge, cache_path=cache, progress=False)
                   .load_cache()) == n
    # garbage in the middle is skipped too
    text = cache.read_text().splitlines(keepends=True)
    cache.write_text(text[0] + "{not json\n" + '{"key": 3}\n' + "".join(text[1:]))
    with pytest.warns(UserWarning) as caught:
        assert len(ExternalOracle(fair_judge, cache_path=cache).load_cache()) == n
    assert ["line 2 (" in str(w.message) for w in caught] == [True, False]
    assert "line 3 (KeyError" in str(caught[1].message)
