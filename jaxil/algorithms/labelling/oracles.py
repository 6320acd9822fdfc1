"""Preference oracles: who answers "is segment x better than segment y?".

An oracle is any callable `oracle(dataset, pairs) -> labels` with
`labels` a float32 `[Q]` array over the queries of a
[`QueryPairs`][jaxil.data.preferences.QueryPairs]: the probability that side x is
preferred (1.0 = x better, 0.0 = y better, 0.5 = tie / indifferent) and NaN
where the oracle gave no usable answer (the preference learner drops those
queries). Oracles run once, on the host, in numpy:

```python
pairs = sample_query_pairs(dataset, num_queries=1000, seed=0)
labels = GroundTruthOracle(flip_rate=0.1)(dataset, pairs)
```

Three oracles are provided:

* [`GroundTruthOracle`][jaxil.algorithms.labelling.oracles.GroundTruthOracle] —
  compares the recorded returns, optionally flipping labels at random (a noisy
  human).
* [`SMAXSemanticOracle`][jaxil.algorithms.labelling.oracles.SMAXSemanticOracle]
  — judges SMAX battles from the recorded world states with the criteria of the
  MisoDICE LLM prompt (ally health kept, enemy health removed, fast wins),
  never looking at the reward.
* [`ExternalOracle`][jaxil.algorithms.labelling.oracles.ExternalOracle] — asks
  a user-supplied `str -> str` callable (e.g. an LLM client) about a text
  rendering of each query, with retries, an optional time limit per call and an
  on-disk answer cache so that an interrupted or timed-out labelling job
  resumes.

The SMAX world-state parser
([`smax_layout`][jaxil.algorithms.labelling.smax_state.smax_layout],
[`smax_health`][jaxil.algorithms.labelling.smax_state.smax_health]) lives in
[`jaxil.algorithms.labelling.smax_state`][jaxil.algorithms.labelling.smax_state],
shared with
[`jaxil.algorithms.labelling.render`][jaxil.algorithms.labelling.render].
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import warnings
from pathlib import Path
from typing import Callable, Optional, Union

import numpy as np

from jaxil.data.format import Dataset
from jaxil.runs.io_atomic import check_file_writable
from jaxil.data.preferences import QueryPairs, dataset_id
from jaxil.data.preferences import segment_returns as true_returns
from jaxil.data.preferences import query_sides as _sides
from jaxil.data.preferences import valid_steps as _valid_steps
from jaxil.algorithms.labelling.render import render_pair
from jaxil.algorithms.labelling.smax_state import SMAXLayout, smax_check_teams, smax_health, smax_layout

Oracle = Callable[[Dataset, QueryPairs], np.ndarray]


def label_agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Fraction of queries on which two label arrays agree exactly, over the
    queries both answered (NaN in either is left out); NaN if none."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"label arrays have different shapes {a.shape} and {b.shape}")
    ok = ~(np.isnan(a) | np.isnan(b))
    return float(np.mean(a[ok] == b[ok])) if ok.any() else float("nan")


def _compare(score_x: np.ndarray, score_y: np.ndarray, tie_tol: float) -> np.ndarray:
    """1 where x scores higher, 0 where y does, 0.5 within `tie_tol`; NaN stays NaN."""
    diff = np.asarray(score_x, np.float64) - np.asarray(score_y, np.float64)
    label = np.where(diff > 0, 1.0, 0.0)
    label = np.where(np.abs(diff) <= tie_tol, 0.5, label)
    return np.where(np.isnan(diff), np.nan, label).astype(np.float32)


def _window_len(dataset: Dataset, pairs: QueryPairs) -> int:
    return dataset.num_steps if pairs.segment_len is None else int(pairs.segment_len)


# -- ground truth ------------------------------------------------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def query_uniforms(pairs: QueryPairs, seed: int) -> np.ndarray:
    """One uniform number in [0, 1) per query, a hash of `seed` and the
    query's indices (both trajectories, both starts, the segment length).

    A query gets the same number whatever else is in the query set and in
    whatever order the set is answered; different seeds give independent
    numbers.
    """
    Q = len(pairs)
    L = -1 if pairs.segment_len is None else int(pairs.segment_len)
    h = np.full(Q, np.uint64(int(seed) % 2**64), np.uint64)
    with np.errstate(over="ignore"):
        h = _mix64(h + _GOLDEN)
        for field in (pairs.traj_x, pairs.start_x, pairs.traj_y, pairs.start_y, np.full(Q, L)):
            v = np.asarray(field, np.int64).astype(np.uint64)
            h = _mix64(h ^ (v + _GOLDEN))
    return (h >> np.uint64(11)).astype(np.float64) / float(2**53)


class GroundTruthOracle:
    """Labels from the true segment returns, with optional random flips.

    A segment's return is the sum of its recorded rewards over its valid steps
    ([`true_returns`][jaxil.data.preferences.segment_returns]). The label is 1
    if x's return is larger, 0 if y's is, and 0.5 if they are within `tie_tol`.
    Each hard (0/1) label is then flipped independently with probability
    `flip_rate`, a model of a noisy annotator; ties are never flipped. The
    flips are a function of `seed` and each query's indices
    ([`query_uniforms`][jaxil.algorithms.labelling.oracles.query_uniforms]), so
    the same query gets the same label on every call, in any query set, in any
    order.

    Args:
      flip_rate: probability of flipping a hard label, in [0, 0.5].
      seed: seed of the flips.
      tie_tol: returns closer than this are a tie (0.5).
    """

    def __init__(self, flip_rate: float = 0.0, seed: int = 0, tie_tol: float = 1e-6):
        flip_rate = float(flip_rate)
        if not 0.0 <= flip_rate <= 0.5:
            raise ValueError(
                f"flip_rate must be in [0, 0.5] (the probability that a label is flipped), "
                f"got {flip_rate}; above 0.5 the labels mostly lie — use 1 - flip_rate and "
                f"swap the sides of the queries instead"
            )
        if not tie_tol >= 0.0:
            raise ValueError(f"tie_tol must be >= 0, got {tie_tol}")
        self.flip_rate = flip_rate
        self.seed = int(seed)
        self.tie_tol = float(tie_tol)

    @property
    def name(self) -> str:
        return f"ground_truth(flip={self.flip_rate:g})"

    def __call__(self, dataset: Dataset, pairs: QueryPairs) -> np.ndarray:
        rx, ry = true_returns(dataset, pairs)
        label = _compare(rx, ry, self.tie_tol)
        if self.flip_rate > 0.0:
            flip = (query_uniforms(pairs, self.seed) < self.flip_rate) & (label != 0.5)
            label = np.where(flip, 1.0 - label, label).astype(np.float32)
        return label


def segment_endpoints(dataset: Dataset, traj: np.ndarray, start: np.ndarray,
                      n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(first_state [Q, S], last_state [Q, S], num_valid [Q])` of segments
    of at most `n` steps: the global state before the first step and the
    state after the last valid step (never the zero padding past an
    episode's end)."""
    gs = np.asarray(dataset.global_state)
    last = gs.shape[1] - 1
    k = _valid_steps(dataset, traj, start, n)
    return gs[traj, np.minimum(start, last)], gs[traj, np.minimum(start + k, last)], k


