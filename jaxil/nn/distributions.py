"""Policy heads as pure functions: masked categorical and three box heads
(tanh-Gaussian, censored Gaussian, Beta).

Every function works on arrays with arbitrary leading dimensions (batch,
agents, time, ...); the last axis is the action axis (`A` choices for the
categorical, `d` dimensions for the box heads).

Masked categorical
    Unavailable actions get a large negative but *finite* logit, so their
    probability is exactly 0 in float32, no `inf - inf` can appear and
    gradients stay finite. If every action of a row is unavailable (e.g. a
    padded or dead agent with an all-False mask), all logits of that row are
    replaced by 0 and the distribution falls back to uniform
    over all `A` actions instead of producing NaNs.

Box tanh-Gaussian
    `u ~ N(mean, exp(log_std)^2)` and `a = loc + scale * tanh(u)` with
    `loc = (high + low) / 2` and `scale = (high - low) / 2`. The density
    of `a` on the box is, per dimension,

        log p(a) = log N(u; mean, std) - log(1 - tanh(u)^2) - log(scale),

    summed over the `d` dimensions (change of variables through the tanh and
    the affine map).

Box censored Gaussian ("clipped" Gaussian)
    `u ~ N(mean, std^2)` and `a = clip(u, low, high)`. Its law has a point
    mass on each bound, `P(a = low) = Φ((low − mean)/std)` and
    `P(a = high) = Φ((mean − high)/std)`, and the Gaussian density inside.
    The log-likelihood of `a` (with respect to Lebesgue measure inside plus
    a unit atom on each bound) is, per dimension, `log Φ((low − mean)/std)`
    on the lower bound, `log Φ((mean − high)/std)` on the upper one and
    `log N(a; mean, std)` in between (the Tobit likelihood). Data whose
    actions sit on the bounds (a scripted controller's clipped forces) get a
    finite likelihood that is maximised by a mean beyond the bound, not by a
    density that grows without limit as under the tanh-Gaussian.

Box Beta
    `y ~ Beta(α, β)` on `[0, 1]` and `a = low + (high − low)·y`:
    `log p(a) = (α−1) log y + (β−1) log(1−y) − log B(α, β) − log(high − low)`.
    A continuous density: actions on a bound are moved `eps` inside first.
"""

from __future__ import annotations

import math
from typing import Union

import chex
import jax
import jax.numpy as jnp
import numpy as np

ArrayLike = Union[jax.Array, np.ndarray, float]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def _mask_value(dtype) -> float:
    """A large negative finite logit for `dtype`.

    `-1e9` (exp underflows to exactly 0 against any sane logit) unless the
    dtype cannot represent it (float16), then half the dtype's minimum so that
    subtracting a log-normaliser cannot overflow to `-inf`.
    """
    return float(max(-1e9, float(jnp.finfo(dtype).min) / 2))


# --------------------------------------------------------------------------
# Masked categorical.
# --------------------------------------------------------------------------


def masked_logits(logits: jax.Array, avail: jax.Array) -> jax.Array:
    """Replaces the logits of unavailable actions by a large negative constant.

    `masked = where(avail, logits, -1e9)`. Softmax of the result is exactly
    0 on unavailable actions. If a row has no available action at all, every
    entry of the row becomes 0, so the distribution is uniform over all `A`
    actions (the documented fallback; never NaN). Gradients with respect to
    `logits` are zero on unavailable actions.

    Args:
      logits: `[..., A]` unnormalised log-probabilities (floating).
      avail: `[..., A]` availability mask (bool, or 0/1 numbers).

    Returns:
      `[..., A]` masked logits, same dtype as `logits`.
    """
    logits, avail = jnp.asarray(logits), jnp.asarray(avail)
    chex.assert_equal_shape([logits, avail])
    chex.assert_type(logits, float)
    avail = avail.astype(bool)
    masked = jnp.where(avail, logits, jnp.asarray(_mask_value(logits.dtype), logits.dtype))
    # All-unavailable row: zeros, i.e. uniform. (All -1e9 would also be uniform
    # under softmax, but Gumbel noise vanishes next to 1e9 in float32 and
    # sampling would always return action 0.)
    return jnp.where(jnp.any(avail, axis=-1, keepdims=True), masked, jnp.zeros_like(masked))


