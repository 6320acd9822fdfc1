"""Does BC reach MPE spread's expert once D_E shows off-path states?

BC(D_E) on MPE spread (continuous) stays near 0.2–0.35 normalised, while DAgger
with the same student and expert reaches 0.73 (``results/mpe_interactive``):
the expert's demonstrations never leave its path, so BC never sees how to
recover. DART (Laskey et al., 2017) collects the demonstrations with noise
injected into the EXECUTED actions and records the expert's clean action at
every visited state. Here the scripted expert (:func:`envs.mpe.spread_expert`,
a function of each agent's observation alone, so its clean action is
recomputed exactly from the stored observation: ``expert_consistency.py``)
is rolled out with Gaussian noise of standard deviation σ on every action
component (clipped to the box), then relabelled. σ = 0 is plain D_E.

BC(D_E) is trained on each set at the MisoDICE table's CPU settings (the
censored head, 64-64, batch 256, 4 seeds) for 2000 updates (the table's) and
20 000, each from scratch, and evaluated in the
noise-free environment, sampled and deterministic. Normalised as the table:
(R − R_random) / (R_expert − R_random), from the dataset's tier sidecar.

    python experiments/misodice_table/dart.py     # σ ∈ {0, 0.4, 0.8} × {200, 1000} episodes
    python experiments/misodice_table/dart.py --sigmas 0 0.2 --episodes 200 --updates 2000
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxil import envs
from jaxil.envs.mpe import spread_expert
from jaxil.envs.policies import Policy, as_policy
from jaxil.cli.args import positive_int
from jaxil.data import Dataset
from jaxil.algorithms.offline import LearnerData, make_learner
from jaxil.algorithms.offline.train import expand_grid, train
from jaxil.collect.comparison import tier_returns

# The MPE-spread helpers of this folder's box_heads.py (a script's own folder is importable).
from box_heads import RECIPE, spread_outcome, write_results

ENV = "mpe:simple_spread_continuous"


def noisy(expert: Policy, spec, sigma: float) -> Policy:
    """``expert`` with N(0, σ²) added to every action component, clipped to the box."""
    lo, hi = spec.action.low, spec.action.high

    def act(params, obs, avail, key, carry):
        k_e, k_n = jax.random.split(key)
        a, carry = expert.act(params, obs, avail, k_e, carry)
        return jnp.clip(a + sigma * jax.random.normal(k_n, a.shape), lo, hi), carry

    return expert._replace(act=act, log_prob=None, entropy=None)


def dart_dataset(env, sigma: float, episodes: int, seed: int) -> Dataset:
    """``episodes`` rollouts of the σ-noised expert, every recorded action
    replaced by the clean expert's action at the recorded observation."""
    expert = as_policy(spread_expert(env))
    ep = jax.jit(lambda k: envs.run_episodes(env, noisy(expert, env.spec, sigma), None, k,
                                             episodes))(jax.random.PRNGKey(seed))
    clean = jax.jit(jax.vmap(jax.vmap(lambda o: expert.act(None, o, None, jax.random.PRNGKey(0),
                                                           None)[0])))
    T = ep.actions.shape[1]
    labels = jnp.where(ep.mask[..., None, None], clean(ep.obs[:, :T]), 0.0)
    return Dataset.from_episodes(ep.replace(actions=labels), env.spec, "expert",
                                 f"spread-expert+dart(sigma={sigma})", seed, expert=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.0, 0.4, 0.8])
    p.add_argument("--episodes", type=positive_int, nargs="+", default=[200, 1000],
                   help="expert episodes per set (D_E has 200)")
    p.add_argument("--updates", type=positive_int, nargs="+", default=[2000, 20000],
                   help="training lengths, each trained from scratch")
    p.add_argument("--seeds", type=positive_int, default=4)
    p.add_argument("--eval-episodes", type=positive_int, default=128)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "dart"))
    args = p.parse_args(argv)
    if any(not (np.isfinite(s) and s >= 0) for s in args.sigmas):
        p.error(f"--sigmas must be finite and >= 0, got {args.sigmas}")
    ref = tier_returns(RECIPE, 0)
    if not ref:
        p.error(f"no tier returns for {RECIPE}: build it first (jaxil data build {RECIPE})")
    norm = lambda r: (np.asarray(r) - ref["random"]) / (ref["expert"] - ref["random"])  # noqa: E731
    env = envs.make(ENV)
    n_agents, n_landmarks = int(env.raw.num_agents), int(env.raw.num_landmarks)
    learner = make_learner("bc_expert", env.spec, hidden=(64, 64), batch_size=256)
    rows = []
    for episodes, sigma, updates in [(e, s, u) for e in args.episodes for s in args.sigmas
                                     for u in args.updates]:
        ds = dart_dataset(env, sigma, episodes, seed=1)
        data = LearnerData.from_dataset(ds, np.ones(ds.num_trajectories, bool))
        out = train(learner, env, data, runs=expand_grid({}, args.seeds), num_updates=updates,
                    eval_every=updates, eval_episodes=args.eval_episodes, progress=False)
        det = jax.jit(jax.vmap(lambda prm, k: envs.run_episodes(
            env, learner.policy(True), prm, k, args.eval_episodes), in_axes=(0, None)))(
            out["states"].params, jax.random.PRNGKey(10_000))
        det_ret = np.asarray(det.episode_return).mean(-1)
        sampled = out["points"][0]["returns"]
        r = dict(sigma=sigma, episodes=episodes, updates=updates, data_return=float(np.mean(ds.episode_return)),
                 sampled=float(norm(sampled).mean()), sampled_std=float(norm(sampled).std()),
                 det=float(norm(det_ret).mean()), det_std=float(norm(det_ret).std()),
                 returns=list(map(float, sampled)), det_returns=det_ret.tolist(),
                 seconds=out["wall_seconds"],
                 **spread_outcome(det.global_state, det.length, n_agents, n_landmarks))
        rows.append(r)
        print(f"{episodes:>5} episodes  sigma {sigma:<5} {updates:>6} updates  data return {r['data_return']:8.2f}  BC sampled {r['sampled']:.3f} ± "
              f"{r['sampled_std']:.3f}  deterministic {r['det']:.3f} ± {r['det_std']:.3f}  "
              f"distinct {r['distinct_share']:.2f}  ({r['seconds']:.0f}s)", flush=True)
    lines = ["| expert episodes | σ (executed-action noise) | updates | return of the noisy rollouts "
             "| BC sampled | BC deterministic | episodes ending on distinct landmarks |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['episodes']} | {r['sigma']:g} | {r['updates']} | {r['data_return']:.2f} | "
              f"{r['sampled']:.2f} ± {r['sampled_std']:.2f} | {r['det']:.2f} ± {r['det_std']:.2f} | "
              f"{r['distinct_share']:.2f} |" for r in rows]
    write_results(args.out, argv, dict(tiers=ref, rows=rows, **vars(args)),
                  f"BC(D_E) on DART-relabelled expert episodes of `{ENV}`, {args.seeds} seeds, 64-64, "
                  f"batch 256, censored head; {args.eval_episodes} evaluation episodes per seed in the "
                  f"noise-free environment; normalised with expert {ref['expert']:.2f}, random "
                  f"{ref['random']:.2f}.", lines)

if __name__ == "__main__":
    main()
