"""Learning language-model-style policies on token environments.

- :mod:`jaxil.algorithms.lm.sft`: supervised fine-tuning (behaviour cloning)
  of a :class:`jaxil.nn.transformer.TransformerPolicy` on whole token
  episodes, teacher-forced: the episode dataset (:class:`TokenEpisodes`),
  demonstrations from a policy (:func:`collect_demos`), the run engine's
  program (:func:`sft_program`) and :func:`train_sft`.
"""

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

__all__ = [
    "SFTConfig",
    "SFTState",
    "TokenEpisodes",
    "check_demos",
    "collect_demos",
    "from_episodes",
    "make_student",
    "score_demos",
    "sft_identity",
    "sft_loss",
    "sft_program",
    "train_sft",
]