def categorical_log_probs(logits: jax.Array, avail: jax.Array) -> jax.Array:
    """Log-probabilities of all actions under the masked categorical.

    `log π(a) = masked_a - logsumexp(masked)`.

    Args:
      logits: `[..., A]`.
      avail: `[..., A]` bool.

    Returns:
      `[..., A]` normalised log-probabilities (a large negative finite
      number on unavailable actions).
    """
    return jax.nn.log_softmax(masked_logits(logits, avail), axis=-1)


def categorical_log_prob(logits: jax.Array, avail: jax.Array, actions: jax.Array) -> jax.Array:
    """Log-probability of the given actions under the masked categorical.

    `log π(a | ·) = masked_a - logsumexp_{a'}(masked_{a'})`.

    An unavailable action gets a large negative *finite* log-probability
    (about `-1e9`): a data bug shows up as a huge loss rather than as NaN.

    Args:
      logits: `[..., A]` logits.
      avail: `[..., A]` availability mask.
      actions: `[...]` integer action indices in `[0, A)`.

    Returns:
      `[...]` log-probabilities, dtype of `logits`.
    """
    logits, actions = jnp.asarray(logits), jnp.asarray(actions)
    chex.assert_equal_shape([logits, avail])
    chex.assert_equal_shape_prefix([logits, actions], actions.ndim)
    chex.assert_rank(logits, actions.ndim + 1)
    chex.assert_type(actions, int)
    log_p = categorical_log_probs(logits, avail)
    return jnp.take_along_axis(log_p, actions[..., None].astype(jnp.int32), axis=-1)[..., 0]


def categorical_sample(key: jax.Array, logits: jax.Array, avail: jax.Array) -> jax.Array:
    """Samples actions from the masked categorical.

    Unavailable actions are never drawn (their masked logit plus Gumbel noise
    cannot beat an available one), unless no action of the row is available,
    in which case the draw is uniform over all actions.

    Args:
      key: PRNG key.
      logits: `[..., A]`.
      avail: `[..., A]`.

    Returns:
      `[...]` int32 actions.
    """
    return jax.random.categorical(key, masked_logits(logits, avail), axis=-1).astype(jnp.int32)


def categorical_mode(logits: jax.Array, avail: jax.Array) -> jax.Array:
    """Most likely available action, `argmax_a masked_a`.

    Args:
      logits: `[..., A]`.
      avail: `[..., A]`.

    Returns:
      `[...]` int32 actions (action 0 for a row with nothing available).
    """
    return jnp.argmax(masked_logits(logits, avail), axis=-1).astype(jnp.int32)


def categorical_entropy(logits: jax.Array, avail: jax.Array) -> jax.Array:
    """Entropy of the masked categorical, `H = -Σ_a π(a) log π(a)`.

    Unavailable actions contribute exactly 0 (and no NaN gradient).

    Args:
      logits: `[..., A]`.
      avail: `[..., A]`.

    Returns:
      `[...]` entropies in nats (`log A` for an all-unavailable row).
    """
    masked = masked_logits(logits, avail)
    log_p = jax.nn.log_softmax(masked, axis=-1)
    p = jnp.exp(log_p)
    return -jnp.sum(jnp.where(p > 0, p * log_p, 0.0), axis=-1)


# --------------------------------------------------------------------------
# Helpers of the Gaussian heads.
# --------------------------------------------------------------------------


def _box(low: ArrayLike, high: ArrayLike, dtype) -> tuple[jax.Array, jax.Array]:
    low = jnp.asarray(low, dtype)
    high = jnp.asarray(high, dtype)
    return (high + low) / 2, (high - low) / 2


def _normal_log_prob(x: jax.Array, mean: jax.Array, log_std: jax.Array) -> jax.Array:
    z = (x - mean) * jnp.exp(-log_std)
    return -0.5 * z**2 - log_std - _LOG_SQRT_2PI


