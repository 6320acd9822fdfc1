"""Rewards learned from demonstrations.

- [`jaxil.algorithms.irl.reward_model`][jaxil.algorithms.irl.reward_model]:
  discriminator reward models trained on two sample sources (Init–SFT,
  Init–Demo, SFT–Demo): local logits mixed by the MisoDICE hypernetwork mixer
  into a team reward (or one per agent), the logistic loss with DemoDICE's
  gradient penalty, trajectory scores, and the analytic r_c = log π_SFT − log
  π_0.
- [`jaxil.algorithms.irl.sources`][jaxil.algorithms.irl.sources]: π_SFT (BC on
  the demonstrations) and π_0 (its initialisation), their rollouts, the stacked
  per-seed source data, and the reward-model training loop (run directory,
  checkpoints, `--resume`).
- [`jaxil.algorithms.irl.best_of_n`][jaxil.algorithms.irl.best_of_n]: M start
  states × K rollouts of π_SFT from the same reset key in one vmapped program;
  best-of-N curves as the exact expectation over N-subsets; learned-vs-true
  Spearman ρ.
- `jaxil.cli.irl`: `jaxil irl reward-model` and `jaxil irl bon`.
- [`jaxil.algorithms.irl.adversarial`][jaxil.algorithms.irl.adversarial]: PPO
  against a learned reward, and multi-agent GAIL and AIRL on the teacher
  trainer.
"""
