"""Token rollouts in which an expert takes over from a transformer student.

[`takeover_policy`][jaxil.algorithms.lm.takeover.takeover_policy] is an
[`envs.policies.Policy`][jaxil.envs.policies.Policy] over a token environment
that runs BOTH the student (a
[`jaxil.nn.transformer.TransformerPolicy`][jaxil.nn.transformer.TransformerPolicy],
its KV cache as carry) and the expert (e.g. the task's scripted expert, which
reads the privileged columns and so continues from any state: it inherits the
token history) at every step, and plays the expert's tokens when

    turn ≥ k_e                      (OEC: the switch turn, drawn per episode at reset)
 or coin_turn < β (DAgger: one coin per turn, so a turn is one agent's) or
 H_student > τ once (entropy gate: sticky from the first token whose
                                     entropy exceeds the threshold τ, when τ ≥ 0)

`turn` counts the turns ended so far (any agent's `<eot>`,
[`jaxil.algorithms.lm.turns.turn_index`][jaxil.algorithms.lm.turns.turn_index]),
so the OEC switch and the DAgger coins fall at turn boundaries; the gate may
fire inside a turn (the expert then completes the student's partial command).
`k_e` comes from
[`jaxil.algorithms.interactive.schedule.sample_switch`][jaxil.algorithms.interactive.schedule.sample_switch]
in units of TURNS.

The student's tokens are sampled from its masked categorical (exploration on
its own histories); its entropy is that of the speaking agents' legal tokens.
[`takeover_episodes`][jaxil.algorithms.lm.takeover.takeover_episodes] records
per step only the small
[`TakeoverStep`][jaxil.algorithms.lm.takeover.TakeoverStep] (never the KV
caches).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxil.envs.core import MultiAgentEnv
from jaxil.envs.policies import Policy, as_policy
from jaxil.envs.rollout import Episodes, run_episodes
from jaxil.envs.tokens import TokenSpecials, token_specials
from jaxil.algorithms.interactive.schedule import sample_switch
from jaxil.nn import distributions as D
from jaxil.nn.transformer import TransformerPolicy


class TakeoverRule(NamedTuple):
    """Who acts (all fields may be traced): the switch `kind, lo, hi, p` of
    [`sample_switch`][jaxil.algorithms.interactive.schedule.sample_switch] (in
    turns), the DAgger expert probability per turn `beta`, and the entropy gate
    `gate` (nats; `< 0`: off)."""

    kind: Any
    lo: Any
    hi: Any
    p: Any
    beta: Any
    gate: Any


class TakeoverStep(NamedTuple):
    """What a step records (leaves `[E, T, ...]` in `Episodes.carry`)."""

    turn: jax.Array  # turns ended before this step
    switch: jax.Array  # the episode's switch turn k
    label: jax.Array  # [N] the expert's token
    student_action: jax.Array  # [N] the student's sampled token
    entropy: jax.Array  # [N] the student's entropy over the legal tokens
    expert_acted: jax.Array  # the expert's tokens were played


class _Carry(NamedTuple):
    turn: jax.Array
    switch: jax.Array
    coin: jax.Array  # the current turn is the expert's (DAgger)
    gated: jax.Array  # the entropy gate has fired
    student: Any
    expert: Any
    record: TakeoverStep


def takeover_policy(student: TransformerPolicy, expert: Any, rule: TakeoverRule,
                    specials: TokenSpecials) -> Policy:
    """The shared-control policy; its params are `(student_params,
    expert_params)`. Per-step records are in the carry's `record`
    ([`recorded`][jaxil.algorithms.lm.takeover.recorded]). `specials`: the
    environment's `<eot>` / `<wait>`
    ([token_specials][jaxil.envs.tokens.token_specials])."""
    eot, wait = specials
    x = as_policy(expert)
    beta = lambda: jnp.asarray(rule.beta, jnp.float32)

    def init(key, n):
        kx, kk, kc = jax.random.split(key, 3)
        zeros = jnp.zeros((n,), jnp.int32)
        rec = TakeoverStep(jnp.int32(0), jnp.int32(0), zeros, zeros, jnp.zeros((n,), jnp.float32),
                           jnp.bool_(False))
        return _Carry(turn=jnp.int32(0),
                      switch=sample_switch(kk, rule.kind, rule.lo, rule.hi, rule.p),
                      coin=jax.random.uniform(kc) < beta(), gated=jnp.bool_(False),
                      student=student.init_carry(key, n), expert=x.init(kx, n), record=rec)

    def act(params, obs, avail, key, c: _Carry):
        ks, kx, kc = jax.random.split(key, 3)
        logits, cs = student.step_logits(params[0], obs, c.student)
        a_s = D.categorical_sample(ks, logits, avail)
        entropy = D.categorical_entropy(logits, avail)
        a_x, cx = x.act(params[1], obs, avail, kx, c.expert)
        a_x = a_x.astype(jnp.int32)
        gate = jnp.asarray(rule.gate, jnp.float32)
        speaking = ~(avail[:, wait] & (jnp.sum(avail, axis=-1) == 1))
        gated = c.gated | ((gate >= 0) & jnp.any(speaking & (entropy > gate)))
        expert_now = (c.turn >= c.switch) | c.coin | gated
        a = jnp.where(expert_now, a_x, a_s)
        ended = jnp.any(a == eot)
        coin = jnp.where(ended, jax.random.uniform(kc) < beta(), c.coin)
        rec = TakeoverStep(c.turn, c.switch, a_x, a_s, entropy, expert_now)
        return a, _Carry(c.turn + ended.astype(jnp.int32), c.switch, coin, gated, cs, cx, rec)

    return Policy(init=init, act=act)


def recorded(carry: _Carry) -> TakeoverStep:
    """The part of a
    [`takeover_policy`][jaxil.algorithms.lm.takeover.takeover_policy] carry a
    rollout keeps."""
    return carry.record


def takeover_episodes(env: MultiAgentEnv, student: TransformerPolicy, expert: Any,
                      student_params: Any, expert_params: Any, rule: TakeoverRule,
                      key: jax.Array, num_episodes: int) -> Episodes:
    """One shared-control episode per environment:
    [`envs.Episodes`][jaxil.envs.rollout.Episodes] whose `carry` is a
    [`TakeoverStep`][jaxil.algorithms.lm.takeover.TakeoverStep]
    (`[E, T, ...]`)."""
    return run_episodes(env, takeover_policy(student, expert, rule, token_specials(env)),
                        (student_params, expert_params), key, num_episodes,
                        record_carry=recorded)
