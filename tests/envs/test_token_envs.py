"""The multi-turn token environments: tokens:repair, tokens:arith, tokens:exchange.

Per environment ONE compiled program (XLA level 0, fast_compile.py) plays
600 episodes, about a third each of the scripted expert, the uniform legal
random policy and shared control where the expert takes over from a random
student (:func:`_shared_control`), and resets from 16 keys twice; the
statistical, observation-contract and reset tests read it. The tool tests
step hand-typed commands through one compiled ``step`` per environment, on
hand-set hidden instances.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.envs.experts import has_scripted_expert, scripted_expert
from jaxil.envs.policies import Policy, uniform_available
from jaxil.envs.token_arith import ArithTask
from jaxil.envs.token_repair import RepairTask
from jaxil.envs.tokens import EOT, PAD, VOCAB, WAIT, transcript
from helpers.fast_compile import fast_call, fast_compile

IDS = ["tokens:repair", "tokens:arith", "tokens:exchange"]
EPISODES = 200
SWITCH_HI = 12  # the expert takes over after 1 … 12 random student tokens


@functools.cache
def _env(eid):
    return envs.make(eid)


EXPERT, RANDOM, TAKEOVER = 0, 1, 2  # the three kinds of episode of _runs


class _Shared(NamedTuple):
    """The carry of :func:`_shared_control` (leaves ``[E, T, ...]`` in
    ``Episodes.carry``)."""

    kind: jax.Array  # EXPERT, RANDOM or TAKEOVER, drawn per episode
    switch: jax.Array  # TAKEOVER: the step from which the expert acts
    t: jax.Array
    proposal: jax.Array  # [N] the expert's token before legalize
    expert_acted: jax.Array


def _shared_control(env) -> Policy:
    """One policy for three kinds of episode, drawn per episode: the scripted
    expert alone; the uniform legal random policy alone; a random student
    that never types SUBMIT (so no episode ends before the switch) for steps
    ``t < k``, ``k ~ U{1 … SWITCH_HI}``, then the expert. As in the
    interactive learners' shared-control rollout, the expert acts on every
    step's observation whether or not its token is played."""
    expert = scripted_expert(env)[0]
    submit = jnp.arange(env.spec.num_actions) == VOCAB["SUBMIT"]

    def init(key, n):
        k_kind, k_switch = jax.random.split(key)
        return _Shared(kind=jax.random.randint(k_kind, (), 0, 3),
                       switch=jax.random.randint(k_switch, (), 1, SWITCH_HI + 1),
                       t=jnp.int32(0), proposal=jnp.zeros((n,), jnp.int32),
                       expert_acted=jnp.bool_(False))

    def act(params, obs, avail, key, c):
        k_x, k_r = jax.random.split(key)
        a_x, _ = expert.act(None, obs, avail, k_x, None)
        student_avail = avail & ~(submit & (c.kind == TAKEOVER))
        student_avail = jnp.where(student_avail.any(-1, keepdims=True), student_avail, avail)
        a_r = uniform_available(k_r, student_avail)
        now = (c.kind == EXPERT) | ((c.kind == TAKEOVER) & (c.t >= c.switch))
        return jnp.where(now, a_x, a_r), c._replace(t=c.t + 1, proposal=a_x, expert_acted=now)

    return Policy(init=init, act=act)


@functools.cache
def _program(eid):
    """Everything the module needs from ``eid``, as ONE compiled program:
    ``3 EPISODES`` shared-control episodes and resets from 16 keys, each
    twice (host arrays)."""
    env = _env(eid)
    keys = jax.random.split(jax.random.PRNGKey(7), 16)

    def run(key):
        eps = envs.run_episodes(env, _shared_control(env), None, key, 3 * EPISODES,
                                record_carry=True)
        return eps, jax.vmap(env.reset)(jnp.concatenate([keys, keys]))

    return jax.tree.map(np.asarray, fast_call(run, jax.random.PRNGKey(0)))


