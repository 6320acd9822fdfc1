"""The W&B logger (:mod:`jaxil.runs.loggers`) and the logger flags of the
``jaxil`` commands, on a small numpy program run by the engine.

No test touches the network: a fake ``wandb`` module in ``sys.modules``
records every ``init``, ``log`` and ``finish``, and keeps each W&B run's
history across sessions the way the W&B server does (a resumed run accepts
steps past its last one only).
"""

from __future__ import annotations

import json
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest
from helpers.data import omapl_dataset

from jaxil.cli.args import make_loggers
from jaxil.cli.main import build_parser, main
from jaxil.data import save
from jaxil.runs import engine, guard, loggers

K = 3  # updates per chunk


# ----------------------------------------------------------------------------- fakes


class _Config(dict):
    def update(self, values, allow_val_change=False):
        super().update(values)


class _Run:
    def __init__(self, server, **kw):
        self.server, self.kw = server, kw
        self.id, self.name = kw["id"], kw["name"]
        self.config = _Config()
        self.step = server.history.get(self.id, 0)  # a resumed run starts past its history

    def log(self, data, step=None, commit=None):
        assert step is not None and commit, "rows are logged at their own step, at once"
        if step < self.step:  # W&B drops a step below its current one (with a warning)
            self.server.dropped.append((self.id, step))
            return
        self.server.logs.append((self.id, step, dict(data)))
        self.step = self.server.history[self.id] = step + 1

    def finish(self, exit_code=None):
        self.server.finished.append((self.id, exit_code))


@pytest.fixture
def fake_wandb(monkeypatch):
    """The W&B "server": ``inits`` (the kwargs of every ``wandb.init``),
    ``logs`` ``(id, step, data)``, ``dropped``, ``finished`` ``(id,
    exit_code)`` and each run's ``history`` (its next step); ``runs`` maps an
    id to its newest run object."""
    server = SimpleNamespace(inits=[], logs=[], dropped=[], finished=[], history={}, runs={})
    mod = types.ModuleType("wandb")
    mod.__version__ = "0.21.0"

    def init(**kw):
        server.inits.append(kw)
        run = server.runs[kw["id"]] = _Run(server, **kw)
        return run

    mod.init = init
    monkeypatch.setitem(sys.modules, "wandb", mod)
    return server


def make_program(runs=2, chunks=4, eval_every=2, bad_chunk=None, **kw) -> engine.Program:
    """R runs of a counter that a chunk moves by ``1 + run / 10`` per update;
    its evaluation is the counter. ``bad_chunk``: the chunk whose loss turns
    NaN (the guard stops the run)."""
    idx = np.arange(runs, dtype=np.float64)

    def chunk(x, c):
        x = x + K * (1 + idx / 10)
        loss = np.full(runs, np.nan) if c == bad_chunk else x / 100
        ok = np.isfinite(loss)
        health = guard.Health(first_bad=np.where(ok, K, 0), at_bad={"loss": loss},
                              params_finite=np.ones(runs, bool))
        return x, {"loss": loss}, health

    return engine.Program(
        name="toy", step_key="update", num_chunks=chunks, steps_per_chunk=K, step_unit=K,
        eval_every=eval_every, run_ids=[dict(run=i, seed=10 + i) for i in range(runs)],
        run_labels=[f"seed {10 + i}" for i in range(runs)], init=lambda: np.zeros(runs),
        chunk=chunk, evaluate=lambda x, c: {"eval_return": x}, **kw)


def run_toy(out, factories, resume=False, overwrite=False, **kw):
    rd = engine.open_run(out, {"toy": 1}, step_key="update", resume=resume, overwrite=overwrite)
    program = make_program(**{k: v for k, v in kw.items() if k != "stop_after_chunks"})
    names = [f"run{i}-seed{10 + i}" for i in range(len(program.run_ids))]
    return engine.run(program, rundir=rd, progress=False, loggers=factories, log_names=names,
                      stop_after_chunks=kw.get("stop_after_chunks"))


