"""`jaxil gail`, `jaxil airl` and `jaxil irl ppo`: adversarial imitation
and PPO against a learned reward (`jaxil.algorithms.irl.adversarial`).

    jaxil gail --env smax:3m --demos data/3m.npz --num-demos 10 --seeds 4 --out runs/gail-3m
    jaxil airl --env smax:3m --demos data/3m.npz --num-demos 10 --mixing none --out runs/airl-3m
    jaxil gail --env smax:3m --demos data/3m.npz --num-demos 10 --seeds 4 --out runs/gail-3m --resume
    jaxil irl ppo --env smax:3m --reward-model runs/rm-3m --demos data/3m.npz --kl-coef 0.05 \\
        --out runs/ppo-rm-3m

Every run starts from π_SFT (BC on the demonstrations, `--sft-updates`;
0 starts from the PPO initialisation) and is evaluated at chunk 0 (that is
BC's return) and every `--eval-every` chunks. Seeds run vmapped in one
program per chunk; `--demos-per-seed` gives each seed its own disjoint
`--num-demos` trajectories. The run directory holds `run.json`,
`metrics.jsonl` (one row per evaluation and seed: true return, learned and
environment reward per step, discriminator loss and accuracy, KL), orbax
checkpoints and `results.json`; `--resume` continues a killed run and
reproduces the uninterrupted one.
"""

from __future__ import annotations

import argparse
from typing import Any

from jaxil.cli.args import (add_hidden, add_loggers, add_progress, add_run_dir, add_seeds,
                            discount, make_loggers, nonneg_float, nonneg_int, positive_float,
                            positive_int)


def _load_demos(args, spec) -> Any:
    import numpy as np

    from jaxil.data import load
    from jaxil.algorithms.irl.adversarial import demos_from_dataset, stack_demos

    ds = load(args.demos, spec=spec)
    idx = np.arange(len(np.asarray(ds.length)))
    if args.tier is not None:
        names = list(ds.info.tier_names)
        if args.tier not in names:
            raise ValueError(f"--tier {args.tier!r} is not in {args.demos} (tiers: "
                             f"{', '.join(names)})")
        idx = idx[np.asarray(ds.tier) == names.index(args.tier)]
    k = args.num_demos if args.num_demos is not None else len(idx)
    sets = args.seeds if args.demos_per_seed else 1
    if k * sets > len(idx):
        raise ValueError(f"{args.demos} has {len(idx)} trajectories"
                         + (f" of tier {args.tier}" if args.tier else "")
                         + f", fewer than --num-demos {k}" + (f" × {sets} seeds" if sets > 1 else "")
                         + "; lower --num-demos or build a larger dataset")
    if sets == 1:
        return demos_from_dataset(ds, idx[:k])
    return stack_demos([demos_from_dataset(ds, idx[s * k:(s + 1) * k]) for s in range(sets)])


def _ppo_config(args):
    from jaxil.teachers import PPOConfig

    return PPOConfig(algo=args.algo, total_timesteps=args.total_timesteps, num_envs=args.num_envs,
                     num_steps=args.num_steps, update_epochs=args.update_epochs,
                     num_minibatches=args.num_minibatches, lr=args.lr, gamma=args.gamma,
                     ent_coef=args.ent_coef, hidden_sizes=tuple(args.hidden),
                     reward_scale=args.reward_scale, updates_per_chunk=args.updates_per_chunk,
                     anneal_lr=not args.no_anneal)