def _runs(eid, kind):
    """The episodes of one kind (about EPISODES of them)."""
    eps = _program(eid)[0]
    keep = eps.carry.kind[:, 0] == kind
    return jax.tree.map(lambda x: x[keep], eps)


def _legal_proposals(eps, acted):
    """Whether every token the expert proposed on a step it acted was legal."""
    avail = eps.avail_actions[:, :-1]  # [E, T, N, V] what each step's token was chosen from
    ok = np.take_along_axis(avail, eps.carry.proposal[..., None], -1)[..., 0]
    return ok[np.broadcast_to(acted[..., None], ok.shape)].all()


# -- the scripted experts and the random policy ---------------------------------------------


@pytest.mark.parametrize("eid", IDS)
def test_expert_succeeds_with_legal_tokens(eid):
    """The scripted expert wins ≥ 95 % at default difficulty and every token it
    proposes is legal. Kills: an expert whose completion of a command types a
    token the grammar forbids (legalize would silently replace it by the first
    legal token, e.g. a wrong location), or an off-by-one in the privileged
    columns it reads (it would edit/compute the wrong thing and lose)."""
    env = _env(eid)
    eps = _runs(eid, EXPERT)
    assert has_scripted_expert(eid)
    assert len(eps.won) > EPISODES // 2
    assert eps.won.mean() >= 0.95, eps.won.mean()
    assert _legal_proposals(eps, eps.mask)
    np.testing.assert_allclose(eps.episode_return[eps.won], 1.0 + env.score_weight, atol=1e-5)
    assert eps.done[np.arange(len(eps.won)), eps.length - 1][eps.won].all(), "a win ends by SUBMIT"


@pytest.mark.parametrize("eid", IDS)
def test_random_legal_policy_rarely_succeeds(eid):
    """The uniform random legal policy almost never wins: the tasks are not
    solved by typing grammatical commands. Kills: a verifier that accepts any
    SUBMIT, or a grammar that leaves only the winning tokens legal."""
    eps = _runs(eid, RANDOM)
    assert len(eps.won) > EPISODES // 2
    assert eps.won.mean() <= 0.1, eps.won.mean()
    assert eps.episode_return.mean() < 0.2


@pytest.mark.parametrize("eid", IDS)
def test_expert_takes_over_from_a_random_student(eid):
    """A random student (never SUBMIT) types 1 … 12 tokens, often stopping
    mid-command; the expert, acting on every step's observation, takes over
    and still wins ≥ 90 %, proposing only legal tokens. Kills: an expert that
    assumes it starts at a turn boundary (it would type a command token
    after the student's ``EDIT 3``) or that cannot undo the student's damage
    (random edits, miscopied calculations, garbled messages)."""
    env = _env(eid)
    eps = _runs(eid, TAKEOVER)
    acted = eps.carry.expert_acted & eps.mask
    assert len(eps.won) > EPISODES // 2
    assert eps.won.mean() >= 0.9, eps.won.mean()
    assert _legal_proposals(eps, acted)
    # the switch landed mid-command in a good share of the episodes
    first = np.argmax(acted, axis=1)
    obs = eps.obs[np.arange(len(first)), first]  # what the expert first acted on
    cmd_len = obs[..., env.token_width + env.cmd_width]  # privileged: the partial command's length
    mid_turn = cmd_len.max(-1) > 0
    assert mid_turn.mean() > 0.2, mid_turn.mean()


# -- the observation contract ---------------------------------------------------------------


