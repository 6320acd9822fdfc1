"""Why does π_SFT fall below the ε-noised demonstrator it clones?

BC that fitted the demonstrator's per-agent action law
``ideal = (1 − ε)·p_E(·|o) + ε·U(avail)`` would return what the demonstrator
returns. For the scripted experts of LevelBasedForaging and MPE spread the
expert's law p_E is computable at every recorded state (the expert is
sampled ``--expert-samples`` times there: LBF breaks ties and jitters at
random, MPE's expert is deterministic), so this script measures, per
environment:

1. **alignment** of the recorded (obs, action) pairs: the share of recorded
   actions equal to the expert's modal action at the recorded observation,
   against the share the ideal law predicts, and the cross-entropy of the
   recorded actions under the ideal law against its entropy (equal in
   expectation when the pairs line up);
2. **π_SFT against the ideal law** on the BC training trajectories and on
   held-out ones: cross-entropy of the recorded actions, entropy,
   probability of the expert's modal action, KL(ideal ‖ π_SFT), and the
   return (the same BC as ``best_of_n.py``: bc_union, 128×128, batch 256,
   lr 3e-4, ``--updates``);
3. the same BC on **noise-free expert** trajectories (ε = 0, same count):
   does BC reach the expert?
4. the same BC on ``--big`` trajectories of the same ε-noised demonstrator:
   does more data close the gap?

    python experiments/irl/diagnose_sft.py --no-progress   # both envs (wall time: README.md)

Writes ``results/diagnose_sft.json`` and prints one table per environment.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

ENV_IDS = ("jumanji:LevelBasedForaging-v0", "mpe:simple_spread")


def expert_law(expert, obs, avail, key, samples: int, chunk: int = 2048):
    """``p_E [T, N, A]``: the expert's action frequencies over ``samples``
    draws at each of the ``T`` observations ``obs [T, N, O]``."""
    import jax
    import jax.numpy as jnp

    num_actions = avail.shape[-1]

    def one(o, av, k):
        acts = jax.vmap(lambda kk: expert(None, o, av, kk))(jax.random.split(k, samples))
        return jax.nn.one_hot(acts, num_actions).mean(0)

    fn = jax.jit(jax.vmap(one))
    out = []
    for s in range(0, obs.shape[0], chunk):
        keys = jax.random.split(jax.random.fold_in(key, s), min(chunk, obs.shape[0] - s))
        out.append(np.asarray(fn(jnp.asarray(obs[s:s + chunk]), jnp.asarray(avail[s:s + chunk]),
                                 keys)))
    return np.concatenate(out)


def law_stats(actions, avail, ideal, probs=None) -> dict:
    """Per-agent-step means over ``[T, N]``; ``probs`` (π_SFT's law) optional."""
    eps_log = 1e-12
    mode = ideal.argmax(-1)  # the expert's modal action (ideal's argmax is p_E's)
    pick = lambda p, a: np.take_along_axis(p, a[..., None], -1)[..., 0]  # noqa: E731
    ent = lambda p: -(p * np.log(np.clip(p, eps_log, 1))).sum(-1)  # noqa: E731
    out = dict(agent_steps=int(actions.size),
               recorded_is_expert_mode=float((actions == mode).mean()),
               ideal_prob_expert_mode=float(pick(ideal, mode).mean()),
               ce_ideal=float(-np.log(np.clip(pick(ideal, actions), eps_log, 1)).mean()),
               entropy_ideal=float(ent(ideal).mean()),
               mean_available=float(avail.sum(-1).mean()))
    if probs is not None:
        out.update(ce_pi=float(-np.log(np.clip(pick(probs, actions), eps_log, 1)).mean()),
                   entropy_pi=float(ent(probs).mean()),
                   pi_prob_expert_mode=float(pick(probs, mode).mean()),
                   pi_argmax_is_expert_mode=float((probs.argmax(-1) == mode).mean()),
                   kl_ideal_pi=float((ideal * (np.log(np.clip(ideal, eps_log, 1))
                                               - np.log(np.clip(probs, eps_log, 1)))).sum(-1).mean()))
    return out


def bc_laws(ds_train, test_sets: dict, args) -> tuple[dict, dict]:
    """Fit π_SFT (``best_of_n.py``'s BC) on ``ds_train``; return its eval
    returns and its action law ``[R, T, N, A]`` on each test set's obs."""
    import jax
    import jax.numpy as jnp

    from jaxil.algorithms.irl.sources import fit_sft
    from jaxil.nn.policy import PolicyNet

    sft = fit_sft(ds_train, seeds=args.seeds, hidden=args.hidden, batch_size=args.batch_size,
                  updates=args.updates, eval_every=args.updates, eval_episodes=args.eval_episodes,
                  lr=args.lr,
                  progress=not args.no_progress)
    net = PolicyNet(ds_train.spec, tuple(args.hidden), True)

    def law(p, obs, avail):
        logits = net.head(p["policy"], obs)
        return jax.nn.softmax(jnp.where(avail, logits, -1e9), -1)

    fn = jax.jit(jax.vmap(law, in_axes=(0, None, None)))
    laws = {name: np.asarray(fn(sft.sft_params, jnp.asarray(o), jnp.asarray(a)))
            for name, (o, a) in test_sets.items()}
    return dict(returns=sft.summary["points"][0]["returns"]), laws


def transitions(ds):
    from jaxil.data.sampling import flatten_transitions

    t = flatten_transitions(ds)
    return (np.asarray(t.obs), np.asarray(t.avail), np.asarray(t.actions))


def run_env(env_id: str, args) -> dict:
    import jax

    from jaxil import envs
    from jaxil.envs.experts import scripted_expert
    from jaxil.collect.demonstrations import demonstrations
    from jaxil.data.format import Dataset
    from jaxil.collect.zoo import make_zoo

    t0 = time.perf_counter()
    ds, info = demonstrations(env_id, args.demos, seed=0)
    eps = info["epsilon"]
    env = envs.make(env_id)
    expert = scripted_expert(env)[0]
    key = jax.random.PRNGKey(7)
    n_train = int(round(args.demos * 0.8))
    parts = dict(train=ds.select(np.arange(n_train)),
                 heldout=ds.select(np.arange(n_train, args.demos)))
    data = {k: transitions(v) for k, v in parts.items()}

    def ideal_of(obs, avail, e, salt):
        p_e = expert_law(expert, obs, avail, jax.random.fold_in(key, salt), args.expert_samples)
        uni = avail / avail.sum(-1, keepdims=True)
        return (1 - e) * p_e + e * uni

    ideals = {k: ideal_of(o, a, eps, i) for i, (k, (o, a, _)) in enumerate(data.items())}
    t_law = time.perf_counter()
    sft_eval, laws = bc_laws(parts["train"], {k: v[:2] for k, v in data.items()}, args)
    res = dict(env_id=env_id, epsilon=eps, demos=args.demos, train_trajectories=n_train,
               demonstrator_return=info["demo_return_mean"],
               expert_return=info["expert_return_mean"], sft_return=sft_eval["returns"],
               noisy={k: [law_stats(data[k][2], data[k][1], ideals[k], laws[k][r])
                          for r in range(args.seeds)] for k in data})
    t_sft = time.perf_counter()

    # BC on noise-free expert trajectories, and on many more noised ones.
    zoo = make_zoo(env_id, epsilons={"medium": eps}, discover=False)
    extra = {"clean": ("expert", 0.0, args.demos), "big": ("medium", eps, args.big)}
    for name, (tier, e, count) in extra.items():
        if count <= 0:
            continue
        seeds = np.arange(count) + (1_000_000 if name == "clean" else 2_000_000)
        eps_np = zoo.collect(tier, seeds)
        dsx = Dataset.from_episodes(eps_np, env.spec, tier=tier, source=zoo[tier].source,
                                    seed=seeds, check=False)
        n_tr = int(round(count * 0.8))
        tr, ho = dsx.select(np.arange(n_tr)), dsx.select(np.arange(n_tr, count))
        o, a, act = transitions(ho)
        ideal = ideal_of(o, a, e, 10 + len(name))
        ev, lw = bc_laws(tr, {"heldout": (o, a)}, args)
        res[name] = dict(epsilon=e, trajectories=count, train_trajectories=n_tr,
                         data_return=float(np.asarray(dsx.episode_return).mean()),
                         sft_return=ev["returns"],
                         heldout=[law_stats(act, a, ideal, lw["heldout"][r])
                                  for r in range(args.seeds)])
    res["wall_seconds"] = dict(expert_law=t_law - t0, sft=t_sft - t_law,
                               total=time.perf_counter() - t0)
    return res


def report(res: dict) -> str:
    def mean(rows, k):
        return float(np.mean([r[k] for r in rows]))

    lines = [f"== {res['env_id']} (ε={res['epsilon']}): demonstrator {res['demonstrator_return']:.3f}, "
             f"expert {res['expert_return']:.3f}",
             f"{'data / split':<22}{'return':>16}{'rec=mode':>9}{'ideal':>7}{'π(mode)':>8}"
             f"{'argmax':>7}{'CE π':>7}{'CE id':>7}{'H π':>7}{'H id':>7}{'KL':>7}"]

    def row(label, rows, ret):
        r = np.asarray(ret)
        lines.append(f"{label:<22}{r.mean():>9.3f}±{r.std():<6.3f}"
                     f"{mean(rows, 'recorded_is_expert_mode'):>9.3f}{mean(rows, 'ideal_prob_expert_mode'):>7.3f}"
                     f"{mean(rows, 'pi_prob_expert_mode'):>8.3f}{mean(rows, 'pi_argmax_is_expert_mode'):>7.3f}"
                     f"{mean(rows, 'ce_pi'):>7.3f}{mean(rows, 'ce_ideal'):>7.3f}"
                     f"{mean(rows, 'entropy_pi'):>7.3f}{mean(rows, 'entropy_ideal'):>7.3f}"
                     f"{mean(rows, 'kl_ideal_pi'):>7.3f}")

    for split, rows in res["noisy"].items():
        row(f"ε={res['epsilon']} {res['demos']}d {split}", rows, res["sft_return"])
    for name in ("clean", "big"):
        if name in res:
            x = res[name]
            row(f"ε={x['epsilon']} {x['trajectories']}d heldout", x["heldout"], x["sft_return"])
            lines[-1] += f"   (data return {x['data_return']:.3f})"
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=list(ENV_IDS))
    p.add_argument("--demos", type=int, default=200)
    p.add_argument("--big", type=int, default=1000, help="noised trajectories of step 4 (0: skip)")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--updates", type=int, default=2000)
    p.add_argument("--lr", type=float, default=None, help="BC's Adam lr (default: bc_union's)")
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 128])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--eval-episodes", type=int, default=64)
    p.add_argument("--expert-samples", type=int, default=16)
    p.add_argument("--out", default=str(ROOT / "experiments" / "irl" / "results" / "diagnose_sft.json"))
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    results = []
    for env_id in args.envs:
        res = run_env(env_id, args)
        print(report(res), flush=True)
        results.append(res)
    wall = time.perf_counter() - t0
    cmd = "python experiments/irl/diagnose_sft.py " + " ".join(sys.argv[1:] if argv is None else argv)
    Path(args.out).write_text(json.dumps(dict(command=cmd.strip(), wall_seconds=wall,
                                              settings=vars(args), results=results), indent=1))
    print(f"wall time {wall:.0f} s; {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
