"""Alignment from demonstrations on the token tasks: sequence reward models
from three sample sources, best-of-N, and RL against the learned reward with
a KL sweep (the questions of Sun & van der Schaar, arXiv 2405.15624).

Per task (:data:`TASKS`), with one demonstrator of stated quality (the
scripted expert with token-level ε-noise: each token is a uniformly random
legal one with probability ε) and ``--seeds`` learner seeds:

1. **SFT**: π_SFT per seed, fine-tuned on ``--demos`` demonstrations; π_0
   is the same network at its initialisation.
2. **Reward models**: one per source (Init–SFT, Init–Demo, SFT–Demo) and
   seed, started from π_SFT's parameters, trained on 256 episodes of each
   role; plus the analytic r_c = log π_SFT − log π_0.
3. **Best-of-N**: for the same ``--prompts`` fixed task instances, K =
   ``--rollouts`` completions of each seed's π_SFT, picked by each reward;
   curves over N = 1 … K of the true score (the episode return:
   success + 0.1 × graded progress) and of success, against π_SFT's mean,
   the demonstrator's mean on the same instances, and oracle best-of-N;
   Spearman ρ of each reward against the true score within a prompt.
4. **RL**: REINFORCE with a leave-one-out baseline against the Init–SFT
   reward model with a per-token KL penalty to π_SFT, one run per (seed,
   KL coefficient) in one compiled program; the true score and the learned
   reward over training.

Every stage is a run of the engine under ``--out/runs/<task>/<stage>``; a
killed experiment resumes where it stopped with the same command. Writes
``--out/results.json``, ``table.md``, ``best_of_n.png`` and ``rl.png``.

    python experiments/lm_alignment/run.py               # CPU size (README.md has its wall time)
    python experiments/lm_alignment/run.py --scale 4     # 4× updates and rollouts (GPU)
    python experiments/lm_alignment/run.py --quick       # a few-minute smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

#: The tasks, their difficulty knobs and their demonstrators (README.md says why): on
#: repair the scripted expert with token noise ε = 0.1 (success about 0.77); on arith and
#: exchange an expert LM, a tiny transformer fine-tuned for 80 updates on 256 clean expert
#: episodes and sampled (the tiny student does not learn to copy operands from ε-noisy
#: arith demos).
TASKS = {
    "tokens:repair": dict(knobs=dict(length=16, faults=4, values=32, max_turns=16), epsilon=0.1),
    "tokens:arith": dict(knobs=dict(num_ops=4, modulus=31, max_turns=8), lm_updates=80),
    "tokens:exchange": dict(knobs=dict(half=3, values=32, sort=False, max_turns=6), lm_updates=80),
}
SOURCES = ("init-sft", "init-demo", "sft-demo")
KL_COEFS = (0.0, 0.01, 0.1, 1.0)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--demos", type=int, default=512, help="demonstrations per task")
    p.add_argument("--source-episodes", type=int, default=256,
                   help="episodes of each role (π_0, π_SFT, demos) a reward model trains on")
    p.add_argument("--sft-updates", type=int, default=300)
    p.add_argument("--rm-updates", type=int, default=100)
    p.add_argument("--rm-lr", type=float, default=3e-4)
    p.add_argument("--read", choices=("token", "turn", "last"), default="token",
                   help="where the reward models read: every agent token, each turn's <eot>, "
                        "or the episode's last token (jaxil.algorithms.lm.reward.read_mask)")
    p.add_argument("--prompts", type=int, default=16, help="best-of-N task instances")
    p.add_argument("--rollouts", type=int, default=256, help="best-of-N completions per prompt")
    p.add_argument("--rl-updates", type=int, default=80)
    p.add_argument("--kl", type=float, nargs="+", default=list(KL_COEFS))
    p.add_argument("--scale", type=int, default=1,
                   help="multiply the updates of every stage (a GPU run)")
    p.add_argument("--quick", action="store_true", help="a few-minute smoke run")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--report-only", action="store_true",
                   help="rebuild table.md and the plots from --out/results.json")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.demos, args.source_episodes = 2, 64, 64
        args.sft_updates, args.rm_updates, args.rl_updates = 40, 20, 4
        args.prompts, args.rollouts, args.kl = 4, 16, [0.0, 0.1]
    for name in ("sft_updates", "rm_updates", "rl_updates"):
        setattr(args, name, getattr(args, name) * args.scale)
    return args


def _stack(trees, concat: bool = False):
    import jax
    import jax.numpy as jnp
    return jax.tree.map(lambda *xs: (jnp.concatenate if concat else jnp.stack)(xs), *trees)


def demonstrator_of(env, task: dict, progress: bool, runs: Path):
    """``(policy, params, rows)`` of the task's demonstrator: the scripted
    expert with token noise ε (``params`` None), or an *expert LM* (a tiny
    transformer fine-tuned on 256 clean scripted-expert episodes for
    ``lm_updates`` updates, sampling; ``rows`` its SFT rows)."""
    import jax

    from jaxil.algorithms.lm import sft
    from jaxil.envs.experts import scripted_expert
    from jaxil.envs.policies import as_policy, epsilon_mixture

    expert = scripted_expert(env)[0]
    if "epsilon" in task:
        return epsilon_mixture(as_policy(expert), env.spec, task["epsilon"]), None, []
    clean = sft.collect_demos(env, expert, None, jax.random.PRNGKey(100), 256)
    cfg = sft.SFTConfig(batch_episodes=16, num_updates=task["lm_updates"],
                        eval_every=task["lm_updates"], eval_episodes=128,
                        deterministic_eval=False)
    d = runs / "expert_lm"
    res = sft.train_sft(env, clean, cfg, seeds=(100,), out_dir=d, resume=d.exists(),
                        progress=progress)
    lm = sft.make_student(env, cfg)
    return lm.policy(), jax.tree.map(lambda x: x[0], res.state.params), res.rows


def _std_outside(a_mean, a_std, b_mean, b_std):
    """Whether two seed means differ by more than one standard deviation of each."""
    return abs(a_mean - b_mean) > max(a_std, b_std)


def run_task(env_id: str, args) -> dict:
    import jax
    import jax.numpy as jnp

    from jaxil import envs
    from jaxil.algorithms.lm import align as A
    from jaxil.algorithms.lm import best_of_n as B
    from jaxil.algorithms.lm import reward as R
    from jaxil.algorithms.lm import sft

    task = TASKS[env_id]
    env = envs.make(env_id, **task["knobs"])
    runs = Path(args.out) / "runs" / env_id.replace(":", "-")
    progress = not args.no_progress
    seeds = list(range(args.seeds))
    timings = {}
    t0 = time.time()

    # -- the demonstrator ---------------------------------------------------------------
    demonstrator, demonstrator_params, lm_rows = demonstrator_of(env, task, progress, runs)
    demos = sft.collect_demos(env, demonstrator, demonstrator_params, jax.random.PRNGKey(1),
                              args.demos)
    held_demos = sft.collect_demos(env, demonstrator, demonstrator_params, jax.random.PRNGKey(2),
                                   64)
    timings["demonstrator_s"] = time.time() - t0

    # -- SFT -------------------------------------------------------------------------------
    t = time.time()
    sft_cfg = sft.SFTConfig(batch_episodes=16, num_updates=args.sft_updates,
                            eval_every=args.sft_updates // 2, eval_episodes=128,
                            deterministic_eval=False)
    sft_dir = runs / "sft"
    res = sft.train_sft(env, demos, sft_cfg, seeds=seeds, heldout=held_demos, out_dir=sft_dir,
                        resume=sft_dir.exists(), progress=progress)
    sft_rows = res.rows
    sft_params = res.state.params
    student = sft.make_student(env, sft_cfg)
    init_params = _stack([sft.initial_params(student, s) for s in seeds])
    timings["sft_s"] = time.time() - t

    # -- the sources' episodes -----------------------------------------------------------------
    t = time.time()
    sample = student.policy()
    n = args.source_episodes
    roles = {"init": R.policy_episodes(env, student, init_params, jax.random.PRNGKey(3), n),
             "sft": R.policy_episodes(env, student, sft_params, jax.random.PRNGKey(4), n),
             "demo": _stack([demos.take(slice(0, n))] * len(seeds))}
    held = {"init": R.policy_episodes(env, student, init_params, jax.random.PRNGKey(5), 64),
            "sft": R.policy_episodes(env, student, sft_params, jax.random.PRNGKey(6), 64),
            "demo": _stack([held_demos] * len(seeds))}
    role_stats = {role: dict(win=float(jnp.mean(e.won)), score=float(jnp.mean(e.episode_return)))
                  for role, e in roles.items()}

    # -- reward models: every (source, seed) in one program, each from its seed's π_SFT ----------
    rm_cfg = R.SequenceRewardConfig(batch_episodes=16, learning_rate=args.rm_lr, read=args.read,
                                    num_updates=args.rm_updates, eval_every=args.rm_updates // 2)
    data, labels = R.stacked_sources(SOURCES, roles)
    held_data, _ = R.stacked_sources(SOURCES, held)
    rm_dir = runs / f"reward_models_{args.read}"
    rm_res = R.train_reward_model(env, data, rm_cfg, seeds * len(SOURCES), labels,
                                  _stack([sft_params] * len(SOURCES), concat=True), held_data,
                                  out_dir=rm_dir, resume=rm_dir.exists(), progress=progress)
    rm_params = rm_res.state.params
    rm = R.SequenceRewardModel(env, rm_cfg)
    timings["reward_models_s"] = time.time() - t

    # -- best-of-N -----------------------------------------------------------------------------
    t = time.time()
    prompt_keys = jax.random.split(jax.random.PRNGKey(20_000), args.prompts)  # the instance set
    same_start = jax.jit(lambda p, k: B.same_start_token_episodes(env, sample, p, prompt_keys, k,
                                                                  args.rollouts))
    demo_same = jax.jit(lambda k: B.same_start_token_episodes(env, demonstrator,
                                                              demonstrator_params, prompt_keys,
                                                              k, 64))(jax.random.PRNGKey(21_000))
    demo_score, demo_win = (float(jnp.mean(demo_same.episode_return)),
                            float(jnp.mean(demo_same.won)))
    rm_scores = jax.jit(rm.scores)
    r_c = jax.jit(lambda ps, p0, e: R.analytic_reward(student, ps, p0, e))
    bon = []
    for i, s in enumerate(seeds):
        one = lambda tree: jax.tree.map(lambda x: x[i], tree)  # noqa: E731
        eps = same_start(one(sft_params), jax.random.PRNGKey(30_000 + s))
        rewards = {src: (lambda e, j=SOURCES.index(src) * len(seeds) + i:
                         rm_scores(jax.tree.map(lambda x: x[j], rm_params), e))
                   for src in SOURCES}
        rewards["r_c"] = lambda e: r_c(one(sft_params), one(init_params), e)
        bon.append(B.token_best_of_n(eps, args.prompts, rewards))
    timings["best_of_n_s"] = time.time() - t

    # -- RL against the Init–SFT reward model, a KL sweep ----------------------------------------
    t = time.time()
    rl_cfg = A.AlignConfig(prompts=8, rollouts_per_prompt=4, learning_rate=3e-4,
                           num_updates=args.rl_updates, eval_every=args.rl_updates // 4,
                           eval_episodes=128)
    pairs = [(b, s) for b in args.kl for s in seeds]
    j0 = SOURCES.index("init-sft") * len(seeds)
    pick = lambda tree, idx: jax.tree.map(lambda x: x[jnp.asarray(idx)], tree)  # noqa: E731
    rl_dir = runs / f"rl_init_sft_{args.read}"
    rl_res = A.train_align(env, R.token_rewards_of(rm), pick(rm_params, [j0 + s for _, s in pairs]),
                           pick(sft_params, [s for _, s in pairs]), [b for b, _ in pairs],
                           [s for _, s in pairs], rl_cfg, reward_name="init-sft",
                           out_dir=rl_dir, resume=rl_dir.exists(), progress=progress)
    timings["rl_s"] = time.time() - t
    timings["total_s"] = time.time() - t0
    return dict(env_id=env_id, read=args.read, knobs=task["knobs"],
                demonstrator_kind=(f"scripted expert, token noise ε = {task['epsilon']}"
                                   if "epsilon" in task else
                                   f"expert LM (tiny, {task['lm_updates']} SFT updates on 256 "
                                   "clean expert episodes, sampled)"),
                expert_lm_rows=lm_rows,
                demonstrator=dict(demo_score=float(jnp.mean(demos.episode_return)),
                                  demo_win=float(jnp.mean(demos.won)),
                                  same_instances_score=demo_score, same_instances_win=demo_win),
                role_stats=role_stats, sft_rows=sft_rows, rm_rows=rm_res.rows,
                rm_summary=rm_res.summary, best_of_n=bon, rl_rows=rl_res.rows,
                rl_summary=rl_res.summary, timings=timings,
                settings=dict(seeds=args.seeds, demos=args.demos,
                              source_episodes=args.source_episodes,
                              sft_updates=args.sft_updates, rm_updates=args.rm_updates,
                              prompts=args.prompts, rollouts=args.rollouts,
                              rl_updates=args.rl_updates, kl=list(args.kl)))


# -- analysis ------------------------------------------------------------------------------------
def bon_table(entry: dict, metric: str = "score") -> dict:
    """Per reward: the mean ± std over seeds of the best-of-N curve and ρ."""
    reps = [b[metric] for b in entry["best_of_n"]]
    ns = reps[0]["ns"]
    out = dict(ns=ns, sft=(np.mean([r["sft_mean"] for r in reps]),
                           np.std([r["sft_mean"] for r in reps])),
               oracle=np.mean([r["oracle"] for r in reps], 0).tolist(), rewards={})
    for name in reps[0]["rewards"]:
        curves = np.array([r["rewards"][name]["curve"] for r in reps])
        rho = np.array([r["rewards"][name]["spearman"] for r in reps])
        lengths = [b.get("length_spearman", {}).get(name) for b in entry["best_of_n"]]
        lengths = [x for x in lengths if x is not None]
        out["rewards"][name] = dict(length_rho=float(np.nanmean(lengths)) if lengths else None,
                                    curve_mean=curves.mean(0).tolist(),
                                    curve_std=curves.std(0).tolist(),
                                    best_n=int(ns[int(np.argmax(curves.mean(0)))]),
                                    rho_mean=float(np.nanmean(rho)), rho_std=float(np.nanstd(rho)))
    return out


def rl_table(entry: dict) -> list[dict]:
    """Per KL coefficient: the true score, success, learned reward and KL at
    the start (π_SFT) and at the end, mean ± std over seeds, and whether the
    learned reward rose while the true score fell (hacking)."""
    rows = entry["rl_rows"]
    first, last = min(r["update"] for r in rows), max(r["update"] for r in rows)
    out = []
    for b in sorted({r["kl_coef"] for r in rows}):
        at = lambda u: [r for r in rows if r["kl_coef"] == b and r["update"] == u]  # noqa: E731
        f = lambda rs, k: (float(np.mean([r[k] for r in rs])),  # noqa: E731
                           float(np.std([r[k] for r in rs])))
        s, e = at(first), at(last)
        row = dict(kl_coef=b, start_return=f(s, "eval_return"), end_return=f(e, "eval_return"),
                   start_win=f(s, "eval_win_rate"), end_win=f(e, "eval_win_rate"),
                   start_reward=f(s, "eval_reward"), end_reward=f(e, "eval_reward"),
                   end_kl=f(e, "eval_kl"))
        row["hacking"] = (row["end_reward"][0] > row["start_reward"][0]
                          and row["end_return"][0] < row["start_return"][0])
        row["beats_sft"] = row["end_return"][0] - row["start_return"][0] > max(
            row["end_return"][1], row["start_return"][1])
        out.append(row)
    return out


def write_report(entries: list[dict], out: Path) -> str:
    pm = lambda m, s: f"{m:.3f} ± {s:.3f}"  # noqa: E731
    lines = ["# Alignment from demonstrations on the token tasks", ""]
    for e in entries:
        t, d = bon_table(e), e["demonstrator"]
        lines += [f"## {e['env_id']} ({', '.join(f'{k}={v}' for k, v in e['knobs'].items())}), "
                  f"reward read: {e.get('read', 'token')}",
                  "", f"Demonstrator: {e['demonstrator_kind']}.", "",
                  f"Demonstrator on the best-of-N instances: score {d['same_instances_score']:.3f}, "
                  f"success {d['same_instances_win']:.3f}. π_SFT: score {pm(*t['sft'])}. "
                  f"Oracle best-of-{t['ns'][-1]}: {t['oracle'][-1]:.3f}.", "",
                  "| reward | ρ (within prompt) | best-of-1 | best-of-16 | best-of-"
                  f"{t['ns'][-1]} | best N: score | beats demonstrator (1 std) | ρ with length |",
                  "|---|---|---|---|---|---|---|---|"]
        i16 = t["ns"].index(16) if 16 in t["ns"] else -1
        for name, r in t["rewards"].items():
            m, s = np.array(r["curve_mean"]), np.array(r["curve_std"])
            best = int(np.argmax(m))
            beats = m[best] - s[best] > d["same_instances_score"]
            lines.append(f"| {name} | {pm(r['rho_mean'], r['rho_std'])} | {pm(m[0], s[0])} | "
                         f"{pm(m[i16], s[i16])} | {pm(m[-1], s[-1])} | "
                         f"{r['best_n']}: {pm(m[best], s[best])} | {'yes' if beats else 'no'} | "
                         + (f"{r['length_rho']:.3f} |" if r["length_rho"] is not None else "– |"))
        lines += ["", "RL against the Init–SFT reward model (start = π_SFT):", "",
                  "| KL coef | true score start → end | success start → end | learned reward "
                  "start → end | KL to π_SFT | beats π_SFT (1 std) | hacking |",
                  "|---|---|---|---|---|---|---|"]
        for r in rl_table(e):
            lines.append(f"| {r['kl_coef']:g} | {pm(*r['start_return'])} → {pm(*r['end_return'])} | "
                         f"{pm(*r['start_win'])} → {pm(*r['end_win'])} | "
                         f"{r['start_reward'][0]:.1f} → {pm(*r['end_reward'])} | "
                         f"{pm(*r['end_kl'])} | {'yes' if r['beats_sft'] else 'no'} | "
                         f"{'yes' if r['hacking'] else 'no'} |")
        tm = e["timings"]
        lines += ["", "Wall time: " + ", ".join(f"{k[:-2]} {v:.0f} s" for k, v in tm.items())
                  + f" (`{e.get('command', '')}`)", ""]
    text = "\n".join(lines)
    (out / "table.md").write_text(text + "\n")
    return text


def plot(entries: list[dict], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(entries), figsize=(6 * len(entries), 4.2), squeeze=False)
    for ax, e in zip(axes[0], entries):
        t = bon_table(e)
        ns = t["ns"]
        for name, r in t["rewards"].items():
            m, s = np.array(r["curve_mean"]), np.array(r["curve_std"])
            ax.plot(ns, m, marker="o", ms=3, label=name)
            ax.fill_between(ns, m - s, m + s, alpha=0.15)
        ax.plot(ns, t["oracle"], "k--", label="oracle")
        ax.axhline(e["demonstrator"]["same_instances_score"], color="grey", ls=":",
                   label="demonstrator")
        ax.axhline(t["sft"][0], color="grey", ls="-.", label="π_SFT mean")
        ax.set_xscale("log", base=2)
        ax.set(title=f"{e['env_id']}: best-of-N (read {e.get('read', 'token')})", xlabel="N",
               ylabel="true score (return)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "best_of_n.png", dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(2, len(entries), figsize=(6 * len(entries), 7), squeeze=False)
    for col, e in enumerate(entries):
        rows = e["rl_rows"]
        for b in sorted({r["kl_coef"] for r in rows}):
            steps = sorted({r["update"] for r in rows})
            for ax, key in zip(axes[:, col], ("eval_return", "eval_reward")):
                vals = [np.mean([r[key] for r in rows if r["kl_coef"] == b and r["update"] == u])
                        for u in steps]
                ax.plot(steps, vals, marker="o", ms=3, label=f"KL coef {b:g}")
        axes[0, col].set(title=f"{e['env_id']}: RL on Init–SFT (read {e.get('read', 'token')})",
                         ylabel="true score (return)")
        axes[1, col].set(xlabel="update", ylabel="learned reward")
        axes[0, col].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "rl.png", dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        entries = json.loads((out / "results.json").read_text())["tasks"]
        print(write_report(entries, out))
        plot(entries, out)
        return 0
    t0 = time.time()
    entries = []
    for env_id in args.tasks:
        entries.append(run_task(env_id, args))
        print(f"{env_id}: {entries[-1]['timings']}", flush=True)
    wall = time.time() - t0
    for e in entries:
        e["command"] = "python experiments/lm_alignment/run.py " + " ".join(sys.argv[1:])
        e["wall_seconds"] = wall
    # Merge with earlier invocations (other tasks or reads): an entry per (task, read).
    path = out / "results.json"
    new = {(e["env_id"], e["read"]) for e in entries}
    old = json.loads(path.read_text())["tasks"] if path.exists() else []
    entries = [e for e in old if (e["env_id"], e.get("read", "token")) not in new] + entries
    path.write_text(json.dumps(dict(tasks=entries), indent=1, default=float))
    print(write_report(entries, out))
    plot(entries, out)
    print(f"wall time {wall:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
