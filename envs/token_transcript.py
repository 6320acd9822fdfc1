"""Experts that read only the transcript: the plumbing every task's shares.

A token task's scripted expert acts on the privileged columns
(`obs[:, K:]`, see [`envs.tokens`][jaxil.envs.tokens]): the hidden list,
the chain's values, whether a message was heard right. A student never sees
them, so where the scripted expert's token follows from them and not from
the transcript, a student trained on it learns to guess (the imitation gap).
A **transcript-only expert** acts the way a perfect language-model expert
would: its token is a function of the agent's own context alone, the
non-`<pad>` tokens of `obs[:, :K]` of every step so far.

[transcript_policy][jaxil.envs.token_transcript.transcript_policy] turns a
task's three pure functions into such a
[Policy][jaxil.envs.policies.Policy]:

- `read_prompt(prompt) -> memory`: what the agent keeps from its prompt
  (the tokens after `<bos>`);
- `read(memory, cmd, cmd_len, ended, answer) -> memory`: the update on
  every later step, from the agent's own command so far (`cmd`,
  `cmd_len`: the tokens it typed since its last `<eot>`), whether this
  step's echo was `<eot>` (`ended`; `cmd` is then the command just sent)
  and the environment's answer tokens (`<pad>` when none);
- `choose(memory, cmd, cmd_len) -> token`: the next token.

The carry holds, per agent, the memory and the partial command, both built
from the token columns only: the policy slices `obs[:, :K]` before it
reads anything, so the privileged columns cannot reach its action. The
carry convention is the rollout's (`init(key, N)`, reset at every episode
boundary); the first observation of an episode (its echo column is
`<bos>`, never an action) also restarts it, so a rollout that forgets the
reset still gets the right expert.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from .policies import Policy

_PAD = 0  # `<pad>`, token 0 of every token vocabulary


class TranscriptCarry(NamedTuple):
    """The carry of a transcript-only expert (leading axis: the agents).

    Attributes:
      memory: what the task's expert keeps from the transcript (a pytree).
      cmd: [N, cmd_width] int32 the agent's tokens since its last `<eot>`.
      cmd_len: [N] int32 how many.
    """

    memory: Any
    cmd: jax.Array
    cmd_len: jax.Array


def transcript_policy(env: Any, read_prompt: Callable[[jax.Array], Any],
                      read: Callable[..., Any],
                      choose: Callable[[Any, jax.Array, jax.Array], jax.Array]) -> Policy:
    """A [Policy][jaxil.envs.policies.Policy] that acts on the agent's own
    transcript only (see the module docstring for the three functions, each
    written for ONE agent; they are vmapped over the agents).

    Args:
      env: a token environment (`token_width`, `cmd_width`, `bos_token`,
        `eot_token`, `wait_token`).
      read_prompt: `read_prompt(prompt [K-1]) -> memory`.
      read: `read(memory, cmd [C], cmd_len, ended, answer [K-1]) -> memory`.
      choose: `choose(memory, cmd [C], cmd_len) -> token id`.

    Returns:
      The policy; its carry is a
      [TranscriptCarry][jaxil.envs.token_transcript.TranscriptCarry].
    """
    K, C = env.token_width, env.cmd_width
    bos, eot, wait = env.bos_token, env.eot_token, env.wait_token

    def fresh(row):
        return TranscriptCarry(read_prompt(row[1:]), jnp.zeros((C,), jnp.int32), jnp.int32(0))

    def see(c: TranscriptCarry, row: jax.Array) -> TranscriptCarry:
        echo, answer = row[0], row[1:]
        ended = echo == eot
        memory = read(c.memory, c.cmd, c.cmd_len, ended, answer)
        grow = ~ended & (echo != wait) & (echo != _PAD)
        at = jnp.minimum(c.cmd_len, C - 1)
        cmd = c.cmd.at[at].set(jnp.where(grow, echo, c.cmd[at]))
        later = TranscriptCarry(memory, jnp.where(ended, 0, cmd),
                                jnp.where(ended, 0, c.cmd_len + grow.astype(jnp.int32)))
        start = fresh(row)
        return jax.tree.map(lambda a, b: jnp.where(echo == bos, a, b), start, later)

    def init(key, n):
        rows = jnp.zeros((n, K), jnp.int32).at[:, 0].set(bos)
        return jax.vmap(fresh)(rows)

    def act(params, obs, avail, key, carry):
        rows = jnp.round(jnp.asarray(obs)[:, :K]).astype(jnp.int32)  # the context, nothing else
        carry = jax.vmap(see)(carry, rows)
        return jax.vmap(choose)(carry.memory, carry.cmd, carry.cmd_len).astype(jnp.int32), carry

    return Policy(init=init, act=act)
