"""Which scripted expert drives which environment.

The experts live beside their adapters
([`envs.smax.heuristic_policy`][jaxil.envs.smax.heuristic_policy],
[`envs.mpe.spread_expert`][jaxil.envs.mpe.spread_expert],
[`envs.jumanji.lbf_expert`][jaxil.envs.jumanji.lbf_expert], the token tasks'
[`envs.token_repair.repair_expert`][jaxil.envs.token_repair.repair_expert],
[`envs.token_arith.arith_expert`][jaxil.envs.token_arith.arith_expert] and
[`envs.token_exchange.exchange_expert`][jaxil.envs.token_exchange.exchange_expert]);
this module only dispatches on the id. The adapters are imported when asked
for, so that importing this module does not load every environment family (and
the adapters, which import [`envs.policies`][jaxil.envs.policies], never import
this module back).
"""

from __future__ import annotations

from typing import Any, Optional

from .core import MultiAgentEnv
from .smax import heuristic_policy
from .mpe import spread_expert
from .jumanji import lbf_expert
from . import tokens as _tokens  # noqa: F401 - registers the shipped token tasks' experts
from .token_tasks import has_token_expert, token_expert


def has_scripted_expert(env_id: str) -> bool:
    """Whether [`scripted_expert`][jaxil.envs.experts.scripted_expert] knows
    `env_id` (without building it)."""
    return env_id.startswith(("smax:", "mpe:simple_spread")) or (
        env_id == "jumanji:LevelBasedForaging-v0") or has_token_expert(env_id)


def scripted_expert(env: MultiAgentEnv) -> Optional[tuple[Any, str, str]]:
    """`(policy, source name, description)` of the scripted expert for
    `env`, or None when there is none.

    The source name and description are recorded in datasets. Raises
    [`envs.policies.ScriptedExpertUnavailable`][jaxil.envs.policies.ScriptedExpertUnavailable]
    when the environment has a scripted expert but not for its configuration.
    """
    eid = env.spec.env_id
    if eid.startswith("smax:"):

        return (heuristic_policy(env), "smax-heuristic",
                "JaxMARL's scripted SMAX micro-management policy driving the allies")
    if eid.startswith("mpe:simple_spread"):

        return (spread_expert(env), "spread-assign-pd",
                "min-total-distance landmark assignment from the own observation, "
                "dead-beat velocity control (envs.mpe.spread_expert)")
    if eid == "jumanji:LevelBasedForaging-v0":

        return (lbf_expert(env), "lbf-bfs-coop",
                "team targets the nearest liftable food, BFS to distinct adjacent "
                "cells, load together (envs.jumanji.lbf_expert)")
    if has_token_expert(eid):
        return token_expert(env)
    return None
