"""`jaxil lm`: transformer students on the token tasks.

    jaxil lm sft --env tokens:arith --demos 256 --seeds 2 --out runs/sft-arith
    jaxil lm interactive oec --env tokens:repair --budget 4000 --seeds 4 --out runs/oec
    jaxil lm interactive gated --env tokens:repair --budget 4000 --entropy-gate 0.3
    jaxil lm interactive oec --env tokens:repair --budget 4000 --out runs/oec --resume
    jaxil lm sft --env tokens:arith --demo-epsilon 0.2 --seeds 2 --out runs/sft-noisy
    jaxil lm align --env tokens:arith --sft runs/sft-noisy --kl 0 0.1 --out runs/align

`sft` fine-tunes a transformer on the scripted expert's episodes
(behaviour cloning, `jaxil.algorithms.lm.sft`); with `--out` the
trained students are kept in `OUT/students` (with `students.json`).
With `--model NAME_OR_PATH` the student is a pretrained model speaking the
task's vocabulary through its own embeddings (`jaxil.nn.task_vocab`),
fine-tuned in full or, with `--lora RANK`, through low-rank adapters; with
`--out` each seed's fine-tuned model is exported as an HF directory,
`OUT/hf` (`OUT/hf-seed-S` for several seeds), and kept in the task's
vocabulary as the students, `OUT/students`, which `interactive --expert OUT`
takes as an expert LM:

    jaxil lm sft --env tokens:arith --task-knob num_ops=1 --model smollm2-135m-instruct \
        --lora 8 --demos 64 --updates 40 --eval-every 20 --batch-episodes 8 --out runs/smol
With `--model NAME_OR_PATH --chat` the task is its chat form instead
(`jaxil.envs.token_chat`): the model reads the system prompt, the tool output
and its own commands as text under its tokenizer and chat template, in its
own vocabulary; `--constrained` masks its tokens by the command grammar.
`sft` and `interactive` both take it:

    jaxil lm sft --env tokens:arith --task-knob num_ops=1 --model smollm2-135m-instruct \
        --chat --expert transcript --demos 16 --updates 40 --out runs/smol-chat
    jaxil lm interactive oec --env tokens:arith --task-knob num_ops=1 \
        --model smollm2-135m-instruct --chat --expert transcript --budget 400

`interactive` runs one method of `jaxil.algorithms.lm.interactive`
(`bc`, `dagger`, `oec`, `oec_mix`, `onpolicy` or `gated`)
against the task's scripted expert, or with `--expert SFT_DIR` against an
*expert LM* (a student of `jaxil lm sft`, e.g. a larger transformer
fine-tuned on many demonstrations, acting greedily), with budgets in
expert tokens and OEC's switch in turns; `opd` (on-policy distillation:
the student samples every turn and matches the expert LM's distribution
on every token, `--beta` GKD's β) needs an expert LM:

    jaxil lm sft --env tokens:repair --size mini --demos 1536 --out runs/expert-lm
    jaxil lm interactive oec --env tokens:repair --budget 2000 --expert runs/expert-lm
    jaxil lm interactive opd --env tokens:repair --budget 2000 --expert runs/expert-lm

`align` trains a sequence reward model between two sources of episodes
(`--reward init-sft`, AfD's pair: the students' initialisation π_0 against
the students π_SFT; or `r_c`, log π_SFT − log π_0 with no training) and
then improves every student by RL against it with a per-token KL penalty
to itself, one run per student and `--kl` coefficient
(`jaxil.algorithms.lm.align`); `--out` holds the two stages'
run directories, `OUT/reward` and `OUT/rl`.

All run on the run engine: `--out` holds `run.json`, `metrics.jsonl`,
orbax checkpoints and `results.json`; `--resume` continues a stopped run
and reproduces the uninterrupted one.
"""

from __future__ import annotations

import argparse
from typing import Optional

from jaxil.cli.args import (add_progress, add_run_dir, add_seeds, nonneg_float, nonneg_int,
                            positive_float, positive_int, probability)
from jaxil.cli import lm_generate, lm_quickstart
from jaxil.cli.interactive import add_method_knobs, knob_overrides


