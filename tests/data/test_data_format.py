"""Dataset format: construction, save/load, determinism, atomicity, validation."""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile

import numpy as np
import pytest

from jaxil.envs.core import ContinuousActions, DiscreteActions, EnvSpec
from jaxil.data import (
    Dataset,
    DatasetError,
    concatenate,
    load,
    save,
    validate,
)
from jaxil.data import format as fmt

from helpers.data import FORMAT_SPEC as SPEC, assert_same, make_dataset, make_episodes
from helpers.disk import fill, small_tmpfs

CSPEC = EnvSpec("test:cont", num_agents=2, obs_dim=3, state_dim=4,
                action=ContinuousActions(dim=2, low=-1.0, high=1.0), max_steps=6)


# -- construction and transformations ------------------------------------------------


def test_from_episodes_fields_and_metadata():
    ds = make_dataset()
    assert len(ds) == 7 and ds.num_steps == 6
    assert ds.num_transitions == int(ds.length.sum())
    assert ds.obs.dtype == np.float32 and ds.actions.dtype == np.int32
    assert ds.tier.dtype == np.int8 and ds.source.dtype == np.int16 and ds.seed.dtype == np.int64
    meta = ds.metadata()
    assert meta["env_id"] == "test:disc" and meta["schema_version"] == fmt.SCHEMA_VERSION
    assert EnvSpec.from_dict(meta["spec"]) == SPEC
    assert meta["tier_names"] == ["poor"] and meta["source_names"] == ["random"]
    assert set(meta["versions"]) >= {"jax", "jaxlib", "jaxmarl", "jumanji", "jaxil"}
    assert meta["creation_args"] == {"num": 7, "seed": 0}
    assert set(meta["fields"]) == set(fmt.FIELDS)
    assert len(meta["fields"]["obs"]["sha256"]) == 64


def test_concatenate_select_shuffle_summary():
    a = make_dataset(num=4, seed=1, tier="expert", source="teacher", expert=True)
    b = make_dataset(num=5, seed=2, tier="poor", source="random")
    c = make_dataset(num=2, seed=3, tier="expert", source="random", expert=True)
    ds = concatenate([a, b, c])
    validate(ds)
    assert len(ds) == 11
    assert ds.info.tier_names == ("expert", "poor")
    assert ds.info.source_names == ("teacher", "random")
    np.testing.assert_array_equal(ds.tier, [0] * 4 + [1] * 5 + [0] * 2)
    np.testing.assert_array_equal(ds.source, [0] * 4 + [1] * 7)
    np.testing.assert_array_equal(ds.obs[4:9], b.obs)

    sub = ds.select(np.flatnonzero(ds.expert))
    assert len(sub) == 6 and sub.expert.all()
    assert_same(ds.select(ds.expert), sub)

    s1, s2 = ds.shuffle(3), ds.shuffle(3)
    assert_same(s1, s2)
    assert sorted(s1.seed.tolist()) == sorted(ds.seed.tolist())
    assert not np.array_equal(s1.seed, ds.seed)

    summ = ds.summary()
    assert summ["num_trajectories"] == 11 and summ["num_transitions"] == ds.num_transitions
    assert summ["tiers"]["expert"]["count"] == 6
    assert summ["tiers"]["expert"]["expert_fraction"] == 1.0
    ret = ds.episode_return[ds.tier == 1].astype(np.float64)
    assert summ["tiers"]["poor"]["mean_return"] == pytest.approx(ret.mean())
    assert summ["tiers"]["poor"]["std_return"] == pytest.approx(ret.std())
    assert summ["tiers"]["poor"]["win_rate"] == pytest.approx(ds.success[ds.tier == 1].mean())
    json.dumps(summ)  # JSON friendly


def test_concatenate_pads_time_axis_and_refuses_other_envs():
    a = make_dataset(num=3)
    b = Dataset.from_episodes(make_episodes(SPEC, 4, seed=9, T=4), SPEC, tier="poor",
                              source="random", seed=9)
    assert b.num_steps == 4
    ds = concatenate([a, b])
    assert ds.num_steps == 6
    validate(ds)
    np.testing.assert_array_equal(ds.obs[3:, :5], b.obs)
    assert not ds.obs[3:, 5:].any() and not ds.mask[3:, 4:].any()
    with pytest.raises(DatasetError, match="different environments"):
        concatenate([a, make_dataset(CSPEC, num=2)])


