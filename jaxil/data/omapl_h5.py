"""Import the O-MAPL authors' `.h5` preference files into jaxil.

The O-MAPL release (github.com/vietbt/OMAPL) reads `dataset/<env>.h5` in
`utils.py` (`load_h5py_data`: every top-level HDF5 dataset becomes one
tensor; the batch size is `len(labels)`); how each key is used is in
`trainers/omarl.py` and `llm_generate.py`. A file holds P preference
pairs, each two trajectories x and y padded to one time axis of T steps, as
flat HDF5 datasets (no groups):

```text
states_{x,y}   [P, T+1, S]     global state (SMACv1: the N agent-specific
                               states, concatenated; a [P, T+1, N, s]
                               copy is flattened to that on import)
obs_{x,y}      [P, T+1, N, O]  local observations
avails_{x,y}   [P, T+1, N, A]  0/1 action masks (discrete tasks)
actions_{x,y}  [P, T, N]       integer actions, or [P, T, N, d] (MaMuJoCo)
dones_{x,y}    [P, T]          step t terminated (no bootstrap from t+1)
actives_{x,y}  [P, T]          1 on the trajectory's steps, 0 on padding
                               (read only by their LLM prompt builder;
                               optional here)
labels         [P]             1: x preferred, 0: y preferred
```

Entry t of states/obs/avails is what the agents saw before acting at step t
(their trainer takes entries `[:-1]` as s_t and `[1:]` as s_{t+1}).
The code does not fix dtypes (it converts with `torch.from_numpy` and
casts labels and dones to float); any numeric or bool dtype is accepted, and
labels anywhere in [0, 1] are read as soft preferences.

What the import makes of it:

* a [`Dataset`][jaxil.data.format.Dataset] of M = 2P trajectories, the x sides at
  `0..P-1` and the y sides at `P..2P-1` (`source` 0 and 1). A
  trajectory's length is its number of active steps; without `actives` it
  ends at its first done, else at T. Entries past the end are zeroed (jaxil
  padding), `done` is the file's done at the last step, `truncated` is
  never set (SMAC reports a time-limit end as done too).
* the preferences Phase 1 takes, `(pairs, prefs)`:
  [`QueryPairs`][jaxil.data.preferences.QueryPairs] of whole trajectories
  (x_i = i, y_i = P + i, start 0, `segment_len=None`) and `prefs [P]` float32,
  the probability that x is preferred = the label:

```python
ds, (pairs, prefs) = import_omapl_h5("dataset/5m_vs_6m.h5", None, spec=SMAC_SPEC)
fit = fit_preferences(ds, pairs, prefs, seeds=3)
```

The files store no rewards and no quality tiers: `reward` and
`episode_return` are zero, `expert` is False, `success` False, `seed`
-1 (so the ground-truth oracle and labelling metrics have nothing to compare
against). A trajectory that appears in several pairs is imported once per
pair. The authors recorded StarCraft II SMAC and MaMuJoCo, whose shapes no
jaxil environment shares (SMAX observations differ): import those with
`spec=` describing the file, or `env_id=None` to infer one.

[`save_preferences`][jaxil.data.omapl_h5.save_preferences] /
[`load_preferences`][jaxil.data.omapl_h5.load_preferences] keep the preferences
beside the dataset file (`jaxil data import-omapl` writes both), tied to the
dataset by a content hash. h5py is an optional dependency:
`pip install "jaxil[h5]"`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, NamedTuple, Optional, Union

import numpy as np

from jaxil.envs.core import ContinuousActions, DiscreteActions, EnvSpec
from jaxil.data.format import (
    Dataset,
    DatasetInfo,
    canonical_json,
    checksum,
    describe_fields,
    library_versions,
    read_archive,
    write_archive,
)
from jaxil.data.validate import BOX_ATOL, SCHEMA_VERSION, DatasetError, validate
from jaxil.data.preferences import QueryPairs
from jaxil import envs

PathLike = Union[str, os.PathLike]

INSTALL_HINT = 'pip install "jaxil[h5]"'
SIDES = ("x", "y")
PREFERENCES_FORMAT = "jaxil.preferences"
_PAIR_FIELDS = ("traj_x", "traj_y", "start_x", "start_y", "prefs")
_LABEL_MEANING = "the probability that trajectory x is preferred (1: x, 0: y)"


class Preferences(NamedTuple):
    """What Phase 1 takes besides the dataset: `fit_preferences(ds, *prefs)`."""

    pairs: QueryPairs
    prefs: np.ndarray  # [Q] float32 in [0, 1]: P(x preferred)


def import_omapl_h5(
    path: PathLike,
    env_id: Optional[str],
    *,
    spec: Optional[EnvSpec] = None,
    tier: str = "unlabelled",
) -> tuple[Dataset, Preferences]:
    """Read an O-MAPL `.h5` preference file (layout in the module docstring).

    Args:
      path: the `.h5` file.
      env_id: the jaxil environment the data must fit (`envs.make(env_id).spec`),
        or None to use `spec`, or to infer a spec from the shapes (env id
        `omapl:<file stem>`, max_steps = T).
      spec: an explicit spec for data from an environment jaxil does not have
        (e.g. the SMAC map it was recorded on); not together with `env_id`.
      tier: the tier name of every trajectory (their quality is not stored).

    Returns:
      `(dataset, Preferences(pairs, prefs))`: M = 2P validated trajectories
      and the P answered queries over them.

    Raises:
      ImportError: h5py is not installed.
      FileNotFoundError: nothing at `path`.
      DatasetError: (a ValueError) anything wrong with the file, in one line
        naming the file, the field and the fix.
    """
    try:
        import h5py
    except ImportError:
        raise ImportError(
            f"reading O-MAPL .h5 files needs h5py, which is not installed: {INSTALL_HINT}"
        ) from None
    path = Path(path)
    if env_id is not None and spec is not None:
        raise ValueError("give env_id or spec, not both")
    if env_id is not None:

        spec = envs.make(env_id).spec
    if not path.exists():
        raise FileNotFoundError(f"no O-MAPL .h5 file at {path}")
    try:
        with h5py.File(path, "r") as f:
            raw = {k: f[k][()] for k in f if isinstance(f[k], h5py.Dataset)}
            groups = sorted(k for k in f if not isinstance(f[k], h5py.Dataset))
    except OSError as e:
        raise DatasetError(
            f"{path} is not a readable HDF5 file ({e}); re-download or re-export it"
        ) from None
    src = _Source(path, raw, groups)
    arrays, labels = _read_pairs(src, spec)
    if spec is None:
        spec = _infer_spec(path, arrays)
    ds = _to_dataset(src, arrays, spec, tier)
    P = labels.shape[0]
    idx = np.arange(P, dtype=np.int32)
    pairs = QueryPairs(traj_x=idx, traj_y=idx + P, start_x=np.zeros(P, np.int32),
                       start_y=np.zeros(P, np.int32), segment_len=None)
    return ds, Preferences(pairs, labels.astype(np.float32))


# -- reading and checking ---------------------------------------------------------------


class _Source:
    """The file's arrays and a one-line error factory that names it."""

    def __init__(self, path: Path, raw: dict[str, np.ndarray], groups: list[str]):
        self.path, self.raw, self.groups = path, raw, groups

    def error(self, key: str, what: str, fix: str) -> DatasetError:
        return DatasetError(f"{self.path}: `{key}` {what}; {fix}")

    def get(self, key: str, required: bool = True) -> Optional[np.ndarray]:
        if key in self.raw:
            x = np.asarray(self.raw[key])
            if x.dtype.kind not in "biuf":
                raise self.error(key, f"has dtype {x.dtype}, not numbers or booleans",
                                 "store it as a numeric array")
            return x
        if not required:
            return None
        found = sorted(self.raw) + [f"{g}/ (group)" for g in self.groups]
        raise DatasetError(
            f"{self.path} has no `{key}` dataset (found: {', '.join(found) or 'nothing'}); an "
            f"O-MAPL preference file holds states_x/y, obs_x/y, actions_x/y, dones_x/y, "
            f"avails_x/y (discrete tasks) and labels at its top level — re-export it with all "
            f"of them"
        )


