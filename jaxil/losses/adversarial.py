"""Adversarial imitation (GAIL, AIRL) and the KL-penalised learned reward.

Pure functions of arrays; the learners in
[`jaxil.algorithms.irl.adversarial`][jaxil.algorithms.irl.adversarial] compose
them with the discriminator network and the PPO trainer.

Conventions. The discriminator D = σ(ℓ) is trained with label 1 on expert
samples and label 0 on the policy's (the logistic loss of
[`jaxil.losses.discriminator_loss`][jaxil.losses.discriminator.discriminator_loss],
here also per agent:
[`agent_discriminator_loss`][jaxil.losses.adversarial.agent_discriminator_loss]).

- GAIL (Ho & Ermon, 2016): ℓ(s, a) is a free function; the policy's reward is
  one of `GAIL_REWARDS` of ℓ ([`gail_reward`][jaxil.losses.adversarial.gail_reward]).
- AIRL (Fu, Luo & Levine, 2018): D(s, a, s') = exp f / (exp f + π(a|s)) with
  the reward-shaping form f = g(s, a) + γ h(s') − h(s), i.e. the logit is ℓ = f
  − log π(a|s) ([`airl_logits`][jaxil.losses.adversarial.airl_logits]), and the
  policy's reward is log D − log(1 − D) = ℓ = f − log π (entropy-regularised RL
  on f).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxil.losses.discriminator import discriminator_loss

# reward forms of gail_reward
GAIL_REWARDS = ("softplus", "logit", "log_d")


def gail_reward(logits: jax.Array, form: str = "softplus") -> jax.Array:
    """The policy's reward from the discriminator logit ℓ = log D − log(1 − D).

    - `"softplus"`: r = −log(1 − D) = softplus(ℓ) > 0 (GAIL as Ho & Ermon
      wrote it; positive, so it rewards surviving longer);
    - `"logit"`: r = log D − log(1 − D) = ℓ (AIRL's form; the AfD reward);
    - `"log_d"`: r = log D = −softplus(−ℓ) < 0 (a cost; rewards ending
      episodes early).

    Args:
      logits: discriminator logits, any shape (float).
      form: one of `GAIL_REWARDS`.

    Returns:
      Rewards, the shape of `logits`.
    """
    logits = jnp.asarray(logits)
    chex.assert_type(logits, float)
    if form == "softplus":
        return jax.nn.softplus(logits)
    if form == "logit":
        return logits
    if form == "log_d":
        return -jax.nn.softplus(-logits)
    raise ValueError(f"unknown GAIL reward form {form!r}; choose one of {GAIL_REWARDS}")


def airl_shaped_reward(g: jax.Array, h: jax.Array, h_next: jax.Array, last: jax.Array,
                       gamma: float) -> jax.Array:
    """AIRL's reward-shaping form

        f(s, a, s') = g(s, a) + γ (1 − last) h(s') − h(s)

    (`last`: the step ended the episode; h of the terminal successor is 0,
    the convention of the GAE here: time limits count as terminal).

    Args:
      g: `[...]` reward term g(s, a).
      h: `[...]` potential h(s).
      h_next: `[...]` potential h(s') of the next state.
      last: `[...]` bool (or 0/1).
      gamma: discount γ.

    Returns:
      `[...]` f.
    """
    g, h, h_next, last = map(jnp.asarray, (g, h, h_next, last))
    chex.assert_equal_shape([g, h, h_next, last])
    chex.assert_type([g, h, h_next], float)
    return g + gamma * (1.0 - last.astype(g.dtype)) * h_next - h


def airl_logits(g: jax.Array, h: jax.Array, h_next: jax.Array, last: jax.Array,
                log_pi: jax.Array, gamma: float) -> jax.Array:
    """AIRL's discriminator logit ℓ = f(s, a, s') − log π(a|s), i.e.
    D = exp f / (exp f + π(a|s)) (Fu et al., 2018, eq. 4).

    Multi-agent: `log_pi` is the joint log-probability Σ_i log π_i(a_i|o_i)
    (team discriminator) or one agent's (per-agent discriminators; then every
    argument carries the agent axis). `log_pi` enters as a constant: the
    discriminator step does not differentiate the policy (stop-gradient).

    Args:
      g, h, h_next, last, gamma: as in
        [`airl_shaped_reward`][jaxil.losses.adversarial.airl_shaped_reward].
      log_pi: `[...]` log π(a|s) under the current policy.

    Returns:
      `[...]` logits.
    """
    log_pi = jnp.asarray(log_pi)
    f = airl_shaped_reward(g, h, h_next, last, gamma)
    chex.assert_equal_shape([f, log_pi])
    return f - jax.lax.stop_gradient(log_pi)


def agent_discriminator_loss(expert_logits: jax.Array, policy_logits: jax.Array) -> jax.Array:
    """Per-agent discriminators: the logistic loss of each agent's own
    discriminator, summed over agents,

        L = Σ_i ( E_E[softplus(−ℓ_i)] + E_π[softplus(ℓ_i)] ).

    Args:
      expert_logits: `[B, N]` logits on expert samples.
      policy_logits: `[B2, N]` logits on policy samples.

    Returns:
      Scalar loss.
    """
    expert_logits, policy_logits = jnp.asarray(expert_logits), jnp.asarray(policy_logits)
    chex.assert_rank([expert_logits, policy_logits], 2)
    chex.assert_equal_shape_suffix([expert_logits, policy_logits], 1)
    per_agent = jax.vmap(discriminator_loss, in_axes=(1, 1))(expert_logits, policy_logits)
    return jnp.sum(per_agent)


def discriminator_accuracy(expert_logits: jax.Array, policy_logits: jax.Array) -> jax.Array:
    """Share of samples the discriminator classifies right (ℓ > 0 on expert
    samples, ℓ < 0 on the policy's), the two sources weighted equally."""
    expert_logits, policy_logits = jnp.asarray(expert_logits), jnp.asarray(policy_logits)
    return 0.5 * (jnp.mean(expert_logits > 0) + jnp.mean(policy_logits < 0))


def kl_penalized_reward(reward: jax.Array, log_pi: jax.Array, ref_log_pi: jax.Array,
                        coef: float) -> jax.Array:
    """The learned reward minus a KL penalty towards a reference policy:

        r̃ = r − β · (log π_θ(a|s) − log π_ref(a|s)),

    a one-sample estimate of β·KL(π_θ ‖ π_ref) per step (its expectation under
    π_θ is the KL), as in RL fine-tuning against a reward model. Joint
    policies factorise over agents, so for a team reward `[...]` the log-ratio
    is summed over agents; a per-agent reward `[..., N]` gets each agent's
    own log-ratio.

    Args:
      reward: `[...]` team rewards or `[..., N]` per-agent rewards.
      log_pi: `[..., N]` log π_θ(a_i|o_i) of the actions taken.
      ref_log_pi: `[..., N]` log π_ref(a_i|o_i) of the same actions.
      coef: β ≥ 0.

    Returns:
      Rewards, the shape of `reward`.
    """
    reward, log_pi, ref_log_pi = map(jnp.asarray, (reward, log_pi, ref_log_pi))
    chex.assert_equal_shape([log_pi, ref_log_pi])
    chex.assert_type([reward, log_pi, ref_log_pi], float)
    ratio = log_pi - ref_log_pi
    if reward.shape == ratio.shape:
        return reward - coef * ratio
    chex.assert_shape(reward, ratio.shape[:-1])
    return reward - coef * jnp.sum(ratio, axis=-1)
