"""The one environment interface every jaxil environment implements.

Agents live on a stacked leading axis. An environment is a Python object that
holds only static configuration; `reset` and `step` are pure functions of
their array arguments, so they can be jitted, vmapped and scanned:

```python
state, ts = env.reset(key)            # ts.obs: [N, obs_dim]
state, ts = env.step(state, actions)  # actions: [N] int32 or [N, dim] float32
```

`step` does not reset: once an episode has ended, wrap the environment in
[`envs.wrappers.AutoReset`][jaxil.envs.wrappers.AutoReset] (or reset it yourself).

Adapters subclass [`MultiAgentEnv`][jaxil.envs.core.MultiAgentEnv] and
implement `_reset` and `_step` on their upstream state; the base class owns the
parts that must be the same everywhere: random keys, episode statistics, dtype
normalisation and the handling of illegal actions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional, Union

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


@dataclasses.dataclass(frozen=True)
class DiscreteActions:
    """`num_actions` choices per agent; `noop_action` replaces illegal ones.

    If the environment has no no-op (`noop_action=None`) an illegal action is
    replaced by the agent's first available action.
    """

    num_actions: int
    noop_action: Optional[int] = None

    @property
    def discrete(self) -> bool:
        return True

    @property
    def shape(self) -> tuple[int, ...]:
        return ()


@dataclasses.dataclass(frozen=True)
class ContinuousActions:
    """A box `[low, high]^dim` per agent; actions are clipped into it."""

    dim: int
    low: float = -1.0
    high: float = 1.0

    @property
    def discrete(self) -> bool:
        return False

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.dim,)


ActionSpace = Union[DiscreteActions, ContinuousActions]


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Static description of a multi-agent environment.

    Attributes:
      env_id: registry id, e.g. `"smax:3m"`.
      num_agents: N, the number of controlled agents.
      obs_dim: length of each agent's observation vector.
      state_dim: length of the global state vector.
      action: the per-agent action space.
      max_steps: episode time limit (an episode ends at or before it).
      has_win: whether the task defines a win / success outcome.
    """

    env_id: str
    num_agents: int
    obs_dim: int
    state_dim: int
    action: ActionSpace
    max_steps: int
    has_win: bool = False

    @property
    def discrete(self) -> bool:
        return self.action.discrete

    @property
    def num_actions(self) -> int:
        """Width of `avail_actions`: A for discrete, 0 for continuous."""
        return self.action.num_actions if self.action.discrete else 0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["action"]["kind"] = "discrete" if self.discrete else "continuous"
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "EnvSpec":
        d = dict(d)
        action = dict(d.pop("action"))
        kind = action.pop("kind")
        space = DiscreteActions(**action) if kind == "discrete" else ContinuousActions(**action)
        return EnvSpec(action=space, **d)


@struct.dataclass
class TimeStep:
    """What every `reset`/`step` returns.

    Attributes:
      obs: [N, obs_dim] float32 local observations.
      global_state: [state_dim] float32 centralised state.
      avail_actions: [N, A] bool legal-action mask (A = 0 for continuous).
      reward: [] float32 team reward of the transition into this step.
      done: [] bool, the episode terminated (no bootstrapping past it).
      truncated: [] bool, the episode was cut by the time limit.
      episode_return: [] float32 sum of rewards so far in this episode.
      episode_length: [] int32 steps taken so far in this episode.
      won: [] bool, the episode ended in a win/success (False while running).
    """

    obs: jax.Array
    global_state: jax.Array
    avail_actions: jax.Array
    reward: jax.Array
    done: jax.Array
    truncated: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    won: jax.Array

    def last(self) -> jax.Array:
        """True where the episode ended (terminated or truncated)."""
        return jnp.logical_or(self.done, self.truncated)


@struct.dataclass
class EnvState:
    """Adapter-independent wrapper of an upstream state."""

    inner: Any
    key: jax.Array
    avail_actions: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    ended: jax.Array


class Step(NamedTuple):
    """What an adapter's `_step`/`_reset` returns (before normalisation)."""

    inner: Any
    obs: jax.Array
    global_state: jax.Array
    avail_actions: jax.Array
    reward: jax.Array = 0.0
    done: jax.Array = False
    truncated: jax.Array = False
    won: jax.Array = False