def logged(server, run_id):
    return [(step, data) for i, step, data in server.logs if i == run_id]


# ----------------------------------------------------------------------------- the logger


def test_one_wandb_run_per_jaxil_run_named_and_grouped(fake_wandb, tmp_path):
    """Each jaxil run (seed) is its own W&B run, named by its run name, with
    its own id, all in one group named after the run directory, opened side
    by side (``reinit="create_new"``) and finished once. Catches: one W&B
    run for the whole vmapped sweep (seeds overwrite each other), a group per
    run (W&B cannot average the seeds), an old ``reinit`` that finishes the
    previous run when the next starts, runs left open."""
    out = tmp_path / "toy-sweep"
    run_toy(out, [loggers.wandb("proj", entity="me", run_dir=out, config={"algo": "toy"})],
            runs=3)
    inits = fake_wandb.inits
    assert [kw["name"] for kw in inits] == ["run0-seed10", "run1-seed11", "run2-seed12"]
    assert len({kw["id"] for kw in inits}) == 3
    assert {kw["group"] for kw in inits} == {"toy-sweep"}
    assert all(kw["project"] == "proj" and kw["entity"] == "me" and kw["resume"] == "allow"
               and kw["reinit"] == "create_new" for kw in inits)
    assert sorted(fake_wandb.finished) == sorted((kw["id"], 0) for kw in inits)
    for i, kw in enumerate(inits):  # the invocation's settings and the run's ids
        assert fake_wandb.runs[kw["id"]].config == {"algo": "toy", "run": i, "seed": 10 + i}


def test_each_row_is_logged_once_at_its_step_with_numeric_fields_only(fake_wandb, tmp_path):
    """Every metrics row reaches its own run's W&B history exactly once, at
    the row's ``update`` as the W&B step, holding the numeric fields and
    nothing else (no ids, no step field, no strings or bools). Catches: rows
    sent to the run at their position in the batch instead of ``row["run"]``,
    W&B's own counter taken as the step, ``seed`` logged as a curve, a bool
    logged as 0/1, a string field crashing ``log``."""
    out = tmp_path / "run"
    derive = lambda row: dict(tag="a", ok=True, count=2)  # noqa: E731
    result = run_toy(out, [loggers.wandb("proj", run_dir=out)], derive=derive)
    ids = [kw["id"] for kw in fake_wandb.inits]
    assert not fake_wandb.dropped
    for i, run_id in enumerate(ids):
        rows = [r for r in result.rows if r["run"] == i]
        assert [s for s, _ in logged(fake_wandb, run_id)] == [r["update"] for r in rows] \
            == [6, 12]
        for (step, data), row in zip(logged(fake_wandb, run_id), rows):
            assert data == {k: row[k] for k in ("eval_return", "loss", "count")}


def test_a_resumed_run_continues_the_same_wandb_runs_with_only_new_rows(fake_wandb, tmp_path):
    """A run killed after chunk 3 (rows every chunk, the checkpoint at chunk
    2) and resumed re-opens the same W&B ids with ``resume="allow"`` and
    logs only the rows W&B does not hold: the union of both sessions is the
    uninterrupted run's rows, each once. Catches: new W&B runs on resume
    (ids not kept), rows at or before the resumed step logged again, the row
    the killed session wrote after its checkpoint logged twice."""
    out = tmp_path / "run"
    run_toy(out, [loggers.wandb("proj", run_dir=out)], row_every_chunk=True,
            stop_after_chunks=3)
    first = [kw["id"] for kw in fake_wandb.inits]
    assert json.loads((out / loggers.WANDB_IDS).read_text())["runs"] == {
        "run0-seed10": first[0], "run1-seed11": first[1]}
    result = run_toy(out, [loggers.wandb("proj", run_dir=out)], resume=True,
                     row_every_chunk=True)
    second = fake_wandb.inits[2:]
    assert [kw["id"] for kw in second] == first
    assert all(kw["resume"] == "allow" for kw in second)
    assert {kw["group"] for kw in fake_wandb.inits} == {"run"}
    assert not fake_wandb.dropped  # the row past the checkpoint (update 9) is skipped
    for i, run_id in enumerate(first):
        steps = [s for s, _ in logged(fake_wandb, run_id)]
        assert steps == [3, 6, 9, 12]
        rows = {r["update"]: r for r in result.rows if r["run"] == i}
        for step, data in logged(fake_wandb, run_id):  # the resumed rows reproduce them
            assert data == {k: v for k, v in rows[step].items() if k in ("loss", "eval_return")}


