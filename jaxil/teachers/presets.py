"""Per-environment teacher presets and the training command line.

The presets are sized for a small CPU budget (3-6M environment steps each);
they start from JaxMARL's SMAX MAPPO sweep (lr 2e-3, 64 envs x 128 steps,
4 epochs x 4 minibatches, clip 0.2, γ 0.99, λ 0.95) with a feed-forward 64x64
network instead of a GRU and an entropy bonus of 0.01 (JaxMARL's IPPO SMAX
value; without it the policy collapses to near-determinism early on 3m and
plateaus at ~0.85 win rate).
`teachers_report.md` at the repository root records what they reach and how
long they take.

Command line:

```bash
jaxil teach --env smax:3m --out runs/teachers/smax_3m
jaxil teach --env smax:3m --out runs/teachers/smax_3m --resume
jaxil teach --env smax:2s3z --set total_timesteps=8000000 lr=0.001
```
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from jaxil.algorithms.rl.config import PPOConfig

_SMAX = PPOConfig(
    algo="mappo",
    total_timesteps=3_000_000,
    num_envs=64,
    num_steps=128,
    update_epochs=4,
    num_minibatches=4,
    lr=2e-3,
    anneal_lr=True,
    gamma=0.99,
    gae_lambda=0.95,
    clip_eps=0.2,
    ent_coef=0.01,  # 0.0 (JaxMARL's sweep) collapsed the entropy early on 3m
    vf_coef=0.5,
    max_grad_norm=0.5,
    hidden_sizes=(64, 64),
    activation="relu",
    updates_per_chunk=5,
)

# MuJoCo-style PPO (CleanRL's and brax's Hopper and HalfCheetah recipes:
# tanh 64x64, observation normalisation, γ 0.99, λ 0.95, lr 3e-4, 10 epochs,
# no entropy bonus) at 64 envs, where MJX on a CPU steps faster per env than
# at 256 (experiments/misodice_table/MAMUJOCO.md). reward_scale 0.02 keeps
# the discounted return (a hopper earns about 3 a step) near the value clip's
# scale. Train with --env-kwarg iterations=4 --env-kwarg ls_iterations=8 on a
# CPU (experiments/misodice_table/MAMUJOCO.md: the same physics there).
_MUJOCO = PPOConfig(
    algo="mappo",
    total_timesteps=3_000_000,
    num_envs=64,
    num_steps=128,
    update_epochs=10,
    num_minibatches=32,
    lr=3e-4,
    gamma=0.99,
    gae_lambda=0.95,
    clip_eps=0.2,
    ent_coef=0.0,
    max_grad_norm=0.5,
    hidden_sizes=(64, 64),
    activation="tanh",
    reward_scale=0.02,
    log_std_init=-0.5,
    normalize_obs=True,
    updates_per_chunk=2,
)

PRESETS: dict[str, PPOConfig] = {
    "smax:3m": _SMAX,
    # The learning-rate schedule anneals over total_timesteps: with 2M steps
    # seed 0 ended at 5% wins (lr decayed too early); the same seed with a 5M
    # schedule reached 96% training wins after 0.94M steps.
    "smax:2s3z": _SMAX.replace(total_timesteps=5_000_000),
    # lr 3e-3 and γ 0.95 beat lr 1e-3 / γ 0.99 in a 1.3M-step sweep (return
    # -18.5 vs -23 at 1.3M steps); IPPO, log_std_init in {-1, 0} and an
    # entropy bonus did not help.
    "mpe:simple_spread_continuous": PPOConfig(
        algo="mappo",
        total_timesteps=6_000_000,
        num_envs=128,
        num_steps=64,
        update_epochs=4,
        num_minibatches=4,
        lr=3e-3,
        gamma=0.95,
        clip_eps=0.2,
        ent_coef=0.0,
        max_grad_norm=0.5,
        hidden_sizes=(64, 64),
        activation="tanh",
        reward_scale=0.1,
        log_std_init=-0.5,
        updates_per_chunk=20,
    ),
    "jumanji:LevelBasedForaging-v0": PPOConfig(
        algo="mappo",
        total_timesteps=6_000_000,
        num_envs=128,
        num_steps=64,
        update_epochs=4,
        num_minibatches=4,
        lr=1e-3,
        clip_eps=0.2,
        ent_coef=0.01,
        max_grad_norm=0.5,
        hidden_sizes=(64, 64),
        activation="relu",
        updates_per_chunk=20,
    ),
    "mamujoco:hopper_3x1": _MUJOCO,
    # The hopper's recipe unchanged: CleanRL and brax use the same PPO
    # settings for HalfCheetah. The half-cheetah never falls, so every
    # episode runs its 1000 steps.
    "mamujoco:halfcheetah_6x1": _MUJOCO,
}


def preset(env_id: str, **overrides: Any) -> PPOConfig:
    """The preset config of `env_id` (SMAX maps without a preset get the SMAX
    one), with keyword overrides."""
    if env_id in PRESETS:
        cfg = PRESETS[env_id]
    elif env_id.startswith("smax:"):
        cfg = _SMAX
    else:
        raise KeyError(
            f"no teacher preset for {env_id!r}; presets: {sorted(PRESETS)}. "
            f"Build a PPOConfig yourself for other environments."
        )
    return cfg.replace(**overrides) if overrides else cfg


def _parse_sets(items: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` overrides (JSON values); PPOConfig range-checks them."""
    fields = {f.name: f for f in dataclasses.fields(PPOConfig)}
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        if k not in fields:
            raise ValueError(f"--set: unknown config field {k!r}; fields: {sorted(fields)}")
        try:
            val = json.loads(v)
        except json.JSONDecodeError:
            val = v  # bare strings such as algo=ippo
        if k == "hidden_sizes":
            if isinstance(val, int) and not isinstance(val, bool):
                val = [val]  # one layer
            if not isinstance(val, list):
                raise ValueError(f"--set hidden_sizes takes a JSON list of widths, e.g. "
                                 f"hidden_sizes=[64,64], got {v!r}")
            val = tuple(val)
        elif (isinstance(getattr(PRESETS["smax:3m"], k), float) and isinstance(val, int)
              and not isinstance(val, bool)):  # true is not 1.0: PPOConfig refuses it
            val = float(val)
        out[k] = val
    return out

