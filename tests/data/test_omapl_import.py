"""The O-MAPL authors' .h5 preference files: a small file in their layout
(SMAX 3m shapes) round-trips into a Dataset and Phase 1's preferences, and
corrupt files are refused with one line naming the field."""

import sys

import jax
import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

from jaxil import envs  # noqa: E402
from jaxil.cli.main import main  # noqa: E402
from jaxil.data import DatasetError, load  # noqa: E402
from jaxil.data.omapl_h5 import import_omapl_h5, load_preferences, save_preferences  # noqa: E402
from jaxil.algorithms.offline import PreferenceData, make_learner, update_n  # noqa: E402
from jaxil.algorithms.labelling.label import score_trajectories  # noqa: E402

from helpers.fast_compile import fast_call  # noqa: E402

ENV = "smax:3m"
SPEC = envs.make(ENV).spec
P, T = 6, 5  # pairs, steps (T+1 observation entries)


def _side(rng, lengths, terminated):
    """One side of every pair in the authors' layout: random observations,
    random avails (each agent has >= 1 legal action), a legal action at every
    active step, dones at the last active step where ``terminated``, and
    garbage (not zeros) in the padding, as a recorder might leave it."""
    N, O, S, A = SPEC.num_agents, SPEC.obs_dim, SPEC.state_dim, SPEC.num_actions
    obs = rng.normal(size=(P, T + 1, N, O)).astype(np.float32)
    states = rng.normal(size=(P, T + 1, S)).astype(np.float32)
    avails = (rng.random((P, T + 1, N, A)) < 0.5).astype(np.float32)
    avails[..., SPEC.action.noop_action] = 1.0
    actions = np.zeros((P, T, N), np.int64)
    for idx in np.ndindex(P, T, N):
        actions[idx] = rng.choice(np.flatnonzero(avails[idx]))
    actives = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
    dones = np.zeros((P, T), np.float32)
    dones[np.arange(P), lengths - 1] = terminated
    dones[actives == 0] = 1.0  # past the end: ignored by the import
    return dict(states=states, obs=obs, avails=avails, actions=actions, dones=dones,
                actives=actives)


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    x = _side(rng, np.array([5, 3, 1, 4, 5, 2]), np.array([1, 1, 0, 1, 0, 1], np.float32))
    y = _side(rng, np.array([2, 5, 4, 1, 3, 5]), np.array([0, 1, 1, 1, 1, 0], np.float32))
    out = {f"{k}_x": v for k, v in x.items()} | {f"{k}_y": v for k, v in y.items()}
    out["labels"] = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.5], np.float32)
    return out


def _write(path, arrays):
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f.create_dataset(k, data=v)
    return path


@pytest.fixture
def h5file(tmp_path):
    return _write(tmp_path / "3m.h5", _arrays())


def test_round_trip_field_by_field(h5file):
    """Every field lands where it belongs: x sides at 0..P-1 and y sides at
    P..2P-1 (catches pairs swapped or x/y interleaved wrongly), labels passed
    as P(x preferred) unchanged (catches labels flipped), length = active
    steps and the observation after the last action kept (catches an
    off-by-one in trajectory length or in the T+1 entries), padding zeroed."""
    a = _arrays()
    ds, (pairs, prefs) = import_omapl_h5(h5file, ENV)
    assert ds.spec == SPEC and len(ds) == 2 * P and ds.num_steps == T
    np.testing.assert_array_equal(pairs.traj_x, np.arange(P))
    np.testing.assert_array_equal(pairs.traj_y, np.arange(P) + P)
    assert pairs.segment_len is None and not pairs.start_x.any() and not pairs.start_y.any()
    np.testing.assert_array_equal(prefs, a["labels"])
    assert prefs.dtype == np.float32
    for side, rows in (("x", slice(0, P)), ("y", slice(P, 2 * P))):
        L = a[f"actives_{side}"].sum(1).astype(int)
        np.testing.assert_array_equal(ds.length[rows], L)
        np.testing.assert_array_equal(ds.mask[rows], a[f"actives_{side}"] != 0)
        np.testing.assert_array_equal(ds.source[rows], 0 if side == "x" else 1)
        for p in range(P):
            m, n = rows.start + p, L[p]
            np.testing.assert_array_equal(ds.obs[m, :n + 1], a[f"obs_{side}"][p, :n + 1])
            np.testing.assert_array_equal(ds.global_state[m, :n + 1],
                                          a[f"states_{side}"][p, :n + 1])
            np.testing.assert_array_equal(ds.avail_actions[m, :n + 1],
                                          a[f"avails_{side}"][p, :n + 1] != 0)
            np.testing.assert_array_equal(ds.actions[m, :n], a[f"actions_{side}"][p, :n])
            assert not ds.obs[m, n + 1:].any() and not ds.actions[m, n:].any()
            assert ds.done[m, n - 1] == bool(a[f"dones_{side}"][p, n - 1])
            assert ds.done[m].sum() == ds.done[m, n - 1]
    assert ds.actions.dtype == np.int32 and not ds.truncated.any()
    assert not ds.expert.any() and not ds.reward.any()


