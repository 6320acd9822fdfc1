"""Best-of-N with learned rewards against an ε-noised demonstrator.

Per environment (SMAX 3m, LevelBasedForaging, MPE spread; demonstrations of
:mod:`jaxil.collect.demonstrations`) and for 4 seeds vmapped in every program:

1. π_SFT = BC on the demonstrations; π_0 = the same network at its
   initialisation (:func:`jaxil.algorithms.irl.sources.fit_sft`).
2. Rollouts of π_0 and π_SFT (``--source-rollouts`` per seed).
3. One reward model per source (Init–SFT, Init–Demo, SFT–Demo: team logits
   with the hypernetwork mixer), plus the analytic r_c = log π_SFT − log π_0.
4. Best-of-N: M start states × K = 256 rollouts of π_SFT from the same reset
   key, one vmapped program; curves over N = 1, 2, …, 256 as the exact
   expectation over N-subsets of the K rollouts (:mod:`jaxil.algorithms.irl.best_of_n`);
   per-state Spearman ρ of each reward against the true return.

Writes ``results.json``, ``table.md`` and ``bon_<env>.png`` into ``--out``;
each environment is cached in ``--out/.cache-<env>.json`` (a killed run
resumes at the environment it stopped in; ``--fresh`` ignores the caches).

    python experiments/irl/best_of_n.py              # CPU size (README.md: wall time)
    python experiments/irl/best_of_n.py --scale 4    # 4x updates and rollouts
    python experiments/irl/best_of_n.py --quick      # a smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

SOURCE_LABELS = {"init-sft": "Init–SFT", "init-demo": "Init–Demo", "sft-demo": "SFT–Demo",
                 "analytic": "r_c (analytic)"}


def run_env(env_id: str, args) -> dict:
    import jax

    from jaxil import envs
    from jaxil.collect.demonstrations import demonstrations
    from jaxil.algorithms.irl import best_of_n as bon
    from jaxil.algorithms.irl.reward_model import SOURCES, RewardModel, RewardModelConfig, analytic_reward
    from jaxil.algorithms.irl.sources import fit_reward_model, fit_sft, rollouts, source_data

    t0 = time.perf_counter()
    ds, info = demonstrations(env_id, args.demos, seed=0, progress=False)
    spec = ds.spec
    env = envs.make(spec.env_id)
    seeds = args.seeds
    sft = fit_sft(ds, seeds=seeds, hidden=args.hidden, batch_size=args.batch_size,
                  updates=args.sft_updates, eval_every=args.sft_updates,
                  eval_episodes=64, progress=not args.no_progress)
    policy = sft.policy()
    key = jax.random.PRNGKey(2024)
    samples = {"init": rollouts(env, policy, sft.init_params, jax.random.fold_in(key, 1),
                                args.source_rollouts),
               "sft": rollouts(env, policy, sft.sft_params, jax.random.fold_in(key, 2),
                               args.source_rollouts)}
    t_sources = time.perf_counter()
    # Best-of-N rollouts: the same M start states for every seed.
    reset_keys = jax.random.split(jax.random.fold_in(key, 3), args.start_states)
    # One seed at a time (the same keys as a vmap over seeds; a vmap holds all
    # R·M·K episodes at once, which SMAX 2s3z's 5 × 127 observations do not
    # fit in 23 GB), kept on the host.
    bon_fn = jax.jit(lambda p, k: bon.same_start_episodes(env, policy, p, reset_keys, k, args.k))
    nseeds = len(sft.seeds)
    per_seed_params = lambda tree, r: jax.tree.map(lambda x: x[r], tree)  # noqa: E731
    flat = []  # per seed: Episodes [M*K, ...] (numpy)
    true = []
    for r in range(nseeds):
        ep = jax.device_get(bon_fn(per_seed_params(sft.sft_params, r),
                                   jax.random.fold_in(jax.random.fold_in(key, 4), r)))
        true.append(np.asarray(ep.episode_return, np.float64))  # [M, K]
        flat.append(jax.tree.map(lambda x: np.asarray(x).reshape((-1,) + x.shape[2:]), ep))
        del ep
    true = np.stack(true)  # [R, M, K]
    t_bon = time.perf_counter()

    rm = RewardModel(spec, RewardModelConfig(mixing=args.mixing, hidden=tuple(args.rm_hidden),
                                             batch_size=args.batch_size))
    scores, fits = {}, {}
    for source in SOURCES:
        data = source_data(source, spec, ds, samples)
        states, rows = fit_reward_model(rm, data, seeds=list(sft.seeds),
                                        updates=args.rm_updates,
                                        eval_every=args.rm_updates // 4,
                                        progress=not args.no_progress, label=source)
        score_fn = jax.jit(lambda p, e: rm.trajectory_scores(p, e, args.gamma))
        s = np.stack([np.asarray(score_fn(per_seed_params(states.params, r), flat[r]), np.float64)
                      for r in range(nseeds)])
        if s.ndim == 3:  # per-agent rewards: the team's score is the sum
            s = s.sum(-1)
        scores[source] = s.reshape(true.shape)
        last = [r for r in rows if r["update"] == args.rm_updates]
        fits[source] = dict(accuracy=[r["accuracy"] for r in last],
                            loss=[r["loss"] for r in last])
    rc_fn = jax.jit(lambda ps, p0, e: analytic_reward(policy, ps, policy, p0, e))
    rc = np.stack([np.asarray(rc_fn(per_seed_params(sft.sft_params, r),
                                    per_seed_params(sft.init_params, r), flat[r]), np.float64)
                   for r in range(nseeds)])
    scores["analytic"] = rc.reshape(true.shape)
    t_rm = time.perf_counter()

    ns = bon.powers_of_two(args.k)
    per_seed = [bon.report({k: v[r] for k, v in scores.items()}, true[r], ns)
                for r in range(true.shape[0])]
    sft_eval = [p["returns"] for p in sft.summary["points"]][0]
    out = dict(env_id=env_id, demos=info, ns=ns, seeds=list(sft.seeds),
               start_states=args.start_states, k=args.k, gamma=args.gamma,
               sft_eval_return=sft_eval, per_seed=per_seed, fits=fits,
               wall_seconds=dict(sft_and_sources=t_sources - t0, bon_rollouts=t_bon - t_sources,
                                 reward_models=t_rm - t_bon, total=time.perf_counter() - t0))
    return out


def summarize(res: dict) -> dict:
    """Mean ± std over seeds of every curve point and ρ."""
    ps = res["per_seed"]

    def ms(vals):
        v = np.asarray(vals, np.float64)
        return [float(v.mean(0).tolist()) if v.ndim == 1 else v.mean(0).tolist(),
                float(v.std(0)) if v.ndim == 1 else v.std(0).tolist()]

    out = dict(sft_mean=ms([p["sft_mean"] for p in ps]), oracle=ms([p["oracle"] for p in ps]),
               rewards={})
    for name in ps[0]["rewards"]:
        rs = [p["rewards"][name] for p in ps]
        out["rewards"][name] = dict(curve=ms([r["curve"] for r in rs]),
                                    spearman=ms([r["spearman"] for r in rs]),
                                    spearman_pooled=ms([r["spearman_pooled"] for r in rs]))
    return out


def table(results: list[dict]) -> str:
    lines = ["| env | demonstrator (ε) | π_SFT | oracle BoN@K | " + " | ".join(
        f"{SOURCE_LABELS[s]} BoN@K (ρ)" for s in SOURCE_LABELS) + " |",
        "|" + "---|" * (4 + len(SOURCE_LABELS))]
    for res in results:
        s = res["summary"]
        d = res["demos"]
        cell = lambda m, sd: f"{m:.3f} ± {sd:.3f}"  # noqa: E731
        row = [res["env_id"], f"{d['demo_return_mean']:.3f} (ε={d['epsilon']})",
               cell(*s["sft_mean"]), cell(s["oracle"][0][-1], s["oracle"][1][-1])]
        for name in SOURCE_LABELS:
            r = s["rewards"][name]
            beat = r["curve"][0][-1] - r["curve"][1][-1] > d["demo_return_mean"]
            row.append(f"{cell(r['curve'][0][-1], r['curve'][1][-1])}{' **>demo**' if beat else ''}"
                       f" (ρ {r['spearman'][0]:.2f} ± {r['spearman'][1]:.2f})")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, ns = res["summary"], np.asarray(res["ns"])
    fig, ax = plt.subplots(figsize=(6, 4))
    series = [("oracle", s["oracle"], "k")] + [
        (SOURCE_LABELS[n], s["rewards"][n]["curve"], c)
        for n, c in zip(SOURCE_LABELS, ("C0", "C1", "C3", "C2"))]
    for label, (m, sd), c in series:
        m, sd = np.asarray(m), np.asarray(sd)
        ax.plot(ns, m, marker="o", ms=3, color=c, label=label)
        ax.fill_between(ns, m - sd, m + sd, color=c, alpha=0.15)
    ax.axhline(s["sft_mean"][0], color="grey", ls=":", label="π_SFT mean")
    ax.axhline(res["demos"]["demo_return_mean"], color="m", ls="--",
               label=f"demonstrator (ε={res['demos']['epsilon']})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N (rollouts of π_SFT from one start state)")
    ax.set_ylabel("true return of the pick")
    ax.set_title(f"best-of-N, {res['env_id']} ({len(res['seeds'])} seeds, ±1 std)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    from jaxil.collect.demonstrations import NOISED_EXPERTS

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=[e for e in NOISED_EXPERTS if e != "smax:2s3z"],
                   help="default: the issue's three (smax:2s3z: README.md, its own command)")
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--demos", type=int, default=200)
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply updates and source rollouts")
    p.add_argument("--quick", action="store_true", help="a smoke run (tiny sizes)")
    p.add_argument("--start-states", type=int, default=8)
    p.add_argument("--k", type=int, default=256, help="rollouts per start state")
    p.add_argument("--mixing", default="hyper", choices=("hyper", "sum", "none"))
    p.add_argument("--gamma", type=float, default=1.0, help="discount of trajectory scores")
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 128], help="π_SFT")
    p.add_argument("--rm-hidden", type=int, nargs="+", default=[64, 64])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--out", default=str(ROOT / "experiments" / "irl" / "results"))
    p.add_argument("--sft-updates", type=int, default=None, help="override (after --scale)")
    p.add_argument("--fresh", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    base = dict(sft_updates=2000, rm_updates=1000, source_rollouts=128)
    if args.quick:
        base = dict(sft_updates=100, rm_updates=40, source_rollouts=8)
        args.seeds, args.start_states, args.k, args.demos = 2, 2, 8, 20
    sft_override = args.sft_updates
    for k, v in base.items():
        setattr(args, k, max(4, int(round(v * (1 if args.quick else args.scale)))))
    if sft_override is not None:
        args.sft_updates = sft_override
    args.rm_updates -= args.rm_updates % 4
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = []
    for env_id in args.envs:
        cache = out / f".cache-{env_id.replace(':', '_')}.json"
        settings = {k: v for k, v in vars(args).items() if k not in ("fresh", "no_progress", "envs", "out")}
        if cache.exists() and not args.fresh:
            doc = json.loads(cache.read_text())
            if doc.get("settings") == settings:
                results.append(doc)
                print(f"{env_id}: cached")
                continue
        print(f"== {env_id}", flush=True)
        res = run_env(env_id, args)
        res["summary"] = summarize(res)
        res["settings"] = settings
        cache.write_text(json.dumps(res))
        results.append(res)
        print(table([res]), flush=True)
    for res in results:
        plot(res, out / f"bon_{res['env_id'].replace(':', '_')}.png")
    md = table(results)
    wall = time.perf_counter() - t0
    cmd = "python experiments/irl/best_of_n.py " + " ".join(sys.argv[1:] if argv is None else argv)
    (out / "table.md").write_text(
        f"Command: `{cmd.strip()}`; this invocation's wall time {wall:.0f} s "
        f"(per environment: " + ", ".join(
            f"{r['env_id']} {r['wall_seconds']['total']:.0f} s" for r in results) + ").\n\n"
        + md + "\n")
    (out / "results.json").write_text(json.dumps(
        [{k: v for k, v in r.items()} for r in results], indent=1))
    print(md)
    print(f"wall time {wall:.0f} s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
