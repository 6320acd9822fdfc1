"""Alignment from demonstrations with a pretrained chat model: an Init–SFT
reward model on SmolLM2 and best-of-N of the SFT model, against the
demonstrator.

    python experiments/lm_chat/afd.py                # the CPU run
    python experiments/lm_chat/afd.py --scale 4      # 4× the episodes and updates (a GPU)

In the chat form of a token task (free decoding):

1. π_0 is the pretrained model; π_SFT is the same model fine-tuned on
   `--demos` of the transcript-only expert's chats (the matching run of
   `sft_demos.py`, restored from its run directory when it is there). The
   demonstrator is that expert.
2. Sources: `--source-episodes` sampled chats of π_0 (negatives) and of
   π_SFT (positives), a quarter of each held out.
3. Rewards: the analytic r_c = log π_SFT(τ) − log π_0(τ) (AfD's optimum of
   the Init–SFT discriminator, no training), and a learned Init–SFT
   reward model started from π_SFT (AfD's initialisation), read once at the
   episode's last assistant token (`--read last`; the model's raw logits
   summed over tokens start at hundreds and grow with length).
4. Best-of-N: `--prompts` instances × `--rollouts` sampled chats of π_SFT
   each, picked by each reward; the exact expected success and return of
   the pick for N = 1, 2, 4, …, against π_SFT's mean, the oracle and the
   demonstrator on the same instances.

Writes `afd_ops<k>[-d<demos>].json` (the table's numbers and every sampled
chat's success, length and scores), `afd_ops<k>[-d<demos>]_picks.txt` (each
prompt's chat that r_c ranks first, beside its best-ranked success when that
pick fails) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np

import jaxil.lm
from jaxil import envs
from jaxil.algorithms.lm import best_of_n as B
from jaxil.algorithms.lm import reward as R
from jaxil.envs.token_chat import ChatEnv, chat_expert, chat_text
from jaxil.nn.task_vocab import chat_model
from jaxil.nn.transformer import TransformerPolicy
from sft_demos import sft_student


def batched(fn, episodes, size: int) -> np.ndarray:
    """`fn` over `episodes` in slices of `size` (the scores of a whole
    pool at once would hold every episode's `[T, V]` logits)."""
    out = [np.asarray(fn(episodes.take(slice(i, i + size))))
           for i in range(0, episodes.num_episodes, size)]
    return np.concatenate(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--env", default="tokens:arith")
    ap.add_argument("--num-ops", type=int, default=1, help="tokens:arith's num_ops")
    ap.add_argument("--demos", type=int, default=1, help="demonstrations of π_SFT")
    ap.add_argument("--source-episodes", type=int, default=16)
    ap.add_argument("--rm-updates", type=int, default=20)
    ap.add_argument("--rm-batch", type=int, default=2, help="episodes per source per update")
    ap.add_argument("--rm-lr", type=float, default=1e-4)
    ap.add_argument("--read", default="last", choices=R.READS)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=16)
    ap.add_argument("--score-batch", type=int, default=8)
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--out", default="experiments/lm_chat/results")
    args = ap.parse_args()
    if args.scale < 1 or args.source_episodes < 4:
        raise SystemExit("--scale must be >= 1 and --source-episodes >= 4")
    out = Path(args.out)
    tag = f"ops{args.num_ops}" + ("" if args.demos == 1 else f"-d{args.demos}")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    times = {}
    lm = jaxil.lm.load(args.model)
    env = ChatEnv.from_model(envs.make(args.env, num_ops=args.num_ops), lm)
    model = chat_model(lm, env)
    net = TransformerPolicy(model.config)
    res = sft_student(env, model, out, args.num_ops, args.demos)
    sft_params = jax.tree.map(lambda x: x[0], res.state.params)
    init_params = model.params
    times["sft_s"] = time.perf_counter() - t0

    # -- sources: π_0 and π_SFT sampled -------------------------------------------------------
    t = time.perf_counter()
    n = args.source_episodes * args.scale
    both = jax.tree.map(lambda a, b: jax.numpy.stack([a, b]), init_params, sft_params)
    roles = R.policy_episodes(env, net, both, jax.random.PRNGKey(40_000), n)
    init_eps, sft_eps = (jax.tree.map(lambda x, i=i: x[i], roles) for i in (0, 1))
    held = n // 4
    role_stats = {name: dict(success=float(np.mean(e.won)), steps=float(np.mean(e.mask.sum(1))))
                  for name, e in (("init", init_eps), ("sft", sft_eps))}
    print("sources:", json.dumps(role_stats), flush=True)
    train = R.RewardEpisodes.build(env, sft_eps.take(slice(held, None)),
                                   init_eps.take(slice(held, None)))
    heldout = R.RewardEpisodes.build(env, sft_eps.take(slice(0, held)),
                                     init_eps.take(slice(0, held)))
    times["sources_s"] = time.perf_counter() - t

    # -- the Init–SFT reward model, from π_SFT -------------------------------------------------
    t = time.perf_counter()
    updates = args.rm_updates * args.scale
    cfg = R.SequenceRewardConfig(read=args.read, batch_episodes=args.rm_batch,
                                 learning_rate=args.rm_lr, num_updates=updates,
                                 eval_every=updates)
    stack = lambda tree: jax.tree.map(lambda x: x[None], tree)  # noqa: E731
    rm_res = R.train_reward_model(env, stack(train), cfg, [0], ["init-sft"], stack(sft_params),
                                  stack(heldout), out_dir=out / "afd" / f"rm_{tag}",
                                  resume=True, progress=True, model=model)
    rm = R.SequenceRewardModel(env, cfg, model)
    rm_params = jax.tree.map(lambda x: x[0], rm_res.state.params)
    times["reward_model_s"] = time.perf_counter() - t

    # -- best-of-N of π_SFT ---------------------------------------------------------------------
    t = time.perf_counter()
    prompts = jax.random.split(jax.random.PRNGKey(20_000), args.prompts)
    k = args.rollouts * args.scale
    eps = jax.jit(lambda p, key: B.same_start_token_episodes(env, net.policy(), p, prompts, key,
                                                             k))(sft_params,
                                                                 jax.random.PRNGKey(30_000))
    demo = jax.jit(lambda key: B.same_start_token_episodes(env, chat_expert(env, "transcript"),
                                                           None, prompts, key, 1))(
        jax.random.PRNGKey(21_000))
    rm_scores = jax.jit(rm.scores)
    r_c = jax.jit(lambda e: R.analytic_reward(net, sft_params, init_params, e))
    scores = {"init-sft": batched(lambda e: rm_scores(rm_params, e), eps, args.score_batch),
              "r_c": batched(r_c, eps, args.score_batch)}
    report = B.token_best_of_n(eps, args.prompts, {name: (lambda e, s=s: s)
                                                   for name, s in scores.items()})
    times["best_of_n_s"] = time.perf_counter() - t
    won = np.asarray(eps.won, bool)
    steps = np.asarray(eps.mask).reshape(len(won), -1).sum(1)
    per_episode = [dict(prompt=i // k, won=bool(won[i]), steps=int(steps[i]),
                        **{name: float(s[i]) for name, s in scores.items()})
                   for i in range(len(won))]
    # Each prompt's pick under r_c beside its best-scored success: what the
    # reward prefers when it prefers a failure.
    picks = []
    for p in range(args.prompts):
        idx = np.arange(p * k, (p + 1) * k)
        top = idx[np.argmax(scores["r_c"][idx])]
        wins = idx[won[idx]]
        shown = [("r_c's pick", top)]
        if not won[top] and len(wins):
            shown.append(("best-scored success", wins[np.argmax(scores["r_c"][wins])]))
        for label, i in shown:
            picks.append(f"=== prompt {p}, {label}: won={bool(won[i])} steps={int(steps[i])} "
                         + " ".join(f"{n}={float(s[i]):.2f}" for n, s in scores.items())
                         + " ===\n" + chat_text(env, np.asarray(eps.obs[i])) + "\n")
    times["total_s"] = time.perf_counter() - t0
    entry = dict(model=args.model, env=args.env, num_ops=args.num_ops, demos=args.demos,
                 read=args.read, settings=vars(args), role_stats=role_stats,
                 rm_rows=rm_res.rows, rm_summary=rm_res.summary,
                 demonstrator=dict(success=float(np.mean(demo.won)),
                                   score=float(np.mean(demo.episode_return))),
                 best_of_n=report, episodes=per_episode,
                 times={a: round(b, 1) for a, b in times.items()})
    path = out / f"afd_{tag}.json"
    path.write_text(json.dumps(entry, indent=1))
    (out / f"afd_{tag}_picks.txt").write_text("\n".join(picks))
    succ = report["success"]
    print(f"π_SFT success {succ['sft_mean']:.3f}; demonstrator {entry['demonstrator']['success']:.3f}")
    print("N       " + " ".join(f"{x:>6d}" for x in succ["ns"]))
    print("oracle  " + " ".join(f"{x:6.3f}" for x in succ["oracle"]))
    for name, r in succ["rewards"].items():
        print(f"{name:8s}" + " ".join(f"{x:6.3f}" for x in r["curve"])
              + f"   spearman {r['spearman']:.3f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
