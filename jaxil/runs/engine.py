"""The run engine: one driver for every training program.

An algorithm contributes a [`Program`][jaxil.runs.engine.Program]: how to make
the stacked state of all its runs, one compiled chunk of work (K fused updates,
an interactive round, a PPO chunk), its evaluation, and its summary fields.
[`run`][jaxil.runs.engine.run] drives any program and owns everything else, so
that no training loop re-implements it:

- the run directory ([`jaxil.runs.rundir`][jaxil.runs.rundir]): identity,
  `resume` (refused when a setting differs), `overwrite`, metrics rows past the
  newest checkpoint dropped on resume;
- restore from the newest checkpoint that can be read and whose metrics
  rows are all kept (a damaged checkpoint, or a row lost to a cut line, moves
  the resume back, in one line, and the newer checkpoints are written
  again;
  [`restore_newest_intact`][jaxil.runs.checkpoint.restore_newest_intact]),
  and a checkpoint after every evaluation
  ([`jaxil.runs.checkpoint`][jaxil.runs.checkpoint]);
- the non-finite guard after every chunk, before anything of that chunk is
  written ([`jaxil.runs.guard`][jaxil.runs.guard]);
- the evaluation cadence, one metrics row per evaluation and run, the
  loggers ([`jaxil.runs.loggers`][jaxil.runs.loggers]), the progress bar;
- the results table (`results.json`, [`jaxil.runs.summary`][jaxil.runs.summary]).

Chunks are numbered from 0; after `c` chunks the run has reached step
`c · step_unit` of its step field (`update`, `round` or `chunk`),
which is what rows and checkpoints are keyed by. Every random key is carried
in the state or derived from the chunk index, so a resumed run reproduces the
uninterrupted one exactly.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

from jaxil.runs import guard
from jaxil.runs.checkpoint import Checkpointer, restore_newest_intact
from jaxil.runs.loggers import Logger, LoggerFactory
from jaxil.runs.rundir import RunDir, note, open_run_dir, read_jsonl


def _restore(ckpt: Checkpointer, like: Any, step: int) -> Any:
    return ckpt.restore(like, step)


def _same(x: Any) -> Any:
    return x


def _rows_due(p: "Program", step: int) -> int:
    """How many metrics rows a run of `p` has written once it reaches `step`."""
    evaluated = (set(p.eval_chunks).__contains__ if p.eval_chunks is not None
                 else lambda n: n % p.eval_every == 0)
    chunks = sum(1 for c in range(1, step // p.step_unit + 1) if p.row_every_chunk or evaluated(c))
    return len(p.run_ids) * (chunks + bool(p.eval_at_start))


def _newest_with_rows(p: "Program", ckpt: Checkpointer, rows: list[dict], latest: int,
                      describe: Callable[[int], str], where: Path,
                      report: bool) -> Optional[int]:
    """The newest checkpoint at or before `latest` whose metrics rows are all
    kept (`latest` itself unless a row of it was lost, e.g. a last line cut
    short), or None for the start: resuming from there rewrites the lost
    rows exactly. A move is reported in one line (`report`)."""
    def complete(s: int) -> bool:
        return sum(1 for r in rows if r[p.step_key] <= s) >= _rows_due(p, s)

    if complete(latest):
        return latest
    older = [s for s in getattr(ckpt, "all_steps", list)() if s < latest and complete(s)]
    step = max(older) if older else None
    if report:
        note(f"{where / 'metrics.jsonl'} lacks rows of {describe(latest)}, the newest "
             f"checkpoint; resuming from {describe(step) if step is not None else 'the start'} "
             "to write them again")
    return step


@dataclasses.dataclass
class Program:
    """What an algorithm hands [`run`][jaxil.runs.engine.run].

    Attributes:
      name: who trains, as errors and the progress bar name it
        (e.g. `"misodice"`, `"GAIL on smax:3m"`).
      step_key: the step field of its rows and checkpoints.
      num_chunks: chunks in the whole run.
      steps_per_chunk: updates in one chunk (the guard numbers updates).
      run_ids: one dict per run, written into its rows: `{"run": i,
        "seed": s, ...}` (`run` indexes the stacked arrays).
      run_labels: one label per run for error messages.
      init: `() -> state`, the stacked state of every run.
      chunk: `(state, c) -> (state, metrics {name: [R]}, guard.Health)`
        for the `c`-th chunk (from 0).
      evaluate: `(state, c) -> {name: [R, ...]}` after `c + 1` chunks
        (`c = -1`: the initial state); each row holds the mean of its run's
        values (e.g. `eval_return` over the evaluation episodes).
      step_unit: step-field units per chunk (`update`: K; else 1).
      eval_every: chunks between evaluations and checkpoints.
      eval_at_start: also evaluate (row at step 0) before the first chunk.
      save_at_start: also checkpoint step 0.
      initial_metrics: `state -> {name: [R]}`, the row-0 metrics.
      summarize: `rows -> dict`, the summary fields (`results.json`);
        None: the program writes no `results.json` (its caller does).
      postfix: `values -> dict`, progress-bar fields from an evaluation's
        host values: the evaluation's and the chunk's metrics.
      fetch: device → host for metrics, health and episodes (a sharded
        program gathers its runs here).
      restore: `(checkpointer, like, step) -> state`.
      checkpoint_view: `state -> tree`, what a checkpoint holds.
      eval_chunks: the chunk counts (from 1) after which to evaluate and
        checkpoint, instead of every `eval_every` (e.g. a few evenly
        spaced checkpoints of a long run); the last must be `num_chunks`.
      row_every_chunk: a metrics row after every chunk (the chunk's
        metrics), the evaluation joining the rows of evaluated chunks.
      timed: rows carry `chunk_time_s` (the chunk, host sync included)
        and `wall_time_s` (every chunk so far, over resumed sessions).
      derive: `row -> dict`, fields computed from a finished row (a
        throughput from `chunk_time_s`, a second step counter).
      describe_step: `step -> str`, a step as error messages name it
        (default `"<step_key> <step>"`).
    """

    name: str
    step_key: str
    num_chunks: int
    steps_per_chunk: int
    run_ids: Sequence[dict]
    run_labels: Sequence[str]
    init: Callable[[], Any]
    chunk: Callable[[Any, int], tuple[Any, dict, guard.Health]]
    evaluate: Callable[[Any, int], dict]
    step_unit: int = 1
    eval_every: int = 1
    eval_at_start: bool = False
    save_at_start: bool = False
    initial_metrics: Optional[Callable[[Any], dict]] = None
    summarize: Optional[Callable[[list[dict]], dict]] = None
    postfix: Optional[Callable[[dict], dict]] = None
    fetch: Callable[[Any], Any] = jax.device_get
    restore: Callable[[Checkpointer, Any, int], Any] = _restore
    checkpoint_view: Callable[[Any], Any] = _same
    eval_chunks: Optional[Sequence[int]] = None
    row_every_chunk: bool = False
    timed: bool = False
    derive: Optional[Callable[[dict], dict]] = None
    describe_step: Optional[Callable[[int], str]] = None

    def __post_init__(self):
        if self.eval_chunks is not None:
            ev = list(self.eval_chunks)
            if not ev or ev != sorted(set(ev)) or ev[0] < 1 or ev[-1] != self.num_chunks:
                raise ValueError(f"eval_chunks must increase from >= 1 to the run's "
                                 f"{self.num_chunks} chunks, got {ev}")
        elif not 1 <= self.eval_every <= self.num_chunks or self.num_chunks % self.eval_every:
            raise ValueError(f"eval_every must divide the run's {self.num_chunks} chunks, got "
                             f"{self.eval_every}")
        if len(self.run_ids) != len(self.run_labels) or not self.run_ids:
            raise ValueError("a program needs one id and one label per run, and at least one run")


@dataclasses.dataclass
class RunResult:
    """What [`run`][jaxil.runs.engine.run] returns: the summary (as written to
    `results.json`, with `wall_seconds` and `complete`), every metrics row, the
    final stacked state and the run directory (closed; None without
    `out_dir`)."""

    summary: dict
    rows: list[dict]
    state: Any
    rundir: Optional[RunDir]


def _clean(x: Any) -> Any:
    """A row value as JSON holds it: non-finite floats become null."""
    return x if not isinstance(x, float) or np.isfinite(x) else None


def open_run(out_dir: str | Path, identity: dict, *, step_key: str, resume: bool = False,
             overwrite: bool = False, info: Optional[dict] = None) -> RunDir:
    """Open the run directory of a program before its expensive set-up, so a
    refused resume costs nothing; pass the result to [`run`][jaxil.runs.engine.run]."""
    return open_run_dir(out_dir, identity, resume=resume, overwrite=overwrite,
                        step_key=step_key, info=info)


def run(program: Program, *, rundir: Optional[RunDir] = None,
        checkpointer: Optional[Checkpointer] = None, resume_step: Optional[int] = None,
        progress: bool = True, loggers: Sequence[LoggerFactory] = (),
        log_names: Optional[Sequence[str]] = None, stop_after_chunks: Optional[int] = None,
        profile_dir: Optional[str] = None) -> RunResult:
    """Run `program` to its end (or `stop_after_chunks`, as a kill would).

    `rundir`: an opened run directory
    ([`open_run`][jaxil.runs.engine.open_run]), or None for a run that writes
    nothing. `checkpointer` / `resume_step`: a process that does not write the
    run directory (the others of a multi-process run) still takes part in the
    checkpoints and resumes from the same step. `loggers`: factories
    `(names, step_key, resume_from) -> Logger` that receive every metrics row
    (one logged run per name of `log_names`). `profile_dir`: a `jax.profiler`
    trace of the second chunk (after compilation).

    Raises:
      jaxil.runs.guard.NonFiniteError: a loss or parameter became NaN or
        inf; nothing of that chunk is written, the directory keeps its last
        good checkpoint.
    """
    p = program
    t_start = time.perf_counter()
    ckpt = rundir.checkpointer if rundir is not None else checkpointer
    latest = rundir.latest if rundir is not None else resume_step
    rows: list[dict] = list(rundir.rows) if rundir is not None else []
    describe = p.describe_step or (lambda s: f"{p.step_key} {s}")
    state = p.init()
    start = 0
    restored = latest
    if latest is not None and ckpt is not None:
        # Every process of a multi-process run takes the same decisions: the
        # others read the rows that process 0 kept (orbax's deletes and saves
        # are collective).
        where = rundir.path if rundir is not None else Path(ckpt.directory).parent
        if rundir is not None or (where / "metrics.jsonl").is_file():
            seen = rows if rundir is not None else [
                r for r in read_jsonl(where / "metrics.jsonl") if r[p.step_key] <= latest]
            restored = _newest_with_rows(p, ckpt, seen, latest, describe, where,
                                         report=rundir is not None)
    if restored is not None:
        like = state
        state, restored, notice = restore_newest_intact(
            ckpt, lambda s: p.restore(ckpt, like, s), restored, describe=describe)
        if notice and (rundir is not None or checkpointer is None):
            note(notice)
        start = restored // p.step_unit
    if restored != latest or restored == 0 and rows:
        # From step 0 the run writes its first row again (eval_at_start).
        rows = [r for r in rows if restored and r[p.step_key] <= restored]
        if rundir is not None:
            rundir.keep_rows(rows, restored)
        elif hasattr(ckpt, "drop_after"):
            ckpt.drop_after(restored)
        latest = restored
    if ckpt is not None and start < p.num_chunks:
        ckpt.check_space(p.checkpoint_view(state))
    names = list(log_names or p.run_labels)
    logs: list[Logger] = [make(names, p.step_key, start * p.step_unit if start else None)
                          for make in loggers] if rundir is not None or checkpointer is None else []

    def record(step: int, metrics: dict, evaluation: dict, extra: Optional[dict] = None) -> dict:
        # Means in the values' own dtype (float32 returns stay float32 until the
        # row), so rows read the same whichever program or version wrote them.
        values = {k: np.asarray(v) for k, v in p.fetch(evaluation).items()}
        values.update({k: np.asarray(v) for k, v in p.fetch(metrics).items()})
        new = []
        for ident in p.run_ids:
            i = ident["run"]
            row = {p.step_key: step, **ident}
            row.update({k: _clean(float(np.mean(v[i]))) for k, v in values.items()
                        if k not in row})  # the step and ids are the engine's
            row.update(extra or {})
            if p.derive is not None:
                row.update(p.derive(row))
            new.append(row)
        rows.extend(new)
        if rundir is not None:
            rundir.append(new)
        for log in logs:
            log.write(new)
        return values

    last_saved = start * p.step_unit if latest is not None else None
    evaluated = (set(p.eval_chunks).__contains__ if p.eval_chunks is not None
                 else lambda n: n % p.eval_every == 0)
    wall = float(rows[-1].get("wall_time_s") or 0.0) if p.timed and rows else 0.0

    def kept() -> str:
        if last_saved is None or rundir is None and checkpointer is None:
            return "no checkpoint was written"
        where = rundir.path if rundir is not None else Path(ckpt.directory).parent
        return f"the last good checkpoint ({describe(last_saved)}) is kept in {where}"

    bar = None
    end = p.num_chunks if stop_after_chunks is None else min(p.num_chunks, stop_after_chunks)
    try:
        if start == 0 and p.eval_at_start:
            zero = p.initial_metrics(state) if p.initial_metrics else {}
            record(0, zero, p.evaluate(state, -1))
            if p.save_at_start and ckpt is not None:
                ckpt.save(0, p.checkpoint_view(state))
                last_saved = 0
        if progress and (rundir is not None or checkpointer is None):
            from tqdm.auto import tqdm

            runs = len(p.run_ids)
            bar = tqdm(total=p.num_chunks * p.step_unit, initial=start * p.step_unit,
                       unit=p.step_key, unit_scale=p.step_unit >= 1000, dynamic_ncols=True,
                       desc=p.name if runs == 1 else f"{p.name} ×{runs}")
        for c in range(start, end):
            t_chunk = time.perf_counter()
            if profile_dir and c == start + 1:
                with jax.profiler.trace(profile_dir):
                    state, metrics, health = jax.block_until_ready(p.chunk(state, c))
            else:
                state, metrics, health = p.chunk(state, c)
            # a step field that counts chunks (rounds, chunks) names the one that diverged
            who = (f"{p.name} ({p.step_key} {c + 1})" if p.step_unit == 1 and p.step_key != "update"
                   else p.name)
            guard.check(p.fetch(health), learner=who, run_labels=list(p.run_labels),
                        first_step=c * p.steps_per_chunk + 1, chunk_len=p.steps_per_chunk,
                        kept=kept())
            elapsed = time.perf_counter() - t_chunk
            wall += elapsed
            evaluate = evaluated(c + 1)
            if evaluate or p.row_every_chunk:
                step = (c + 1) * p.step_unit
                timing = dict(chunk_time_s=elapsed, wall_time_s=wall) if p.timed else None
                host = record(step, metrics, p.evaluate(state, c) if evaluate else {}, timing)
                if evaluate and ckpt is not None:
                    ckpt.save(step, p.checkpoint_view(state))
                    last_saved = step
                if bar is not None and p.postfix is not None:
                    bar.set_postfix(p.postfix(host), refresh=False)
            if bar is not None:
                bar.update(p.step_unit)
    except BaseException:
        # A stopped run (the guard, Ctrl-C) still releases its directory, so
        # the same process, or another, can resume it.
        if rundir is not None:
            rundir.close()
        raise
    finally:
        for log in logs:
            log.close()
        if bar is not None:
            bar.close()
    summary = dict(p.summarize(rows)) if p.summarize is not None else {}
    summary.update(wall_seconds=time.perf_counter() - t_start, complete=end == p.num_chunks)
    if rundir is not None:
        if p.summarize is not None:
            rundir.write_results(summary)
        rundir.close()
    elif ckpt is not None:
        ckpt.close()
    return RunResult(summary=summary, rows=rows, state=state, rundir=rundir)
