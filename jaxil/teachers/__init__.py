"""Teachers: IPPO / MAPPO policies trained to produce demonstrations.

- :mod:`jaxil.algorithms.rl.config`: :class:`PPOConfig`.
- :mod:`jaxil.algorithms.rl.ppo`: the pure training program (``make_ppo``,
  ``make_train``); the losses live in :mod:`jaxil.losses` (``gae``,
  ``clipped_surrogate_loss``, ``clipped_value_loss``), the networks in
  :mod:`jaxil.nn.policy` and :mod:`jaxil.nn.nets`.
- :mod:`jaxil.teachers.train`: the teacher program and ``train_teacher``
  (chunks, checkpoints, evaluations and resume, run by
  :func:`jaxil.runs.engine.run`).
- :mod:`jaxil.teachers.rundir`: the teacher directory as the engine writes it.
- :mod:`jaxil.teachers.io`: run directories, ``load_teacher`` and the
  teachers shipped with jaxil.
- :mod:`jaxil.teachers.presets`: per-environment presets and the command line
  (``jaxil teach --env smax:3m --out runs/teachers/smax_3m``).
"""

from jaxil.algorithms.rl.config import PPOConfig
from jaxil.teachers.io import (
    list_teacher_checkpoints,
    load_teacher,
    ship_teacher,
    shipped_teachers,
)
from jaxil.algorithms.rl.ppo import PPO, RunnerState, make_actor, make_critic, make_policy, make_ppo, make_train
from jaxil.teachers.train import checkpoint_chunks, evaluate, train_teacher

__all__ = [
    "PPO",
    "PPOConfig",
    "RunnerState",
    "checkpoint_chunks",
    "evaluate",
    "list_teacher_checkpoints",
    "load_teacher",
    "make_actor",
    "make_critic",
    "make_policy",
    "make_ppo",
    "make_train",
    "ship_teacher",
    "shipped_teachers",
    "train_teacher",
]