def _token_env(env_id: str, knobs: list[str], need_expert: bool = True,
               kind: str = "scripted"):
    """`(env, expert policy or None, knobs)` of a token task id (its expert
    of `kind`, `scripted` or `transcript`): a
    registered one (`tokens:repair`, a task of `envs.register_token_task`
    or of a `jaxil.envs` entry point) or `MODULE:CALLABLE`."""
    from jaxil import envs
    from jaxil.envs.tokens import token_specials

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
    if not (hasattr(env, "token_width") and hasattr(env, "max_context")):
        raise ValueError(f"{env_id} is not a token task; jaxil lm trains transformers on "
                         "tokens:repair, tokens:arith, tokens:exchange or a task registered "
                         "with envs.register_token_task (see `jaxil envs`)")
    token_specials(env)  # <eot> / <wait>, which the learners count turns with
    expert = envs.token_expert(env, kind)[0] if need_expert else None
    return env, expert, kwargs


STUDENTS = "students"


def _save_students(out: str, env_id: str, knobs: dict, cfg, seeds: list[int], params,
                   model=None, model_name: Optional[str] = None) -> None:
    """Write the students' parameters (stacked `[S]`) to `OUT/students` and
    what rebuilds their network to `OUT/students.json`: the task, the size
    of a student trained from scratch, or (`model`, a pretrained
    [`TaskModel`][jaxil.nn.task_vocab.TaskModel], its parameters the
    decoder's, adapters merged) the model's name, architecture and task
    vocabulary."""
    import json
    from pathlib import Path

    from jaxil.runs.checkpoint import save_tree

    meta = dict(env_id=env_id, knobs=knobs, size=cfg.size, agent_ids=cfg.agent_ids, seeds=seeds)
    if model is not None:
        from jaxil.pretrained.config import to_hf_config

        v = model.vocab
        meta.update(size=None, model=dict(
            name=str(model_name or model.source), source=model.source,
            config=to_hf_config(model.checkpoint.arch),
            vocab=dict(names=list(v.names), texts=list(v.texts),
                       pieces=[list(p) for p in v.pieces], model_vocab_size=v.model_vocab_size),
            lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha if cfg.lora_rank else None))
    save_tree(Path(out) / STUDENTS, params)
    (Path(out) / f"{STUDENTS}.json").write_text(json.dumps(meta))


def _students_meta(meta_path, flag: str) -> dict:
    """The fields of a `students.json`, each checked (one line naming the
    file, the field and the fix otherwise)."""
    import json

    from jaxil.nn.transformer import SIZES

    redo = "; write it again with `jaxil lm sft --out DIR` (do not edit it)"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{flag}: {meta_path} is not readable JSON ({e}){redo}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{flag}: {meta_path} holds {type(meta).__name__}, not an object{redo}")
    pretrained = meta.get("model") is not None
    fields = {"env_id": "a token task id", "knobs": "an object of task knobs",
              "size": "null (a pretrained model)" if pretrained else f"one of {list(SIZES)}",
              "agent_ids": "true or false", "seeds": "a non-empty list of seeds"}
    missing = [f for f in fields if f not in meta]
    if missing:
        raise ValueError(f"{flag}: {meta_path} has no {', '.join(missing)}{redo}")
    good = {
        "env_id": isinstance(meta["env_id"], str) and ":" in meta["env_id"],
        "knobs": isinstance(meta["knobs"], dict) and all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
            for k, v in meta["knobs"].items()),
        "size": meta["size"] is None if pretrained else meta["size"] in SIZES,
        "agent_ids": isinstance(meta["agent_ids"], bool),
        "seeds": isinstance(meta["seeds"], list) and len(meta["seeds"]) > 0 and all(
            isinstance(x, int) and not isinstance(x, bool) for x in meta["seeds"]),
    }
    for name, ok in good.items():
        if not ok:
            raise ValueError(f"{flag}: {meta_path} field `{name}` is {meta[name]!r}, not "
                             f"{fields[name]}{redo}")
    if pretrained and not _model_meta_ok(meta["model"]):
        raise ValueError(f"{flag}: {meta_path} field `model` is not a pretrained model's name, "
                         f"config and task vocabulary{redo}")
    return meta