def test_a_fresh_run_in_a_used_directory_gets_new_wandb_runs(fake_wandb, tmp_path):
    """``--overwrite`` starts the jaxil run afresh, and its W&B runs too: new
    ids, every row logged from step 0 on. Catches ids derived from the
    directory alone, which would append to the old W&B runs, whose history
    is past these steps, so W&B would drop every row of the new run."""
    out = tmp_path / "run"
    run_toy(out, [loggers.wandb("proj", run_dir=out)])
    old = {kw["id"] for kw in fake_wandb.inits}
    run_toy(out, [loggers.wandb("proj", run_dir=out)], overwrite=True)
    new = [kw["id"] for kw in fake_wandb.inits[2:]]
    assert not old & set(new) and not fake_wandb.dropped
    assert all([s for s, _ in logged(fake_wandb, i)] == [6, 12] for i in new)


def test_programs_sharing_a_directory_keep_each_others_wandb_ids(fake_wandb, tmp_path):
    """Two programs of one command (π_SFT, then the model trained on it) log
    into one run directory under prefixed names; resumed, each continues its
    own W&B runs. Catches the second program's ids replacing the first's
    in ``wandb.json`` (a resumed π_SFT would open new W&B runs)."""
    out = tmp_path / "run"
    factory = loggers.wandb("proj", run_dir=out)
    run_toy(out / "sft", [loggers.prefixed(factory, "sft-")])
    run_toy(out, [factory])
    ids = {kw["name"]: kw["id"] for kw in fake_wandb.inits}
    assert set(ids) == {"sft-run0-seed10", "sft-run1-seed11", "run0-seed10", "run1-seed11"}
    factory = loggers.wandb("proj", run_dir=out)
    run_toy(out / "sft", [loggers.prefixed(factory, "sft-")], resume=True)
    run_toy(out, [factory], resume=True)
    assert {kw["name"]: kw["id"] for kw in fake_wandb.inits[4:]} == ids


def test_a_run_stopped_by_the_guard_finishes_its_wandb_runs_failed(fake_wandb, tmp_path):
    """A NaN loss stops the run; its W&B runs are finished with exit code 1,
    so W&B shows them failed. Catches runs left open (or marked finished)
    when training raises."""
    out = tmp_path / "run"
    with pytest.raises(guard.NonFiniteError):
        run_toy(out, [loggers.wandb("proj", run_dir=out)], bad_chunk=2)
    assert sorted(code for _, code in fake_wandb.finished) == [1, 1]


def test_missing_or_old_wandb_is_refused_in_one_line(fake_wandb, monkeypatch):
    """Without wandb the factory refuses at once with the install line (not
    an ImportError traceback after the data is built); a wandb older than
    0.19.10 is refused too, since its ``reinit`` would finish each run when
    the next one starts. Also an unknown mode."""
    sys.modules["wandb"].__version__ = "0.18.7"
    with pytest.raises(ValueError, match=r"wandb >= 0\.19\.10.*found 0\.18\.7"):
        loggers.wandb("proj")
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(ValueError) as e:
        loggers.wandb("proj")
    assert str(e.value) == '--wandb needs wandb: pip install "jaxil[wandb]"'
    with pytest.raises(ValueError) as e:
        loggers.WandB("proj", ["a"])
    assert str(e.value) == '--wandb needs wandb: pip install "jaxil[wandb]"'
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(__version__="0.21.0"))
    with pytest.raises(ValueError, match="online, offline, disabled"):
        loggers.wandb("proj", mode="quiet")


# ----------------------------------------------------------------------------- the flags


