"""`jaxil label` and `jaxil pipeline`: Phase 1 labels from the command line."""

from __future__ import annotations

from jaxil.algorithms.labelling.pipeline import (LabelOutcome, ORACLES, load_callable, make_oracle,
                                                 phase1, write_labels)
from jaxil.algorithms.labelling.oracles import LabellerTimeout
from jaxil.data.preferences import num_distinct_pairs

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence
import numpy as np
from jaxil.cli.args import (add_hidden, add_loggers, add_progress, make_loggers, nonneg_int,
                            positive_float, positive_int, probability)
from jaxil.runs.loggers import LoggerFactory, prefixed
from jaxil.cli import stop
from jaxil.data.format import Dataset
from jaxil.runs.io_atomic import atomic_write_text, check_file_writable
from jaxil.algorithms.labelling.label import (
    summary_line,
    to_json,
)
from jaxil.data.preferences import dataset_id


def _flip_rate(text: str) -> float:
    """A flip probability in [0, 0.5] (above 0.5 the labels mostly lie)."""
    x = probability(text)
    if x > 0.5:
        raise argparse.ArgumentTypeError(f"must be in [0, 0.5], got {text} (above 0.5 the "
                                         "labels mostly lie)")
    return x


def _fraction(text: str) -> float:
    """A fraction in (0, 1]."""
    x = positive_float(text)
    if x > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return x


# An LLM reply takes seconds, a slow one a minute or two; five minutes of
# silence means a dead connection or a stuck service. Stopping then costs
# little: the answers so far are in --cache and a rerun reuses them.
_DEFAULT_TIMEOUT = 300.0


def _phase1_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--oracle", choices=ORACLES, default="ground_truth")
    p.add_argument("--flip-rate", type=_flip_rate, default=0.0,
                   help="ground_truth oracle: probability of flipping each answer, in [0, 0.5]")
    p.add_argument("--external", default=None, help="MODULE:FUNCTION, a callable str -> '#1'|'#2'")
    p.add_argument("--cache", default=None,
                   help="external oracle: JSONL answer cache; a rerun with the same cache "
                        "reuses its answers")
    p.add_argument("--timeout", type=positive_float, default=None, metavar="SECONDS",
                   help=f"external oracle: seconds one call of the labeller may take; a call "
                        f"still silent then stops the run, the answers so far kept in --cache "
                        f"(default {_DEFAULT_TIMEOUT:g}: far above an LLM's reply, yet a hung "
                        f"labeller is noticed; 'inf' = no limit, e.g. for a person answering)")
    p.add_argument("--queries", type=positive_int, default=1000,
                   help="query budget: distinct pairs asked (at most all pairs of the dataset)")
    p.add_argument("--segment-len", type=positive_int, default=None,
                   help="steps per segment (default: whole)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--top-k", type=positive_int, default=None,
                   help="label this many trajectories expert")
    g.add_argument("--top-frac", type=_fraction, default=None, help="... or this fraction, in (0, 1]")
    p.add_argument("--label-updates", type=positive_int, default=1000, help="O-MAPL updates")
    p.add_argument("--label-seeds", type=positive_int, default=3, help="O-MAPL seeds (ensembled)")
    add_hidden(p, (64, 64), flag="--label-hidden", help="O-MAPL widths")
    p.add_argument("--pairs-per-batch", type=positive_int, default=8, help="O-MAPL batch (pairs)")
    p.add_argument("--seed", type=nonneg_int, default=0)
    add_loggers(p)
    add_progress(p)


def _check_phase1_args(args) -> Optional[Callable[[str], str]]:
    """What can be refused before the dataset is loaded or built: oracle
    options that do not fit the oracle, an --external that does not load, an
    answer cache that cannot be written. Returns the --external callable."""
    if args.flip_rate and args.oracle != "ground_truth":
        raise ValueError("--flip-rate applies to the ground_truth oracle only")
    if args.oracle != "external" and (args.external or args.cache or args.timeout is not None):
        raise ValueError(f"--external, --cache and --timeout apply to the external oracle only, "
                         f"not --oracle {args.oracle}")
    if args.oracle == "external" and not args.external:
        raise ValueError("the external oracle needs a callable: --external MODULE:FUNCTION "
                         "(a function str -> '#1' | '#2')")
    ext = load_callable(args.external) if args.external else None
    if args.cache:
        from jaxil.algorithms.labelling.oracles import check_cache_writable

        check_cache_writable(args.cache)
    return ext


