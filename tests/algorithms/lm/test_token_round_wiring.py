"""What one interactive token round
([`make_round`][jaxil.algorithms.lm.interactive.make_round]) hands its
takeover rule, loss mask and expert-token budget, checked through what it
writes into the buffer and its metrics, in the default suite.

The pure pieces (`token_loss_mask`, `expert_tokens`, `sample_switch`) have
their own tests; the rollout tests of the switch and the coins, and the
program-level tests, are slow. Here one compiled round (the regime's knobs
are traced) serves every regime on `tokens:arith` with one operation and
the untrained tiny student, from one key: OEC with the switch fixed at
turn 2, and DAgger with β = 1 and β = 0 (constant). The verifier, the
repetition filter and the budget are off or ample, so every episode is
kept and what the buffer holds follows from its own tokens; then each of
them in turn bites (a budget that ends mid-round, the `win` verifier, a
repetition limit that rejects every turn) on the same rollouts.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.algorithms.lm import interactive as TI
from jaxil.algorithms.lm import turns
from jaxil.algorithms.lm.sft import collect_demos
from jaxil.envs.experts import scripted_expert
from jaxil.envs.tokens import token_specials
from jaxil.losses.sequence import agent_token_mask

from helpers.fast_compile import fast_compile

ENV = envs.make("tokens:arith", num_ops=1)
EOT, WAIT = token_specials(ENV)
SWITCH = 2  # OEC's switch turn
E = 8  # episodes per round
CFG = TI.TokenInteractiveConfig(rounds=1, episodes_per_round=E, updates_per_round=1,
                                sft_tokens=10, sft_updates=1, eval_episodes=1, batch_episodes=2,
                                capacity=E)
KNOBS = dict(sft_tokens=CFG.sft_tokens, verifier="off", repeat_limit=0, return_threshold=0.0)
BUDGET = 10 ** 6
REGIMES = {
    "oec": TI.token_regime("oec", BUDGET, switch_kind="fixed", switch_lo=SWITCH,
                           switch_hi=SWITCH, **KNOBS),
    "dagger_b1": TI.token_regime("dagger", BUDGET, beta0=1.0, beta_kind="constant", switch_hi=1,
                                 **KNOBS),
    "dagger_b0": TI.token_regime("dagger", BUDGET, beta0=0.0, beta_kind="constant", switch_hi=1,
                                 **KNOBS),
}


@pytest.fixture(scope="module")
def round_of():
    """`knobs -> (state after round 0, metrics)` of one run from the same
    untrained student and key, through one compiled round (the knobs are
    traced: any regime runs without compiling again)."""
    expert = scripted_expert(ENV)[0]
    eps = collect_demos(ENV, expert, None, jax.random.PRNGKey(0), 2)
    demos = TI.Demos(episodes=eps, mask=jax.vmap(agent_token_mask, in_axes=(0, None, 0))(
        eps.mask, ENV.spec.num_agents, eps.avail))
    student = TI.make_student(ENV, CFG)
    tx = TI._optimizer(CFG)
    params = student.init(jax.random.PRNGKey(0))

    def state(knobs):
        return TI.TokenRunState(
            params=params, opt_state=tx.init(params),
            hp=jax.tree.map(lambda x: x[0], TI.stack_regimes([knobs])),
            buffer=TI.empty_buffer(ENV, CFG.buffer_episodes), spent=jnp.int32(0),
            expert_turns=jnp.int32(0), expert_episodes=jnp.int32(0),
            demo_eps=jnp.int32(eps.num_episodes), round=jnp.int32(0),
            key=jax.random.PRNGKey(1))

    first = state(next(iter(REGIMES.values())))
    round_fn = fast_compile(TI.make_round(ENV, student, expert, CFG, tx), first, demos, None)

    def run(knobs):
        new, metrics, _ = round_fn(state(knobs), demos, None)
        return jax.device_get((new, metrics))

    return run


@pytest.fixture(scope="module")
def rounds(round_of):
    """`{regime: (state after round 0, metrics)}` of `REGIMES`."""
    return {name: round_of(knobs) for name, knobs in REGIMES.items()}


def _episodes(state):
    """Per buffered episode: `(tokens [T, N], legal [T, N, V], mask [T, N],
    turn [T], valid [T])`. An arith episode ends with an `<eot>` (the
    environment answers only then), so its valid steps are those up to
    its last `<eot>`."""
    b = state.buffer
    assert int(b.size) == E
    for e in range(E):
        tokens = np.asarray(b.targets[e])
        ends = np.flatnonzero((tokens == EOT).any(axis=1))
        assert len(ends)
        valid = np.arange(len(tokens)) <= ends[-1]
        turn = np.asarray(turns.turn_index(jnp.asarray(tokens), eot=EOT))
        yield tokens, np.asarray(b.avail[e]), np.asarray(b.mask[e]), turn, valid


def test_oec_trains_only_on_the_tokens_from_the_switch_turn_on(rounds):
    """With OEC's prefix mask the kept episodes' loss mask is exactly the
    tokens with a choice (more than one legal token) from turn 2 on; the
    student's two turns before the switch are context only. Kills
    `make_round` passing `mask_prefix=False` (or dropping the regime's
    `hp.mask_prefix`) into `token_loss_mask`: the student's choice tokens
    of turns 0 and 1 are trained on too. (Also fails when the switch
    counts tokens: the expert's, trained tokens then start inside turn 0.)"""
    state, metrics = rounds["oec"]
    assert int(metrics["episodes_kept"]) == E
    before = 0
    for tokens, legal, mask, turn, valid in _episodes(state):
        choice = (legal.sum(-1) > 1) & valid[:, None]
        before += int((choice & (turn < SWITCH)[:, None]).sum())
        np.testing.assert_array_equal(mask, choice & (turn >= SWITCH)[:, None])
    assert before > 0  # the student did speak before the switch
    assert 0 < int(metrics["trained_tokens"]) == sum(int(m.sum()) for *_, m, _, _ in
                                                    _episodes(state))


def test_oec_switch_falls_at_the_kth_turn_not_the_kth_token(rounds):
    """The expert-token cost of OEC's round is exactly the speaking tokens
    of turn 2 on (turns counted by `<eot>` in the played tokens), and the
    expert's share of the steps is theirs. Kills OEC's switch on token
    tasks counting tokens instead of turns (the expert would take over at
    step 2, inside the student's first turn, and pay for those tokens);
    also a switch one turn early or late."""
    state, metrics = rounds["oec"]
    paid = steps = expert_steps = 0
    for tokens, legal, _, turn, valid in _episodes(state):
        speak = np.asarray(turns.speaking(jnp.asarray(legal), jnp.asarray(valid), wait=WAIT))
        paid += int((speak & (turn >= SWITCH)[:, None]).sum())
        steps += int(valid.sum())
        expert_steps += int((valid & (turn >= SWITCH)).sum())
    assert 0 < paid == int(metrics["interactive_tokens"]) == int(state.spent)
    assert expert_steps < steps
    np.testing.assert_allclose(float(metrics["expert_share"]), expert_steps / steps, rtol=1e-6)


def test_dagger_expert_acts_on_a_turn_with_probability_beta(rounds):
    """DAgger's per-turn coin hands the turn to the expert with
    probability β: at β = 1 the expert plays every step (and the
    privileged expert solves every episode), at β = 0 none; every token
    is labelled and paid for either way. Kills the coin drawn as `u > β`
    instead of `u < β` (β = 1 would give the student every turn, β = 0
    the expert), and a `make_round` that passes 1 − β or ignores the
    regime's schedule."""
    s1, m1 = rounds["dagger_b1"]
    s0, m0 = rounds["dagger_b0"]
    assert float(m1["beta"]) == 1.0 and float(m0["beta"]) == 0.0
    assert float(m1["expert_share"]) == 1.0 and float(m1["rollout_win_rate"]) == 1.0
    assert float(m0["expert_share"]) == 0.0
    for state, metrics in ((s1, m1), (s0, m0)):
        speak = sum(int(np.asarray(turns.speaking(jnp.asarray(legal), jnp.asarray(valid),
                                                  wait=WAIT)).sum())
                    for _, legal, _, _, valid in _episodes(state))
        assert 0 < speak == int(metrics["interactive_tokens"])


def _dagger(**knobs):
    """DAgger at β = 0 (the student plays every turn, the expert labels
    every token) with `knobs` over the ample, unfiltered defaults."""
    knobs = {**KNOBS, "beta0": 0.0, "beta_kind": "constant", "switch_hi": 1, **knobs}
    return TI.token_regime("dagger", knobs.pop("budget", BUDGET), **knobs)


def test_dagger_trains_on_the_experts_labels_not_the_tokens_played(rounds):
    """DAgger's training targets are the expert's labels: at β = 0 they
    differ from the student's played tokens (read back from the next
    step's context) at many trained tokens, at β = 1 (the expert plays)
    they are the played tokens. Kills `make_round` training on the
    executed tokens (`use_label` dropped from `training_targets`): DAgger
    would imitate its own samples."""
    for name in ("dagger_b1", "dagger_b0"):
        b = rounds[name][0].buffer
        played = np.asarray(b.obs[:, 1:, :, 0]).astype(np.int64)  # the token of step t
        targets, mask = np.asarray(b.targets[:, :-1]), np.asarray(b.mask[:, :-1])
        differ = int(((targets != played) & mask).sum())
        if name == "dagger_b1":
            assert differ == 0 and mask.sum() > 0
        else:
            assert differ > mask.sum() // 4, (differ, mask.sum())


def test_a_round_keeps_and_pays_only_the_episodes_within_its_allowance(rounds, round_of):
    """With a budget whose interactive part (budget − the demonstrations'
    expert tokens) ends one token short of the first half of the round's
    episodes and their next one, the round keeps and pays exactly that
    half, in order: its buffer holds the same episodes as the ample run's
    first half, its spent tokens are theirs. Kills an allowance that
    forgets to subtract the demonstrations (one more episode fits), a
    round that keeps the episodes past the allowance, and one that pays
    for them."""
    ample, _ = rounds["dagger_b0"]
    cost = np.asarray([int(np.asarray(turns.speaking(jnp.asarray(legal), jnp.asarray(valid),
                                                     wait=WAIT)).sum())
                       for _, legal, _, _, valid in _episodes(ample)])
    cum = np.cumsum(cost)
    half = E // 2
    knobs = _dagger(budget=CFG.sft_tokens + int(cum[half]) - 1)
    assert knobs["demo_labels"] == CFG.sft_tokens and cost[half] > 1
    state, metrics = round_of(knobs)
    assert int(state.buffer.size) == half == int(metrics["episodes_within_budget"]) \
        == int(metrics["episodes_kept"]) == int(state.expert_episodes)
    np.testing.assert_array_equal(np.asarray(state.buffer.targets[:half]),
                                  np.asarray(ample.buffer.targets[:half]))
    assert int(state.spent) == int(metrics["interactive_tokens"]) == int(cum[half - 1])


def test_the_verifier_and_the_repetition_filter_reach_the_round(rounds, round_of):
    """With the `win` verifier a round keeps exactly its won episodes (the
    student alone at β = 0 wins fewer than the expert at β = 1, which wins
    all); with a repetition limit of 1 (a turn played once is already
    too often) it keeps none, yet pays the expert's tokens of every episode
    within the allowance (the expert labelled them). Kills `make_round`
    dropping the regime's verifier or repetition limit (every episode
    kept), and one that pays only for the kept episodes."""
    kept = {}
    for beta in (0.0, 1.0):
        state, metrics = round_of(_dagger(beta0=beta, verifier="win"))
        within = int(metrics["episodes_within_budget"])
        assert within == E
        kept[beta] = int(metrics["episodes_kept"])
        assert kept[beta] == round(float(metrics["rollout_win_rate"]) * within) \
            == int(state.buffer.size)
    assert kept[0.0] < kept[1.0] == E
    # A limit of 1, below what a regime accepts (every played turn then
    # counts as a loop), so that the filter rejects every episode here.
    state, metrics = round_of(dict(_dagger(), repeat_limit=1))
    assert int(metrics["episodes_kept"]) == int(state.buffer.size) == 0
    assert int(metrics["episodes_within_budget"]) == E
    assert int(state.spent) == int(rounds["dagger_b0"][1]["interactive_tokens"]) > 0
