"""GAIL and AIRL against BC at the same (small) number of demonstrations.

    python experiments/irl/adversarial.py                 # the committed results (CPU, ~30 min)
    python experiments/irl/adversarial.py --scale 4       # 4x the PPO budget per run
    python experiments/irl/adversarial.py --quick         # smoke run, one env, minutes
    python experiments/irl/adversarial.py --envs smax:3m --demos 5
    python experiments/irl/adversarial.py --envs mpe:simple_spread_continuous --expert-demos \
        --demos 200 --settings literature --tag box_literature   # box actions, clean expert

Per environment (SMAX 3m, LevelBasedForaging, MPE spread) and seed (4), the
demonstrations are ``--demos`` trajectories of the ε-noised expert of
jaxil.collect.demonstrations (seed s gets trajectories [s·d, (s+1)·d) of one
dataset: disjoint sets). Every run starts from π_SFT (BC on its own
demonstrations); GAIL and AIRL then alternate discriminator steps and PPO
(jaxil.algorithms.irl.adversarial, one compiled program per chunk, the 4 seeds
vmapped). BC's return is the chunk-0 evaluation of the same runs (same
policy, same 64 start states as every later evaluation), so the BC column is
the very policy GAIL and AIRL start from.

``--expert-demos`` takes the noise-free expert's trajectories instead (any
environment with recipes, e.g. the box-action MPE spread), ``--demos`` per
seed, disjoint. ``--settings literature`` replaces the committed stabilisers
by those of the working implementations (REFERENCES.md, "Adversarial IL in
practice"): −log(1−D) reward, 16 discriminator steps per PPO iteration,
gradient penalty 10, no KL to π_SFT, no entropy bonus, 4,096-step PPO batches.

Writes results/adversarial.json, results/adversarial.md (the table) and
results/adversarial_curves.png (true return and learned reward over training).
Run directories go under runs/experiments/irl/adversarial/ (resumable: a
killed run continues where it stopped).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from jaxil.collect.demonstrations import NOISED_EXPERTS, demonstrations

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "experiments" / "irl" / "results"
RUNS = ROOT / "runs" / "experiments" / "irl" / "adversarial"
SEEDS = 4


#: MaMuJoCo runs: the hopper teacher's PPO (jaxil.teachers.presets: 64 envs x
#: 128 steps, 8,192-step batches, in the working implementations' 4k-16k
#: range) for MUJOCO_STEPS env-steps per seed at --scale 1, the learned
#: reward (about 0.7 a step for -log(1-D) at D = 1/2) scaled by 0.1 instead
#: of the task reward's 0.02; MUJOCO_EVALS evaluations of
#: MUJOCO_EVAL_EPISODES greedy episodes per seed (a 1000-step episode costs
#: as much physics as an eighth of a PPO batch).
MUJOCO_STEPS = 1_000_000
MUJOCO_EVALS = 5
MUJOCO_EVAL_EPISODES = 16


def mujoco_chunks(scale: float, quick: bool) -> int:
    """Chunks of 2 PPO iterations (16,384 env-steps per seed) at `scale`,
    a multiple of MUJOCO_EVALS."""
    if quick:
        return 2
    per = 2 * 64 * 128
    return max(MUJOCO_EVALS, int(round(MUJOCO_STEPS * scale / per / MUJOCO_EVALS)) * MUJOCO_EVALS)


def ppo_config(env_id: str, scale: float, quick: bool, settings: str = "committed"):
    from jaxil.teachers import PPOConfig

    if env_id.startswith("mamujoco:"):
        from jaxil.teachers.presets import preset

        base = preset(env_id)
        chunks = mujoco_chunks(scale, quick)
        return preset(env_id, reward_scale=0.1, total_timesteps=chunks * base.updates_per_chunk
                      * base.num_envs * base.num_steps)
    chunks = 2 if quick else max(1, int(round(20 * scale)))
    num_envs = 128 if settings == "literature" else 32
    num_steps, k = 32, 5
    return PPOConfig(algo="mappo", total_timesteps=chunks * k * num_envs * num_steps,
                     num_envs=num_envs, num_steps=num_steps, update_epochs=4,
                     num_minibatches=4, lr=3e-4, anneal_lr=True, gamma=0.99,
                     ent_coef=0.0 if settings == "literature" else 0.01,
                     hidden_sizes=(64, 64), activation="relu", updates_per_chunk=k)


# The settings of each method (the stabilisers: see README.md).
METHODS = {
    "gail": dict(method="gail", mixing="hyper", reward_form="logit", disc_steps=2,
                 gp_coef=1.0, kl_coef=0.05),
    "airl": dict(method="airl", mixing="hyper", reward_form="logit", disc_steps=2,
                 gp_coef=1.0, kl_coef=0.05),
}


# The working implementations' settings (REFERENCES.md): -log(1-D) for GAIL,
# many discriminator steps, a strong gradient penalty, no KL anchor.
LITERATURE = {
    "gail": dict(method="gail", mixing="hyper", reward_form="softplus", disc_steps=16,
                 gp_coef=10.0, kl_coef=0.0),
    "airl": dict(method="airl", mixing="hyper", reward_form="logit", disc_steps=16,
                 gp_coef=10.0, kl_coef=0.0),
}


# Ablation flags: a setting given on the command line replaces METHODS' value
# for every method, and names the run directories (so that no ablation
# resumes another's run).
OVERRIDES = {"kl_coef": float, "disc_steps": int, "gp_coef": float, "reward_form": str}


def overrides(args) -> dict:
    return {k: getattr(args, k) for k in OVERRIDES if getattr(args, k) is not None}


def override_suffix(args) -> str:
    return "".join(f"-{k}{v:g}" if isinstance(v, float | int) else f"-{k}-{v}"
                   for k, v in overrides(args).items())


def run_env(env_id: str, args) -> dict:
    from jaxil import envs
    from jaxil.algorithms.irl.adversarial import AdversarialConfig, demos_from_dataset, stack_demos, \
        train_adversarial

    if args.dataset:  # the expert-flagged trajectories of a recipe dataset, in file order
        ds, info, env = dataset_demos(args.dataset, env_id)
    elif args.expert_demos:  # the noise-free expert, --demos per seed
        ds, info = demonstrations(env_id, num_demos=SEEDS * args.demos, seed=0, epsilon=0)
        env = envs.make(env_id)
    else:  # B's 200-trajectory dataset of jaxil.collect.demonstrations (shared with best-of-N)
        ds, info = demonstrations(env_id, num_demos=200, seed=0)
        env = envs.make(env_id)
    if SEEDS * args.demos > len(ds):
        raise ValueError(f"--demos {args.demos} x {SEEDS} seeds exceeds the {len(ds)} trajectories")
    per_seed = [demos_from_dataset(ds, range(s * args.demos, (s + 1) * args.demos),
                                   subsample=args.subsample, subsample_seed=s)
                for s in range(SEEDS)]
    seed_returns = [float(np.mean(np.asarray(ds.episode_return)[s * args.demos:(s + 1) * args.demos]))
                    for s in range(SEEDS)]
    info["pairs_per_seed"] = [int(np.asarray(d.weight).sum()) for d in per_seed]
    demos = stack_demos(per_seed)
    cfg = ppo_config(env_id, args.scale, args.quick, args.settings)
    methods = LITERATURE if args.settings == "literature" else METHODS
    out = dict(env_id=env_id, demos=info, demos_per_seed=args.demos,
               demo_return_per_seed=seed_returns, ppo=cfg.to_dict(), methods={})
    mujoco = env_id.startswith("mamujoco:")
    out.update(subsample=args.subsample, warm_start=not args.no_warm_start)
    for name in args.methods:
        settings = dict(methods[name], **overrides(args))
        if args.no_warm_start:  # from the initial policy: no π_SFT, so no KL anchor either
            settings.update(kl_coef=0.0)
        # MaMuJoCo: greedy evaluations, fewer of them (1000-step episodes)
        ev = dict(deterministic_eval=True, eval_episodes=MUJOCO_EVAL_EPISODES) if mujoco else \
            dict(eval_episodes=64)
        acfg = AdversarialConfig(hidden=(64, 64), mixer_hidden=32, disc_batch=256, disc_lr=3e-4,
                                 sft_updates=0 if args.no_warm_start else args.sft_updates,
                                 sft_lr=1e-3, sft_batch=256, **ev, **settings)
        rdir = RUNS / f"{env_id.replace(':', '_')}-{name}-{args.demos}d-x{args.scale:g}" \
            f"{'-expert' if args.expert_demos or args.dataset else ''}" \
            f"{f'-sub{args.subsample}' if args.subsample > 1 else ''}" \
            f"{'-cold' if args.no_warm_start else ''}" \
            f"{'-literature' if args.settings == 'literature' else ''}" \
            f"{override_suffix(args)}{'-quick' if args.quick else ''}"
        t0 = time.time()
        resume = (rdir / "run.json").exists()
        chunks = cfg.total_timesteps // (cfg.updates_per_chunk * cfg.num_envs * cfg.num_steps)
        summary = train_adversarial(env, cfg, acfg, demos, seeds=SEEDS, base_seed=0,
                                    out_dir=rdir, resume=resume,
                                    eval_every=max(1, chunks // MUJOCO_EVALS) if mujoco else 1,
                                    progress=not args.no_progress,
                                    run_info=dict(experiment="experiments/irl/adversarial.py"))
        summary.pop("states")
        from jaxil.runs.rundir import read_jsonl

        rows = read_jsonl(rdir / "metrics.jsonl")
        out["methods"][name] = dict(config=acfg.to_dict(), summary=summary,
                                    wall_seconds=time.time() - t0, run_dir=str(rdir.relative_to(ROOT)),
                                    curves=_curves(rows))
        print(f"{env_id} {name}: BC {summary['initial']['return_mean']:.3f} ± "
              f"{summary['initial']['return_std']:.3f} -> {summary['final']['return_mean']:.3f} ± "
              f"{summary['final']['return_std']:.3f} ({time.time() - t0:.0f}s)", flush=True)
    return out


def dataset_demos(name: str, env_id: str):
    """`(expert trajectories, info, environment)` of a recipe dataset (e.g.
    `mamujoco-hopper_3x1/misodice-200e-1000p`): its expert-flagged
    trajectories in file order (the file is shuffled), the info fields of
    `demonstrations` from its measured tiers, and the environment it was
    recorded in (with its keywords)."""
    from jaxil.collect.comparison import tier_returns
    from jaxil.collect.recipes import load_dataset
    from jaxil.data.environment import dataset_env

    ds = load_dataset(name)
    if ds.spec.env_id != env_id:
        raise ValueError(f"--dataset {name} was recorded on {ds.spec.env_id}, not {env_id}")
    expert = np.flatnonzero(np.asarray(ds.expert, bool))
    if expert.size == 0:
        raise ValueError(f"--dataset {name} has no expert trajectories")
    demos = ds.select(expert)
    ret = np.asarray(demos.episode_return, np.float64)
    tiers = tier_returns(name)
    info = dict(env_id=env_id, epsilon=0.0, num_demos=int(expert.size), seed=0, path=name,
                source=demos.info.source_names[0], demo_return_mean=float(ret.mean()),
                demo_return_std=float(ret.std()), demonstrator_measured=tiers["expert"],
                expert_return_mean=tiers["expert"], random_return_mean=tiers["random"],
                env_kwargs=ds.info.env_kwargs)
    return demos, info, dataset_env(ds)


def _curves(rows: list[dict]) -> dict:
    """Per chunk: the mean ± std over seeds of the true eval return and of the
    per-step learned and environment rewards of the training rollouts."""
    chunks = sorted({r["chunk"] for r in rows})
    out = {"chunk": chunks}
    for key in ("eval_return", "eval_length", "learned_reward", "env_reward", "disc_accuracy", "kl"):
        m, s = [], []
        for c in chunks:
            v = [r.get(key) for r in rows if r["chunk"] == c]
            v = [x for x in v if x is not None]
            m.append(float(np.mean(v)) if v else None)
            s.append(float(np.std(v)) if v else None)
        out[key] = m
        out[key + "_std"] = s
    return out


def table(results: list[dict]) -> str:
    """Returns ± std over seeds, with the return normalised between the random
    policy (0) and the noise-free expert (1) in brackets."""
    lines = ["| environment | demonstrator | BC (π_SFT) | GAIL | AIRL |",
             "|---|---|---|---|---|"]
    for r in results:
        d = r["demos"]
        lo, hi = d["random_return_mean"], d["expert_return_mean"]

        def norm(x):
            return f" [{(x - lo) / (hi - lo):.2f}]" if hi != lo else ""

        cells = [f"{d['demo_return_mean']:.3f} ± {d['demo_return_std']:.3f}"
                 f"{norm(d['demo_return_mean'])} (ε={d['epsilon']})"]
        first = next(iter(r["methods"].values()))["summary"]["initial"]
        cells.append(f"{first['return_mean']:.3f} ± {first['return_std']:.3f}"
                     f"{norm(first['return_mean'])}")
        for name in ("gail", "airl"):
            if name not in r["methods"]:
                cells.append("—")
                continue
            f = r["methods"][name]["summary"]["final"]
            i = r["methods"][name]["summary"]["initial"]
            gap = f["return_mean"] - i["return_mean"]
            mark = " ✓" if gap > max(f["return_std"], i["return_std"]) else ""
            cells.append(f"{f['return_mean']:.3f} ± {f['return_std']:.3f}{norm(f['return_mean'])} "
                         f"({gap:+.3f}){mark}")
        lines.append(f"| {r['env_id']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(4.5 * len(results), 6.5), squeeze=False)
    for j, r in enumerate(results):
        for name, m in r["methods"].items():
            c = m["curves"]
            x = np.asarray(c["chunk"]) * r["ppo"]["updates_per_chunk"] * r["ppo"]["num_envs"] \
                * r["ppo"]["num_steps"]
            y, s = np.asarray(c["eval_return"], float), np.asarray(c["eval_return_std"], float)
            axes[0, j].plot(x, y, label=name.upper())
            axes[0, j].fill_between(x, y - s, y + s, alpha=0.2)
            lr = np.asarray([np.nan if v is None else v for v in c["learned_reward"]], float)
            axes[1, j].plot(x[1:], lr[1:], label=f"{name.upper()} learned")
        axes[0, j].axhline(r["demos"]["demo_return_mean"], color="k", ls="--", lw=1,
                           label="demonstrator")
        first = next(iter(r["methods"].values()))["summary"]["initial"]
        axes[0, j].axhline(first["return_mean"], color="gray", ls=":", lw=1, label="BC")
        axes[0, j].set_title(r["env_id"])
        axes[0, j].set_ylabel("true return (eval)")
        axes[1, j].set_ylabel("learned reward per step (training)")
        axes[1, j].set_xlabel("env steps per seed")
        axes[0, j].legend(fontsize=7)
        axes[1, j].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=[e for e in NOISED_EXPERTS if e != "smax:2s3z"],
                   help="default: the issue's three (smax:2s3z joined best-of-N only)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--demos", type=int, default=10, help="demonstration trajectories per seed")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies the PPO budget")
    p.add_argument("--sft-updates", type=int, default=1000)
    p.add_argument("--expert-demos", action="store_true",
                   help="the noise-free expert's trajectories (any environment with recipes)")
    p.add_argument("--settings", choices=("committed", "literature"), default="committed",
                   help="the stabilisers: this study's (METHODS) or the working "
                        "implementations' (LITERATURE)")
    p.add_argument("--dataset", help="demonstrations from this recipe dataset's expert "
                   "trajectories (e.g. mamujoco-hopper_3x1/misodice-200e-1000p), --demos per "
                   "seed, disjoint")
    p.add_argument("--subsample", type=int, default=1,
                   help="keep every k-th step of each demonstration from a random offset "
                        "(GAIL's MuJoCo pipeline: 20)")
    p.add_argument("--no-warm-start", action="store_true",
                   help="start GAIL/AIRL from the initial policy, not from BC (π_SFT)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--tag", default="adversarial", help="name of the result files")
    for k, typ in OVERRIDES.items():
        p.add_argument("--" + k.replace("_", "-"), type=typ, default=None,
                       help=f"ablation: replace every method's {k} (default: METHODS)")
    args = p.parse_args(argv)
    if args.quick:
        args.envs = args.envs[:1]
    t0 = time.time()
    OUT.mkdir(parents=True, exist_ok=True)
    results = []
    for e in args.envs:
        results.append(run_env(e, args))
        (OUT / f"{args.tag}.partial.json").write_text(json.dumps(results, indent=1))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    doc = dict(command="python experiments/irl/adversarial.py " + " ".join(argv or sys.argv[1:]),
               commit=commit, wall_seconds=time.time() - t0, seeds=SEEDS, results=results)
    (OUT / f"{args.tag}.json").write_text(json.dumps(doc, indent=1))
    (OUT / f"{args.tag}.md").write_text(
        f"{table(results)}\n\nReturn after GAIL/AIRL (final − BC); ✓: the gain exceeds one std "
        f"over seeds of both. {SEEDS} seeds, {args.demos} demonstrations per seed"
        f"{f' (every {args.subsample}th step)' if args.subsample > 1 else ''}"
        f"{', no BC warm start' if args.no_warm_start else ''}, "
        f"wall time {doc['wall_seconds']:.0f} s.\n")
    plot(results, OUT / f"{args.tag}_curves.png")
    print(table(results))
    print(f"wall time {doc['wall_seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