def _run_phase1(ds: Dataset, args, ext: Optional[Callable[[str], str]] = None,
                loggers: Sequence[LoggerFactory] = ()) -> LabelOutcome:
    if ext is None and args.external:
        ext = load_callable(args.external)
    timeout = _DEFAULT_TIMEOUT if args.timeout is None else args.timeout
    oracle = make_oracle(args.oracle, flip_rate=args.flip_rate, seed=args.seed, external=ext,
                         cache=args.cache, timeout=timeout, progress=not args.no_progress)
    top_k = args.top_k
    if top_k is None and args.top_frac is None:
        top_k = int(np.sum(ds.expert)) or None
        if top_k is None:
            raise ValueError("the dataset marks no expert trajectories to size the labels by; "
                             "pass --top-k or --top-frac")
        print(f"labelling the top {top_k} trajectories (the dataset's expert count; "
              "change with --top-k / --top-frac)")
    total = num_distinct_pairs(ds, args.segment_len)
    if 0 < total < args.queries:  # phase1 asks each distinct pair once
        what = ("" if args.segment_len is None else
                f" (segments of {args.segment_len} steps)")
        print(f"--queries {args.queries} exceeds the {total} distinct pairs of this "
              f"dataset{what}; asking {total}")
    try:
        out = phase1(ds, oracle, queries=args.queries, segment_len=args.segment_len, top_k=top_k,
                     top_frac=args.top_frac, seeds=args.label_seeds, updates=args.label_updates,
                     seed=args.seed, progress=not args.no_progress,
                     hidden=tuple(args.label_hidden), batch_size=args.pairs_per_batch,
                     loggers=loggers)
    except LabellerTimeout as e:
        raise TimeoutError(_timeout_message(e, args)) from e
    rep = out.oracle["report"]
    if rep:
        print("oracle report: " + json.dumps({k: v for k, v in rep.items() if k != "failed"}))
    print(f"oracle {out.oracle['name']}: {out.oracle['answered']}/{out.oracle['queries']} "
          "distinct pairs answered")
    print(f"labels vs ground truth ({int(out.labels.sum())} labelled): {summary_line(out.metrics)}")
    return out


def _timeout_message(e: LabellerTimeout, args) -> str:
    """One line: which query went silent, what was kept, which flags help."""
    head = (f"the external labeller gave no reply to query {e.query} of {e.num_queries} "
            f"within {e.timeout:g} s")
    raise_it = "allow it longer with --timeout SECONDS ('inf' = no limit)"
    if args.cache:
        return (f"{head}; this run's {e.answered} answers are saved in {args.cache}: rerun the "
                f"same command (with --cache {args.cache}) to reuse them, and {raise_it}")
    return (f"{head}; this run's {e.answered} answers were not kept (pass --cache FILE to keep "
            f"them across runs); {raise_it}")