class SMAXSemanticOracle:
    """Judges SMAX segments from their world states, not from the reward.

    The criteria are those of the MisoDICE LLM prompt: keep the allies' health,
    remove the enemies' health, and win in fewer steps. With `h` the unit
    health fractions
    ([`smax_health`][jaxil.algorithms.labelling.smax_state.smax_health]) of the
    state before the segment (`0`) and after its last valid step (`1`), `A`
    allies, `E` enemies, `n` valid steps and `T` = `spec.max_steps`, a segment
    scores:

    ```text
    damage    = Σ_enemies (h0 − h1) / E          enemy health removed, in [0, 1]
    ally_loss = Σ_allies  (h0 − h1) / A          ally health lost, in [0, 1]
    won       = all enemies dead and an ally alive in the last state
    score     = enemy_weight·damage − ally_weight·ally_loss
                + won·(win_bonus + speed_weight·(1 − n/T))
    ```

    and the segment with the higher score is preferred (0.5 within
    `tie_tol`). On whole trajectories `−ally_loss` is the ally health
    kept minus one, and with the defaults a win always outscores a non-win.
    A segment without valid steps cannot be judged: its queries get NaN.

    Args:
      enemy_weight, ally_weight: weights of damage dealt and health lost.
      win_bonus: bonus for a win inside the segment.
      speed_weight: extra bonus for a fast win, times `1 − n/T`.
      tie_tol: scores closer than this are a tie.
    """

    def __init__(
        self,
        enemy_weight: float = 1.0,
        ally_weight: float = 1.0,
        win_bonus: float = 1.0,
        speed_weight: float = 0.5,
        tie_tol: float = 1e-6,
    ):
        self.enemy_weight = float(enemy_weight)
        self.ally_weight = float(ally_weight)
        self.win_bonus = float(win_bonus)
        self.speed_weight = float(speed_weight)
        self.tie_tol = float(tie_tol)

    @property
    def name(self) -> str:
        return "smax_semantic"

    def scores(self, dataset: Dataset, pairs: QueryPairs) -> tuple[np.ndarray, np.ndarray]:
        """The score (see the class docstring) of both sides, `[Q]` each."""
        if not dataset.info.env_id.startswith("smax:"):
            raise ValueError(
                f"SMAXSemanticOracle judges SMAX battles from their world states, but the "
                f"dataset is {dataset.info.env_id!r}; use GroundTruthOracle or "
                f"ExternalOracle for other environments"
            )
        layout = smax_layout(dataset.spec)
        smax_check_teams(dataset, layout)
        n = _window_len(dataset, pairs)
        T = int(dataset.spec.max_steps)
        sx, sy = (self._score(dataset, traj, start, n, layout, T)
                  for traj, start in _sides(dataset, pairs))
        return sx, sy

    def _score(self, dataset: Dataset, traj: np.ndarray, start: np.ndarray, n: int,
               layout: SMAXLayout, T: int) -> np.ndarray:
        first, last, n = segment_endpoints(dataset, traj, start, n)
        a0, e0 = smax_health(first, layout)
        a1, e1 = smax_health(last, layout)
        damage = (e0 - e1).sum(-1) / layout.num_enemies
        ally_loss = (a0 - a1).sum(-1) / layout.num_allies
        won = ~np.any(e1 > 0, axis=-1) & np.any(a1 > 0, axis=-1)
        speed = 1.0 - n / T
        score = (self.enemy_weight * damage - self.ally_weight * ally_loss
                 + won * (self.win_bonus + self.speed_weight * speed))
        return np.where(n > 0, score, np.nan)

    def __call__(self, dataset: Dataset, pairs: QueryPairs) -> np.ndarray:
        sx, sy = self.scores(dataset, pairs)
        return _compare(sx, sy, self.tie_tol)