def _model_meta_ok(m) -> bool:
    """Whether `students.json`'s `model` has the fields `_pretrained_config`
    reads."""
    def ints(xs):
        return isinstance(xs, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                            for x in xs)

    if not isinstance(m, dict) or not isinstance(m.get("name"), str) \
            or not isinstance(m.get("config"), dict) or not isinstance(m.get("vocab"), dict):
        return False
    v = m["vocab"]
    names, texts, pieces = v.get("names"), v.get("texts"), v.get("pieces")
    return (isinstance(names, list) and all(isinstance(x, str) for x in names)
            and isinstance(texts, list) and all(isinstance(x, str) for x in texts)
            and isinstance(pieces, list) and all(ints(p) for p in pieces)
            and len(names) == len(texts) == len(pieces) and ints([v.get("model_vocab_size")]))


def _pretrained_config(meta: dict, env, where: str):
    """The task decoder's configuration of a pretrained model's students
    (`students.json`'s `model`: its architecture and task vocabulary, no
    checkpoint read), refused in one line when the vocabulary is not
    `env`'s."""
    from jaxil.nn.task_vocab import TaskVocab, task_config
    from jaxil.pretrained import CheckpointError, from_hf_config

    m = meta["model"]
    v = m["vocab"]
    vocab = TaskVocab(tuple(v["names"]), tuple(v["texts"]), tuple(tuple(p) for p in v["pieces"]),
                      v["model_vocab_size"])
    if vocab.names != tuple(env.vocab.names):
        raise ValueError(f"{where}: {m['name']} was mapped onto a vocabulary of {len(vocab)} "
                         f"tokens, not {env.spec.env_id}'s {len(env.vocab.names)}; give the "
                         "--env and --task-knob of the `jaxil lm sft` run")
    try:
        arch = from_hf_config(m["config"])
    except CheckpointError as e:
        raise ValueError(f"{where}: field `model.config` is not a model's config ({e}); write it "
                         "again with `jaxil lm sft --out DIR` (do not edit it)") from None
    return task_config(arch, vocab, env.token_width, env.max_context)


def load_students(path: str, env, knobs: dict, flag: str = "--expert", alternative: str = "",
                  pretrained_refusal: Optional[str] = None):
    """`(TransformerPolicy, params stacked [S], students.json)` of the
    students saved by `jaxil lm sft --out PATH` for `env`: transformers of
    a `--size` trained from scratch, or a pretrained model's decoder in the
    task's vocabulary (`--model`). Refused in one line, naming `flag` and
    offering `alternative`, when there are none, when a field of
    `students.json` is missing or malformed, when they were trained on
    another task or setting, when the saved parameters do not have the
    shapes that setting needs, or (`pretrained_refusal`, the reason and
    what to do instead) when they are a pretrained model's."""
    from pathlib import Path

    import jax
    import numpy as np

    from jaxil.nn.transformer import TransformerPolicy, config_for_env
    from jaxil.runs.checkpoint import CheckpointDamaged, CheckpointMismatch, restore_tree

    meta_path = Path(path) / f"{STUDENTS}.json"
    if not meta_path.is_file():
        raise ValueError(f"{flag} {path}: no {STUDENTS}.json there; pass {alternative}the --out "
                         "directory of a finished `jaxil lm sft` run")
    meta = _students_meta(meta_path, flag)
    if meta["env_id"] != env.spec.env_id or meta["knobs"] != knobs:
        raise ValueError(f"{flag} {path} was trained on {meta['env_id']} {meta['knobs']}, not "
                         f"{env.spec.env_id} {knobs}; give the same --env and --task-knob")
    pretrained = meta.get("model") is not None
    if pretrained and pretrained_refusal:
        raise ValueError(f"{flag} {path} holds {meta['model']['name']} fine-tuned with "
                         f"`jaxil lm sft --model`; {pretrained_refusal}")
    policy = TransformerPolicy(_pretrained_config(meta, env, f"{flag} {meta_path}") if pretrained
                               else config_for_env(env, meta["size"],
                                                   agent_ids=meta["agent_ids"]))
    like = jax.eval_shape(jax.vmap(policy.init),
                          jax.random.split(jax.random.PRNGKey(0), len(meta["seeds"])))
    try:
        params = restore_tree(Path(path) / STUDENTS, like)
    except (CheckpointDamaged, CheckpointMismatch, FileNotFoundError) as e:
        raise ValueError(f"{flag} {path}: the students' parameters cannot be read ({e}); "
                         "train them again with `jaxil lm sft --out DIR`") from None
    got = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    for key, want in jax.tree_util.tree_flatten_with_path(like)[0]:
        have = tuple(np.shape(got[key]))
        if have != tuple(want.shape):
            name = "/".join(str(getattr(k, "key", k)) for k in key)
            setting = (meta["model"]["name"] if pretrained else f"at size {meta['size']}")
            raise ValueError(
                f"{flag} {path}: parameter {name} has shape {have[1:]} per student but "
                f"{env.spec.env_id} {knobs} {setting} needs {tuple(want.shape[1:])} "
                f"({have[0]} vs {want.shape[0]} students); {STUDENTS}.json does not describe "
                "these parameters, so train them again with `jaxil lm sft --out DIR`")
    return policy, params, meta