def _load_reward_model(path: str, spec, seed_index: int = 0):
    """`(RewardModelConfig, params)` of seed `seed_index` of a
    `jaxil irl reward-model` run directory (its latest checkpoint)."""
    import json
    from pathlib import Path

    import jax

    from jaxil.runs.checkpoint import Checkpointer
    from jaxil.algorithms.irl.reward_model import RewardModel, RewardModelConfig
    from jaxil.algorithms.irl.sources import init_reward_states

    rdir = Path(path)
    try:
        ident = json.loads((rdir / "run.json").read_text()).get("identity") or {}
    except FileNotFoundError:
        raise FileNotFoundError(f"--reward-model {rdir} holds no run.json: pass a directory "
                                "written by `jaxil irl reward-model --out`") from None
    if ident.get("command") != "irl reward-model":
        raise ValueError(f"--reward-model {rdir} is not a `jaxil irl reward-model` run")
    c = dict(ident["config"])
    c["hidden"] = tuple(c["hidden"])
    config = RewardModelConfig(**c)
    seeds = list(ident["seeds"])
    if not 0 <= seed_index < len(seeds):
        raise ValueError(f"--reward-seed {seed_index}: {rdir} holds {len(seeds)} seeds")
    rm = RewardModel(spec, config)
    like = init_reward_states(rm, seeds, ident["base_seed"])
    ck = Checkpointer(rdir / "checkpoints")
    try:
        if ck.latest_step() is None:
            raise FileNotFoundError(f"--reward-model {rdir} has no checkpoint yet; train it first")
        states = ck.restore(like)
    finally:
        ck.close()
    return config, jax.tree.map(lambda x: x[seed_index], states.params)


def _run(args) -> int:
    from jaxil import envs
    from jaxil.algorithms.irl.adversarial import AdversarialConfig, format_summary, train_adversarial

    method = args.method
    logs = make_loggers(args, args.out)
    env = envs.make(args.env)
    ppo = _ppo_config(args)
    reward_params, rm_info = None, {}
    kw = dict(method=method, sft_updates=args.sft_updates, sft_lr=args.sft_lr,
              sft_batch=args.sft_batch, kl_coef=args.kl_coef, eval_episodes=args.eval_episodes,
              deterministic_eval=args.deterministic_eval)
    if method == "ppo":
        rm_config, reward_params = _load_reward_model(args.reward_model, env.spec,
                                                      args.reward_seed)
        kw.update(mixing=rm_config.mixing, hidden=rm_config.hidden,
                  mixer_hidden=rm_config.mixer_hidden, reward_form=args.reward_form or "logit")
        rm_info = dict(reward_model=str(args.reward_model), reward_seed=args.reward_seed)
    else:
        kw.update(mixing=args.mixing, hidden=tuple(args.disc_hidden),
                  mixer_hidden=args.mixer_hidden, disc_steps=args.disc_steps,
                  disc_batch=args.disc_batch, disc_lr=args.disc_lr, gp_coef=args.gp_coef,
                  reward_form=args.reward_form)
    config = AdversarialConfig(**kw)
    if method != "ppo" and args.demos is None:
        raise ValueError(f"jaxil {method} needs --demos (a jaxil dataset file)")
    if config.sft_updates > 0 and args.demos is None:
        raise ValueError("--sft-updates > 0 trains π_SFT on --demos; pass --demos or "
                         "--sft-updates 0")
    if args.out:  # refuse a bad --out before loading and compiling
        from jaxil.runs.rundir import check_run_dir

        check_run_dir(args.out, resume=args.resume, overwrite=args.overwrite)
    demos = None if args.demos is None else _load_demos(args, env.spec)
    summary = train_adversarial(
        env, ppo, config, demos, seeds=args.seeds, base_seed=args.seed,
        reward_params=reward_params, out_dir=args.out, resume=args.resume,
        overwrite=args.overwrite, eval_every=args.eval_every,
        stop_after_chunks=args.stop_after_chunks, progress=not args.no_progress, loggers=logs,
        run_info=dict(demos=args.demos, num_demos=args.num_demos, tier=args.tier, **rm_info))
    print(format_summary(summary))
    if args.out:
        print(f"results in {args.out}")
    return 0


