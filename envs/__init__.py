"""Vectorized JAX multi-agent environments behind one interface."""

from .core import (
    ContinuousActions,
    DiscreteActions,
    EnvSpec,
    EnvState,
    MultiAgentEnv,
    TimeStep,
    check_actions,
)
from .registry import list_envs as list  # noqa: A001 - mirrors gym/jumanji naming
from .registry import make, register
from .wrappers import ActionNoise, AutoReset, StandardizeObservations
from .rollout import Episodes, Trajectory, episode_summary, rollout, run_episodes
from .token_tasks import register_token_task, token_expert

__all__ = [
    "ActionNoise",
    "StandardizeObservations",
    "AutoReset",
    "ContinuousActions",
    "DiscreteActions",
    "EnvSpec",
    "EnvState",
    "Episodes",
    "MultiAgentEnv",
    "TimeStep",
    "Trajectory",
    "check_actions",
    "episode_summary",
    "list",
    "make",
    "register",
    "register_token_task",
    "rollout",
    "run_episodes",
    "token_expert",
]
