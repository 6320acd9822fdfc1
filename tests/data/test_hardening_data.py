"""Runs that cannot lie: dataset metadata checks, killed atomic writes, a quiet
JaxMARL import. Each test names the bug it would catch."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from jaxil.runs import io_atomic
from jaxil.data import DatasetError, load, save
from jaxil.data import format as fmt
from jaxil.data.validate import METADATA_KEYS
from helpers.data import FORMAT_SPEC as SPEC, make_dataset

ROOT = Path(__file__).resolve().parents[2]

# A registered id on the toy spec: the registry check is membership only.
SMAX_SPEC = dataclasses.replace(SPEC, env_id="smax:3m")


def _rewrite(path: Path, edit) -> Path:
    """Re-write the dataset at ``path`` with ``edit(metadata)`` applied (arrays
    kept)."""
    meta, arrays = fmt.read_archive(path)
    edit(meta)
    fmt.write_archive(path, arrays, meta)
    return path


def _data_cli(argv: list[str]) -> int:
    from jaxil.cli import data as cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


# -- 1. `jaxil data validate` and the metadata block -----------------------------------


@pytest.mark.parametrize("key", sorted(METADATA_KEYS))
def test_metadata_without_a_key_is_refused(tmp_path, key):
    """Bug: load read only `spec`/`tier_names`/`source_names` and defaulted the
    rest, so a file stripped of env_id, versions, recipe, creation_args or the
    counts validated as OK and its provenance silently became empty."""
    path = _rewrite(save(make_dataset(), tmp_path / "d.npz"), lambda m: m.pop(key))
    with pytest.raises(DatasetError, match=rf"d\.npz.*`{key}`") as e:
        load(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("key,value", [("num_trajectories", "7"), ("num_steps", True),
                                       ("versions", ["jax"]), ("env_id", 3)])
def test_metadata_of_the_wrong_type_is_refused(tmp_path, key, value):
    """Bug: a key present with a wrong JSON type (a string count, a list of
    versions) passed, or crashed later with a TypeError far from the file."""
    path = _rewrite(save(make_dataset(), tmp_path / "d.npz"), lambda m: m.update({key: value}))
    with pytest.raises(DatasetError, match=rf"d\.npz: metadata\.json `{key}`"):
        load(path)


@pytest.mark.parametrize("key,delta", [("num_trajectories", 1), ("num_trajectories", -1),
                                       ("num_steps", 2)])
def test_counts_that_disagree_with_the_arrays_are_refused(tmp_path, key, delta):
    """Bug: num_trajectories / num_steps were written but never compared with
    the arrays, so edited or hand-assembled metadata lied about the data."""
    path = _rewrite(save(make_dataset(), tmp_path / "d.npz"),
                    lambda m: m.update({key: m[key] + delta}))
    with pytest.raises(DatasetError, match=rf"d\.npz: metadata\.json `{key}` .* set `{key}` to"):
        load(path)


def test_env_id_that_disagrees_with_the_spec_is_refused(tmp_path):
    """Bug: the top-level env_id (what `jaxil data list`/info show) could name
    another environment than the spec the data is checked against."""
    path = _rewrite(save(make_dataset(), tmp_path / "d.npz"),
                    lambda m: m.update(env_id="smax:3m"))
    with pytest.raises(DatasetError, match=r"d\.npz: metadata\.json `env_id` is 'smax:3m' but "
                                           r"`spec\.env_id` is 'test:disc'"):
        load(path)


def test_validate_command_refuses_an_unknown_env_id(tmp_path, capsys):
    """Bug: `jaxil data validate` said OK for a dataset of an environment that
    does not exist (a typo'd id), which then failed only when a run tried to
    evaluate on it."""
    typo = dataclasses.replace(SPEC, env_id="smax:3mm")
    bad = save(make_dataset(typo), tmp_path / "typo.npz")
    assert _data_cli(["data", "validate", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"INVALID {bad}: metadata.json `env_id` 'smax:3mm' is not a registered")
    assert "smax:3m" in err.split("did you mean", 1)[1] and "\n" not in err

    good = save(make_dataset(SMAX_SPEC), tmp_path / "good.npz")
    assert _data_cli(["data", "validate", str(good)]) == 0
    assert capsys.readouterr().out.startswith(f"OK {good}")
    # load itself stays usable for test and out-of-tree environments
    assert load(tmp_path / "typo.npz").spec.env_id == "smax:3mm"


# -- 2. atomic writes after a killed write ---------------------------------------------


def _hidden(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("leftover", [".d.npz.tmp", ".d.npz.k3j5h2g1.tmp"])
def test_save_removes_what_a_killed_save_left(tmp_path, leftover):
    """Bug: a killed `jaxil data build` left a hidden temp file up to the full
    dataset size (mkstemp names are random, so no later write ever reused or
    removed it); repeated kills filled the disk."""
    (tmp_path / leftover).write_bytes(os.urandom(1 << 16))
    ds = make_dataset()
    save(ds, tmp_path / "d.npz")
    assert _hidden(tmp_path) == []
    assert load(tmp_path / "d.npz").num_trajectories == ds.num_trajectories


def test_dead_writers_temps_go_live_writers_stay(tmp_path):
    """Bug: cleaning up by name alone would delete the temp file of another
    process writing the same path right now (its os.replace then fails);
    cleaning up nothing keeps every killed writer's temp forever."""
    target = tmp_path / "metrics.jsonl"
    pid = _dead_pid()
    dead = [target.with_name(f".{target.name}.{io_atomic._HOST}-{pid}-ab12cd34.tmp"),
            target.with_name(f".{target.name}.{pid}.tmp")]  # a pid-only name of older code
    live = [io_atomic.temp_sibling(target),  # this process: alive
            target.with_name(f".{target.name}.{os.getpid()}.tmp")]
    for p in dead + live:
        p.write_text("junk")
    io_atomic.atomic_write_text(target, "row\n")
    assert target.read_text() == "row\n"
    assert not any(p.exists() for p in dead) and all(p.exists() for p in live)


def test_temp_names_are_unique_per_process_and_call(tmp_path):
    """Bug: a fixed `.name.tmp` is shared by two writers of one path (two
    processes, or threads), which then interleave bytes or replace each
    other's half-written file."""
    a, b = io_atomic.temp_sibling(tmp_path / "x"), io_atomic.temp_sibling(tmp_path / "x")
    assert a != b and f"-{os.getpid()}-" in a.name and a.name.startswith(".x.")
    errors = []

    def write(i):
        try:
            for _ in range(20):
                io_atomic.atomic_write_text(tmp_path / "x", f"{i}\n" * 1000, fsync=False)
        except Exception as e:  # noqa: BLE001 - any failure is the bug
            errors.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set((tmp_path / "x").read_text().splitlines())) == 1  # one writer's whole file
    assert _hidden(tmp_path) == []


