"""Decentralised policy shared by every learner: a local network per agent
(one batched call for all agents) and a masked-categorical or tanh-Gaussian
head. Each agent sees only its own observation (and, in shared mode, its id).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from envs.core import EnvSpec
from jaxil import distributions as D
from jaxil.nets import LocalMLP

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


class PolicyNet:
    """``log_prob``/``sample``/``mode`` over ``obs [..., N, O]``.

    Discrete: logits ``[..., N, A]`` masked by ``avail``. Continuous: mean and
    log-std ``[..., N, d]``, tanh-squashed into the action box.
    """

    def __init__(self, spec: EnvSpec, hidden: tuple[int, ...], shared: bool):
        self.spec = spec
        out = spec.num_actions if spec.discrete else 2 * spec.action.dim
        self.net = LocalMLP(out_dim=out, num_agents=spec.num_agents, hidden=hidden, shared=shared)

    def init(self, key: jax.Array) -> Any:
        obs = jnp.zeros((self.spec.num_agents, self.spec.obs_dim), jnp.float32)
        return self.net.init(key, obs)

    def _split(self, out):
        d = self.spec.action.dim
        mean, log_std = out[..., :d], out[..., d:]
        return mean, jnp.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)

    def log_prob(self, params, obs, avail, actions) -> jax.Array:
        """``[..., N]`` log-probabilities of ``actions``."""
        out = self.net.apply(params, obs)
        if self.spec.discrete:
            return D.categorical_log_prob(out, avail, actions)
        mean, log_std = self._split(out)
        a = self.spec.action
        return D.tanh_gaussian_log_prob(mean, log_std, actions, a.low, a.high)

    def act(self, params, obs, avail, key, deterministic: bool = False) -> jax.Array:
        out = self.net.apply(params, obs)
        if self.spec.discrete:
            if deterministic:
                return D.categorical_mode(out, avail)
            return D.categorical_sample(key, out, avail)
        mean, log_std = self._split(out)
        a = self.spec.action
        if deterministic:
            return D.tanh_gaussian_mode(mean, a.low, a.high)
        return D.tanh_gaussian_sample(key, mean, log_std, a.low, a.high)[0]

    def policy_fn(self, deterministic: bool = False):
        """A plain ``(params, obs, avail, key) -> actions`` for envs.run_episodes."""

        def fn(params, obs, avail, key):
            return self.act(params, obs, avail, key, deterministic)

        return fn

    def learner_fns(self):
        """``(act, policy_fn)`` of a learner whose params hold this network
        under ``params["policy"]``."""

        def act(params, obs, avail, key, deterministic=False):
            return self.act(params["policy"], obs, avail, key, deterministic)

        def policy_fn(deterministic=False):
            f = self.policy_fn(deterministic)
            return lambda params, obs, avail, key: f(params["policy"], obs, avail, key)

        return act, policy_fn


def encode_actions(spec: EnvSpec, actions: jax.Array) -> jax.Array:
    """Actions as network input: one-hot ``[..., N, A]`` or the raw box vector."""
    if spec.discrete:
        return jax.nn.one_hot(actions, spec.num_actions, dtype=jnp.float32)
    return jnp.asarray(actions, jnp.float32)
