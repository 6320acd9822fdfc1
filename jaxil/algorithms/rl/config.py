"""The hyper-parameters of an IPPO/MAPPO teacher run
([`PPOConfig`][jaxil.algorithms.rl.config.PPOConfig])."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from jaxil.nn.nets import ACTIVATIONS

ALGOS = ("ippo", "mappo")


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Hyper-parameters of an IPPO/MAPPO run (hashable; a static argument).

    Budget: every PPO update consumes `num_envs * num_steps` environment
    steps; updates are grouped into chunks of `updates_per_chunk` (the unit of
    logging and checkpointing). The run has
    `num_chunks = total_timesteps // (num_envs * num_steps * updates_per_chunk)`
    chunks, so `total_timesteps` is rounded down to whole chunks.

    Attributes:
      algo: `"ippo"` (per-agent critic on the agent's observation) or
        `"mappo"` (centralised critic on the global state).
      total_timesteps: environment steps (one step = all agents act once).
      num_envs: parallel environments.
      num_steps: rollout length per update.
      update_epochs: passes over each rollout.
      num_minibatches: minibatches per epoch (splits the `num_envs*num_steps`
        joint transitions; the agents of one transition stay together).
      lr: Adam learning rate of actor and critic.
      anneal_lr: decay the learning rate linearly to 0 over the run.
      gamma, gae_lambda: discount and GAE λ, each in [0, 1].
      clip_eps: PPO ratio clip (also used for value clipping).
      ent_coef, vf_coef: entropy bonus and value-loss weights.
      max_grad_norm: global gradient-norm clip (per network).
      hidden_sizes: MLP torso widths of actor and critic.
      activation: `"relu"` or `"tanh"`.
      reward_scale: multiplies the team reward before GAE (MPE returns are
        large and negative; scaling keeps the value targets O(1)).
      normalize_advantages: per-minibatch advantage normalisation.
      log_std_init: initial log standard deviation of the Gaussian head.
      normalize_obs: standardise observations (actor) and critic inputs
        by running per-feature statistics, clipped to ±10, updated after
        each update's epochs with that update's rollout (the MuJoCo
        recipes of PureJaxRL, brax and CleanRL). The actor's statistics
        are part of its parameters, so a saved teacher acts on raw
        observations.
      updates_per_chunk: PPO updates fused into one `update_chunk` call.
    """

    algo: str = "mappo"
    total_timesteps: int = 10_000_000
    num_envs: int = 128
    num_steps: int = 128
    update_epochs: int = 4
    num_minibatches: int = 4
    lr: float = 2e-3
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden_sizes: tuple[int, ...] = (128, 128)
    activation: str = "relu"
    reward_scale: float = 1.0
    normalize_advantages: bool = True
    log_std_init: float = -0.5
    normalize_obs: bool = False
    updates_per_chunk: int = 10

    def __post_init__(self):
        def fail(name, msg):
            raise ValueError(f"PPOConfig.{name}={getattr(self, name)!r}: {msg}")

        def number(v) -> bool:  # a real number; True/False are not learning rates
            return (isinstance(v, (int, float, np.integer, np.floating))
                    and not isinstance(v, (bool, np.bool_)) and math.isfinite(v))

        if self.algo not in ALGOS:
            fail("algo", f"must be one of {ALGOS}")
        if self.activation not in ACTIVATIONS:
            fail("activation", f"must be one of {tuple(ACTIVATIONS)}")
        for name in ("total_timesteps", "num_envs", "num_steps", "update_epochs",
                     "num_minibatches", "updates_per_chunk"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                fail(name, "must be an integer >= 1")
        for name in ("anneal_lr", "normalize_advantages", "normalize_obs"):
            if not isinstance(getattr(self, name), bool):
                fail(name, "must be True or False")
        for name in ("lr", "clip_eps", "max_grad_norm", "reward_scale"):
            v = getattr(self, name)
            if not (number(v) and v > 0):
                fail(name, "must be a finite number > 0")
        for name in ("ent_coef", "vf_coef"):
            v = getattr(self, name)
            if not (number(v) and v >= 0):
                fail(name, "must be a finite number >= 0")
        for name in ("gamma", "gae_lambda"):
            v = getattr(self, name)
            if not (number(v) and 0 <= v <= 1):
                fail(name, "must be a number in [0, 1]")
        if not number(self.log_std_init):
            fail("log_std_init", "must be a finite number")
        hs = self.hidden_sizes
        if not isinstance(hs, (tuple, list)) or not all(
            isinstance(h, (int, np.integer)) and not isinstance(h, bool) and h > 0 for h in hs
        ) or len(hs) == 0:
            fail("hidden_sizes", "must be a non-empty sequence of positive integers")
        object.__setattr__(self, "hidden_sizes", tuple(int(h) for h in hs))
        batch = self.num_envs * self.num_steps
        if batch % self.num_minibatches:
            fail(
                "num_minibatches",
                f"must divide num_envs * num_steps = {batch} "
                f"(e.g. num_minibatches in {_divisors(batch)[:8]})",
            )
        per_chunk = batch * self.updates_per_chunk
        if self.total_timesteps < per_chunk:
            fail(
                "total_timesteps",
                f"is less than one chunk (num_envs * num_steps * updates_per_chunk = "
                f"{per_chunk} environment steps); raise it or lower updates_per_chunk",
            )

    @property
    def batch_size(self) -> int:
        """Environment steps per PPO update."""
        return self.num_envs * self.num_steps

    @property
    def num_chunks(self) -> int:
        return self.total_timesteps // (self.batch_size * self.updates_per_chunk)

    @property
    def num_updates(self) -> int:
        """PPO updates actually run (whole chunks)."""
        return self.num_chunks * self.updates_per_chunk

    @property
    def env_steps(self) -> int:
        """Environment steps actually run (`total_timesteps` rounded down)."""
        return self.num_updates * self.batch_size

    def replace(self, **kw) -> "PPOConfig":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["hidden_sizes"] = list(self.hidden_sizes)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "PPOConfig":
        known = {f.name for f in dataclasses.fields(PPOConfig)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown PPOConfig fields {sorted(unknown)}; known: {sorted(known)}")
        return PPOConfig(**d)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
