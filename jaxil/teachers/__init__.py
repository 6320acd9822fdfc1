"""Teachers: IPPO / MAPPO policies trained to produce demonstrations.

- [`jaxil.algorithms.rl.config`][jaxil.algorithms.rl.config]:
  [`PPOConfig`][jaxil.algorithms.rl.config.PPOConfig].
- [`jaxil.algorithms.rl.ppo`][jaxil.algorithms.rl.ppo]: the pure training
  program (`make_ppo`, `make_train`); the losses live in
  [`jaxil.losses`][jaxil.losses] (`gae`, `clipped_surrogate_loss`,
  `clipped_value_loss`), the networks in [`jaxil.nn.policy`][jaxil.nn.policy]
  and [`jaxil.nn.nets`][jaxil.nn.nets].
- [`jaxil.teachers.train`][jaxil.teachers.train]: the teacher program and
  `train_teacher` (chunks, checkpoints, evaluations and resume, run by
  [`jaxil.runs.engine.run`][jaxil.runs.engine.run]).
- [`jaxil.teachers.rundir`][jaxil.teachers.rundir]: the teacher directory as
  the engine writes it.
- [`jaxil.teachers.io`][jaxil.teachers.io]: run directories, `load_teacher` and the
  teachers shipped with jaxil.
- [`jaxil.teachers.presets`][jaxil.teachers.presets]: per-environment presets
  and the command line (`jaxil teach --env smax:3m --out
  runs/teachers/smax_3m`).
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
