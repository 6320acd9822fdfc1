"""Smoke test of benchmarks/collect_throughput.py at a tiny size."""

import json
import math

import pytest

from benchmarks.collect_throughput import main

ENV = "mpe:simple_spread_continuous"  # short episodes (26 steps), among the fastest to compile


@pytest.mark.slow  # default-suite time (about 16 s of compile); run with -m slow
def test_collect_throughput_writes_rows(tmp_path):
    # Neural policy only: each collector takes ~15 s to compile on the 2-core CI
    # machine; the random policy runs through the same code (see the script).
    main(["--envs", ENV, "--num-envs", "2", "--repeats", "1", "--policies", "neural",
          "--out-dir", str(tmp_path)])
    files = list(tmp_path.glob("collect_throughput-*.json"))
    assert len(files) == 1
    doc = json.loads(files[0].read_text())
    assert doc["benchmark"] == "collect_throughput"
    assert "machine" in doc and "versions" in doc
    rows = doc["rows"]
    assert [(r["env"], r["num_envs"], r["policy"]) for r in rows] == [(ENV, 2, "neural")]
    for r in rows:
        assert not r["skipped"]
        assert math.isfinite(r["trajectories_per_s"]) and r["trajectories_per_s"] > 0
        assert r["padded_steps"] == 2 * r["max_steps"]
        assert 0 < r["valid_steps"] <= r["padded_steps"]
        assert r["valid_env_steps_per_s"] <= r["padded_env_steps_per_s"]
        assert r["output_bytes"] > 0
        assert r["compile_s"] > 0 and r["cpu_s"] > 0
        assert r["time_ratio_neural_random"] is None  # needs both policies
