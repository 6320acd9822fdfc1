"""The external labeller's time limit and the distinct query pairs.

A labeller (``str -> '#1' | '#2'``) that never replies must stop the
oracle after ``timeout`` seconds with the answers so far cached, without
keeping the process alive; a budget of queries is a number of distinct
pairs, at most all the pairs a dataset offers.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.data import omapl_dataset

from jaxil.algorithms.labelling.oracles import ExternalOracle, LabellerTimeout
from jaxil.data.preferences import distinct_query_pairs, num_distinct_pairs, sample_query_pairs

TESTS = Path(__file__).resolve().parents[2]
ROOT = TESTS.parent


@pytest.fixture(scope="module")
def small():
    """12 trajectories of 4 to 8 steps: 66 pairs of whole trajectories."""
    return omapl_dataset(0, n_expert=4, n_poor=8)


class Labeller:
    """Answers '#1' to the first ``answers`` distinct calls, then blocks
    until the test releases it (or, with ``interrupt``, raises
    KeyboardInterrupt as Ctrl-C inside the labeller's client would)."""

    def __init__(self, answers: int, interrupt: bool = False):
        self.answers, self.interrupt = answers, interrupt
        self.calls, self.threads = 0, set()
        self.release = threading.Event()

    def __call__(self, prompt: str) -> str:
        self.threads.add(threading.current_thread().name)
        if self.calls >= self.answers:
            if self.interrupt:
                raise KeyboardInterrupt
            self.release.wait(30)  # "forever", as far as a 0.3 s limit goes
        self.calls += 1
        return "#1"


def test_a_silent_labeller_stops_the_oracle_with_the_answers_so_far_cached(small, tmp_path):
    """Plausible bugs: no time limit (the oracle waits for the labeller, so
    no LabellerTimeout and the test blocks 30 s); the silent call retried as
    an ordinary labeller error (3 × the limit, then a NaN instead of a
    stop); the partial batch lost on the way out (the cache short of the 3
    answers); the silent query misnumbered."""
    pairs = sample_query_pairs(small, 10, None, seed=0)
    cache = tmp_path / "answers.jsonl"
    hung = Labeller(answers=3)
    oracle = ExternalOracle(hung, cache_path=cache, batch_size=16, timeout=0.3, progress=False)
    t0 = time.perf_counter()
    try:
        with pytest.raises(LabellerTimeout) as e:
            oracle(small, pairs)
    finally:
        hung.release.set()
    assert time.perf_counter() - t0 < 5
    keys = pairs.keys()
    fourth = sorted({k: i for i, k in reversed(list(enumerate(keys)))}.values())[3]
    assert (e.value.query, e.value.num_queries, e.value.answered) == (fourth + 1, 10, 3)
    assert e.value.timeout == 0.3 and isinstance(e.value, TimeoutError)
    assert f"query {fourth + 1} of 10 within 0.3 s" in str(e.value)
    assert oracle.report["asked"] == 4  # the silent call is not retried
    assert len(cache.read_text().splitlines()) == 3
    assert threading.main_thread().name not in hung.threads  # calls run on a worker thread
    # a new oracle on the same cache asks only the rest
    again = Labeller(answers=100)
    labels = ExternalOracle(again, cache_path=cache, timeout=5, progress=False)(small, pairs)
    assert again.calls == len(set(keys)) - 3 and np.all(labels == 1.0)


def test_labeller_errors_and_interrupts_cross_the_worker_thread(small):
    """Plausible bugs: an exception of the labeller lost in the worker
    thread (the query hangs until the limit, or gets a reply of None); a
    labeller's own TimeoutError taken for the oracle's limit (the run stops
    instead of retrying); Ctrl-C in the labeller swallowed as an error and
    retried."""
    pairs = sample_query_pairs(small, 6, None, seed=1)
    seen = set()

    def flaky(prompt):  # its client's own timeout, the first time
        if prompt not in seen:
            seen.add(prompt)
            raise TimeoutError("read timed out")
        return "#2"

    oracle = ExternalOracle(flaky, max_retries=1, timeout=5, progress=False)
    assert np.all(oracle(small, pairs) == 0.0)
    assert oracle.report["errors"] == len(set(pairs.keys()))
    with pytest.raises(KeyboardInterrupt):
        ExternalOracle(Labeller(0, interrupt=True), timeout=5, progress=False)(small, pairs)


@pytest.mark.parametrize("bad", [0, -1.0, math.nan])
def test_timeout_must_be_positive(bad):
    """Plausible bug: a zero or NaN limit accepted, failing every call."""
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        ExternalOracle(str, timeout=bad)
    assert ExternalOracle(str, timeout=math.inf).timeout is None  # no limit


_HUNG_SCRIPT = textwrap.dedent("""
    import signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    from helpers.data import omapl_dataset
    from jaxil.algorithms.labelling.oracles import ExternalOracle, LabellerTimeout
    from jaxil.data.preferences import sample_query_pairs

    ds = omapl_dataset(0, n_expert=4, n_poor=8)
    pairs = sample_query_pairs(ds, 10, None, seed=0)
    calls = []

    def hangs(prompt):
        time.sleep(3600)

    def answers_twice_then_hangs(prompt):
        if len(calls) == 2:
            print("hanging", flush=True)
            time.sleep(3600)
        calls.append(prompt)
        return "#1"

    try:
        ExternalOracle(hangs, timeout=0.2, progress=False)(ds, pairs)
    except LabellerTimeout:
        print("timed out", flush=True)
    try:
        ExternalOracle(answers_twice_then_hangs, cache_path=sys.argv[1], timeout=600,
                       progress=False)(ds, pairs)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
""")


def test_a_hung_labeller_thread_does_not_keep_the_process_alive(tmp_path):
    """A real process: one call abandoned at its time limit, another hung
    call interrupted by SIGINT (Ctrl-C) while the oracle waits; the process
    must then exit at once with the two answers cached. Plausible bugs: the
    call run on a ThreadPoolExecutor, whose workers are joined at exit (the
    process outlives its script by an hour); the wait not interruptible
    (SIGINT ignored until the limit, 600 s); the answers of the interrupted
    batch not flushed."""
    cache = tmp_path / "answers.jsonl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT)]))
    proc = subprocess.Popen([sys.executable, "-c", _HUNG_SCRIPT, str(cache)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "timed out\n"
        assert proc.stdout.readline() == "hanging\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert out == "interrupted\n"
    assert [json.loads(line)["label"] for line in cache.read_text().splitlines()] == [1.0, 1.0]


# -- distinct pairs ---------------------------------------------------------------------


def _unordered(pairs):
    return [frozenset({(int(a), int(sa)), (int(b), int(sb))}) for a, sa, b, sb in
            zip(pairs.traj_x, pairs.start_x, pairs.traj_y, pairs.start_y)]


@pytest.mark.parametrize("L", [None, 3])
def test_distinct_query_pairs_count_and_cap(small, L):
    """Plausible bugs: pairs drawn with replacement (a budget near the
    number of pairs asks many twice, so fewer distinct pairs than reported);
    ``x vs y`` and ``y vs x`` counted as two pairs; a budget above the total
    not capped (an endless redraw) or capped at the wrong total; segments
    outside their episode."""
    # brute force: every unordered pair of segments of two different trajectories
    segs = [(t, s) for t in range(small.num_trajectories)
            for s in range(1 if L is None else max(int(small.length[t]) - L, 0) + 1)]
    total = sum(a[0] != b[0] for a, b in itertools.combinations(segs, 2))
    assert num_distinct_pairs(small, L) == total
    assert total == (66 if L is None else 800)
    for q in (10, total // 2, total // 2 + 1, total - 1, total, 10 * total):
        p = distinct_query_pairs(small, q, L, seed=1)
        keys = _unordered(p)
        assert len(p) == len(set(keys)) == min(q, total)
        assert np.all(p.traj_x != p.traj_y)
        if L is not None:
            for t, s in ((p.traj_x, p.start_x), (p.traj_y, p.start_y)):
                assert np.all(s <= np.maximum(small.length[t] - L, 0))
        again = distinct_query_pairs(small, q, L, seed=1)
        assert p.keys() == again.keys()  # deterministic in the seed
    assert set(_unordered(distinct_query_pairs(small, total, L, seed=2))) == \
        {frozenset(pair) for pair in itertools.combinations(segs, 2) if pair[0][0] != pair[1][0]}


def test_distinct_query_pairs_keep_a_draw_without_repeats():
    """Plausible bug: every budget redrawn, so the queries (and the answer
    caches keyed on them) change although the old draw had no repeat."""
    ds = omapl_dataset(0)
    old = sample_query_pairs(ds, 50, None, seed=0)
    assert len(set(_unordered(old))) == 50
    assert distinct_query_pairs(ds, 50, None, seed=0).keys() == old.keys()
    many = sample_query_pairs(ds, 2000, None, seed=0)  # 7140 pairs: repeats
    new = distinct_query_pairs(ds, 2000, None, seed=0)
    assert len(set(_unordered(many))) < 2000 == len(set(_unordered(new)))
    assert set(_unordered(many)) <= set(_unordered(new))  # repeats replaced, the rest kept