def _read_pairs(src: _Source, spec: Optional[EnvSpec]) -> tuple[dict, np.ndarray]:
    """Every field checked against `spec` (or, without one, against the x
    side's shapes); returns per side the arrays and lengths, and the labels."""
    labels = src.get("labels")
    if labels.ndim != 1 or labels.shape[0] < 1:
        raise src.error("labels", f"has shape {labels.shape}", "it must be [P], one per pair")
    labels = labels.astype(np.float64)
    bad = ~np.isfinite(labels) | (labels < 0) | (labels > 1)
    if bad.any():
        p = int(np.flatnonzero(bad)[0])
        raise src.error("labels", f"of pair {p} is {labels[p]:g} but a label is {_LABEL_MEANING}",
                        "store labels in [0, 1]")
    discrete = spec.discrete if spec is not None else src.get("actions_x").ndim == 3
    dims = _Dims(spec, labels.shape[0])
    return {side: _read_side(src, side, spec, discrete, dims) for side in SIDES}, labels


class _Dims:
    """Expected size of each named axis and why: the spec's, else the first
    array that showed it (so the y side must match the x side)."""

    def __init__(self, spec: Optional[EnvSpec], P: int):
        # name -> (size, why, whether the spec fixed it)
        self.sizes: dict[str, tuple[int, str, bool]] = {
            "P": (P, "`labels` has that many pairs", False)}
        if spec is not None:
            env = spec.env_id
            self.sizes.update(N=(spec.num_agents, f"{env} has that many agents", True),
                              O=(spec.obs_dim, f"{env} has that obs_dim", True),
                              S=(spec.state_dim, f"{env} has that state_dim", True))
            if spec.discrete:
                self.sizes["A"] = (spec.num_actions, f"{env} has that many actions", True)
            else:
                self.sizes["d"] = (spec.action.dim, f"{env} has that action dim", True)

    def check(self, src: _Source, key: str, x: np.ndarray, names: tuple) -> None:
        layout = "[" + ", ".join(names) + "]"
        if x.ndim != len(names):
            raise src.error(key, f"has shape {x.shape} (rank {x.ndim})",
                            f"it must be {layout} in the O-MAPL layout")
        for axis, name in enumerate(names):
            self.sizes.setdefault(name, (x.shape[axis], f"`{key}` has that size there", False))
            size, why, from_spec = self.sizes[name]
            if x.shape[axis] != size:
                fix = ("all fields of both sides share P, T, N and the widths: re-export the file"
                       if not from_spec else "import the file with the environment it was recorded "
                       "on (env_id/--env, or spec=), or re-export it")
                raise src.error(key, f"has shape {x.shape} but axis {axis} ({name}) should be "
                                f"{size}: {why}", fix)


