"""Vectorized rollouts: `lax.scan` over time, `vmap` over environments.

A policy is either a plain function `policy(params, obs, avail, key) ->
actions` acting for all N agents of ONE environment (`obs [N, obs_dim]`,
`avail [N, A]`), or a [`envs.policies.Policy`][jaxil.envs.policies.Policy] that
also threads a recurrent carry (the SMAX heuristic needs one). Decentralised
policies vmap over agents inside.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .core import MultiAgentEnv
from .policies import as_policy
from .wrappers import AutoReset


@struct.dataclass
class Trajectory:
    """Time-major batch from [`rollout`][jaxil.envs.rollout.rollout]: every
    leaf is `[T, E, ...]`.

    `obs`/`global_state`/`avail_actions` are what the policy acted on;
    `reward`/`done`/`truncated`/`won` and the episode statistics
    belong to the transition that the action caused.
    """

    obs: jax.Array
    global_state: jax.Array
    avail_actions: jax.Array
    actions: jax.Array
    reward: jax.Array
    done: jax.Array
    truncated: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    won: jax.Array


def rollout(
    env: MultiAgentEnv,
    policy: Any,
    params: Any,
    key: jax.Array,
    num_envs: int,
    num_steps: int,
) -> Trajectory:
    """Run `num_envs` auto-resetting environments for `num_steps` steps.

    Jittable (`env`, `policy`, `num_envs` and `num_steps` static). Returns a
    time-major [`Trajectory`][jaxil.envs.rollout.Trajectory]
    `[num_steps, num_envs, ...]`.
    """
    if not isinstance(env, AutoReset):
        env = AutoReset(env)
    pol = as_policy(policy)
    n = env.spec.num_agents
    reset_key, carry_key, run_key = jax.random.split(key, 3)
    state, ts = jax.vmap(env.reset)(jax.random.split(reset_key, num_envs))
    pcarry = jax.vmap(lambda k: pol.init(k, n))(jax.random.split(carry_key, num_envs))

    def body(c, step_key):
        state, ts, pcarry = c
        act_key, init_key = jax.random.split(step_key)
        actions, new_pcarry = jax.vmap(pol.act, in_axes=(None, 0, 0, 0, 0))(
            params, ts.obs, ts.avail_actions, jax.random.split(act_key, num_envs), pcarry
        )
        actions = jax.vmap(env.legalize)(actions, ts.avail_actions)
        state, nts = jax.vmap(env.step)(state, actions)
        if pol.reset is not None:
            new_pcarry = jax.vmap(pol.reset)(new_pcarry, nts.last())
        else:
            fresh = jax.vmap(lambda k: pol.init(k, n))(jax.random.split(init_key, num_envs))
            new_pcarry = _where_batch(nts.last(), fresh, new_pcarry)
        out = Trajectory(
            obs=ts.obs,
            global_state=ts.global_state,
            avail_actions=ts.avail_actions,
            actions=actions,
            reward=nts.reward,
            done=nts.done,
            truncated=nts.truncated,
            episode_return=nts.episode_return,
            episode_length=nts.episode_length,
            won=nts.won,
        )
        return (state, nts, new_pcarry), out

    _, traj = jax.lax.scan(body, (state, ts, pcarry), jax.random.split(run_key, num_steps))
    return traj


@struct.dataclass
class Episodes:
    """One complete episode per environment, batch-major `[E, T(+1), ...]`.

    `T = spec.max_steps`; steps at and after `length` are padding
    (`mask` False, zeros). `obs`/`global_state`/`avail_actions` have
    `T + 1` entries: entry `length` is the final observation.
    """

    obs: jax.Array  # [E, T+1, N, obs_dim]
    global_state: jax.Array  # [E, T+1, S]
    avail_actions: jax.Array  # [E, T+1, N, A]
    actions: jax.Array  # [E, T, N] or [E, T, N, dim]
    reward: jax.Array  # [E, T]
    done: jax.Array  # [E, T]
    truncated: jax.Array  # [E, T]
    mask: jax.Array  # [E, T] valid steps
    episode_return: jax.Array  # [E]
    length: jax.Array  # [E]
    won: jax.Array  # [E]
    carry: Any = None  # [E, T, ...] the policy's carry after each act (record_carry)


def episode_summary(eps: Episodes, has_win: bool) -> dict[str, Any]:
    """The statistics every report of a batch of episodes gives, on the host
    in float64: `episodes`, `return_mean`, `return_std` (population),
    `length_mean` and, where the task has a win, `win_rate`."""
    ret = np.asarray(eps.episode_return, np.float64)
    out = dict(episodes=int(ret.size), return_mean=float(ret.mean()),
               return_std=float(ret.std()), length_mean=float(np.asarray(eps.length).mean()))
    if has_win:
        out["win_rate"] = float(np.asarray(eps.won).mean())
    return out


def run_episodes(
    env: MultiAgentEnv,
    policy: Any,
    params: Any,
    key: jax.Array,
    num_episodes: int,
    record_carry: bool | Callable[[Any], Any] = False,
) -> Episodes:
    """Play exactly one episode in each of `num_episodes` parallel envs.

    Steps run until every episode has ended (at most `spec.max_steps`): a
    `lax.while_loop` writes each step into preallocated `[T, ...]`
    buffers, so a batch of short episodes (SMAX 3m ends in ~15 of its 101
    steps) costs only the steps it takes. An environment that has finished is
    frozen (its steps are masked out) until the others end. Step `t` always
    draws its actions with the `t`-th of `T` keys split from `key`, so
    the result does not depend on when the loop stops.

    `record_carry=True` also returns the policy's carry after each step's
    `act` as `Episodes.carry` (`[E, T, ...]`, zero on padding steps): a
    policy that computes more than the actions it plays (the interactive
    learners record the expert's label and the student's choice there) gets
    them out without a second pass. A function instead of True records
    `record_carry(carry)`, the part of the carry worth keeping (a
    transformer's KV cache per step would be `T` times its size).
    """
    if isinstance(env, AutoReset):
        env = env.env
    pol = as_policy(policy)
    spec = env.spec
    n, T = spec.num_agents, spec.max_steps
    reset_key, carry_key, run_key = jax.random.split(key, 3)
    state, ts = jax.vmap(env.reset)(jax.random.split(reset_key, num_episodes))
    pcarry = jax.vmap(lambda k: pol.init(k, n))(jax.random.split(carry_key, num_episodes))
    alive = jnp.ones((num_episodes,), jnp.bool_)
    step_keys = jax.random.split(run_key, T)

    def step(state, ts, pcarry, alive, step_key):
        actions, new_pcarry = jax.vmap(pol.act, in_axes=(None, 0, 0, 0, 0))(
            params, ts.obs, ts.avail_actions, jax.random.split(step_key, num_episodes), pcarry
        )
        actions = jax.vmap(env.legalize)(actions, ts.avail_actions)
        new_state, nts = jax.vmap(env.step)(state, actions)
        # Finished environments stay frozen on their final step.
        new_state = _where_batch(alive, new_state, state)
        keep_ts = _where_batch(alive, nts, ts)
        new_pcarry = _where_batch(alive, new_pcarry, pcarry)
        zero = lambda x: jnp.where(_bcast(alive, x), x, jnp.zeros_like(x))
        out = dict(
            actions=zero(actions),
            reward=zero(nts.reward),
            done=zero(nts.done),
            truncated=zero(nts.truncated),
            mask=alive,
            obs=keep_ts.obs,
            global_state=keep_ts.global_state,
            avail_actions=keep_ts.avail_actions,
        )
        if record_carry:
            kept = record_carry(new_pcarry) if callable(record_carry) else new_pcarry
            out["carry"] = jax.tree.map(zero, kept)
        new_alive = alive & ~nts.last()
        return (new_state, keep_ts, new_pcarry, new_alive), out

    # Output buffers: the shapes of one step's output, with a leading T axis.
    shapes = jax.eval_shape(step, state, ts, pcarry, alive, step_keys[0])[1]
    bufs = jax.tree.map(lambda s: jnp.zeros((T,) + s.shape, s.dtype), shapes)

    def cond(c):
        t, _, _, _, alive, _ = c
        return (t < T) & jnp.any(alive)

    def body(c):
        t, state, ts, pcarry, alive, bufs = c
        (state, ts, pcarry, alive), out = step(state, ts, pcarry, alive, step_keys[t])
        bufs = jax.tree.map(lambda b, x: jax.lax.dynamic_update_index_in_dim(b, x, t, 0), bufs, out)
        return t + 1, state, ts, pcarry, alive, bufs

    _, _, final_ts, _, _, out = jax.lax.while_loop(
        cond, body, (jnp.int32(0), state, ts, pcarry, alive, bufs)
    )
    bm = lambda x: jnp.swapaxes(x, 0, 1)
    out = jax.tree.map(bm, out)
    mask = out["mask"]
    length = mask.sum(axis=1).astype(jnp.int32)
    # Observations: the reset step, then each step's result; entries after the
    # final one are zero padding.
    pad = jnp.arange(T + 1)[None, :] <= length[:, None]

    def with_first(first, rest):
        x = jnp.concatenate([first[:, None], rest], axis=1)
        return jnp.where(_bcast(pad, x, 2), x, jnp.zeros_like(x))

    return Episodes(
        obs=with_first(ts.obs, out["obs"]),
        global_state=with_first(ts.global_state, out["global_state"]),
        avail_actions=with_first(ts.avail_actions, out["avail_actions"]),
        actions=out["actions"],
        reward=out["reward"],
        done=out["done"],
        truncated=out["truncated"],
        mask=mask,
        episode_return=final_ts.episode_return,
        length=length,
        won=final_ts.won,
        carry=out.get("carry"),
    )


def _bcast(cond: jax.Array, x: jax.Array, ndim: int | None = None) -> jax.Array:
    ndim = cond.ndim if ndim is None else ndim
    return cond.reshape(cond.shape[:ndim] + (1,) * (x.ndim - ndim))


def _where_batch(cond: jax.Array, a: Any, b: Any) -> Any:
    """Per-environment select over pytrees whose leaves lead with [E]."""
    return jax.tree.map(lambda x, y: jnp.where(_bcast(cond, x), x, y), a, b)