@pytest.mark.slow  # default-suite time (~20 s of O-MAPL compile); the import's own checks stay
def test_phase1_consumes_the_import(h5file):
    """The real Phase-1 consumers take the result: PreferenceData.from_pairs
    gathers side x of query i from the file's x trajectory i (catches an
    index mapping that looks right but pairs the wrong trajectories) with
    mask/done from the file; an O-MAPL update trains on it and
    score_trajectories scores every imported trajectory (tiny nets)."""
    a = _arrays()
    ds, (pairs, prefs) = import_omapl_h5(h5file, ENV)
    data = PreferenceData.from_pairs(ds, pairs, prefs)
    n = int(max(a["actives_x"].sum(1).max(), a["actives_y"].sum(1).max()))
    np.testing.assert_array_equal(np.asarray(data.label), a["labels"])
    for side, seg in (("x", data.x), ("y", data.y)):
        act = a[f"actives_{side}"][:, :n] != 0
        np.testing.assert_array_equal(np.asarray(seg.mask), act)
        np.testing.assert_array_equal(np.asarray(seg.actions)[act],
                                      a[f"actions_{side}"][:, :n][act])
        np.testing.assert_array_equal(np.asarray(seg.obs)[:, 0], a[f"obs_{side}"][:, 0])
        np.testing.assert_array_equal(np.asarray(seg.done),
                                      (a[f"dones_{side}"][:, :n] != 0) & act)
    learner = make_learner("omapl", SPEC, hidden=(8,), mixer_hidden=4, batch_size=2)
    state = fast_call(learner.init, jax.random.PRNGKey(0))
    state, metrics = fast_call(lambda s, d: update_n(learner, s, d, 2), state, data)
    assert all(np.isfinite(float(v)) for v in metrics.values())
    stacked = jax.tree.map(lambda v: v[None], state)
    scores = score_trajectories(learner.config, SPEC, stacked.params, stacked.hparams.gamma, ds)
    assert scores.shape == (1, 2 * P) and np.isfinite(scores).all()
    # and Phase 1's one-call fit runs on the import end to end
    from jaxil.algorithms.labelling.label import fit_preferences

    fit = fit_preferences(ds, pairs, prefs, seeds=1, updates=4, chunk=2, progress=False,
                          hidden=(8,), mixer_hidden=4, batch_size=2)
    assert fit.scores.shape == (1, 2 * P) and np.isfinite(fit.scores).all()
    assert fit.num_pairs == P


def test_without_actives_a_trajectory_ends_at_its_first_done(tmp_path):
    """``actives`` is optional (only the authors' LLM prompt code reads it):
    without it the length comes from the first done, else T — the view of
    their trainer (catches a length taken from the padded T regardless)."""
    a = _arrays()
    for side in "xy":
        del a[f"actives_{side}"]
    ds, _ = import_omapl_h5(_write(tmp_path / "noact.h5", a), ENV)
    d = a["dones_x"] != 0
    want = np.where(d.any(1), d.argmax(1) + 1, T)
    np.testing.assert_array_equal(ds.length[:P], want)
    np.testing.assert_array_equal(ds.done[np.arange(P), want - 1], d.any(1))


def test_spec_inferred_without_env(h5file):
    """With no environment, the spec comes from the shapes (catches the
    action width taken from the actions' max instead of the avails)."""
    ds, _ = import_omapl_h5(h5file, None)
    s = ds.spec
    assert s.env_id == "omapl:3m" and (s.num_agents, s.obs_dim, s.state_dim) == (
        SPEC.num_agents, SPEC.obs_dim, SPEC.state_dim)
    assert s.discrete and s.num_actions == SPEC.num_actions and s.max_steps == T


def test_cli_writes_both_files_and_they_load_back(h5file, tmp_path, capsys):
    """``jaxil data import-omapl`` writes the dataset and the preferences
    (default name beside it); both load back equal to the direct import, and
    the preferences refuse a dataset they were not made for (catches
    preferences silently applied to other trajectories)."""
    out = tmp_path / "out" / "3m.npz"
    assert main(["data", "import-omapl", str(h5file), "--env", ENV, "--out", str(out)]) == 0
    prefs_path = out.with_name("3m.prefs.npz")
    assert out.exists() and prefs_path.exists()
    ds0, (pairs0, prefs0) = import_omapl_h5(h5file, ENV)
    ds = load(out)
    for k, v in ds0.arrays().items():
        np.testing.assert_array_equal(ds.arrays()[k], v, err_msg=k)
    pairs, prefs = load_preferences(prefs_path, ds)
    np.testing.assert_array_equal(prefs, prefs0)
    np.testing.assert_array_equal(pairs.traj_y, pairs0.traj_y)
    assert pairs.segment_len is None
    other = ds.select(np.roll(np.arange(2 * P), 1))
    with pytest.raises(DatasetError, match="another dataset"):
        load_preferences(prefs_path, other)
    # an explicit --prefs path, and the same files again (atomic overwrite)
    custom = tmp_path / "p.npz"
    assert main(["data", "import-omapl", str(h5file), "--env", ENV, "--out", str(out),
                 "--prefs", str(custom)]) == 0
    assert load_preferences(custom, ds).prefs.shape == (P,)
    save_preferences(custom, ds, (pairs, prefs))  # the save function itself, directly
    assert "6 pairs" in capsys.readouterr().out


