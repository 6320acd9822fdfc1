"""`tokens:arith`: multi-step arithmetic with a calculator tool.

The prompt is a chain of `num_ops` modular operations, evaluated left to
right (no precedence), e.g. `<bos> arith 7 + 12 * 3 - 25 * 9` means
`(((7 + 12) * 3) - 25) * 9 mod modulus`. The agent (N = 1) may not
compute: it calls the calculator one operation at a time, copying operands
from the prompt and from earlier results, then submits the final value:

| agent               | environment answers                     |
|---------------------|-----------------------------------------|
| `CALC a op b <eot>` | `= r` with `r = (a op b) mod modulus`   |
| `SUBMIT r <eot>`    | `PASS` or `FAIL`; the episode ends      |

`op` is one of `+ - *`; the mask allows numbers `0 … modulus-1` as
operands. An error (a miscopied operand) propagates to every later step.

Verifier: the submitted value is the chain's value (`won`). Graded score:
`progress / num_ops`, where `progress` counts the chain's steps done in
order with the calculator (a `CALC` whose operands are the previous
step's value, the next operator and the next operand); `reward = won +
score_weight * score` on the submit step, 0 otherwise (and on truncation
after `max_turns` turns).

Difficulty knobs: `num_ops` (default 4), `modulus` (31, prime, so that
`*` keeps the values spread), `max_turns` (default `2 num_ops + 2`).

**Privileged columns** (`obs[:, K:]`, expert only, see
[`envs.tokens`][jaxil.envs.tokens]): the partial command (4 tokens) and its
length, then `progress`, the chain of values `r_0 … r_n` (`r_0` the first
operand, `r_n` the answer), the operators (`n`, 0/1/2 for `+ - *`) and the
operands `v_0 … v_n`.

[`arith_expert`][jaxil.envs.token_arith.arith_expert] is the scripted expert:
`CALC r_p op_{p+1} v_{p+1}` for `p = progress` until the chain is done, then
`SUBMIT r_n` (`num_ops + 1` turns).
[`arith_transcript_expert`][jaxil.envs.token_arith.arith_transcript_expert]
plays it from the agent's own context only, copying values from the
calculator's answers.
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
    OP0,
    PAD,
    VOCAB,
    Command,
    Outcome,
    TokenEnv,
    number,
    numbers,
    random_ints,
    value_of,
)

CALC, SUBMIT = VOCAB["CALC"], VOCAB["SUBMIT"]
NUM_OPS = 3  # + - *


@struct.dataclass
class ArithTask:
    operands: jax.Array  # [n+1] int32 v_0 … v_n
    ops: jax.Array  # [n] int32 0: +, 1: -, 2: *
    chain: jax.Array  # [n+1] int32 r_0 = v_0, r_k = r_{k-1} op_k v_k
    progress: jax.Array  # [] int32 chain steps computed in order


def _apply(op, a, b, modulus):
    return jnp.select([op == 0, op == 1], [a + b, a - b], a * b) % modulus


class ArithEnv(TokenEnv):
    """`tokens:arith` (see the module docstring)."""

    def __init__(self, num_ops: int = 4, modulus: int = 31, max_turns: int | None = None,
                 score_weight: float = 0.1):
        if not isinstance(num_ops, int) or num_ops < 1:
            raise ValueError(f"num_ops must be a positive int, got {num_ops!r}")
        if not 2 <= modulus <= MAX_NUMBER:
            raise ValueError(f"modulus must be in [2, {MAX_NUMBER}], got {modulus}")
        self.num_ops, self.modulus = num_ops, modulus
        nums, ops = numbers(0, modulus), tuple(OP0 + i for i in range(NUM_OPS))
        super().__init__(
            "tokens:arith", num_agents=1, prompt_len=2 + 2 * num_ops,
            commands=(Command("CALC", (nums, ops, nums), answer=2),
                      Command("SUBMIT", (nums,), answer=1)),
            num_features=3 * num_ops + 3,
            max_turns=2 * num_ops + 2 if max_turns is None else max_turns,
            score_weight=score_weight)

    def _generate(self, key):
        n, Q = self.num_ops, self.modulus
        r = random_ints(key, (2 * n + 1,), Q * NUM_OPS)
        operands, ops = r[:n + 1] % Q, r[n + 1:] % NUM_OPS
        chain = [operands[0]]
        for k in range(n):
            chain.append(_apply(ops[k], chain[-1], operands[k + 1], Q))
        chain = jnp.stack(chain).astype(jnp.int32)
        # <bos> arith v0 op1 v1 … opn vn
        body = jnp.stack([OP0 + ops, number(operands[1:])], axis=1).reshape(-1)
        prompt = jnp.concatenate([jnp.array([VOCAB["arith"]], jnp.int32),
                                  number(operands[:1]), body])
        return ArithTask(operands, ops, chain, jnp.int32(0)), prompt[None]

    def chat_intro(self) -> str:
        Q = self.modulus
        return (f"You evaluate a chain of operations modulo {Q}, left to right with no "
                f"precedence: 7 + 12 * 3 means (7 + 12) * 3. Do not compute yourself; use the "
                f"calculator one operation at a time. Each turn, write exactly one command:\n"
                f"CALC a op b - with a and b in 0-{Q - 1} and op one of + - *; the answer is "
                f"= r\n"
                f"SUBMIT r - give the chain's final value and finish.\n"
                f"Write only the command, e.g. CALC 7 + 12")

    def _features(self, task):
        return jnp.concatenate([task.progress[None], task.chain, task.ops, task.operands])[None]

    def _execute(self, task, cmd, cmd_len, ended):
        n, Q = self.num_ops, self.modulus
        c, e = cmd[0], ended[0]
        kind = c[0]
        a, op, b = value_of(c[1]), c[2] - OP0, value_of(c[3])
        result = _apply(op, a, b, Q)
        calc = e & (kind == CALC)
        p = task.progress
        q = jnp.minimum(p, n - 1)
        in_order = (p < n) & (a == task.chain[q]) & (op == task.ops[q]) & (b == task.operands[q + 1])
        progress = p + (calc & in_order).astype(jnp.int32)
        submit = e & (kind == SUBMIT)
        right = value_of(c[1]) == task.chain[n]
        answer = jnp.where(kind == CALC, jnp.stack([VOCAB["="], number(result)]),
                           jnp.stack([jnp.where(right, VOCAB["PASS"], VOCAB["FAIL"]), PAD]))
        return Outcome(task=task.replace(progress=progress), answer=answer[None].astype(jnp.int32),
                       done=submit, won=right, score=progress / n)


def _next_token(n, cmd, cmd_len, progress, value, ops, operands, submitted):
    """The next token of both arith experts, given what each knows: at a
    turn start `CALC` (or `SUBMIT` once `progress >= n`), then the `CALC`'s
    `value op_{p+1} v_{p+1}` (`value` is r_progress), a `SUBMIT`'s
    `submitted`, and `<eot>` once the command is complete."""
    q = jnp.minimum(progress, n - 1)
    kind = cmd[0]
    calc = kind == CALC
    return jnp.select(
        [cmd_len == 0,
         calc & (cmd_len == 1), calc & (cmd_len == 2), calc & (cmd_len == 3),
         (kind == SUBMIT) & (cmd_len == 1)],
        [jnp.where(progress >= n, SUBMIT, CALC),
         number(value), OP0 + ops[q], number(operands[q + 1]), number(submitted)],
        EOT).astype(jnp.int32)


def arith_expert(env: MultiAgentEnv) -> Policy:
    """Scripted expert for `tokens:arith`, from the privileged columns.

    At a turn start: `CALC r_p op_{p+1} v_{p+1}` for `p = progress` (the
    chain steps done so far), or `SUBMIT r_n` once all are done. Mid-turn
    it completes the command it took over with the next step's tokens (a
    miscopied `CALC` is sent, its result ignored, and the right one
    follows); a `SUBMIT` it took over gets the chain's value. Deterministic.
    """
    if not isinstance(env, ArithEnv):
        raise TypeError(f"arith_expert needs a tokens:arith environment, got {env!r}")
    n = env.num_ops

    def one(cmd, cmd_len, f):
        p = f[0]
        chain, ops, operands = f[1:n + 2], f[n + 2:2 * n + 2], f[2 * n + 2:]
        return _next_token(n, cmd, cmd_len, p, chain[jnp.minimum(p, n)], ops, operands,
                           submitted=chain[n])

    def act(params, obs, avail, key, carry):
        p = env.privileged(obs)
        return jax.vmap(one)(p.cmd, p.cmd_len, p.features), carry

    return Policy(init=stateless_carry, act=act)


@struct.dataclass
class _ArithNotes:
    """What the transcript of `tokens:arith` has shown."""

    operands: jax.Array  # [n+1] int32 v_0 … v_n (from the prompt)
    ops: jax.Array  # [n] int32 0/1/2 (from the prompt)
    progress: jax.Array  # [] int32 chain steps the calculator answered in order
    value: jax.Array  # [] int32 r_progress, the last such answer (v_0 at the start)


def arith_transcript_expert(env: MultiAgentEnv) -> Policy:
    """Transcript-only expert for `tokens:arith`: it never computes, it
    copies operands from the prompt and values from the calculator's
    answers.

    It reads the chain from its prompt and counts the steps done: a `CALC
    a op b` answered `= r` is step `p + 1` when `a` is the last value
    shown for step `p` (`v_0` for `p = 0`), `op` and `b` the prompt's
    next operator and operand; `r` is then step `p + 1`'s value. At a
    turn start: `CALC r_p op_{p+1} v_{p+1}` until all steps are done, then
    `SUBMIT r_n`. Taking over a partial `CALC` it types the next step's
    tokens (a miscopied one is sent, and its answer does not count); a
    `SUBMIT` typed before the chain was done gets the last value the
    calculator showed, the best the transcript holds (where
    [arith_expert][jaxil.envs.token_arith.arith_expert] submits the hidden
    chain's value). From a fresh episode it plays exactly `arith_expert`'s
    tokens. Deterministic.
    """
    if not isinstance(env, ArithEnv):
        raise TypeError(f"arith_transcript_expert needs a tokens:arith environment, got {env!r}")
    n, Q = env.num_ops, env.modulus

    def read_prompt(prompt):
        # arith v0 op1 v1 … opn vn
        body = prompt[1:2 + 2 * n]
        operands = jnp.clip(value_of(body[0::2]), 0, Q - 1)
        ops = jnp.clip(body[1::2] - OP0, 0, NUM_OPS - 1)
        return _ArithNotes(operands, ops, jnp.int32(0), operands[0])

    def read(m, cmd, cmd_len, ended, answer):
        p = m.progress
        q = jnp.minimum(p, n - 1)
        step = (ended & (cmd[0] == CALC) & (answer[0] == VOCAB["="]) & (p < n)
                & (value_of(cmd[1]) == m.value) & (cmd[2] - OP0 == m.ops[q])
                & (value_of(cmd[3]) == m.operands[q + 1]))
        return m.replace(progress=p + step.astype(jnp.int32),
                         value=jnp.where(step, value_of(answer[1]), m.value))

    def choose(m, cmd, cmd_len):
        return _next_token(n, cmd, cmd_len, m.progress, m.value, m.ops, m.operands,
                           submitted=m.value)

    return transcript_policy(env, read_prompt, read, choose)
