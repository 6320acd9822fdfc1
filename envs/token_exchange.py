"""`tokens:exchange`: two agents pool the halves of a list by talking.

Agent 0 holds `a` and agent 1 holds `b`, `half` values each in `0 …
values-1`; the team must submit `a ++ b` (agent 0's half first), or
`sorted(a ++ b)` with `sort=True`. Neither can do it alone. Prompts:
`<bos> exchange A a_1 … a_H` and `<bos> exchange B b_1 … b_H`.

The agents take turns, agent 0 first. The agent on turn types a command;
the other may only emit `<wait>` (the legal mask says so), so the
interface stays one token per agent per step and every `<wait>` is echoed
into the waiting agent's context like any own token. The turn passes at
`<eot>`:

==============================  ============================================
agent on turn                   environment answers
==============================  ============================================
`SAY m_1 … m_k <eot>`         the OTHER agent receives `HEAR m_1 … m_k`
                                (1 ≤ k ≤ half); the speaker gets nothing
`SUBMIT z_1 … z_2H <eot>`     both receive `PASS` or `FAIL`; the
                                episode ends
==============================  ============================================

Verifier: the submitted list is the answer (`won`). Graded score: the
fraction of the `2 half` entries right; `reward = won + score_weight *
score` on the submit step, 0 otherwise (and on truncation after
`max_turns` turns, both agents' turns counted).

Difficulty knobs: `half` (default 3), `values` (32), `sort` (False),
`max_turns` (8).

**Privileged columns** (`obs[:, K:]`, expert only, see
[`envs.tokens`][jaxil.envs.tokens]): the partial command (`1 + 2 half` tokens)
and its length, then per agent: on turn (0/1), heard the other's half correctly
(0/1: the last message it received is exactly the other agent's half), its own
half (`half`) and the answer (`2 half`).

[`exchange_expert`][jaxil.envs.token_exchange.exchange_expert] is the scripted
expert: on turn, `SUBMIT` the answer if it has heard the other's half, else
`SAY` its own half (two turns from the start: agent 0 says `a`, agent 1
submits).
[`exchange_transcript_expert`][jaxil.envs.token_exchange.exchange_transcript_expert]
acts on the agent's own context only: it cannot see whether a message is right,
so it submits a half only once it has heard it twice (four turns from the
start).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from .core import MultiAgentEnv
from .policies import Policy, stateless_carry
from .token_transcript import transcript_policy
from .tokens import (
    EOT,
    MAX_NUMBER,
    PAD,
    VOCAB,
    WAIT,
    Command,
    Outcome,
    TokenEnv,
    number,
    numbers,
    random_ints,
    value_of,
)

SAY, SUBMIT = VOCAB["SAY"], VOCAB["SUBMIT"]


@struct.dataclass
class ExchangeTask:
    halves: jax.Array  # [2, H] int32 each agent's half
    answer: jax.Array  # [2H] int32 what must be submitted
    heard: jax.Array  # [2, H] int32 the last message each agent received (0 past its length)
    heard_len: jax.Array  # [2] int32 its length
    turn: jax.Array  # [] int32 the agent on turn


class ExchangeEnv(TokenEnv):
    """`tokens:exchange` (see the module docstring)."""

    def __init__(self, half: int = 3, values: int = 32, sort: bool = False, max_turns: int = 8,
                 score_weight: float = 0.1):
        if not isinstance(half, int) or not 1 <= half <= 8:
            raise ValueError(f"half must be an int in [1, 8], got {half!r}")
        if not 2 <= values <= MAX_NUMBER:
            raise ValueError(f"values must be in [2, {MAX_NUMBER}], got {values}")
        self.half, self.values, self.sort = half, values, bool(sort)
        nums = numbers(0, values)
        super().__init__(
            "tokens:exchange", num_agents=2, prompt_len=2 + half,
            commands=(Command("SAY", (nums,) * half, min_args=1, answer=1 + half),
                      Command("SUBMIT", (nums,) * (2 * half), answer=1)),
            num_features=2 + 3 * half, max_turns=max_turns, score_weight=score_weight)

    def _generate(self, key):
        H = self.half
        halves = random_ints(key, (2, H), self.values)
        answer = halves.reshape(-1)
        if self.sort:
            answer = jnp.sort(answer)
        task = ExchangeTask(halves=halves, answer=answer, heard=jnp.zeros((2, H), jnp.int32),
                            heard_len=jnp.zeros((2,), jnp.int32), turn=jnp.int32(0))
        head = jnp.array([[VOCAB["exchange"], VOCAB["A"]], [VOCAB["exchange"], VOCAB["B"]]],
                         jnp.int32)
        return task, jnp.concatenate([head, number(halves)], axis=1)

    def _on_turn(self, task):
        return jnp.arange(2) == task.turn

    def _heard_ok(self, task):
        other = task.halves[::-1]
        return (task.heard_len == self.half) & jnp.all(task.heard == other, axis=1)

    def chat_intro(self) -> str:
        H, M = self.half, self.values
        order = "sorted in increasing order" if self.sort else "A's numbers first, then B's"
        return (f"You are one of two agents, A and B. Each holds {H} numbers (0-{M - 1}); the "
                f"team must submit all {2 * H}, {order}. You take turns, A first. On your turn "
                f"write exactly one command:\n"
                f"SAY m1 ... mk - tell the other agent 1 to {H} numbers; they hear HEAR m1 ... "
                f"mk\n"
                f"SUBMIT z1 ... z{2 * H} - submit the whole list and finish; both hear PASS or "
                f"FAIL.\n"
                f"Write only the command, e.g. SAY 4 9 2")

    def _features(self, task):
        on = self._on_turn(task).astype(jnp.int32)[:, None]
        ok = self._heard_ok(task).astype(jnp.int32)[:, None]
        answer = jnp.broadcast_to(task.answer, (2, 2 * self.half))
        return jnp.concatenate([on, ok, task.halves, answer], axis=1)

    def _execute(self, task, cmd, cmd_len, ended):
        H = self.half
        on = task.turn
        other = 1 - on
        c, k, e = cmd[on], cmd_len[on] - 1, ended[on]
        kind = c[0]
        say = e & (kind == SAY)
        said = jnp.arange(H) < k
        msg = jnp.where(said, c[1:1 + H], PAD)
        heard = jnp.where(say, task.heard.at[other].set(jnp.where(said, value_of(msg), 0)),
                          task.heard)
        heard_len = jnp.where(say, task.heard_len.at[other].set(k), task.heard_len)
        submit = e & (kind == SUBMIT)
        right = value_of(c[1:1 + 2 * H]) == task.answer
        won = right.all()
        hear = jnp.concatenate([jnp.array([VOCAB["HEAR"]], jnp.int32), msg])
        to_other = jnp.zeros((2, 1 + H), jnp.int32).at[other].set(hear)
        verdict = jnp.zeros((2, 1 + H), jnp.int32).at[:, 0].set(
            jnp.where(won, VOCAB["PASS"], VOCAB["FAIL"]))
        answer = jnp.where(kind == SAY, to_other, verdict)
        task = task.replace(heard=heard, heard_len=heard_len,
                            turn=jnp.where(e, other, on).astype(jnp.int32))
        return Outcome(task=task, answer=answer, done=submit, won=won, score=jnp.mean(right))


def exchange_expert(env: MultiAgentEnv) -> Policy:
    """Scripted expert for `tokens:exchange`, from the privileged columns.

    Off turn: `<wait>`. On turn, at a turn start: `SUBMIT` the answer if
    the agent has heard the other's half correctly, else `SAY` its own
    half. Mid-turn (taking over a partial command): a `SAY` whose words so
    far are a prefix of the own half is finished; any other `SAY` is cut
    with `<eot>` (the other agent then says its half, and this one
    submits); a `SUBMIT` is finished with the answer. "Heard correctly" is
    privileged (a student sees what it heard, not whether it is right):
    after a garbled message the expert speaks instead of submitting it.
    Deterministic.
    """
    if not isinstance(env, ExchangeEnv):
        raise TypeError(f"exchange_expert needs a tokens:exchange environment, got {env!r}")
    H = env.half

    def one(cmd, cmd_len, f):
        on, ok = f[0] > 0, f[1] > 0
        own, answer = f[2:2 + H], f[2 + H:2 + 3 * H]
        k = cmd_len - 1  # words typed after the command
        kind = cmd[0]
        prefix = jnp.all((value_of(cmd[1:1 + H]) == own) | (jnp.arange(H) >= k))
        say_next = jnp.where((k < H) & prefix, number(own[jnp.clip(k, 0, H - 1)]), EOT)
        submit_next = jnp.where(k < 2 * H, number(answer[jnp.clip(k, 0, 2 * H - 1)]), EOT)
        return jnp.select(
            [~on, cmd_len == 0, kind == SAY],
            [WAIT, jnp.where(ok, SUBMIT, SAY), say_next], submit_next).astype(jnp.int32)

    def act(params, obs, avail, key, carry):
        p = env.privileged(obs)
        return jax.vmap(one)(p.cmd, p.cmd_len, p.features), carry

    return Policy(init=stateless_carry, act=act)


@struct.dataclass
class _ExchangeNotes:
    """What one agent's transcript of `tokens:exchange` has shown."""

    role: jax.Array  # [] int32 0 for A, 1 for B (from the prompt)
    own: jax.Array  # [H] int32 the own half (from the prompt)
    on: jax.Array  # [] bool on turn: A at the start, after a HEAR; off after the own <eot>
    last: jax.Array  # [H] int32 the last message heard (0 past its length)
    last_len: jax.Array  # [] int32
    prev: jax.Array  # [H] int32 the message heard before it
    prev_len: jax.Array  # [] int32


