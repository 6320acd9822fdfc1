"""OG-MARL / flashbax vault interchange."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import warnings

import numpy as np
import pytest

from jaxil.envs.core import ContinuousActions, DiscreteActions, EnvSpec
from jaxil.envs.rollout import Episodes
from jaxil.data import Dataset, DatasetError, export_vault, import_vault, load, save
from jaxil.data import vault as vault_mod

from helpers.data import assert_same

try:
    import flashbax.vault  # noqa: F401

    HAVE_FLASHBAX = True
except ImportError:  # the optional extra jaxil[vault]
    HAVE_FLASHBAX = False

needs_flashbax = pytest.mark.skipif(not HAVE_FLASHBAX, reason="flashbax not installed (jaxil[vault])")

SPEC = EnvSpec("test:disc", num_agents=3, obs_dim=4, state_dim=5,
               action=DiscreteActions(num_actions=6, noop_action=0), max_steps=8, has_win=True)
CSPEC = EnvSpec("test:cont", num_agents=2, obs_dim=4, state_dim=5,
                action=ContinuousActions(dim=2, low=-1.0, high=1.0), max_steps=8)


def make_dataset(spec: EnvSpec = SPEC, num: int = 6, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    n, T = spec.num_agents, spec.max_steps
    length = rng.integers(1, T + 1, num).astype(np.int32)
    length[:3] = [T, 1, T][:num]
    steps = np.arange(T)[None] < length[:, None]
    entries = np.arange(T + 1)[None] <= length[:, None]
    obs = rng.normal(size=(num, T + 1, n, spec.obs_dim)).astype(np.float32) * entries[..., None, None]
    state = rng.normal(size=(num, T + 1, spec.state_dim)).astype(np.float32) * entries[..., None]
    if spec.discrete:
        avail = (rng.random((num, T + 1, n, spec.num_actions)) < 0.5) & entries[..., None, None]
        avail[..., 0] |= entries[..., None]
        actions = np.zeros((num, T, n), np.int32)  # action 0 is always legal
    else:
        avail = np.zeros((num, T + 1, n, 0), bool)
        actions = rng.uniform(-1, 1, (num, T, n, spec.action.dim)).astype(np.float32) * steps[..., None, None]
    reward = rng.normal(size=(num, T)).astype(np.float32) * steps
    last = np.arange(T)[None] == (length[:, None] - 1)
    kind = np.arange(num) % 3  # terminal, truncated, cut
    ep = Episodes(obs=obs, global_state=state, avail_actions=avail, actions=actions, reward=reward,
                  done=last & (kind == 0)[:, None], truncated=last & (kind == 1)[:, None], mask=steps,
                  episode_return=reward.sum(1), length=length, won=last.any(1) & (kind == 0))
    return Dataset.from_episodes(ep, spec, tier="poor", source="random", seed=seed + 7,
                                 expert=np.arange(num) % 2 == 0, recipe="unit")


@pytest.mark.parametrize("spec", [SPEC, CSPEC], ids=["discrete", "continuous"])
def test_round_trip_tensorstore_backend(tmp_path, spec):
    ds = make_dataset(spec)
    d = export_vault(ds, tmp_path, "unit.vlt", "Mixed", backend="tensorstore")
    assert d == tmp_path / "unit.vlt" / "Mixed"
    assert_same(ds, import_vault(tmp_path / "unit.vlt", "Mixed", backend="tensorstore"))
    assert_same(ds, import_vault(d, backend="tensorstore"))  # the uid directory itself
    assert sorted(os.listdir(tmp_path / "unit.vlt")) == ["Mixed"]  # no temporary left


@needs_flashbax
def test_layout_is_what_flashbax_and_og_marl_read(tmp_path):
    from flashbax.vault import Vault

    ds = make_dataset()
    export_vault(ds, tmp_path, "unit.vlt", "Good", backend="tensorstore")
    v = Vault(vault_name="unit.vlt", rel_dir=str(tmp_path), vault_uid="Good")
    exp = v.read().experience
    K, N = ds.num_transitions, SPEC.num_agents
    assert set(exp) == {"observations", "actions", "rewards", "terminals", "truncations", "infos"}
    assert set(exp["infos"]) == {"legals", "state"}
    assert exp["observations"].shape == (1, K, N, SPEC.obs_dim)
    assert exp["actions"].shape == (1, K, N)
    assert exp["rewards"].shape == exp["terminals"].shape == exp["truncations"].shape == (1, K, N)
    assert exp["infos"]["legals"].shape == (1, K, N, SPEC.num_actions)
    assert exp["infos"]["state"].shape == (1, K, SPEC.state_dim)
    ends = np.asarray(exp["terminals"] + exp["truncations"])[0, :, 0]
    assert ends.sum() == len(ds)  # every trajectory, cut ones included, ends once
    np.testing.assert_array_equal(np.flatnonzero(ends), np.cumsum(ds.length) - 1)


@needs_flashbax
@pytest.mark.parametrize("write, read", [("flashbax", "tensorstore"), ("tensorstore", "flashbax"),
                                         ("flashbax", "flashbax")])
def test_backends_read_each_other(tmp_path, write, read):
    ds = make_dataset(seed=3)
    export_vault(ds, tmp_path, "x.vlt", "u", backend=write)
    assert_same(ds, import_vault(tmp_path / "x.vlt", "u", backend=read))


def _og_marl_experience(rng, lengths, n=2, o=3, s=4, a=5, tail=0):
    """A vault as OG-MARL writes it: float32 flags and legals, per-agent rewards,
    no final observations; ``tail`` steps of an unfinished episode at the end."""
    K = sum(lengths) + tail
    terminals = np.zeros((1, K, n), np.float32)
    truncations = np.zeros((1, K, n), np.float32)
    for i, stop in enumerate(np.cumsum(lengths) - 1):
        (terminals if i % 2 == 0 else truncations)[0, stop] = 1.0
    legals = np.ones((1, K, n, a), np.float32)
    legals[..., 3] = 0.0
    team = rng.normal(size=(1, K, 1)).astype(np.float32)
    return {
        "observations": rng.normal(size=(1, K, n, o)).astype(np.float32),
        "actions": rng.integers(0, 3, (1, K, n)).astype(np.int32),
        "rewards": np.repeat(team, n, axis=2),
        "terminals": terminals,
        "truncations": truncations,
        "infos": {"legals": legals, "state": rng.normal(size=(1, K, s)).astype(np.float32)},
    }


def test_import_plain_og_marl_vault(tmp_path):
    rng = np.random.default_rng(0)
    lengths = [3, 5, 2]
    exp = _og_marl_experience(rng, lengths, tail=2)
    vdir = tmp_path / "smac_v1" / "3m.vlt" / "Good"
    vault_mod._write_experience(vdir, exp, {}, "tensorstore")
    ds = import_vault(tmp_path / "smac_v1" / "3m.vlt", backend="tensorstore")
    assert len(ds) == 4
    np.testing.assert_array_equal(ds.length, [3, 5, 2, 2])
    assert ds.spec.env_id == "vault:3m.vlt/Good" and ds.spec.num_agents == 2
    assert ds.spec.num_actions == 5 and ds.spec.max_steps == 5
    assert ds.done[0, 2] and ds.truncated[1, 4] and ds.done[2, 1]
    assert not ds.done[3].any() and not ds.truncated[3].any()  # unfinished tail: cut
    assert ds.info.source_names == ("3m.vlt/Good",) and ds.info.tier_names == ("vault",)
    assert (ds.seed == -1).all()
    obs = exp["observations"][0]
    np.testing.assert_array_equal(ds.obs[1, :5], obs[3:8])
    np.testing.assert_array_equal(ds.obs[1, 5], obs[7])  # final observation: repeated
    np.testing.assert_array_equal(ds.global_state[2, :2], exp["infos"]["state"][0, 8:10])
    np.testing.assert_array_equal(ds.reward[1, :5], exp["rewards"][0, 3:8, 0])
    assert not ds.avail_actions[..., 3].any()
    np.testing.assert_allclose(ds.episode_return, [exp["rewards"][0, a:b, 0].sum() for a, b in
                                                   [(0, 3), (3, 8), (8, 10), (10, 12)]], rtol=1e-5)
    spec = EnvSpec("smax:3m_like", num_agents=2, obs_dim=3, state_dim=4,
                   action=DiscreteActions(5, 0), max_steps=10)
    ds2 = import_vault(tmp_path / "smac_v1" / "3m.vlt", "Good", spec=spec, tier="good", expert=True,
                       backend="tensorstore")
    assert ds2.num_steps == 10 and ds2.spec == spec and ds2.expert.all()
    assert_same(ds2, load(save(ds2, tmp_path / "imported.npz"), spec=spec))


def test_refusals(tmp_path):
    rng = np.random.default_rng(1)
    exp = _og_marl_experience(rng, [3, 3])
    exp["terminals"][0, 2, 1] = 0.0  # agent 1 does not end with agent 0
    vault_mod._write_experience(tmp_path / "a.vlt" / "u", exp, {}, "tensorstore")
    with pytest.raises(DatasetError, match=r"`terminals` at time step 2 is set for agents \[0\] but not"):
        import_vault(tmp_path / "a.vlt", "u", backend="tensorstore")

    with pytest.raises(FileNotFoundError, match="no OG-MARL vault"):
        import_vault(tmp_path / "missing.vlt", backend="tensorstore")
    ds = make_dataset(num=3)
    export_vault(ds, tmp_path, "b.vlt", "one", backend="tensorstore")
    export_vault(ds, tmp_path, "b.vlt", "two", backend="tensorstore")
    with pytest.raises(ValueError, match=r"several vaults \['one', 'two'\]; pass vault_uid"):
        import_vault(tmp_path / "b.vlt", backend="tensorstore")
    with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
        export_vault(ds, tmp_path, "b.vlt", "one", backend="tensorstore")
    other = make_dataset(num=4, seed=5)
    export_vault(other, tmp_path, "b.vlt", "one", overwrite=True, backend="tensorstore")
    assert_same(other, import_vault(tmp_path / "b.vlt", "one", backend="tensorstore"))

    wrong = EnvSpec(**{**SPEC.__dict__, "num_agents": 5})
    with pytest.raises(DatasetError, match="has shape .* but the environment test:disc has 5 agents"):
        import_vault(tmp_path / "b.vlt", "one", spec=wrong, backend="tensorstore")

    meta_path = tmp_path / "b.vlt" / "two" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["version"] = 2.0
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match="layout version 2.0"):
        import_vault(tmp_path / "b.vlt", "two", backend="tensorstore")


def test_interrupted_export_leaves_no_vault(tmp_path, monkeypatch):
    ds = make_dataset(num=3)
    export_vault(ds, tmp_path, "c.vlt", "keep", backend="tensorstore")

    def boom(*args, **kwargs):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(vault_mod, "write_archive", boom)
    with pytest.raises(KeyboardInterrupt):
        export_vault(ds, tmp_path, "c.vlt", "new", backend="tensorstore")
    with pytest.raises(KeyboardInterrupt):
        export_vault(make_dataset(num=2, seed=9), tmp_path, "c.vlt", "keep", overwrite=True,
                     backend="tensorstore")
    assert sorted(os.listdir(tmp_path / "c.vlt")) == ["keep"]
    assert_same(ds, import_vault(tmp_path / "c.vlt", "keep", backend="tensorstore"))


def test_sidecar_that_no_longer_matches_is_ignored(tmp_path):
    ds = make_dataset(num=4)
    d = export_vault(ds, tmp_path, "d.vlt", "u", backend="tensorstore")
    other = make_dataset(num=5, seed=2)
    export_vault(other, tmp_path, "e.vlt", "u", backend="tensorstore")
    os.replace(tmp_path / "e.vlt" / "u" / vault_mod.SIDECAR_FILE, d / vault_mod.SIDECAR_FILE)
    with pytest.warns(UserWarning, match="episode boundaries do not match"):
        plain = import_vault(d, backend="tensorstore")
    assert len(plain) == len(ds)
    np.testing.assert_array_equal(plain.length, ds.length)
    np.testing.assert_array_equal(plain.obs[:, :-1] * plain.mask[..., None, None], ds.obs[:, :-1] * ds.mask[..., None, None])


def test_missing_backends_give_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashbax", None)
    monkeypatch.setitem(sys.modules, "flashbax.vault", None)
    with pytest.raises(ImportError, match=r"pip install 'jaxil\[vault\]'"):
        vault_mod._resolve_backend("flashbax")
    assert vault_mod._resolve_backend("auto") == "tensorstore"
    monkeypatch.setitem(sys.modules, "tensorstore", None)
    with pytest.raises(ImportError, match=r"pip install 'jaxil\[vault\]'"):
        vault_mod._resolve_backend("auto")


@pytest.mark.slow  # ~20 s of jaxmarl import and rollout compilation on 2 cores
def test_round_trip_of_generated_episodes(tmp_path):
    """Real rollouts: random policy on mpe:simple_spread through run_episodes."""
    import jax

    from jaxil import envs
    from jaxil.envs.policies import random_policy

    env = envs.make("mpe:simple_spread", max_steps=6)
    run = jax.jit(envs.run_episodes, static_argnums=(0, 1, 4))
    eps = run(env, random_policy(env.spec), None, jax.random.PRNGKey(0), 3)
    ds = Dataset.from_episodes(eps, env.spec, tier="random", source="random_policy", seed=0)
    d = export_vault(ds, tmp_path, "simple_spread.vlt", "Random")
    back = import_vault(d)
    assert_same(ds, back)
    assert_same(ds, load(save(ds, tmp_path / "spread.npz"), spec=env.spec))
    for field in ("obs", "actions", "reward", "avail_actions", "global_state", "done", "truncated"):
        np.testing.assert_array_equal(getattr(back, field), getattr(ds, field))


# -- shape checks, episode ends, the stored spec, the command line -----------------------------

def _rewrite(vdir, change):
    """Rewrite the arrays of the vault at ``vdir`` with ``change(exp)``, keeping
    its user metadata and episode file."""
    meta, exp = vault_mod._read_experience(vdir, "tensorstore")
    layout = ("version", "structure_shape", "structure_dtype")
    user = {k: v for k, v in meta.items() if k not in layout}
    side = vdir / vault_mod.SIDECAR_FILE
    keep = side.read_bytes() if side.exists() else None
    shutil.rmtree(vdir)
    vault_mod._write_experience(vdir, change(exp), user, "tensorstore")
    if keep is not None:
        side.write_bytes(keep)


def _plain_vault(tmp_path, change=lambda exp: exp, lengths=(3, 5, 2)):
    """A plain OG-MARL vault (N=2, O=3, S=4, A=5, K=10) changed by ``change``."""
    exp = change(_og_marl_experience(np.random.default_rng(4), list(lengths)))
    vault_mod._write_experience(tmp_path / "p.vlt" / "u", exp, {}, "tensorstore")
    return tmp_path / "p.vlt"


def _with(exp, key, fn):
    if key.startswith("infos."):
        return {**exp, "infos": {**exp["infos"], key[6:]: fn(exp["infos"][key[6:]])}}
    return {**exp, key: fn(exp[key])}


def test_legals_width_must_be_the_number_of_actions(tmp_path):
    """A vault whose `infos.legals` width differs from the number of actions is
    refused in one line naming the vault, the field, actual and expected shape.
    Fails if legals are not checked against the stored spec (numpy's "could not be
    broadcast" error when the episode file's final entries are written), against
    the actions taken (legals width 2 while actions reach 2), or against a given
    spec."""
    d = export_vault(make_dataset(), tmp_path, "a.vlt", "u", backend="tensorstore")
    _rewrite(d, lambda e: _with(e, "infos.legals", lambda x: x[..., :4]))
    with pytest.raises(DatasetError) as err:
        import_vault(d, backend="tensorstore")
    msg = str(err.value)
    assert msg.startswith(f"vault {d.resolve()}: `infos.legals` has shape (1, 24, 3, 4) but the "
                          "environment test:disc (the spec stored with the vault) has 6 actions "
                          "(expected (1, 24, 3, 6) [B, K, N, A]); ")
    assert "re-export the vault" in msg and "\n" not in msg

    narrow = _plain_vault(tmp_path, lambda e: _with(e, "infos.legals", lambda x: x[..., :2]))
    with pytest.raises(DatasetError, match=r"p\.vlt/u: `actions` reach action 2 but "
                                           r"`infos\.legals` has shape \(1, 10, 2, 2\), "
                                           r"expected a width of at least 3"):
        import_vault(narrow, backend="tensorstore")

    five = EnvSpec("og:five", num_agents=2, obs_dim=3, state_dim=4, action=DiscreteActions(4),
                   max_steps=10)
    with pytest.raises(DatasetError, match=r"`infos\.legals` has shape \(1, 10, 2, 5\) but the "
                                           r"environment og:five has 4 actions \(expected "
                                           r"\(1, 10, 2, 4\)"):
        import_vault(_plain_vault(tmp_path / "g"), spec=five, backend="tensorstore")


@pytest.mark.parametrize("key, change, message", [
    ("infos.legals", lambda x: x[:, :, :1],
     (r"`infos\.legals` has shape \(1, 10, 1, 5\) but `observations` has 2 agents "
      r"\(expected \(1, 10, 2, 5\) \[B, K, N, A\]\); the vault's fields disagree")),
    ("rewards", lambda x: x[:, :, :1],
     r"`rewards` has shape \(1, 10, 1\) but `observations` has 2 agents \(expected \(1, 10, 2\)"),
    ("truncations", lambda x: np.concatenate([x, x]),
     (r"`truncations` has shape \(2, 10, 2\) but `observations` has 1 stream \(expected "
      r"\(1, 10, 2\)")),
    ("infos.state", lambda x: x[..., None],
     r"`infos\.state` has shape \(1, 10, 4, 1\) \(rank 4\), expected \[B, K, S\]"),
], ids=["legals-N", "rewards-N", "truncations-B", "state-rank"])
def test_fields_that_disagree_are_named(tmp_path, key, change, message):
    """Every field is checked against the others. Fails if only the leading
    [B, K] axes are compared: a legals or rewards array with the wrong number of
    agents then passes through (rewards [1, K, 1] are silently averaged over one
    agent) or ends in an error that names no vault field."""
    vault = _plain_vault(tmp_path, lambda e: _with(e, key, change))
    where = re.escape(str(vault.resolve()))
    with pytest.raises(DatasetError, match=rf"^vault {where}/u: {message}"):
        import_vault(vault, backend="tensorstore")


def test_wrong_agent_count_against_the_stored_spec(tmp_path):
    """An exported vault whose legals lost an agent names the stored spec's 3
    agents. Fails if the stored spec is not read (the broadcast error of the
    final entries instead)."""
    d = export_vault(make_dataset(), tmp_path, "b.vlt", "u", backend="tensorstore")
    _rewrite(d, lambda e: _with(e, "infos.legals", lambda x: x[:, :, :2]))
    with pytest.raises(DatasetError, match=r"`infos\.legals` has shape \(1, 24, 2, 6\) but the "
                                           r"environment test:disc \(the spec stored with the "
                                           r"vault\) has 3 agents"):
        import_vault(d, backend="tensorstore")


def test_a_vault_whose_episodes_never_end_is_refused(tmp_path):
    """No step of `terminals` / `truncations` set: refused, naming both fields.
    Fails if the stream is read as one long cut trajectory (here 10 steps, in
    OG-MARL's vaults thousands). An unfinished tail after ended episodes stays a
    cut trajectory (test_import_plain_og_marl_vault)."""
    def never(exp):
        return {**exp, "terminals": 0 * exp["terminals"], "truncations": 0 * exp["truncations"]}

    with pytest.raises(DatasetError, match=r"p\.vlt/u: no step of `terminals` or `truncations` is "
                                           r"set, so none of its 10 steps ends an episode; a vault "
                                           r"must mark each episode's last step"):
        import_vault(_plain_vault(tmp_path, never), backend="tensorstore")
    d = export_vault(make_dataset(), tmp_path, "c.vlt", "u", backend="tensorstore")
    _rewrite(d, never)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused before the episode file is compared
        with pytest.raises(DatasetError, match="none of its 24 steps ends an episode"):
            import_vault(d, backend="tensorstore")


@pytest.mark.parametrize("spec", [SPEC, CSPEC], ids=["discrete", "continuous"])
def test_spec_is_stored_and_used(tmp_path, spec):
    """The spec is stored in metadata.json and comes back whole (env id, sizes,
    action space with noop_action, max_steps, has_win), also when the episode
    file is gone or no longer matches; the arrays must fit it. Fails if import
    drops the stored spec and infers one (env id vault:..., no noop action,
    has_win False, max_steps = the longest episode)."""
    ds = make_dataset(spec)
    d = export_vault(ds, tmp_path, "s.vlt", "u", backend="tensorstore")
    meta = json.loads((d / "metadata.json").read_text())
    assert meta["jaxil"]["spec"] == spec.to_dict()
    back = import_vault(d, backend="tensorstore")
    assert back.spec == spec
    assert_same(ds, back)

    side = (d / vault_mod.SIDECAR_FILE).read_bytes()
    (d / vault_mod.SIDECAR_FILE).unlink()
    plain = import_vault(d, backend="tensorstore")
    assert plain.spec == spec and plain.num_steps == spec.max_steps
    np.testing.assert_array_equal(plain.length, ds.length)
    np.testing.assert_array_equal(plain.actions, ds.actions)

    # an episode file of another export of the same environment: ignored, spec kept
    other = export_vault(make_dataset(spec, num=4, seed=2), tmp_path, "o.vlt", "u",
                         backend="tensorstore")
    os.replace(other / vault_mod.SIDECAR_FILE, d / vault_mod.SIDECAR_FILE)
    with pytest.warns(UserWarning, match="episode boundaries do not match"):
        assert import_vault(d, backend="tensorstore").spec == spec

    (d / vault_mod.SIDECAR_FILE).write_bytes(side)
    meta["jaxil"]["spec"]["obs_dim"] = 7
    (d / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match=r"`observations` has shape \(1, \d+, \d, 4\) but the "
                                           r"environment test:\w+ \(the spec stored with the "
                                           r"vault\) has 7 observation features"):
        import_vault(d, backend="tensorstore")
    with pytest.warns(UserWarning, match="its spec differs from the one in metadata.json"):
        assert import_vault(d, spec=spec, backend="tensorstore").spec == spec  # a given spec wins


def _clean_dataset() -> Dataset:
    """make_dataset with +0.0 padding (its rng * 0 padding holds -0.0, which a
    vault, storing no padding, gives back as +0.0)."""
    ds = make_dataset()
    return ds.replace(obs=ds.obs + 0.0, global_state=ds.global_state + 0.0,
                      reward=ds.reward + 0.0)


@pytest.fixture(scope="module")
def cli_main():
    """``jaxil.cli.main.main``. Building its parser imports every command's
    module (JaxMARL among them: seconds, once per process)."""
    from jaxil.cli.main import build_parser, main

    build_parser()
    return main


def _cli(capsys, main, *argv):
    rc = main(["data", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_round_trip_is_byte_identical(tmp_path, capsys, monkeypatch, cli_main):
    """export-vault then import-vault writes the original file byte for byte,
    with relative paths. Fails if a relative --out breaks the tensorstore
    writer (its file:// URLs need absolute paths), if the CLI drops the stored
    spec or the episode file, or if --overwrite does not replace."""
    monkeypatch.chdir(tmp_path)
    save(_clean_dataset(), "ds.npz")
    rc, out, err = _cli(capsys, cli_main, "export-vault", "ds.npz", "--out", "vaults",
                        "--vault-uid", "Mixed", "--backend", "tensorstore")
    assert (rc, err) == (0, "")
    assert out.startswith("wrote vault vaults/ds.vlt/Mixed (6 trajectories of test:disc")
    rc, out, err = _cli(capsys, cli_main, "import-vault", "vaults/ds.vlt", "--out", "back.npz",
                        "--backend", "tensorstore")
    assert (rc, err) == (0, "")
    assert out.startswith("wrote back.npz (6 trajectories of test:disc, 24 transitions, T=8)")
    assert (tmp_path / "back.npz").read_bytes() == (tmp_path / "ds.npz").read_bytes()

    save(make_dataset(num=4, seed=3), "other.npz")
    rc, *_ = _cli(capsys, cli_main, "export-vault", "other.npz", "--out", "vaults",
                  "--name", "ds.vlt", "--vault-uid", "Mixed", "--overwrite",
                  "--backend", "tensorstore")
    rc2, *_ = _cli(capsys, cli_main, "import-vault", "vaults/ds.vlt/Mixed", "--out", "back.npz",
                   "--overwrite", "--backend", "tensorstore")
    assert rc == rc2 == 0
    assert len(load("back.npz")) == 4


def test_cli_errors_are_one_line(tmp_path, capsys, monkeypatch, cli_main):
    """Missing vault or dataset, a corrupt vault, an existing output: exit 1,
    one line on stderr, nothing written. A stale episode file is a one-line
    warning. Fails if an error escapes as a traceback, if an existing --out or
    vault is silently replaced, or if warnings print Python's two-line form."""
    monkeypatch.chdir(tmp_path)
    save(make_dataset(), "ds.npz")
    d = export_vault(make_dataset(), tmp_path, "bad.vlt", "u", backend="tensorstore")
    _rewrite(d, lambda e: _with(e, "infos.legals", lambda x: x[..., :4]))
    export_vault(make_dataset(), tmp_path, "ok.vlt", "u", backend="tensorstore")
    (tmp_path / "taken.npz").write_bytes(b"keep")
    ts = ("--backend", "tensorstore")
    cases = [
        (("import-vault", "missing.vlt", "--out", "x.npz", *ts), "no OG-MARL vault at missing.vlt"),
        (("import-vault", "bad.vlt", "--out", "x.npz", *ts), "`infos.legals` has shape"),
        (("import-vault", "ok.vlt", "--out", "taken.npz", *ts),
         "--out taken.npz already exists; pass --overwrite"),
        (("export-vault", "missing.npz", "--out", ".", "--vault-uid", "v", *ts),
         "no dataset at missing.npz"),
        (("export-vault", "ds.npz", "--out", ".", "--name", "ok.vlt", "--vault-uid", "u", *ts),
         "vault ok.vlt/u already exists; pass --overwrite"),
    ]
    for argv, message in cases:
        rc, out, err = _cli(capsys, cli_main, *argv)
        assert rc == 1 and out == "", argv
        assert err.startswith("jaxil data: error: ") and message in err, err
        assert err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "x.npz").exists() and not (tmp_path / "missing.npz.vlt").exists()
    assert (tmp_path / "taken.npz").read_bytes() == b"keep"

    os.replace(tmp_path / "bad.vlt" / "u" / vault_mod.SIDECAR_FILE,
               tmp_path / "ok.vlt" / "u" / vault_mod.SIDECAR_FILE)
    export_vault(make_dataset(num=2, seed=1), tmp_path, "two.vlt", "u", backend="tensorstore")
    os.replace(tmp_path / "two.vlt" / "u" / vault_mod.SIDECAR_FILE,
               tmp_path / "ok.vlt" / "u" / vault_mod.SIDECAR_FILE)
    rc, out, err = _cli(capsys, cli_main, "import-vault", "ok.vlt", "--out", "stale.npz", *ts)
    assert rc == 0 and out.startswith("wrote stale.npz")
    assert err.startswith("jaxil data import-vault: warning: ignoring ") and err.count("\n") == 1
