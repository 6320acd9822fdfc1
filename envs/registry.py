"""One registry of string ids: `envs.make("smax:3m")`, `envs.list()`.

An id is `family:name`. Each family module registers a factory per id; the
factory takes keyword overrides (`envs.make("jumanji:LevelBasedForaging-v0",
num_agents=3)`).

Environments of other packages are found two ways: a `module:callable` id
(`envs.make("mypkg.tasks:make_nav")` imports `mypkg.tasks` and calls
`make_nav` with the overrides), and the entry points of the group
`jaxil.envs` (each names a module whose import registers its ids; they are
loaded when an id is not found, and when the ids are listed).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
from typing import Callable

from .core import MultiAgentEnv

_FACTORIES: dict[str, Callable[..., MultiAgentEnv]] = {}
# Sibling modules that register their families when imported, by family. Only
# the family of the id asked for is imported (Jumanji's and JaxMARL's imports
# cost seconds each); listing the ids, or an unknown family, imports them all.
_FAMILY_MODULES = {"smax": ".smax", "mpe": ".mpe", "jumanji": ".jumanji", "mabrax": ".mabrax",
                   "mamujoco": ".mamujoco", "tokens": ".tokens"}
_loaded: set[str] = set()
#: The entry-point group a package lists its environment modules under.
ENTRY_POINT_GROUP = "jaxil.envs"
_plugins_loaded = False


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


def _load_plugins() -> None:
    """Import the modules of the `jaxil.envs` entry points (once); each
    registers its ids when imported. A broken plugin is refused in one line
    that names it."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as e:
            raise ImportError(f"the {ENTRY_POINT_GROUP} entry point {ep.name} = {ep.value!r} "
                              f"fails to load ({type(e).__name__}: {e}); fix or uninstall the "
                              "package that declares it") from None


def _from_callable(env_id: str) -> Callable[..., MultiAgentEnv] | None:
    """The callable named by a `module:callable` id, or None when the part
    before the colon is not an importable module."""
    module, _, name = env_id.partition(":")
    if module in _FAMILY_MODULES or not module or not name:
        return None
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except (ImportError, ValueError):  # a parent package that does not exist
        return None
    mod = importlib.import_module(module)
    obj = mod
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise KeyError(f"environment id {env_id!r}: module {module} has no {name!r}")
    if not callable(obj):
        raise KeyError(f"environment id {env_id!r}: {name} in {module} is not callable; name a "
                       "function or class that builds the environment")
    return obj


def list_envs() -> list[str]:
    """All registered ids, sorted."""
    _load()
    _load_plugins()
    return sorted(_FACTORIES)


def make(env_id: str, **kwargs) -> MultiAgentEnv:
    """Build an environment from its id; keyword arguments override defaults."""
    _load(env_id.split(":", 1)[0] if isinstance(env_id, str) else None)
    if env_id not in _FACTORIES and isinstance(env_id, str) and ":" in env_id:
        _load_plugins()
        if env_id not in _FACTORIES:
            factory = _from_callable(env_id)
            if factory is not None:
                env = factory(**kwargs)
                if not isinstance(env, MultiAgentEnv):
                    raise ValueError(f"environment id {env_id!r}: the callable returned a "
                                     f"{type(env).__name__}, not an environment (a "
                                     "MultiAgentEnv such as a TokenEnv subclass)")
                return env
    if env_id not in _FACTORIES:
        _load()  # the suggestions come from every family
        close = difflib.get_close_matches(env_id, list(_FACTORIES), n=5, cutoff=0.4)
        if not close:  # match on the part after the family too
            name = env_id.split(":")[-1].lower()
            close = [k for k in _FACTORIES if name and name in k.lower()][:5]
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise KeyError(
            f"unknown environment id {env_id!r}.{hint} "
            f"See envs.list() for all {len(_FACTORIES)} ids; an environment of your own is "
            "found by a MODULE:CALLABLE id or a jaxil.envs entry point"
        )
    return _FACTORIES[env_id](**kwargs)
