"""`jaxil export marl-eval`: run directories in marl-eval's format."""

from __future__ import annotations

from jaxil.runs.export import to_marl_eval

import json
from pathlib import Path
from typing import Optional


def _parse_metrics(specs: Optional[list[str]]) -> Optional[dict[str, str]]:
    if not specs:
        return None
    out = {}
    for s in specs:
        key, _, name = s.partition("=")
        out[key] = name or key
    return out


def _marl_eval(args) -> int:
    data = to_marl_eval(args.run_dirs, env_name=args.env_name, task_name=args.task_name,
                        algorithm_names=args.name, metrics=_parse_metrics(args.metric))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2))
    n = sum(len(a) for t in data.values() for a in t.values())
    where = ", ".join(f"{e}/{t}" for e in data for t in data[e])
    print(f"wrote {out}: {n} algorithm(s) in {where}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("export", help="write run directories in other tools' formats")
    fmt = p.add_subparsers(dest="format", metavar="FORMAT", required=True)
    m = fmt.add_parser("marl-eval", help="the raw-data JSON of InstaDeep's marl-eval",
                       description="Each grid point / regime becomes an algorithm, each seed a "
                       "run_<seed>, each evaluation a step_<i> (values are per-run means: "
                       "one-element lists); absolute_metrics are the final evaluation's.")
    m.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    m.add_argument("--out", required=True, help="the JSON file to write")
    m.add_argument("--env-name", default=None, help="default: env_id's part before ':'")
    m.add_argument("--task-name", default=None, help="default: env_id's part after ':'")
    m.add_argument("--name", action="append", default=None, metavar="NAME",
                   help="algorithm name prefix, once per RUN_DIR in order (default: the learner)")
    m.add_argument("--metric", action="append", default=None, metavar="KEY[=NAME]",
                   help="metrics.jsonl key to export, optionally renamed (repeatable; default "
                        "eval_return=return and eval_win_rate=win_rate)")
    m.set_defaults(func=_marl_eval)
