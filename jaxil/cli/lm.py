"""``jaxil lm``: transformer students on the token tasks.

::

    jaxil lm sft --env tokens:arith --demos 256 --seeds 2 --out runs/sft-arith
    jaxil lm interactive oec --env tokens:repair --budget 4000 --seeds 4 --out runs/oec
    jaxil lm interactive gated --env tokens:repair --budget 4000 --entropy-gate 0.3
    jaxil lm interactive oec --env tokens:repair --budget 4000 --out runs/oec --resume

``sft`` fine-tunes a transformer on the scripted expert's episodes
(behaviour cloning, :mod:`jaxil.algorithms.lm.sft`); with ``--out`` the
trained students are kept in ``OUT/students`` (with ``students.json``).
``interactive`` runs one method of :mod:`jaxil.algorithms.lm.interactive`
(``bc``, ``dagger``, ``oec``, ``oec_mix``, ``onpolicy`` or ``gated``)
against the task's scripted expert, or with ``--expert SFT_DIR`` against an
*expert LM* (a student of ``jaxil lm sft``, e.g. a larger transformer
fine-tuned on many demonstrations, acting greedily), with budgets in
expert tokens and OEC's switch in turns::

    jaxil lm sft --env tokens:repair --size mini --demos 1536 --out runs/expert-lm
    jaxil lm interactive oec --env tokens:repair --budget 2000 --expert runs/expert-lm
Both run on the run engine: ``--out`` holds ``run.json``, ``metrics.jsonl``,
orbax checkpoints and ``results.json``; ``--resume`` continues a stopped run
and reproduces the uninterrupted one.
"""

from __future__ import annotations

import argparse

from jaxil.cli.args import (add_progress, add_run_dir, add_seeds, nonneg_float, nonneg_int,
                            positive_float, positive_int)
from jaxil.cli.interactive import add_method_knobs, knob_overrides


def _token_env(env_id: str, knobs: list[str]):
    from jaxil import envs
    from jaxil.envs.experts import scripted_expert

    if not env_id.startswith("tokens:"):
        raise ValueError(f"{env_id} is not a token task; jaxil lm trains transformers on "
                         "tokens:repair, tokens:arith or tokens:exchange (see `jaxil envs`)")
    kwargs = {}
    for item in knobs:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--task-knob {item!r} is not NAME=VALUE (e.g. faults=4)")
        try:
            kwargs[name] = int(value)
        except ValueError:
            raise ValueError(f"--task-knob {name} must be an integer, got {value!r}") from None
    try:
        env = envs.make(env_id, **kwargs)
    except TypeError as e:
        raise ValueError(f"{env_id} does not take {sorted(kwargs)}: {e}") from None
    return env, scripted_expert(env)[0], kwargs


STUDENTS = "students"


def _save_students(out: str, env_id: str, knobs: dict, cfg, seeds: list[int], params) -> None:
    import json
    from pathlib import Path

    from jaxil.runs.checkpoint import save_tree

    save_tree(Path(out) / STUDENTS, params)
    (Path(out) / f"{STUDENTS}.json").write_text(json.dumps(dict(
        env_id=env_id, knobs=knobs, size=cfg.size, agent_ids=cfg.agent_ids, seeds=seeds)))