# -- external (LLM) oracle -------------------------------------------------------------

_HASH_CHOICE = re.compile(r"#\s*([12])(?!\d|\.\d)")
_BARE_CHOICE = re.compile(r"(?<![\w.#])([12])(?!\w|\.\d)")


def parse_choice(answer: Optional[str]) -> Optional[int]:
    """1 or 2 from an answer naming one trajectory, else None.

    Accepts `#1`, `# 2`, `Trajectory #1`, `1`, `trajectory 2.`
    (case and whitespace tolerant). Choices written with `#` take
    precedence over bare digits (so `"#1 (2 allies left)"` is 1); an answer
    naming both trajectories, or neither, is unparseable (None). Digits inside
    larger numbers or decimals (`12`, `0.2`) do not count.
    """
    if not isinstance(answer, str):
        return None
    for pattern in (_HASH_CHOICE, _BARE_CHOICE):
        found = set(pattern.findall(answer))
        if len(found) == 1:
            return int(found.pop())
        if len(found) > 1:
            return None
    return None


_CHOICE_LABEL = {1: 1.0, 2: 0.0}
_MAX_FAILED_EXAMPLES = 5


def _end_last_line(f) -> None:
    """Make a cache file opened in `a+b` mode end with a complete line.

    A job killed mid-write leaves a last line without its newline. If that
    fragment is not a valid JSON object it is cut off (it was never a usable
    answer); if it is, the missing newline is added. Either way the entries
    appended next start on a line of their own.
    """
    size = f.seek(0, os.SEEK_END)
    if size == 0:
        return
    f.seek(size - 1)
    if f.read(1) == b"\n":
        return
    pos, block = size, 1 << 16
    while pos > 0:  # find the start of the last line
        lo = max(pos - block, 0)
        f.seek(lo)
        chunk = f.read(pos - lo)
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            pos = lo + nl + 1
            break
        pos = lo
    f.seek(pos)
    tail = f.read()
    try:
        ok = isinstance(json.loads(tail.decode("utf-8")), dict)
    except ValueError:
        ok = False
    if ok:
        f.write(b"\n")
    else:
        f.truncate(pos)