def _read_side(src: _Source, side: str, spec: Optional[EnvSpec], discrete: bool,
               dims: _Dims) -> dict[str, np.ndarray]:
    k = {name: f"{name}_{side}" for name in ("obs", "states", "avails", "actions", "dones",
                                              "actives")}
    obs = src.get(k["obs"])
    if obs.ndim == 4:
        dims.sizes.setdefault("T", (obs.shape[1] - 1,
                                    f"`{k['obs']}` has T+1={obs.shape[1]} entries", False))
    dims.check(src, k["obs"], obs, ("P", "T+1", "N", "O"))
    P, T1 = obs.shape[:2]
    T = T1 - 1
    if T < 1:
        raise src.error(k["obs"], f"has {T1} entries per trajectory",
                        "a trajectory needs at least one step (T+1 >= 2 entries)")
    state = src.get(k["states"])
    if state.ndim == 4:  # agent-specific states stored per agent: one flat vector per entry
        state = state.reshape(state.shape[:2] + (-1,))
    dims.check(src, k["states"], state, ("P", "T+1", "S"))
    actions = src.get(k["actions"])
    if discrete:
        avail = src.get(k["avails"])
        dims.check(src, k["avails"], avail, ("P", "T+1", "N", "A"))
        _check_binary(src, k["avails"], avail)
        dims.check(src, k["actions"], actions, ("P", "T", "N"))
    else:
        dims.check(src, k["actions"], actions, ("P", "T", "N", "d"))
        avail = np.zeros(obs.shape[:3] + (0,), bool)

    done = src.get(k["dones"])
    dims.check(src, k["dones"], done, ("P", "T"))
    _check_binary(src, k["dones"], done)
    done = done != 0
    actives = src.get(k["actives"], required=False)
    if actives is not None:
        dims.check(src, k["actives"], actives, ("P", "T"))
        _check_binary(src, k["actives"], actives)
        active = actives != 0
        length = active.sum(1)
        prefix = np.arange(T)[None, :] < length[:, None]
        if (active != prefix).any():
            p, t = (int(i) for i in np.argwhere(active != prefix)[0])
            raise src.error(k["actives"], f"of pair {p} is {int(active[p, t])} at step {t} "
                            f"with {int(length[p])} active steps in all",
                            "actives must be 1 on the trajectory's steps, then 0 (padding)")
        if (length == 0).any():
            p = int(np.flatnonzero(length == 0)[0])
            raise src.error(k["actives"], f"of pair {p} has no active step",
                            "every trajectory needs at least one step; drop the pair")
        early = done & (np.arange(T)[None, :] < length[:, None] - 1)
        if early.any():
            p, t = (int(i) for i in np.argwhere(early)[0])
            raise src.error(k["dones"], f"of pair {p} is set at step {t}, before the last "
                            f"active step {int(length[p]) - 1}",
                            "an episode ends at its last step: fix `dones` or `actives`")
    else:  # the trainer's view: a trajectory runs to its first done, or to T
        length = np.where(done.any(1), done.argmax(1) + 1, T)
    steps = np.arange(T)[None, :] < length[:, None]
    entries = np.arange(T1)[None, :] <= length[:, None]
    last_done = done[np.arange(P), length - 1]

    for key, x in ((k["obs"], obs), (k["states"], state)):
        bad = ~np.isfinite(x) & entries.reshape(entries.shape + (1,) * (x.ndim - 2))
        if bad.any():
            p, t = (int(i) for i in np.argwhere(bad)[0][:2])
            raise src.error(key, f"of pair {p} is NaN or inf at entry {t}",
                            "re-export the file from finite data")
    actions = _check_actions(src, k["actions"], actions, avail, steps, spec, discrete)
    if spec is not None and (length > spec.max_steps).any():
        p = int(np.flatnonzero(length > spec.max_steps)[0])
        raise src.error(k["actives"] if actives is not None else k["dones"],
                        f"gives pair {p} a length of {int(length[p])} steps, longer than the "
                        f"time limit max_steps={spec.max_steps} of {spec.env_id}",
                        "import it with the spec of the environment it was recorded on")
    return dict(obs=obs, state=state, avail=avail != 0, actions=actions, length=length,
                last_done=last_done, steps=steps, entries=entries)