def load_expert_lm(path: str, env, knobs: dict, seed_index: int = 0):
    """``(policy, params, name)`` of the student ``seed_index`` saved by
    ``jaxil lm sft --out PATH``, acting greedily, for ``env`` (refused in
    one line when it was trained on another task or setting)."""
    import json
    from pathlib import Path

    import jax

    from jaxil.nn.transformer import TransformerPolicy, config_for_env
    from jaxil.runs.checkpoint import params_digest, restore_tree

    meta_path = Path(path) / f"{STUDENTS}.json"
    if not meta_path.is_file():
        raise ValueError(f"--expert {path}: no {STUDENTS}.json there; pass `scripted` or the "
                         "--out directory of a finished `jaxil lm sft` run")
    meta = json.loads(meta_path.read_text())
    if meta["env_id"] != env.spec.env_id or meta["knobs"] != knobs:
        raise ValueError(f"--expert {path} was trained on {meta['env_id']} {meta['knobs']}, not "
                         f"{env.spec.env_id} {knobs}; give the same --env and --task-knob")
    if not 0 <= seed_index < len(meta["seeds"]):
        raise ValueError(f"--expert-seed {seed_index}: {path} holds {len(meta['seeds'])} students")
    policy = TransformerPolicy(config_for_env(env, meta["size"], agent_ids=meta["agent_ids"]))
    like = jax.vmap(policy.init)(jax.random.split(jax.random.PRNGKey(0), len(meta["seeds"])))
    params = jax.tree.map(lambda x: x[seed_index], restore_tree(Path(path) / STUDENTS, like))
    return policy.policy(deterministic=True), params, f"lm:{meta['size']}:{params_digest(params)}"


def _sft(args) -> int:
    import jax

    from jaxil.algorithms.lm import sft

    env, expert, knobs = _token_env(args.env, args.task_knob)
    cfg = sft.SFTConfig(size=args.size, agent_ids=args.agent_ids, learning_rate=args.lr,
                        batch_episodes=args.batch_episodes, num_updates=args.updates,
                        eval_every=args.eval_every, eval_episodes=args.eval_episodes)
    demos = sft.collect_demos(env, expert, None, jax.random.PRNGKey(args.seed + 777_777),
                              args.demos + args.heldout)
    train, held = demos.take(slice(0, args.demos)), demos.take(slice(args.demos, None))
    seeds = list(range(args.seed, args.seed + args.seeds))
    res = sft.train_sft(env, train, cfg, seeds=seeds,
                        heldout=held if args.heldout else None, out_dir=args.out,
                        resume=args.resume, overwrite=args.overwrite,
                        progress=not args.no_progress)
    last = max(r["update"] for r in res.rows)
    for r in res.rows:
        if r["update"] == last:
            extra = (f", held-out NLL {r['eval_nll']:.3f}, accuracy {r['eval_accuracy']:.3f}"
                     if "eval_nll" in r else "")
            print(f"seed {r['seed']}: win rate {r['eval_win_rate']:.3f}, return "
                  f"{r['eval_return']:.3f}{extra}")
    if args.out:
        _save_students(args.out, env.spec.env_id, knobs, cfg, seeds, res.state.params)
        print(f"results in {args.out}; the students in {args.out}/{STUDENTS}")
    return 0


def _interactive(args) -> int:
    from jaxil.algorithms.lm import interactive as TI

    env, expert, knobs = _token_env(args.env, args.task_knob)
    expert_params, expert_name = None, "scripted"
    if args.expert != "scripted":
        expert, expert_params, expert_name = load_expert_lm(args.expert, env, knobs,
                                                            args.expert_seed)
    config = TI.TokenInteractiveConfig(
        size=args.size, agent_ids=args.agent_ids, batch_episodes=args.batch_episodes,
        rounds=args.rounds, episodes_per_round=args.episodes_per_round,
        updates_per_round=args.updates_per_round, sft_tokens=args.sft_tokens,
        sft_updates=args.sft_updates, capacity=args.capacity, eval_episodes=args.eval_episodes)
    over = knob_overrides(args, env.spec)
    if args.entropy_gate is not None:
        over["entropy_gate"] = args.entropy_gate
    regime = TI.token_regime(args.method, args.budget, sft_tokens=args.sft_tokens, **over)
    name = args.name or f"{args.method}@{args.budget}"
    res = TI.run(env, expert, expert_params, [(name, regime)], seeds=args.seeds, config=config,
                 base_seed=args.seed, out_dir=args.out, resume=args.resume,
                 overwrite=args.overwrite, eval_every=args.eval_every,
                 progress=not args.no_progress, expert_name=expert_name)
    print(TI.format_table(res.summary))
    print(f"wall time {res.summary['wall_seconds']:.1f}s"
          + (f"; results in {args.out}" if args.out else ""))
    return 0


