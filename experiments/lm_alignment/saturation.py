"""Where the sequence reward models start: each source's episode scores and
the two terms of the discriminator loss at π_SFT's parameters, before the
first update.

The reward model reads the logit of each emitted token and starts from
π_SFT (``jaxil.algorithms.lm.reward``), so its first score of an episode is
the sum of π_SFT's logits over the episode's agent tokens. Where π_SFT is
confident, that sum is large for π_SFT's own and the demonstrator's
episodes, ``softplus(−S)`` underflows and the positive term gives no
gradient: the Init–SFT and Init–Demo models then learn from their shared
negatives (π_0's episodes) alone and end the same. This script measures it
on the experiment's own runs (``run.py`` first; SFT and the expert LM are
restored from ``--out/runs``, nothing is trained).

    python experiments/lm_alignment/saturation.py   # writes --out/saturation.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import run as experiment  # noqa: E402  (this folder's driver: its tasks and demonstrators)


def measure(env_id: str, runs: Path, seeds: int, demos: int, sft_updates: int,
            episodes: int = 64) -> dict:
    import jax

    from jaxil import envs
    from jaxil.algorithms.lm import reward as R
    from jaxil.algorithms.lm import sft

    task = experiment.TASKS[env_id]
    env = envs.make(env_id, **task["knobs"])
    runs = runs / env_id.replace(":", "-")
    if not (runs / "sft").exists():
        raise SystemExit(f"saturation.py: error: {runs / 'sft'} does not exist; run "
                         f"`python experiments/lm_alignment/run.py --tasks {env_id}` first")
    demonstrator, demo_params, _ = experiment.demonstrator_of(env, task, False, runs)
    demo_eps = sft.collect_demos(env, demonstrator, demo_params, jax.random.PRNGKey(1), demos)
    held = sft.collect_demos(env, demonstrator, demo_params, jax.random.PRNGKey(2), 64)
    cfg = sft.SFTConfig(batch_episodes=16, num_updates=sft_updates, eval_every=sft_updates // 2,
                        eval_episodes=128, deterministic_eval=False)  # run.py's, to restore
    res = sft.train_sft(env, demo_eps, cfg, seeds=list(range(seeds)), heldout=held,
                        out_dir=runs / "sft", resume=True, progress=False)
    student = sft.make_student(env, cfg)
    rm = R.SequenceRewardModel(env, R.SequenceRewardConfig(read="token"))
    scores = jax.jit(rm.scores)
    softplus = lambda x: np.logaddexp(0.0, x)  # noqa: E731
    out = {role: [] for role in ("init", "sft", "demo")}
    for s in range(seeds):
        params = jax.tree.map(lambda x: x[s], res.state.params)
        init = sft.initial_params(student, s)
        roles = {
            "init": R.policy_episodes(env, student, jax.tree.map(lambda x: x[None], init),
                                      jax.random.PRNGKey(3), episodes),
            "sft": R.policy_episodes(env, student, jax.tree.map(lambda x: x[None], params),
                                     jax.random.PRNGKey(4), episodes),
        }
        roles = {k: jax.tree.map(lambda x: x[0], v) for k, v in roles.items()}
        roles["demo"] = demo_eps.take(slice(0, episodes))
        for role, eps in roles.items():
            sc = np.asarray(scores(params, eps), np.float64)
            out[role].append(dict(score_median=float(np.median(sc)), score_min=float(sc.min()),
                                  positive_term=float(softplus(-sc).mean()),
                                  negative_term=float(softplus(sc).mean())))
    return {role: {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
            for role, rows in out.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=list(experiment.TASKS),
                   choices=list(experiment.TASKS))
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--demos", type=int, default=512)
    p.add_argument("--sft-updates", type=int, default=300)
    args = p.parse_args(argv)
    out = Path(args.out)
    result = {t: measure(t, out / "runs", args.seeds, args.demos, args.sft_updates)
              for t in args.tasks}
    (out / "saturation.json").write_text(json.dumps(result, indent=1))
    print("| task | role | median score S | min S | mean softplus(−S) (positive term) "
          "| mean softplus(S) (negative term) |\n|---|---|---|---|---|---|")
    for t, roles in result.items():
        for role, r in roles.items():
            print(f"| {t} | {role} | {r['score_median']:.1f} | {r['score_min']:.1f} | "
                  f"{r['positive_term']:.2e} | {r['negative_term']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
