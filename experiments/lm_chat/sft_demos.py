"""SFT of a pretrained model on transcript-only expert chats: success
against the number of demonstrations.

    python experiments/lm_chat/sft_demos.py --demos 1 2 4 --out experiments/lm_chat/results

For each demonstration count, one SFT run (full fine-tuning, the run engine,
`OUT/sft_demos/N` resumable) of SmolLM2-135M-Instruct in the chat form of a
token task, free decoding, on episodes of the task's transcript-only
expert written as text; evaluated greedily on fixed instances, free and
constrained. Writes `sft_demos.json` (one row per count: held-out NLL and
accuracy of the assistant tokens, success free and constrained, seconds per
update and per evaluation).
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
from jaxil.algorithms.lm import sft
from jaxil.envs.token_chat import ChatEnv, chat_expert
from jaxil.nn.task_vocab import chat_model


def results_dir(out: str, name: str) -> Path:
    """`out`, created, with XLA's compilation cache in `out/name/xla_cache`
    (the runs of one script share their compiled programs)."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path / name / "xla_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    return path


def demo_pool(env, pool: int = 64, heldout: int = 8):
    """The transcript-only expert's chats every run draws from: the first
    `pool` to train on (a run with N takes the first N), the last `heldout`
    to score."""
    return sft.collect_demos(env, chat_expert(env, "transcript"), None, jax.random.PRNGKey(7),
                             pool + heldout)


def sft_student(env, model, out: Path, num_ops: int, n: int, *, pool: int = 64,
                heldout: int = 8, updates: int = 40, batch_episodes: int = 4,
                lr: float = 1e-4, eval_episodes: int = 16):
    """The SFT run on the first `n` demonstrations (`OUT/sft_demos/ops<k>-<n>`,
    `-u<updates>` added unless 40; resumed or restored when it is there):
    the engine's `RunResult`."""
    demos = demo_pool(env, pool, heldout)
    cfg = sft.SFTConfig(num_updates=updates, eval_every=updates, batch_episodes=batch_episodes,
                        learning_rate=lr, eval_episodes=eval_episodes)
    return sft.train_sft(env, demos.take(slice(0, n)), cfg, seeds=[0],
                         heldout=demos.take(slice(pool, None)), model=model,
                         out_dir=out / "sft_demos" / (f"ops{num_ops}-{n}"
                                                      + ("" if updates == 40 else f"-u{updates}")),
                         resume=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--env", default="tokens:arith")
    ap.add_argument("--num-ops", type=int, default=1, help="tokens:arith's num_ops")
    ap.add_argument("--demos", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--pool", type=int, default=64,
                    help="demonstrations collected; a run with N trains on the first N")
    ap.add_argument("--heldout", type=int, default=8)
    ap.add_argument("--updates", type=int, default=40)
    ap.add_argument("--batch-episodes", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--eval-episodes", type=int, default=16)
    ap.add_argument("--out", default="experiments/lm_chat/results")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lm = jaxil.lm.load(args.model)
    task = envs.make(args.env, num_ops=args.num_ops)
    env = ChatEnv.from_model(task, lm)
    model = chat_model(lm, env)
    if max(args.demos) > args.pool:
        raise SystemExit(f"--demos {max(args.demos)} is more than --pool {args.pool}")
    # One pool for every count (runs stay comparable and resumable).
    pool = demo_pool(env, args.pool, args.heldout)
    print(f"demonstrations: success {float(pool.won.mean()):.3f}", flush=True)
    rows = []
    for n in args.demos:
        t0 = time.perf_counter()
        res = sft_student(env, model, out, args.num_ops, n, pool=args.pool, heldout=args.heldout,
                          updates=args.updates, batch_episodes=args.batch_episodes, lr=args.lr,
                          eval_episodes=args.eval_episodes)
        wall = time.perf_counter() - t0
        last = max(r["update"] for r in res.rows)
        first = {r["update"]: r for r in res.rows}
        params = jax.tree.map(lambda x: x[0], res.state.params)
        # The same students, constrained by the grammar.
        cons = ChatEnv.from_model(task, lm, constrained=True)
        net = jaxil.lm.chat_policy(lm, cons)[0]
        t1 = time.perf_counter()
        ep = jax.jit(lambda p, k: envs.run_episodes(cons, net.policy(deterministic=True), p, k,
                                                    args.eval_episodes))(
            params, jax.random.PRNGKey(10_000))
        jax.block_until_ready(ep.won)
        row = dict(demos=n, updates=last, lr=args.lr, batch_episodes=args.batch_episodes,
                   nll_start=first[0]["eval_nll"], nll=first[last]["eval_nll"],
                   accuracy=first[last]["eval_accuracy"],
                   success_start=first[0]["eval_win_rate"],
                   success_free=first[last]["eval_win_rate"],
                   success_constrained=float(np.asarray(ep.won).mean()),
                   wall_s=round(wall, 1), constrained_eval_s=round(time.perf_counter() - t1, 1))
        rows.append(row)
        print(json.dumps(row), flush=True)
        (out / f"sft_demos_ops{args.num_ops}.json").write_text(json.dumps(dict(
            model=args.model, env=args.env, num_ops=args.num_ops, heldout=args.heldout,
            eval_episodes=args.eval_episodes, rows=rows), indent=1))


if __name__ == "__main__":
    main()