@pytest.mark.parametrize("eid", IDS)
def test_obs_tokens_are_the_transcript(eid):
    """Appending the non-PAD token columns of every step gives the whole
    history: the prompt, then each own token echoed at the next step (the
    action actually played), then the tool answers, which arrive only on the
    step of some agent's ``<eot>``; tokens are left-aligned and their count
    never exceeds ``max_context``. Kills: a missing or shifted echo, an
    answer delivered a step late or without an ``<eot>``, a right-aligned
    row, and a ``max_context`` too small for a KV cache."""
    env = _env(eid)
    K = env.token_width
    eps = _program(eid)[0]
    tok = eps.obs[..., :K].astype(np.int64)  # [E, T+1, N, K]
    valid = np.arange(tok.shape[1])[None] <= eps.length[:, None]  # steps 0 … length
    nonpad = tok != PAD
    assert not (~nonpad[..., :-1] & nonpad[..., 1:]).any(), "tokens are left-aligned"
    assert (tok[:, 0, :, 0] == VOCAB["<bos>"]).all()
    echo, step = tok[:, 1:, :, 0], eps.mask
    np.testing.assert_array_equal(echo[step], eps.actions[step])
    answered = nonpad[:, 1:, :, 1:].any(-1)  # [E, T, N]
    after_eot = (eps.actions == EOT).any(-1)  # [E, T]
    assert not (answered & ~after_eot[..., None]).any()
    count = (nonpad & valid[..., None, None]).sum(axis=(1, 3))  # [E, N]
    assert count.max() <= env.max_context, (count.max(), env.max_context)
    assert (tok[~valid] == PAD).all()
    # the decoded context of an expert episode is its transcript
    eps = _runs(eid, EXPERT)
    n = int(eps.length[0])
    for agent in range(env.spec.num_agents):
        text = env.vocab.decode(eps.obs[0, : n + 1, agent, :K])
        lines = transcript(env, eps.obs[0], agent, n, show_wait=True).splitlines()
        assert text.split() == [w for line in lines for w in line.split() if w not in ("<", ">")]
        assert text.startswith("<bos> " + eid.split(":")[1])
    assert "SUBMIT" in text


@pytest.mark.parametrize("eid", IDS)
def test_reset_is_a_pure_function_of_the_key(eid):
    """The same key gives the same instance and different keys different
    instances (an unbounded, reproducible instance set). Kills: a generator
    that ignores its key, or draws at trace time from a global seed (every
    key would give one instance)."""
    env = _env(eid)
    state, ts = _program(eid)[1]  # 16 keys, twice
    for x in jax.tree.leaves((state, ts)):
        np.testing.assert_array_equal(x[:16], x[16:])
    hidden = ts.obs[:16, :, env.token_width:].reshape(16, -1)
    assert len({h.tobytes() for h in hidden}) == 16


# -- the tools, on hand-typed commands -------------------------------------------------------


class _Driver:
    """Steps hand-typed tokens through one compiled ``step`` per environment,
    from a reset whose hidden task ``task_fn`` rewrites."""

    def __init__(self, eid, task_fn):
        self.env = _env(eid)
        state, self.ts = jax.tree.map(lambda x: x[0], _program(eid)[1])
        self.state = state.replace(inner=state.inner.replace(task=task_fn(state.inner.task)))
        self.step_fn = _compiled_step(eid)

    def type(self, text, agent=0):
        """Type ``text`` (token names) as ``agent`` while the other agent
        waits; every token must be legal. Returns each agent's answer (token
        columns 1 … of the last step, decoded)."""
        n = self.env.spec.num_agents
        for tok in VOCAB.encode(text):
            a = np.full((n,), WAIT, np.int32)
            a[agent] = tok
            legal = np.asarray(self.state.avail_actions)[np.arange(n), a]
            assert legal.all(), f"{VOCAB.names[tok]} is not legal for agent {agent}"
            self.state, self.ts = self.step_fn(self.state, jnp.asarray(a))
        return self.answers()

    def answers(self):
        K = self.env.token_width
        return [VOCAB.decode(np.asarray(self.ts.obs)[i, 1:K]) for i in range(self.env.spec.num_agents)]

    def legal(self, agent=0):
        return {VOCAB.names[i] for i in np.flatnonzero(np.asarray(self.ts.avail_actions)[agent])}


