"""Token tasks and their experts: one registration, and how a process finds them.

A token task is a [TokenEnv][jaxil.envs.tokens.TokenEnv] (or any
environment that keeps the token contract) plus an expert that the
learners imitate and that takes over from their students.
[register_token_task][jaxil.envs.token_tasks.register_token_task] records
both under one id, e.g. `tokens:nav`:

```python
envs.register_token_task("tokens:nav", NavEnv, expert=nav_expert)
envs.make("tokens:nav", size=5)  # the environment
envs.token_expert(env)           # (policy, source name, description)
```

A fresh process (the `jaxil` command line) finds a task that is not
shipped in one of two ways:

- **A `module:callable` id**, e.g. `--env mypkg.tasks:make_nav`: the
  module is imported (its import may register the task's expert) and the
  callable, called with the task's knobs, builds the environment.
- **Entry points** of the group `jaxil.envs` in the user's package, e.g.
  in its `pyproject.toml`:

  ```toml
  [project.entry-points."jaxil.envs"]
  nav = "mypkg.tasks"
  ```

  An id no family knows loads every such entry point (importing the
  module, which registers its tasks) before it is refused.

The expert is `expert(env) -> policy`: given the environment, a
[Policy][jaxil.envs.policies.Policy] (or a plain
`policy(params, obs, avail, key) -> actions` function) over it. What it must guarantee is in the docs page "Custom
token tasks"; [check_token_task][jaxil.algorithms.lm.task_check.check_token_task]
checks it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from .core import MultiAgentEnv
from .registry import register


@dataclasses.dataclass(frozen=True)
class TokenExpert:
    """A registered expert of a token task.

    Attributes:
      make: `make(env) -> policy`, the expert of an environment built by the
        task's factory.
      source: the short name datasets and runs record (e.g.
        `"repair-test-edit"`).
      description: one sentence on what it does.
    """

    make: Callable[[MultiAgentEnv], Any]
    source: str
    description: str = ""


_EXPERTS: dict[str, TokenExpert] = {}


def register_token_task(env_id: str, factory: Optional[Callable[..., MultiAgentEnv]] = None, *,
                        expert: Callable[[MultiAgentEnv], Any], source: Optional[str] = None,
                        description: str = ""):
    """Register a token environment and its expert under one id.

    Args:
      env_id: `family:name`, e.g. `"tokens:nav"`; the environment built by
        `factory` must report it as `spec.env_id`.
      factory: `factory(**knobs) -> env` (a [TokenEnv][jaxil.envs.tokens.TokenEnv]
        subclass is one). Leave it out to use this as a class decorator.
      expert: `expert(env) -> policy`, the task's expert.
      source: the expert's name in datasets and runs (default: the id's
        name with `-expert`).
      description: one sentence on what the expert does.

    Returns:
      `factory` (or, without it, a decorator that registers and returns it).

    Raises:
      ValueError: a malformed id or an expert that is not callable.
    """
    if ":" not in env_id:
        raise ValueError(f"env id {env_id!r} must look like 'family:name' (e.g. 'tokens:nav')")
    if not callable(expert):
        raise ValueError(f"{env_id}: expert must be a callable expert(env) -> policy, got "
                         f"{type(expert).__name__}")
    entry = TokenExpert(expert, source or f"{env_id.split(':', 1)[1]}-expert", description)

    def add(f: Callable[..., MultiAgentEnv]) -> Callable[..., MultiAgentEnv]:
        if not callable(f):
            raise ValueError(f"{env_id}: factory must be callable (an env class or function)")
        register(env_id, f)
        _EXPERTS[env_id] = entry
        return f

    return add if factory is None else add(factory)


def has_token_expert(env_id: str) -> bool:
    """Whether an expert is registered for `env_id`."""
    return env_id in _EXPERTS


def token_expert(env: MultiAgentEnv) -> tuple[Any, str, str]:
    """`(policy, source name, description)` of the registered expert of `env`.

    Raises:
      ValueError: none is registered for `env.spec.env_id` (one line that
        says how to register one).
    """
    eid = env.spec.env_id
    entry = _EXPERTS.get(eid)
    if entry is None:
        raise ValueError(
            f"{eid} has no expert: register one with "
            f"jaxil.envs.register_token_task({eid!r}, factory, expert=make_expert) "
            "(make_expert(env) returns the expert policy)")
    return entry.make(env), entry.source, entry.description