def _refuse_directory(cache: Path) -> None:
    if cache.is_dir():
        raise IsADirectoryError(f"answer cache {cache} is a directory; pass --cache a file "
                                f"such as {cache / 'answers.jsonl'}")


def check_cache_writable(path: Union[str, os.PathLike]) -> Path:
    """Prove that the answer cache at `path` can be appended to (its
    directory is created), or raise a one-line `PermissionError`
    naming it and the fix. An external labeller's answers cost money or
    time: a cache found unwritable only after the first batch loses them."""
    path = Path(path)
    _refuse_directory(path)
    return check_file_writable(
        path, "answer cache", append=True,
        fix="the labeller's answers could not be kept; pass --cache a file you can write "
            "to (or fix its permissions) before asking")


class LabellerTimeout(TimeoutError):
    """The external labeller gave no reply to one query within the time limit.

    Raised by
    [`ExternalOracle`][jaxil.algorithms.labelling.oracles.ExternalOracle] after
    the answers obtained before the silent query were appended to its cache, so
    a new oracle with the same cache starts from them.

    Attributes:
      query: the silent query's position in the query set, from 1.
      num_queries: the size of the query set.
      timeout: the limit, in seconds.
      answered: answers obtained from the labeller by this call (all cached
        when `cache_path` is set).
      cache_path: the answer cache, or None.
    """

    def __init__(self, *, query: int, num_queries: int, timeout: float, answered: int,
                 cache_path: Optional[Path]):
        self.query, self.num_queries, self.timeout = query, num_queries, timeout
        self.answered, self.cache_path = answered, cache_path
        kept = (f"the {answered} answers obtained before it are saved in {cache_path}"
                if cache_path is not None else
                f"the {answered} answers obtained before it were not cached")
        super().__init__(f"the external labeller gave no reply to query {query} of "
                         f"{num_queries} within {timeout:g} s; {kept}")


class _NoReply(Exception):
    """The labeller's call did not return within the timeout."""