def _cached_answers(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def _interrupted(args, written_at_end: str, e: KeyboardInterrupt) -> int:
    """Ctrl-C or SIGTERM: one line saying what was kept and how to go on,
    exit status 130 or 143 ([`jaxil.cli.stop`][jaxil.cli.stop])."""
    command = getattr(args, "command", None) or "label"
    if args.oracle == "external" and args.cache:
        hint = (f"the cache {args.cache} holds {_cached_answers(args.cache)} answers; rerun the "
                f"same command (with --cache {args.cache}) and they are reused")
    elif args.oracle == "external":
        hint = ("the labeller's answers were not kept (pass --cache FILE to keep them across "
                "runs)")
    else:
        hint = "rerun the same command to start again"
    print(f"jaxil {command}: {stop.what(e)}; {written_at_end} is written only at the end; "
          f"{hint}", file=sys.stderr)
    return stop.exit_status(e)


def _provenance(ds: Dataset, args, source: str) -> dict:
    return dict(source=source, source_id=dataset_id(ds), oracle=args.oracle,
                flip_rate=args.flip_rate, queries=args.queries, segment_len=args.segment_len,
                top_k=args.top_k, top_frac=args.top_frac, label_updates=args.label_updates,
                label_seeds=args.label_seeds, seed=args.seed)


def _label_cmd(args) -> int:
    try:
        return _label(args)
    except KeyboardInterrupt as e:
        if getattr(args, "debug", False):
            raise
        return _interrupted(args, "the labelled copy", e)


def _label(args) -> int:
    from jaxil.collect.recipes import load_dataset

    src = Path(args.dataset)
    if args.out:
        out = Path(args.out)
    else:
        stem = src.stem if src.exists() else args.dataset.replace("/", "-")
        out = Path("runs/labels") / f"{stem}-{args.oracle}.npz"
    if src.exists() and out.resolve() == src.resolve():
        raise ValueError("--out is the input dataset; `jaxil label` never modifies its input, "
                         "choose another path")
    # Before the dataset is loaded (or built) and the oracle asked.
    check_file_writable(out, "--out")
    check_file_writable(out.with_suffix(".labels.json"), "--out's sidecar")
    ext = _check_phase1_args(args)
    logs = make_loggers(args)
    ds = load_dataset(args.dataset)
    outcome = _run_phase1(ds, args, ext, logs)
    side = write_labels(ds, outcome, out, _provenance(ds, args, args.dataset))
    print(f"wrote {out} and {side}")
    return 0


def _pipeline_cmd(args) -> int:
    try:
        return _pipeline(args)
    except KeyboardInterrupt as e:
        if getattr(args, "debug", False):
            raise
        return _interrupted(args, "pipeline.json", e)


def _pipeline(args) -> int:
    from jaxil.collect.recipes import env_short
    from jaxil.data.environment import dataset_env
    from jaxil.algorithms.offline import LearnerData, make_learner
    from jaxil.runs.rundir import check_writable
    from jaxil.algorithms.offline.train import expand_grid, train
    from jaxil.collect.recipes import load_dataset

    t0 = time.perf_counter()
    if args.evals > args.updates:
        raise ValueError(f"--evals {args.evals} is more than --updates {args.updates}; "
                         "give at most one evaluation per update")
    if args.out:  # before the dataset, Phase 1 and the training runs
        check_writable(Path(args.out))
    ext = _check_phase1_args(args)
    logs = make_loggers(args, args.out)
    env_id = args.env if ":" in args.env else args.env.replace("-", ":", 1)
    ds = load_dataset(args.dataset or f"{env_short(env_id)}/{args.recipe}")
    if ds.spec.env_id != env_id:
        raise ValueError(f"the dataset was recorded on {ds.spec.env_id}, not {env_id}")
    env = dataset_env(ds)
    print(f"dataset {ds.info.recipe}: {ds.num_trajectories} trajectories, "
          f"{int(ds.expert.sum())} expert (hidden from Phase 1)")
    outcome = _run_phase1(ds, args, ext, [prefixed(f, "omapl-") for f in logs])
    settings = {"phase1": outcome.labels}
    if args.compare:
        settings.update(ground_truth=np.asarray(ds.expert, bool),
                        no_phase1=np.ones(ds.num_trajectories, bool))
    learner = make_learner(args.algo, ds.spec, hidden=tuple(args.hidden), batch_size=args.batch_size)
    results = {}
    for name, labels in settings.items():
        s = train(learner, env, LearnerData.from_dataset(ds, labels),
                  runs=expand_grid({}, args.seeds), num_updates=args.updates,
                  eval_every=args.updates // args.evals, eval_episodes=args.eval_episodes,
                  base_seed=args.seed, progress=not args.no_progress,
                  loggers=[prefixed(f, f"{name}-") for f in logs])
        results[name] = {k: s["points"][0][k] for k in
                         ("return_mean", "return_std", "win_mean", "win_std", "returns")}
    summary = dict(env=ds.spec.env_id, recipe=ds.info.recipe, algo=args.algo, seeds=args.seeds,
                   updates=args.updates, labelling=outcome.metrics, oracle=outcome.oracle,
                   phase2=results, wall_seconds=time.perf_counter() - t0)
    print(f"\n== pipeline {ds.spec.env_id}: {args.algo}, {args.seeds} seeds, {args.updates} updates ==")
    print(f"Phase 1 ({outcome.oracle['name']}, {outcome.oracle['queries']} queries): "
          f"{summary_line(outcome.metrics)}")
    names = {"phase1": "Phase-1 labels", "ground_truth": "ground-truth labels",
             "no_phase1": "no Phase 1 (all expert)"}
    for k, r in results.items():
        print(f"  {names[k]:<26} return {r['return_mean']:.3f} ± {r['return_std']:.3f}   "
              f"win {r['win_mean']:.3f} ± {r['win_std']:.3f}")
    print(f"wall time {summary['wall_seconds']:.0f}s")
    if args.out:
        out = Path(args.out)
        atomic_write_text(out / "pipeline.json", to_json(summary))
        print(f"summary in {out / 'pipeline.json'}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("label", help="Phase 1: label a dataset's trajectories from preferences")
    p.add_argument("dataset", help="dataset file or recipe name")
    p.add_argument("--out", default=None, help="labelled copy (default runs/labels/<name>-<oracle>.npz)")
    _phase1_args(p)
    p.set_defaults(func=_label_cmd)
    q = sub.add_parser("pipeline", help="unlabeled data → Phase-1 labels → MisoDICE → evaluation")
    q.add_argument("env", help="environment id, e.g. smax:3m")
    q.add_argument("--recipe", default="misodice-200e-1000p",
                   help="dataset recipe for the env (built under runs/data/ if missing)")
    q.add_argument("--dataset", default=None, help="a dataset file instead of the recipe")
    q.add_argument("--algo", default="misodice")
    q.add_argument("--seeds", type=positive_int, default=4,
                   help="seeds trained together in one program (default: 4)")
    q.add_argument("--updates", type=positive_int, default=2000)
    q.add_argument("--evals", type=positive_int, default=4)
    q.add_argument("--eval-episodes", type=positive_int, default=32)
    add_hidden(q, (128, 128))
    q.add_argument("--batch-size", type=positive_int, default=256)
    q.add_argument("--no-compare", dest="compare", action="store_false",
                   help="skip the ground-truth-label and no-Phase-1 runs")
    q.add_argument("--out", default=None, help="directory for pipeline.json")
    _phase1_args(q)
    q.set_defaults(func=_pipeline_cmd)