def _common(p, size_default: str = "tiny") -> None:
    from jaxil.nn.transformer import SIZES

    p.add_argument("--env", required=True, help="token task id, e.g. tokens:repair")
    p.add_argument("--task-knob", action="append", default=[], metavar="NAME=VALUE",
                   help="a difficulty knob of the task, e.g. faults=4 (repeatable)")
    p.add_argument("--size", choices=list(SIZES), default=size_default,
                   help="the student transformer's size")
    p.add_argument("--agent-ids", action="store_true", help="learned agent-id embedding")
    add_seeds(p)


def register(sub) -> None:
    from jaxil.algorithms.lm.interactive import TOKEN_METHODS, TokenInteractiveConfig
    from jaxil.algorithms.lm.sft import SFTConfig

    lm = sub.add_parser("lm", help="transformer students on token tasks: sft, interactive",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    lsub = lm.add_subparsers(dest="lm_command", metavar="COMMAND", required=True)

    s = lsub.add_parser("sft", help="fine-tune a transformer on the scripted expert's episodes")
    _common(s)
    d = SFTConfig()
    s.add_argument("--demos", type=positive_int, default=256, help="demonstration episodes")
    s.add_argument("--heldout", type=nonneg_int, default=64,
                   help="held-out demonstration episodes scored at each evaluation (0: none)")
    s.add_argument("--updates", type=positive_int, default=d.num_updates)
    s.add_argument("--eval-every", type=positive_int, default=d.eval_every)
    s.add_argument("--batch-episodes", type=positive_int, default=d.batch_episodes)
    s.add_argument("--lr", type=positive_float, default=d.learning_rate)
    s.add_argument("--eval-episodes", type=positive_int, default=d.eval_episodes)
    add_run_dir(s)
    add_progress(s)
    s.set_defaults(func=_sft)

    i = lsub.add_parser("interactive", help="bc, dagger, oec, oec_mix, onpolicy or gated on a "
                                            "token task")
    i.add_argument("method", choices=TOKEN_METHODS)
    _common(i)
    i.add_argument("--budget", type=positive_int, required=True,
                   help="total expert tokens, demonstrations included")
    i.add_argument("--name", default=None, help="regime label (default METHOD@BUDGET)")
    i.add_argument("--expert", default="scripted",
                   help="scripted (the task's scripted expert) or the --out directory of a "
                        "`jaxil lm sft` run (an expert LM, acting greedily)")
    i.add_argument("--expert-seed", type=nonneg_int, default=0,
                   help="which of that run's students is the expert")
    c = TokenInteractiveConfig()
    i.add_argument("--rounds", type=positive_int, default=c.rounds)
    i.add_argument("--episodes-per-round", type=positive_int, default=c.episodes_per_round)
    i.add_argument("--updates-per-round", type=positive_int, default=c.updates_per_round)
    i.add_argument("--sft-tokens", type=positive_int, default=c.sft_tokens,
                   help="expert tokens of the shared SFT start")
    i.add_argument("--sft-updates", type=positive_int, default=c.sft_updates)
    i.add_argument("--capacity", type=nonneg_int, default=c.capacity,
                   help="episodes the buffer holds (0: rounds × episodes per round)")
    i.add_argument("--batch-episodes", type=positive_int, default=c.batch_episodes)
    i.add_argument("--lr", type=positive_float, default=None)
    i.add_argument("--eval-episodes", type=positive_int, default=c.eval_episodes)
    i.add_argument("--eval-every", type=positive_int, default=1, help="rounds between evaluations")
    k = add_method_knobs(i, steps="turns")
    k.add_argument("--entropy-gate", type=nonneg_float, default=None,
                   help="gated: the expert takes over once the student's token entropy exceeds "
                        "this many nats")
    add_run_dir(i)
    add_progress(i)
    i.set_defaults(func=_interactive)