def load_expert_lm(path: str, env, knobs: dict, seed_index: int = 0):
    """`(TransformerPolicy, params, name)` of the student `seed_index`
    saved by `jaxil lm sft --out PATH` for `env` (refused in one line
    when it was trained on another task or setting): the interactive
    program acts with it greedily, and `opd` reads its distribution."""
    from pathlib import Path

    import jax

    from jaxil.runs.checkpoint import params_digest

    policy, stacked, meta = load_students(path, env, knobs, "--expert",
                                          "`scripted`, `transcript` or ")
    n = len(meta["seeds"])
    if not 0 <= seed_index < n:
        raise ValueError(f"--expert-seed {seed_index}: {path} holds {n} student"
                         f"{'s' if n > 1 else ''} (seeds {meta['seeds']}); give --expert-seed "
                         f"0{f' … {n - 1}' if n > 1 else ''}")
    params = jax.tree.map(lambda x: x[seed_index], stacked)
    label = meta["size"] if meta.get("model") is None else Path(meta["model"]["name"]).name
    return policy, params, f"lm:{label}:{params_digest(params)}"


def _check_chat_flags(args) -> None:
    """`--chat` needs `--model`; `--constrained` needs `--chat` (one line each)."""
    if args.chat and args.model is None:
        raise ValueError("--chat renders the task as text for a pretrained model; give --model "
                         "NAME_OR_PATH (e.g. smollm2-135m-instruct)")
    if args.constrained and not args.chat:
        raise ValueError("--constrained decodes the chat form's commands by their grammar; add "
                         "--chat (the private vocabulary's masks already allow only commands)")


def _chat_form(args, env, kind: str):
    """`(chat env, chat expert of kind, chat TaskModel)` of `--model` on the
    task `env` (`--constrained` decoding or free text)."""
    from jaxil.envs.token_chat import ChatEnv, chat_expert
    from jaxil.nn.task_vocab import chat_model
    from jaxil.pretrained.load import load_checkpoint

    ckpt = load_checkpoint(args.model)
    chat = ChatEnv.from_model(env, ckpt, constrained=args.constrained)
    model = chat_model(ckpt, chat)
    print(f"{args.model} in the chat form of {env.spec.env_id} ({model.vocab.describe()}; "
          f"{'constrained' if args.constrained else 'free'} decoding, up to "
          f"{chat.turn_tokens} tokens a turn, {chat.max_context} in a context)")
    return chat, chat_expert(chat, kind), model


def _add_chat_flags(p) -> None:
    p.add_argument("--chat", action="store_true",
                   help="with --model: the task's chat form under the model's tokenizer and chat "
                        "template (it writes its commands as text; jaxil.envs.token_chat) "
                        "instead of the task's private vocabulary")
    p.add_argument("--constrained", action="store_true",
                   help="with --chat: legal tokens from the command grammar's automaton, so "
                        "every command parses (default: free text, the parser judges)")