def _log1m_tanh_sq(u: jax.Array) -> jax.Array:
    """`log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))`, stable for all u."""
    return 2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u))


# --------------------------------------------------------------------------
# Diagonal Gaussian (the pre-squash variable of the tanh-Gaussian).
# --------------------------------------------------------------------------


def gaussian_sample(key: jax.Array, mean: jax.Array, log_std: jax.Array) -> jax.Array:
    """Reparameterised draw `u = mean + exp(log_std)·ε`, `ε ~ N(0, I)`.

    Args:
      key: PRNG key.
      mean: `[..., d]`.
      log_std: `[..., d]` (same shape as `mean`).

    Returns:
      `[..., d]` samples, differentiable in `mean` and `log_std`.
    """
    mean, log_std = jnp.asarray(mean), jnp.asarray(log_std)
    chex.assert_equal_shape([mean, log_std])
    chex.assert_type([mean, log_std], float)
    return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)


def gaussian_log_prob(mean: jax.Array, log_std: jax.Array, x: jax.Array) -> jax.Array:
    """Log-density of a diagonal Gaussian, summed over the last axis.

    `log N(x; μ, σ) = Σ_d [−½((x_d − μ_d)/σ_d)² − log σ_d − ½ log 2π]`.

    Args:
      mean, log_std, x: `[..., d]`.

    Returns:
      `[...]` log-densities.
    """
    mean, log_std, x = jnp.asarray(mean), jnp.asarray(log_std), jnp.asarray(x)
    chex.assert_equal_shape([mean, log_std, x])
    chex.assert_type([mean, log_std, x], float)
    return jnp.sum(_normal_log_prob(x, mean, log_std), axis=-1)


def gaussian_entropy(log_std: jax.Array) -> jax.Array:
    """Entropy of a diagonal Gaussian, `H = Σ_d [log σ_d + ½ log(2πe)]`.

    (The tanh-squashed Gaussian has no closed-form entropy; PPO uses this one
    of the pre-squash variable as its entropy bonus.)

    Args:
      log_std: `[..., d]`.

    Returns:
      `[...]` entropies in nats.
    """
    log_std = jnp.asarray(log_std)
    chex.assert_type(log_std, float)
    return jnp.sum(log_std + (_LOG_SQRT_2PI + 0.5), axis=-1)


def squash(u: jax.Array, low: ArrayLike = -1.0, high: ArrayLike = 1.0) -> jax.Array:
    """`a = loc + scale·tanh(u)` onto the box `[low, high]`.

    Args:
      u: `[..., d]` pre-squash values.
      low, high: bounds of the box, scalars or `[d]`.

    Returns:
      `[..., d]` actions in the box.
    """
    u = jnp.asarray(u)
    chex.assert_type(u, float)
    loc, scale = _box(low, high, u.dtype)
    return loc + scale * jnp.tanh(u)


# --------------------------------------------------------------------------
# Tanh-squashed Gaussian on a box.
# --------------------------------------------------------------------------