@functools.cache
def _compiled_step(eid):
    env = _env(eid)
    state, _ = jax.eval_shape(env.reset, jax.random.PRNGKey(0))
    return fast_compile(env.step, state, jax.ShapeDtypeStruct((env.spec.num_agents,), jnp.int32))


def _repair_task(task):
    y = jnp.array([3, 1, 4, 1, 5, 9, 2, 6], jnp.int32)
    x = y.at[2].set(7).at[5].set(0)  # faults at 2 and 5
    return RepairTask(x=x, y=y, report=jnp.int32(-1))


def test_repair_tools_answer_from_the_hidden_file():
    """VIEW i returns x[i] (every i), EDIT i v answers OK and changes exactly
    x[i], TEST reports the FIRST failing test with its wanted and actual
    value and PASS once all pass, SUBMIT ends the episode and wins iff all
    pass, with the graded score in the reward. Kills: an off-by-one location
    (VIEW 2 showing x[1] or x[3]), EDIT writing the neighbour, TEST reporting
    the last failure or the wrong value, an echo missing from the answer
    step, and a verifier that ignores the file."""
    d = _Driver("tokens:repair", _repair_task)
    x = [3, 1, 7, 1, 5, 0, 2, 6]
    for i, v in enumerate(x):
        assert d.type(f"VIEW {i} <eot>") == [f"= {v}"]
    assert VOCAB.decode(np.asarray(d.ts.obs)[0, :1]) == "<eot>"  # the echo comes first
    assert d.type("TEST <eot>") == ["FAIL 2 WANT 4 GOT 7"]
    assert d.type("EDIT 2 4 <eot>") == ["OK"]
    assert d.type("VIEW 2 <eot>") == ["= 4"] and d.type("VIEW 1 <eot>") == ["= 1"]
    assert d.type("VIEW 3 <eot>") == ["= 1"]
    assert d.type("TEST <eot>") == ["FAIL 5 WANT 9 GOT 0"]
    saved = (d.state, d.ts)
    assert d.type("SUBMIT <eot>") == ["FAIL 5 WANT 9 GOT 0"]
    assert bool(d.ts.done) and not bool(d.ts.won)
    np.testing.assert_allclose(float(d.ts.reward), 0.1 * 7 / 8, rtol=1e-6)
    d.state, d.ts = saved
    assert d.type("EDIT 5 9 <eot>") == ["OK"]
    assert not bool(d.ts.done)
    assert d.type("TEST <eot>") == ["PASS"]
    assert d.type("SUBMIT <eot>") == ["PASS"]
    assert bool(d.ts.done) and bool(d.ts.won)
    np.testing.assert_allclose(float(d.ts.reward), 1.1, rtol=1e-6)


def test_repair_grammar_mask():
    """At a turn start only the commands are legal; after EDIT only locations
    below ``length``, after EDIT i only values below ``values``, then only
    <eot>; PAD and WAIT never. Kills: a mask that lets a malformed command
    through (an EDIT without a value) or allows an out-of-range location."""
    d = _Driver("tokens:repair", _repair_task)
    assert d.legal() == {"TEST", "VIEW", "EDIT", "SUBMIT"}
    d.type("EDIT")
    assert d.legal() == {str(i) for i in range(8)}
    d.type("7")
    assert d.legal() == {str(v) for v in range(16)}
    d.type("15")
    assert d.legal() == {"<eot>"}
    d.type("<eot>")
    d.type("TEST")
    assert d.legal() == {"<eot>"}


def _arith_task(task):
    operands = jnp.array([7, 12, 3, 25, 9], jnp.int32)
    ops = jnp.array([0, 2, 1, 2], jnp.int32)  # 7 + 12 * 3 - 25 * 9
    chain = jnp.array([7, 19, 26, 1, 9], jnp.int32)  # mod 31
    return ArithTask(operands=operands, ops=ops, chain=chain, progress=jnp.int32(0))