def _sft(args) -> int:
    import jax

    from jaxil.algorithms.lm import sft

    env, expert, knobs = _token_env(args.env, args.task_knob, kind=args.expert)
    _check_chat_flags(args)
    if args.model is None and args.lora is not None:
        raise ValueError("--lora adapts a pretrained model; give --model NAME_OR_PATH (e.g. "
                         "smollm2-135m-instruct) or leave out --lora")
    if args.model is not None and args.size is not None:
        raise ValueError(f"--size {args.size} sizes a student trained from scratch; --model "
                         f"{args.model} brings its own architecture: leave out --size")
    cfg = sft.SFTConfig(size=args.size or "tiny", agent_ids=args.agent_ids, learning_rate=args.lr,
                        batch_episodes=args.batch_episodes, num_updates=args.updates,
                        eval_every=args.eval_every, eval_episodes=args.eval_episodes,
                        lora_rank=args.lora, lora_alpha=args.lora_alpha)
    model = None
    if args.chat:
        env, expert, model = _chat_form(args, env, args.expert)
        sft.check_model(env, cfg, model)
    elif args.model is not None:
        from jaxil.nn.task_vocab import task_decoder

        model = task_decoder(args.model, env)
        sft.check_model(env, cfg, model)
        print(f"{args.model} in {env.spec.env_id}'s vocabulary: {model.vocab.describe()}")
    if args.demo_epsilon > 0:
        from jaxil.envs.policies import as_policy, epsilon_mixture
        expert = epsilon_mixture(as_policy(expert), env.spec, args.demo_epsilon)
    demos = sft.collect_demos(env, expert, None, jax.random.PRNGKey(args.seed + 777_777),
                              args.demos + args.heldout)
    print(f"demonstrations: success {float(demos.won.mean()):.3f}, score "
          f"{float(demos.episode_return.mean()):.3f}")
    train, held = demos.take(slice(0, args.demos)), demos.take(slice(args.demos, None))
    seeds = list(range(args.seed, args.seed + args.seeds))
    res = sft.train_sft(env, train, cfg, seeds=seeds,
                        heldout=held if args.heldout else None, out_dir=args.out,
                        resume=args.resume, overwrite=args.overwrite,
                        progress=not args.no_progress, model=model)
    last = max(r["update"] for r in res.rows)
    for r in res.rows:
        if r["update"] == last:
            extra = (f", held-out NLL {r['eval_nll']:.3f}, accuracy {r['eval_accuracy']:.3f}"
                     if "eval_nll" in r else "")
            print(f"seed {r['seed']}: win rate {r['eval_win_rate']:.3f}, return "
                  f"{r['eval_return']:.3f}{extra}")
    if args.out and model is not None:
        from pathlib import Path

        import numpy as np

        from jaxil.nn.task_vocab import export_model

        students = []
        for i, s in enumerate(seeds):
            params = sft.decoder_params(jax.tree.map(lambda x: x[i], res.state.params), cfg,
                                        model)
            d = export_model(Path(args.out) / ("hf" if len(seeds) == 1 else f"hf-seed-{s}"),
                             model, params)
            print(f"seed {s}: the fine-tuned model in {d} (HF safetensors)")
            students.append(params)
        if args.chat:  # the HF directories are the students: the model's own vocabulary
            print(f"results in {args.out}")
            return 0
        _save_students(args.out, env.spec.env_id, knobs, cfg, seeds,
                       jax.tree.map(lambda *xs: np.stack(xs), *students), model, args.model)
        print(f"results in {args.out}; the students (the task's vocabulary) in "
              f"{args.out}/{STUDENTS}")
    elif args.out:
        _save_students(args.out, env.spec.env_id, knobs, cfg, seeds, res.state.params)
        print(f"results in {args.out}; the students in {args.out}/{STUDENTS}")
    return 0


def _interactive(args) -> int:
    import warnings

    from jaxil.algorithms.lm import interactive as TI

    named = args.expert in ("scripted", "transcript")
    env, expert, knobs = _token_env(args.env, args.task_knob, need_expert=named,
                                    kind=args.expert if named else "scripted")
    expert_params, expert_name = None, args.expert
    _check_chat_flags(args)
    if args.model is not None and not args.chat:
        raise ValueError("an interactive run takes a pretrained student in the task's chat form: "
                         "add --chat to --model")
    model = None
    if args.chat:
        if not named:
            raise ValueError("with --chat the expert is the task's own, written as text: "
                             "--expert scripted or transcript")
        env, expert, model = _chat_form(args, env, args.expert)
    if not named:
        expert, expert_params, expert_name = load_expert_lm(args.expert, env, knobs,
                                                            args.expert_seed)
    config = TI.TokenInteractiveConfig(
        size=args.size, agent_ids=args.agent_ids, batch_episodes=args.batch_episodes,
        rounds=args.rounds, episodes_per_round=args.episodes_per_round,
        updates_per_round=args.updates_per_round, sft_tokens=args.sft_tokens,
        sft_updates=args.sft_updates, capacity=args.capacity, eval_episodes=args.eval_episodes,
        **({} if args.lr is None else {"learning_rate": args.lr}))
    over = knob_overrides(args, env.spec)
    if args.entropy_gate is not None:
        over["entropy_gate"] = args.entropy_gate
    if args.beta is not None:
        if args.method != TI.OPD:
            raise ValueError(f"--beta is GKD's beta of opd; {args.method}'s expert probability "
                             "is --beta0")
        over[TI.DISTILL_BETA] = args.beta
    regime = TI.token_regime(args.method, args.budget, sft_tokens=args.sft_tokens, **over)
    name = args.name or f"{args.method}@{args.budget}"
    with warnings.catch_warnings():  # the table below prints them
        warnings.simplefilter("ignore", TI.BudgetUnderspent)
        res = TI.run(env, expert, expert_params, [(name, regime)], seeds=args.seeds,
                     config=config, base_seed=args.seed, out_dir=args.out, resume=args.resume,
                     overwrite=args.overwrite, eval_every=args.eval_every,
                     progress=not args.no_progress, expert_name=expert_name, model=model)
    print(TI.format_table(res.summary))
    print(f"wall time {res.summary['wall_seconds']:.1f}s"
          + (f"; results in {args.out}" if args.out else ""))
    return 0


