"""Dataset recipes, the policy zoo and ``jaxil data``: determinism, metadata, CLI.

Everything runs on a tiny version of ``mpe-simple_spread_continuous/
misodice-200e-1000p`` (4 expert + 8 poor episodes of 10 steps, scripted
expert). The expert, medium and poor tiers share one compiled program, and
the zoo is cached per process, so the whole file compiles one collector.
"""

from __future__ import annotations

import json
import zipfile

import jax
import numpy as np
import pytest

from jaxil import envs
from jaxil.cli.main import main
from jaxil.data import load
from jaxil.collect import recipes as rc
from jaxil.collect.zoo import ExpertUnavailable, episode_keys, make_zoo, measure_tiers

RECIPE = "mpe-simple_spread_continuous/misodice-200e-1000p"
ENV_KW = {"max_steps": 10}
COUNTS = {"expert": 4, "poor": 8}
CHUNK = 8
TINY = dict(counts=COUNTS, env_kwargs=ENV_KW, discover_teachers=False, chunk_size=CHUNK,
            measure_episodes=0, progress=False)
CLI_TINY = ["--n-expert", "4", "--n-poor", "8", "--env-kwarg", "max_steps=10", "--no-teacher",
            "--chunk-size", str(CHUNK), "--measure-episodes", "0", "--quiet"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("recipes")
    paths = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        paths[name] = d / f"{name}.npz"
        rc.build(RECIPE, seed, paths[name], **TINY)
    return paths


def test_same_seed_identical_different_seed_differs(built):
    a, b, c = (built[k].read_bytes() for k in "abc")
    assert a == b
    assert a != c
    da, dc = load(built["a"]), load(built["c"])
    assert not np.array_equal(da.seed, dc.seed)
    assert not np.array_equal(np.sort(da.episode_return), np.sort(dc.episode_return))


def test_metadata(built):
    ds = load(built["a"])
    assert len(ds) == 12
    assert ds.info.recipe == RECIPE
    assert ds.spec.max_steps == envs.make("mpe:simple_spread_continuous", **ENV_KW).spec.max_steps
    tiers = np.array(ds.info.tier_names)[ds.tier]
    assert (tiers == "expert").sum() == 4 and (tiers == "poor").sum() == 8
    np.testing.assert_array_equal(ds.expert, tiers == "expert")
    sources = np.array(ds.info.source_names)[ds.source]
    assert set(sources[tiers == "expert"]) == {"spread-assign-pd"}
    assert set(sources[tiers == "poor"]) == {"spread-assign-pd+eps0.9"}
    assert len(set(ds.seed.tolist())) == 12 and (ds.seed >= 0).all()
    assert not (tiers[:4] == "expert").all()  # shuffled
    args = ds.info.creation_args
    assert args["seed"] == 0 and args["counts"] == COUNTS and args["env_kwargs"] == ENV_KW
    assert args["zoo"]["expert"]["kind"] == "scripted"
    assert args["zoo"]["poor"]["epsilon"] == 0.9


def test_episode_reproducible_from_its_seed(built):
    """A trajectory is one run_episodes call keyed by PRNGKey(its seed)."""
    ds = load(built["a"])
    i = int(np.flatnonzero(ds.expert)[0])
    zoo = make_zoo("mpe:simple_spread_continuous", env_kwargs=ENV_KW, discover=False)
    np.testing.assert_array_equal(episode_keys([ds.seed[i]])[0],
                                  jax.random.PRNGKey(int(ds.seed[i])))
    ep = zoo.collect("expert", [int(ds.seed[i])], CHUNK)
    np.testing.assert_allclose(ep.actions[0], ds.actions[i], atol=1e-6)
    np.testing.assert_allclose(ep.episode_return[0], ds.episode_return[i], rtol=1e-5)


def test_measure_tiers(tmp_path):
    zoo = make_zoo("mpe:simple_spread_continuous", env_kwargs=ENV_KW, discover=False)
    out = tmp_path / "m.json"
    m = measure_tiers("mpe:simple_spread_continuous", tiers=("expert", "medium", "poor"),
                      num_episodes=16, chunk_size=CHUNK, zoo=zoo, out_path=out)
    t = m["tiers"]
    assert t["expert"]["mean_return"] > t["medium"]["mean_return"] > t["poor"]["mean_return"]
    assert t["expert"]["episodes"] == 16 and t["expert"]["win_rate"] is None
    assert json.loads(out.read_text()) == m


def test_cli_build_info_validate(tmp_path, built, capsys):
    out = tmp_path / "cli.npz"
    assert main(["data", "build", RECIPE, "--seed", "0", "--out", str(out), *CLI_TINY]) == 0
    assert out.read_bytes() == built["a"].read_bytes()  # the CLI builds what the API builds
    assert rc.sidecar_path(out).exists()
    capsys.readouterr()

    assert main(["data", "info", str(out)]) == 0
    text = capsys.readouterr().out
    assert RECIPE in text and "mpe:simple_spread_continuous" in text and "MB" in text
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] in ("expert", "poor") and "±" in parts:
            rows[parts[0]] = float(parts[parts.index("±") - 1])
    assert rows["expert"] > rows["poor"], text

    assert main(["data", "validate", str(out)]) == 0
    # Corrupt one byte inside the observations: the checksum catches it.
    raw = bytearray(out.read_bytes())
    with zipfile.ZipFile(out) as zf:
        info = zf.getinfo("obs.npy")
    raw[info.header_offset + 200 + info.file_size // 2] ^= 0xFF
    bad = tmp_path / "bad.npz"
    bad.write_bytes(bytes(raw))
    capsys.readouterr()
    assert main(["data", "validate", str(bad)]) == 1
    assert "checksum" in capsys.readouterr().err
    assert main(["data", "validate", str(tmp_path / "missing.npz")]) == 1


def test_cli_list_and_unknown_recipe(capsys):
    assert main(["data", "list"]) == 0
    text = capsys.readouterr().out
    for env in ("smax-3m", "smax-2s3z", "smax-5m_vs_6m", "smax-smacv2_5_units",
                "mpe-simple_spread_continuous", "jumanji-LevelBasedForaging-v0"):
        for kind in ("misodice-200e-1000p", "expert", "medium", "poor", "random", "replay"):
            assert f"{env}/{kind}" in text
    assert main(["data", "build", "smax-3m/misodise-200e-1000p"]) == 1
    err = capsys.readouterr().err
    assert "Did you mean" in err and "smax-3m/misodice-200e-1000p" in err


def test_recipe_names():
    r = rc.get_recipe("smax:3m/misodice-200e-1000p")
    assert r.name == "smax-3m/misodice-200e-1000p" and r.counts == (("expert", 200), ("poor", 1000))
    assert dict(rc.get_recipe("smax-3m/replay").counts) == {t: 300 for t in
                                                           ("expert", "medium", "poor", "random")}
    mix = rc.get_recipe("smax-6h_vs_8z/mix-50e-10m-400p")
    assert mix.env_id == "smax:6h_vs_8z" and dict(mix.counts) == {"expert": 50, "medium": 10,
                                                                  "poor": 400}
    assert r.resolve_counts(0.01) == {"expert": 2, "poor": 10}
    assert r.resolve_counts(1.0, {"poor": 0, "random": 3}) == {"expert": 200, "random": 3}
    assert r.default_path(0) == rc.DEFAULT_DATA_DIR / "smax-3m-misodice-200e-1000p.npz"
    assert r.default_path(2, {"expert": 4, "poor": 8}).name == (
        "smax-3m-misodice-200e-1000p-4e-8p-seed2.npz")
    for bad in ("smax-3m", "smax-3m/nope", "smax-99m/expert", "smax-3m/mix-5e-6e"):
        with pytest.raises(KeyError, match="jaxil data list"):
            rc.get_recipe(bad)


def test_env_without_expert_says_how_to_get_one():
    with pytest.raises(ExpertUnavailable, match="jaxil teach jumanji:Connector-v3"):
        make_zoo("jumanji:Connector-v3", discover=False)


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["jumanji:LevelBasedForaging-v0", "mpe:simple_spread",
                                    "smax:3m"])
