"""`jaxil irl reward-model` and `jaxil irl bon`: reward models from
demonstrations and best-of-N selection with them.

    jaxil irl reward-model --dataset runs/data/smax-3m-medium.npz --source init-sft \\
        --seeds 4 --out runs/rm-3m
    jaxil irl reward-model ... --out runs/rm-3m --resume     # continue after a kill
    jaxil irl bon --reward runs/rm-3m --start-states 8 --rollouts 256

`reward-model` trains π_SFT (BC on the dataset; its own run directory
`<out>/sft`, a `jaxil train` run), takes π_0 = the same network at its
initialisation, rolls out the policies the source needs, and trains one
reward model per seed (all seeds in one program) on negatives vs positives
of the source (`init-sft`, `init-demo`, `sft-demo`). `<out>` holds
`run.json`, `metrics.jsonl` (loss, accuracy, the per-state Spearman ρ of
the learned against the true return on held-out π_SFT rollouts), orbax
checkpoints of the stacked reward-model states and `results.json`.

`bon` reads such a directory: M start states × K rollouts of π_SFT from the
same reset key, scored by the learned reward (and the analytic
r_c = log π_SFT − log π_0), and reports best-of-N curves over N = 1, 2, …, K
against π_SFT's mean, the demonstrations' mean and the oracle, with the
Spearman ρ; `--out` writes `bon.json` there (default: inside the
reward-model directory).
"""

from __future__ import annotations

from jaxil.cli import adversarial

import argparse
import json
from pathlib import Path

from jaxil.runs.loggers import prefixed
from jaxil.cli.args import (add_hidden, add_loggers, add_progress, add_run_dir, add_seeds,
                            make_loggers, nonneg_float, nonneg_int, positive_float, positive_int,
                            probability)

SOURCES = ("init-sft", "init-demo", "sft-demo")
MIXING = ("hyper", "sum", "none")


def _load(args):
    from jaxil.collect.recipes import load_dataset
    from jaxil.data.environment import dataset_env

    ds = load_dataset(args.dataset, args.data_seed)
    return ds, dataset_env(ds)


def _pipeline(args, *, resume: bool, overwrite: bool, progress: bool, loggers=()):
    """π_SFT, π_0, source rollouts and held-out π_SFT rollouts (deterministic
    given the arguments, so a resumed run rebuilds the same data); π_SFT's
    runs log as `sft-<name>` to `loggers`."""
    import jax

    from jaxil.algorithms.irl.sources import fit_sft, rollouts
    from jaxil.data.preferences import dataset_id

    ds, env = _load(args)
    out = Path(args.out)
    sft = fit_sft(ds, seeds=args.seeds, base_seed=args.seed, hidden=args.sft_hidden,
                  batch_size=args.batch_size, updates=args.sft_updates,
                  eval_every=args.sft_updates, out_dir=out / "sft", resume=resume,
                  overwrite=overwrite, progress=progress,
                  data_identity=dict(dataset_id=dataset_id(ds)),
                  loggers=[prefixed(f, "sft-") for f in loggers])
    policy = sft.policy()
    key = jax.random.PRNGKey(args.seed + 7919)
    samples = {"init": rollouts(env, policy, sft.init_params, jax.random.fold_in(key, 1),
                                args.rollouts),
               "sft": rollouts(env, policy, sft.sft_params, jax.random.fold_in(key, 2),
                               args.rollouts)}
    return ds, env, sft, samples, key


