"""One registry of string ids: `envs.make("smax:3m")`, `envs.list()`.

An id is `family:name`. Each family module registers a factory per id; the
factory takes keyword overrides (`envs.make("jumanji:LevelBasedForaging-v0",
num_agents=3)`).
"""

from __future__ import annotations

import difflib
import importlib
from typing import Callable

from .core import MultiAgentEnv

_FACTORIES: dict[str, Callable[..., MultiAgentEnv]] = {}
# Sibling modules that register their families when imported, by family. Only
# the family of the id asked for is imported (Jumanji's and JaxMARL's imports
# cost seconds each); listing the ids, or an unknown family, imports them all.
_FAMILY_MODULES = {"smax": ".smax", "mpe": ".mpe", "jumanji": ".jumanji", "mabrax": ".mabrax",
                   "tokens": ".tokens"}
_loaded: set[str] = set()


def register(env_id: str, factory: Callable[..., MultiAgentEnv]) -> None:
    if ":" not in env_id:
        raise ValueError(f"env id {env_id!r} must look like 'family:name'")
    _FACTORIES[env_id] = factory


def _load(family: str | None = None) -> None:
    """Import the module of `family` (every family's with `None` or an
    unknown family)."""
    names = [family] if family in _FAMILY_MODULES else list(_FAMILY_MODULES)
    for name in names:
        if name not in _loaded:
            importlib.import_module(_FAMILY_MODULES[name], __package__)
            _loaded.add(name)


def list_envs() -> list[str]:
    """All registered ids, sorted."""
    _load()
    return sorted(_FACTORIES)


def make(env_id: str, **kwargs) -> MultiAgentEnv:
    """Build an environment from its id; keyword arguments override defaults."""
    _load(env_id.split(":", 1)[0] if isinstance(env_id, str) else None)
    if env_id not in _FACTORIES:
        _load()  # the suggestions come from every family
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