ENGINE_COMMANDS = [
    ["train", "bc_union", "--dataset", "d"],
    ["sweep", "bc_union", "--dataset", "d"],
    ["interactive", "dagger", "--env", "e", "--budget", "10"],
    ["irl", "reward-model", "--dataset", "d", "--out", "o"],
    ["irl", "gail", "--env", "e", "--demos", "d"],
    ["irl", "airl", "--env", "e", "--demos", "d"],
    ["irl", "ppo", "--env", "e", "--reward-model", "r"],
    ["gail", "--env", "e", "--demos", "d"],
    ["label", "d"],
    ["pipeline", "smax:3m"],
    ["teach", "--env", "e"],
]


@pytest.mark.parametrize("argv", ENGINE_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_every_engine_command_takes_the_logger_flags(fake_wandb, argv, tmp_path):
    """Every command that trains on the engine parses ``--tensorboard`` and
    the ``--wandb`` flags from the one declaration, and they become a
    TensorBoard and a W&B factory whose runs carry the mode, entity, group
    and the command's settings as config. Catches a command left without
    the flags, a second declaration drifting from the first, a flag parsed
    but not handed to the W&B factory."""
    args = build_parser().parse_args(
        [*argv, "--tensorboard", str(tmp_path / "tb"), "--wandb", "proj", "--wandb-entity", "me",
         "--wandb-group", "g", "--wandb-mode", "disabled"])
    tb, wb = make_loggers(args, tmp_path / "run")
    board = tb(["a"], "update", None)
    assert isinstance(board, loggers.TensorBoard)
    board.close()
    wb(["a", "b"], "update", None).close()
    kw = fake_wandb.inits[0]
    assert (kw["project"], kw["entity"], kw["group"], kw["mode"]) == ("proj", "me", "g",
                                                                      "disabled")
    config = fake_wandb.runs[kw["id"]].config
    assert "wandb" not in config and "func" not in config
    assert "seed" in config  # the command's own flags


def test_wandb_flags_need_wandb_and_a_known_mode(capsys):
    """``--wandb-mode`` (or entity, group) without ``--wandb PROJECT`` is
    refused in one line rather than silently logging nothing; a mode W&B
    does not know is refused by the parser."""
    parser = build_parser()
    args = parser.parse_args(["train", "bc_union", "--dataset", "d", "--wandb-mode", "offline"])
    with pytest.raises(ValueError, match="--wandb-mode applies to W&B logging; add --wandb"):
        make_loggers(args)
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["train", "bc_union", "--dataset", "d", "--wandb", "p",
                           "--wandb-mode", "quiet"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_jaxil_label_hands_its_loggers_to_the_engine(fake_wandb, tmp_path, monkeypatch):
    """``jaxil label ... --wandb P --wandb-mode disabled``: the O-MAPL fit of
    Phase 1 reaches the engine with one W&B factory, whose runs (one per
    seed, named ``run<i>-seed<s>``) open in that mode. The engine is stopped
    there: the rest is the engine's, tested above. Catches flags that parse
    but never reach the engine."""

    class Reached(Exception):
        pass

    def run(program, **kw):
        kw["loggers"][0](kw["log_names"], program.step_key, None).close()
        raise Reached

    monkeypatch.setattr(engine, "run", run)
    data = tmp_path / "mixed.npz"
    save(omapl_dataset(0, n_expert=6, n_poor=18), data)
    with pytest.raises(Reached):
        main(["label", str(data), "--out", str(tmp_path / "labelled.npz"), "--queries", "40",
              "--top-k", "6", "--label-updates", "8", "--label-seeds", "2", "--label-hidden",
              "8", "--no-progress", "--wandb", "proj", "--wandb-mode", "disabled"])
    inits = fake_wandb.inits
    assert [kw["name"] for kw in inits] == ["run0-seed0", "run1-seed1"]
    assert {kw["mode"] for kw in inits} == {"disabled"} and len(fake_wandb.finished) == 2
    assert fake_wandb.runs[inits[0]["id"]].config["oracle"] == "ground_truth"