def _reward_model(args) -> int:
    import jax
    import numpy as np

    from jaxil.algorithms.irl import best_of_n as bon
    from jaxil.algorithms.irl.reward_model import RewardModel, RewardModelConfig
    from jaxil.algorithms.irl.sources import fit_reward_model, source_data
    from jaxil.runs.io_atomic import atomic_write_text
    from jaxil.data.preferences import dataset_id
    from jaxil.runs.rundir import check_run_dir

    if args.updates % args.eval_every:
        raise ValueError(f"--updates ({args.updates}) must be a multiple of --eval-every "
                         f"({args.eval_every})")
    check_run_dir(args.out, resume=args.resume, overwrite=args.overwrite)  # before any work
    logs = make_loggers(args, args.out)
    cfg = RewardModelConfig(mixing=args.mixing, hidden=tuple(args.hidden),
                            batch_size=args.batch_size, grad_penalty=args.gp_coef > 0)
    ds, env, sft, samples, key = _pipeline(args, resume=args.resume, overwrite=args.overwrite,
                                           progress=not args.no_progress, loggers=logs)
    rm = RewardModel(ds.spec, cfg)
    data = source_data(args.source, ds.spec, ds, samples)
    # held-out π_SFT rollouts from shared start states: the ρ of every evaluation
    from jaxil.algorithms.irl.sources import rollouts

    held = rollouts(env, sft.policy(), sft.sft_params, jax.random.fold_in(key, 3), args.eval_episodes)
    true = np.asarray(held.episode_return, np.float64)  # [R, E]
    score_fn = jax.jit(jax.vmap(lambda p, e: rm.trajectory_scores(p, e, args.gamma)))

    def evaluate(params):
        s = np.asarray(score_fn(params, held), np.float64)
        if s.ndim == 3:  # per agent: the team's score is the sum
            s = s.sum(-1)
        return {"eval_spearman": np.array([bon.spearman_per_state(s[r:r + 1], true[r:r + 1])[0]
                                           for r in range(len(s))])}

    identity = dict(command="irl reward-model", source=args.source, dataset_id=dataset_id(ds),
                    sft=dict(hidden=list(args.sft_hidden), updates=args.sft_updates),
                    rollouts=args.rollouts, gamma=args.gamma, eval_episodes=args.eval_episodes)
    info = dict(dataset=args.dataset, data_seed=args.data_seed, seed=args.seed,
                sft_dir=str(Path(args.out) / "sft"))
    hp = rm.default_hparams(lr=args.lr, gp_coef=args.gp_coef)
    states, rows = fit_reward_model(
        rm, data, seeds=list(sft.seeds), base_seed=args.seed, hparams=hp, updates=args.updates,
        eval_every=args.eval_every, out_dir=args.out, resume=args.resume,
        overwrite=args.overwrite, progress=not args.no_progress, identity=identity, info=info,
        evaluate=evaluate, label=f"reward model {args.source}", loggers=logs)
    last = [r for r in rows if r["update"] == args.updates]
    summary = dict(source=args.source, env_id=ds.spec.env_id, updates=args.updates,
                   seeds=list(sft.seeds), sft_eval_return=sft.summary["points"][0]["returns"],
                   demo_return_mean=float(np.mean(ds.episode_return)),
                   final={k: [r[k] for r in last] for k in ("loss", "accuracy", "eval_spearman")})
    atomic_write_text(Path(args.out) / "results.json", json.dumps(summary, indent=2))
    acc, rho = np.mean(summary["final"]["accuracy"]), np.nanmean(summary["final"]["eval_spearman"])
    print(f"{args.source} on {ds.spec.env_id}: accuracy {acc:.3f}, Spearman ρ (learned vs true "
          f"return, held-out π_SFT rollouts) {rho:.3f}; π_SFT return "
          f"{np.mean(summary['sft_eval_return']):.3f}, demonstrations {summary['demo_return_mean']:.3f}")
    print(f"results in {args.out}")
    return 0


