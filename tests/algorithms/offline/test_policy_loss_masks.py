"""The legal-action mask at BC's policy-loss call site, in the default suite.

The other BC tests train on data whose every action is legal (`avail` all
True), where a loss that drops the batch's mask (scoring the actions
against every action instead of the legal ones) gives the same numbers.
Here about half the actions are unavailable at each step. (The DICE
learners' weighted BC is checked the same way by the float64 reference of
test_misodice_fidelity.py, whose data have unavailable actions too.)
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxil.algorithms.offline import LearnerData, make_learner
from jaxil.data.sampling import Transitions
from jaxil.envs.core import DiscreteActions, EnvSpec

from helpers.fast_compile import fast_call

SPEC = EnvSpec("synthetic:masks", num_agents=2, obs_dim=4, state_dim=3,
               action=DiscreteActions(5, noop_action=0), max_steps=8)
K, LENGTH, B = 256, 8, 64


def _data() -> LearnerData:
    """K steps of K/LENGTH trajectories, each recorded action legal (action
    0 always is, the others with probability 1/2)."""
    rng = np.random.default_rng(0)
    n, a = SPEC.num_agents, SPEC.num_actions
    traj, step = np.arange(K) // LENGTH, np.arange(K) % LENGTH
    obs = rng.normal(size=(K, n, SPEC.obs_dim)).astype(np.float32)
    nxt = rng.normal(size=(K, n, SPEC.obs_dim)).astype(np.float32)
    gs = rng.normal(size=(K, SPEC.state_dim)).astype(np.float32)
    avail = rng.random((K, n, a)) < 0.5
    avail[..., 0] = True
    actions = np.array([[rng.choice(np.flatnonzero(avail[k, i])) for i in range(n)]
                        for k in range(K)], np.int32)
    t = Transitions(obs=jnp.asarray(obs), global_state=jnp.asarray(gs), avail=jnp.asarray(avail),
                    actions=jnp.asarray(actions), reward=jnp.zeros(K),
                    next_obs=jnp.asarray(nxt), next_global_state=jnp.asarray(gs),
                    next_avail=jnp.asarray(avail), done=jnp.asarray(step == LENGTH - 1),
                    init_obs=jnp.asarray(obs[traj * LENGTH]),
                    init_global_state=jnp.asarray(gs[traj * LENGTH]),
                    init_avail=jnp.asarray(avail[traj * LENGTH]),
                    traj_index=jnp.asarray(traj, jnp.int32), step=jnp.asarray(step, jnp.int32))
    return LearnerData(union=t)


def test_bc_loss_is_the_masked_likelihood_of_its_batch():
    """BC's update reports −mean_b Σ_i log π(a_bi | o_bi) over the LEGAL
    actions of each step (the policy's own masked log-probability of the
    batch). Kills BC's loss scored without the batch's ``avail`` (all
    actions legal), which the tests on all-legal data cannot see; the
    reference under that mutation is checked to be far off."""
    learner = make_learner("bc_union", SPEC, hidden=(8,), batch_size=B)
    data = LearnerData(union=_data().union)  # no labels: plain BC on D_U
    policy = learner.policy(False)

    def run(key):
        state = learner.init(key)
        batch = learner.sample(jax.random.PRNGKey(1), data)
        u = batch.union
        _, metrics = learner.update(state, batch)
        ref = lambda av: -jnp.mean(jnp.sum(  # noqa: E731
            policy.log_prob(state.params, u.obs, av, u.actions), -1))
        return metrics["bc_loss"], ref(u.avail), ref(jnp.ones_like(u.avail))

    loss, want, unmasked = map(float, fast_call(run, jax.random.PRNGKey(0)))
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    assert abs(want - unmasked) > 0.3, (want, unmasked)

