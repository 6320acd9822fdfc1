"""Tests of benchmarks/side_process.py (a side timed in a process of its
own) and of time_sides' rule for alternatives of one group."""

import textwrap
import time

import numpy as np
import pytest

from benchmarks import side_process as sp
from benchmarks import token_rollout as tr

_MODULE = textwrap.dedent('''
    import numpy as np

    class Skip(Exception):
        pass

    def load(state, *, x):
        print("a library printing to stdout")  # must not reach the pipe
        state["x"] = x
        return {"got": x}

    def prep(state, info, *, kind):
        info["compile_s"] = 0.25
        if kind == "skip":
            raise Skip("no such engine here")
        if kind == "boom":
            raise ValueError("the weights are corrupt")
        return lambda: np.full((2, 3), state["x"])
''')


def test_a_child_process_runs_loads_times_and_reports(tmp_path):
    """A side prepared in a child keeps the child's state, returns the facts
    it recorded, times itself there and hands back its first output. Fails
    if a print inside the module corrupts the protocol, if the output never
    comes back (the greedy-tokens check would compare nothing), if a
    `Skip` in the child becomes a crash rather than a skipped side, or if a
    child's error loses its message."""
    module = tmp_path / "engine.py"
    module.write_text(_MODULE)
    with sp.SideProcess("test engine", module) as proc:
        assert proc.setup("load", x=7) == {"got": 7}
        info = {}
        call = proc.prepare("side_a", "prep", info, keep_output=True, kind="ok")
        assert info == {"compile_s": 0.25}
        wall, cpu, out = call.time(3)
        assert wall > 0 and cpu >= 0
        np.testing.assert_array_equal(out, np.full((2, 3), 7))
        assert call.time(1)[2] is None  # only the warm-up's output travels
        with pytest.raises(sp.Skip, match="no such engine here"):
            proc.prepare("side_b", "prep", {}, kind="skip")
        with pytest.raises(RuntimeError, match="ValueError: the weights are corrupt"):
            proc.prepare("side_c", "prep", {}, kind="boom")
        assert proc.setup("load", x=1) == {"got": 1}  # still serving after both
    assert proc.proc.returncode == 0


def test_time_sides_leaves_out_a_groups_slower_alternative():
    """Of two alternatives in one group, the one many times slower in its
    first timed round is skipped with the reason, and the fastest is timed;
    a side with no group is always timed. Fails if the rule drops the
    faster side, or drops sides of different groups against each other."""
    def sleeper(s):
        return lambda info: (lambda: time.sleep(s))

    specs = [tr.SideSpec("peer_t1", 1, sleeper(0.06), group="peer"),
             tr.SideSpec("peer_t2", 1, sleeper(0.002), group="peer"),
             tr.SideSpec("mine", 1, sleeper(0.06))]
    out = tr.time_sides(specs, 1, repeats=2, target_s=1.0, max_call_s=10.0, history={},
                        deadline=float("inf"))
    assert out["peer_t1"]["skipped"].startswith("slower than its group's fastest")
    assert out["peer_t2"]["skipped"] is None and out["peer_t2"]["tokens_per_s"] > 0
    assert out["mine"]["skipped"] is None
