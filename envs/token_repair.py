"""`tokens:repair`: find and fix the faults of a hidden list with tools.

SWE-bench in miniature. A hidden file is a list `x` of `length` values in
`0 … values-1`; a hidden test suite expects the list `y` (test `i`
checks `x[i] == y[i]`). `faults` distinct entries of `x` were changed
to another value. The agent (N = 1) repairs the file with commands, one
token per step, each ended by `<eot>`; the environment answers after it:

========================  =============================================
agent                     environment answers
========================  =============================================
`TEST <eot>`            `PASS`, or the first failing test:
                          `FAIL i WANT y_i GOT x_i`
`VIEW i <eot>`          `= x_i`
`EDIT i v <eot>`        `OK` (and sets `x_i = v`)
`SUBMIT <eot>`          the `TEST` answer; the episode ends
========================  =============================================

The prompt is `<bos> repair`: the file is only seen through the tools.
The legal-token mask allows a location (`0 … length-1`) after `VIEW` /
`EDIT` and a value (`0 … values-1`) after `EDIT i`.

Verifier: every test passes at `SUBMIT` (`won`). Graded score: the
fraction of tests passing at `SUBMIT`; `reward = won + score_weight *
score` on the submit step, 0 otherwise (and on truncation after
`max_turns` turns).

Difficulty knobs: `length` (default 8), `faults` (3), `values` (16),
`max_turns` (default `4 faults + 8`, 20: twice what the expert needs
plus slack).

**Privileged columns** (`obs[:, K:]`, expert only, see
[`envs.tokens`][jaxil.envs.tokens]): the partial command (3 tokens) and its
length, then `x` (`length`), `y` (`length`) and the last test report (`-1`:
none since the last `EDIT`; `i < length`: `FAIL` at `i`; `length`: `PASS`).

[`repair_expert`][jaxil.envs.token_repair.repair_expert] is the scripted
expert: `TEST`; on `FAIL i WANT v`, `EDIT i v`; `TEST` again; on `PASS`,
`SUBMIT` (2F + 2 turns for F faults: the procedure a student can follow from
the transcript).
[`repair_transcript_expert`][jaxil.envs.token_repair.repair_transcript_expert]
plays it from the agent's own context only (the same tokens from a fresh
episode; a partial command it takes over is completed from what the answers
showed).
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
    Command,
    Outcome,
    TokenEnv,
    number,
    numbers,
    random_ints,
    value_of,
)

TEST, VIEW, EDIT, SUBMIT = (VOCAB[n] for n in ("TEST", "VIEW", "EDIT", "SUBMIT"))


@struct.dataclass
class RepairTask:
    x: jax.Array  # [L] int32 the file now
    y: jax.Array  # [L] int32 what the tests expect
    report: jax.Array  # [] int32 last TEST: -1 none, i < L fail at i, L pass


class RepairEnv(TokenEnv):
    """`tokens:repair` (see the module docstring)."""

    def __init__(self, length: int = 8, faults: int = 3, values: int = 16,
                 max_turns: int | None = None, score_weight: float = 0.1):
        if not 1 <= length <= MAX_NUMBER:
            raise ValueError(f"length must be in [1, {MAX_NUMBER}], got {length}")
        if not 1 <= faults <= length:
            raise ValueError(f"faults must be in [1, length={length}], got {faults}")
        if not 2 <= values <= MAX_NUMBER:
            raise ValueError(f"values must be in [2, {MAX_NUMBER}], got {values}")
        self.length, self.faults, self.values = length, faults, values
        locs, vals = numbers(0, length), numbers(0, values)
        super().__init__(
            "tokens:repair", num_agents=1, prompt_len=1,
            commands=(Command("TEST", answer=6), Command("VIEW", (locs,), answer=2),
                      Command("EDIT", (locs, vals), answer=1), Command("SUBMIT", answer=6)),
            num_features=2 * length + 1,
            max_turns=4 * faults + 8 if max_turns is None else max_turns,
            score_weight=score_weight)

    def _generate(self, key):
        L, F, M = self.length, self.faults, self.values
        r = random_ints(key, (3, L), 2**30)
        y = r[0] % M
        # the F entries with the smallest draws (ties broken by index) are faulty
        u, idx = r[1], jnp.arange(L)
        rank = ((u[None, :] < u[:, None]) | ((u[None, :] == u[:, None]) & (idx[None, :] < idx[:, None]))).sum(1)
        shift = 1 + r[2] % (M - 1)
        x = jnp.where(rank < F, (y + shift) % M, y)
        task = RepairTask(x=x, y=y, report=jnp.int32(-1))
        return task, jnp.full((1, 1), VOCAB["repair"], jnp.int32)

    def chat_intro(self) -> str:
        L, M = self.length, self.values
        return (f"You are repairing a hidden file: a list of {L} numbers, each 0-{M - 1}. "
                f"Some entries are wrong. Test i checks entry i. Each turn, write exactly one "
                f"command:\n"
                f"TEST - run the tests; the answer is PASS, or the first failing test as "
                f"FAIL i WANT v GOT u\n"
                f"VIEW i - show entry i (0-{L - 1}); the answer is = u\n"
                f"EDIT i v - set entry i to v (0-{M - 1}); the answer is OK\n"
                f"SUBMIT - finish; you win if every test passes.\n"
                f"Write only the command, e.g. EDIT 3 7")

    def _features(self, task):
        return jnp.concatenate([task.x, task.y, task.report[None]])[None]

    def _execute(self, task, cmd, cmd_len, ended):
        L, M = self.length, self.values
        c, e = cmd[0], ended[0]
        kind = c[0]
        loc = jnp.clip(value_of(c[1]), 0, L - 1)
        val = jnp.clip(value_of(c[2]), 0, M - 1)
        edit = e & (kind == EDIT)
        x = jnp.where(edit, task.x.at[loc].set(val), task.x)
        bad = x != task.y
        failing = bad.any()
        first = jnp.argmax(bad)
        report_toks = jnp.where(
            failing,
            jnp.stack([VOCAB["FAIL"], number(first), VOCAB["WANT"], number(task.y[first]),
                       VOCAB["GOT"], number(x[first])]),
            jnp.array([VOCAB["PASS"], PAD, PAD, PAD, PAD, PAD], jnp.int32))
        pad4 = jnp.full((4,), PAD, jnp.int32)
        view_toks = jnp.concatenate([jnp.stack([VOCAB["="], number(x[loc])]), pad4])
        ok_toks = jnp.array([VOCAB["OK"], PAD, PAD, PAD, PAD, PAD], jnp.int32)
        answer = jnp.where(kind == VIEW, view_toks, jnp.where(kind == EDIT, ok_toks, report_toks))
        test = e & (kind == TEST)
        report = jnp.where(test, jnp.where(failing, first, L),
                           jnp.where(edit, -1, task.report)).astype(jnp.int32)
        submit = e & (kind == SUBMIT)
        return Outcome(task=RepairTask(x=x, y=task.y, report=report), answer=answer[None],
                       done=submit, won=~failing, score=jnp.mean(~bad))


def repair_expert(env: MultiAgentEnv) -> Policy:
    """Scripted expert for `tokens:repair`, from the privileged columns.

    At a turn start: `SUBMIT` after a `PASS` report, `EDIT i y_i` after
    a `FAIL i` report, `TEST` otherwise (at the start, after an `EDIT`,
    after a `VIEW`). Mid-turn (taking over a partial command) it completes
    the command harmlessly: `EDIT`/`VIEW` get the reported (else the
    first failing) location, `EDIT i` gets the right value `y_i`, a
    complete command gets `<eot>`; a wrong `EDIT i v` already typed is
    sent and repaired after the next `TEST`. Deterministic.
    """
    if not isinstance(env, RepairEnv):
        raise TypeError(f"repair_expert needs a tokens:repair environment, got {env!r}")
    L = env.length

    def one(cmd, cmd_len, f):
        x, y, report = f[:L], f[L:2 * L], f[2 * L]
        bad = x != y
        known = (report >= 0) & (report < L)
        target = jnp.where(known, report, jnp.where(bad.any(), jnp.argmax(bad), 0))
        start = jnp.where(report == L, SUBMIT, jnp.where(known, EDIT, TEST))
        kind = cmd[0]
        loc_next = (kind == EDIT) | (kind == VIEW)
        edit_val = number(y[jnp.clip(value_of(cmd[1]), 0, L - 1)])
        return jnp.select(
            [cmd_len == 0, loc_next & (cmd_len == 1), (kind == EDIT) & (cmd_len == 2)],
            [start, number(target), edit_val], EOT).astype(jnp.int32)

    def act(params, obs, avail, key, carry):
        p = env.privileged(obs)
        return jax.vmap(one)(p.cmd, p.cmd_len, p.features), carry

    return Policy(init=stateless_carry, act=act)


@struct.dataclass
class _RepairNotes:
    """What the transcript of `tokens:repair` has shown (per location)."""

    x_known: jax.Array  # [L] bool the file's current value is known
    x: jax.Array  # [L] int32 that value (from VIEW, from a FAIL's GOT, from the agent's EDIT)
    y_known: jax.Array  # [L] bool the test's wanted value is known (from a FAIL's WANT)
    y: jax.Array  # [L] int32 that value
    report: jax.Array  # [] int32 last TEST / SUBMIT answer since the last EDIT: -1, i or L (PASS)


def repair_transcript_expert(env: MultiAgentEnv) -> Policy:
    """Transcript-only expert for `tokens:repair`: the scripted procedure,
    with every choice read from the agent's own context.

    It remembers what the answers showed: a `FAIL i WANT v GOT u` (test
    `i` wants `v`, the file holds `u`), a `= u` after `VIEW i`, its own
    `EDIT i v` (the file now holds `v`), a `PASS`; an `EDIT` makes the
    last test report stale. At a turn start: `SUBMIT` after a `PASS` not
    followed by an `EDIT`, `EDIT i v` after such a `FAIL i WANT v`,
    `TEST` otherwise. Taking over a partial command, it completes it with
    what the transcript justifies: a location after `EDIT` / `VIEW` is the
    reported failing one, else one whose wanted value is known and not yet
    written, else one whose current value is known (re-writing it changes
    nothing), else 0; a value after `EDIT i` is the wanted `y_i` if a
    report showed it, else the known current value, else 0 (a guess: the
    next `TEST` reports any damage, which is then repaired). From a fresh
    episode it plays exactly [repair_expert][jaxil.envs.token_repair.repair_expert]'s
    tokens. Deterministic.
    """
    if not isinstance(env, RepairEnv):
        raise TypeError(f"repair_transcript_expert needs a tokens:repair environment, got {env!r}")
    L, M = env.length, env.values

    def read_prompt(prompt):
        no, zero = jnp.zeros((L,), bool), jnp.zeros((L,), jnp.int32)
        return _RepairNotes(no, zero, no, zero, jnp.int32(-1))

    def read(m, cmd, cmd_len, ended, answer):
        kind = cmd[0]
        loc = jnp.clip(value_of(cmd[1]), 0, L - 1)
        val = jnp.clip(value_of(cmd[2]), 0, M - 1)
        tested = ended & ((kind == TEST) | (kind == SUBMIT))
        passed = tested & (answer[0] == VOCAB["PASS"])
        failed = tested & (answer[0] == VOCAB["FAIL"])
        fi = jnp.clip(value_of(answer[1]), 0, L - 1)
        viewed = ended & (kind == VIEW)
        edited = ended & (kind == EDIT)
        x_at = jnp.where(failed, fi, loc)
        x_new = jnp.select([failed, viewed, edited],
                           [value_of(answer[5]), value_of(answer[1]), val], 0)
        write_x = failed | viewed | edited
        x_known = jnp.where(write_x, m.x_known.at[x_at].set(True), m.x_known)
        x = jnp.where(write_x, m.x.at[x_at].set(x_new), m.x)
        y_known = jnp.where(failed, m.y_known.at[fi].set(True), m.y_known)
        y = jnp.where(failed, m.y.at[fi].set(value_of(answer[3])), m.y)
        report = jnp.select([passed, failed, edited], [L, fi, -1], m.report).astype(jnp.int32)
        return _RepairNotes(x_known, x, y_known, y, report)

    def choose(m, cmd, cmd_len):
        known = (m.report >= 0) & (m.report < L)
        todo = m.y_known & ~(m.x_known & (m.x == m.y))
        target = jnp.select([known, todo.any(), m.x_known.any()],
                            [m.report, jnp.argmax(todo), jnp.argmax(m.x_known)], 0)
        start = jnp.where(m.report == L, SUBMIT, jnp.where(known, EDIT, TEST))
        kind = cmd[0]
        i = jnp.clip(value_of(cmd[1]), 0, L - 1)
        value = jnp.where(m.y_known[i], m.y[i], jnp.where(m.x_known[i], m.x[i], 0))
        return jnp.select(
            [cmd_len == 0, ((kind == EDIT) | (kind == VIEW)) & (cmd_len == 1),
             (kind == EDIT) & (cmd_len == 2)],
            [start, number(target), number(value)], EOT).astype(jnp.int32)

    return transcript_policy(env, read_prompt, read, choose)
