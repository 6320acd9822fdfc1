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

A task may register a second expert, `transcript_expert=`, whose tokens
follow from the agent's own context alone (see
[`envs.token_transcript`][jaxil.envs.token_transcript]); the scripted one may
read the privileged columns. `token_expert(env, "transcript")` finds it
(`EXPERT_KINDS` are the kinds).

The expert is `expert(env) -> policy`: given the environment, a
[Policy][jaxil.envs.policies.Policy] (or a plain
`policy(params, obs, avail, key) -> actions` function) over it. What it must
guarantee is in the docs page "Custom token tasks";
[check_token_task][jaxil.algorithms.lm.task_check.check_token_task] checks it.
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


#: The kinds of registered expert: `scripted` (may read the privileged
#: columns) and `transcript` (acts on the agent's own context only).
EXPERT_KINDS = ("scripted", "transcript")

_EXPERTS: dict[str, dict[str, TokenExpert]] = {}


def register_token_task(env_id: str, factory: Optional[Callable[..., MultiAgentEnv]] = None, *,
                        expert: Callable[[MultiAgentEnv], Any], source: Optional[str] = None,
                        description: str = "",
                        transcript_expert: Optional[Callable[[MultiAgentEnv], Any]] = None,
                        transcript_source: Optional[str] = None,
                        transcript_description: str = ""):
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
      transcript_expert: optionally `transcript_expert(env) -> policy`, an
        expert whose tokens are a function of the agent's own context only
        (the kind `transcript` of [token_expert][jaxil.envs.token_tasks.token_expert]).
      transcript_source: its name in datasets and runs (default: the
        id's name with `-transcript`).
      transcript_description: one sentence on what it does.

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
    if transcript_expert is not None and not callable(transcript_expert):
        raise ValueError(f"{env_id}: transcript_expert must be a callable expert(env) -> policy, "
                         f"got {type(transcript_expert).__name__}")
    name = env_id.split(':', 1)[1]
    entry = {"scripted": TokenExpert(expert, source or f"{name}-expert", description)}
    if transcript_expert is not None:
        entry["transcript"] = TokenExpert(transcript_expert, transcript_source
                                          or f"{name}-transcript", transcript_description)

    def add(f: Callable[..., MultiAgentEnv]) -> Callable[..., MultiAgentEnv]:
        if not callable(f):
            raise ValueError(f"{env_id}: factory must be callable (an env class or function)")
        register(env_id, f)
        _EXPERTS[env_id] = entry
        return f

    return add if factory is None else add(factory)


def has_token_expert(env_id: str, kind: str = "scripted") -> bool:
    """Whether an expert of `kind` (`"scripted"` or `"transcript"`) is
    registered for `env_id`."""
    return kind in _EXPERTS.get(env_id, {})


def token_expert(env: MultiAgentEnv, kind: str = "scripted") -> tuple[Any, str, str]:
    """`(policy, source name, description)` of the registered expert of `env`.

    Args:
      env: the token environment.
      kind: `"scripted"` (the task's expert, which may read the privileged
        columns) or `"transcript"` (the one that acts on the agent's own
        context only).

    Raises:
      ValueError: an unknown kind, or none of that kind is registered for
        `env.spec.env_id` (one line that says how to register one).
    """
    if kind not in EXPERT_KINDS:
        raise ValueError(f"expert kind {kind!r} is not one of {list(EXPERT_KINDS)}")
    eid = env.spec.env_id
    entry = _EXPERTS.get(eid, {}).get(kind)
    if entry is None:
        what, arg = ("", "expert") if kind == "scripted" else ("transcript ",
                                                               "transcript_expert")
        raise ValueError(
            f"{eid} has no {what}expert: register one with "
            f"jaxil.envs.register_token_task({eid!r}, factory, {arg}=make_expert) "
            "(make_expert(env) returns the expert policy)")
    return entry.make(env), entry.source, entry.description
