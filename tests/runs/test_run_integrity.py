"""Runs that cannot finish wrong: run-directory identity and resume, range
checks, the NaN guard, label checks and clean OS errors (``jaxil train``,
``sweep`` and ``eval``). Each test is one finding of the hostile-tester
review; it failed on the code before the fix."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.cli.main import main
from jaxil.data import save
from jaxil.algorithms.offline import LearnerData, make_learner
from jaxil.algorithms.offline.train import expand_grid, train

from helpers.mpe_data import poor_and_expert

pytestmark = pytest.mark.xdist_group("run_integrity")

FAST = ["--updates", "10", "--eval-every", "5", "--eval-episodes", "2", "--batch-size", "16",
        "--hidden", "8", "--no-progress"]


def _dataset(seed):
    return poor_and_expert(seed)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("integrity")
    save(_dataset(0), d / "a.npz")
    save(_dataset(10), d / "b.npz")
    return d


def _rows(path):
    return [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]


def _err(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


@pytest.mark.slow  # default-suite time (~30 s: a training per argument); the engine's and the CLIs' own resume-refusal tests stay
def test_resume_refuses_each_changed_argument_and_names_it(files, tmp_path, capsys):
    """A changed dataset, seed, batch size, eval cadence, network shape,
    learner or number of seeds is refused on --resume, naming what changed
    (the old code continued silently, mislabelled updates or dumped an orbax
    tree); the run directory is left as it was. Breaks if any of these is
    left out of the identity."""
    out = tmp_path / "run"
    base = ["train", "misodice", "--dataset", str(files / "a.npz"), "--out", str(out), *FAST]
    assert main(base) == 0
    before = (out / "metrics.jsonl").read_text(), (out / "run.json").read_text()
    changes = {
        "data": (["--dataset", str(files / "b.npz")], "dataset_id"),
        "seed": (["--seed", "3"], "base_seed"),
        "batch": (["--batch-size", "32"], "config"),
        "eval cadence": (["--eval-every", "2"], "eval_every"),
        "network shape": (["--hidden", "12"], "config"),
        "seeds": (["--seeds", "2"], "runs"),
    }
    for name, (extra, key) in changes.items():
        assert main(base + extra + ["--resume"]) == 1, name
        msg = _err(capsys)
        assert "differ" in msg and key in msg, (name, msg)
    learner = ["train", "bc_expert"] + base[2:]
    assert main(learner + ["--resume"]) == 1
    assert "learner" in _err(capsys)
    assert ((out / "metrics.jsonl").read_text(), (out / "run.json").read_text()) == before
    # the same settings resume (nothing left to do), and more updates continue
    assert main(base + ["--resume"]) == 0
    assert main(base + ["--resume", "--updates", "15"]) == 0
    assert [r["update"] for r in _rows(out)] == [5, 10, 15]


@pytest.mark.slow  # default-suite time; run with -m slow; the engine's own refusal tests stay
def test_reuse_without_resume_is_refused_and_overwrite_starts_afresh(files, tmp_path, capsys):
    """Reusing a directory without --resume, even for another learner, used to
    append to its metrics.jsonl; it is refused in one line, and --overwrite
    replaces the old run's rows instead of mixing them."""
    out = tmp_path / "run"
    args = ["--dataset", str(files / "a.npz"), "--out", str(out), *FAST]
    assert main(["train", "misodice", *args]) == 0
    assert main(["train", "bc_union", *args]) == 1
    assert "already holds a run" in _err(capsys)
    assert main(["train", "bc_union", *args, "--overwrite"]) == 0
    rows = _rows(out)
    assert len(rows) == 2 and "bc_loss" in rows[0] and "nu_loss" not in rows[0]


