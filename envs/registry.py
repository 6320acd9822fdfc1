"""One registry of string ids: ``envs.make("smax:3m")``, ``envs.list()``.

An id is ``family:name``. Each family module registers a factory per id; the
factory takes keyword overrides (``envs.make("jumanji:LevelBasedForaging-v0",
num_agents=3)``).
"""

from __future__ import annotations

import difflib
import importlib
from typing import Callable

from .core import MultiAgentEnv

_FACTORIES: dict[str, Callable[..., MultiAgentEnv]] = {}
# Sibling modules that register their families when imported.
_FAMILY_MODULES = (".smax", ".mpe", ".jumanji", ".mabrax", ".tokens")
_loaded = False


def register(env_id: str, factory: Callable[..., MultiAgentEnv]) -> None:
    if ":" not in env_id:
        raise ValueError(f"env id {env_id!r} must look like 'family:name'")
    _FACTORIES[env_id] = factory


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for mod in _FAMILY_MODULES:
            importlib.import_module(mod, __package__)


def list_envs() -> list[str]:
    """All registered ids, sorted."""
    _load()
    return sorted(_FACTORIES)


def make(env_id: str, **kwargs) -> MultiAgentEnv:
    """Build an environment from its id; keyword arguments override defaults."""
    _load()
    if env_id not in _FACTORIES:
        close = difflib.get_close_matches(env_id, list(_FACTORIES), n=5, cutoff=0.4)
        if not close:  # match on the part after the family too
            name = env_id.split(":")[-1].lower()
            close = [k for k in _FACTORIES if name and name in k.lower()][:5]
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise KeyError(
            f"unknown environment id {env_id!r}.{hint} "
            f"See envs.list() for all {len(_FACTORIES)} ids."
        )
    return _FACTORIES[env_id](**kwargs)
