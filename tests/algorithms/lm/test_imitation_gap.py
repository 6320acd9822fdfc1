"""The imitation-gap rates: a hand-counted case and the shipped experts."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.algorithms.lm.imitation_gap import (expert_labels, imitation_gap,
                                                imitation_gap_by_turn)
from jaxil.envs.policies import Policy, uniform_available
from helpers.fast_compile import fast_call


def _tiny_episodes():
    """3 episodes, 2 steps, 1 agent, K = 1 token column and one privileged
    column; every step has 2 legal tokens except episode 2's second step."""
    tok = np.array([[5, 6], [5, 7], [5, 6]], np.float32)  # contexts: e0 and e2 agree
    priv = np.array([[1, 2], [3, 2], [1, 4]], np.float32)
    obs = np.stack([tok, priv], -1)[:, :, None, :]  # [E, T, N=1, O=2]
    obs = np.concatenate([obs, obs[:, -1:]], 1)  # the final observation
    avail = np.ones((3, 3, 1, 8), bool)
    avail[2, 1, 0, 1:] = False  # no choice there
    return SimpleNamespace(obs=obs, avail_actions=avail, mask=np.ones((3, 2), bool))


def _by_column(c):
    return lambda params, obs, avail, key: jnp.round(obs[:, c]).astype(jnp.int32)


def test_rates_match_a_hand_count():
    """Privileged label = the privileged column, transcript label = the
    token. Step 0: the context `5` is shared by all three episodes, with
    privileged labels 1, 3, 1 (undetermined for all three); step 1: e0 and
    e2 share `5 6` (labels 2 and 4), but e2's step has no choice, so it is
    not counted and e0's step is neither shared nor undetermined; e1's
    `5 7` is its own. 5 states, every label differs from the token.
    Catches a count over unselected or choiceless steps, contexts compared
    by the last row only (e1's step 1 would join e0's), or rates divided by
    the wrong total."""
    env = SimpleNamespace(token_width=1)
    gap = imitation_gap(env, _by_column(1), _by_column(0), _tiny_episodes())
    assert gap.states == 5
    assert gap.differs == pytest.approx(1.0)
    assert gap.undetermined == pytest.approx(3 / 5)
    assert gap.shared == pytest.approx(3 / 5)
    only_first = imitation_gap(env, _by_column(1), _by_column(0), _tiny_episodes(),
                               select=np.array([[1, 0], [1, 0], [0, 0]], bool))
    assert only_first.states == 2 and only_first.undetermined == pytest.approx(1.0)
    with pytest.raises(ValueError, match="select has shape"):
        imitation_gap(env, _by_column(1), _by_column(0), _tiny_episodes(), select=np.ones(3))



def test_rates_by_turn_match_a_hand_count():
    """With `<eot>` = 6, the echo `6` at step 1 of e0 and e2 ends their
    first turn, so step 1 is turn 1 there and turn 0 in e1. Turn 0 holds
    e0, e1, e2 at step 0 and e1 at step 1 (3 of 4 undetermined), turn 1
    holds e0's step 1 alone (e2's has no choice): neither shared nor
    undetermined. The first entry is the rates over all states. Catches a
    turn read from the privileged column or from the step count, a bin
    that drops the last (`≥`) turns, or per-bin contexts that count
    unselected states."""
    env = SimpleNamespace(token_width=1, eot_token=6)
    everything, turn0, turn1 = imitation_gap_by_turn(env, _by_column(1), _by_column(0),
                                                     _tiny_episodes(), num_bins=2)
    assert everything == imitation_gap(env, _by_column(1), _by_column(0), _tiny_episodes())
    assert (turn0.states, turn1.states) == (4, 1)
    assert turn0.undetermined == pytest.approx(3 / 4) and turn0.shared == pytest.approx(3 / 4)
    assert turn1.undetermined == 0.0 and turn1.shared == 0.0 and turn1.differs == 1.0
    recorded = np.asarray(_tiny_episodes().obs)[:, :-1, :, 1]  # the privileged column's labels
    assert imitation_gap_by_turn(env, None, _by_column(0), _tiny_episodes(), num_bins=2,
                                 labels=recorded) == [everything, turn0, turn1]
    with pytest.raises(ValueError, match="labels has shape"):
        imitation_gap_by_turn(env, None, _by_column(0), _tiny_episodes(), labels=recorded[0])
    with pytest.raises(ValueError, match="num_bins"):
        imitation_gap_by_turn(env, _by_column(1), _by_column(0), _tiny_episodes(), num_bins=0)

def test_expert_labels_threads_the_carry():
    """A counting expert (carry + 1 per step) labels step t with t + 1 in
    every episode. Catches a replay that starts the carry afresh on every
    step (a transcript expert would forget the transcript)."""
    count = Policy(init=lambda key, n: jnp.zeros((n,), jnp.int32),
                   act=lambda params, obs, avail, key, c: (c + 1, c + 1))
    eps = _tiny_episodes()
    lab = expert_labels(count, eps.obs[:, :-1], eps.avail_actions[:, :-1])
    assert (lab[..., 0] == np.array([[1, 2]] * 3)).all()


@functools.cache
def _student_then_expert(eid):
    """120 episodes: a random student for 1 … 6 tokens (never SUBMIT), then
    the scripted expert; the carry records which steps the expert played."""
    env = envs.make(eid)
    x = envs.token_expert(env)[0]
    ban = jnp.arange(env.spec.num_actions) == env.vocab["SUBMIT"]

    def init(key, n):
        return (jax.random.randint(key, (), 1, 7), jnp.int32(0), jnp.bool_(False))

    def act(params, obs, avail, key, c):
        switch, t, _ = c
        a_x, _ = x.act(None, obs, avail, key, x.init(key, obs.shape[0]))
        ok = jnp.where((avail & ~ban).any(-1, keepdims=True), avail & ~ban, avail)
        now = t >= switch
        return jnp.where(now, a_x, uniform_available(key, ok)), (switch, t + 1, now)

    run = lambda k: envs.run_episodes(env, Policy(init, act), None, k, 120,
                                      record_carry=lambda c: c[2])
    return env, jax.tree.map(np.asarray, fast_call(run, jax.random.PRNGKey(0)))


def test_the_transcript_expert_has_no_gap_and_the_scripted_one_has_one():
    """On tokens:repair states a random student visited: the transcript-only
    expert against itself differs 0 and is undetermined 0 (a function of
    the context); the scripted expert's labels differ from it and are
    undetermined on some states (`<bos> repair EDIT` is a context every
    instance shares, and the scripted expert's location is each instance's
    first fault). Catches rates that compare an expert with itself, or
    contexts keyed on the privileged columns (no context would recur)."""
    env, eps = _student_then_expert("tokens:repair")
    scripted, _, _ = envs.token_expert(env)
    transcript, _, _ = envs.token_expert(env, "transcript")
    none = imitation_gap(env, transcript, transcript, eps)
    assert none.states > 1000 and none.differs == 0 and none.undetermined == 0
    gap = imitation_gap(env, scripted, transcript, eps)
    print(gap)
    assert gap.differs > 0.01 and gap.undetermined > 0.005 and gap.shared > gap.undetermined
