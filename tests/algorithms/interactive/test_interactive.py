"""Interactive imitation: schedules, switch, masks, filters, buffer, rounds, resume."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.envs.policies import Policy
from jaxil.algorithms.interactive import labels as L
from jaxil.algorithms.interactive.buffer import empty_buffer, insert
from jaxil.algorithms.interactive.config import InteractiveConfig, regime
from jaxil.algorithms.interactive.rollout import SwitchRule, mixed_episodes
from jaxil.algorithms.interactive.schedule import NEVER, SWITCHES, expert_probability, sample_switch


# ----------------------------------------------------------------------------- schedules


@pytest.mark.parametrize("jit", [False, True])
def test_expert_probability_matches_numpy(jit):
    """β_r of each schedule against the formulas in float64. Catches a decay
    that starts at round 1 instead of 0 (β_0 ≠ beta0), a linear decay that
    goes negative, or exponents off by one."""
    rng = np.random.default_rng(0)
    fn = jax.jit(expert_probability) if jit else expert_probability
    for _ in range(20):
        r, b0, rate = int(rng.integers(0, 12)), float(rng.uniform()), float(rng.uniform(0, 0.4))
        want = [b0, b0 * min(1.0, max(0.0, 1 - r * rate)), b0 * rate ** r]
        for kind in range(3):
            np.testing.assert_allclose(float(fn(r, b0, kind, rate)), want[kind], rtol=1e-5,
                                       atol=1e-7)
    assert float(fn(0, 0.7, 2, 0.5)) == pytest.approx(0.7)  # β_0 is beta0 for every schedule


def _pmf(kind, lo, hi, p, kmax):
    k = np.arange(kmax + 1)
    w = hi - lo + 1
    inside = (k >= lo) & (k <= hi)
    if kind == "uniform":
        return np.where(inside, 1.0 / w, 0.0)
    j = k - lo
    if kind == "late":  # P(⌊√u·w⌋ = j) = ((j+1)² − j²) / w²
        return np.where(inside, ((j + 1) ** 2 - j ** 2) / w ** 2, 0.0)
    if kind == "early":
        return np.where(inside, ((w - j) ** 2 - (w - j - 1) ** 2) / w ** 2, 0.0)
    if kind == "geometric":
        return np.where(k >= lo, (1 - p) ** np.maximum(j, 0) * p, 0.0)
    if kind == "fixed":
        return (k == lo).astype(float)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["uniform", "early", "late", "geometric", "fixed"])
def test_switch_distributions_match_their_pmf(kind):
    """Empirical switch frequencies against the analytic pmf. Catches an
    exclusive upper end (hi never drawn), early/late swapped, and a geometric
    that counts trials instead of failures (never equal to lo)."""
    lo, hi, p = 3, 9, 0.3
    keys = jax.random.split(jax.random.PRNGKey(1), 40_000)
    ks = np.asarray(jax.jit(jax.vmap(lambda k: sample_switch(k, SWITCHES.index(kind), lo, hi, p)))(keys))
    kmax = 40
    emp = np.bincount(np.minimum(ks, kmax), minlength=kmax + 1)[: kmax + 1] / len(ks)
    want = _pmf(kind, lo, hi, p, kmax)
    np.testing.assert_allclose(emp[:kmax], want[:kmax], atol=0.01)
    assert ks.min() >= lo
    if kind != "geometric":
        assert ks.max() <= hi


def test_no_switch_never_hands_over():
    k = sample_switch(jax.random.PRNGKey(0), SWITCHES.index("none"), 0, 5, 0.5)
    assert int(k) == NEVER


# ----------------------------------------------------------------------------- labels, masks


def _hand_built():
    """Two episodes of lengths 5 and 3 (T = 6); the expert takes over at k = 2 and 1."""
    valid = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], bool)
    t = np.arange(6)[None]
    acted = (t >= np.array([[2], [1]])) & valid
    return valid, acted


@pytest.mark.parametrize("jit", [False, True])
def test_loss_mask_and_labels_on_hand_built_episodes(jit):
    """OEC trains on t ≥ k only (the switch step itself included), DAgger on
    every valid step; a mask shifted by one step (t > k, or t ≥ k−1), one that
    forgets the padding, or one that ignores a dropped episode fails here."""
    valid, acted = _hand_built()
    kept = np.array([True, False])
    fn = jax.jit(L.loss_mask) if jit else L.loss_mask
    oec = np.asarray(fn(valid, acted, True, kept))
    np.testing.assert_array_equal(oec, [[0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(np.asarray(fn(valid, acted, True, np.array([True, True])))[1],
                                  [0, 1, 1, 0, 0, 0])
    ablation = np.asarray(fn(valid, acted, False, kept))  # mask off: the whole episode
    np.testing.assert_array_equal(ablation, [[1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]])
    spent = jax.jit(L.labels_spent, static_argnums=3) if jit else L.labels_spent
    np.testing.assert_array_equal(spent(valid, acted, False, 3), [3 * 3, 3 * 2])  # OEC: expert steps
    np.testing.assert_array_equal(spent(valid, acted, True, 3), [3 * 5, 3 * 3])  # DAgger: all visited
    np.testing.assert_array_equal(spent(valid, np.zeros_like(acted), False, 3), [0, 0])  # on-policy


def test_budget_allowance_is_inclusive_and_in_order():
    """Episodes are taken in order while the running cost ≤ allowance: an
    exclusive bound (<) or a per-episode test instead of the cumulative one
    fails."""
    spent = jnp.array([5, 0, 4, 2, 0])
    np.testing.assert_array_equal(L.within_allowance(spent, 9), [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(L.within_allowance(spent, 11), [1, 1, 1, 1, 1])
    np.testing.assert_array_equal(L.within_allowance(spent, 0), [0, 0, 0, 0, 0])
    np.testing.assert_array_equal(L.within_allowance(jnp.zeros(3, jnp.int32), 0), [1, 1, 1])


def test_training_targets_and_verifier():
    lab, ex = jnp.array([[[1, 2]]]), jnp.array([[[3, 4]]])
    np.testing.assert_array_equal(L.training_targets(lab, ex, True), lab)
    np.testing.assert_array_equal(L.training_targets(lab, ex, False), ex)
    won, ret = jnp.array([True, False, False]), jnp.array([0.0, 2.0, 1.0])
    np.testing.assert_array_equal(L.verify(won, ret, 0, 0.0), [1, 1, 1])
    np.testing.assert_array_equal(L.verify(won, ret, 1, 0.0), [1, 0, 0])
    np.testing.assert_array_equal(L.verify(won, ret, 2, 1.0), [0, 1, 1])  # ≥, not >


def _repeats_reference(obs, actions, valid):
    E, T, N = actions.shape[:3]
    out = np.zeros(E, int)
    for e in range(E):
        for i in range(N):
            seen = {}
            for t in range(T):
                if valid[e, t]:
                    key = (obs[e, t, i].tobytes(), np.asarray(actions[e, t, i]).tobytes())
                    seen[key] = seen.get(key, 0) + 1
            out[e] = max([out[e]] + list(seen.values()))
    return out


@pytest.mark.parametrize("jit", [False, True])
def test_repetition_filter_counts_exact_pairs(jit):
    """The largest count of one agent's identical (obs, action) pair, against
    a dictionary count. Catches counting obs alone (same obs, other action),
    counting across agents, and counting padding steps."""
    rng = np.random.default_rng(3)
    E, T, N, O = 4, 7, 2, 3
    obs = rng.integers(0, 2, (E, T, N, O)).astype(np.float32)
    act = rng.integers(0, 2, (E, T, N)).astype(np.int32)
    valid = np.arange(T)[None] < rng.integers(3, T + 1, (E, 1))
    obs[0, :, 0] = 0.5  # agent 0 of episode 0: one obs throughout,
    act[0, :, 0] = np.arange(T) % 2  # alternating actions: pairs repeat ⌈T/2⌉ times
    obs[1, :, :] = 0.25
    act[1, :, 0], act[1, :, 1] = 0, 1  # agents differ in action: no cross-agent count
    valid[1] = True
    fn = jax.jit(L.max_repeats) if jit else L.max_repeats
    got = np.asarray(fn(obs, act, valid))
    np.testing.assert_array_equal(got, _repeats_reference(obs, act, valid))
    assert got[1] == T
    passes = np.asarray(L.passes_repetition(obs, act, valid, T))
    assert not passes[1] and bool(np.asarray(L.passes_repetition(obs, act, valid, 0)).all())


def test_repetition_filter_skips_agents_without_a_choice():
    """A dead unit (constant zero observation, no-op only) repeats one pair
    until the episode ends; with the choice mask it is not counted, while a
    live agent looping on one pair still is. Without the mask (the first
    experiment's filter) every won episode with an early death was rejected."""
    E, T, N, O = 1, 10, 2, 3
    rng = np.random.default_rng(5)
    obs = rng.normal(size=(E, T, N, O)).astype(np.float32)
    act = rng.integers(0, 5, (E, T, N)).astype(np.int32)
    obs[0, 2:, 1], act[0, 2:, 1] = 0.0, 0  # agent 1 dies at t = 2
    valid = np.ones((E, T), bool)
    choice = np.ones((E, T, N), bool)
    choice[0, 2:, 1] = False
    assert int(L.max_repeats(obs, act, valid)[0]) == 8
    assert int(L.max_repeats(obs, act, valid, choice)[0]) == 1
    assert bool(L.passes_repetition(obs, act, valid, 8, choice)[0])
    obs[0, 3:9, 0], act[0, 3:9, 0] = 0.5, 2  # agent 0 loops for 6 steps
    assert int(L.max_repeats(obs, act, valid, choice)[0]) == 6
    assert not bool(L.passes_repetition(obs, act, valid, 6, choice)[0])


# ----------------------------------------------------------------------------- buffer


def test_ring_buffer_matches_a_python_ring():
    """Appends kept rows in order and overwrites the oldest once full,
    including one insert with more kept rows than the capacity. Catches a
    pointer that advances by all rows instead of kept ones, and scatter
    collisions when an insert wraps."""
    spec = envs.make("mpe:simple_spread").spec
    C = 7
    buf = empty_buffer(spec, C)
    ring, ptr, size = [None] * C, 0, 0
    rng = np.random.default_rng(4)
    n, A, O = spec.num_agents, spec.num_actions, spec.obs_dim
    ins = jax.jit(insert)
    for rows in (3, 5, 12, 4):
        obs = rng.normal(size=(rows, n, O)).astype(np.float32)
        act = rng.integers(0, A, (rows, n)).astype(np.int32)
        av = np.ones((rows, n, A), bool)
        keep = rng.uniform(size=rows) < 0.7
        buf = ins(buf, obs, av, act, keep)
        for r in np.nonzero(keep)[0]:
            ring[ptr] = (obs[r], act[r])
            ptr, size = (ptr + 1) % C, min(size + 1, C)
        assert int(buf.ptr) == ptr and int(buf.size) == size
        for j in range(C):
            if ring[j] is not None:
                np.testing.assert_array_equal(np.asarray(buf.obs[j]), ring[j][0])
                np.testing.assert_array_equal(np.asarray(buf.actions[j]), ring[j][1])


def test_batches_mix_demos_and_buffer_at_the_stated_ratio():
    """Each batch row comes from the run's demo prefix with probability ρ
    (fixed, or demo_steps / (demo_steps + size) when ρ = −1), else from the
    filled part of the buffer. Rows past the prefix or past the buffer's size
    are marked 9 and must never be drawn (sampling the whole demo array, or
    the buffer's empty slots, fails); an empty buffer gives demos only."""
    from types import SimpleNamespace

    from jaxil.algorithms.interactive.loop import Demos, sample_batch

    spec = envs.make("mpe:simple_spread").spec
    n, O, A = spec.num_agents, spec.obs_dim, spec.num_actions
    D, C, nd, nb = 50, 40, 30, 10
    demo_obs = np.full((D, n, O), 1.0, np.float32)
    demo_obs[nd:] = 9.0
    demos = Demos(obs=jnp.asarray(demo_obs), avail=jnp.ones((D, n, A), bool),
                  actions=jnp.zeros((D, n), jnp.int32))
    buf = empty_buffer(spec, C)
    buf = insert(buf, jnp.full((nb, n, O), 2.0), jnp.ones((nb, n, A), bool),
                 jnp.zeros((nb, n), jnp.int32), jnp.ones(nb, bool))
    buf = buf.replace(obs=buf.obs.at[nb:].set(9.0))

    def share(ratio, buffer):
        st = SimpleNamespace(demo_steps=jnp.int32(nd), buffer=buffer,
                             hp=SimpleNamespace(demo_ratio=jnp.float32(ratio)))
        o = np.asarray(sample_batch(jax.random.PRNGKey(0), st, demos, 20_000).obs[:, 0, 0])
        assert not (o == 9.0).any()
        return (o == 1.0).mean()

    assert abs(share(-1.0, buf) - nd / (nd + nb)) < 0.015
    assert abs(share(0.3, buf) - 0.3) < 0.015
    assert share(0.3, empty_buffer(spec, C)) == 1.0


# ----------------------------------------------------------------------------- shared control


def _counter_policies(num_actions):
    """Student: always action 0. Expert: action 1 + (its call count mod
    A−1), so its action reveals how many steps it has seen."""
    def s_init(key, n):
        return jnp.zeros((), jnp.int32)

    def s_act(params, obs, avail, key, c):
        return jnp.zeros(obs.shape[0], jnp.int32), c

    def x_act(params, obs, avail, key, c):
        return jnp.full(obs.shape[0], 1 + c % (num_actions - 1), jnp.int32), c + 1

    return Policy(s_init, s_act), Policy(s_init, x_act)


@functools.lru_cache(maxsize=None)
def _mpe_mixed():
    """``mixed_episodes`` on MPE spread with the counter policies, 64 episodes,
    the switch rule an argument: ONE compiled program for the switch and the
    coin tests below."""
    env = envs.make("mpe:simple_spread")
    student, expert = _counter_policies(env.spec.num_actions)
    run = jax.jit(lambda rule, key: mixed_episodes(env, student, expert, None, None, rule, key, 64))
    rule = lambda kind, lo, hi, p, beta: SwitchRule(  # noqa: E731  (one dtype per field: one compile)
        jnp.int32(kind), jnp.int32(lo), jnp.int32(hi), jnp.float32(p), jnp.float32(beta))
    return env, lambda key, *r: run(rule(*r), key)


def test_expert_takes_over_at_k_and_inherits_its_history():
    """With a fixed switch k the played action is the student's for t < k and
    the expert's from k on; the expert has been run on every step, so at k
    its carry already counts k steps. Catches t > k (off by one), an expert
    started fresh at the switch, and a label that is the played action
    instead of the expert's."""
    env, run = _mpe_mixed()
    A = env.spec.num_actions
    k = 4
    ep = run(jax.random.PRNGKey(0), SWITCHES.index("fixed"), k, k, 1.0, 0.0)
    T = int(ep.length[0])
    t = np.arange(T)
    want_expert = 1 + t % (A - 1)
    np.testing.assert_array_equal(np.asarray(ep.carry.expert_acted[0, :T]), t >= k)
    np.testing.assert_array_equal(np.asarray(ep.actions[0, :T, 0]), np.where(t >= k, want_expert, 0))
    np.testing.assert_array_equal(np.asarray(ep.carry.label[0, :T, 0]), want_expert)
    np.testing.assert_array_equal(np.asarray(ep.carry.student_action[0, :T, 0]), 0)


@pytest.mark.slow  # default-suite time (~15 s); run with -m slow
def test_labels_are_legal_actions():
    """An expert that always proposes the last action (attack the last enemy:
    usually unavailable, and never available to a dead SMAX unit) gets its
    label mapped onto the action the environment would execute, exactly
    as the played action is. Before the fix, the raw proposal was the label:
    a DAgger student on smacv2_5_units with the SMAX heuristic (which moves
    dead units) trained on log-probabilities of masked actions, loss ~1e9."""
    env = envs.make("smax:3m")
    A = env.spec.num_actions
    student, _ = _counter_policies(A)
    last = Policy(lambda key, n: jnp.int32(0),
                  lambda p, obs, avail, key, c: (jnp.full(obs.shape[0], A - 1, jnp.int32), c))
    ep = jax.jit(lambda key: mixed_episodes(env, student, last, None, None,
                                            SwitchRule(0, 0, 0, 1.0, 1.0), key, 8))(
        jax.random.PRNGKey(0))
    T = ep.mask.shape[1]
    m = np.asarray(ep.mask)
    avail = np.asarray(ep.avail_actions[:, :T])
    label = np.asarray(ep.carry.label)
    assert np.take_along_axis(avail, label[..., None], -1)[..., 0][m].all()
    np.testing.assert_array_equal(label[m], np.asarray(ep.actions)[m])  # the expert acted
    assert (~avail[..., A - 1][m]).any()  # the raw proposal was illegal somewhere


def test_dagger_coin_follows_beta():
    """β = 0 never, β = 1 always, β = 0.3 about 30 % of steps hands the
    controls to the expert (a coin drawn once per episode, or compared the
    wrong way, fails)."""
    _, run = _mpe_mixed()
    key = jax.random.PRNGKey(2)

    def acted(beta):
        ep = run(key, 0, 0, 0, 1.0, beta)
        return np.asarray(ep.carry.expert_acted), np.asarray(ep.mask)

    for beta, share in ((0.0, 0.0), (1.0, 1.0)):
        a, m = acted(beta)
        assert float(a[m].mean()) == share, beta
    per_episode = acted(0.3)[0].mean(1)
    assert abs(per_episode.mean() - 0.3) < 0.04 and per_episode.std() < 0.2


# ----------------------------------------------------------------------------- regimes


def test_regime_presets_and_range_checks():
    """Presets set the documented knobs; out-of-range values are refused with
    the name and the allowed range."""
    kw = dict(sft_labels=100, has_win=True)
    oec = regime("oec", 1000, **kw)
    assert oec["mask_prefix"] and oec["verifier"] == 1 and not oec["use_label"]
    assert regime("dagger", 1000, **kw)["use_label"] and regime("bc", 1000, **kw)["demo_labels"] == 1000
    assert regime("oec", 1000, sft_labels=100, has_win=False)["verifier"] == 2
    for bad, match in ((dict(beta0=1.5), "beta0.*0, 1"), (dict(switch_p=0.0), "switch_p"),
                       (dict(repeat_limit=1), "repeat_limit"), (dict(lr=-1.0), "lr"),
                       (dict(demo_labels=2000), "demo_labels"), (dict(switch_kind="late2"), "switch_kind"),
                       (dict(demo_ratio=float("nan")), "finite")):
        with pytest.raises(ValueError, match=match):
            regime("dagger", 1000, **kw, **bad)
    with pytest.raises(ValueError, match="budget"):
        regime("oec", 50, **kw)
    with pytest.raises(ValueError, match="unknown interactive method"):
        regime("gail", 1000, **kw)
    with pytest.raises(ValueError, match="rounds"):
        InteractiveConfig(rounds=0)


# ----------------------------------------------------------------------------- rounds, resume

CFG = InteractiveConfig(rounds=3, envs_per_round=8, updates_per_round=20, sft_updates=20,
                        eval_episodes=8, sft_labels=150, capacity=1024, hidden=(32,))


@pytest.fixture(scope="module")
def spread():
    from jaxil.cli.interactive import load_expert

    env, pol, params, _ = load_expert("mpe:simple_spread", "scripted")
    return env, pol, params


def _regimes(env, budget=900):
    kw = dict(sft_labels=CFG.sft_labels, has_win=env.spec.has_win)
    return [(m, regime(m, budget, **kw)) for m in ("bc", "dagger", "oec", "onpolicy")] + [
        # learning rates so small that the weights stay where each round starts
        ("scratch", regime("dagger", budget, **kw, lr=1e-9, scratch=True)),
        ("warm", regime("dagger", budget, **kw, lr=1e-9))]


@pytest.mark.slow  # default-suite time (about 80 s of compile); run with -m slow
def test_rounds_respect_the_budget_and_resume_reproduces(spread, tmp_path, monkeypatch):
    """One program runs BC, DAgger, OEC and rejection sampling × 2 seeds:
    - no regime spends more expert labels than its budget, and the interactive
      share is spread over rounds (an allowance that forgets what earlier
      rounds spent, or counting kept instead of paid episodes, breaks this);
    - BC and rejection sampling ask the expert nothing interactively, and BC
      keeps none of its rollouts (a BC preset whose free, unlabelled
      rollouts pass the budget would imitate its own actions);
    - a run killed after round 2's metrics but before its checkpoint resumes
      from round 1 and reproduces the uninterrupted metrics and states
      exactly (a key drawn from the wall clock, or metrics rows kept past
      the checkpoint, would break it).
    """
    from jaxil.runs.checkpoint import Checkpointer
    from jaxil.algorithms.interactive.loop import run

    env, pol, params = spread
    regs = _regimes(env)
    full = run(env, pol, params, regs, seeds=2, config=CFG, out_dir=tmp_path / "full",
               progress=False, diagnostics=False)
    rows = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        assert r["labels"] <= 900
        if r["round"] > 0:
            assert r["interactive_labels"] <= (900 - 150) * r["round"] // CFG.rounds
            if r["regime"] in ("bc", "onpolicy"):
                assert r["interactive_labels"] == 0
            if r["regime"] == "bc":  # BC trains on the demonstrations only
                assert r["trained_steps"] == 0 and r["buffer_size"] == 0
    final = {r["regime"]: r for r in rows if r["round"] == CFG.rounds}
    assert final["dagger"]["labels"] > 600 and final["oec"]["labels"] > 450

    # Retraining from scratch restarts each round from a fresh initialisation
    # (ignoring the flag, or re-initialising the warm runs, fails here).
    from jaxil.algorithms.interactive.loop import make_student

    st = full["states"]
    student = make_student(env, CFG)
    idx = {r["regime"]: r["run"] for r in rows if r["round"] == 0 and r["seed"] == 0}
    fresh = lambda i: student.init(st.init_key[i], None).params
    gap = lambda i: max(float(np.abs(np.asarray(a) - np.asarray(b[i])).max()) for a, b in zip(
        jax.tree.leaves(fresh(i)), jax.tree.leaves(st.student.params)))
    assert gap(idx["scratch"]) < 1e-6 and gap(idx["warm"]) > 1e-2

    save = Checkpointer.save

    def killed(self, step, state):
        if step == 2:
            raise KeyboardInterrupt
        save(self, step, state)

    monkeypatch.setattr(Checkpointer, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        run(env, pol, params, regs, seeds=2, config=CFG, out_dir=tmp_path / "killed",
            progress=False, diagnostics=False)
    with open(tmp_path / "killed" / "metrics.jsonl", "a") as f:
        f.write('{"round": 3, "run"')  # a line cut by the kill
    monkeypatch.setattr(Checkpointer, "save", save)
    with pytest.raises(FileExistsError, match="--resume"):
        run(env, pol, params, regs, seeds=2, config=CFG, out_dir=tmp_path / "killed",
            progress=False, diagnostics=False)
    with pytest.raises(ValueError, match="differ.*regimes"):
        run(env, pol, params, _regimes(env, 1000), seeds=2, config=CFG,
            out_dir=tmp_path / "killed", resume=True, progress=False, diagnostics=False)
    resumed = run(env, pol, params, regs, seeds=2, config=CFG, out_dir=tmp_path / "killed",
                  resume=True, progress=False, diagnostics=False)
    again = [json.loads(x) for x in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert again == rows
    for a, b in zip(jax.tree.leaves(full["states"]), jax.tree.leaves(resumed["states"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow  # a whole interactive run's compiles (about 1 min on 2 cores)
def test_a_diverging_student_stops_the_run_with_its_round_and_update(spread, tmp_path):
    """A regime whose student diverges (learning rate 1e30) stops the run in
    round 1, naming the run, its regime, the update and the loss; round 1 is
    not recorded and no checkpoint holds the NaN student. Before the guard,
    the run finished with NaN weights evaluated as a plausible return. Breaks
    if the guard checks only the SFT, or records the round before checking."""
    from jaxil.runs.guard import NonFiniteError
    from jaxil.algorithms.interactive.loop import run

    env, pol, params = spread
    regs = _regimes(env)
    kw = dict(sft_labels=CFG.sft_labels, has_win=env.spec.has_win)
    regs[-1] = ("warm", regime("dagger", 900, **kw, lr=1e30))
    with pytest.raises(NonFiniteError) as e:
        run(env, pol, params, regs, seeds=2, config=CFG, out_dir=tmp_path, progress=False,
            diagnostics=False)
    msg = str(e.value)
    assert "(round 1) diverged in run 10 (warm, seed 0)" in msg and "bc_loss = nan" in msg
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {r["round"] for r in rows} == {0}
    assert not any((tmp_path / "checkpoints").iterdir())


def test_cli_refuses_bad_input_in_one_line(capsys):
    """A budget below the SFT set exits 1 with a one-line message (no
    traceback); an out-of-range β is refused by the parser (exit 2) with the
    allowed range."""
    from jaxil.cli.main import main

    assert main(["interactive", "oec", "--env", "mpe:simple_spread", "--expert", "scripted",
                 "--budget", "100", "--sft-labels", "150"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "budget" in err[0] and "150" in err[0]
    with pytest.raises(SystemExit) as e:  # refused when parsed, before any work
        main(["interactive", "dagger", "--env", "mpe:simple_spread", "--expert", "scripted",
              "--budget", "1000", "--beta0", "2"])
    assert e.value.code == 2
    assert "argument --beta0: must be in [0, 1], got 2" in capsys.readouterr().err


def test_box_action_steps_flatten_into_the_buffer():
    """Box-action environments have ``avail [E, T, N, 0]``: flattening the
    round's ``[E, T, ...]`` arrays must not infer a size from zero-width
    axes (a ``reshape(-1, N, 0)`` fails), and float targets are stored as
    floats (an int32 action buffer would truncate them)."""
    from jaxil.algorithms.interactive.loop import _flat

    spec = envs.make("mpe:simple_spread_continuous").spec
    E, T, n, d = 2, 3, spec.num_agents, spec.action.dim
    obs = jnp.ones((E, T, n, spec.obs_dim))
    avail = jnp.zeros((E, T, n, 0), bool)
    act = jnp.full((E, T, n, d), 0.25)
    keep = jnp.array([[1, 1, 0], [1, 0, 0]], bool)
    buf = insert(empty_buffer(spec, 8), _flat(obs), _flat(avail), _flat(act), _flat(keep))
    assert int(buf.size) == 3 and buf.avail.shape == (8, n, 0)
    np.testing.assert_array_equal(np.asarray(buf.actions[:3]), 0.25)


@pytest.mark.slow
def test_cli_run_killed_with_sigkill_resumes_exactly(tmp_path):
    """The real thing: ``jaxil interactive`` killed by SIGKILL once its first
    checkpoint exists, then ``--resume``, gives the metrics of an
    uninterrupted run line for line (a resume that restarts the round count,
    redraws keys, or keeps rows of an uncommitted round fails)."""
    import sys

    from helpers.cli_kill import kill_then_resume

    args = [sys.executable, "-m", "jaxil.cli.main", "interactive", "dagger", "--env", "mpe:simple_spread",
            "--expert", "scripted", "--budget", "1200", "--sft-labels", "150", "--rounds", "6",
            "--envs-per-round", "8", "--updates-per-round", "200", "--sft-updates", "20",
            "--eval-episodes", "8", "--hidden", "32", "--seeds", "2", "--no-progress",
            "--no-diagnostics"]
    kill_then_resume(args, tmp_path, min_step=0, max_step=6, timeout_s=300)
    a = (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
    b = (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in a] == [json.loads(x) for x in b]


def _one_dagger_regime():
    """One DAgger regime's traced knobs (unstacked), for driving `train_student`."""
    from jaxil.algorithms.interactive.config import stack_regimes

    return jax.tree.map(lambda x: x[0], stack_regimes([regime(
        "dagger", 2000, sft_labels=100, has_win=False, switch_hi=1, return_threshold=0.0)]))


def _round_zero_state(learner, buffer, hp, demo_steps, k_init, k_state):
    """An `InteractiveState` before its first round, around `learner`."""
    from jaxil.algorithms.interactive.loop import InteractiveState

    return InteractiveState(student=learner, buffer=buffer, hp=hp, labels=jnp.int32(0),
                            env_steps=jnp.int32(0), round=jnp.int32(0),
                            demo_steps=jnp.int32(demo_steps), init_key=k_init, key=k_state)


def test_student_updates_raise_the_likelihood_of_the_labels():
    """50 of the student's fused updates (``train_student``: the SFT start
    and every round's retraining) on demonstrations and a buffer of
    labelled steps, the label a_i = argmax o_i[:A]: the student's mean
    probability of the labels rises from ~1/A to ~0.9. Kills 'the student's
    update reversed at its call site' (the step taken against the BC loss's
    gradient, e.g. the loss negated) for every interactive method (DAgger,
    OEC, rejection sampling all train through it); the round tests that
    would see it are slow."""
    from jaxil.algorithms.interactive.loop import Demos, make_student, train_student
    from jaxil.algorithms.offline.bc import BCHParams

    from helpers.fast_compile import fast_call
    from helpers.teachers import MaskedToy

    env = MaskedToy()  # only its spec matters here
    spec = env.spec
    n, A = spec.num_agents, spec.num_actions
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(2, 256, n, spec.obs_dim)).astype(np.float32)
    label = obs[..., :A].argmax(-1).astype(np.int32)
    avail = np.ones((2, 256, n, A), bool)
    demos = Demos(obs=jnp.asarray(obs[0]), avail=jnp.asarray(avail[0]),
                  actions=jnp.asarray(label[0]))
    config = InteractiveConfig(hidden=(32,), batch_size=64)
    student = make_student(env, config)
    hp = _one_dagger_regime()
    policy = student.policy()

    def run(key):
        k_init, k_state = jax.random.split(key)
        ls = student.init(k_init, BCHParams(beta=jnp.float32(0.0), lr=jnp.float32(1e-2)))
        buf = insert(empty_buffer(spec, 512), jnp.asarray(obs[1]), jnp.asarray(avail[1]),
                     jnp.asarray(label[1]), jnp.ones(256, bool))
        state = _round_zero_state(ls, buf, hp, 256, k_init, k_state)
        p = lambda params: jnp.exp(policy.log_prob(  # noqa: E731
            params, jnp.asarray(obs), jnp.asarray(avail), jnp.asarray(label))).mean()
        new, _, _ = train_student(student, state, demos, 50, config.batch_size)
        return p(ls.params), p(new.student.params)

    before, after = map(float, fast_call(run, jax.random.PRNGKey(0)))
    assert after > before + 0.2, (before, after)


def test_ppo_student_standardises_by_the_sft_demonstrations_and_keeps_them():
    """The `student="ppo"` network (the PPO actor's, with observation
    statistics): `with_demo_stats` sets the statistics to the mean and
    population variance of the first `steps` demonstration steps, all agents
    pooled (float64 numpy reference), and 30 fused student updates leave them
    exactly as they are while raising the likelihood of the labels. Fails if
    the statistics come from every demonstration instead of the SFT prefix,
    if the student is still the relu BC network (no statistics at all), if
    the updates move the statistics (Adam stepping them as weights), or if
    the update climbs the BC loss's gradient."""
    from jaxil.algorithms.interactive.loop import (Demos, make_student, student_net,
                                                   train_student, with_demo_stats)
    from jaxil.algorithms.offline.bc import BCHParams

    from helpers.fast_compile import fast_call

    env = envs.make("mpe:simple_spread_continuous")
    spec = env.spec
    n, O, d = spec.num_agents, spec.obs_dim, spec.action.dim
    rng = np.random.default_rng(1)
    obs = (3.0 + 2.0 * rng.normal(size=(400, n, O))).astype(np.float32)
    obs[300:] += 50.0  # beyond the SFT prefix: must not enter the statistics
    act = np.tanh(obs[..., :d] - 3.0).astype(np.float32) * 0.8
    demos = Demos(obs=jnp.asarray(obs), avail=jnp.zeros((400, n, 0), bool),
                  actions=jnp.asarray(act))
    config = InteractiveConfig(hidden=(32,), batch_size=64, student="ppo")
    net = student_net(spec, config)
    assert net.obs_norm and net.param_log_std and net.box == "tanh_gaussian"
    student = make_student(env, config)
    hp = _one_dagger_regime()
    policy = student.policy()

    def run(key):
        k_init, k_state = jax.random.split(key)
        ls = student.init(k_init, BCHParams(beta=jnp.float32(0.0), lr=jnp.float32(3e-3)))
        ls = ls.replace(params=with_demo_stats(ls.params, net, demos, 300))
        state = _round_zero_state(ls, empty_buffer(spec, 16), hp, 300, k_init, k_state)
        lp = lambda params: policy.log_prob(  # noqa: E731
            params, demos.obs[:300], demos.avail[:300], demos.actions[:300]).mean()
        new, _, _ = train_student(student, state, demos, 30, config.batch_size)
        return ls.params, new.student.params, lp(ls.params), lp(new.student.params)

    p0, p1, before, after = fast_call(run, jax.random.PRNGKey(0))
    ref = obs[:300].astype(np.float64).reshape(-1, O)
    stats = p0["policy"]["obs_stats"]
    np.testing.assert_allclose(np.asarray(stats.mean), ref.mean(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(stats.var), ref.var(0), rtol=1e-3)
    for a, b in zip(jax.tree.leaves(stats), jax.tree.leaves(p1["policy"]["obs_stats"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(after) > float(before) + 0.5, (float(before), float(after))


@pytest.mark.slow  # a whole interactive run's compiles on box actions (about 1 min)
def test_ppo_student_runs_dagger_and_scratch_keeps_the_sft_statistics(tmp_path):
    """`run` with `student="ppo"` on box actions (MPE spread, scripted
    expert), DAgger warm and from scratch: every run's observation
    statistics at the end are those of the SFT demonstrations, also in the
    run re-initialised every round (a fresh initialisation that dropped them
    would reset them to mean 0, variance 1), and the evaluations are finite
    with their episode lengths recorded."""
    from jaxil.algorithms.interactive.loop import collect_demos, run
    from jaxil.cli.interactive import load_expert

    env, pol, params, _ = load_expert("mpe:simple_spread_continuous", "scripted")
    cfg = InteractiveConfig(rounds=2, envs_per_round=4, updates_per_round=20, sft_updates=20,
                            eval_episodes=4, sft_labels=150, capacity=1024, hidden=(32,),
                            student="ppo")
    kw = dict(sft_labels=cfg.sft_labels, has_win=env.spec.has_win)
    regs = [("dagger", regime("dagger", 900, **kw)),
            ("scratch", regime("dagger", 900, **kw, scratch=True))]
    out = run(env, pol, params, regs, seeds=1, config=cfg, out_dir=tmp_path / "r",
              progress=False, diagnostics=False)
    demos, _, _ = collect_demos(env, pol, params, jax.random.PRNGKey(777_777), 64)
    steps = out["demos"]["sft_steps"]
    ref = np.asarray(demos.obs[:steps], np.float64).reshape(-1, env.spec.obs_dim)
    stats = out["states"].student.params["policy"]["obs_stats"]
    for i in range(2):
        np.testing.assert_allclose(np.asarray(stats.mean[i]), ref.mean(0), rtol=1e-4, atol=1e-4)
        # (constant features: the initial count of 1e-4 at variance 1 leaves ~1e-6)
        np.testing.assert_allclose(np.asarray(stats.var[i]), ref.var(0), rtol=1e-3, atol=1e-5)
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r["eval_return"]) and r["eval_length"] == env.spec.max_steps
               for r in rows if "eval_return" in r)


def test_a_greedy_teacher_expert_acts_on_its_mode_and_a_scripted_one_is_refused(tmp_path,
                                                                                monkeypatch):
    """`load_expert(..., greedy=True)` on SMAX 3m (the shipped teacher's
    expert-tier checkpoint): the same joint action under every key, where the
    sampling expert of the same checkpoint draws different ones, and the
    greedy action is the sampled actions' most frequent choice per agent; the
    source names the mode. A scripted expert is refused with a ValueError that
    names the flag. Bugs caught: the flag ignored (the sampling policy comes
    back), another checkpoint than the tier's loaded (its mode is not the
    sampled actions' mode), the shipped teacher's recorded label used as a
    path (a FileNotFoundError outside the repository root)."""
    from jaxil.cli.interactive import load_expert
    from jaxil.envs.policies import as_policy

    monkeypatch.chdir(tmp_path)  # away from the repository root, where the label is a path
    env, pol, params, source = load_expert("smax:3m", "zoo")
    _, gpol, gparams, gsource = load_expert("smax:3m", "zoo", greedy=True)
    assert gsource == source + " (greedy)" and "@" in source
    _, ts = env.reset(jax.random.PRNGKey(3))
    keys = jax.random.split(jax.random.PRNGKey(0), 256)

    def actions(policy, p):
        pol_ = as_policy(policy)
        carry = pol_.init(jax.random.PRNGKey(1), env.spec.num_agents)
        act = jax.jit(jax.vmap(lambda k: pol_.act(p, ts.obs, ts.avail_actions, k, carry)[0]))
        return np.asarray(act(keys))

    sampled, greedy = actions(pol, params), actions(gpol, gparams)
    assert (greedy == greedy[0]).all()
    assert not (sampled == sampled[0]).all()
    for agent in range(env.spec.num_agents):
        counts = np.bincount(sampled[:, agent], minlength=env.spec.action.num_actions)
        assert greedy[0, agent] == counts.argmax(), (agent, counts)
    with pytest.raises(ValueError, match="--expert-greedy needs a teacher expert"):
        load_expert("mpe:simple_spread", "scripted", greedy=True)
