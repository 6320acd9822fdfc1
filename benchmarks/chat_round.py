"""The cost of one interactive round with a pretrained student in a token
task's chat form: its rollouts and its updates, each timed on its own.

    python benchmarks/chat_round.py --out-dir benchmarks/results
    python benchmarks/chat_round.py --quick          # 2 episodes, batch 2, one repeat

For a model (``--model``, SmolLM2-135M-Instruct by default) in the chat
form of a task (``--env``, ``--num-ops`` for ``tokens:arith``), in one run:

- ``rollout``: ``run_episodes`` of ``--episodes`` episodes with the model
  sampling (temperature 1, free decoding), jitted: what a round of BC,
  DAgger, OEC or RS pays to collect its data (OEC's takeovers run the expert
  in the same loop, at the cost of the scripted expert, which is small);
- ``update``: one full fine-tuning step on ``--batch`` of the transcript
  expert's chats (``jax.value_and_grad`` of the SFT loss, global-norm
  clipping, Adam), jitted: a round runs ``updates_per_round`` of them.

Each is compiled first, then timed ``--repeats`` times after
``block_until_ready``; the medians are reported with the round they imply,
``rollout + U × update`` for ``U`` = ``--updates`` (the interactive
learners' default, 100). The JSON goes to ``benchmarks/results`` (``--out-dir``),
named by ``jaxil.runs.measure.results_path``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jax
import optax

import jaxil.lm
from jaxil import envs
from jaxil.algorithms.lm import sft
from jaxil.envs.token_chat import ChatEnv, chat_expert
from jaxil.nn.task_vocab import chat_model
from jaxil.nn.transformer import TransformerPolicy
from jaxil.runs import measure as M

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _median_time(fn, repeats: int) -> float:
    jax.block_until_ready(fn())  # compile
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--env", default="tokens:arith")
    ap.add_argument("--num-ops", type=int, default=1)
    ap.add_argument("--episodes", type=int, default=16, help="rollouts per round")
    ap.add_argument("--batch", type=int, default=16, help="episodes per update")
    ap.add_argument("--updates", type=int, default=100, help="updates per round")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out-dir", default=None, help="where the JSON goes (default benchmarks/results)")
    ap.add_argument("--name", default="chat_round")
    ap.add_argument("--quick", action="store_true", help="2 episodes, batch 2, 1 repeat")
    args = ap.parse_args()
    if args.quick:
        args.episodes, args.batch, args.repeats = 2, 2, 1
    lm = jaxil.lm.load(args.model)
    env = ChatEnv.from_model(envs.make(args.env, num_ops=args.num_ops), lm)
    model = chat_model(lm, env)
    student = TransformerPolicy(model.config)
    params = model.params
    demos = sft.collect_demos(env, chat_expert(env, "transcript"), None, jax.random.PRNGKey(0),
                              args.batch)
    roll = jax.jit(lambda p, k: envs.run_episodes(env, student.policy(), p, k, args.episodes))
    rollout_s = _median_time(lambda: roll(params, jax.random.PRNGKey(1)).won, args.repeats)
    cfg = sft.SFTConfig()
    tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(cfg.learning_rate))
    opt = tx.init(params)

    @jax.jit
    def update(p, o):
        loss, g = jax.value_and_grad(lambda q: sft.sft_loss(student, q, demos, False))(p)
        u, o = tx.update(g, o, p)
        return optax.apply_updates(p, u), o, loss

    update_s = _median_time(lambda: update(params, opt)[2], args.repeats)
    row = dict(model=args.model, env=env.spec.env_id, num_ops=args.num_ops,
               max_context=env.max_context, max_steps=int(env.spec.max_steps),
               episodes=args.episodes, batch=args.batch, repeats=args.repeats,
               rollout_s=round(rollout_s, 2), update_s=round(update_s, 2), updates=args.updates,
               round_s=round(rollout_s + args.updates * update_s, 1),
               device=str(jax.devices()[0]))
    print(json.dumps(row), flush=True)
    if not args.quick:
        print(f"wrote {M.write_json(args.name, row, args.out_dir or RESULTS_DIR)}")


if __name__ == "__main__":
    main()
