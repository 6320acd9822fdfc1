"""Teachers: IPPO / MAPPO policies trained to produce demonstrations.

See :mod:`jaxil.teachers.ppo` for the training program and driver and
:mod:`jaxil.teachers.zoo` for per-environment presets and the command line
(``python -m jaxil.teachers.zoo --env smax:3m --out runs/teachers/smax_3m``).
"""

from jaxil.teachers.ppo import (
    PPO,
    Actor,
    Critic,
    PPOConfig,
    RunnerState,
    action_probs,
    checkpoint_chunks,
    evaluate,
    gae,
    list_teacher_checkpoints,
    load_teacher,
    make_actor,
    make_policy,
    make_ppo,
    make_train,
    masked_logits,
    train_teacher,
)

__all__ = [
    "PPO",
    "Actor",
    "Critic",
    "PPOConfig",
    "RunnerState",
    "action_probs",
    "checkpoint_chunks",
    "evaluate",
    "gae",
    "list_teacher_checkpoints",
    "load_teacher",
    "make_actor",
    "make_policy",
    "make_ppo",
    "make_train",
    "masked_logits",
    "train_teacher",
]