def test_dataset_is_a_pytree_that_jits():
    import jax

    ds = make_dataset(num=3)
    total = jax.jit(lambda d: d.reward.sum())(ds)
    assert np.isclose(float(total), float(ds.reward.sum()), atol=1e-5)


# -- save / load ------------------------------------------------------------------------


def test_save_load_round_trip_discrete_and_continuous(tmp_path):
    for spec in (SPEC, CSPEC):
        ds = make_dataset(spec, num=5)
        path = save(ds, tmp_path / f"{spec.env_id.replace(':', '_')}.npz")
        back = load(path)
        assert_same(ds, back)
        assert load(path, spec=spec).info.spec == spec
        # np.load reads the same file (npz layout) without jaxil.
        with np.load(path) as z:
            np.testing.assert_array_equal(z["obs"], ds.obs)


def test_same_content_gives_byte_identical_files(tmp_path):
    p1 = save(make_dataset(seed=4), tmp_path / "a.npz")
    p2 = save(make_dataset(seed=4), tmp_path / "b.npz")
    assert p1.read_bytes() == p2.read_bytes()
    p3 = save(make_dataset(seed=5), tmp_path / "c.npz")
    assert p1.read_bytes() != p3.read_bytes()
    meta = json.loads(zipfile.ZipFile(p1).read("metadata.json"))
    assert not any("time" in k or "date" in k for k in meta)


def test_interrupted_write_leaves_nothing_loadable_and_keeps_old(tmp_path, monkeypatch):
    path = tmp_path / "d.npz"
    original = fmt._write_array
    calls = {"n": 0}

    def failing(zf, member, arr):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated kill mid-write")
        original(zf, member, arr)

    monkeypatch.setattr(fmt, "_write_array", failing)
    with pytest.raises(KeyboardInterrupt):
        save(make_dataset(seed=1), path)
    assert not path.exists()
    assert os.listdir(tmp_path) == []  # the temporary file is cleaned up

    monkeypatch.setattr(fmt, "_write_array", original)
    old = make_dataset(seed=1)
    save(old, path)
    calls["n"] = 0
    monkeypatch.setattr(fmt, "_write_array", failing)
    with pytest.raises(KeyboardInterrupt):
        save(make_dataset(seed=2), path)
    assert_same(load(path), old)
    assert os.listdir(tmp_path) == ["d.npz"]