def _check_binary(src: _Source, key: str, x: np.ndarray) -> None:
    bad = (x != 0) & (x != 1)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise src.error(key, f"is {x[idx]} at index {idx}", "it holds flags: 0 or 1 only")


def _check_actions(src: _Source, key: str, actions: np.ndarray, avail: np.ndarray,
                   steps: np.ndarray, spec: Optional[EnvSpec], discrete: bool) -> np.ndarray:
    """Actions as jaxil stores them (int32 / float32), checked at valid steps."""
    where = steps[..., None] if discrete else steps[..., None, None]
    if not discrete:
        x = actions.astype(np.float32)
        bad = ~np.isfinite(x) & where
        if spec is not None:
            lo, hi = spec.action.low, spec.action.high
            tol = BOX_ATOL * max(1.0, abs(lo), abs(hi))
            bad |= ((x < lo - tol) | (x > hi + tol)) & where
        if bad.any():
            p, t, i, j = (int(v) for v in np.argwhere(bad)[0])
            box = f" [{spec.action.low}, {spec.action.high}]" if spec is not None else ""
            raise src.error(key, f"of pair {p}, step {t}, agent {i}, dim {j} is "
                            f"{x[p, t, i, j]}, outside the action box{box}",
                            "rescale the actions into the box (the authors' action_scale/bias)")
        return x
    A = avail.shape[-1]
    if actions.dtype.kind == "f":
        bad = (~np.isfinite(actions) | (actions != np.round(actions))) & where
        if bad.any():
            p, t, i = (int(v) for v in np.argwhere(bad)[0])
            raise src.error(key, f"of pair {p}, step {t}, agent {i} is {actions[p, t, i]}",
                            "discrete actions are integers")
    a = np.where(where, actions, 0).astype(np.int64)
    out = ((a < 0) | (a >= A)) & where
    if out.any():
        p, t, i = (int(v) for v in np.argwhere(out)[0])
        raise src.error(key, f"of pair {p}, step {t}, agent {i} is {a[p, t, i]}, outside "
                        f"[0, {A})", "import the file with the environment it was recorded on")
    legal = np.take_along_axis(avail[:, :-1] != 0, a[..., None], -1)[..., 0]
    illegal = ~legal & where
    if illegal.any():
        p, t, i = (int(v) for v in np.argwhere(illegal)[0])
        ok = np.flatnonzero(avail[p, t, i]).tolist()
        raise src.error(key, f"of pair {p}, step {t}, agent {i} is {a[p, t, i]}, which the "
                        f"avails forbid there (legal: {ok})",
                        "the actions and avails do not belong together: re-export the file")
    return a.astype(np.int32)