def test_scripted_experts_beat_random(env_id):
    m = measure_tiers(env_id, tiers=("expert", "random"), num_episodes=64, discover=False)
    t = m["tiers"]
    assert t["expert"]["mean_return"] > t["random"]["mean_return"] + 0.5 * abs(
        t["random"]["mean_return"])
    if t["expert"]["win_rate"] is not None:  # SMAX's heuristic wins ~40 % of 3m
        assert t["expert"]["win_rate"] > t["random"]["win_rate"] + 0.25


def test_dataset_path_resolves_files_and_recipes(tmp_path):
    from pathlib import Path

    from jaxil.collect.recipes import get_recipe
    from jaxil.collect.recipes import dataset_path

    f = tmp_path / "mine.npz"
    f.write_bytes(b"")
    assert dataset_path(str(f)) == f
    assert dataset_path("smax-3m/misodice-200e-1000p") == Path("runs/data/smax-3m-misodice-200e-1000p.npz")
    assert dataset_path("smax-3m/misodice-200e-1000p", 2) == get_recipe("smax-3m/misodice-200e-1000p").default_path(2)
    assert dataset_path("smax-3m/misodice-200e-1000p", 2).name.endswith("-seed2.npz")
    with pytest.raises(FileNotFoundError, match="not a file"):
        dataset_path("smax-3m/no-such-recipe")
