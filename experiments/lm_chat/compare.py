"""OEC against BC, DAgger, on-policy RS and OPD with a pretrained chat
student, at two expert-token budgets, and the per-turn divergence of each
final student against the expert's floor.

    python experiments/lm_chat/compare.py                   # the CPU run (1 seed)
    python experiments/lm_chat/compare.py --seeds 4 --scale 4   # a GPU
    python experiments/lm_chat/compare.py --methods --budgets 4 --ablations mask-off repetition-filter-off

Every run starts from one SFT start, the pretrained model fine-tuned for
`--start-updates` updates on one of the transcript expert's chats (the
`sft_demos.py` recipe; 0: the pretrained model itself), in the chat form of a
token task, free decoding. The start's demonstration is counted in every run's
budget (`sft_tokens`, one expert episode, is in every run's data; the
interactive programs' own `sft_updates` is 0). BC, DAgger, OEC and RS use the
task's transcript-only expert written as text (`chat_expert(env,
"transcript")`); OPD distils from an expert LM, the same model fine-tuned on 4
of that expert's chats (the 4-demonstration run of `sft_demos.py`, restored
from its run directory when it is there). Each (method, budget) is one
`interactive.run` with its own resumable run directory
(`OUT/compare/<method>-x<B>`), since one program per regime keeps a batch of
full fine-tuning inside the machine's memory; compilation is cached on disk so
that regimes of one shape compile once. Budgets count every expert token, the
demonstrations included, in multiples of the transcript expert's longest
episode (so that a budget of ×N buys BC N whole demonstrations).

After each run, the final student's per-turn covariate shift
(`jaxil.algorithms.lm.diagnostics.covariate_shift`: its next-token
disagreement with the expert's labels on its own episodes, and the floor,
the same on the expert's episodes) is measured. Writes
`compare_ops<k>.json` (one row per run, keeping the rows of earlier calls
with other methods or budgets) and prints the table. `--ablations` adds
OEC's ablations (`interactive.OEC_ABLATIONS`: its prefix mask, repetition
filter, verifier or switch distribution changed), each a run of its own at
each budget, under the method name `oec[<ablation>]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import jax
import numpy as np

import jaxil.lm
from jaxil import envs
from jaxil.algorithms.lm import diagnostics, interactive, sft
from jaxil.envs.token_chat import ChatEnv, chat_expert
from jaxil.nn.task_vocab import chat_model
from jaxil.nn.transformer import TransformerPolicy
from sft_demos import results_dir, sft_student

METHODS = ("bc", "dagger", "oec", "onpolicy", "opd")
# The ablations by their command-line names ("mask off" is mask-off).
ABLATIONS = {name.replace(" ", "-"): name for name in interactive.OEC_ABLATIONS}


def row_order(method: str) -> tuple[int, int]:
    """Methods in `METHODS`' order, OEC's ablations after OEC."""
    if method.startswith("oec["):
        return METHODS.index("oec"), 1 + list(interactive.OEC_ABLATIONS).index(method[4:-1])
    return METHODS.index(method), 0


def expert_lm(env, model, out: Path, num_ops: int):
    """The expert LM of OPD: the model fine-tuned on 4 of the transcript
    expert's chats for 10 updates (`sft_demos.py`'s recipe; with one
    operation 10 updates on one chat already reach success 1.0), restored
    from its run directory when it is there."""
    res = sft_student(env, model, out, num_ops, 4, updates=10)
    last = max(r["update"] for r in res.rows)
    win = [r["eval_win_rate"] for r in res.rows if r["update"] == last][0]
    return TransformerPolicy(model.config), jax.tree.map(lambda x: x[0], res.state.params), win


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--env", default="tokens:arith")
    ap.add_argument("--num-ops", type=int, default=2, help="tokens:arith's num_ops")
    ap.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS)
    ap.add_argument("--ablations", nargs="+", default=[], choices=sorted(ABLATIONS),
                    help="OEC's ablations to run as well, at each budget")
    ap.add_argument("--budgets", type=float, nargs="+", default=[2.0, 4.0],
                    help="expert-token budgets in longest expert episodes")
    ap.add_argument("--start-updates", type=int, default=0,
                    help="SFT updates of the shared start on one demonstration (0: none)")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--episodes-per-round", type=int, default=8)
    ap.add_argument("--updates-per-round", type=int, default=8)
    ap.add_argument("--batch-episodes", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--eval-episodes", type=int, default=16)
    ap.add_argument("--shift-episodes", type=int, default=4,
                    help="episodes of the student and of the expert for the divergence (0: skip)")
    ap.add_argument("--scale", type=int, default=1,
                    help="multiplies rollouts and updates per round (a GPU: 4)")
    ap.add_argument("--out", default="experiments/lm_chat/results")
    args = ap.parse_args()
    if args.scale < 1 or args.seeds < 1:
        raise SystemExit("--scale and --seeds must be >= 1")
    if not args.methods and not args.ablations:
        raise SystemExit("nothing to run: give --methods, --ablations or both")
    out = results_dir(args.out, "compare")

    lm = jaxil.lm.load(args.model)
    task = envs.make(args.env, num_ops=args.num_ops)
    env = ChatEnv.from_model(task, lm)
    base = model = chat_model(lm, env)
    expert = chat_expert(env, "transcript")
    start_win = 0.0
    if args.start_updates:
        res = sft_student(env, model, out, args.num_ops, 1, updates=args.start_updates)
        start_win = [r["eval_win_rate"] for r in res.rows if r["update"] == args.start_updates][0]
        model = dataclasses.replace(model, params=jax.tree.map(lambda x: x[0], res.state.params))
        print(f"SFT start ({args.start_updates} updates on 1 demonstration): greedy success "
              f"{start_win:.3f}", flush=True)
    probe = sft.collect_demos(env, expert, None, jax.random.PRNGKey(777_777), 16)
    acc = interactive.demo_accounting(env, probe)
    episode_tokens = float(acc["tokens"][-1] / len(acc["tokens"]))
    sft_tokens = int(np.ceil(np.max(np.diff(acc["tokens"], prepend=0))))
    print(f"transcript expert: {episode_tokens:.1f} assistant tokens per episode; "
          f"sft_tokens {sft_tokens}", flush=True)
    cfg = interactive.TokenInteractiveConfig(
        learning_rate=args.lr, batch_episodes=args.batch_episodes, rounds=args.rounds,
        episodes_per_round=args.episodes_per_round * args.scale,
        updates_per_round=args.updates_per_round * args.scale, sft_tokens=sft_tokens,
        sft_updates=0, eval_episodes=args.eval_episodes)
    opd_expert = None
    path = out / f"compare_ops{args.num_ops}.json"
    settings = dict(rounds=cfg.rounds, episodes_per_round=cfg.episodes_per_round,
                    updates_per_round=cfg.updates_per_round, batch_episodes=cfg.batch_episodes,
                    lr=cfg.learning_rate, eval_episodes=cfg.eval_episodes, sft_updates=0)
    # Rows of earlier calls (other budgets or methods) are kept; a rerun of
    # a (method, budget) replaces its row.
    earlier = json.loads(path.read_text()) if path.exists() else {}
    if earlier and (earlier["config"], earlier["start_updates"]) != (settings,
                                                                   args.start_updates):
        raise SystemExit(f"{path} holds rows of other settings ({earlier['config']}, "
                         f"--start-updates {earlier['start_updates']}); rerun with those or "
                         "give another --out")
    rows = earlier.get("rows", [])
    lm_success = earlier.get("expert_lm_success")
    for mult in args.budgets:
        budget = int(round(mult * sft_tokens))
        runs = [(m, {}) for m in args.methods] + [
            (f"oec[{ABLATIONS[a]}]", interactive.OEC_ABLATIONS[ABLATIONS[a]])
            for a in args.ablations]
        for method, overrides in runs:
            if method == "opd":
                if opd_expert is None:
                    opd_expert = expert_lm(env, base, out, args.num_ops)
                    lm_success = opd_expert[2]
                    print(f"expert LM: greedy success {opd_expert[2]:.3f}", flush=True)
                teacher, teacher_params = opd_expert[0], opd_expert[1]
            else:
                teacher, teacher_params = expert, None
            name = f"{method}-x{mult:g}".replace("[", "-").replace("]", "").replace(" ", "-")
            t0 = time.perf_counter()
            res = interactive.run(
                env, teacher, teacher_params,
                [(name, interactive.token_regime(method.split("[")[0], budget,
                                                 sft_tokens=sft_tokens, lr=args.lr,
                                                 **overrides))],
                seeds=args.seeds, config=cfg, out_dir=out / "compare" / name, resume=True,
                eval_every=args.rounds, progress=True,
                expert_name="expert LM" if method == "opd" else "transcript", model=model)
            wall = time.perf_counter() - t0
            g = res.summary["regimes"][0]
            row = dict(method=method, budget_episodes=mult, budget_tokens=budget,
                       seeds=args.seeds, expert_tokens=g["expert_tokens_mean"],
                       win_mean=g["win_mean"], win_std=g["win_std"],
                       return_mean=g["return_mean"], return_std=g["return_std"],
                       per_seed=[r["eval_win_rate"] for r in res.rows
                                 if r["round"] == args.rounds],
                       start=[r["eval_win_rate"] for r in res.rows if r["round"] == 0],
                       wall_s=round(wall, 1))
            if args.shift_episodes:
                t1 = time.perf_counter()
                student = interactive.make_student(env, cfg, model)
                params = jax.tree.map(lambda x: x[0], res.state.params)
                tab = diagnostics.covariate_shift(env, student, params, expert,
                                                  jax.random.PRNGKey(20_000),
                                                  args.shift_episodes, 4, deterministic=True,
                                                  max_samples=256)
                row["shift"] = diagnostics.covariate_shift_rows(tab)
                row["shift_s"] = round(time.perf_counter() - t1, 1)
            rows = [r for r in rows if (r["method"], r["budget_episodes"]) != (method, mult)]
            rows.append(row)
            rows.sort(key=lambda r: (r["budget_episodes"], row_order(r["method"])))
            print(json.dumps({k: v for k, v in row.items() if k != "shift"}), flush=True)
            path.write_text(json.dumps(dict(
                model=args.model, env=args.env, num_ops=args.num_ops,
                episode_tokens=episode_tokens, sft_tokens=sft_tokens,
                config=settings, start_updates=args.start_updates, start_success=start_win,
                expert_lm_success=lm_success,
                rows=rows), indent=1))


if __name__ == "__main__":
    main()