def _infer_spec(path: Path, arrays: dict) -> EnvSpec:
    x, y = arrays["x"], arrays["y"]
    N, O = x["obs"].shape[2:]
    if x["actions"].dtype.kind in "iu":
        action: Any = DiscreteActions(num_actions=int(x["avail"].shape[-1]))
    else:
        valid = [s["actions"][s["steps"]] for s in (x, y)]
        lo = float(min(-1.0, *(v.min() for v in valid)))
        hi = float(max(1.0, *(v.max() for v in valid)))
        action = ContinuousActions(dim=int(x["actions"].shape[-1]), low=lo, high=hi)
    return EnvSpec(env_id=f"omapl:{path.stem}", num_agents=int(N), obs_dim=int(O),
                   state_dim=int(x["state"].shape[-1]), action=action,
                   max_steps=int(x["actions"].shape[1]), has_win=False)


# -- the dataset -----------------------------------------------------------------------------


def _to_dataset(src: _Source, arrays: dict, spec: EnvSpec, tier: str) -> Dataset:
    x, y = arrays["x"], arrays["y"]
    def both(name: str, valid: str) -> np.ndarray:
        # x sides first, then y sides (the authors' torch.cat((x, y)) order); padding zeroed
        v = np.concatenate([x[name], y[name]])
        keep = np.concatenate([x[valid], y[valid]])
        return np.where(keep.reshape(keep.shape + (1,) * (v.ndim - 2)), v, np.zeros((), v.dtype))

    length = np.concatenate([x["length"], y["length"]]).astype(np.int32)
    M, T = length.shape[0], x["actions"].shape[1]
    P = M // 2
    mask = np.arange(T)[None, :] < length[:, None]
    done = np.zeros((M, T), bool)
    done[np.arange(M), length - 1] = np.concatenate([x["last_done"], y["last_done"]])
    name = src.path.name
    info = DatasetInfo(
        spec=spec,
        tier_names=(str(tier),),
        source_names=(f"{name} x", f"{name} y"),
        recipe="omapl-h5",
        versions=tuple(sorted(library_versions().items())),
        creation_args_json=canonical_json(
            {"import_omapl_h5": {"file": name, "pairs": P, "steps": T}}),
    )
    ds = Dataset(
        obs=both("obs", "entries").astype(np.float32),
        global_state=both("state", "entries").astype(np.float32),
        avail_actions=both("avail", "entries"),
        actions=both("actions", "steps"),
        reward=np.zeros((M, T), np.float32),  # the files store no rewards
        done=done,
        truncated=np.zeros((M, T), bool),
        mask=mask,
        episode_return=np.zeros((M,), np.float32),
        length=length,
        success=np.zeros((M,), bool),
        tier=np.zeros((M,), np.int8),
        source=np.repeat(np.arange(2, dtype=np.int16), P),
        seed=np.full((M,), -1, np.int64),
        expert=np.zeros((M,), bool),
        info=info,
    )
    try:
        validate(ds, spec)
    except DatasetError as e:
        raise DatasetError(f"{src.path}: {e}") from None
    return ds


