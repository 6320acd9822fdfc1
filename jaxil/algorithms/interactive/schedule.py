"""Who acts when: DAgger's expert-probability schedule β_r and OEC's switch step k.

Both are pure functions of traced numbers, so a sweep over schedules or switch
distributions is a `vmap` axis like any other hyper-parameter; the kind of
schedule is an integer index into `BETA_SCHEDULES` / `SWITCHES`.

DAgger (Ross et al. 2011): at round `r` each environment step is acted by
the expert with probability β_r, by the student otherwise.

- `constant`:     β_r = β_0
- `linear`:       β_r = β_0 · max(0, 1 − r·c)      (c = `rate`)
- `exponential`:  β_r = β_0 · c^r

On-policy Expert Corrections (arXiv 2512.14895): per episode a switch step k;
the student acts for t < k, the expert from k on. For a range `[lo, hi]`
and u ~ U[0, 1):

- `none`:       k = ∞ (the expert never takes over)
- `uniform`:    k = lo + ⌊u·(hi − lo + 1)⌋, P(k) = 1/(hi − lo + 1)
- `early`:      k = lo + ⌊(1 − √u)·(hi − lo + 1)⌋, density falling linearly to hi
- `late`:       k = lo + ⌊√u·(hi − lo + 1)⌋, density rising linearly to hi
- `geometric`:  k = lo + G, G ~ Geometric(p) failures before the first
  success (P(G = g) = (1 − p)^g · p), unbounded above
- `fixed`:      k = lo
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

BETA_SCHEDULES = ("constant", "linear", "exponential")
SWITCHES = ("none", "uniform", "early", "late", "geometric", "fixed")
NEVER = 2**30  # a switch step no episode reaches


def expert_probability(round_index, beta0, kind, rate) -> jax.Array:
    """β_r of the DAgger schedule `BETA_SCHEDULES[kind]` at round `r`
    (float32 scalar in [0, β_0]); every argument may be traced."""
    r = jnp.asarray(round_index, jnp.float32)
    beta0 = jnp.asarray(beta0, jnp.float32)
    rate = jnp.asarray(rate, jnp.float32)
    options = jnp.stack([
        beta0,
        beta0 * jnp.clip(1.0 - r * rate, 0.0, 1.0),
        beta0 * rate ** r,
    ])
    return options[jnp.asarray(kind, jnp.int32)]


def sample_switch(key: jax.Array, kind, lo, hi, p) -> jax.Array:
    """One switch step k (int32 scalar) from `SWITCHES[kind]` over
    `[lo, hi]` (`p`: the geometric success probability)."""
    lo = jnp.asarray(lo, jnp.int32)
    hi = jnp.maximum(jnp.asarray(hi, jnp.int32), lo)
    width = (hi - lo + 1).astype(jnp.float32)
    u = jax.random.uniform(key, (), jnp.float32)
    span = lambda f: jnp.clip(lo + jnp.floor(f * width).astype(jnp.int32), lo, hi)
    p = jnp.clip(jnp.asarray(p, jnp.float32), 1e-6, 1.0)
    # G = ⌊log(1 − u) / log(1 − p)⌋ (inverse CDF); p = 1 gives G = 0.
    g = jnp.where(p >= 1.0, 0.0, jnp.floor(jnp.log1p(-u) / jnp.log1p(-jnp.minimum(p, 1 - 1e-7))))
    geometric = lo + jnp.minimum(g, NEVER - 1).astype(jnp.int32)
    options = jnp.stack([
        jnp.int32(NEVER),
        span(u),
        span(1.0 - jnp.sqrt(u)),
        span(jnp.sqrt(u)),
        jnp.minimum(geometric, NEVER - 1),
        lo,
    ])
    return options[jnp.asarray(kind, jnp.int32)]