def tanh_gaussian_sample(
    key: jax.Array,
    mean: jax.Array,
    log_std: jax.Array,
    low: ArrayLike = -1.0,
    high: ArrayLike = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Reparameterised sample of a box tanh-Gaussian and its log-density.

    `u = mean + exp(log_std)·ε`, `ε ~ N(0, I)`; `a = loc + scale·tanh(u)`;

        log p(a) = Σ_d [log N(u_d; mean_d, std_d) − log(1 − tanh²u_d) − log scale_d]

    with `log(1 − tanh²u) = 2(log 2 − u − softplus(−2u))` evaluated from the
    pre-squash sample, so it stays exact even where `tanh(u)` rounds to ±1
    in float32 (`tanh_gaussian_log_prob` of such an action clips it first and
    returns a slightly different, finite number).

    Args:
      key: PRNG key.
      mean: `[..., d]` pre-squash mean.
      log_std: `[..., d]` pre-squash log standard deviation.
      low: lower bound of the box, scalar or `[d]`.
      high: upper bound of the box, scalar or `[d]`.

    Returns:
      `(actions [..., d], log_prob [...])`; differentiable in `mean` and
      `log_std`.
    """
    u = gaussian_sample(key, mean, log_std)
    _, scale = _box(low, high, u.dtype)
    log_det = jnp.sum(_log1m_tanh_sq(u) + jnp.log(scale), axis=-1)
    return squash(u, low, high), gaussian_log_prob(mean, log_std, u) - log_det


def tanh_gaussian_log_prob(
    mean: jax.Array,
    log_std: jax.Array,
    actions: jax.Array,
    low: ArrayLike = -1.0,
    high: ArrayLike = 1.0,
    eps: float = 1e-6,
) -> jax.Array:
    """Log-density of box-valued actions under the tanh-Gaussian.

    `y = clip((a − loc)/scale, −1 + eps, 1 − eps)`, `u = atanh(y)`;

        log p(a) = Σ_d [log N(u_d; mean_d, std_d) − log(1 − y_d²) − log scale_d]

    with `1 − y² = (1 − y)(1 + y)` to avoid cancellation near the bounds. The
    clip keeps actions on (or outside) the boundary finite; it changes the
    density only within `eps` of the bounds. Unlike the DemoDICE / O-MAPL
    code (`log(1 − a² + eps)`) no `eps` is added inside the log, so this is
    the exact density wherever the clip is inactive, and it includes the
    `−log scale` term of a box other than `[−1, 1]`.

    Args:
      mean: `[..., d]` pre-squash mean.
      log_std: `[..., d]` pre-squash log standard deviation.
      actions: `[..., d]` actions in `[low, high]`.
      low: lower bound, scalar or `[d]`.
      high: upper bound, scalar or `[d]`.
      eps: distance from ±1 at which squashed actions are clipped.

    Returns:
      `[...]` log-densities with respect to Lebesgue measure on the box.
    """
    mean, log_std, actions = jnp.asarray(mean), jnp.asarray(log_std), jnp.asarray(actions)
    chex.assert_equal_shape([mean, log_std, actions])
    chex.assert_type([mean, log_std, actions], float)
    loc, scale = _box(low, high, mean.dtype)
    y = jnp.clip((actions - loc) / scale, -1.0 + eps, 1.0 - eps)
    u = jnp.arctanh(y)
    log_det = jnp.log1p(-y) + jnp.log1p(y)
    log_prob = _normal_log_prob(u, mean, log_std) - log_det - jnp.log(scale)
    return jnp.sum(log_prob, axis=-1)


def tanh_gaussian_mode(mean: jax.Array, low: ArrayLike = -1.0, high: ArrayLike = 1.0) -> jax.Array:
    """Deterministic action `loc + scale·tanh(mean)` (squashed Gaussian mean).

    Args:
      mean: `[..., d]` pre-squash mean.
      low: lower bound, scalar or `[d]`.
      high: upper bound, scalar or `[d]`.

    Returns:
      `[..., d]` actions in the box.
    """
    return squash(mean, low, high)


# --------------------------------------------------------------------------
# Censored ("clipped") Gaussian on a box.
# --------------------------------------------------------------------------


def clip_to_box(u: jax.Array, low: ArrayLike = -1.0, high: ArrayLike = 1.0) -> jax.Array:
    """`a = clip(u, low, high)`: a pre-clip draw as a box action.

    Args:
      u: `[..., d]` pre-clip values.
      low, high: bounds of the box, scalars or `[d]`.

    Returns:
      `[..., d]` actions in the box.
    """
    u = jnp.asarray(u)
    chex.assert_type(u, float)
    return jnp.clip(u, jnp.asarray(low, u.dtype), jnp.asarray(high, u.dtype))


def censored_gaussian_sample(
    key: jax.Array,
    mean: jax.Array,
    log_std: jax.Array,
    low: ArrayLike = -1.0,
    high: ArrayLike = 1.0,
) -> jax.Array:
    """A draw `clip(mean + exp(log_std)·ε, low, high)`, `ε ~ N(0, I)`.

    Args:
      key: PRNG key.
      mean, log_std: `[..., d]` of the pre-clip Gaussian.
      low, high: bounds of the box, scalars or `[d]`.

    Returns:
      `[..., d]` actions in the box (on a bound with the probabilities of
      [`censored_gaussian_log_prob`][jaxil.nn.distributions.censored_gaussian_log_prob]).
    """
    return clip_to_box(gaussian_sample(key, mean, log_std), low, high)


def censored_gaussian_log_prob(
    mean: jax.Array,
    log_std: jax.Array,
    actions: jax.Array,
    low: ArrayLike = -1.0,
    high: ArrayLike = 1.0,
    tol: float = 1e-6,
) -> jax.Array:
    """Log-likelihood of box actions under `clip(N(mean, std²), low, high)`.

    Per dimension, with `z_lo = (low − mean)/std` and `z_hi = (mean − high)/std`:

        log p(a) = log Φ(z_lo)            if a ≤ low + tol·(high − low)
                 = log Φ(z_hi)            if a ≥ high − tol·(high − low)
                 = log N(a; mean, std)    otherwise,

    summed over the `d` dimensions; `log Φ` is `jax.scipy.special.log_ndtr`
    (accurate far into the tail, so a mean far inside the box still gives a
    finite, steep loss for an action on the bound). An action outside the box
    counts as on the nearer bound, as `clip` would have put it there.

    Args:
      mean: `[..., d]` pre-clip mean.
      log_std: `[..., d]` pre-clip log standard deviation.
      actions: `[..., d]` actions.
      low, high: bounds, scalars or `[d]`.
      tol: how close to a bound, as a fraction of the box width, counts as on it.

    Returns:
      `[...]` log-likelihoods (log-probabilities on the bounds, log-densities
      inside).
    """
    mean, log_std, actions = jnp.asarray(mean), jnp.asarray(log_std), jnp.asarray(actions)
    chex.assert_equal_shape([mean, log_std, actions])
    chex.assert_type([mean, log_std, actions], float)
    low = jnp.asarray(low, mean.dtype)
    high = jnp.asarray(high, mean.dtype)
    inv_std = jnp.exp(-log_std)
    width = tol * (high - low)
    at_low, at_high = actions <= low + width, actions >= high - width
    inside = _normal_log_prob(jnp.clip(actions, low, high), mean, log_std)
    lower = jax.scipy.special.log_ndtr((low - mean) * inv_std)
    upper = jax.scipy.special.log_ndtr((mean - high) * inv_std)
    return jnp.sum(jnp.where(at_low, lower, jnp.where(at_high, upper, inside)), axis=-1)


def censored_gaussian_mode(mean: jax.Array, low: ArrayLike = -1.0, high: ArrayLike = 1.0) -> jax.Array:
    """Deterministic action `clip(mean, low, high)` (the clipped Gaussian's median).

    Args:
      mean: `[..., d]` pre-clip mean.
      low, high: bounds, scalars or `[d]`.

    Returns:
      `[..., d]` actions in the box.
    """
    return clip_to_box(mean, low, high)


# --------------------------------------------------------------------------
# Beta on a box.
# --------------------------------------------------------------------------


def _beta_checks(alpha, beta, *rest):
    arrays = [jnp.asarray(x) for x in (alpha, beta) + rest]
    chex.assert_equal_shape(arrays)
    chex.assert_type(arrays, float)
    return arrays


def beta_log_prob(
    alpha: jax.Array,
    beta: jax.Array,
    actions: jax.Array,
    low: ArrayLike = 0.0,
    high: ArrayLike = 1.0,
    eps: float = 1e-6,
) -> jax.Array:
    """Log-density of box actions under `low + (high − low)·Beta(α, β)`.

    `y = clip((a − low)/(high − low), eps, 1 − eps)`;

        log p(a) = Σ_d [(α_d − 1) log y_d + (β_d − 1) log(1 − y_d)
                        − log B(α_d, β_d) − log(high_d − low_d)].

    The clip keeps actions on a bound finite (the density there is 0 or ∞);
    it changes the density only within `eps` of the bounds.

    Args:
      alpha, beta: `[..., d]` positive concentrations.
      actions: `[..., d]` actions in `[low, high]`.
      low, high: bounds, scalars or `[d]`.
      eps: distance from 0 and 1 at which `y` is clipped.

    Returns:
      `[...]` log-densities.
    """
    alpha, beta, actions = _beta_checks(alpha, beta, actions)
    low = jnp.asarray(low, alpha.dtype)
    width = jnp.asarray(high, alpha.dtype) - low
    y = jnp.clip((actions - low) / width, eps, 1.0 - eps)
    lp = ((alpha - 1.0) * jnp.log(y) + (beta - 1.0) * jnp.log1p(-y)
          - jax.scipy.special.betaln(alpha, beta) - jnp.log(width))
    return jnp.sum(lp, axis=-1)


def beta_sample(
    key: jax.Array,
    alpha: jax.Array,
    beta: jax.Array,
    low: ArrayLike = 0.0,
    high: ArrayLike = 1.0,
) -> jax.Array:
    """A draw `low + (high − low)·y`, `y ~ Beta(α, β)`, differentiable in
    `α` and `β` (JAX's implicit reparameterisation of the gamma draws).

    Args:
      key: PRNG key.
      alpha, beta: `[..., d]` positive concentrations.
      low, high: bounds, scalars or `[d]`.

    Returns:
      `[..., d]` actions in the box.
    """
    alpha, beta = _beta_checks(alpha, beta)
    y = jax.random.beta(key, alpha, beta, dtype=alpha.dtype)
    low = jnp.asarray(low, alpha.dtype)
    return low + (jnp.asarray(high, alpha.dtype) - low) * y


def beta_mode(alpha: jax.Array, beta: jax.Array, low: ArrayLike = 0.0,
              high: ArrayLike = 1.0) -> jax.Array:
    """Deterministic action: the most likely point of the Beta.

    `(α − 1)/(α + β − 2)` when both are ≥ 1 (the middle for α = β = 1); the
    lower bound when α < 1 ≤ β, the upper when β < 1 ≤ α; for a U-shaped
    Beta (both < 1) the bound with the smaller concentration, which holds
    more of the mass next to it.

    Args:
      alpha, beta: `[..., d]` positive concentrations.
      low, high: bounds, scalars or `[d]`.

    Returns:
      `[..., d]` actions in the box.
    """
    alpha, beta = _beta_checks(alpha, beta)
    denom = alpha + beta - 2.0
    interior = jnp.where(denom > 0, (alpha - 1.0) / jnp.where(denom > 0, denom, 1.0), 0.5)
    y = jnp.where(
        (alpha >= 1.0) & (beta >= 1.0), interior,
        jnp.where((alpha < 1.0) & (beta < 1.0), (alpha >= beta).astype(alpha.dtype),
                  (alpha >= 1.0).astype(alpha.dtype)))
    low = jnp.asarray(low, alpha.dtype)
    return low + (jnp.asarray(high, alpha.dtype) - low) * y


def beta_entropy(alpha: jax.Array, beta: jax.Array, low: ArrayLike = 0.0,
                 high: ArrayLike = 1.0) -> jax.Array:
    """Differential entropy of the box Beta, summed over the last axis:

        H = Σ_d [log B(α, β) − (α − 1)ψ(α) − (β − 1)ψ(β) + (α + β − 2)ψ(α + β)
                 + log(high − low)].

    Args:
      alpha, beta: `[..., d]` positive concentrations.
      low, high: bounds, scalars or `[d]`.

    Returns:
      `[...]` entropies in nats.
    """
    alpha, beta = _beta_checks(alpha, beta)
    dg = jax.scipy.special.digamma
    width = jnp.asarray(high, alpha.dtype) - jnp.asarray(low, alpha.dtype)
    h = (jax.scipy.special.betaln(alpha, beta) - (alpha - 1.0) * dg(alpha)
         - (beta - 1.0) * dg(beta) + (alpha + beta - 2.0) * dg(alpha + beta)
         + jnp.broadcast_to(jnp.log(width), alpha.shape))
    return jnp.sum(h, axis=-1)
