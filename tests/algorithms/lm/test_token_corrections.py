"""Turns, loss masks, costs, the repetition filter and the takeover switch
of interactive imitation on token tasks, on hand-built token episodes and
on short real rollouts. Each test names the mutations it kills."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.algorithms.lm import corrections as C
from jaxil.algorithms.lm import interactive as TI
from jaxil.algorithms.lm import turns
from jaxil.algorithms.lm.takeover import TakeoverRule, takeover_episodes
from jaxil.envs.experts import scripted_expert
from jaxil.envs.tokens import EOT, VOCAB, WAIT
from jaxil.nn.transformer import TransformerPolicy, config_for_env

V = len(VOCAB)
tok = VOCAB.encode


def _avail(actions, only_wait=None):
    """``[T, N, V]``: every token legal, or ``<wait>`` alone where ``only_wait``."""
    T, N = actions.shape
    a = np.ones((T, N, V), bool)
    a[..., 0] = False
    if only_wait is not None:
        a[only_wait] = False
        a[only_wait, WAIT] = True
    return a


def _numpy_turns(actions):
    T, N = actions.shape
    glob, per = np.zeros(T, np.int64), np.zeros((T, N), np.int64)
    g, p = 0, np.zeros(N, np.int64)
    for t in range(T):
        glob[t], per[t] = g, p
        g += int(np.any(actions[t] == EOT))
        p += actions[t] == EOT
    return glob, per


@pytest.mark.parametrize("jit", [False, True])
def test_turn_indices_match_a_python_loop(jit):
    """Turn indices count the ``<eot>`` tokens BEFORE a step, on random
    token sequences of two agents. Kills an inclusive count (the ``<eot>``
    step already in the next turn: every OEC switch one token early) and a
    count over one agent only."""
    rng = np.random.default_rng(0)
    for _ in range(5):
        actions = rng.choice([EOT, VOCAB["TEST"], VOCAB["3"], WAIT], size=(30, 2))
        f = functools.partial(turns.turn_index, eot=EOT)
        g = functools.partial(turns.agent_turn_index, eot=EOT)
        if jit:
            f, g = jax.jit(f), jax.jit(g)
        glob, per = _numpy_turns(actions)
        np.testing.assert_array_equal(f(jnp.asarray(actions)), glob)
        np.testing.assert_array_equal(g(jnp.asarray(actions)), per)


def test_speaking_leaves_out_waiting_and_padding():
    """An agent off turn (``<wait>`` its only legal token) and steps past
    the end are not speaking; a step with ``<wait>`` among other legal
    tokens is. Kills counting waits as expert tokens (off-turn agents would
    double an exchange episode's cost) and counting padding."""
    actions = np.asarray([[VOCAB["SAY"], WAIT], [EOT, WAIT], [WAIT, VOCAB["SAY"]], [0, 0]])
    only_wait = np.zeros((4, 2), bool)
    only_wait[:2, 1] = only_wait[2, 0] = True
    avail = _avail(actions, only_wait)
    valid = np.asarray([True, True, True, False])
    got = np.asarray(turns.speaking(jnp.asarray(avail), jnp.asarray(valid), wait=WAIT))
    np.testing.assert_array_equal(got, [[1, 0], [1, 0], [0, 1], [0, 0]])
    avail[2, 0, VOCAB["SAY"]] = True  # <wait> plus another legal token: a choice
    assert bool(turns.speaking(jnp.asarray(avail), jnp.asarray(valid), wait=WAIT)[2, 0])


def test_token_loss_mask_keeps_the_expert_tokens_with_a_choice():
    """A hand-built OEC episode: the student types two turns, the expert
    the third from step 5 on; the first ``<eot>`` is forced (one legal
    token), the others are choices.
    Masked: only the expert's tokens with a choice; unmasked: every token
    with a choice; a rejected episode: none. Kills the prefix mask shifted
    by one token (the student's last token trained on, or the expert's
    first left out), forced tokens in the loss, and ``kept`` ignored."""
    actions = tok("TEST <eot> VIEW 3 <eot> EDIT 3 7 <eot>")[:, None]
    T = len(actions)
    avail = _avail(actions)
    forced = np.arange(T) == 1
    avail[1, 0, :] = False
    avail[1, 0, EOT] = True
    valid = np.ones(T, bool)
    acted = np.arange(T) >= 5
    m = lambda prefix, kept: np.asarray(C.token_loss_mask(
        jnp.asarray(valid), jnp.asarray(avail), jnp.asarray(acted), prefix, kept))[:, 0]
    np.testing.assert_array_equal(m(True, True), acted & ~forced)
    np.testing.assert_array_equal(m(False, True), ~forced)
    assert not m(True, False).any()
    assert m(True, True).sum() == 4  # EDIT 3 7 <eot>


def test_expert_tokens_pay_for_speaking_expert_tokens_or_every_label():
    """Cost of a hand-built two-agent episode: OEC pays the expert's
    speaking tokens, DAgger (a label at every visited state) every
    speaking token; waits and padding are free. Kills paying for the
    other agent's waits, for padding, and ignoring ``label_every_step``."""
    actions = np.asarray([[VOCAB["SAY"], WAIT], [EOT, WAIT], [WAIT, VOCAB["SAY"]],
                          [WAIT, EOT], [0, 0]])
    only_wait = np.zeros((5, 2), bool)
    only_wait[:2, 1] = only_wait[2:4, 0] = True
    avail = jnp.asarray(_avail(actions, only_wait))
    valid = jnp.asarray([1, 1, 1, 1, 0], bool)
    acted = jnp.asarray([0, 0, 1, 1, 1], bool)
    assert int(C.expert_tokens(valid, avail, acted, False, wait=WAIT)) == 2
    assert int(C.expert_tokens(valid, avail, acted, True, wait=WAIT)) == 4


def _after(actions, answers):
    """``[T, 1, K]`` tokens entering after each step: the echo, and after an
    ``<eot>`` the given answer."""
    K = 4
    out = np.zeros((len(actions), 1, K), np.int64)
    it = iter(answers)
    for t, a in enumerate(actions[:, 0]):
        out[t, 0, 0] = a
        if a == EOT:
            ans = tok(next(it))
            out[t, 0, 1:1 + len(ans)] = ans
    return out


_max_turn_repeats = jax.jit(functools.partial(C.max_turn_repeats, eot=EOT, wait=WAIT))


def _repeats(text, answers, T=12):
    """The episode's repeats, padded to ``T`` steps that are not valid (one
    compiled program for every case; op by op it took 12 s of the suite)."""
    actions = tok(text)[:, None]
    n = len(actions)
    pad = lambda x: np.concatenate([x, np.zeros((T - n, *x.shape[1:]), x.dtype)])
    return int(_max_turn_repeats(jnp.asarray(pad(_after(actions, answers))),
                                 jnp.asarray(pad(actions)), jnp.asarray(pad(_avail(actions))),
                                 jnp.arange(T) < n))


def test_repetition_counts_identical_turns_with_identical_answers():
    """``VIEW 3`` answered ``3`` three times is a loop of 3; ``TEST``
    answered by a different failing test each time is no loop; ``EDIT 3 7``
    and ``EDIT 7 3`` are different turns. Kills a hash that ignores the
    answer (every expert's repeated TEST rejected), one that ignores the
    token positions, and one that does not reset at a turn's start."""
    assert _repeats("VIEW 3 <eot> VIEW 3 <eot> VIEW 3 <eot>", ["3", "3", "3"]) == 3
    assert _repeats("VIEW 3 <eot> VIEW 3 <eot> VIEW 3 <eot>", ["3", "5", "3"]) == 2
    assert _repeats("TEST <eot> TEST <eot> TEST <eot>", ["FAIL 1", "FAIL 2", "PASS"]) == 1
    assert _repeats("EDIT 3 7 <eot> EDIT 7 3 <eot>", ["OK", "OK"]) == 1
    assert _repeats("VIEW 3 <eot> TEST <eot> VIEW 3 <eot>", ["3", "PASS", "3"]) == 2
    actions = tok("VIEW 3 <eot> VIEW 3 <eot> VIEW 3 <eot>")[:, None]
    args = (jnp.asarray(_after(actions, ["3"] * 3)), jnp.asarray(actions),
            jnp.asarray(_avail(actions)), jnp.ones(len(actions), bool))
    passes = jax.jit(functools.partial(C.passes_repetition, eot=EOT, wait=WAIT))  # the limit is traced: one program for the three
    assert not bool(passes(*args, 3))
    assert bool(passes(*args, 4)) and bool(passes(*args, 0))


@pytest.mark.slow
def test_the_scripted_experts_never_loop():
    """The repetition filter at its default limit keeps every episode of
    every task's scripted expert (so OEC's filter rejects only students)."""
    for eid in ("tokens:repair", "tokens:arith", "tokens:exchange"):
        env = envs.make(eid)
        ep = envs.run_episodes(env, scripted_expert(env)[0], None, jax.random.PRNGKey(0), 64)
        T, K = env.spec.max_steps, env.token_width
        after = jnp.round(ep.obs[:, 1:, :, :K]).astype(jnp.int32)
        ok = jax.vmap(functools.partial(C.passes_repetition, eot=env.eot_token,
                                        wait=env.wait_token), in_axes=(0, 0, 0, 0, None, None))(
            after, ep.actions, ep.avail_actions[:, :T], ep.mask, TI.DEFAULT_REPEAT_LIMIT,
            env.cmd_width + 1)
        assert bool(jnp.all(ok)), eid


def test_insert_episodes_appends_the_kept_ones_in_order_and_wraps():
    """Kills writing the rejected episodes, a ring pointer that does not
    wrap, and a size that exceeds the capacity."""
    env = envs.make("tokens:arith", num_ops=1)
    buf = TI.empty_buffer(env, 3)
    T, N, K, V = buf.obs.shape[1], 1, env.token_width, env.spec.num_actions

    def eps(first):
        ids = jnp.arange(first, first + 4, dtype=jnp.float32)
        return (jnp.broadcast_to(ids[:, None, None, None], (4, T, N, K)),
                jnp.ones((4, T, N, V), bool), jnp.zeros((4, T, N), jnp.int32),
                jnp.ones((4, T, N), bool))

    buf = TI.insert_episodes(buf, *eps(10), jnp.asarray([True, False, True, False]))
    assert int(buf.size) == 2 and int(buf.ptr) == 2
    np.testing.assert_array_equal(buf.obs[:2, 0, 0, 0], [10, 12])
    buf = TI.insert_episodes(buf, *eps(20), jnp.asarray([True, True, False, False]))
    assert int(buf.size) == 3 and int(buf.ptr) == 1
    np.testing.assert_array_equal(buf.obs[:, 0, 0, 0], [21, 12, 20])


@pytest.fixture(scope="module")
def repair():
    env = envs.make("tokens:repair", length=6, faults=2)
    student = TransformerPolicy(config_for_env(env, "tiny"))
    return env, student, student.init(jax.random.PRNGKey(0)), scripted_expert(env)[0]


@pytest.fixture(scope="module")
def roll(repair):
    """``roll(**rule)``: 16 takeover episodes of the untrained student under
    ``rule`` (one compiled program; the rule is traced)."""
    env, student, params, expert = repair
    run = jax.jit(lambda rule, k: takeover_episodes(env, student, expert, params, None, rule,
                                                    k, 16))

    def go(**rule):
        r = dict(kind=5, lo=0, hi=0, p=0.5, beta=0.0, gate=-1.0)
        r.update(rule)
        r = TakeoverRule(**{k: jnp.asarray(v, jnp.float32 if k in ("p", "beta", "gate")
                                           else jnp.int32) for k, v in r.items()})
        return jax.device_get(run(r, jax.random.PRNGKey(3)))

    return go


@pytest.mark.slow
def test_the_fixed_switch_hands_over_exactly_at_turn_k(repair, roll):
    """With the switch fixed at turn 2 the expert plays exactly the steps
    after the student's second ``<eot>`` (and every episode that lasts two
    turns ends solved: the expert inherits the history). Kills a switch
    counted in tokens, one turn late or early, and an expert that restarts
    the command instead of continuing from the state."""
    ep = roll(kind=5, lo=2)
    T = ep.mask.shape[1]
    for e in range(16):
        t_idx = np.asarray(turns.turn_index(jnp.asarray(ep.actions[e]), eot=EOT))
        valid = ep.mask[e]
        np.testing.assert_array_equal(ep.carry.expert_acted[e][valid], (t_idx >= 2)[valid])
        if t_idx[valid].max() >= 2:
            assert ep.won[e]
    assert T == repair[0].spec.max_steps
    assert ep.carry.expert_acted.any() and (~ep.carry.expert_acted & ep.mask).any()


@pytest.mark.slow
def test_dagger_coins_fall_per_turn_and_the_gate_is_sticky(roll):
    """β = 1: the expert plays everything, β = 0 (and switch none): the
    student everything; β = 0.5: who acts is constant within each turn and
    both act. The entropy gate at 0 nats hands over at the first speaking
    token (an untrained student is uncertain) and never back. Kills a
    per-token coin, a coin that ignores β, and a gate that releases."""
    none = 0
    all_x = roll(kind=none, beta=1.0)
    assert all_x.carry.expert_acted[all_x.mask].all() and all_x.won.all()
    no_x = roll(kind=none, beta=0.0)
    assert not no_x.carry.expert_acted[no_x.mask].any()
    half = roll(kind=none, beta=0.5)
    acted = half.carry.expert_acted
    assert acted[half.mask].any() and (~acted)[half.mask].any()
    for e in range(16):
        t_idx = np.asarray(turns.turn_index(jnp.asarray(half.actions[e]), eot=EOT))[half.mask[e]]
        a = acted[e][half.mask[e]]
        for k in np.unique(t_idx):
            assert len(set(a[t_idx == k].tolist())) == 1
    gated = roll(kind=none, gate=0.0)
    assert gated.carry.expert_acted[gated.mask].all()
    never = roll(kind=none, gate=1e3)
    assert not never.carry.expert_acted[never.mask].any()


def test_token_regimes_refuse_bad_knobs_in_one_line():
    """Unknown methods and an out-of-range gate are refused by name."""
    with pytest.raises(ValueError, match="unknown method 'oecc'"):
        TI.token_regime("oecc", 1000, sft_tokens=100)
    with pytest.raises(ValueError, match="entropy_gate"):
        TI.token_regime("gated", 1000, sft_tokens=100, entropy_gate=-0.5)
    h = TI.token_regime("gated", 1000, sft_tokens=100)
    assert h["entropy_gate"] == TI.DEFAULT_ENTROPY_GATE and h["mask_prefix"]
    assert TI.token_regime("oec", 1000, sft_tokens=100)["repeat_limit"] == TI.DEFAULT_REPEAT_LIMIT
