"""What every learner shares: its state, its data, optimisers and `update_n`.

A learner is a [`Learner`][jaxil.algorithms.offline.base.Learner] bundle of
pure functions (PureJaxRL/JAX-CORL shape):

```python
state = learner.init(key, hparams)          # LearnerState pytree
batch = learner.sample(key, data)           # on-device gather
state, metrics = learner.update(state, batch)
state, metrics = update_n(learner, state, data, k)   # K fused updates
step = jit_update_n(learner, k)             # the same, compiled, state donated
actions = learner.act(state.params, obs, avail, key, deterministic)
policy = learner.policy(deterministic)      # an envs.policies.Policy
```

Static structure (network sizes, modes) lives in the learner's frozen config;
the numbers a sweep varies (α, γ, β, learning rates) live in
`state.hparams` as arrays, so a grid of them is a `vmap` axis.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxil.data.sampling import (Transitions, flatten_transitions, sample_transitions_indexed,
                                 sample_where)
from jaxil.envs.policies import Policy
from jaxil.runs.updates import fused_updates, scan_updates


@struct.dataclass
class LearnerData:
    """On-device training data: all transitions (D_U) and, for learners that
    use them, the expert labels per transition (D_E = union[expert])."""

    union: Transitions
    expert: Optional[jax.Array] = None  # [K] bool

    @staticmethod
    def from_dataset(dataset, expert_flags=None) -> "LearnerData":
        trans = flatten_transitions(dataset, expert_flags)
        return LearnerData(union=trans.replace(expert=None), expert=trans.expert)


@struct.dataclass
class LearnerState:
    """What a learner's update carries: a pytree, so seeds and grid points
    stack along a leading axis.

    Attributes:
        params: the networks' parameters (e.g. `{"policy": ...}`).
        opt_state: the optimiser states, one per network.
        hparams: the traced hyper-parameters (the learner's HParams), one
            value per run when stacked.
        step: the number of updates done.
        key: the PRNG key the next update draws from.
    """

    params: Any
    opt_state: Any
    hparams: Any
    step: jax.Array
    key: jax.Array


class Learner(NamedTuple):
    """A learner: pure functions over a
    [`LearnerState`][jaxil.algorithms.offline.base.LearnerState], built by
    [`make_learner`][jaxil.algorithms.offline.make_learner].

    Nothing here holds state; jit or vmap the functions as you need, or hand
    the learner to [`train`][jaxil.algorithms.offline.train.train], which
    runs many seeds and grid points in one compiled program.

    Attributes:
        name: the learner's name (`"bc"`, `"dice"`, ...).
        config: its frozen static config (network sizes, batch size, ...).
        init: `init(key, hparams=None) -> LearnerState` (the default
            hyper-parameters when `hparams` is None).
        sample: `sample(key, data) -> batch`, a training batch drawn on the
            device from a [`LearnerData`][jaxil.algorithms.offline.base.LearnerData].
        update: `update(state, batch) -> (state, metrics)`, one gradient step.
        act: the actions of the learned policy for a batch of observations.
        default_hparams: `default_hparams() -> HParams`, the defaults.
        policy: `policy(deterministic) -> Policy` over the learner's
            parameters, for [`run_episodes`][jaxil.envs.rollout.run_episodes].
        weigh: DICE learners only: `weigh(params, hparams, union_batch) ->
            (discriminator logit, policy weights)` as their update computes
            them; None for the others.
    """

    name: str
    config: Any
    init: Callable[[jax.Array, Any], LearnerState]
    sample: Callable[[jax.Array, LearnerData], Any]
    update: Callable[[LearnerState, Any], tuple[LearnerState, dict]]
    act: Callable[..., jax.Array]
    default_hparams: Callable[[], Any]
    policy: Callable[[bool], Policy]  # policy(deterministic) over the learner params
    # DICE learners: (params, hparams, union batch) -> (discriminator logit,
    # policy weights) as their update computes them; None for the others.
    weigh: Optional[Callable[[Any, Any, Any], tuple[jax.Array, jax.Array]]] = None


class Range(NamedTuple):
    """The allowed values of one hyper-parameter: `lo`/`hi` with open or
    closed ends, and why (shown in the error)."""

    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False
    why: str = ""

    def __contains__(self, x: float) -> bool:  # NaN is in no range
        x = float(x)
        above = x > self.lo if self.lo_open else x >= self.lo
        below = x < self.hi if self.hi_open else x <= self.hi
        return above and below

    def __str__(self) -> str:
        lo = "(" if self.lo_open or self.lo == -math.inf else "["
        hi = ")" if self.hi_open or self.hi == math.inf else "]"
        return f"{lo}{self.lo:g}, {self.hi:g}{hi}"


POSITIVE = Range(0.0, lo_open=True, why="a learning rate")
NONNEGATIVE = Range(0.0, why="a weight")
DISCOUNT = Range(0.0, 1.0, hi_open=True, why="a discount")
PROBABILITY = Range(0.0, 1.0, why="a probability")


def check_hparams(learner: str, hparams: Any, where: str = "") -> None:
    """Raise a one-line ValueError for the first hyper-parameter of
    `hparams` (a learner's HParams) outside its class's `RANGES`."""
    ranges = getattr(type(hparams), "RANGES", {})
    for f in dataclasses.fields(hparams):
        r = ranges.get(f.name)
        if r is None:
            continue
        for v in np.atleast_1d(np.asarray(getattr(hparams, f.name), np.float64)):
            if v not in r:
                flag = "--" + f.name.replace("_", "-")
                raise ValueError(f"{flag} {v:g}{where}: {learner}'s {f.name} must be in {r}"
                                 + (f" ({r.why})" if r.why else ""))


def adam(max_grad_norm: float) -> optax.GradientTransformation:
    """Adam with global-norm clipping; the learning rate is injected so it can
    be a traced, per-seed array (`opt_state[1].hyperparams`)."""
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm),
        optax.inject_hyperparams(optax.adam)(learning_rate=1e-3),
    )


def init_opt(tx: optax.GradientTransformation, params: Any, lr: jax.Array) -> Any:
    """`tx.init(params)` for [`adam`][jaxil.algorithms.offline.base.adam], with
    its learning rate set to `lr`."""
    return with_learning_rate(tx.init(params), lr)


def learning_rate(opt_state: Any) -> jax.Array:
    """The learning rate an [`adam`][jaxil.algorithms.offline.base.adam] state
    steps with (a traced array, per run under `vmap`)."""
    return opt_state[1].hyperparams["learning_rate"]


def with_learning_rate(opt_state: Any, lr: jax.Array) -> Any:
    """An [`adam`][jaxil.algorithms.offline.base.adam] state that steps with
    learning rate `lr` from now on (the moments are kept); the one place that
    knows where optax's `inject_hyperparams` keeps it."""
    clip, adam_state = opt_state
    hyper = dict(adam_state.hyperparams, learning_rate=jnp.asarray(lr, jnp.float32))
    return (clip, adam_state._replace(hyperparams=hyper))


def apply_grads(tx, params: dict, grads: dict, opt_state: dict) -> tuple[dict, dict]:
    """One optimiser step per parameter group (each group has its own lr)."""
    new_params, new_opt = {}, {}
    for k in params:
        updates, new_opt[k] = tx.update(grads[k], opt_state[k], params[k])
        new_params[k] = optax.apply_updates(params[k], updates)
    return new_params, new_opt


def expert_and_union(key: jax.Array, data: LearnerData, batch_size: int,
                     with_index: bool = False):
    """A D_E batch (needs labels) and an independent D_U batch; with
    `with_index` also the D_U batch's indices into `data.union` (the
    batches are the same for the same key either way)."""
    if data.expert is None:
        raise ValueError(
            "this learner needs expert labels: build LearnerData with expert_flags "
            "(ground-truth `dataset.expert` or Phase-1 labels)"
        )
    ke, ku = jax.random.split(key)
    u, idx = sample_transitions_indexed(ku, data.union, batch_size)
    e = sample_where(ke, data.union, batch_size, data.expert)
    return (e, u, idx) if with_index else (e, u)


def _updates(learner: Learner, data: LearnerData, place_batch: Optional[Callable] = None):
    """One update of `learner` on a batch it samples from `data`, in the form
    [`jaxil.runs.updates.scan_updates`][jaxil.runs.updates.scan_updates] fuses.
    `place_batch` (e.g.
    [`jaxil.runs.sharding.constrain_batch`][jaxil.runs.sharding.constrain_batch])
    lays out each batch first."""

    def one(state: LearnerState, key: jax.Array):
        batch = learner.sample(key, data)
        if place_batch is not None:
            batch = place_batch(batch)
        return learner.update(state, batch)

    return one


def update_n(learner: Learner, state: LearnerState, data: LearnerData, k: int):
    """K updates fused in one `lax.scan`; batches are gathered on device.

    Returns the new state and the metrics of the last update (means over K
    would hide divergence). Jit with `learner` and `k` static, e.g.
    `jax.jit(update_n, static_argnums=(0, 3))`.
    """
    state, metrics = scan_updates(_updates(learner, data), state, k)
    return state, jax.tree.map(lambda m: m[-1], metrics)


def unalias(tree: Any) -> Any:
    """`tree` with every array that appears more than once replaced, after
    its first use, by a copy of its own.

    A learner's `init` puts the same array in two places (the target
    networks start as the online ones; a learning rate sits in the
    hyper-parameters and in the optimiser state). A jitted call that donates
    such a state fails ("Attempt to donate the same buffer twice"); after
    [`unalias`][jaxil.algorithms.offline.base.unalias] each leaf owns its buffer.
    """
    seen: set[int] = set()

    def own(x):
        if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer) or x.is_deleted():
            return x  # under a trace, XLA gives each output its own buffer anyway
        if id(x) in seen:
            return jnp.array(x, copy=True)
        seen.add(id(x))
        return x

    return jax.tree.map(own, tree)


def jit_update_n(learner: Learner, k: int = 1, *, donate: bool = True) -> Callable:
    """`step(state, data) -> (state, metrics)`:
    [`update_n`][jaxil.algorithms.offline.base.update_n] with K updates per
    call, compiled once, for a loop of your own.

    `donate` (default): the input state's buffers are donated, so XLA writes
    the new state in place instead of allocating a second one per call; the
    state passed in is deleted (use the returned one). The state is passed
    through [`unalias`][jaxil.algorithms.offline.base.unalias] first, so a
    freshly initialised state can be donated. On the CPU backend, also call
    [`jaxil.runs.hostmem.retain`][jaxil.runs.hostmem.retain] before the first
    computation: every call otherwise maps and zeroes its temporary buffer
    anew, the larger part of what one update per call costs over fused updates
    (`benchmarks/single_update.py`).
    """
    if k < 1:
        raise ValueError(f"k (updates per call) must be >= 1, got {k}")
    fn = jax.jit(lambda s, d: update_n(learner, s, d, k), donate_argnums=(0,) if donate else ())
    if not donate:
        return fn

    def step(state: LearnerState, data: LearnerData):
        return fn(unalias(state), data)

    step.lower = lambda state, data: fn.lower(state, data)  # for cost analysis and AOT
    return step


def update_n_checked(learner: Learner, state: LearnerState, data: LearnerData, k: int,
                     place_batch: Optional[Callable] = None):
    """[`update_n`][jaxil.algorithms.offline.base.update_n] plus the chunk's
    [`jaxil.runs.guard.Health`][jaxil.runs.guard.Health] (the first update with
    a non-finite metric, and whether the parameters stay finite):
    `(state, last metrics, health)`. `place_batch`: see `_updates`."""
    return fused_updates(_updates(learner, data, place_batch), state, k)
