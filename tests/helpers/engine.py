"""A small pure program for the run engine's tests: each run's state is a
vector that every update moves by a key-drawn step; its evaluation is the
state's mean."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxil.runs import engine
from jaxil.runs.updates import fused_updates


@struct.dataclass
class Toy:
    x: jax.Array  # [R, 3]
    key: jax.Array  # [R, 2]


def one_update(s: Toy, key):
    step = jax.random.normal(key, s.x.shape)
    new = s.replace(x=s.x + step)
    return new, {"loss": jnp.sum(new.x ** 2)}


def make_program(runs=2, chunks=6, eval_every=2, k=3, nan_at=None, **kw) -> engine.Program:
    """``nan_at``: the chunk whose metrics turn NaN (the guard's test)."""

    def chunk_one(s, c):
        s, m, h = fused_updates(one_update, s, k, params=lambda t: t.x)
        if nan_at is not None:
            m = {"loss": jnp.where(c == nan_at, jnp.nan, m["loss"])}
            h = h._replace(first_bad=jnp.where(c == nan_at, 0, h.first_bad),
                           at_bad={"loss": m["loss"]})
        return s, m, h

    chunk = jax.jit(jax.vmap(chunk_one, in_axes=(0, None)))

    def init():
        keys = jnp.stack([jax.random.PRNGKey(s) for s in range(runs)])
        return Toy(x=jnp.zeros((runs, 3)), key=keys)

    return engine.Program(
        name="toy", step_key="update", num_chunks=chunks, steps_per_chunk=k, step_unit=k,
        eval_every=eval_every, run_ids=[dict(run=i, seed=i) for i in range(runs)],
        run_labels=[f"seed {i}" for i in range(runs)], init=init,
        chunk=lambda s, c: chunk(s, jnp.int32(c)),
        evaluate=lambda s, c: {"eval_return": jnp.mean(s.x, axis=-1),
                               "eval_win_rate": jnp.zeros(runs)},
        summarize=lambda rows: {"last": max(r["update"] for r in rows)}, **kw)