def _bon(args) -> int:
    import jax
    import numpy as np

    from jaxil.runs.io_atomic import atomic_write_text
    from jaxil.algorithms.irl import best_of_n as bon
    from jaxil.algorithms.irl.reward_model import RewardModel, RewardModelConfig, analytic_reward
    from jaxil.algorithms.irl.sources import init_reward_states
    from jaxil.runs.checkpoint import Checkpointer

    rdir = Path(args.reward)
    try:
        doc = json.loads((rdir / "run.json").read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"--reward {rdir} holds no run.json: pass a directory written by "
                                "`jaxil irl reward-model --out`") from None
    ident, info = doc.get("identity") or {}, doc
    if ident.get("command") != "irl reward-model":
        raise ValueError(f"--reward {rdir} is not a `jaxil irl reward-model` run")
    if args.rollouts < 1 or args.start_states < 1:
        raise ValueError("--rollouts and --start-states must be >= 1")
    saved = argparse.Namespace(
        dataset=info["dataset"], data_seed=info["data_seed"], seed=info["seed"],
        seeds=len(ident["seeds"]), sft_hidden=ident["sft"]["hidden"],
        sft_updates=ident["sft"]["updates"], batch_size=ident["config"]["batch_size"],
        rollouts=1, out=str(rdir))
    ds, env = _load(saved)
    from jaxil.algorithms.irl.sources import fit_sft
    from jaxil.data.preferences import dataset_id

    sft = fit_sft(ds, seeds=saved.seeds, base_seed=saved.seed, hidden=saved.sft_hidden,
                  batch_size=saved.batch_size, updates=saved.sft_updates,
                  eval_every=saved.sft_updates, out_dir=rdir / "sft", resume=True,
                  progress=False, data_identity=dict(dataset_id=dataset_id(ds)))
    c = dict(ident["config"])
    c["hidden"] = tuple(c["hidden"])
    rm = RewardModel(ds.spec, RewardModelConfig(**c))
    like = init_reward_states(rm, ident["seeds"], ident["base_seed"])
    ck = Checkpointer(rdir / "checkpoints")
    if ck.latest_step() is None:
        raise FileNotFoundError(f"--reward {rdir} has no checkpoint yet; train it first")
    states = ck.restore(like)
    ck.close()
    policy = sft.policy()
    key = jax.random.PRNGKey(args.seed)
    reset_keys = jax.random.split(jax.random.fold_in(key, 0), args.start_states)
    rkeys = jax.random.split(jax.random.fold_in(key, 1), len(sft.seeds))
    ep = jax.jit(jax.vmap(lambda p, k: bon.same_start_episodes(
        env, policy, p, reset_keys, k, args.rollouts)))(sft.sft_params, rkeys)
    true = np.asarray(ep.episode_return, np.float64)
    flat = jax.tree.map(lambda x: x.reshape((x.shape[0], -1) + x.shape[3:]), ep)
    s = np.asarray(jax.jit(jax.vmap(lambda p, e: rm.trajectory_scores(p, e, ident["gamma"])))(
        states.params, flat), np.float64)
    if s.ndim == 3:
        s = s.sum(-1)
    rc = np.asarray(jax.jit(jax.vmap(lambda a, b, e: analytic_reward(policy, a, policy, b, e)))(
        sft.sft_params, sft.init_params, flat), np.float64)
    ns = bon.powers_of_two(args.rollouts)
    per_seed = [bon.report({ident["source"]: s[r].reshape(true.shape[1:]),
                            "analytic": rc[r].reshape(true.shape[1:])}, true[r], ns)
                for r in range(true.shape[0])]
    demo = float(np.mean(ds.episode_return))
    result = dict(reward=str(rdir), source=ident["source"], env_id=ds.spec.env_id, ns=ns,
                  start_states=args.start_states, rollouts=args.rollouts, seed=args.seed,
                  demo_return_mean=demo, per_seed=per_seed)
    out = Path(args.out) if args.out else rdir / "bon.json"
    atomic_write_text(out, json.dumps(result, indent=2))
    mean = lambda f: (np.mean([f(p) for p in per_seed]), np.std([f(p) for p in per_seed]))  # noqa: E731
    print(f"best-of-N on {ds.spec.env_id}, {len(per_seed)} seeds; demonstrations {demo:.3f}, "
          f"π_SFT %.3f ± %.3f" % mean(lambda p: p["sft_mean"]))
    print(f"{'N':>5} {'oracle':>16} " + " ".join(f"{n:>22}" for n in (ident["source"], "analytic")))
    for i, n in enumerate(ns):
        cells = [mean(lambda p: p["oracle"][i])] + [
            mean(lambda p, k=k: p["rewards"][k]["curve"][i]) for k in (ident["source"], "analytic")]
        print(f"{n:>5} " + " ".join(f"{m:>10.3f} ± {sd:<5.3f}" for m, sd in cells))
    for k in (ident["source"], "analytic"):
        m, sd = mean(lambda p, k=k: p["rewards"][k]["spearman"])
        print(f"Spearman ρ per start state, {k}: {m:.3f} ± {sd:.3f}")
    print(f"results in {out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("irl", help="rewards learned from demonstrations: reward-model, bon, "
                       "ppo, gail, airl",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    isub = p.add_subparsers(dest="irl_command", metavar="IRL_COMMAND", required=True)

    r = isub.add_parser("reward-model", help="train a reward model for a sample source",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--dataset", required=True, help="demonstrations: dataset file or recipe name")
    r.add_argument("--data-seed", type=nonneg_int, default=0, help="seed when building a recipe")
    r.add_argument("--source", choices=SOURCES, default="init-sft")
    r.add_argument("--mixing", choices=MIXING, default="hyper",
                   help="hyper: team reward (hypernetwork mixer); sum; none: per agent")
    add_seeds(r)
    r.add_argument("--updates", type=positive_int, default=1000)
    r.add_argument("--eval-every", type=positive_int, default=250)
    r.add_argument("--eval-episodes", type=positive_int, default=64,
                   help="held-out π_SFT rollouts for the Spearman ρ")
    r.add_argument("--lr", type=positive_float, default=3e-4)
    r.add_argument("--gp-coef", type=nonneg_float, default=0.1, help="0: no gradient penalty")
    r.add_argument("--gamma", type=probability, default=1.0,
                   help="discount of trajectory scores (1: the plain sum, as r_c)")
    add_hidden(r, (64, 64), help="reward-model widths")
    r.add_argument("--batch-size", type=positive_int, default=256)
    r.add_argument("--sft-hidden", type=positive_int, nargs="+", default=[128, 128])
    r.add_argument("--sft-updates", type=positive_int, default=2000)
    r.add_argument("--rollouts", type=positive_int, default=128,
                   help="episodes of π_0 and π_SFT per seed")
    add_run_dir(r, required=True)
    add_loggers(r)
    add_progress(r)
    r.set_defaults(func=_reward_model)

    b = isub.add_parser("bon", help="best-of-N with a trained reward model")
    b.add_argument("--reward", required=True, help="a `jaxil irl reward-model` run directory")
    b.add_argument("--start-states", type=positive_int, default=8)
    b.add_argument("--rollouts", type=positive_int, default=256,
                   help="K rollouts of π_SFT per start state (N goes 1, 2, 4, ... K)")
    b.add_argument("--seed", type=nonneg_int, default=123)
    b.add_argument("--out", default=None, help="result file (default <reward>/bon.json)")
    b.set_defaults(func=_bon)
    adversarial.add_commands(isub)
    adversarial.add_aliases(sub)
