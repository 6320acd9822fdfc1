"""Rollouts where the student and the expert share the controls.

[`mixed_policy`][jaxil.algorithms.interactive.rollout.mixed_policy] is an
[`envs.policies.Policy`][jaxil.envs.policies.Policy] that runs BOTH policies at
every step — the student on its own carry, the expert on its carry (so at the
switch the expert inherits the history it keeps, e.g. the SMAX heuristic's
targets) — and plays the expert's joint action when

    t ≥ k_e  (OEC switch, drawn per episode at reset)   or   u_t < β  (DAgger coin per step).

Its carry records, per step, the expert's label, the student's choice and who
acted; [`envs.run_episodes`][jaxil.envs.rollout.run_episodes] with
`record_carry=True` returns them as `Episodes.carry`
([`MixedStep`][jaxil.algorithms.interactive.rollout.MixedStep]).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from jaxil import envs
from jaxil.envs.core import MultiAgentEnv
from jaxil.envs.policies import Policy, as_policy
from jaxil.algorithms.interactive.schedule import sample_switch


class MixedStep(NamedTuple):
    """Per step (leaves `[E, T, ...]` in `Episodes.carry`)."""

    t: jax.Array  # step index
    switch: jax.Array  # the episode's k
    student_carry: Any
    expert_carry: Any
    label: jax.Array  # the expert's action [N(, d)]
    student_action: jax.Array  # the student's action [N(, d)]
    expert_acted: jax.Array  # bool: the expert's action was played


class SwitchRule(NamedTuple):
    """Who acts: `kind, lo, hi, p` of
    [`sample_switch`][jaxil.algorithms.interactive.schedule.sample_switch] and
    the DAgger expert probability `beta` (all may be traced)."""

    kind: Any
    lo: Any
    hi: Any
    p: Any
    beta: Any


def mixed_policy(student: Any, expert: Any, rule: SwitchRule, action_shape: tuple,
                 legalize: Optional[Callable] = None) -> Policy:
    """The shared-control policy; its params are `(student_params, expert_params)`.

    `legalize(actions, avail)` (the environment's,
    [`MultiAgentEnv.legalize`][jaxil.envs.core.MultiAgentEnv.legalize]) maps
    both proposals onto the actions the environment would execute, so that a
    label is always a legal action: a scripted expert may propose a move for a
    dead SMAX unit, whose only legal action is the no-op, and a label the
    student's masked policy cannot take has log-probability −inf.
    """
    s, x = as_policy(student), as_policy(expert)
    legal = legalize if legalize is not None else (lambda a, avail: a)

    def init(key, n):
        ks, kx, kk = jax.random.split(key, 3)
        zeros = jnp.zeros((n,) + tuple(action_shape[1:]), action_dtype(action_shape))
        return MixedStep(t=jnp.int32(0), switch=sample_switch(kk, rule.kind, rule.lo, rule.hi, rule.p),
                         student_carry=s.init(ks, n), expert_carry=x.init(kx, n),
                         label=zeros, student_action=zeros, expert_acted=jnp.bool_(False))

    def act(params, obs, avail, key, c: MixedStep):
        ks, kx, kc = jax.random.split(key, 3)
        a_s, cs = s.act(params[0], obs, avail, ks, c.student_carry)
        a_x, cx = x.act(params[1], obs, avail, kx, c.expert_carry)
        a_x = legal(a_x, avail).astype(a_x.dtype)
        a_s = legal(a_s, avail).astype(a_x.dtype)
        coin = jax.random.uniform(kc) < jnp.asarray(rule.beta, jnp.float32)
        expert_now = (c.t >= c.switch) | coin
        a = jnp.where(expert_now, a_x, a_s)
        return a, MixedStep(c.t + 1, c.switch, cs, cx, a_x, a_s, expert_now)

    return Policy(init=init, act=act)


def action_dtype(action_shape: tuple):
    """int32 for `[N]` (discrete) actions, float32 for `[N, d]` boxes."""
    return jnp.int32 if len(action_shape) == 1 else jnp.float32


def mixed_episodes(env: MultiAgentEnv, student: Any, expert: Any, student_params: Any,
                   expert_params: Any, rule: SwitchRule, key: jax.Array, num_episodes: int):
    """One shared-control episode per environment: `envs.Episodes` whose
    `carry` is a [`MixedStep`][jaxil.algorithms.interactive.rollout.MixedStep]
    (`[E, T, ...]`)."""
    spec = env.spec
    shape = (spec.num_agents,) + spec.action.shape
    pol = mixed_policy(student, expert, rule, shape, env.legalize)
    return envs.run_episodes(env, pol, (student_params, expert_params), key, num_episodes,
                             record_carry=True)
