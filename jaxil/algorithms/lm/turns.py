"""Turns of a token episode: which turn each token belongs to, and which
tokens an agent actually says.

A token environment ([`envs.tokens`][jaxil.envs.tokens]) ends an agent's turn with
`<eot>`; the environment answers after it. Over one episode's recorded
tokens `actions [T, N]`:

- [`turn_index`][jaxil.algorithms.lm.turns.turn_index] — `[T]` the episode's
  turn at each step: the number of `<eot>` tokens any agent emitted BEFORE the
  step (turns of all agents counted together, as the environments' `max_turns`
  does). Step `t` opens a turn when `t = 0` or a token at `t − 1` was `<eot>`.
- [`agent_turn_index`][jaxil.algorithms.lm.turns.agent_turn_index] — `[T, N]`
  the same count per agent (its own `<eot>` tokens before the step).
- [`speaking`][jaxil.algorithms.lm.turns.speaking] — `[T, N]` the tokens an
  agent chose on its turn: valid steps whose legal mask is not `<wait>` alone
  (an agent off turn in `tokens:exchange` may only wait; that token costs no
  one anything).

Pure functions of arrays; `vmap` them over episodes. The special tokens
are the environment's (`env.eot_token`, `env.wait_token`, checked by
[token_specials][jaxil.envs.tokens.token_specials]), passed in by keyword.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp



def _exclusive_cumsum(x: jax.Array, axis: int = 0) -> jax.Array:
    c = jnp.cumsum(x.astype(jnp.int32), axis=axis)
    return c - x.astype(jnp.int32)


def turn_index(actions: jax.Array, *, eot: int) -> jax.Array:
    """`[T]` int32: how many turns (of any agent) ended before each step.

    Args:
      actions: `[T, N]` integer tokens of one episode.
      eot: the environment's `<eot>` id.
    """
    chex.assert_rank(actions, 2)
    return _exclusive_cumsum(jnp.any(actions == eot, axis=1))


def agent_turn_index(actions: jax.Array, *, eot: int) -> jax.Array:
    """`[T, N]` int32: how many of its own turns each agent ended before
    each step (`eot`: the environment's `<eot>` id)."""
    chex.assert_rank(actions, 2)
    return _exclusive_cumsum(actions == eot, axis=0)


def speaking(avail: jax.Array, valid: jax.Array, *, wait: int) -> jax.Array:
    """`[T, N]` bool: valid steps at which the agent is on turn (its legal
    tokens are not `<wait>` alone).

    Args:
      avail: `[T, N, V]` legal-token masks.
      valid: `[T]` bool, the episode's valid steps.
      wait: the environment's `<wait>` id.
    """
    chex.assert_rank([avail, valid], [3, 1])
    only_wait = avail[..., wait] & (jnp.sum(avail.astype(jnp.int32), axis=-1) == 1)
    return valid.astype(bool)[:, None] & ~only_wait