def _add_arguments(p: argparse.ArgumentParser, method: str) -> None:
    p.add_argument("--env", required=True, help="environment id, e.g. smax:3m")
    p.add_argument("--demos", default=None, required=method != "ppo",
                   help="demonstrations: a jaxil dataset file (jaxil data build)")
    p.add_argument("--tier", default=None, help="use only this tier's trajectories")
    p.add_argument("--num-demos", type=positive_int, default=None,
                   help="demonstration trajectories (default: all)")
    p.add_argument("--demos-per-seed", action="store_true",
                   help="each seed gets its own disjoint --num-demos trajectories")
    if method == "ppo":
        p.add_argument("--reward-model", required=True,
                       help="a `jaxil irl reward-model` run directory (the fixed reward)")
        p.add_argument("--reward-seed", type=nonneg_int, default=0,
                       help="which of its seeds' reward model to use")
    add_seeds(p)
    g = p.add_argument_group("PPO (the teacher trainer)")
    g.add_argument("--algo", choices=("mappo", "ippo"), default="mappo")
    g.add_argument("--total-timesteps", type=positive_int, default=1_000_000,
                   help="environment steps per seed")
    g.add_argument("--num-envs", type=positive_int, default=64)
    g.add_argument("--num-steps", type=positive_int, default=32)
    g.add_argument("--update-epochs", type=positive_int, default=4)
    g.add_argument("--num-minibatches", type=positive_int, default=4)
    g.add_argument("--updates-per-chunk", type=positive_int, default=5)
    g.add_argument("--lr", type=positive_float, default=3e-4)
    g.add_argument("--no-anneal", action="store_true", help="constant learning rate")
    g.add_argument("--gamma", type=discount, default=0.99)
    g.add_argument("--ent-coef", type=nonneg_float, default=0.01,
                   help="entropy bonus (a stabiliser)")
    g.add_argument("--reward-scale", type=positive_float, default=1.0)
    add_hidden(g, (64, 64), help="actor and critic widths")
    s = p.add_argument_group("π_SFT and the KL penalty")
    s.add_argument("--sft-updates", type=nonneg_int, default=1000,
                   help="BC steps on the demonstrations before PPO (0: none)")
    s.add_argument("--sft-lr", type=positive_float, default=1e-3)
    s.add_argument("--sft-batch", type=positive_int, default=256)
    s.add_argument("--kl-coef", type=nonneg_float, default=0.0,
                   help="β of the per-step KL penalty towards π_SFT (0: none)")
    if method != "ppo":
        d = p.add_argument_group("discriminator")
        d.add_argument("--mixing", choices=("hyper", "sum", "none"), default="hyper",
                       help="team (local logits + hypernetwork mixer), sum, or per agent")
        d.add_argument("--disc-hidden", type=positive_int, nargs="+", default=[64, 64])
        d.add_argument("--mixer-hidden", type=positive_int, default=32)
        d.add_argument("--disc-steps", type=positive_int, default=1,
                       help="discriminator updates per PPO iteration (the update ratio)")
        d.add_argument("--disc-batch", type=positive_int, default=256)
        d.add_argument("--disc-lr", type=positive_float, default=3e-4)
        d.add_argument("--gp-coef", type=nonneg_float, default=0.0,
                       help="gradient-penalty weight (0: none)")
    forms = ("softplus", "logit", "log_d")
    if method != "airl":
        p.add_argument("--reward-form", choices=forms, default=None,
                       help="reward of the logit: softplus = -log(1-D), logit = log D - "
                            "log(1-D), log_d = log D (default: gail softplus, ppo logit)")
    else:
        p.set_defaults(reward_form="logit")
    e = p.add_argument_group("evaluation and the run directory")
    e.add_argument("--eval-episodes", type=positive_int, default=64)
    e.add_argument("--eval-every", type=positive_int, default=1, help="chunks between evaluations")
    e.add_argument("--deterministic-eval", action="store_true")
    add_run_dir(e)
    e.add_argument("--stop-after-chunks", type=positive_int, default=None,
                   help=argparse.SUPPRESS)  # tests and time-boxed runs
    add_progress(e)
    add_loggers(p)
    p.set_defaults(func=_run, method=method)


_HELP = {"gail": "multi-agent GAIL (team or per-agent discriminator) on PPO",
         "airl": "multi-agent AIRL (g(s,a) + γh(s') − h(s)) on PPO",
         "ppo": "PPO against a learned reward model (optional KL penalty to π_SFT)"}


def add_commands(irl_sub) -> None:
    """`jaxil irl ppo`, `jaxil irl gail` and `jaxil irl airl` on the
    `jaxil irl` group's subparsers."""
    for method in ("ppo", "gail", "airl"):
        p = irl_sub.add_parser(method, help=_HELP[method], description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        _add_arguments(p, method)


def add_aliases(sub) -> None:
    """The earlier top-level spellings `jaxil gail` and `jaxil airl`."""
    for method in ("gail", "airl"):
        p = sub.add_parser(method, help=f"alias of `jaxil irl {method}`", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        _add_arguments(p, method)
