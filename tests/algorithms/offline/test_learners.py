"""Learners: configs, both parameter modes, and learning by learning."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.envs.core import DiscreteActions, EnvSpec
from jaxil.envs.policies import epsilon_mixture
from jaxil.envs.smax import heuristic_policy
from jaxil.data import Dataset, concatenate
from jaxil.data.sampling import Transitions
from jaxil.algorithms.offline import LEARNERS, DiceConfig, LearnerData, make_learner, update_n

from helpers.fast_compile import fast_call, fast_compile

SPEC = EnvSpec("synthetic:test", num_agents=3, obs_dim=6, state_dim=5,
               action=DiscreteActions(4, noop_action=0), max_steps=10)


_SYNTHETIC = {}


def _synthetic(key, k=2048, length=8):
    """``_synthetic_data``, made by one program per size compiled at XLA's
    level 0 (op by op, or at the default level, drawing the data takes
    seconds of compiling)."""
    if (k, length) not in _SYNTHETIC:
        fn = functools.partial(_synthetic_data, k=k, length=length)
        _SYNTHETIC[k, length] = fast_compile(fn, key)
    return _SYNTHETIC[k, length](key)


def _synthetic_data(key, k, length):
    """Trajectories of ``length`` steps (k/length of them): expert trajectories
    (the first quarter) act a_i = argmax of the first 4 obs features, poor
    ones uniformly; the expert flag is the ground truth. As real data:
    next_obs is the next step's observation (a final one after the last
    step), init_obs step 0's, and every other trajectory ends terminal
    (``done``) while the rest are truncated."""
    ks = jax.random.split(key, 6)
    m = k // length
    traj, step = jnp.arange(k) // length, jnp.arange(k) % length
    entries = jax.random.normal(ks[0], (m, length + 1, 3, 6))  # T+1 observations per trajectory
    states = jax.random.normal(ks[1], (m, length + 1, 5))
    obs, gs = entries[traj, step], states[traj, step]
    expert = traj < m // 4
    good = jnp.argmax(obs[..., :4], -1)
    rand = jax.random.randint(ks[2], (k, 3), 0, 4)
    actions = jnp.where(expert[:, None], good, rand).astype(jnp.int32)
    avail = jnp.ones((k, 3, 4), bool)
    t = Transitions(obs=obs, global_state=gs, avail=avail, actions=actions,
                    reward=jnp.zeros(k), next_obs=entries[traj, step + 1],
                    next_global_state=states[traj, step + 1], next_avail=avail,
                    done=(step == length - 1) & (traj % 2 == 0), init_obs=entries[traj, 0],
                    init_global_state=states[traj, 0], init_avail=avail,
                    traj_index=traj.astype(jnp.int32), step=step.astype(jnp.int32))
    return LearnerData(union=t, expert=expert), good


# bc_expert / bc_mix are bc_union with another β: one BC case covers the code.
# Slow (default-suite time), as the default suite updates them elsewhere:
# bc_union shared by bc_mix here; misodice shared by test_misodice_fidelity.py's
# numpy reference; the DICE learners' independent networks (one parameter
# code, whatever the mixing) by indd's here, the cheapest of them to compile,
# and indd's shared networks by misodice_vdn's.
_COVERED = {("bc_union", True), ("misodice", True), ("misodice", False), ("indd", True)}
CASES = [pytest.param(a, s, marks=[pytest.mark.slow] if (a, s) in _COVERED else [])
         for a, s in [(a, True) for a in LEARNERS if a not in ("bc_expert",)]
         + [("misodice", False), ("indd", False)]]


@pytest.mark.parametrize("algo,shared", CASES)
def test_every_learner_updates_finitely_in_both_modes(algo, shared):
    data, _ = _synthetic(jax.random.PRNGKey(0), 256)
    learner = make_learner(algo, SPEC, hidden=(16,), batch_size=32, shared=shared)
    state = fast_call(learner.init, jax.random.PRNGKey(1))  # XLA level 0: fast_compile.py
    leaves = jax.tree.leaves(state.params["policy"])
    if not shared:
        assert all(x.shape[0] == 3 for x in leaves), "independent mode stacks an agent axis"
    new, metrics = fast_call(lambda s, d: update_n(learner, s, d, 3), state, data)
    assert int(new.step) == 3
    assert all(np.isfinite(np.asarray(v)).all() for v in metrics.values())
    assert any(not np.array_equal(a, b) for a, b in
               zip(jax.tree.leaves(state.params), jax.tree.leaves(new.params)))
    a = learner.act(new.params, data.union.obs[0], data.union.avail[0], jax.random.PRNGKey(2))
    assert a.shape == (3,) and a.dtype == jnp.int32


@pytest.mark.slow  # default-suite time (about 17 s; bc_mix's update test stays); run with -m slow
def test_bc_expert_learns_the_expert_rule():
    data, good = _synthetic(jax.random.PRNGKey(0))
    learner = make_learner("bc_expert", SPEC, hidden=(64,), batch_size=128)
    state = learner.init(jax.random.PRNGKey(1), learner.default_hparams().replace(lr=3e-3))
    state, _ = fast_call(lambda s, d: update_n(learner, s, d, 400), state, data)
    exp = np.asarray(data.expert)
    pred = jax.vmap(lambda o, a: learner.act(state.params, o, a, None, True))(
        data.union.obs, data.union.avail)
    acc_expert = float((np.asarray(pred) == np.asarray(good))[exp].mean())
    assert acc_expert > 0.9, acc_expert


@pytest.mark.slow  # default-suite time (about 30 s; the DICE weight-direction and ν-descent tests of test_misodice_fidelity.py stay); run with -m slow
def test_dice_weights_favour_expert_transitions():
    """MisoDICE's discriminator reward and policy weights separate D_E from the
    poor data: the mechanism that lets it beat BC on the union.

    Kills the mutation 'discriminator reward sign flipped in the DICE
    learner' (``reward = −sg(ℓ_tot)``): the policy, trained by weighted BC on
    the union, must put more probability on the expert action than BC on
    the union can (0.25 + 0.75·0.25 = 0.44 here); the flipped reward
    up-weights the poor transitions and drives it below that."""
    data, good = _synthetic(jax.random.PRNGKey(0))
    learner = make_learner("misodice", SPEC, hidden=(64,), batch_size=256)
    # Faster discriminator and policy than the defaults, so 300 updates show it
    # (measured: P(expert action) 0.62 here, 0.19 with the reward flipped).
    hp = learner.default_hparams().replace(lr_actor=jnp.float32(3e-3), lr_disc=jnp.float32(1e-3))
    state = learner.init(jax.random.PRNGKey(1), hp)
    state, m = fast_call(lambda s, d: update_n(learner, s, d, 300), state, data)
    assert float(m["reward_expert"]) > float(m["reward_union"]) + 0.5
    u = data.union
    p_good = float(jnp.exp(learner.policy().log_prob(state.params, u.obs, u.avail, good)).mean())
    assert p_good > 0.5, p_good


def test_config_and_name_errors():
    with pytest.raises(KeyError, match="unknown learner"):
        make_learner("misodic", SPEC)
    with pytest.raises(ValueError, match="mixing"):
        DiceConfig(mixing="qmix")
    with pytest.raises(ValueError, match="batch_size"):
        make_learner("misodice", SPEC, batch_size=0)
    learner = make_learner("misodice", SPEC, hidden=(8,), batch_size=8)
    data, _ = _synthetic(jax.random.PRNGKey(0), 256)
    with pytest.raises(ValueError, match="expert labels"):
        learner.sample(jax.random.PRNGKey(0), data.replace(expert=None))


@pytest.mark.slow
def test_misodice_beats_bc_on_union_smax_3m():
    """4 seeds each; MisoDICE's mean return clears BC(D_U)'s by more than one
    standard deviation on a 40-expert / 200-poor SMAX 3m dataset."""
    env = envs.make("smax:3m")
    spec = env.spec
    heur = heuristic_policy(env)
    run = lambda pol, n, s: jax.jit(lambda k: envs.run_episodes(env, pol, None, k, n))(
        jax.random.PRNGKey(s))
    ds = concatenate([
        Dataset.from_episodes(run(heur, 40, 1), spec, "expert", "heuristic", 1, expert=True),
        Dataset.from_episodes(run(epsilon_mixture(heur, spec, 0.8), 200, 2), spec, "poor",
                              "heuristic-eps0.8", 2, expert=False),
    ])
    data = LearnerData.from_dataset(ds, np.asarray(ds.expert))
    results = {}
    for algo in ("bc_union", "misodice"):
        learner = make_learner(algo, spec, hidden=(64, 64), batch_size=256)
        states = jax.vmap(learner.init)(jax.random.split(jax.random.PRNGKey(0), 4))
        states, _ = jax.jit(jax.vmap(lambda s, d: update_n(learner, s, d, 500), (0, None)))(
            states, data)
        ep = jax.jit(jax.vmap(lambda p, k: envs.run_episodes(env, learner.policy(), p, k, 64),
                              (0, None)))(states.params, jax.random.PRNGKey(9))
        results[algo] = np.asarray(ep.episode_return.mean(1))
    bc, miso = results["bc_union"], results["misodice"]
    assert miso.mean() - bc.mean() > max(miso.std(), bc.std()), results


def test_jit_update_n_donates_a_fresh_state_and_matches_update_n():
    """``jit_update_n`` (state donated) takes a freshly initialised BC state,
    whose learning rate used to be one buffer in the hyper-parameters and in
    the optimiser state (MisoDICE's: three; "Attempt to donate the same
    buffer twice"), returns what ``update_n`` returns, and consumes its input
    (donated). Fails without ``unalias`` in ``init``/``jit_update_n``, with
    the donation dropped, or with K ignored."""
    from jaxil.algorithms.offline import jit_update_n

    data, _ = _synthetic(jax.random.PRNGKey(0), 256)
    learner = make_learner("bc_union", SPEC, hidden=(8,), batch_size=32)
    fresh = learner.init(jax.random.PRNGKey(1))
    ids = [id(x) for x in jax.tree.leaves(fresh)]
    assert len(ids) == len(set(ids)), "init returned one buffer in two leaves"
    want_state, want = fast_call(lambda s, d: update_n(learner, s, d, 2), fresh, data)
    state = learner.init(jax.random.PRNGKey(1))
    got_state, got = jit_update_n(learner, 2)(state, data)
    assert int(got_state.step) == 2
    assert all(x.is_deleted() for x in jax.tree.leaves(state.params))
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-5, atol=1e-6,
                                   err_msg=k)
    for a, b in zip(jax.tree.leaves(got_state.params), jax.tree.leaves(want_state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="k \\(updates per call\\) must be >= 1"):
        jit_update_n(learner, 0)


def test_omapl_actor_update_raises_the_likelihood_of_the_data_actions():
    """30 O-MAPL updates on preference pairs: the actor (weighted BC with the
    Gumbel weights exp(z) > 0) makes the segments' own actions more likely
    than at initialisation. Kills 'the actor loss's sign flipped in the O-MAPL
    update' (``pref + v_loss − actor``), which the labelling tests (scores
    only) do not see."""
    from helpers.data import OMAPL_SPEC, omapl_dataset
    from jaxil.algorithms.offline import PreferenceData
    from jaxil.data.preferences import pair_segments, sample_query_pairs, segment_returns

    ds = omapl_dataset(2, 6, 10)
    pairs = sample_query_pairs(ds, 20, 4, seed=1)
    rx, ry = segment_returns(ds, pairs)
    data = PreferenceData.from_pairs(ds, pairs, (rx > ry).astype(np.float32))
    learner = make_learner("omapl", OMAPL_SPEC, hidden=(16,), mixer_hidden=8, batch_size=4)
    seg = jax.tree.map(jnp.asarray, pair_segments(ds, pairs)[0])
    policy = learner.policy()

    def run(key):
        state = learner.init(key, learner.default_hparams().replace(lr_actor=jnp.float32(1e-2)))
        def logp(s):  # mean over valid steps of Σ_i log π_i(a_i|o_i)
            lp = policy.log_prob(s.params, seg.obs[:, :-1], seg.avail[:, :-1], seg.actions)
            return jnp.sum(lp.sum(-1) * seg.mask) / seg.mask.sum()

        return logp(state), logp(update_n(learner, state, data, 30)[0])

    before, after = map(float, fast_call(run, jax.random.PRNGKey(0)))
    assert after > before + 0.3, (before, after)
