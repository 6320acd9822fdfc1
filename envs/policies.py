"""Reference policies usable on every environment, and the policy protocol.

A policy acts for the N agents of ONE environment: `obs [N, O]`,
`avail [N, A]` (`[N, 0]` for continuous actions) and one PRNG key give
`actions` (`[N]` int32 or `[N, d]` float32). Everything that takes a
policy (rollouts, the dataset zoo, teachers, learners, the interactive and
IRL learners) takes either form:

- a plain function `policy(params, obs, avail, key) -> actions`
  (stateless), or
- a [`Policy`][jaxil.envs.policies.Policy], which also threads a carry
  (`init(key, N) -> carry`, reset by the rollout at every episode boundary):
  scripted state such as the SMAX heuristic's per-agent target, or a recurrent
  network's hidden state. Where a policy defines them,
  `log_prob(params, obs, avail, actions) -> [N]` and `entropy(params, obs,
  avail) -> [N]` score its per-agent action distribution (neural policies,
  [`jaxil.nn.policy.PolicyNet`][jaxil.nn.policy.PolicyNet]); scripted experts
  leave them `None`.

[`as_policy`][jaxil.envs.policies.as_policy] turns either form into a
[`Policy`][jaxil.envs.policies.Policy].
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from .core import EnvSpec


class ScriptedExpertUnavailable(ValueError):
    """A scripted expert exists for the environment but not for this
    configuration (e.g. LevelBasedForaging with a partial view)."""


class Policy(NamedTuple):
    """`init(key, num_agents) -> carry`;
    `act(params, obs, avail, key, carry) -> (actions, carry)`; where defined,
    `log_prob(params, obs, avail, actions) -> [N]` and
    `entropy(params, obs, avail) -> [N]` (`None` otherwise), and
    `reset(carry, done) -> carry`: the carry of a new episode where the
    scalar `done` is true, else `carry` (for an auto-resetting rollout; a
    policy with a large carry, such as a KV cache, resets only what a new
    episode reads instead of having the whole carry replaced by `init`'s;
    `None`: the rollout selects `init`'s carry)."""

    init: Callable[[jax.Array, int], Any]
    act: Callable[..., tuple[jax.Array, Any]]
    log_prob: Optional[Callable[..., jax.Array]] = None
    entropy: Optional[Callable[..., jax.Array]] = None
    reset: Optional[Callable[[Any, jax.Array], Any]] = None


def stateless_carry(key: jax.Array, num_agents: int) -> jax.Array:
    """The carry of a policy that keeps none (a scalar placeholder)."""
    return jnp.zeros((), jnp.int32)


def as_policy(policy: Any) -> Policy:
    """Wrap a plain `(params, obs, avail, key) -> actions` function."""
    if isinstance(policy, Policy):
        return policy
    if not callable(policy):
        raise TypeError(
            f"policy must be a function (params, obs, avail, key) -> actions or an "
            f"envs.policies.Policy, got {type(policy).__name__}"
        )

    def act(params, obs, avail, key, carry):
        return policy(params, obs, avail, key), carry

    return Policy(init=stateless_carry, act=act)


def uniform_available(key: jax.Array, avail: jax.Array) -> jax.Array:
    """One uniformly random available action per row of an `[..., A]` mask
    (int32 `[...]`). The one sampler of uniform legal actions in `envs`
    (scripted experts and benchmarks use it too); neural policies sample from
    [`jaxil.nn.distributions`][jaxil.nn.distributions]."""
    return jax.random.categorical(key, jnp.where(avail, 0.0, -jnp.inf), axis=-1).astype(jnp.int32)


def random_policy(spec: EnvSpec) -> Callable:
    """Uniform over each agent's available actions (or over the action box)."""
    n = spec.num_agents
    if spec.discrete:

        def act(params, obs, avail, key):
            return uniform_available(key, avail)

    else:
        space = spec.action

        def act(params, obs, avail, key):
            return jax.random.uniform(
                key, (n, space.dim), minval=space.low, maxval=space.high
            )

    return act


def epsilon_mixture(policy: Any, spec: EnvSpec, epsilon: float) -> Policy:
    """Each agent follows `policy` with prob 1-ε and acts randomly otherwise."""
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    base = as_policy(policy)
    rand = random_policy(spec)
    n = spec.num_agents

    def act(params, obs, avail, key, carry):
        k_base, k_rand, k_coin = jax.random.split(key, 3)
        a, carry = base.act(params, obs, avail, k_base, carry)
        r = rand(None, obs, avail, k_rand)
        explore = jax.random.uniform(k_coin, (n,)) < epsilon
        explore = explore.reshape((n,) + (1,) * (a.ndim - 1))
        return jnp.where(explore, r, a).astype(a.dtype), carry

    return Policy(init=base.init, act=act)