def _align(args) -> int:
    from pathlib import Path

    import jax
    import jax.numpy as jnp

    from jaxil.algorithms.lm import align as A
    from jaxil.algorithms.lm import reward as R
    from jaxil.algorithms.lm import sft
    from jaxil.envs.policies import as_policy, epsilon_mixture

    env, expert, knobs = _token_env(args.env, args.task_knob,
                                    need_expert=args.reward != "r_c"
                                    and "demo" in R.source_roles(args.reward))
    student, sft_params, meta = load_students(
        args.sft, env, knobs, "--sft", pretrained_refusal=(
            "align builds its π_0 and reward model as --size transformers trained from scratch, "
            "so it takes students of `jaxil lm sft` without --model (the fine-tuned model is an "
            "expert LM for `jaxil lm interactive --expert DIR`)"))
    seeds = [int(x) for x in meta["seeds"]]
    init_params = jax.tree.map(lambda *xs: jnp.stack(xs),
                               *[sft.initial_params(student, s) for s in seeds])
    out = Path(args.out) if args.out else None
    progress = not args.no_progress

    def stage(name):
        d = None if out is None else out / name
        return dict(out_dir=d, resume=bool(args.resume and d is not None and d.exists()),
                    overwrite=args.overwrite, progress=progress)

    if args.reward == "r_c":
        token_reward = lambda p, e: R.analytic_token_rewards(student, p, e)  # noqa: E731
        reward_params = {"sft": sft_params, "init": init_params}
    else:
        roles = {}
        for i, role in enumerate(("init", "sft")):
            if role in R.source_roles(args.reward):
                params = init_params if role == "init" else sft_params
                roles[role] = R.policy_episodes(env, student, params,
                                                jax.random.PRNGKey(args.seed + 3 + i),
                                                args.source_episodes)
        if "demo" in R.source_roles(args.reward):
            demonstrator = epsilon_mixture(as_policy(expert), env.spec, args.demo_epsilon)
            demos = sft.collect_demos(env, demonstrator, None, jax.random.PRNGKey(args.seed + 1),
                                      args.source_episodes)
            roles["demo"] = jax.tree.map(lambda x: jnp.stack([x] * len(seeds)), demos)
        data, labels = R.stacked_sources([args.reward], roles)
        rm_cfg = R.SequenceRewardConfig(size=meta["size"], agent_ids=meta["agent_ids"],
                                        num_updates=args.rm_updates,
                                        eval_every=args.rm_updates)
        rm_res = R.train_reward_model(env, data, rm_cfg, seeds, labels, sft_params,
                                      **stage("reward"))
        token_reward = R.token_rewards_of(R.SequenceRewardModel(env, rm_cfg))
        reward_params = rm_res.state.params

    pairs = [(b, i) for b in args.kl for i in range(len(seeds))]
    idx = jnp.asarray([i for _, i in pairs])
    pick = lambda tree: jax.tree.map(lambda x: x[idx], tree)  # noqa: E731
    cfg = A.AlignConfig(size=meta["size"], agent_ids=meta["agent_ids"], prompts=args.prompts,
                        rollouts_per_prompt=args.rollouts, learning_rate=args.lr,
                        num_updates=args.updates, eval_every=args.eval_every,
                        eval_episodes=args.eval_episodes)
    res = A.train_align(env, token_reward, pick(reward_params), pick(sft_params),
                        [b for b, _ in pairs], [seeds[i] for _, i in pairs], cfg,
                        reward_name=args.reward, **stage("rl"))
    print(A.format_table(res.summary))
    if out is not None:
        print(f"results in {out}/rl (reward model: {out}/reward)")
    return 0