def test_failed_write_keeps_the_old_file_and_no_temp(tmp_path):
    """Bug: an exception mid-write left the temp file behind or a half file at
    the destination."""
    target = tmp_path / "r.json"
    io_atomic.atomic_write_text(target, "old")
    with pytest.raises(RuntimeError):
        with io_atomic.atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert target.read_text() == "old" and _hidden(tmp_path) == []


def test_directory_swap_killed_between_renames_is_repaired(tmp_path):
    """Bug: a vault export or teacher ship killed between moving the old
    directory aside and moving the new one in left no directory at the path
    and the previous version hidden under a temp name, forever."""
    target = tmp_path / "vault"
    pid = _dead_pid()
    aside = tmp_path / f".vault.{io_atomic._HOST}-{pid}-0a0b0c0d.old"
    aside.mkdir()
    (aside / "v").write_text("previous")
    half = tmp_path / f".vault.{io_atomic._HOST}-{pid}-0e0f0a0b.tmp"
    half.mkdir()
    (half / "v").write_bytes(os.urandom(1 << 12))
    io_atomic.clear_stale(target)
    assert (target / "v").read_text() == "previous" and _hidden(tmp_path) == []

    with io_atomic.atomic_dir(target) as tmp:
        tmp.mkdir()
        (tmp / "v").write_text("new")
    assert (target / "v").read_text() == "new" and _hidden(tmp_path) == []


def test_result_cache_and_teacher_json_use_the_shared_helper(tmp_path):
    """Bug: a copy of the atomic-write code (ResultCache, teacher.json) kept a
    fixed temp name and no cleanup while the others were fixed."""
    from jaxil.runs.result_cache import ResultCache
    from jaxil.teachers.io import write_json

    for name in ("cache.json", "teacher.json"):
        (tmp_path / f".{name}.{io_atomic._HOST}-{_dead_pid()}-1234abcd.tmp").write_text("junk")
    ResultCache(tmp_path / "cache.json", {"a": 1}, {"x": ("a",)}).put("x1", 2)
    write_json(tmp_path / "teacher.json", {"env_id": "smax:3m", "n": np.int64(3)})
    assert _hidden(tmp_path) == []
    assert '"n": 3' in (tmp_path / "teacher.json").read_text()


# -- 3. the JaxMARL banner ---------------------------------------------------------------


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow  # a subprocess importing everything; test_packaging's import test checks the same stdout by default
def test_importing_the_adapters_prints_nothing_on_stdout():
    """Bug: JaxMARL prints "Importing submoduled environments..." on import, so
    every jaxil command's stdout (and --json output piped onward) began with
    two lines of noise."""
    r = _run("import envs.smax, envs.mpe; print('ok')")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ok\n"


@pytest.mark.slow  # default-suite time; run with -m slow (a subprocess importing everything)
def test_quiet_import_restores_redirected_streams_and_keeps_other_output():
    """Bug: silencing by swallowing stdout would also hide real output; and
    JaxMARL's mabrax module resets sys.stdout/sys.stderr to the process's
    originals, breaking any redirection (pytest's capsys, a log file) for the
    rest of the run."""
    r = _run(
        "import io, sys, contextlib\n"
        "out, err = io.StringIO(), io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        "    import envs.smax\n"
        "    assert sys.stdout is out and sys.stderr is err\n"
        "    print('real output')\n"
        "assert out.getvalue() == 'real output\\n', repr(out.getvalue())\n"
        "from envs._jaxmarl import _without_banner\n"
        "assert _without_banner('Importing submoduled environments...\\nkeep\\n') == 'keep\\n'\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""


@pytest.mark.slow  # default-suite time (a subprocess importing everything); run with -m slow
def test_jaxil_help_has_no_banner():
    """Bug: the banner reached `jaxil --help` (the full parser imports the
    environment adapters)."""
    r = _run("from jaxil.cli.main import main; main(['--help'])")
    assert "ubmoduled" not in r.stdout and r.stdout.startswith("usage: jaxil")
