"""Learning language-model-style policies on token environments.

- [`jaxil.algorithms.lm.sft`][jaxil.algorithms.lm.sft]: supervised fine-tuning
  (behaviour cloning) of a
  [`jaxil.nn.transformer.TransformerPolicy`][jaxil.nn.transformer.TransformerPolicy]
  on whole token episodes, teacher-forced: the episode dataset
  ([`TokenEpisodes`][jaxil.algorithms.lm.sft.TokenEpisodes]), demonstrations
  from a policy ([`collect_demos`][jaxil.algorithms.lm.sft.collect_demos]), the
  run engine's program ([`sft_program`][jaxil.algorithms.lm.sft.sft_program])
  and [`train_sft`][jaxil.algorithms.lm.sft.train_sft].
- [`jaxil.algorithms.lm.diagnostics`][jaxil.algorithms.lm.diagnostics]:
  per-turn covariate shift of a student
  ([`covariate_shift`][jaxil.algorithms.lm.diagnostics.covariate_shift]):
  next-token disagreement with the expert on its own histories against the
  expert's, and the MMD² of its hidden states, each with its floor.
- [`jaxil.algorithms.lm.reward`][jaxil.algorithms.lm.reward]: sequence reward
  models over token episodes
  ([`SequenceRewardModel`][jaxil.algorithms.lm.reward.SequenceRewardModel], a
  discriminator between two sources of episodes) and the analytic Init–SFT
  reward ([`analytic_reward`][jaxil.algorithms.lm.reward.analytic_reward]).
"""

from jaxil.algorithms.lm.diagnostics import (
    ShiftEpisodes,
    covariate_shift,
    covariate_shift_rows,
    disagreement_by_turn,
    feature_mmd2_by_turn,
    mmd2_by_turn,
    shift_episodes,
    shift_table,
    student_disagreement_by_turn,
    turn_bin_labels,
)
from jaxil.algorithms.lm.reward import (
    RewardEpisodes,
    SequenceRewardConfig,
    SequenceRewardModel,
    SequenceRewardState,
    analytic_reward,
    sequence_reward_loss,
    source_episodes,
)
from jaxil.algorithms.lm.sft import (
    SFTConfig,
    SFTState,
    TokenEpisodes,
    check_demos,
    collect_demos,
    from_episodes,
    make_student,
    score_demos,
    sft_identity,
    sft_loss,
    sft_program,
    train_sft,
)
from jaxil.algorithms.lm.task_check import TokenTaskReport, check_token_task

__all__ = [
    "RewardEpisodes",
    "SFTConfig",
    "SFTState",
    "SequenceRewardConfig",
    "SequenceRewardModel",
    "SequenceRewardState",
    "TokenTaskReport",
    "ShiftEpisodes",
    "TokenEpisodes",
    "analytic_reward",
    "check_demos",
    "check_token_task",
    "collect_demos",
    "covariate_shift",
    "covariate_shift_rows",
    "disagreement_by_turn",
    "feature_mmd2_by_turn",
    "from_episodes",
    "make_student",
    "mmd2_by_turn",
    "score_demos",
    "sequence_reward_loss",
    "sft_identity",
    "sft_loss",
    "sft_program",
    "shift_episodes",
    "shift_table",
    "source_episodes",
    "student_disagreement_by_turn",
    "train_sft",
    "turn_bin_labels",
]