def _drop(a, key):
    del a[key]


def _widen(a, key):
    a[key] = np.concatenate([a[key], np.zeros(a[key].shape[:-1] + (1,), a[key].dtype)], -1)


def _illegal(a, key):
    # pair 1 of side y, step 0, agent 2: forbid the action it took
    a["avails_y"][1, 0, 2, a["actions_y"][1, 0, 2]] = 0.0


def _set(value):
    def f(a, key):
        a[key][3] = value
    return f


def _early_done(a, key):
    a["dones_x"][0, 1] = 1.0  # pair 0 of side x has 5 active steps


def _gap(a, key):
    a["actives_x"][0, 2] = 0.0


def _short_y(a, key):
    for k in ("obs_y", "states_y", "avails_y"):
        a[k] = a[k][:, :-1]
    for k in ("actions_y", "dones_y", "actives_y"):
        a[k] = a[k][:, :-1]
    a["actives_y"][:, -1] = 0.0  # keep lengths within the shorter axis


CORRUPT = {
    # name: (how, the field the message must name, which bug it would catch)
    "missing key": (_drop, "obs_y", "a file exported without one side's observations"),
    "obs width": (_widen, "obs_x", "a file from another map (obs 76 vs 75)"),
    "illegal action": (_illegal, "actions_y", "actions and avails misaligned by a step"),
    "label 2.5": (_set(2.5), "labels", "labels on another scale than P(x preferred)"),
    "NaN label": (_set(np.nan), "labels", "unanswered queries smuggled in as NaN"),
    "done before the end": (_early_done, "dones_x", "dones shifted against actives"),
    "actives with a gap": (_gap, "actives_x", "actives that are not a prefix"),
    "sides of different T": (_short_y, "obs_y", "x and y padded to different horizons"),
}


@pytest.mark.parametrize("name", list(CORRUPT))
def test_corrupt_file_is_refused_in_one_line(tmp_path, name):
    """Each corruption is refused with a one-line ValueError naming the file
    and the field (CORRUPT says, per case, which producer bug it stands for)."""
    how, field, _ = CORRUPT[name]
    a = _arrays()
    how(a, field)
    path = _write(tmp_path / "bad.h5", a)
    with pytest.raises(ValueError) as e:
        import_omapl_h5(path, ENV)
    msg = str(e.value)
    assert f"`{field}`" in msg and str(path) in msg and "\n" not in msg, msg


def test_cli_reports_a_bad_file_in_one_line(tmp_path, capsys):
    """Through the CLI a corrupt file is one line on stderr and exit 1, and
    no output file is left behind (catches a half-written dataset)."""
    a = _arrays()
    a["labels"][0] = 2.5
    path = _write(tmp_path / "bad.h5", a)
    out = tmp_path / "o.npz"
    assert main(["data", "import-omapl", str(path), "--env", ENV, "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert "`labels`" in err and len(err.splitlines()) == 1
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))


def test_not_an_hdf5_file(tmp_path):
    """A file that is not HDF5 (a truncated download, an .npz by mistake) is
    one ValueError naming it, not an h5py traceback."""
    path = tmp_path / "x.h5"
    path.write_bytes(b"not hdf5")
    with pytest.raises(ValueError, match="not a readable HDF5 file") as e:
        import_omapl_h5(path, ENV)
    assert str(path) in str(e.value)
    with pytest.raises(FileNotFoundError):
        import_omapl_h5(tmp_path / "missing.h5", ENV)


def test_missing_h5py_names_the_extra(h5file, monkeypatch, capsys):
    """Without h5py the import says how to install it (catches a bare
    ModuleNotFoundError traceback from the CLI)."""
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(ImportError, match=r'pip install "jaxil\[h5\]"'):
        import_omapl_h5(h5file, ENV)
    out = str(h5file.with_suffix(".npz"))
    assert main(["data", "import-omapl", str(h5file), "--env", ENV, "--out", out]) == 1
    assert 'pip install "jaxil[h5]"' in capsys.readouterr().err