def _strong_type(x: Any) -> Any:
    """`x` with a strong dtype (a weakly typed array gets its own dtype)."""
    return jnp.asarray(x, dtype=x.dtype) if getattr(x, "weak_type", False) else x


class MultiAgentEnv:
    """Base class of every adapter. Subclasses set `self.spec` and implement
    `_reset(key) -> Step` and `_step(key, inner, actions) -> Step`.

    `actions` handed to `_step` are already legal: for discrete spaces an
    int32 `[N]` whose every entry is allowed by the last `avail_actions`
    (illegal or out-of-range entries were replaced by `noop_action`, or by
    the first legal action when the space has no no-op); for continuous
    spaces a float32 `[N, dim]` clipped to the box, non-finite entries
    replaced by the box centre.
    """

    spec: EnvSpec
    #: Whether `_step` consumes its `key`. Adapters whose upstream step is
    #: deterministic given the state set this to False, and `step` skips
    #: the per-step key split (a measurable share of a cheap env step).
    stochastic_step: bool = True
    #: Whether every discrete action is always legal (`avail_actions` all
    #: True, e.g. MPE); `legalize` then only checks the range.
    all_actions_available: bool = False
    #: Whether the adapter implements `_observe(inner)`: observation, global
    #: state and legal actions as a pure function of the upstream state.
    #: `envs.AutoReset` then picks between the stepped and the reset
    #: state first and observes the one it keeps, instead of observing both
    #: and picking (which is what the upstream auto-resets do).
    observes_state: bool = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec.env_id!r})"

    # -- to implement -------------------------------------------------------
    def _reset(self, key: jax.Array) -> Step:
        raise NotImplementedError  # pragma: no cover - abstract

    def _step(self, key: jax.Array, inner: Any, actions: jax.Array) -> Step:
        raise NotImplementedError  # pragma: no cover - abstract

    def _observe(self, inner: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
        """`(obs, global_state, avail_actions)` of an upstream state; only
        called when `observes_state` is set."""
        raise TypeError(f"{type(self).__name__} sets no observes_state and has no _observe")

    # -- the interface --------------------------------------------------------
    def reset(self, key: jax.Array) -> tuple[EnvState, TimeStep]:
        key, reset_key = jax.random.split(key)
        out = self._reset(reset_key)
        ts = self._timestep(out, jnp.float32(0.0), jnp.int32(0))
        state = EnvState(
            # weak types from upstream resets (SMAX's enemy-policy state) would
            # make step's output types differ from its input's: a jitted step
            # in a Python loop compiled twice
            inner=jax.tree.map(_strong_type, out.inner),
            key=key,
            avail_actions=self._kept_avail(ts.avail_actions),
            episode_return=ts.episode_return,
            episode_length=ts.episode_length,
            ended=jnp.bool_(False),
        )
        return state, ts

    def step(self, state: EnvState, actions: jax.Array) -> tuple[EnvState, TimeStep]:
        actions = self.legalize(actions, state.avail_actions)
        if self.stochastic_step:
            key, step_key = jax.random.split(state.key)
        else:
            key = step_key = state.key
        out = self._step(step_key, state.inner, actions)
        reward = jnp.asarray(out.reward, jnp.float32)
        ts = self._timestep(
            out, state.episode_return + reward, state.episode_length + 1
        )
        new_state = EnvState(
            inner=out.inner,
            key=key,
            avail_actions=self._kept_avail(ts.avail_actions),
            episode_return=ts.episode_return,
            episode_length=ts.episode_length,
            ended=ts.last(),
        )
        return new_state, ts

    def _kept_avail(self, avail: jax.Array) -> jax.Array:
        """What `EnvState` keeps of the legal-action mask for the next
        `legalize`: nothing (`[N, 0]`) when every action is always legal."""
        return avail[:, :0] if self.all_actions_available else avail

    def legalize(self, actions: jax.Array, avail_actions: jax.Array) -> jax.Array:
        """Map any action array onto a legal one (see the class docstring)."""
        spec = self.spec
        n = spec.num_agents
        space = spec.action
        if space.discrete:
            chex.assert_shape(actions, (n,))
            a = jnp.asarray(actions)
            if jnp.issubdtype(a.dtype, jnp.floating):
                a = jnp.where(jnp.isfinite(a), a, -1)
            a = a.astype(jnp.int32)
            in_range = (a >= 0) & (a < space.num_actions)
            safe = jnp.clip(a, 0, space.num_actions - 1)
            legal = in_range
            if not self.all_actions_available:
                legal &= jnp.take_along_axis(avail_actions, safe[:, None], axis=-1)[:, 0]
            if space.noop_action is not None or self.all_actions_available:
                fallback = jnp.full((n,), space.noop_action or 0, jnp.int32)
            else:
                fallback = jnp.argmax(avail_actions, axis=-1).astype(jnp.int32)
            return jnp.where(legal, a, fallback)
        chex.assert_shape(actions, (n, space.dim))
        a = jnp.asarray(actions, jnp.float32)
        centre = 0.5 * (space.low + space.high)
        a = jnp.where(jnp.isfinite(a), a, centre)
        return jnp.clip(a, space.low, space.high)

    def observation(self, obs, global_state, avail_actions) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The `TimeStep` dtypes and shapes of an adapter's observation:
        float32 obs and state, a bool mask (`[N, 0]` for continuous actions)."""
        spec = self.spec
        if spec.discrete:
            avail = jnp.asarray(avail_actions, jnp.bool_)
        else:
            avail = jnp.zeros((spec.num_agents, 0), jnp.bool_)
        return jnp.asarray(obs, jnp.float32), jnp.asarray(global_state, jnp.float32), avail

    def _timestep(self, out: Step, episode_return, episode_length) -> TimeStep:
        done = jnp.asarray(out.done, jnp.bool_)
        truncated = jnp.logical_and(jnp.asarray(out.truncated, jnp.bool_), ~done)
        obs, global_state, avail = self.observation(out.obs, out.global_state, out.avail_actions)
        return TimeStep(
            obs=obs,
            global_state=global_state,
            avail_actions=avail,
            reward=jnp.asarray(out.reward, jnp.float32),
            done=done,
            truncated=truncated,
            episode_return=jnp.asarray(episode_return, jnp.float32),
            episode_length=jnp.asarray(episode_length, jnp.int32),
            won=jnp.logical_and(jnp.asarray(out.won, jnp.bool_), done | truncated),
        )


def check_actions(spec: EnvSpec, actions: Any, avail_actions: Any = None) -> None:
    """Eagerly validate a batch of actions `[..., N]` / `[..., N, dim]`.

    Raises `ValueError` naming the problem; meant for data pipelines and user
    input (inside jit, `MultiAgentEnv.legalize` maps illegal actions instead).
    """
    a = np.asarray(actions)
    n = spec.num_agents
    if spec.discrete:
        if a.ndim < 1 or a.shape[-1] != n:
            raise ValueError(
                f"actions have shape {a.shape} but {spec.env_id} has {n} agents: "
                f"expected [..., {n}] integer actions"
            )
        if not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"discrete actions must be integers, got dtype {a.dtype}")
        bad = (a < 0) | (a >= spec.num_actions)
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"action {int(a[idx])} at index {idx} is outside [0, {spec.num_actions})"
            )
        if avail_actions is not None:
            av = np.asarray(avail_actions).astype(bool)
            ok = np.take_along_axis(av, a[..., None].astype(np.int64), -1)[..., 0]
            if not ok.all():
                idx = tuple(int(i) for i in np.argwhere(~ok)[0])
                raise ValueError(
                    f"action {int(a[idx])} at index {idx} is not allowed by avail_actions"
                )
    else:
        d = spec.action.dim
        if a.ndim < 2 or a.shape[-2:] != (n, d):
            raise ValueError(
                f"actions have shape {a.shape} but {spec.env_id} expects [..., {n}, {d}]"
            )
        if not np.isfinite(a).all():
            raise ValueError("continuous actions contain NaN or inf")
        lo, hi = spec.action.low, spec.action.high
        if (a < lo - 1e-6).any() or (a > hi + 1e-6).any():
            raise ValueError(f"continuous actions fall outside the box [{lo}, {hi}]")
