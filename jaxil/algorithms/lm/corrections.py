"""From takeover episodes to training tokens: loss masks, costs and the
repetition filter of interactive imitation on token tasks.

Pure functions over ONE episode (`T` steps, `N` agents); `vmap` them
over episodes. Notation: `valid [T]` (the step happened), `avail [T, N,
V]`, `expert_acted [T]` (the expert's tokens were played at the step).

- [`token_loss_mask`][jaxil.algorithms.lm.corrections.token_loss_mask] — the
  tokens a round trains on: `choice ∧ (expert_acted ∨ ¬mask_prefix) ∧
  kept`, with `choice` the agent tokens that had more than one legal option
  (forced tokens carry no gradient). With OEC's prefix mask the student's
  tokens before the switch are context only.
- [`expert_tokens`][jaxil.algorithms.lm.corrections.expert_tokens] — what an
  episode cost in expert tokens: the speaking agent tokens
  ([`jaxil.algorithms.lm.turns.speaking`][jaxil.algorithms.lm.turns.speaking])
  the expert produced, or, when every visited state is labelled (DAgger), every
  speaking token.
- [`max_turn_repeats`][jaxil.algorithms.lm.corrections.max_turn_repeats] /
  [`passes_repetition`][jaxil.algorithms.lm.corrections.passes_repetition] —
  the anti-loop filter: an agent that repeats one and the same TURN (the same
  tokens, answered the same by the environment) `R` times is stuck.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxil.algorithms.lm.turns import speaking
from jaxil.losses.sequence import agent_token_mask


def token_loss_mask(valid: jax.Array, avail: jax.Array, expert_acted: jax.Array,
                    mask_prefix, kept) -> jax.Array:
    """`[T, N]` bool: the agent tokens the student is trained on.

    Args:
      valid: `[T]` bool, steps that happened.
      avail: `[T, N, V]` legal-token masks.
      expert_acted: `[T]` bool, the expert's tokens were played.
      mask_prefix: bool scalar (may be traced): leave the student's tokens out.
      kept: bool scalar, the episode passed the filters and the budget.
    """
    chex.assert_rank([valid, avail, expert_acted], [1, 3, 1])
    chex.assert_equal_shape([valid, expert_acted])
    own = expert_acted | ~jnp.asarray(mask_prefix, jnp.bool_)
    choice = agent_token_mask(valid, avail.shape[1], avail)
    return choice & own[:, None] & jnp.asarray(kept, jnp.bool_)


def expert_tokens(valid: jax.Array, avail: jax.Array, expert_acted: jax.Array,
                  label_every_step, *, wait: int) -> jax.Array:
    """int32 scalar: the expert tokens an episode cost (speaking agent
    tokens the expert produced, or all of them with `label_every_step`;
    `wait`: the environment's `<wait>` id)."""
    chex.assert_rank([valid, avail, expert_acted], [1, 3, 1])
    asked = expert_acted | jnp.asarray(label_every_step, jnp.bool_)
    return jnp.sum(speaking(avail, valid, wait=wait) & asked[:, None], dtype=jnp.int32)


def _turn_hashes(after: jax.Array, actions: jax.Array, speak: jax.Array, width: int,
                 vocab: int, eot: int):
    """Per agent and step: the running hash of the agent's current turn
    (its tokens with their position in the turn, and the environment's
    answer that enters the context after its `<eot>`) and whether the step
    ends the turn.

    The hash is a float sum of fixed random table entries accumulated in
    step order from 0 at each turn's start, so two identical turns give
    bit-identical hashes; distinct ones collide with probability 0 in
    exact arithmetic. Returns `(hash [T, N, 2], ends [T, N])`."""
    K, V = after.shape[-1], vocab
    k_obs, k_act = jax.random.split(jax.random.PRNGKey(0x7A5), 2)
    table_obs = jax.random.normal(k_obs, (K, V, 2), jnp.float32)
    table_act = jax.random.normal(k_act, (width, V, 2), jnp.float32)
    cols = jnp.arange(K)

    def agent(aft, act, spk):
        def body(c, x):
            acc, pos, fresh = c
            t, a, s = x
            pos = jnp.where(fresh, 0, pos)
            acc = jnp.where(fresh, 0.0, acc)
            end = s & (a == eot)
            h = table_act[jnp.clip(pos, 0, width - 1), jnp.clip(a, 0, V - 1)]
            answer = jnp.sum(table_obs[cols, jnp.clip(t, 0, V - 1)], axis=0)
            acc = jnp.where(s, acc + h + jnp.where(end, answer, 0.0), acc)
            pos = jnp.where(s, pos + 1, pos)
            return (acc, pos, jnp.where(s, end, fresh)), (acc, end)

        init = (jnp.zeros((2,), jnp.float32), jnp.int32(0), jnp.bool_(True))
        _, (acc, end) = jax.lax.scan(body, init, (aft, act, spk))
        return acc, end

    return jax.vmap(agent, in_axes=(1, 1, 1), out_axes=1)(after, actions, speak)


def max_turn_repeats(after: jax.Array, actions: jax.Array, avail: jax.Array,
                     valid: jax.Array, width: int = 8, *, eot: int, wait: int) -> jax.Array:
    """int32 scalar: the largest number of times one agent plays one and
    the same turn in the episode.

    A turn is an agent's run of speaking steps ending with `<eot>`; it is
    identified by the tokens emitted, in order, and the environment's
    answer to it. Repeating a command that gets the same answer (`VIEW 3`
    → the same value; `TEST` without a successful edit in between → the
    same failing test) is a loop; the same command with a different answer
    (`TEST` after a fix) is not.

    Args:
      after: `[T, N, K]` integer tokens entering each agent's context
        AFTER each step (`obs[1:T+1, :, :K]`: after `<eot>`, the answer).
      actions: `[T, N]` the tokens played.
      avail: `[T, N, V]` legal-token masks.
      valid: `[T]` bool.
      width: the longest turn told apart by position (`env.cmd_width + 1`
        or more; later positions share a table row).
      eot: the environment's `<eot>` id.
      wait: its `<wait>` id.
    """
    chex.assert_rank([after, actions, avail, valid], [3, 2, 3, 1])
    speak = speaking(avail, valid, wait=wait)
    h, end = _turn_hashes(after.astype(jnp.int32), actions.astype(jnp.int32), speak, width,
                          avail.shape[-1], eot)
    same = jnp.all(h[:, None] == h[None, :], axis=-1)  # [T, T, N]
    both = end[:, None] & end[None, :]
    counts = jnp.sum(same & both, axis=1)  # [T, N]
    return jnp.max(jnp.where(end, counts, 0)).astype(jnp.int32)


def passes_repetition(after, actions, avail, valid, limit, width: int = 8, *, eot: int,
                      wait: int) -> jax.Array:
    """bool scalar: no agent plays one turn `limit` or more times
    ([`max_turn_repeats`][jaxil.algorithms.lm.corrections.max_turn_repeats]);
    `limit ≤ 0` turns the filter off."""
    limit = jnp.asarray(limit, jnp.int32)
    return (limit <= 0) | (max_turn_repeats(after, actions, avail, valid, width, eot=eot,
                                            wait=wait) < limit)
