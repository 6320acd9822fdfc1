"""The tiny from-scratch student on a token task in both forms: its private
vocabulary and its chat form under a pretrained model's tokenizer, every
interactive regime, same settings, side by side.

    python experiments/lm_chat/tiny_student.py                 # the CPU run (4 seeds)
    python experiments/lm_chat/tiny_student.py --scale 4       # a GPU

Both forms are the same hidden instances (the same reset keys). The
private form speaks the task's own tokens (57 for arith); the chat form is
`ChatEnv.from_model(task, model)`, free decoding: the student writes
tokens of the model's vocabulary (SmolLM2's 49,152) and its commands are
parsed from text, among the system message, the template and the tool
answers. The student is the `tiny` transformer from scratch in both
(no pretrained weights; in the chat form its embedding and head span the
whole vocabulary). The expert is the task's transcript-only expert (in
the chat form written as text).

Regimes: BC, on-policy RS, DAgger, OEC, OEC+BC and the gated switch, at two
budgets in multiples of the form's longest expert episode (so that ×N buys BC N
whole demonstrations in either form), from an SFT start on `--sft-episodes`
episodes' worth of tokens (Adam at `--lr`, the rounds at `--round-lr`); each
method is one program of its budgets × seeds (one program of every regime would
hold every run's `[T, 49,152]` logits at once), and the programs of a form
share one SFT start per seed through `interactive.run`'s `start_cache`. Writes
`tiny_student_ops<k>.json` with one row per (form, regime): success mean ± std
over seeds, tokens spent, and wall times.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

import jaxil.lm
from jaxil import envs
from jaxil.algorithms.lm import interactive, sft
from jaxil.envs.token_chat import ChatEnv, chat_expert
from jaxil.envs.token_tasks import token_expert
from sft_demos import results_dir

METHODS = ("bc", "onpolicy", "dagger", "oec", "oec_mix", "gated")


def longest_episode(env, expert) -> int:
    """Expert tokens of the expert's longest episode among 16."""
    acc = interactive.demo_accounting(env, sft.collect_demos(env, expert, None,
                                                             jax.random.PRNGKey(777_777), 16))
    return int(np.max(np.diff(acc["tokens"], prepend=0)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="whose tokenizer and template make the chat form")
    ap.add_argument("--env", default="tokens:arith")
    ap.add_argument("--num-ops", type=int, default=1, help="tokens:arith's num_ops")
    ap.add_argument("--forms", nargs="+", default=["private", "chat"],
                    choices=["private", "chat"])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--budgets", type=float, nargs="+", default=[32.0, 64.0],
                    help="budgets in the form's longest expert episodes")
    ap.add_argument("--sft-episodes", type=float, default=16.0)
    ap.add_argument("--sft-updates", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--episodes-per-round", type=int, default=16)
    ap.add_argument("--updates-per-round", type=int, default=30)
    ap.add_argument("--batch-episodes", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3, help="Adam's step size of the SFT start")
    ap.add_argument("--round-lr", type=float, default=1e-3,
                    help="Adam's step size of the rounds (the interactive regimes' default)")
    ap.add_argument("--eval-episodes", type=int, default=64)
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--out", default="experiments/lm_chat/results")
    args = ap.parse_args()
    if args.scale < 1 or args.seeds < 1:
        raise SystemExit("--scale and --seeds must be >= 1")
    out = results_dir(args.out, "tiny_student")
    task = envs.make(args.env, num_ops=args.num_ops)
    forms = {}
    if "private" in args.forms:
        forms["private"] = (task, token_expert(task, "transcript")[0])
    if "chat" in args.forms:
        chat = ChatEnv.from_model(task, jaxil.lm.load(args.model))
        forms["chat"] = (chat, chat_expert(chat, "transcript"))
    path = out / f"tiny_student_ops{args.num_ops}.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    done = {(r["form"], r["regime"]) for r in rows}
    for form, (env, expert) in forms.items():
        unit = longest_episode(env, expert)
        sft_tokens = int(round(args.sft_episodes * unit))
        cfg = interactive.TokenInteractiveConfig(
            size="tiny", learning_rate=args.lr, batch_episodes=args.batch_episodes,
            rounds=args.rounds, episodes_per_round=args.episodes_per_round * args.scale,
            updates_per_round=args.updates_per_round * args.scale, sft_tokens=sft_tokens,
            sft_updates=args.sft_updates * args.scale, eval_episodes=args.eval_episodes)
        print(f"{form}: {env.spec.num_actions} tokens, context {env.max_context}, longest expert "
              f"episode {unit} tokens", flush=True)
        for method in args.methods:
            regimes = [(f"{method}-x{b:g}", interactive.token_regime(
                method, int(round(b * unit)), sft_tokens=sft_tokens, lr=args.round_lr))
                for b in args.budgets]
            if all((form, n) in done for n, _ in regimes):
                continue
            t0 = time.perf_counter()
            res = interactive.run(env, expert, None, regimes, seeds=args.seeds, config=cfg,
                                  out_dir=out / "tiny_student" / f"ops{args.num_ops}" / form
                                  / method, resume=True, eval_every=args.rounds,
                                  progress=True, expert_name="transcript",
                                  start_cache=out / "tiny_student" / "sft_starts")
            wall = time.perf_counter() - t0
            start = [r["eval_win_rate"] for r in res.rows if r["round"] == 0]
            for g in res.summary["regimes"]:
                rows.append(dict(form=form, regime=g["regime"], method=method,
                                 budget_episodes=float(g["regime"].split("-x")[1]),
                                 unit_tokens=unit, seeds=g["seeds"],
                                 expert_tokens=g["expert_tokens_mean"], win_mean=g["win_mean"],
                                 win_std=g["win_std"], start_mean=float(np.mean(start)),
                                 wall_s=round(wall, 1)))
                print(json.dumps(rows[-1]), flush=True)
            path.write_text(json.dumps(dict(env=args.env, num_ops=args.num_ops, model=args.model,
                                            settings=vars(args), rows=rows), indent=1))


if __name__ == "__main__":
    main()