def _common(p, size_default: Optional[str] = "tiny") -> None:
    from jaxil.nn.transformer import SIZES

    p.add_argument("--env", required=True,
                   help="token task id, e.g. tokens:repair, a task registered by a jaxil.envs "
                        "entry point, or MODULE:CALLABLE (e.g. mypkg.tasks:make_nav)")
    p.add_argument("--task-knob", action="append", default=[], metavar="NAME=VALUE",
                   help="a difficulty knob of the task, e.g. faults=4 (repeatable)")
    p.add_argument("--size", choices=list(SIZES), default=size_default,
                   help="the student transformer's size (default: tiny)")
    p.add_argument("--agent-ids", action="store_true", help="learned agent-id embedding")
    add_seeds(p)


def register(sub) -> None:
    from jaxil.algorithms.lm.align import AlignConfig
    from jaxil.algorithms.lm.interactive import INTERACTIVE_METHODS, TokenInteractiveConfig
    from jaxil.algorithms.lm.sft import SFTConfig

    lm = sub.add_parser("lm", help="transformer students on token tasks: sft, interactive, align",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    lsub = lm.add_subparsers(dest="lm_command", metavar="COMMAND", required=True)
    lm_quickstart.register(lsub)
    lm_generate.register(lsub)

    s = lsub.add_parser("sft", help="fine-tune a transformer on the scripted expert's episodes")
    _common(s, size_default=None)
    d = SFTConfig()
    s.add_argument("--demos", type=positive_int, default=256, help="demonstration episodes")
    s.add_argument("--heldout", type=nonneg_int, default=64,
                   help="held-out demonstration episodes scored at each evaluation (0: none)")
    s.add_argument("--updates", type=positive_int, default=d.num_updates)
    s.add_argument("--eval-every", type=positive_int, default=d.eval_every)
    s.add_argument("--batch-episodes", type=positive_int, default=d.batch_episodes)
    s.add_argument("--lr", type=positive_float, default=d.learning_rate)
    s.add_argument("--eval-episodes", type=positive_int, default=d.eval_episodes)
    s.add_argument("--expert", choices=("scripted", "transcript"), default="scripted",
                   help="the demonstrator: scripted (the task's scripted expert, which reads the "
                        "hidden state) or transcript (its expert that acts on the agent's own "
                        "context only; train an expert LM on it for `lm interactive --expert "
                        "DIR`)")
    s.add_argument("--demo-epsilon", type=probability, default=0.0,
                   help="demonstrator of stated quality: the scripted expert emits a uniformly "
                        "random legal token with this probability (default 0: the expert)")
    s.add_argument("--model", default=None, metavar="NAME_OR_PATH",
                   help="fine-tune a pretrained model (a shipped name such as "
                        "smollm2-135m-instruct, a GGUF file or an HF directory) in the task's "
                        "vocabulary instead of a --size transformer from scratch")
    _add_chat_flags(s)
    s.add_argument("--lora", type=int, default=None, metavar="RANK",
                   help="with --model: train low-rank adapters of this rank on its projection "
                        "kernels, the model frozen (default: full fine-tuning)")
    s.add_argument("--lora-alpha", type=positive_float, default=d.lora_alpha,
                   help="the adapters' alpha (the update is scaled by alpha / rank)")
    add_run_dir(s)
    add_progress(s)
    s.set_defaults(func=_sft)

    a = lsub.add_parser("align", help="RL of `jaxil lm sft` students against a learned sequence "
                                      "reward with a KL penalty to them (alignment from "
                                      "demonstrations)")
    a.add_argument("--env", required=True, help="the token task the students were trained on")
    a.add_argument("--task-knob", action="append", default=[], metavar="NAME=VALUE",
                   help="the students' task knobs (repeatable)")
    a.add_argument("--sft", required=True, help="the --out directory of a `jaxil lm sft` run")
    a.add_argument("--reward", choices=("init-sft", "init-demo", "sft-demo", "r_c"),
                   default="init-sft",
                   help="a reward model trained on this source (negatives-positives), or r_c: "
                        "log π_SFT − log π_0 (default: init-sft)")
    a.add_argument("--source-episodes", type=positive_int, default=256,
                   help="episodes of each role the reward model trains on")
    a.add_argument("--demo-epsilon", type=probability, default=0.0,
                   help="the demonstrations' token noise (sources with demo)")
    a.add_argument("--rm-updates", type=positive_int, default=200)
    a.add_argument("--kl", type=nonneg_float, nargs="+", default=[0.1],
                   help="KL coefficients, each run with every student (default 0.1)")
    ac = AlignConfig()
    a.add_argument("--updates", type=positive_int, default=ac.num_updates)
    a.add_argument("--eval-every", type=positive_int, default=ac.eval_every)
    a.add_argument("--prompts", type=positive_int, default=ac.prompts)
    a.add_argument("--rollouts", type=positive_int, default=ac.rollouts_per_prompt,
                   help="rollouts per prompt (>= 2, the leave-one-out baseline's group)")
    a.add_argument("--lr", type=positive_float, default=ac.learning_rate)
    a.add_argument("--eval-episodes", type=positive_int, default=ac.eval_episodes)
    a.add_argument("--seed", type=nonneg_int, default=0, help="base seed of the source episodes")
    add_run_dir(a, "directory of the run: OUT/reward and OUT/rl")
    add_progress(a)
    a.set_defaults(func=_align)

    i = lsub.add_parser("interactive", help="bc, dagger, oec, oec_mix, onpolicy, gated or opd "
                                            "on a token task")
    i.add_argument("method", choices=INTERACTIVE_METHODS)
    _common(i)
    i.add_argument("--budget", type=positive_int, required=True,
                   help="total expert tokens, demonstrations included")
    i.add_argument("--name", default=None, help="regime label (default METHOD@BUDGET)")
    i.add_argument("--expert", default="scripted",
                   help="scripted (the task's scripted expert, which reads the hidden state), "
                        "transcript (its expert that acts on the agent's own context only) or "
                        "the --out directory of a `jaxil lm sft` run, from scratch or --model "
                        "(an expert LM, acting greedily)")
    i.add_argument("--expert-seed", type=nonneg_int, default=0,
                   help="which of that run's students is the expert")
    i.add_argument("--model", default=None, metavar="NAME_OR_PATH",
                   help="with --chat: the student is this pretrained model (a shipped name such "
                        "as smollm2-135m-instruct, a GGUF file or an HF directory), fine-tuned "
                        "in full; --size is not used")
    _add_chat_flags(i)
    c = TokenInteractiveConfig()
    i.add_argument("--rounds", type=positive_int, default=c.rounds)
    i.add_argument("--episodes-per-round", type=positive_int, default=c.episodes_per_round)
    i.add_argument("--updates-per-round", type=positive_int, default=c.updates_per_round)
    i.add_argument("--sft-tokens", type=positive_int, default=c.sft_tokens,
                   help="expert tokens of the shared SFT start")
    i.add_argument("--sft-updates", type=nonneg_int, default=c.sft_updates,
                   help="updates of the shared SFT start (0: every run starts from the untrained "
                        "student; the --sft-tokens demonstrations stay in its data and budget)")
    i.add_argument("--capacity", type=nonneg_int, default=c.capacity,
                   help="episodes the buffer holds (0: rounds × episodes per round)")
    i.add_argument("--batch-episodes", type=positive_int, default=c.batch_episodes)
    i.add_argument("--lr", type=positive_float, default=None,
                   help=f"Adam's step size of the SFT start and the rounds (default "
                        f"{c.learning_rate:g}; full fine-tuning of a pretrained --model wants "
                        "about 1e-4)")
    i.add_argument("--eval-episodes", type=positive_int, default=c.eval_episodes)
    i.add_argument("--eval-every", type=positive_int, default=1, help="rounds between evaluations")
    k = add_method_knobs(i, steps="turns")
    k.add_argument("--entropy-gate", type=nonneg_float, default=None,
                   help="gated: the expert takes over once the student's token entropy exceeds "
                        "this many nats")
    k.add_argument("--beta", type=probability, default=None,
                   help="opd: GKD's beta of the generalized JSD to the expert LM (default 1: "
                        "the per-token reverse KL; 0: the forward KL)")
    add_run_dir(i)
    add_progress(i)
    i.set_defaults(func=_interactive)
