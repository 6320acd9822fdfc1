"""Which box-action likelihood lets BC learn MPE spread.

BC(D_E) on ``mpe-simple_spread_continuous/misodice-200e-1000p`` (the 200
expert trajectories, ground-truth labels) with each head of
:class:`jaxil.nn.policy.PolicyNet` — censored (clipped) Gaussian, tanh-Gaussian,
Beta — at the MisoDICE table's CPU settings (64-64, batch 256, 4 seeds, 2000
updates, 32 evaluation episodes) and, with ``--updates``, longer. The final
policies are also evaluated deterministically (clipped / squashed mean, Beta
mode), and their sampled actions on the expert's states are compared with the
expert's: the share of action components on a bound, and the mean absolute
error of the mode. Normalised return as the table: (R − R_random) /
(R_expert − R_random), from the dataset's tier sidecar.

    python experiments/misodice_table/box_heads.py                # 3 heads x 2000 updates
    python experiments/misodice_table/box_heads.py --updates 2000 10000
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxil import envs
from jaxil.nn import policy as policy_mod
from jaxil.cli.args import positive_int
from jaxil.algorithms.offline import LearnerData, make_learner
from jaxil.algorithms.offline.train import expand_grid, train
from jaxil.collect.comparison import tier_returns
from jaxil.collect.recipes import load_dataset
from jaxil.data.environment import dataset_env
from jaxil.data.labels import expert_labels

RECIPE = "mpe-simple_spread_continuous/misodice-200e-1000p"


def action_stats(learner, states, ds) -> dict:
    """On the expert's recorded states: the share of action components that
    the policy puts exactly on a bound (sampled), against the expert's, and the
    mean |mode − expert action| per component, mean over seeds."""
    low, high = ds.spec.action.low, ds.spec.action.high
    e, m = np.asarray(ds.expert).astype(bool), np.asarray(ds.mask).astype(bool)
    T = m.shape[1]  # obs holds T + 1 steps (the last next observation)
    obs = jnp.asarray(np.asarray(ds.obs)[:, :T][e][m[e]][:4096])  # [B, N, O]
    acts = np.asarray(ds.actions)[e][m[e]][:4096]
    act = jax.jit(jax.vmap(learner.act, in_axes=(0, None, None, 0, None)), static_argnums=4)
    keys = jax.random.split(jax.random.PRNGKey(7), jax.tree.leaves(states.params)[0].shape[0])
    sampled = np.asarray(act(states.params, obs, None, keys, False))
    mode = np.asarray(act(states.params, obs, None, keys, True))
    on = lambda a: float(np.mean((a <= low) | (a >= high)))  # noqa: E731
    return dict(expert_on_bound=on(acts), sampled_on_bound=on(sampled),
                mode_abs_err=float(np.abs(mode - acts[None]).mean()))


def spread_outcome(global_state, length, n_agents: int, n_landmarks: int) -> dict:
    """Where the agents end (MPE spread's global state: agent positions, then
    landmark positions): the mean distance from each landmark to its nearest
    agent at the final step (what the coverage reward scores), and the share
    of episodes whose agents end nearest to pairwise different landmarks
    (none left uncovered by two agents sharing one)."""
    g = np.asarray(global_state)
    g = g.reshape((-1,) + g.shape[-2:])
    last = np.take_along_axis(g, np.asarray(length).reshape(-1)[:, None, None], axis=1)[:, 0]
    agents = last[:, :2 * n_agents].reshape(-1, n_agents, 2)
    marks = last[:, 2 * n_agents:2 * (n_agents + n_landmarks)].reshape(-1, n_landmarks, 2)
    dist = np.linalg.norm(agents[:, :, None] - marks[:, None], axis=-1)  # [E, N, L]
    nearest = dist.argmin(-1)
    distinct = np.mean([len(set(row)) == min(n_agents, n_landmarks) for row in nearest])
    return dict(final_landmark_dist=float(dist.min(1).mean()), distinct_share=float(distinct))


def write_results(out_dir, argv, payload: dict, caption: str, lines: list[str]) -> None:
    """``results.json`` (``payload`` and the command) and ``table.md``
    (``caption``, the table ``lines``, the command) under ``out_dir``; prints
    the table."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cmd = "python " + " ".join([sys.argv[0]] + (sys.argv[1:] if argv is None else argv))
    (out / "results.json").write_text(json.dumps(dict(command=cmd, **payload), indent=2))
    (out / "table.md").write_text(caption + "\n\n" + "\n".join(lines) + f"\n\nCommand: `{cmd}`\n")
    print((out / "table.md").read_text())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--boxes", default=",".join(policy_mod.BOX_HEADS))
    p.add_argument("--updates", type=positive_int, nargs="+", default=[2000])
    p.add_argument("--seeds", type=positive_int, default=4)
    p.add_argument("--evals", type=positive_int, default=2)
    p.add_argument("--eval-episodes", type=positive_int, default=32)
    p.add_argument("--batch-size", type=positive_int, default=256)
    p.add_argument("--hidden", type=positive_int, nargs="+", default=[64, 64])
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "box_heads"))
    p.add_argument("--recipe", default=RECIPE,
                   help="the MPE-spread dataset (e.g. mpe-simple_spread_continuous/mix-2000e-1000p "
                        "for ten times the expert trajectories)")
    args = p.parse_args(argv)
    ds = load_dataset(args.recipe, 0)
    ref = tier_returns(args.recipe, 0)
    env = dataset_env(ds)
    data = LearnerData.from_dataset(ds, expert_labels(ds, "ground_truth"))
    norm = lambda r: (np.asarray(r) - ref["random"]) / (ref["expert"] - ref["random"])  # noqa: E731
    raw = env.raw
    n_agents, n_landmarks = int(raw.num_agents), int(raw.num_landmarks)
    from jaxil.envs.mpe import spread_expert
    from jaxil.envs.policies import as_policy

    ep = jax.jit(lambda k: envs.run_episodes(env, as_policy(spread_expert(env)), None, k,
                                             args.eval_episodes))(jax.random.PRNGKey(10_000))
    expert_outcome = spread_outcome(ep.global_state, ep.length, n_agents, n_landmarks)
    print("scripted expert", expert_outcome, flush=True)
    rows = []
    for updates in args.updates:
        for box in args.boxes.split(","):
            learner = make_learner("bc_expert", ds.spec, hidden=tuple(args.hidden),
                                   batch_size=args.batch_size, box=box)
            out = train(learner, env, data, runs=expand_grid({}, args.seeds), num_updates=updates,
                        eval_every=updates // args.evals, eval_episodes=args.eval_episodes,
                        progress=False)
            states = out["states"]
            det = jax.jit(jax.vmap(lambda prm, k: envs.run_episodes(
                env, learner.policy(True), prm, k, args.eval_episodes), in_axes=(0, None)))(
                states.params, jax.random.PRNGKey(10_000))
            det_ret = np.asarray(det.episode_return).mean(-1)
            outcome = spread_outcome(det.global_state, det.length, n_agents, n_landmarks)
            pt = out["points"][0]
            r = dict(box=box, updates=updates, seconds=out["wall_seconds"], returns=pt["returns"],
                     norm_mean=float(norm(pt["returns"]).mean()), norm_std=float(norm(pt["returns"]).std()),
                     det_returns=det_ret.tolist(), det_norm_mean=float(norm(det_ret).mean()),
                     det_norm_std=float(norm(det_ret).std()), **outcome,
                     **action_stats(learner, states, ds))
            rows.append(r)
            print(f"{box:<18}{updates:>6}  sampled {r['norm_mean']:.3f} ± {r['norm_std']:.3f}  "
                  f"deterministic {r['det_norm_mean']:.3f} ± {r['det_norm_std']:.3f}  "
                  f"on bound {r['sampled_on_bound']:.2f} (expert {r['expert_on_bound']:.2f})  "
                  f"|mode − a| {r['mode_abs_err']:.3f}  landmark dist {r['final_landmark_dist']:.3f} "
                  f"distinct {r['distinct_share']:.2f}  ({r['seconds']:.0f}s)", flush=True)
    lines = ["| head | updates | normalised return (sampled) | normalised return (deterministic) "
             "| action components on a bound, sampled (expert) | mean abs. error of the mode "
             "| final landmark–agent distance, deterministic (expert) "
             "| episodes ending on distinct landmarks (expert) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['box']} | {r['updates']} | {r['norm_mean']:.2f} ± {r['norm_std']:.2f} | "
                     f"{r['det_norm_mean']:.2f} ± {r['det_norm_std']:.2f} | "
                     f"{r['sampled_on_bound']:.2f} ({r['expert_on_bound']:.2f}) | {r['mode_abs_err']:.3f} | "
                     f"{r['final_landmark_dist']:.3f} ({expert_outcome['final_landmark_dist']:.3f}) | "
                     f"{r['distinct_share']:.2f} ({expert_outcome['distinct_share']:.2f}) |")
    write_results(args.out, argv, dict(tiers=ref, seeds=args.seeds, hidden=args.hidden,
                                       expert=expert_outcome, rows=rows),
                  f"BC(D_E) on `{args.recipe}`, {args.seeds} seeds, hidden {args.hidden}, batch "
                  f"{args.batch_size}, {args.eval_episodes} evaluation episodes per seed; mean ± std "
                  f"over seeds. Normalised: (R − R_random) / (R_expert − R_random), expert "
                  f"{ref['expert']:.3f}, random {ref['random']:.3f} (the dataset's measured tiers).",
                  lines)


if __name__ == "__main__":
    main()