# -- the preferences on disk -----------------------------------------------------------------


def content_id(dataset: Dataset) -> str:
    """SHA-256 over the trajectories' observations, actions and lengths.
    (Phase 1's `dataset_id` hashes returns, seeds and lengths, which are
    constant or coincide across imported files: they store no rewards.)"""
    parts = (checksum(np.asarray(getattr(dataset, k))) for k in ("obs", "actions", "length"))
    return hashlib.sha256("".join(parts).encode()).hexdigest()


def save_preferences(path: PathLike, dataset: Dataset, prefs: Preferences) -> Path:
    """Write `prefs` beside `dataset` atomically (the dataset file layout:
    `metadata.json` + one `.npy` per array, format `jaxil.preferences`). The
    metadata records the dataset's
    [`content_id`][jaxil.data.omapl_h5.content_id], checked on load."""
    pairs, p = prefs
    arrays = {
        "traj_x": np.asarray(pairs.traj_x, np.int32),
        "traj_y": np.asarray(pairs.traj_y, np.int32),
        "start_x": np.asarray(pairs.start_x, np.int32),
        "start_y": np.asarray(pairs.start_y, np.int32),
        "prefs": np.asarray(p, np.float32),
    }
    meta = {
        "format": PREFERENCES_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "env_id": dataset.info.env_id,
        "dataset_sha256": content_id(dataset),
        "segment_len": pairs.segment_len,
        "num_queries": len(pairs),
        "label_meaning": _LABEL_MEANING,
        "fields": describe_fields(arrays),
    }
    write_archive(path, arrays, meta)
    return Path(path)


def load_preferences(path: PathLike, dataset: Optional[Dataset] = None) -> Preferences:
    """Read what [`save_preferences`][jaxil.data.omapl_h5.save_preferences]
    wrote; with `dataset`, refuse preferences that were made for other
    trajectories."""
    meta, a = read_archive(path, format_name=PREFERENCES_FORMAT, required=_PAIR_FIELDS)
    if dataset is not None and meta.get("dataset_sha256") != content_id(dataset):
        raise DatasetError(
            f"{path}: these preferences index another dataset (recorded on "
            f"{meta.get('env_id')}, content {str(meta.get('dataset_sha256'))[:12]}) than the one "
            f"given ({content_id(dataset)[:12]}); load the dataset file they were imported with"
        )
    pairs = QueryPairs(a["traj_x"], a["traj_y"], a["start_x"], a["start_y"],
                       meta.get("segment_len"))
    return Preferences(pairs, a["prefs"])