class ExternalOracle:
    """Preferences from an external judge, e.g. a language model.

    Each query is rendered to text by `render(dataset, pairs, i)`
    ([`render_pair`][jaxil.algorithms.labelling.render.render_pair];
    trajectory #1 is side x, #2 side y), passed to `fn` and the reply parsed by
    [`parse_choice`][jaxil.algorithms.labelling.oracles.parse_choice]: #1 →
    1.0, #2 → 0.0. jaxil never calls a network itself; `fn` is the hook for
    whatever client the user has.

    An unparseable reply or an exception raised by `fn` is retried up to
    `max_retries` times; a query still unanswered gets NaN. Queries are worked
    through in batches of `batch_size` (`fn` is still called once per query).
    The cache is checked writable before the first query
    ([`check_cache_writable`][jaxil.algorithms.labelling.oracles.check_cache_writable]);
    after each batch the new answers are appended to the JSONL `cache_path` and
    flushed to disk, so a killed labelling job loses at most one batch, and a
    new oracle with the same cache answers the already-answered queries from
    the cache without calling `fn`. Each cache line is
    `{"key", "label", "answer"}` with the key from
    [`QueryPairs.keys`][jaxil.data.preferences.QueryPairs.keys] (the dataset
    id, both trajectories and starts, the segment length); a corrupt line (e.g.
    a truncated last line) is skipped with a warning. Unanswered queries are
    not cached, so they are asked again next time.

    With a `timeout`, each call of `fn` runs on a daemon worker thread and is
    given that many seconds; a call still running then stops the oracle with
    [`LabellerTimeout`][jaxil.algorithms.labelling.oracles.LabellerTimeout]
    (after the answers obtained so far are cached) instead of waiting forever.
    The silent call is not retried: a labeller that hung once (a dead
    connection, a stuck service) usually hangs again, and the cache makes a
    later run cheap. Python cannot stop a running thread, so the abandoned call
    keeps running in the background (its reply, if any, is discarded) until it
    returns or the process exits; being a daemon thread it does not keep the
    process alive. While the oracle waits, Ctrl-C (KeyboardInterrupt) stops it
    at once, with the answers so far cached. `fn` must therefore tolerate being
    called from a thread other than the main one.

    After a call, `report` holds: `queries`; `asked` (calls of
    `fn` this run, retries included); `cached` (queries answered from
    the cache or from an identical query of this run); `parsed` (queries
    answered by `fn` this run); `unparseable` (replies that could not be
    parsed); `errors` (calls that raised); `num_failed` (queries left
    NaN) and `failed` (the first few, each with its key and raw replies).

    Args:
      fn: `prompt -> reply` callable.
      cache_path: JSONL answer cache (created if missing); None = no cache.
      batch_size: queries per cache checkpoint.
      max_retries: extra attempts per query after an unusable reply.
      render: `(dataset, pairs, i) -> prompt`.
      dataset_key: the dataset part of the cache keys; default
        [`dataset_id`][jaxil.data.preferences.dataset_id] (a content hash).
      progress: show a tqdm progress bar.
      timeout: seconds each call of `fn` may take; None or `inf` = no
        limit (`fn` then runs on the calling thread).
    """

    def __init__(
        self,
        fn: Callable[[str], str],
        cache_path: Optional[Union[str, os.PathLike]] = None,
        batch_size: int = 16,
        max_retries: int = 2,
        render: Callable[[Dataset, QueryPairs, int], str] = render_pair,
        dataset_key: Optional[str] = None,
        progress: bool = True,
        timeout: Optional[float] = None,
    ):
        if not callable(fn):
            raise TypeError(f"fn must be a callable prompt -> reply, got {type(fn).__name__}")
        if not callable(render):
            raise TypeError(f"render must be a callable (dataset, pairs, i) -> prompt, "
                            f"got {type(render).__name__}")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if int(max_retries) < 0:
            raise ValueError(f"max_retries must be >= 0 (0 = ask once), got {max_retries}")
        if timeout is not None and not float(timeout) > 0:  # NaN fails too
            raise ValueError(f"timeout must be a positive number of seconds (None = no limit), "
                             f"got {timeout}")
        self.fn = fn
        self.cache_path = None if cache_path is None else Path(cache_path)
        self.batch_size = int(batch_size)
        self.max_retries = int(max_retries)
        self.render = render
        self.dataset_key = dataset_key
        self.progress = bool(progress)
        self.timeout = None if timeout is None or math.isinf(timeout) else float(timeout)
        self.report: dict = {}

    @property
    def name(self) -> str:
        fn_name = getattr(self.fn, "__name__", type(self.fn).__name__)
        return f"external({fn_name})"

    # -- cache --------------------------------------------------------------------
    def load_cache(self) -> dict[str, float]:
        """Key -> label of every valid line of the cache (later lines win)."""
        out: dict[str, float] = {}
        if self.cache_path is None or not self.cache_path.exists():
            return out
        _refuse_directory(self.cache_path)
        with open(self.cache_path, "r", encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                    key, label = entry["key"], float(entry["label"])
                    if not isinstance(key, str) or label not in (0.0, 0.5, 1.0):
                        raise ValueError(f"bad key or label {label!r}")
                except (ValueError, KeyError, TypeError) as e:
                    warnings.warn(
                        f"{self.cache_path}: skipping corrupt cache line {lineno} "
                        f"({type(e).__name__}: {e}); probably a labelling job killed "
                        f"mid-write — that query will be asked again",
                        stacklevel=3,
                    )
                    continue
                out[key] = label
        return out

    def _append(self, lines: list[str]) -> None:
        if self.cache_path is None or not lines:
            return
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.cache_path, "a+b") as f:
            _end_last_line(f)
            f.write("".join(lines).encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())

    # -- asking --------------------------------------------------------------------
    def _call(self, prompt: str):
        """`fn(prompt)`, or `_NoReply` after `timeout` seconds."""
        if self.timeout is None:
            return self.fn(prompt)
        done = threading.Event()
        box: list = []

        def work():
            try:
                box.append((True, self.fn(prompt)))
            except BaseException as e:  # noqa: BLE001 -- handed to the waiting thread
                box.append((False, e))
            finally:
                done.set()

        # A daemon thread, not a ThreadPoolExecutor: the executor's workers
        # are joined at interpreter exit, so a hung call would keep the
        # process alive after the oracle gave up on it.
        threading.Thread(target=work, name="jaxil-external-labeller", daemon=True).start()
        if not done.wait(self.timeout):  # Ctrl-C interrupts the wait
            raise _NoReply
        ok, value = box.pop()
        if not ok:
            raise value
        return value

    def _ask(self, prompt: str, stats: dict) -> tuple[Optional[int], list[str]]:
        replies: list[str] = []
        for _ in range(self.max_retries + 1):
            stats["asked"] += 1
            try:
                reply = self._call(prompt)
            except _NoReply:
                raise
            except Exception as e:  # the judge's failure, not ours: retry
                stats["errors"] += 1
                replies.append(f"<{type(e).__name__}: {e}>")
                continue
            replies.append(reply if isinstance(reply, str) else repr(reply))
            choice = parse_choice(reply)
            if choice is not None:
                return choice, replies
            stats["unparseable"] += 1
        return None, replies

    def __call__(self, dataset: Dataset, pairs: QueryPairs) -> np.ndarray:
        key_prefix = dataset_id(dataset) if self.dataset_key is None else self.dataset_key
        keys = pairs.keys(key_prefix)
        Q = len(keys)
        labels = np.full(Q, np.nan, np.float32)
        known = self.load_cache()
        stats = dict(queries=Q, asked=0, cached=0, parsed=0, unparseable=0, errors=0,
                     num_failed=0, failed=[])
        self.report = stats

        todo: dict[str, list[int]] = {}  # key -> query indices, first-seen order
        for i, k in enumerate(keys):
            if k in known:
                labels[i] = known[k]
                stats["cached"] += 1
            else:
                todo.setdefault(k, []).append(i)
        order = list(todo)
        if order and self.cache_path is not None:  # before paying for the first answer
            check_cache_writable(self.cache_path)

        bar = None
        if self.progress and order:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(order), desc=f"asking {self.name}", unit="query")
        try:
            for b0 in range(0, len(order), self.batch_size):
                pending: list[str] = []
                try:
                    for k in order[b0 : b0 + self.batch_size]:
                        idx = todo[k]
                        try:
                            choice, replies = self._ask(self.render(dataset, pairs, idx[0]),
                                                        stats)
                        except _NoReply:
                            raise LabellerTimeout(
                                query=idx[0] + 1, num_queries=Q, timeout=self.timeout,
                                answered=stats["parsed"], cache_path=self.cache_path) from None
                        if choice is None:
                            stats["num_failed"] += len(idx)
                            if len(stats["failed"]) < _MAX_FAILED_EXAMPLES:
                                stats["failed"].append({"key": k, "answers": replies})
                        else:
                            labels[idx] = _CHOICE_LABEL[choice]
                            stats["parsed"] += 1
                            stats["cached"] += len(idx) - 1
                            pending.append(json.dumps(
                                {"key": k, "label": _CHOICE_LABEL[choice], "answer": replies[-1]}
                            ) + "\n")
                        if bar is not None:
                            bar.update(1)
                finally:  # keep what this batch got, even when interrupted
                    self._append(pending)
        finally:
            if bar is not None:
                bar.close()
        return labels
