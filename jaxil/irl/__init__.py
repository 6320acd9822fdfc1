"""Rewards learned from demonstrations (issue 12).

- :mod:`jaxil.irl.reward_model`: discriminator reward models trained on two
  sample sources (Init–SFT, Init–Demo, SFT–Demo) and the analytic
  r_c = log π_SFT − log π_0; best-of-N selection by a learned reward.
- :mod:`jaxil.irl.adversarial`: PPO against a learned reward, and
  multi-agent GAIL and AIRL on the teacher trainer.
"""
