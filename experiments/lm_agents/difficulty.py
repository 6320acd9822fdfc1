"""Difficulty sweep of the token tasks for imitation-gap experiments.

For each candidate setting (a task id and its difficulty knobs) it reports

- the scripted expert's win rate on ``--expert-episodes`` episodes and its
  mean episode length (agent tokens spoken, turns);
- for each demonstration count in ``--demos``: a behaviour-cloning (SFT)
  student's greedy win rate after ``--updates`` updates (mean over the
  ``--seeds``, vmapped in one program) and the run's wall time.

Usage (from the repository root, venv active)::

    python experiments/lm_agents/difficulty.py --preset chosen        # ~12 min
    python experiments/lm_agents/difficulty.py --task tokens:repair \\
        --knobs '{"length": 16, "faults": 4, "values": 32, "max_turns": 14}' --demos 32 64
    python experiments/lm_agents/difficulty.py --preset chosen --only tokens:repair \\
        --expert-lm --size mini --demos 1536 --updates 200 --eval-every 100 \\
        --eval-episodes 256 --out /tmp/expert_lm

``--expert-lm`` trains one larger student (``--size``) on many expert
demonstrations and reports its greedy success rate on ``--eval-episodes``
episodes (the "expert LM"); with ``--out`` the run directory (params
checkpointed by :mod:`jaxil.runs`) goes to ``OUT/<task>`` (one run per
task: give one demo count with ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS",
                      "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", "/tmp/jaxil-lm-difficulty-xla")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

import jax
import numpy as np
from jaxil.envs.experts import scripted_expert
from jaxil.envs.tokens import EOT, WAIT

from jaxil import envs
from jaxil.algorithms.lm import sft

# Candidate settings tried (see DIFFICULTY.md): (task, knobs, default demo
# counts). "chosen" is one per task. max_turns was set tight when SFT's
# teacher-forced pass still ran over max_steps * token_width positions (padding
# included; it now runs over the packed max_context tokens, DIFFICULTY.md).
REPAIR = {"length": 16, "faults": 4, "values": 32, "max_turns": 14}
ARITH = {"num_ops": 4, "modulus": 31, "max_turns": 6}
EXCHANGE = {"half": 3, "values": 32, "sort": True, "max_turns": 4}
PRESETS: dict[str, list[tuple[str, dict, list[int]]]] = {
    "chosen": [
        ("tokens:repair", REPAIR, [32, 48, 64]),
        ("tokens:arith", ARITH, [32, 48, 64]),
        ("tokens:exchange", EXCHANGE, [128, 256, 512]),
    ],
    "repair": [
        ("tokens:repair", {"length": 8, "faults": 3, "values": 16}, [64]),
        ("tokens:repair", REPAIR, [16, 32, 48, 64, 256]),
    ],
    "arith": [
        ("tokens:arith", ARITH, [16, 32, 48, 64, 256]),
    ],
    "exchange": [
        ("tokens:exchange", EXCHANGE, [64, 128, 256, 512]),
    ],
}


def episode_stats(demos: sft.TokenEpisodes) -> dict:
    """Mean agent tokens (own tokens, ``<wait>`` excluded, all agents
    together) and turns (``<eot>`` tokens) per episode, and the win rate."""
    mask = np.asarray(demos.mask)[..., None]  # [E, T, 1]
    act = np.asarray(demos.actions)  # [E, T, N]
    spoken = (mask & (act != WAIT)).sum(axis=(1, 2))
    turns = (mask & (act == EOT)).sum(axis=(1, 2))
    return {"win": float(np.mean(np.asarray(demos.won))), "tokens": float(spoken.mean()),
                "turns": float(turns.mean())}


def run_candidate(task: str, knobs: dict, demo_counts: list[int], args) -> list[dict]:
    env = envs.make(task, **knobs)
    expert = scripted_expert(env)[0]
    n_max = max(demo_counts)
    t0 = time.time()
    # one pool of expert episodes: the first n are the n-demo training set
    # (nested sets), the stats come from --expert-episodes fresh ones
    pool = sft.collect_demos(env, expert, None, jax.random.PRNGKey(args.demo_seed), n_max)
    check = sft.collect_demos(env, expert, None, jax.random.PRNGKey(args.demo_seed + 1),
                              args.expert_episodes)
    st = episode_stats(check)
    print(f"# {task} {json.dumps(knobs)}: expert win {st['win']:.3f} on {args.expert_episodes} "
          f"episodes, {st['tokens']:.1f} agent tokens, {st['turns']:.1f} turns, "
          f"max_context {env.max_context}, max_steps {env.spec.max_steps} "
          f"({time.time() - t0:.1f}s)", flush=True)
    cfg = sft.SFTConfig(size=args.size, agent_ids=env.spec.num_agents > 1,
                        learning_rate=args.lr, batch_episodes=args.batch,
                        num_updates=args.updates, eval_every=args.eval_every or args.updates,
                        eval_episodes=args.eval_episodes)
    rows = []
    for n in demo_counts:
        demos = pool.take(slice(0, n))
        out = None
        if args.out:
            out = os.path.join(args.out, task.split(":")[1])
        t1 = time.time()
        res = sft.train_sft(env, demos, cfg, seeds=tuple(range(args.seeds)), out_dir=out,
                            overwrite=True)
        wall = time.time() - t1
        final = [r for r in res.rows if r["update"] == args.updates]
        wins = [r["eval_win_rate"] for r in final]
        curve = {}
        for r in res.rows:
            curve.setdefault(r["update"], []).append(r["eval_win_rate"])
        row = {"task": task, "knobs": knobs, "expert_win": st["win"], "tokens": st["tokens"],
                   "turns": st["turns"], "size": args.size, "demos": n, "updates": args.updates,
                   "bc_win": float(np.mean(wins)), "bc_win_seeds": wins,
                   "curve": {u: float(np.mean(v)) for u, v in curve.items()},
                   "loss": float(np.mean([r["loss"] for r in final])), "wall_s": wall}
        rows.append(row)
        print(f"  demos {n:5d}: BC win {row['bc_win']:.3f} (seeds "
              f"{', '.join(f'{w:.2f}' for w in wins)}), loss {row['loss']:.3f}, "
              f"curve {' '.join(f'{u}:{w:.2f}' for u, w in row['curve'].items())}, "
              f"{wall:.0f}s", flush=True)
        if args.out:
            with open(os.path.join(out, "difficulty_row.json"), "w") as f:
                json.dump(row, f, indent=1)
    return rows


def table(rows: list[dict]) -> str:
    lines = [("| task | knobs | expert win | agent tokens | turns | size | demos | updates "
             "| BC win (greedy) | wall s |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        knobs = ", ".join(f"{k}={v}" for k, v in r["knobs"].items())
        lines.append(f"| {r['task']} | {knobs} | {r['expert_win']:.3f} | {r['tokens']:.1f} | "
                     f"{r['turns']:.1f} | {r['size']} | {r['demos']} | {r['updates']} | "
                     f"{r['bc_win']:.3f} | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), help="a set of candidate settings")
    p.add_argument("--only", help="with --preset: keep this task id only")
    p.add_argument("--task", help="one task id (tokens:repair, tokens:arith, tokens:exchange)")
    p.add_argument("--knobs", default="{}", help="its difficulty knobs, as JSON")
    p.add_argument("--demos", type=int, nargs="+",
                   help="demonstration counts (nested sets of one expert pool); default: "
                        "the preset's, else 64 128 256")
    p.add_argument("--updates", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=150, help="0: evaluate at the end only")
    p.add_argument("--batch", type=int, default=16, help="episodes per minibatch")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seeds", type=int, default=1, help="students vmapped per run")
    p.add_argument("--size", default="tiny", help="transformer size (jaxil.nn.transformer.SIZES)")
    p.add_argument("--eval-episodes", type=int, default=128)
    p.add_argument("--expert-episodes", type=int, default=256)
    p.add_argument("--demo-seed", type=int, default=1)
    p.add_argument("--expert-lm", action="store_true",
                   help="train one larger model (--size, default mini) as the expert LM")
    p.add_argument("--out", help="run directories go to OUT/<task> (e.g. /tmp/expert_lm)")
    p.add_argument("--json", help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    if args.expert_lm and args.size == "tiny":
        args.size = "mini"
    if args.expert_lm:
        args.seeds = 1
    if args.preset:
        cands = [c for c in PRESETS[args.preset] if args.only in (None, c[0])]
    elif args.task:
        cands = [(args.task, json.loads(args.knobs), [64, 128, 256])]
    else:
        p.error("give --preset or --task")
    rows = []
    for task, knobs, counts in cands:
        rows += run_candidate(task, knobs, args.demos or counts, args)
    print()
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