def exchange_transcript_expert(env: MultiAgentEnv) -> Policy:
    """Transcript-only expert for `tokens:exchange`: it submits only a half
    it has heard twice, the same both times.

    An agent cannot see whether a message it heard is the other's half (the
    other agent's tokens may have been a student's), so one `HEAR` is not
    enough; the expert always says its own half, so the same full message
    heard twice in a row is. Off turn (the transcript says: A starts, the
    turn passes at the own `<eot>` and comes back with a `HEAR`): `<wait>`.
    On turn, at a turn start: `SUBMIT` (its half and the twice-heard one,
    A's first; sorted with `sort=True`) once the last two messages agree,
    else `SAY` its own half. Taking over a partial command: a `SAY` whose
    words so far are a prefix of the own half is finished, any other is cut
    with `<eot>`; a `SUBMIT` is finished with its half and the last
    message heard (the best the transcript holds). From a fresh episode:
    A says, B says, A says, B submits (four turns where
    [exchange_expert][jaxil.envs.token_exchange.exchange_expert], which
    knows the message was right, needs two). Deterministic.
    """
    if not isinstance(env, ExchangeEnv):
        raise TypeError(f"exchange_transcript_expert needs a tokens:exchange environment, got "
                        f"{env!r}")
    H, M = env.half, env.values
    A, HEAR = VOCAB["A"], VOCAB["HEAR"]

    def read_prompt(prompt):
        # exchange A|B h_1 … h_H
        role = jnp.where(prompt[1] == A, 0, 1).astype(jnp.int32)
        zero = jnp.zeros((H,), jnp.int32)
        return _ExchangeNotes(role, jnp.clip(value_of(prompt[2:2 + H]), 0, M - 1), role == 0,
                              zero, jnp.int32(0), zero, jnp.int32(0))

    def read(m, cmd, cmd_len, ended, answer):
        heard = answer[0] == HEAR
        words = answer[1:1 + H]
        said = words != PAD
        msg = jnp.where(said, jnp.clip(value_of(words), 0, M - 1), 0)
        return m.replace(
            on=jnp.where(heard, True, jnp.where(ended, False, m.on)),
            last=jnp.where(heard, msg, m.last),
            last_len=jnp.where(heard, said.sum(dtype=jnp.int32), m.last_len),
            prev=jnp.where(heard, m.last, m.prev),
            prev_len=jnp.where(heard, m.last_len, m.prev_len))

    def choose(m, cmd, cmd_len):
        sure = (m.last_len == H) & (m.prev_len == H) & jnp.all(m.last == m.prev)
        pair = jnp.where(m.role == 0, jnp.concatenate([m.own, m.last]),
                         jnp.concatenate([m.last, m.own]))
        answer = jnp.sort(pair) if env.sort else pair
        k = cmd_len - 1  # words typed after the command
        kind = cmd[0]
        prefix = jnp.all((value_of(cmd[1:1 + H]) == m.own) | (jnp.arange(H) >= k))
        say_next = jnp.where((k < H) & prefix, number(m.own[jnp.clip(k, 0, H - 1)]), EOT)
        submit_next = jnp.where(k < 2 * H, number(answer[jnp.clip(k, 0, 2 * H - 1)]), EOT)
        return jnp.select(
            [~m.on, cmd_len == 0, kind == SAY],
            [WAIT, jnp.where(sure, SUBMIT, SAY), say_next], submit_next).astype(jnp.int32)

    return transcript_policy(env, read_prompt, read, choose)
