"""SmolLM2-135M-Instruct, zero-shot, in the chat form of each token task:
success with and without constrained decoding, and the share of malformed
commands (turns the parser refused).

    python experiments/lm_chat/zero_shot.py --episodes 16 --out experiments/lm_chat/results

Writes `zero_shot.json` (one row per task and mode) and one transcript per
task and mode (`zero_shot_<task>_<mode>.txt`, the first episode's chat).
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
from jaxil.envs.token_chat import ChatEnv, chat_text

TASKS = ("tokens:repair", "tokens:arith", "tokens:exchange")


def run(lm, eid: str, constrained: bool, episodes: int, greedy: bool, seed: int):
    env = ChatEnv.from_model(envs.make(eid), lm, constrained=constrained)
    net, params = jaxil.lm.chat_policy(lm, env)
    t0 = time.perf_counter()
    ep = jax.jit(lambda k: envs.run_episodes(env, net.policy(deterministic=greedy), params, k,
                                             episodes))(jax.random.key(seed))
    jax.block_until_ready(ep.won)
    wall = time.perf_counter() - t0
    acts = np.asarray(ep.actions)
    mask = np.asarray(ep.mask, bool)
    ended = (acts == env.eot_token) & mask[..., None]
    sent = np.asarray(env.privileged(ep.obs[:, 1:])["sent_len"]) > 0
    n_turns = int(ended.sum())
    row = dict(task=eid, constrained=constrained, episodes=episodes, greedy=greedy,
               success=float(np.asarray(ep.won).mean()),
               return_mean=float(np.asarray(ep.episode_return).mean()),
               turns=n_turns, malformed=float(1 - sent[ended].mean()) if n_turns else None,
               steps_mean=float(np.asarray(ep.length).mean()), wall_s=round(wall, 1))
    texts = [chat_text(env, np.asarray(ep.obs[0]), agent=i, length=int(ep.length[0]))
             for i in range(env.spec.num_agents)]
    return row, texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--tasks", nargs="*", default=list(TASKS))
    ap.add_argument("--sample", action="store_true", help="sample at temperature 1 (default: greedy)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="experiments/lm_chat/results")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lm = jaxil.lm.load("smollm2-135m-instruct")
    rows = []
    for eid in args.tasks:
        for constrained in (False, True):
            row, texts = run(lm, eid, constrained, args.episodes, not args.sample, args.seed)
            rows.append(row)
            print(json.dumps(row), flush=True)
            name = f"zero_shot_{eid.split(':')[1]}_{'constrained' if constrained else 'free'}.txt"
            (out / name).write_text("\n\n".join(f"--- agent {i} ---\n{t}"
                                              for i, t in enumerate(texts)))
            (out / "zero_shot.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
