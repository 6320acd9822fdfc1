"""benchmarks/gpu_suite.py and benchmarks/single_update.py on the CPU: the
--quick smoke runs, the headline summary, and the peer's clean skips."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_suite

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.xdist_group("gpu_suite")


@pytest.mark.slow  # default-suite time (about 40 s of compile); run with -m slow
def test_quick_parts_write_one_json_with_numbers(tmp_path, monkeypatch):
    """``--quick`` env, precision and peer parts run on the CPU and write one
    JSON: env rows for the adapter and the raw env at each size, a loss and
    an update time at every precision (fp32's own relative change 0), and
    the peer skipped with the reason. Catches a part that fails (it would be
    under ``errors``: the env part once did, on a removed helper), a
    precision skipped, and a JSON without the summary."""
    monkeypatch.delenv("JAXIL_OMAPL_PEER", raising=False)
    out = gpu_suite.main(["--quick", "--parts", "env,precision,peer", "--out-dir", str(tmp_path)])
    files = list(tmp_path.glob("gpu_suite_quick-*.json"))
    assert len(files) == 1
    assert json.loads(files[0].read_text())["summary"] == json.loads(json.dumps(out["summary"]))
    assert out["errors"] == {}
    env = out["parts"]["env"]
    assert {r["num_envs"] for r in env["rows"]} == set(env["sizes"])
    prec = out["parts"]["precision"]["rows"]
    assert set(prec) == set(gpu_suite.PRECISIONS)
    for p, r in prec.items():
        assert r["update_ms"] > 0 and r["matmul_tflops"] > 0, p
        assert r["losses"] and all(v == v for v in r["losses"].values()), p  # finite, no NaN
    assert all(v == 0.0 for v in prec["fp32"]["loss_rel_change_vs_fp32"].values())
    assert "JAXIL_OMAPL_PEER" in out["parts"]["peer"]["skipped"]
    assert out["summary"]["env_steps_per_s_at"] == max(env["sizes"])


def test_peer_without_the_authors_code_is_skipped_with_the_reason(tmp_path, monkeypatch):
    """A JAXIL_OMAPL_PEER that holds no trainers/omarl.py is skipped naming
    the folder, not an ImportError that loses the suite's other parts."""
    monkeypatch.setenv("JAXIL_OMAPL_PEER", str(tmp_path))
    args = gpu_suite.parse_args(["--quick", "--parts", "peer"])
    res = gpu_suite.part_peer(args, 10, tmp_path)
    assert "holds no trainers/omarl.py" in res["skipped"] and str(tmp_path) in res["skipped"]
    with pytest.raises(SystemExit):
        gpu_suite.parse_args(["--parts", "env,gpu"])


def test_summary_headlines():
    """The vmapped-seeds speedup is the top seed count's updates/s over one
    seed's (updates/s is summed over seeds: 256 seeds at 1/100 of the call
    rate of one seed each is 2.56x); the peer ratio divides the peer's time
    by jaxil's; the token headline is the largest batch's row. Catches an
    inverted ratio, the speedup taken from the batch axis and the token
    headline taken from a small batch."""
    parts = {
        "learners": {"rows": [
            {"learner": "bc_union", "axis": "seeds", "seeds": 1, "updates_per_s": 100.0},
            {"learner": "bc_union", "axis": "seeds", "seeds": 256, "updates_per_s": 256.0},
            {"learner": "bc_union", "axis": "batch", "seeds": 1, "updates_per_s": 1.0},
        ]},
        "paper": {"summary": {"omapl_fused": {"update_ms": 2.0}, "omapl_single": {"update_ms": 4.0}}},
        "peer": {"update_ms": 20.0},
        "env": {"rows": [{"env": "a", "num_envs": 8, "raw_env_steps_per_s": 5.0},
                         {"env": "a", "num_envs": 1, "raw_env_steps_per_s": 1.0}]},
        "tokens": {"rows": [{"size": "tiny", "batch": 64, "decode_cached_over_recompute": 9.0},
                            {"size": "small", "batch": 64, "decode_cached_over_recompute": 30.0},
                            {"size": "small", "batch": 8, "decode_cached_over_recompute": 3.0}]},
    }
    s = gpu_suite.summarize(parts)
    # the token headline is the largest batch, the larger model at it
    assert s["token_decode"]["size"] == "small" and s["token_decode"]["batch"] == 64
    assert s["token_decode"]["decode_cached_over_recompute"] == 30.0
    assert s["vmapped_seeds_speedup"]["bc_union"] == {"seeds": 256, "speedup": 2.56}
    assert s["peer_over_jaxil_omapl_fused"] == 10.0 and s["peer_over_jaxil_omapl_single"] == 5.0
    assert s["env_steps_per_s_at"] == 8 and s["env_steps_per_s"]["a"] == {"raw_env_steps_per_s": 5.0}


@pytest.mark.slow
def test_the_whole_quick_suite_through_the_script(tmp_path):
    """``bash benchmarks/gpu_suite.sh --quick``: every part, no errors."""
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("JAXIL_OMAPL_PEER", None)
    p = subprocess.run(["bash", "benchmarks/gpu_suite.sh", "--quick", "--out-dir", str(tmp_path)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(next(tmp_path.glob("gpu_suite_quick-*.json")).read_text())
    assert out["errors"] == {}, out["errors"]
    assert set(out["parts"]) == set(gpu_suite.PARTS)
    assert out["summary"]["paper_update_ms"]


@pytest.mark.slow
def test_single_update_quick(tmp_path):
    """benchmarks/single_update.py --quick: both memory modes, every call timed."""
    p = subprocess.run([sys.executable, "benchmarks/single_update.py", "--quick", "--cores", "all",
                        "--learners", "omapl", "--out", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(next(tmp_path.glob("single_update_quick-*.json")).read_text())
    assert [r["memory"] for r in out["rows"]] == ["default", "retain"]
    for r in out["rows"]:
        assert "error" not in r, r
        assert set(r["calls"]) == {"fused", "single", "single_donated"}


def test_the_peer_child_stubs_a_missing_tensorboard(tmp_path):
    """A PyTorch whose ``torch.utils.tensorboard`` fails to import (the
    ``tensorboard`` package absent) gets a no-op ``SummaryWriter``, so the
    peer's trainer imports and is timed. Fails if the stub is not installed
    under the module name the trainer imports, if its writer lacks the
    methods a trainer calls, or if the stub replaces a working module."""
    fake = tmp_path / "torch" / "utils" / "tensorboard"
    fake.mkdir(parents=True)
    (tmp_path / "torch" / "__init__.py").write_text("")
    (tmp_path / "torch" / "utils" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'tensorboard'\")\n")
    script = (
        "import sys\n"
        "from benchmarks.gpu_suite import stub_summary_writer\n"
        "assert stub_summary_writer()\n"
        "from torch.utils.tensorboard import SummaryWriter\n"
        "w = SummaryWriter(log_dir='unused')\n"
        "w.add_scalar('loss', 1.0, 0); w.add_histogram('h', [1], 0); w.flush(); w.close()\n"
        "assert not stub_summary_writer()  # now importable: left alone\n"
        "print('stubbed')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "stubbed"
