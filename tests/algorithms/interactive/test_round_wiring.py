"""What one interactive round (jaxil.algorithms.interactive.loop.make_round)
hands its loss mask, training targets and label budget, checked through
what it writes into the buffer, in the default suite.

The pure functions (labels.loss_mask, training_targets, labels_spent,
within_allowance) have their own tests on hand-built episodes; the round
tests that run them inside a real round are slow. Here one round of OEC
(the expert takes over at a fixed step k) and one of DAgger run on the tiny
``toy:masked`` environment (episodes of exactly 8 steps, 2 agents) with an
expert that always picks the target, so every count is known: one compiled
round (the regime's knobs are traced) serves both.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil.algorithms.interactive.buffer import empty_buffer
from jaxil.algorithms.interactive.config import InteractiveConfig, regime, stack_regimes
from jaxil.algorithms.interactive.loop import (Demos, InteractiveState, make_round, make_student,
                                               sample_batch)
from jaxil.algorithms.offline.bc import BCHParams
from jaxil.envs.policies import Policy

from helpers.fast_compile import fast_compile
from helpers.teachers import MaskedToy

ENV = MaskedToy()
N, A, T = ENV.spec.num_agents, ENV.spec.num_actions, ENV.spec.max_steps
CONFIG = InteractiveConfig(hidden=(8,), batch_size=16, rounds=2, envs_per_round=8,
                           updates_per_round=1, sft_labels=10, sft_updates=1, capacity=128)
K = 3  # OEC's switch step
SFT_LABELS, INTERACTIVE = 10, 96  # round 0 may spend half of the 96: 48 labels
EXPERT = Policy(lambda key, n: jnp.int32(0),
                lambda p, obs, avail, key, c: (jnp.argmax(obs[:, :A], -1).astype(jnp.int32), c))
KNOBS = dict(sft_labels=SFT_LABELS, has_win=True, verifier="off", repeat_limit=0,
             return_threshold=0.0)
REGIMES = {
    "oec": regime("oec", SFT_LABELS + INTERACTIVE, switch_kind="fixed", switch_lo=K,
                  switch_hi=K, **KNOBS),
    "dagger": regime("dagger", SFT_LABELS + INTERACTIVE, beta_kind="constant", switch_hi=1,
                     **KNOBS),
}


@pytest.fixture(scope="module")
def rounds():
    """``{regime: (state after round 0, metrics)}`` and ``"demos"``."""
    student = make_student(ENV, CONFIG)
    hps = stack_regimes(list(REGIMES.values()))
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(16, N, ENV.spec.obs_dim)).astype(np.float32)
    demos = Demos(obs=jnp.asarray(obs), avail=jnp.ones((16, N, A), bool),
                  actions=jnp.asarray(obs[..., :A].argmax(-1), jnp.int32))

    def state(i):
        k_init, k_state = jax.random.split(jax.random.PRNGKey(i))
        ls = student.init(k_init, BCHParams(beta=jnp.float32(0.0), lr=jnp.float32(1e-3)))
        return InteractiveState(student=ls, buffer=empty_buffer(ENV.spec, CONFIG.capacity),
                                hp=jax.tree.map(lambda x: x[i], hps), labels=jnp.int32(0),
                                env_steps=jnp.int32(0), round=jnp.int32(0),
                                demo_steps=jnp.int32(16), init_key=k_init, key=k_state)

    states = [state(i) for i in range(len(REGIMES))]
    round_fn = fast_compile(make_round(ENV, student, EXPERT, CONFIG), states[0], demos, None)
    out = {}
    for name, s in zip(REGIMES, states):
        new, metrics, _ = round_fn(s, demos, None)
        out[name] = jax.device_get((new, metrics))
    out["demos"] = demos
    return out


def _buffer(state):
    b = state.buffer
    n = int(b.size)
    return np.asarray(b.obs)[:n], np.asarray(b.actions)[:n]


def test_oec_trains_on_the_experts_steps_of_the_episodes_within_budget(rounds):
    """OEC (the expert takes over at step k = 3, the student's steps masked
    out) pays 5 steps × 2 agents = 10 labels per episode; round 0 of 2 may
    spend half the interactive budget (48), so 4 episodes are kept and
    4 × 5 = 20 expert steps, each labelled with the target, enter the
    buffer. Kills, at make_round's call sites: the prefix mask dropped
    (``mask_prefix`` False: the student's 3 steps too, 32 rows), the
    expert's steps inverted (12 rows), the budget's ``kept`` left out of
    the mask (40 rows), and an allowance of round r instead of r + 1 (0)."""
    state, metrics = rounds["oec"]
    obs, targets = _buffer(state)
    assert int(metrics["episodes_within_budget"]) == 4
    assert int(metrics["interactive_labels"]) == 4 * (T - K) * N == int(state.labels)
    assert int(metrics["trained_steps"]) == len(obs) == 4 * (T - K)
    np.testing.assert_array_equal(targets, obs[..., :A].argmax(-1))
    # the kept steps are those from the switch on: t/T = obs[..., A] ≥ K/T
    assert (obs[:, 0, A] >= K / T - 1e-6).all()


def test_dagger_trains_on_every_step_with_the_experts_labels(rounds):
    """DAgger (β = 0.5: the expert acts on about half the steps; every step
    labelled) pays 8 steps × 2 agents = 16 labels per episode, so 3
    episodes fit round 0's 48, and all their 24 steps enter the buffer with
    the EXPERT's label, also where the student acted. Kills the training
    targets taken from the executed actions (``use_label`` ignored), labels
    counted only where the expert acted (more episodes would fit), and the
    student's steps masked out."""
    state, metrics = rounds["dagger"]
    obs, targets = _buffer(state)
    assert int(metrics["episodes_within_budget"]) == 3
    assert int(metrics["interactive_labels"]) == 3 * T * N == int(state.labels)
    assert len(obs) == 3 * T
    np.testing.assert_array_equal(targets, obs[..., :A].argmax(-1))
    assert float(metrics["beta"]) == 0.5


def test_the_students_batches_carry_the_legal_masks_of_their_steps(rounds):
    """The buffer keeps each step's legal-action mask (toy:masked makes
    about half the actions unavailable, never the target), and the
    student's minibatches (``sample_batch``, demonstrations ∪ buffer) pair
    every step with its own mask: the demonstrations' (all legal here) or
    the buffer row's. Kills an all-legal mask stored or drawn (the BC loss
    would then score the labels against illegal actions too, which
    test_policy_loss_masks.py shows changes it) and masks drawn from the
    other source."""
    state, _ = rounds["oec"]
    demos = rounds["demos"]
    b = state.buffer
    n = int(b.size)
    obs, avail, targets = (np.asarray(x)[:n] for x in (b.obs, b.avail, b.actions))
    assert np.take_along_axis(avail, targets[..., None], -1).all()
    assert avail.mean() < 0.9
    state = jax.tree.map(jnp.asarray, state)
    batch = jax.device_get(sample_batch(jax.random.PRNGKey(5), state, demos, 64))
    d_obs = np.asarray(demos.obs)
    from_demos = 0
    for o, av in zip(batch.obs, batch.avail):
        if (d_obs == o).all(axis=(1, 2)).any():
            from_demos += 1
            assert av.all()
        else:
            rows = np.flatnonzero((obs == o).all(axis=(1, 2)))  # steps look alike here
            assert len(rows) and (avail[rows] == av).all(axis=(1, 2)).any()
    assert 0 < from_demos < 64
