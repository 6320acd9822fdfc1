"""From one round's episodes to training targets: labels, loss masks, filters.

Pure functions over batch-major episode arrays (`E` episodes, `T` steps, `N`
agents);
[`jaxil.algorithms.interactive.loop`][jaxil.algorithms.interactive.loop]
composes them. Notation per episode e and step t: `valid[e, t]` (the step
happened), `expert_acted[e, t]` (the expert chose the executed joint action),
`k_e` the OEC switch step.

- Targets. DAgger and BC train on the expert's label at every visited state;
  OEC and on-policy rejection sampling train on the executed action (under
  OEC's mask that is the expert's own action).
- Loss mask. `valid ∧ (expert_acted ∨ ¬mask_prefix) ∧ kept[e]`: with the
  OEC prefix mask on, the student's steps t < k are context only.
- Expert labels spent (the budget): `N · Σ_t valid ∧ (expert_acted ∨
  labels_every_step)`. DAgger labels every visited state; OEC pays only for the
  expert's steps; rejection sampling pays nothing. Episodes rejected by a
  filter have still been paid for.
- Verifier: accept a win (tasks with a win), or `return ≥ threshold`.
- Repetition filter: reject an episode in which some agent meets the same
  (observation, action) pair `R` or more times (stuck in a loop), counting
  only agent-steps with a choice (more than one available action).
- Budget: episodes are taken in index order while the cumulative labels they
  spent stay within the round's allowance; the rest are dropped unpaid (as if
  never run), so every method stops at the same expert-label count.
"""

from __future__ import annotations

from typing import Optional

import chex
import jax
import jax.numpy as jnp

VERIFIERS = ("off", "win", "return")


def loss_mask(valid: jax.Array, expert_acted: jax.Array, mask_prefix, kept: jax.Array) -> jax.Array:
    """`[E, T]` bool: the steps a round trains on.

    Args:
      valid: `[E, T]` bool, steps that happened.
      expert_acted: `[E, T]` bool, the expert chose the executed action.
      mask_prefix: bool scalar (may be traced); True masks the student's steps out.
      kept: `[E]` bool, episodes that passed the filters and the budget.
    """
    chex.assert_rank([valid, expert_acted, kept], [2, 2, 1])
    chex.assert_equal_shape([valid, expert_acted])
    chex.assert_equal_shape_prefix([valid, kept], 1)
    own = expert_acted | ~jnp.asarray(mask_prefix, jnp.bool_)
    return valid & own & kept[:, None]


def training_targets(label: jax.Array, executed: jax.Array, use_label) -> jax.Array:
    """The expert's labels (`use_label`) or the executed actions, `[E, T, N(, d)]`."""
    chex.assert_equal_shape([label, executed])
    return jnp.where(jnp.asarray(use_label, jnp.bool_), label, executed).astype(executed.dtype)


def labels_spent(valid: jax.Array, expert_acted: jax.Array, label_every_step, num_agents: int
                 ) -> jax.Array:
    """`[E]` int32 expert labels (agent-steps the expert annotated) per episode."""
    chex.assert_rank([valid, expert_acted], 2)
    chex.assert_equal_shape([valid, expert_acted])
    asked = valid & (expert_acted | jnp.asarray(label_every_step, jnp.bool_))
    return num_agents * jnp.sum(asked, axis=1, dtype=jnp.int32)


def within_allowance(spent: jax.Array, allowance) -> jax.Array:
    """`[E]` bool: episodes (in index order) whose cumulative cost stays
    `≤ allowance`; an episode that spent nothing is always within."""
    chex.assert_rank(spent, 1)
    return jnp.cumsum(spent) <= jnp.asarray(allowance, spent.dtype)


def verify(won: jax.Array, episode_return: jax.Array, kind, threshold) -> jax.Array:
    """`[E]` bool verdicts of `VERIFIERS[kind]`: off accepts everything,
    `win` accepts won episodes, `return` accepts `return ≥ threshold`."""
    chex.assert_rank([won, episode_return], 1)
    chex.assert_equal_shape([won, episode_return])
    options = jnp.stack([
        jnp.ones_like(won, jnp.bool_),
        won.astype(jnp.bool_),
        episode_return >= jnp.asarray(threshold, episode_return.dtype),
    ])
    return options[jnp.asarray(kind, jnp.int32)]


def max_repeats(obs: jax.Array, actions: jax.Array, valid: jax.Array,
                agent_mask: Optional[jax.Array] = None) -> jax.Array:
    """`[E]` int32: per episode, the largest number of valid steps at which
    one agent meets one and the same (observation, action) pair.

    `agent_mask` `[E, T, N]` limits the count to the agent-steps it
    marks, e.g. agents with more than one available action: a dead SMAX unit
    (zero observation, no-op only) repeats one pair until the episode ends,
    which is not a loop the policy is stuck in.

    Pairs are compared exactly: observations and actions are joined into one
    vector per agent-step and hashed by two fixed random projections
    (identical vectors give identical hashes bit for bit; distinct ones
    collide with probability 0 in exact arithmetic), then counted with a
    `T × T` comparison per agent.

    Args:
      obs: `[E, T, N, O]`; actions: `[E, T, N]` int or `[E, T, N, d]`;
      valid: `[E, T]` bool.
      agent_mask: optional `[E, T, N]` bool, the agent-steps to count.
    """
    chex.assert_rank([obs, valid], [4, 2])
    chex.assert_equal_shape_prefix([obs, actions, valid], 2)
    E, T, N, _ = obs.shape
    act = actions.reshape(E, T, N, -1).astype(jnp.float32)
    x = jnp.concatenate([obs.astype(jnp.float32), act], axis=-1)
    proj = jax.random.normal(jax.random.PRNGKey(0x0EC), (x.shape[-1], 2), jnp.float32)
    h = jnp.einsum("etnf,fk->etnk", x, proj, precision=jax.lax.Precision.HIGHEST)
    same = jnp.all(h[:, :, None] == h[:, None, :], axis=-1)  # [E, T, T, N]
    live = jnp.broadcast_to(valid[..., None], (E, T, N))
    if agent_mask is not None:
        chex.assert_shape(agent_mask, (E, T, N))
        live = live & agent_mask
    both = live[:, :, None, :] & live[:, None, :, :]  # [E, T, T, N]
    counts = jnp.sum(same & both, axis=2)  # [E, T, N]: matches of step t
    return jnp.max(jnp.where(live, counts, 0), axis=(1, 2)).astype(jnp.int32)


def passes_repetition(obs, actions, valid, limit, agent_mask=None) -> jax.Array:
    """`[E]` bool: no agent repeats an (observation, action) pair `limit`
    times (among the agent-steps `agent_mask` marks); `limit ≤ 0` turns
    the filter off."""
    limit = jnp.asarray(limit, jnp.int32)
    return (limit <= 0) | (max_repeats(obs, actions, valid, agent_mask) < limit)
