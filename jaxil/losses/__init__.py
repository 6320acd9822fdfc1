"""Pure loss functions (rlax style): arrays in, scalar or per-sample arrays out.

Each function checks its shapes with chex, states its equation and reference
in its docstring, and is tested against a float64 numpy reference.
"""

from jaxil.losses.adversarial import (
    agent_discriminator_loss,
    airl_logits,
    airl_shaped_reward,
    gail_reward,
    kl_penalized_reward,
)
from jaxil.losses.bc import agent_weighted_bc_loss, weighted_bc_loss
from jaxil.losses.dice import (
    dice_advantage,
    dice_nu_loss,
    dice_weights,
    nu_gradient_penalty,
    nu_penalty_points,
)
from jaxil.losses.discriminator import (
    agent_gradient_penalty,
    bounded_reward,
    discriminator_loss,
    gradient_penalty,
)
from jaxil.losses.distill import distillation_loss, generalized_jsd
from jaxil.losses.gae import gae
from jaxil.losses.ppo import (
    SurrogateStats,
    clipped_surrogate_loss,
    clipped_value_loss,
    normalize_advantages,
)
from jaxil.losses.preference import preference_loss
from jaxil.losses.sequence import (
    after_switch,
    agent_token_mask,
    leave_one_out_advantages,
    masked_sequence_nll,
    reinforce_loss,
)
from jaxil.losses.trajectory import discounted_score, log_ratio_score
from jaxil.losses.value import gumbel_value_loss, gumbel_weights

__all__ = [
    "SurrogateStats",
    "after_switch",
    "agent_discriminator_loss",
    "agent_gradient_penalty",
    "agent_token_mask",
    "agent_weighted_bc_loss",
    "airl_logits",
    "airl_shaped_reward",
    "bounded_reward",
    "clipped_surrogate_loss",
    "clipped_value_loss",
    "dice_advantage",
    "dice_nu_loss",
    "dice_weights",
    "discounted_score",
    "discriminator_loss",
    "distillation_loss",
    "gae",
    "gail_reward",
    "generalized_jsd",
    "gradient_penalty",
    "gumbel_value_loss",
    "gumbel_weights",
    "log_ratio_score",
    "masked_sequence_nll",
    "leave_one_out_advantages",
    "reinforce_loss",
    "kl_penalized_reward",
    "normalize_advantages",
    "nu_gradient_penalty",
    "nu_penalty_points",
    "preference_loss",
    "weighted_bc_loss",
]