def test_partial_temporary_file_is_refused(tmp_path):
    path = save(make_dataset(), tmp_path / "d.npz")
    data = path.read_bytes()
    partial = tmp_path / ".d.npz.abc.tmp"
    partial.write_bytes(data[: len(data) // 2])  # what a kill -9 mid-write leaves
    with pytest.raises(DatasetError, match="truncated or corrupt"):
        load(partial)


# -- refusals on load -------------------------------------------------------------------


def _rewrite(path, edit_arrays=None, edit_meta=None, keep_checksums=False):
    meta, arrays = fmt.read_archive(path)
    if edit_arrays:
        edit_arrays(arrays)
    if edit_meta:
        edit_meta(meta)
    if not keep_checksums:
        meta["fields"] = fmt.describe_fields(arrays)
    fmt.write_archive(path, arrays, meta)


def test_truncated_file_is_refused(tmp_path):
    path = save(make_dataset(), tmp_path / "d.npz")
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(DatasetError, match=r"d\.npz is not a readable jaxil dataset.*truncated or corrupt"):
        load(path)


def test_checksum_mismatch_is_refused(tmp_path):
    path = save(make_dataset(), tmp_path / "d.npz")

    def flip(arrays):
        arrays["obs"][0, 0, 0, 0] += 1.0

    _rewrite(path, edit_arrays=flip, keep_checksums=True)
    with pytest.raises(DatasetError, match="field `obs` fails its SHA-256 checksum"):
        load(path)
    assert load(path, verify=False).obs.shape[0] == 7  # explicit opt-out still validates


def test_flipped_byte_on_disk_is_refused(tmp_path):
    path = save(make_dataset(), tmp_path / "d.npz")
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("reward.npy")
    raw[info.header_offset + 200] ^= 0xFF  # inside the reward member's data
    path.write_bytes(bytes(raw))
    with pytest.raises(DatasetError, match="`reward`"):
        load(path)


def test_missing_field_is_refused(tmp_path):
    path = save(make_dataset(), tmp_path / "d.npz")
    _rewrite(path, edit_arrays=lambda a: a.pop("reward"))
    with pytest.raises(DatasetError, match="missing field `reward`"):
        load(path)


def test_schema_version_mismatch_is_refused(tmp_path):
    path = save(make_dataset(), tmp_path / "d.npz")
    _rewrite(path, edit_meta=lambda m: m.update(schema_version=99))
    with pytest.raises(DatasetError, match="schema version 99 but this jaxil reads version 1"):
        load(path)


def test_wrong_shaped_field_is_refused(tmp_path):
    path = save(make_dataset(), tmp_path / "d.npz")
    _rewrite(path, edit_arrays=lambda a: a.update(reward=a["reward"][:, :-1]))
    with pytest.raises(DatasetError, match=r"field `reward` has shape \(7, 5\) but `actions` has T=6 steps"):
        load(path)


def test_illegal_action_is_refused(tmp_path):
    ds = make_dataset()
    avail = ds.avail_actions.copy()
    a = int(ds.actions[1, 0, 1])
    avail[1, 0, 1, a] = False
    avail[1, 0, 1, (a + 1) % 4] = True
    path = tmp_path / "d.npz"
    save(ds, path)
    _rewrite(path, edit_arrays=lambda arr: arr.update(avail_actions=avail))
    with pytest.raises(DatasetError, match=rf"`actions` of trajectory 1, step 0, agent 1 is {a}, which `avail_actions` forbids"):
        load(path)


def test_nan_reward_is_refused(tmp_path):
    path = save(make_dataset(), tmp_path / "d.npz")

    def nan(arrays):
        arrays["reward"][2, 0] = np.nan

    _rewrite(path, edit_arrays=nan)
    with pytest.raises(DatasetError, match=r"field `reward` is nan at trajectory 2, step 0"):
        load(path)


def test_wrong_spec_is_refused(tmp_path):
    path = save(make_dataset(), tmp_path / "d.npz")
    five = EnvSpec("smax:5m_vs_6m", num_agents=5, obs_dim=3, state_dim=4,
                   action=DiscreteActions(4, 0), max_steps=6)
    with pytest.raises(DatasetError, match=r"field `actions` has shape \(7, 6, 2\) but the environment smax:5m_vs_6m has 5 agents"):
        load(path, spec=five)
    longer = EnvSpec(**{**SPEC.__dict__, "max_steps": 50})
    with pytest.raises(DatasetError, match=r"recorded on test:disc but the given spec differs \(max_steps: 6"):
        load(path, spec=longer)


def test_not_a_dataset_and_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no dataset at"):
        load(tmp_path / "nope.npz")
    bad = tmp_path / "x.npz"
    np.savez(bad, a=np.zeros(3))
    with pytest.raises(DatasetError, match="has no metadata.json"):
        load(bad)


# -- validation rules (in memory) -------------------------------------------------------


def _broken(**edits):
    ds = make_dataset()
    arrays = ds.arrays()
    for k, fn in edits.items():
        arrays[k] = fn(arrays[k].copy())
    return ds.replace(**arrays)


def _set(idx, value):
    def f(x):
        x[idx] = value
        return x
    return f


@pytest.mark.parametrize(
    "edits, message",
    [
        (dict(reward=lambda x: x.astype(np.float64)), r"`reward` has dtype float64 but must be float32"),
        (dict(obs=_set((3, 1, 0, 2), np.inf)), r"`obs` is inf at trajectory 3, step 1, index \(0, 2\)"),
        (dict(actions=_set((0, 2, 1), 9)), r"trajectory 0, step 2, agent 1 is 9, outside \[0, 4\)"),
        (dict(mask=_set((0, 5), False)), r"`mask` of trajectory 0 is False at step 5 but length is 6"),
        (dict(done=_set((0, 1), True)), r"`done` of trajectory 0 is set at step 1 before the last valid step 5"),
        (dict(episode_return=_set(4, 123.0)), r"`episode_return` of trajectory 4 is 123.0 but its rewards sum"),
        (dict(tier=_set(2, 3)), r"`tier` of trajectory 2 is 3 but there are 1 tier_names"),
        (dict(length=_set(0, 9)), r"`length` of trajectory 0 is 9 but must be in \[1, T=6\]"),
    ],
)
def test_validation_messages(edits, message):
    with pytest.raises(DatasetError, match=message):
        validate(_broken(**edits))


def test_padding_and_both_flags_are_refused():
    ds = make_dataset()
    m = int(np.flatnonzero(ds.length < 6)[0])
    L = int(ds.length[m])
    with pytest.raises(DatasetError, match=rf"`reward` of trajectory {m} is non-zero at padding step {L}"):
        validate(_broken(reward=_set((m, L), 1.0)))
    with pytest.raises(DatasetError, match=rf"`obs` of trajectory {m} is non-zero at padding step {L + 1}"):
        validate(_broken(obs=_set((m, L + 1, 0, 0), 1.0)))
    both = int(np.flatnonzero(ds.done.any(1))[0])
    last = int(ds.length[both]) - 1
    with pytest.raises(DatasetError, match="`done` and `truncated` are both set"):
        validate(_broken(truncated=_set((both, last), True)))


def test_continuous_action_outside_box_is_refused():
    ds = make_dataset(CSPEC)
    acts = ds.actions.copy()
    acts[1, 0, 0, 1] = 1.5
    with pytest.raises(DatasetError, match=r"trajectory 1, step 0, agent 0, dim 1 is 1.5, outside the box \[-1.0, 1.0\]"):
        validate(ds.replace(actions=acts))


def test_cut_trajectories_are_accepted():
    ds = make_dataset()
    cut = ~(ds.done | ds.truncated).any(axis=1)
    assert cut.any()  # kind 2 in make_episodes: neither flag at the last step
    validate(ds)


def test_from_episodes_checks_by_default():
    ep = make_episodes(SPEC, 3)
    bad = ep.replace(reward=np.where(ep.mask, np.nan, 0.0).astype(np.float32))
    with pytest.raises(DatasetError, match="`reward` is nan"):
        Dataset.from_episodes(bad, SPEC, tier="t", source="s", seed=0)


# -- jaxil data diff -----------------------------------------------------------------


def test_data_diff_reports_arrays_and_metadata(tmp_path, capsys):
    import argparse
    import dataclasses

    from jaxil.cli import data as cli

    # Only the `jaxil data` commands: the full `jaxil` parser imports jaxmarl,
    # whose MABrax module resets sys.stdout and so escapes capsys.
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())

    def main(argv):
        args = parser.parse_args(argv)
        return args.func(args)

    a = save(make_dataset(), tmp_path / "a.npz")
    b = save(make_dataset(), tmp_path / "b.npz")
    assert main(["data", "diff", str(a), str(b)]) == 0
    assert "byte-identical" in capsys.readouterr().out

    ds = make_dataset()
    obs = ds.obs.copy()
    obs[0, 1, 1, 2] += 0.25
    info = dataclasses.replace(ds.info, creation_args_json=fmt.canonical_json(
        {"num": 7, "seed": 0, "note": "x" * 200}))
    c = save(ds.replace(obs=obs, info=info), tmp_path / "c.npz")
    assert main(["data", "diff", str(a), str(c)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{a} and {c} differ"
    assert "  obs: 1 of 294 elements differ, max |a - b| = 0.25" in out
    assert not any(line.startswith("  reward:") for line in out)  # identical arrays are not listed
    i = out.index("  creation_args.note:")
    assert out[i + 1] == "    A: null"
    assert out[i + 2] == "    B: " + json.dumps("x" * 200)[:77] + "..."
    assert cli._short_pair("p" * 100 + "old tail", "p" * 100 + "new tail") == (
        "..." + "p" * 20 + 'old tail"', "..." + "p" * 20 + 'new tail"')
    assert not any("fields." in line for line in out)  # the checksums are the arrays' business

    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    for other in ("bad.npz", "missing.npz"):
        assert main(["data", "diff", str(a), str(tmp_path / other)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("jaxil data diff: error: ")


def test_a_dataset_records_the_physics_packages_and_what_xla_compiled_for(tmp_path, monkeypatch):
    """The same recipe and packages on two CPUs can write different bytes:
    XLA compiles for the host's vector instructions, and a wider set changes
    the last bits that a robot's contacts amplify. So a dataset records the
    MuJoCo packages and the compile target, and `jaxil data diff` names a
    changed target. Bugs caught: the target left out of `versions` (the diff
    cannot say why two builds differ), an `XLA_FLAGS` cap on the instruction
    set not recorded, the CPU's flags read as the narrowest set."""
    from jaxil.cli.data import diff_files
    from jaxil.runs.measure import compute_target, cpu_model, vector_isa

    monkeypatch.delenv("XLA_FLAGS", raising=False)
    ds = make_dataset()
    versions = dict(ds.info.versions)
    assert {"mujoco", "mujoco-mjx"} <= set(versions)
    assert versions[fmt.TARGET_KEY] == compute_target()
    assert versions[fmt.TARGET_KEY].startswith(f"cpu: {cpu_model()} (")
    assert vector_isa("fpu sse4_2 avx avx2 fma avx512f avx512dq") == "avx512f"
    assert vector_isa("fpu sse4_2 avx fma avx2") == "avx2"
    assert vector_isa("fp asimd evtstrm sve") == "sve"
    assert vector_isa("fpu vme") is None
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 --xla_cpu_max_isa=AVX2")
    assert compute_target().endswith(", capped at AVX2)")
    assert dict(make_dataset().info.versions)[fmt.TARGET_KEY] == compute_target()

    a = save(ds, tmp_path / "a.npz")
    other = dict(ds.info.versions, **{fmt.TARGET_KEY: "cpu: another model (avx2)"})
    b = save(ds.replace(info=dataclasses.replace(ds.info, versions=tuple(sorted(other.items())))),
             tmp_path / "b.npz")
    d = diff_files(a, b)
    assert not d["identical"] and d["arrays"] == {}
    assert d["metadata"] == {f"versions.{fmt.TARGET_KEY}": (versions[fmt.TARGET_KEY],
                                                           "cpu: another model (avx2)")}


def test_a_full_disk_names_the_file_and_keeps_the_old_one(tmp_path):
    """A dataset written to a full disk: an ENOSPC OSError that names the
    file being written, the earlier file at that path intact and no
    temporary left behind. Bug caught: "[Errno 28] No space left on device"
    without a path (the write into the zip stream names no file)."""
    import errno

    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        path = disk / "d.npz"
        small = make_dataset(num=2)
        fmt.save(small, path)
        before = path.read_bytes()
        fill(disk)
        with pytest.raises(OSError) as e:
            fmt.save(make_dataset(num=400), path)
        assert e.value.errno == errno.ENOSPC and e.value.filename == str(path), e.value
        assert path.read_bytes() == before
        assert sorted(p.name for p in disk.iterdir()) == ["d.npz", "filler"]


def test_size_bound_covers_the_written_file(tmp_path):
    """The bound ``data build`` checks free space against is at least the
    file a dataset of that many full-length trajectories becomes. Bug
    caught: a bound that forgets a field and lets a build fill the disk."""
    ds = make_dataset(num=6)
    path = fmt.save(ds, tmp_path / "d.npz")
    T = ds.actions.shape[1]
    bound = fmt.size_bound(ds.info.spec, 6, max_steps=T)
    assert path.stat().st_size <= bound + 64 * 1024  # + metadata and zip headers
    assert bound >= sum(np.asarray(v).nbytes for v in ds.arrays().values())
