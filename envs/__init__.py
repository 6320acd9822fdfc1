"""Vectorized JAX multi-agent environments behind one interface."""

from envs.core import (
    ContinuousActions,
    DiscreteActions,
    EnvSpec,
    EnvState,
    MultiAgentEnv,
    TimeStep,
    check_actions,
)
from envs.registry import list_envs as list  # noqa: A001 - mirrors gym/jumanji naming
from envs.registry import make, register
from envs.wrappers import ActionNoise, AutoReset
from envs.rollout import Trajectory, rollout, run_episodes

__all__ = [
    "ActionNoise",
    "AutoReset",
    "ContinuousActions",
    "DiscreteActions",
    "EnvSpec",
    "EnvState",
    "MultiAgentEnv",
    "TimeStep",
    "Trajectory",
    "check_actions",
    "list",
    "make",
    "register",
    "rollout",
    "run_episodes",
]
