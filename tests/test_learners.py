"""Learners: configs, both parameter modes, and learning by learning."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.core import DiscreteActions, EnvSpec
from envs.policies import epsilon_mixture
from envs.smax import heuristic_policy
from jaxil.data import Dataset, concatenate
from jaxil.data.sampling import Transitions
from jaxil.learners import LEARNERS, DiceConfig, LearnerData, make_learner, update_n

from fast_compile import fast_call

SPEC = EnvSpec("synthetic:test", num_agents=3, obs_dim=6, state_dim=5,
               action=DiscreteActions(4, noop_action=0), max_steps=10)


def _synthetic(key, k=2048):
    """Expert transitions act a_i = argmax of the first 4 obs features; poor
    ones act uniformly. The expert flag is the ground truth."""
    ks = jax.random.split(key, 6)
    obs = jax.random.normal(ks[0], (k, 3, 6))
    gs = jax.random.normal(ks[1], (k, 5))
    expert = jnp.arange(k) < k // 4
    good = jnp.argmax(obs[..., :4], -1)
    rand = jax.random.randint(ks[2], (k, 3), 0, 4)
    actions = jnp.where(expert[:, None], good, rand).astype(jnp.int32)
    avail = jnp.ones((k, 3, 4), bool)
    t = Transitions(obs=obs, global_state=gs, avail=avail, actions=actions,
                    reward=jnp.zeros(k), next_obs=jax.random.normal(ks[3], (k, 3, 6)),
                    next_global_state=jax.random.normal(ks[4], (k, 5)), next_avail=avail,
                    done=jnp.zeros(k, bool), init_obs=obs, init_global_state=gs, init_avail=avail,
                    traj_index=jnp.arange(k) // 10, step=jnp.arange(k) % 10)
    return LearnerData(union=t, expert=expert), good


# bc_expert / bc_mix are bc_union with another β: one BC case covers the code.
CASES = [(a, True) for a in LEARNERS if a not in ("bc_expert",)] + [("misodice", False), ("indd", False)]


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


def test_dice_weights_favour_expert_transitions():
    """MisoDICE's discriminator reward and policy weights separate D_E from the
    poor data: the mechanism that lets it beat BC on the union."""
    data, _ = _synthetic(jax.random.PRNGKey(0))
    learner = make_learner("misodice", SPEC, hidden=(64,), batch_size=256)
    state = learner.init(jax.random.PRNGKey(1))
    state, m = fast_call(lambda s, d: update_n(learner, s, d, 300), state, data)
    assert float(m["reward_expert"]) > float(m["reward_union"]) + 0.5


def test_config_and_name_errors():
    with pytest.raises(KeyError, match="unknown learner"):
        make_learner("misodic", SPEC)
    with pytest.raises(ValueError, match="mixing"):
        DiceConfig(mixing="qmix")
    with pytest.raises(ValueError, match="batch_size"):
        make_learner("misodice", SPEC, batch_size=0)
    learner = make_learner("misodice", SPEC, hidden=(8,), batch_size=8)
    data, _ = _synthetic(jax.random.PRNGKey(0), 64)
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
