"""Runs sharded across devices: ``train(devices=N)``, ``--devices N``
(:mod:`jaxil.runs.sharding`), and one run trained by two processes
(:mod:`jaxil.runs.distributed`).

JAX fixes its device count when it starts, so the sharded runs train in a
subprocess (this file run as a script) with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` and
``JAX_PLATFORMS=cpu``; the same subprocess trains the one-device reference,
with the same flags (XLA optimisation level 0, as in tests/helpers/fast_compile.py,
for both). Tiny runs: mpe:simple_spread random-policy data, BC on D_E,
hidden 8, batch 16, 10 updates, evaluation of 2 episodes every 5.

Sharded and unsharded runs agree to float32 round-off, not bit for bit: the
compiled programs differ (the sharded one trains R/N runs per device where
the unsharded one trains R), and XLA's CPU code for another batch size
rounds some sums differently. Measured: in these BC runs the metrics rows
came out identical and the checkpoints differ by at most 3e-8; MisoDICE's
losses differ in the 7th significant digit for some runs, as they do
between R = 6 and R = 8 runs on ONE device. So every integer field of a
metrics row (update, run, seed, grid) must be equal and every float equal to
a relative 1e-5, and the checkpoints too, leaf by leaf. A permuted or padded
run differs in the first digit, not the seventh.

Multi-process on CPU works with this JAX (0.10.2): ``jax.distributed.
initialize(coordinator_address="localhost:PORT", num_processes=2,
process_id=i)`` with the default ``jax_cpu_collectives_implementation =
"gloo"``. The slow test starts two processes through
``jaxil.runs.distributed.initialize_from_argv`` and then ``jaxil.cli.main.main``:
initialize must come before JAX first runs, and building the CLI parser
already does (JaxMARL makes arrays at import).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.xdist_group("sharding")

ROOT = Path(__file__).resolve().parents[2]
RTOL, ATOL = 1e-5, 1e-6
FAST = ["--updates", "10", "--eval-every", "5", "--eval-episodes", "2", "--batch-size", "16",
        "--hidden", "8", "--no-progress"]
COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")


def _env(devices: int = 8) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    # the workers run this file as a script: they import helpers from tests/
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tests"),
                                                      env.get("PYTHONPATH")]))
    env["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count={devices} "
                        "--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false "
                        "intra_op_parallelism_threads=1")
    return env


# The 8-device worker (about 75 s of compile on 2 cores) runs with -m slow.
_WORKER = pytest.mark.slow


@pytest.fixture(scope="module")
def worked(tmp_path_factory):
    """The worker's run directories and report (one subprocess for all tests)."""
    out = tmp_path_factory.mktemp("sharding")
    p = subprocess.run([sys.executable, __file__, "worker", str(out)], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    return out, json.loads((out / "report.json").read_text())


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _assert_same_rows(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys(), (g, w)
        for k, v in w.items():
            if isinstance(v, float):
                assert g[k] == pytest.approx(v, rel=RTOL, abs=ATOL), (k, g, w)
            else:
                assert g[k] == v, (k, g, w)


def _assert_same_checkpoint(got: Path, want: Path) -> None:
    a, b = np.load(got / "checkpoint.npz"), np.load(want / "checkpoint.npz")
    assert sorted(a.files) == sorted(b.files)
    for k in b.files:
        assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
        if np.issubdtype(b[k].dtype, np.floating):
            np.testing.assert_allclose(a[k], b[k], rtol=RTOL, atol=ATOL, err_msg=k)
        else:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@_WORKER
def test_eight_runs_on_eight_devices_match_one_device(worked):
    """8 runs, one per device, give the one-device run's metrics rows and
    checkpoint. Catches runs permuted across devices (a row or a checkpoint
    slot holding another seed's run) and a device's runs dropped."""
    out, rep = worked
    _assert_same_rows(_rows(out / "r8_d8"), _rows(out / "r8_d1"))
    _assert_same_checkpoint(out / "r8_d8", out / "r8_d1")
    assert rep["r8_d8"]["steps"] == rep["r8_d1"]["steps"] == [5, 10]


@_WORKER
def test_six_runs_on_four_devices_pad_without_leaking(worked):
    """6 runs on 4 devices are padded to 8; the padding never shows: exactly
    runs 0-5 in every metrics row, results.json and the returned states, and
    the checkpoint holds 6 runs equal to the one-device run's. Catches a
    padded run leaking into metrics or results, and a checkpoint saved with
    padding (8 runs; it would not even restore into the 6-run state)."""
    out, rep = worked
    rows = _rows(out / "r6_d4")
    assert sorted({r["run"] for r in rows}) == list(range(6))
    assert [r["update"] for r in rows] == [5] * 6 + [10] * 6
    _assert_same_rows(rows, _rows(out / "r6_d1"))
    res = json.loads((out / "r6_d4" / "results.json").read_text())
    assert [p["seeds"] for p in res["points"]] == [6] and len(res["points"][0]["returns"]) == 6
    assert rep["r6_d4"]["returned_runs"] == [6]
    _assert_same_checkpoint(out / "r6_d4", out / "r6_d1")
    assert rep["r6_d4"]["stored_runs"] == [6]


@_WORKER
def test_a_killed_sharded_run_resumes_to_the_same_rows_and_checkpoint(worked):
    """Killed between the update-10 metrics and their checkpoint, the sharded
    run of 6 runs on 4 devices resumes from update 5 and ends as the
    uninterrupted one-device run (its checkpoint restored replicated and
    padded again). Catches a restore into the wrong layout, a restore that
    keeps the padding's state in a real run's slot, and the rows of update 10
    written twice. (N dividing R, the checkpoint restored straight into the
    runs sharding, is resumed in the slow CLI sweep test: 6 runs on 3
    devices.)"""
    out, rep = worked
    name, ref = "r6_d4", out / "r6_d1"
    killed = out / f"{name}_killed"
    assert rep[f"{name}_killed"]["rows_at_kill"] == 12
    _assert_same_rows(_rows(killed), _rows(ref))
    _assert_same_checkpoint(killed, ref)


@_WORKER
def test_the_sharded_programs_need_no_communication(worked):
    """Each device trains and evaluates its own runs: the compiled sharded
    chunk and evaluation hold no collective, and the state is split 2 runs
    per device. Catches a sharding that XLA resolves by gathering the state
    (or the dataset) every chunk."""
    _, rep = worked
    assert rep["collectives"] == {"chunk": [], "evaluate": []}
    assert rep["shard_rows"] == [2] * 4


@_WORKER
def test_a_batch_split_over_four_devices_trains_as_on_one(worked):
    """2 runs × 4 batch devices (each run's batch of 16 split 4 ways on a
    2 × 4 mesh) give the one-device run's metrics rows and checkpoint; the
    state is split one run per runs-device (copied over the batch axis),
    and the compiled chunk holds the all-reduce that sums the gradients.
    Catches a batch that is silently not split (no collective), padding
    computed from all 8 devices instead of the 2 along the runs axis (4
    rows per shard), and a split that changes the update (rows differ)."""
    out, rep = worked
    _assert_same_rows(_rows(out / "r2_d2_b4"), _rows(out / "r2_d1"))
    _assert_same_checkpoint(out / "r2_d2_b4", out / "r2_d1")
    assert rep["batch_shard_rows"] == [1] * 8
    assert "all-reduce" in rep["batch_collectives"]


@_WORKER
def test_omapl_fit_with_its_pairs_over_four_devices_matches_one(worked):
    """Phase 1's O-MAPL fit with each batch of 8 pairs split over 4 devices
    records the one-device fit's losses and scores every trajectory alike,
    to float32 round-off. Catches the sharded states not gathered back
    (scores from padding or one device) and a changed update."""
    _, rep = worked
    one, four = rep["omapl"]["1"], rep["omapl"]["4"]
    assert [h["update"] for h in four["history"]] == [5, 10]
    for a, b in zip(four["history"], one["history"]):
        for k, v in b.items():
            assert a[k] == pytest.approx(v, rel=RTOL, abs=ATOL), (k, a, b)
    # a score sums ~20 step values: near-cancelling sums get an absolute
    # tolerance on the scale of the scores, not of each one
    scale = np.abs(np.asarray(one["scores"])).max()
    np.testing.assert_allclose(four["scores"], one["scores"], rtol=RTOL, atol=RTOL * scale)


def test_a_batch_that_does_not_split_is_refused():
    """--batch-size 10 over --batch-devices 4 is refused naming both and the
    fix, before anything trains; --batch-devices above the device count names
    the count."""
    import jax

    from jaxil.runs.sharding import check_batch_split, num_devices

    with pytest.raises(ValueError, match="--batch-size 10 does not split over --batch-devices 4"):
        check_batch_split(10, 4)
    check_batch_split(12, 4)
    n = jax.device_count()
    with pytest.raises(ValueError, match=f"--batch-devices {n + 1}: there (is|are) {n}"):
        num_devices(None, 4, n + 1)


def test_device_counts_out_of_range_are_refused():
    """--devices 0 or more than there are devices (here: 1) names the
    available count; more devices than runs is refused, not padded."""
    from jaxil.runs.sharding import make_mesh, num_devices

    import jax

    n = jax.device_count()
    for bad in (0, n + 1):
        with pytest.raises(ValueError, match=f"there (is|are) {n} cpu device"):
            num_devices(bad, 8)
    with pytest.raises(ValueError, match="a mesh of 2 devices"):
        make_mesh(n + 1)
    assert num_devices(None, 8) == n
    if n == 1:
        return
    with pytest.raises(ValueError, match="more than the 1 runs"):
        num_devices(2, 1)


def test_multi_process_settings_are_all_or_none(monkeypatch):
    """Half a multi-process setting (a coordinator without a process id, or
    an id out of range) is refused naming what is missing; none at all, and
    no multi-task SLURM / Open MPI job, is one process (nothing initialized)."""
    from jaxil.runs import distributed

    for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
                "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert distributed.initialize_from_argv(["train", "bc_union"]) == ["train", "bc_union"]
    with pytest.raises(ValueError, match="--process-id unset"):
        distributed.initialize_from_env("localhost:1234", 2, None)
    with pytest.raises(ValueError, match=r"outside \[0, 2\)"):
        distributed.initialize_from_argv(["--coordinator", "h:1", "--num-processes", "2",
                                          "--process-id", "2"])
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "localhost:1234")
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES unset"):
        distributed.initialize_from_env()
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS")
    assert distributed.initialize_from_env() is False


# ----------------------------------------------------------------------------- worker


def _dataset():
    """12 random-policy episodes of mpe:simple_spread, half labelled expert."""
    from helpers.mpe_data import poor_and_expert

    return poor_and_expert(0)


def _dump(run_dir: Path) -> None:
    """``run_dir/checkpoint.npz``: the newest checkpoint restored into the
    one-device state its run.json describes (as ``jaxil eval`` does)."""
    import jax

    from jaxil import envs
    from jaxil.runs.checkpoint import Checkpointer
    from jaxil.algorithms.offline import make_learner
    from jaxil.algorithms.offline.train import RunSpec, init_runs

    info = json.loads((run_dir / "run.json").read_text())["identity"]
    cfg = dict(info["config"])
    cfg.pop("mixing", None)
    cfg["hidden"] = tuple(cfg["hidden"])
    learner = make_learner(info["learner"], envs.make(info["env_id"]).spec, **cfg)
    runs = [RunSpec(r["index"], r["seed"], tuple(map(tuple, r["grid"]))) for r in info["runs"]]
    ck = Checkpointer(run_dir / "checkpoints")
    leaves = jax.tree.leaves(ck.restore(init_runs(learner, runs, info["base_seed"])))
    ck.close()
    np.savez(run_dir / "checkpoint.npz",
             **{f"leaf_{i:03d}": np.asarray(x) for i, x in enumerate(leaves)})


def _worker(out: Path) -> None:
    """Train every run the tests compare and write ``report.json``; each run
    directory gets ``checkpoint.npz``: its newest checkpoint restored into the
    one-device state (as ``jaxil eval`` does), leaf by leaf."""
    import re

    import jax
    import orbax.checkpoint as ocp

    from jaxil import envs
    from jaxil.runs.checkpoint import Checkpointer
    from jaxil.algorithms.offline import LearnerData, make_learner
    from jaxil.runs.sharding import RunsLayout, make_mesh
    from jaxil.algorithms.offline.train import _compiled, expand_grid, init_runs, train

    assert jax.device_count() == 8, jax.devices()
    env = envs.make("mpe:simple_spread")
    spec = env.spec
    ds = _dataset()
    learner = make_learner("bc_expert", spec, hidden=(8,), batch_size=16)
    data = LearnerData.from_dataset(ds, np.asarray(ds.expert))
    report: dict = {}

    def go(name, r, n, **kw):
        return train(learner, env, data, runs=expand_grid({}, r), num_updates=10, eval_every=5,
                     eval_episodes=2, out_dir=out / name, devices=n, progress=False, **kw)

    def record(name, r, summary=None):
        _dump(out / name)
        ck = Checkpointer(out / name / "checkpoints")
        step = ck.latest_step()
        meta = ocp.StandardCheckpointer().metadata(ck.directory / str(step) / "default")
        report[name] = dict(steps=list(ck.manager.all_steps()), stored_runs=sorted(
            {int(m.shape[0]) for m in jax.tree.leaves(meta.item_metadata) if m.shape}))
        if summary is not None:
            report[name]["returned_runs"] = sorted(
                {int(x.shape[0]) for x in jax.tree.leaves(summary["states"])})
        ck.close()

    for r, n in ((8, 1), (8, 8), (6, 1), (6, 4)):
        record(f"r{r}_d{n}", r, go(f"r{r}_d{n}", r, n))

    save = Checkpointer.save

    def killed(self, step, state):
        if step == 10:
            raise KeyboardInterrupt
        save(self, step, state)

    for r, n in ((6, 4),):  # the padded layout: restored replicated, padded again
        name = f"r{r}_d{n}_killed"
        Checkpointer.save = killed
        try:
            go(name, r, n)
        except KeyboardInterrupt:
            pass
        finally:
            Checkpointer.save = save
        rows_at_kill = len((out / name / "metrics.jsonl").read_text().splitlines())
        go(name, r, n, resume=True)
        record(name, r)
        report[name]["rows_at_kill"] = rows_at_kill

    lay = RunsLayout(make_mesh(4), 6)
    states = lay.place(init_runs(learner, expand_grid({}, 6), 0))
    report["shard_rows"] = [s.data.shape[0] for s in jax.tree.leaves(states)[0].addressable_shards]
    chunk, evaluate = _compiled(learner, env, 5, 2, False, lay.mesh)
    key = lay.replicate(jax.random.PRNGKey(0))
    hlo = dict(chunk=chunk.lower(states, lay.replicate(data)).compile().as_text(),
               evaluate=evaluate.lower(states.params, key).compile().as_text())
    report["collectives"] = {k: sorted(set(re.findall("|".join(COLLECTIVES), v)))
                             for k, v in hlo.items()}

    # batch (data-parallel) sharding: 2 runs × 4 batch devices against 2 runs on one
    for name, n, m in (("r2_d1", 1, 1), ("r2_d2_b4", 2, 4)):
        record(name, 2, go(name, 2, n, batch_devices=m))
    blay = RunsLayout(make_mesh(2, 4), 2)
    bstates = blay.place(init_runs(learner, expand_grid({}, 2), 0))
    report["batch_shard_rows"] = [s.data.shape[0]
                                  for s in jax.tree.leaves(bstates)[0].addressable_shards]
    bchunk, _ = _compiled(learner, env, 5, 2, False, blay.mesh)
    bhlo = bchunk.lower(bstates, blay.replicate(data)).compile().as_text()
    report["batch_collectives"] = sorted(set(re.findall("|".join(COLLECTIVES), bhlo)))

    # O-MAPL (Phase 1's fit) with its batch of pairs over 4 devices
    from jaxil.algorithms.labelling.label import fit_preferences
    from jaxil.data.preferences import sample_query_pairs

    pairs = sample_query_pairs(ds, 24, None, seed=0)
    ret = np.asarray(ds.episode_return)
    prefs = (ret[pairs.traj_x] > ret[pairs.traj_y]).astype(np.float32)
    fits = {m: fit_preferences(ds, pairs, prefs, seeds=2, updates=10, chunk=5, hidden=(8,),
                               mixer_hidden=4, batch_size=8, progress=False, batch_devices=m)
            for m in (1, 4)}
    report["omapl"] = {str(m): dict(history=f.history, scores=f.scores.tolist())
                       for m, f in fits.items()}
    (out / "report.json").write_text(json.dumps(report, indent=1))


def _sweep_worker(out: Path) -> None:
    """The CLI path: ``jaxil sweep`` of 2 grid points × 3 seeds on 1 and on 4
    devices, both resumed with 5 more updates (the sharded one on 3
    devices), then ``jaxil eval`` of the sharded run."""
    from jaxil.data import save
    from jaxil.cli.main import main

    save(_dataset(), out / "data.npz")
    base = ["sweep", "bc_expert", "--dataset", str(out / "data.npz"), "--lr", "0.0003,0.003",
            "--seeds", "3", *FAST]
    for name, n, more in (("ref", 1, 1), ("sharded", 4, 3)):
        assert main([*base, "--devices", str(n), "--out", str(out / name)]) == 0
        assert main([*base, "--devices", str(more), "--out", str(out / name), "--resume",
                     "--updates", "15"]) == 0
        _dump(out / name)
    assert main(["eval", str(out / "sharded"), "--episodes", "2"]) == 0


@pytest.mark.slow
def test_a_sweep_through_the_cli_resumes_on_another_device_count(tmp_path):
    """``jaxil sweep --devices 4`` (2 learning rates × 3 seeds = 6 runs,
    padded to 8) resumed with ``--devices 3`` ends as the one-device sweep:
    the checkpoint holds the 6 real runs whatever the device count, and
    ``jaxil eval`` restores it on one device. Catches a checkpoint tied to
    the device count or to the padding, and the --devices flag not reaching
    train().

    BC, not MisoDICE: MisoDICE's ν-loss is invariant to a constant shift of
    ν_tot, so the value mixer's output bias has a zero gradient in exact
    arithmetic, and Adam scales its round-off gradient (~1e-8) to steps of
    the learning rate: that one parameter differs by 1e-5 to 1e-4, its own
    size, between any two differently compiled programs, sharded or not
    (measured: 6 against 8 runs on one device; the metrics rows still agree
    to 1e-5)."""
    p = subprocess.run([sys.executable, __file__, "sweep", str(tmp_path)], cwd=ROOT,
                       env=_env(), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    rows = _rows(tmp_path / "sharded")
    assert [r["update"] for r in rows] == [5] * 6 + [10] * 6 + [15] * 6
    _assert_same_rows(rows, _rows(tmp_path / "ref"))
    _assert_same_checkpoint(tmp_path / "sharded", tmp_path / "ref")
    assert "all: return" in p.stdout


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_train_one_sharded_run(tmp_path):
    """Two processes of 2 CPU devices each (jax.distributed on localhost,
    gloo collectives) train 6 runs padded to 8 as one run, then resume it
    for 5 more updates: the metrics rows and the checkpoint are the one
    process, one device run's, each row written once, and only process 0
    writes run files and prints. Catches every process appending its rows,
    a process whose runs (or padding) are lost in the gather, and
    checkpoints that cannot be saved or restored across processes."""
    def cli(*args):
        return [sys.executable, __file__, "cli", *args]

    ds = tmp_path / "data.npz"
    one = subprocess.run([sys.executable, __file__, "dataset", str(ds)], cwd=ROOT, env=_env(1),
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-4000:]
    base = ["train", "bc_expert", "--dataset", str(ds), "--seeds", "6", *FAST]
    for extra in ([], ["--resume", "--updates", "15"]):
        ref = subprocess.run(cli(*base, *extra, "--devices", "1", "--out", str(tmp_path / "ref")),
                             cwd=ROOT, env=_env(2), capture_output=True, text=True, timeout=300)
        assert ref.returncode == 0, ref.stderr[-4000:]
        port = _free_port()
        procs = [subprocess.Popen(
            cli(*base, *extra, "--out", str(tmp_path / "two"), "--coordinator",
                f"localhost:{port}", "--num-processes", "2", "--process-id", str(i)),
            cwd=ROOT, env=_env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(2)]
        outs = [p.communicate(timeout=600) for p in procs]
        for p, (_, err) in zip(procs, outs):
            assert p.returncode == 0, err[-4000:]
        printed = [[x for x in o.splitlines() if not x.startswith("[Gloo]")] for o, _ in outs]
        assert any(x.startswith("learner") for x in printed[0]) and printed[1] == []
    rows = _rows(tmp_path / "two")
    assert [r["update"] for r in rows] == [5] * 6 + [10] * 6 + [15] * 6
    _assert_same_rows(rows, _rows(tmp_path / "ref"))
    assert sorted(x.name for x in (tmp_path / "two").iterdir()) == sorted(
        x.name for x in (tmp_path / "ref").iterdir())
    dump = subprocess.run([sys.executable, __file__, "dump", str(tmp_path / "two"),
                           str(tmp_path / "ref")], cwd=ROOT, env=_env(1), capture_output=True,
                          text=True, timeout=300)
    assert dump.returncode == 0, dump.stderr[-4000:]
    _assert_same_checkpoint(tmp_path / "two", tmp_path / "ref")


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "worker":
        _worker(Path(rest[0]))
    elif mode == "sweep":
        _sweep_worker(Path(rest[0]))
    elif mode == "dataset":
        from jaxil.data import save

        save(_dataset(), rest[0])
    elif mode == "dump":
        for d in rest:
            _dump(Path(d))
    elif mode == "cli":  # jax.distributed must start before the CLI imports the environments
        from jaxil.runs import distributed

        argv = distributed.initialize_from_argv(rest)
        from jaxil.cli.main import main

        sys.exit(main(argv))