def test_arith_calculator_and_verifier():
    """CALC a op b answers (a op b) mod 31 for + - * (with wrap-around), the
    graded progress counts only chain steps done in order, SUBMIT wins iff
    the value is the chain's. Kills: an operator table off by one (+ read as
    -), a negative remainder, progress credited for an out-of-order or
    miscopied step, and a verifier comparing with an intermediate value."""
    d = _Driver("tokens:arith", _arith_task)
    assert d.type("CALC 3 - 5 <eot>") == ["= 29"]
    assert d.type("CALC 30 * 30 <eot>") == ["= 1"]
    assert d.type("CALC 12 * 3 <eot>") == ["= 5"]  # not the next chain step
    assert d.type("CALC 7 + 12 <eot>") == ["= 19"]
    assert d.type("CALC 19 * 4 <eot>") == ["= 14"]  # miscopied operand
    assert d.type("CALC 19 * 3 <eot>") == ["= 26"]
    saved = (d.state, d.ts)
    assert d.type("SUBMIT 26 <eot>") == ["FAIL"]
    assert bool(d.ts.done) and not bool(d.ts.won)
    np.testing.assert_allclose(float(d.ts.reward), 0.1 * 2 / 4, rtol=1e-6)
    d.state, d.ts = saved
    assert d.legal() == {"CALC", "SUBMIT"}
    d.type("CALC 26")
    assert d.legal() == {"+", "-", "*"}
    assert d.type("- 25 <eot>") == ["= 1"]
    assert d.type("CALC 1 * 9 <eot>") == ["= 9"]
    assert d.type("SUBMIT 9 <eot>") == ["PASS"]
    assert bool(d.ts.won)
    np.testing.assert_allclose(float(d.ts.reward), 1.1, rtol=1e-6)


def _exchange_task(task):
    halves = jnp.array([[4, 8, 15], [16, 23, 0]], jnp.int32)
    return task.replace(halves=halves, answer=halves.reshape(-1))


def test_exchange_delivers_messages_to_the_other_agent():
    """Agent 0 starts; while it types, agent 1 may only <wait>; its SAY
    reaches agent 1 (``HEAR …``) and not itself, on the step of its <eot>;
    then the turn passes. A SUBMIT by agent 1 of both halves in agent order
    wins; the wrong order loses with the graded score. Kills: the message
    delivered to the speaker, a turn that does not pass (or passes before
    <eot>), and a verifier indifferent to whose half comes first."""
    d = _Driver("tokens:exchange", _exchange_task)
    assert d.legal(0) == {"SAY", "SUBMIT"} and d.legal(1) == {"<wait>"}
    assert d.type("SAY 4 8", agent=0) == ["", ""]
    assert d.legal(0) == {"<eot>"} | {str(v) for v in range(32)}
    assert d.type("15", agent=0) == ["", ""]
    assert d.legal(0) == {"<eot>"} and d.legal(1) == {"<wait>"}
    assert d.type("<eot>", agent=0) == ["", "HEAR 4 8 15"]
    tok = np.asarray(d.ts.obs)[:, 0].astype(int)
    assert [VOCAB.names[t] for t in tok] == ["<eot>", "<wait>"]  # the echoes
    assert d.legal(0) == {"<wait>"} and d.legal(1) == {"SAY", "SUBMIT"}
    saved = (d.state, d.ts)
    assert d.type("SUBMIT 16 23 0 4 8 15 <eot>", agent=1) == ["FAIL", "FAIL"]  # b ++ a
    assert bool(d.ts.done) and not bool(d.ts.won)
    assert float(d.ts.reward) == 0.0  # no entry in its place
    d.state, d.ts = saved
    assert d.type("SUBMIT 4 8 15 16 23 0 <eot>", agent=1) == ["PASS", "PASS"]
    assert bool(d.ts.won)