@pytest.mark.slow  # default-suite time (~13 s: a CLI process killed and rerun); run with -m slow
def test_kill_before_the_first_checkpoint_does_not_duplicate_rows(tmp_path, monkeypatch):
    """Killed after the first chunk's metrics but before its checkpoint, a
    resumed run used to keep those rows and append them again; it must drop
    rows past the newest committed checkpoint (here: all) and reproduce the
    uninterrupted metrics exactly."""
    from jaxil.runs.checkpoint import Checkpointer

    env = envs.make("mpe:simple_spread")
    ds = _dataset(0)
    learner = make_learner("bc_expert", env.spec, hidden=(8,), batch_size=16)
    data = LearnerData.from_dataset(ds, np.asarray(ds.expert))
    go = lambda out, **kw: train(learner, env, data, runs=expand_grid({}, 2), num_updates=10,
                                 eval_every=5, eval_episodes=2, out_dir=out, progress=False, **kw)
    go(tmp_path / "full")
    save = Checkpointer.save

    def killed(self, step, state):
        raise KeyboardInterrupt

    monkeypatch.setattr(Checkpointer, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        go(tmp_path / "killed")
    assert len(_rows(tmp_path / "killed")) == 2  # the chunk's rows, no checkpoint
    monkeypatch.setattr(Checkpointer, "save", save)
    go(tmp_path / "killed", resume=True)
    assert _rows(tmp_path / "killed") == _rows(tmp_path / "full")


@pytest.mark.parametrize("flag,value,allowed", [
    ("--alpha", "-2", "[0, inf)"), ("--alpha", "nan", "[0, inf)"), ("--gamma", "1", "[0, 1)"),
    ("--gamma", "-0.1", "[0, 1)"), ("--lr-actor", "-0.001", "(0, inf)"),
])
def test_hyper_parameters_out_of_range_are_refused(files, flag, value, allowed, capsys):
    """α ≤ −1 or NaN used to give NaN losses reported as return 0.000 with
    exit 0; γ ≥ 1, γ < 0 and negative learning rates trained silently. Each
    is refused before training with the allowed range."""
    rc = main(["sweep", "misodice", "--dataset", str(files / "a.npz"), flag, value, *FAST])
    assert rc == 1
    msg = _err(capsys)
    assert flag in msg and allowed in msg


@pytest.mark.parametrize("flag", ["--eval-episodes", "--seeds", "--updates", "--batch-size"])
def test_counts_below_one_are_refused_at_parse_time(files, flag, capsys):
    """--eval-episodes 0 reported `nan ± nan`, --seeds 0 raised IndexError."""
    with pytest.raises(SystemExit) as e:
        main(["train", "bc_union", "--dataset", str(files / "a.npz"), *FAST, flag, "0"])
    assert e.value.code == 2
    assert f"argument {flag}: must be in [1, inf), got 0" in capsys.readouterr().err


@pytest.mark.slow  # default-suite time; run with -m slow; the guard's engine and teacher tests stay
def test_a_diverging_learner_stops_with_the_update_and_keeps_its_checkpoint(tmp_path):
    """A learner whose loss turns NaN at update 8 stops there: the error names
    the learner, the run, the update and the quantity; the chunk's metrics and
    checkpoint are not written, and the last good checkpoint (update 5) still
    loads. The old loop wrote NaN metrics, checkpointed NaN parameters and
    exited 0. Breaks if the guard checks only the last update of a chunk
    (it would say update 10), or saves before checking."""
    from jaxil.runs.checkpoint import Checkpointer
    from jaxil.runs.guard import NonFiniteError
    from jaxil.algorithms.offline.train import init_runs

    env = envs.make("mpe:simple_spread")
    ds = _dataset(0)
    base = make_learner("bc_expert", env.spec, hidden=(8,), batch_size=16)

    def poisoned(state, batch):
        new, m = base.update(state, batch)
        bad = new.step >= 8
        m = dict(m, bc_loss=jnp.where(bad, jnp.nan, m["bc_loss"]))
        params = jax.tree.map(lambda p: jnp.where(bad, jnp.inf, p), new.params)
        return new.replace(params=params), m

    learner = base._replace(update=poisoned)
    data = LearnerData.from_dataset(ds, np.asarray(ds.expert))
    runs = expand_grid({}, 2)
    with pytest.raises(NonFiniteError) as e:
        train(learner, env, data, runs=runs, num_updates=15, eval_every=5, eval_episodes=2,
              out_dir=tmp_path, progress=False)
    msg = str(e.value)
    assert "bc_expert diverged in run 0 (seed 0" in msg and "bc_loss = nan at update 8" in msg
    assert "update 5" in msg  # the checkpoint kept
    assert [r["update"] for r in _rows(tmp_path)] == [5, 5]
    ck = Checkpointer(tmp_path / "checkpoints")
    assert ck.latest_step() == 5
    st = ck.restore(init_runs(base, runs, 0))
    assert all(bool(np.isfinite(np.asarray(x)).all()) for x in jax.tree.leaves(st.params))


def test_diverging_cli_run_exits_non_zero(files, tmp_path, capsys):
    """Through the CLI a real divergence (learning rate 1e30) ends with exit 1
    and one line that says so, instead of a plausible return and exit 0.
    (Two runs, so that the program is the TensorBoard test's and compiles once.)"""
    rc = main(["sweep", "bc_union", "--dataset", str(files / "a.npz"), "--lr", "1e30,1e29",
               "--seeds", "1", *FAST])
    assert rc == 1
    assert "diverged" in _err(capsys)


def _write(path, obj):
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(path)


def test_labels_are_checked(files, tmp_path, capsys):
    """All-False labels trained anyway; labels made for another dataset of the
    same length were accepted; a 2.5 was accepted; a bare JSON list, a
    missing `expert` key or invalid JSON gave a traceback or no file name."""
    from jaxil.data import load
    from jaxil.data.preferences import dataset_id
    from jaxil.data.labels import expert_labels

    ds = load(files / "a.npz")
    m = ds.num_trajectories
    own = dataset_id(ds)
    other = dataset_id(load(files / "b.npz"))
    cases = {
        "no expert": ({"source_id": own, "expert": [False] * m}, "marks no trajectory"),
        "other dataset": ({"source_id": other, "expert": [True] * m}, "were made for dataset"),
        "2.5": ({"source_id": own, "expert": [True] * (m - 1) + [2.5]}, "found 2.5"),
        "bare list": ([True] * m, "has no `expert` key"),
        "no expert key": ({"source_id": own}, "has no `expert` key"),
        "invalid": ("{not json", "is not valid JSON"),
    }
    for i, (name, (doc, want)) in enumerate(cases.items()):
        path = _write(tmp_path / f"l{i}.labels.json", doc)
        rc = main(["train", "misodice", "--dataset", str(files / "a.npz"), "--labels", path, *FAST])
        assert rc == 1, name
        msg = _err(capsys)
        assert want in msg, (name, msg)
        if name != "no expert":
            assert path in msg, (name, msg)
    # A valid file is read as written: the array the CLI hands to the learner.
    flags = [True, False] * (m // 2)
    good = _write(tmp_path / "ok.labels.json", {"source_id": own, "expert": flags})
    np.testing.assert_array_equal(expert_labels(ds, good), flags)


def test_os_errors_are_one_line_and_checked_before_work(files, tmp_path, capsys):
    """--out naming a file, or a path under a file, used to escape as a
    traceback (FileExistsError / NotADirectoryError) after the work."""
    f = tmp_path / "a-file"
    f.write_text("x")
    for out in (f, f / "sub"):
        rc = main(["train", "bc_union", "--dataset", str(files / "a.npz"), "--out", str(out), *FAST])
        assert rc == 1
        msg = _err(capsys)
        assert str(f) in msg and "Traceback" not in msg


def test_eval_names_the_environment_mismatch(files, tmp_path, capsys):
    """`jaxil eval` on a run whose recorded environment no longer matches gave
    an orbax shape error; it now says which dimension changed."""
    out = tmp_path / "run"
    assert main(["train", "bc_union", "--dataset", str(files / "a.npz"), "--out", str(out),
                 *FAST]) == 0
    assert main(["eval", str(out), "--episodes", "2"]) == 0
    capsys.readouterr()
    doc = json.loads((out / "run.json").read_text())
    doc["identity"]["spec"]["obs_dim"] += 3
    (out / "run.json").write_text(json.dumps(doc))
    assert main(["eval", str(out), "--episodes", "2"]) == 1
    msg = _err(capsys)
    assert "no longer matches" in msg and "obs_dim" in msg


def _scalars(logdir):
    """{(run dir name, tag): [(step, value)]} from tensorboardX event files
    (TFRecord framing: u64 length, u32 crc, payload, u32 crc)."""
    import struct

    from tensorboardX.proto import event_pb2

    out = {}
    for f in sorted(logdir.glob("*/events.out.tfevents.*")):
        data = f.read_bytes()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            for v in ev.summary.value:
                out.setdefault((f.parent.name, v.tag), []).append((ev.step, v.simple_value))
    return out


def test_tensorboard_scalars_match_the_metrics_rows(files, tmp_path):
    """--tensorboard writes each run's metrics under its own run name at the
    update of the row (a writer indexed by position instead of row["run"],
    or the step taken from the wrong key, breaks the equality)."""
    pytest.importorskip("tensorboardX")
    out, tb = tmp_path / "run", tmp_path / "tb"
    assert main(["sweep", "bc_union", "--dataset", str(files / "a.npz"), "--lr", "0.001,0.01",
                 "--seeds", "1", "--out", str(out), "--tensorboard", str(tb), *FAST]) == 0
    got = _scalars(tb)
    rows = _rows(out)
    assert {name for name, _ in got} == {"run0-seed0-lr=0.001", "run1-seed0-lr=0.01"}
    for r in rows:
        name = f"run{r['run']}-seed0-lr={r['grid']['lr']:g}"
        for tag in ("eval_return", "bc_loss"):
            assert (r["update"], pytest.approx(r[tag], rel=1e-6)) in got[(name, tag)]
