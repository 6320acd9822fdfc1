"""The rules every jaxil dataset satisfies, and
[`validate`][jaxil.data.validate.validate] that checks them.

A dataset holds M padded trajectories of T steps (`T = actions.shape[1]`):

* `obs [M, T+1, N, O]`, `global_state [M, T+1, S]`,
  `avail_actions [M, T+1, N, A]` — entry `t` is what the agents saw before
  acting at step `t`; entry `length` is the observation after the last
  action (what a truncated trajectory bootstraps from).
* `actions [M, T, N]` int32 (discrete) or `[M, T, N, d]` float32
  (continuous), `reward/done/truncated/mask [M, T]`.
* per trajectory: `episode_return, length, success, tier, source, seed,
  expert` (all `[M]`).

Episode boundaries (the decision this module enforces):

* `mask` is a prefix of `length` ones, `1 <= length <= T`, and
  `length <= spec.max_steps`.
* `done` (terminated: no bootstrapping) and `truncated` (time limit:
  bootstrap from `obs[length]`) are False before the last valid step
  `length - 1`; at it, at most one of them is True. Neither means the
  trajectory was *cut* by the collector (a collection horizon, the trailing
  part of an imported stream): learners treat it like a truncation.
* `episode_return` equals the sum of `reward` over valid steps (within a
  float32 accumulation tolerance).
* Padding is zero: `reward/done/truncated/actions` at steps `>= length`
  and `obs/global_state/avail_actions` at entries `> length`.
* Discrete actions lie in `[0, A)` and are allowed by `avail_actions` at
  every valid step; continuous actions lie in the spec's box.
* Float fields hold no NaN or inf.

Every violation raises [`DatasetError`][jaxil.data.validate.DatasetError]
naming the field, the trajectory (and step) and what to do about it. All checks
are vectorised numpy; they cost about as much as one pass over the data.
"""

from __future__ import annotations

import difflib
from typing import Any, Mapping, Optional

import numpy as np

from jaxil.envs.core import EnvSpec
from jaxil.envs.registry import list_envs

# Bump when the meaning or layout of a field changes; files written under
# another version are refused on load.
SCHEMA_VERSION = 1

# Field name -> dtype. `actions` is int32 for discrete spaces and float32 for
# continuous ones (`None` here).
TRAJECTORY_FIELDS: dict[str, Any] = {
    "obs": np.float32,
    "global_state": np.float32,
    "avail_actions": np.bool_,
    "actions": None,
    "reward": np.float32,
    "done": np.bool_,
    "truncated": np.bool_,
    "mask": np.bool_,
}
METADATA_FIELDS: dict[str, Any] = {
    "episode_return": np.float32,
    "length": np.int32,
    "success": np.bool_,
    "tier": np.int8,
    "source": np.int16,
    "seed": np.int64,
    "expert": np.bool_,
}
FIELDS: dict[str, Any] = {**TRAJECTORY_FIELDS, **METADATA_FIELDS}

# |return - sum(reward)| <= RETURN_RTOL * (1 + sum |reward|): float32 sums of
# a few thousand terms stay well inside this.
RETURN_RTOL = 1e-4
# Continuous actions may overshoot the box by this much (float rounding).
BOX_ATOL = 1e-6

_REGENERATE = "regenerate the dataset, or drop the trajectory with dataset.select(...)"


class DatasetError(ValueError):
    """A dataset (in memory or on disk) breaks the schema; the message says
    which field, which trajectory and step, and how to fix it."""


# -- the file's metadata block -----------------------------------------------------

# Every key of `metadata.json` that `jaxil.data.save` writes and
# `jaxil.data.load` reads, with its JSON type. All have been written since
# schema version 1, so a file without one was not written by jaxil or was edited.
METADATA_KEYS: dict[str, type] = {
    "format": str,
    "schema_version": int,
    "env_id": str,
    "spec": dict,
    "tier_names": list,
    "source_names": list,
    "recipe": str,
    "versions": dict,
    "creation_args": dict,
    "num_trajectories": int,
    "num_steps": int,
    "fields": dict,
}
# Env-id families that name data, not a simulator: what the importers record
# when they infer the spec from the file (`vault:<name>` from
# `jaxil.data.import_vault`, `omapl:<stem>` from `jaxil data
# import-omapl --env infer`).
DATA_ONLY_FAMILIES = ("vault", "omapl")

_JSON_TYPE = {str: "string", int: "integer", dict: "object", list: "array"}
_RECREATE = "the file was not written by jaxil.data.save or was edited — re-create it"


def check_metadata(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    """Check a file's `metadata.json` block against the arrays stored with it.

    Every key of `METADATA_KEYS` must be present with its type, `env_id` must
    equal `spec.env_id`, and `num_trajectories` / `num_steps` must equal the
    trajectories in `length` and the steps in `actions`. Raises
    [`DatasetError`][jaxil.data.validate.DatasetError] (the caller adds the
    file name).
    """
    for key, kind in METADATA_KEYS.items():
        if key not in meta:
            raise DatasetError(f"metadata.json has no `{key}`; {_RECREATE}")
        value = meta[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise DatasetError(
                f"metadata.json `{key}` is {value!r} but must be a JSON {_JSON_TYPE[kind]}; "
                f"{_RECREATE}"
            )
    spec_id = meta["spec"].get("env_id")
    if meta["env_id"] != spec_id:
        raise DatasetError(
            f"metadata.json `env_id` is {meta['env_id']!r} but `spec.env_id` is {spec_id!r}; "
            f"they must agree — {_RECREATE}"
        )
    counts = (
        ("num_trajectories", "length", 0, "trajectories"),
        ("num_steps", "actions", 1, "steps"),
    )
    for key, field, axis, what in counts:
        x = arrays.get(field)
        if x is None or np.ndim(x) <= axis:
            continue  # a missing or misshapen array is reported by its own check
        have = int(np.shape(x)[axis])
        if meta[key] != have:
            raise DatasetError(
                f"metadata.json `{key}` is {meta[key]} but the arrays hold {have} {what} "
                f"(`{field}` has shape {tuple(np.shape(x))}); {_RECREATE}, or set "
                f"`{key}` to {have} if only the metadata is wrong"
            )


def check_env_id(env_id: str) -> None:
    """Raise [`DatasetError`][jaxil.data.validate.DatasetError] unless `env_id`
    is registered with [`envs`][jaxil.envs] (membership only: no environment is
    built) or belongs to a data-only family (`DATA_ONLY_FAMILIES`)."""

    if env_id.split(":", 1)[0] in DATA_ONLY_FAMILIES:
        return
    known = list_envs()
    if env_id in known:
        return
    close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise DatasetError(
        f"metadata.json `env_id` {env_id!r} is not a registered environment{hint}; "
        f"`jaxil envs` lists the {len(known)} ids — re-create the dataset on one of them (an "
        f"out-of-tree environment: envs.register it, then jaxil.data.load the file)"
    )


def action_dtype(spec: EnvSpec) -> np.dtype:
    return np.dtype(np.int32 if spec.discrete else np.float32)


def validate(dataset: Any, spec: Optional[EnvSpec] = None) -> None:
    """Check every rule in this module's docstring; raise
    [`DatasetError`][jaxil.data.validate.DatasetError].

    Args:
      dataset: a [`jaxil.data.Dataset`][jaxil.data.format.Dataset] (anything
        with its fields and an `info` carrying the recorded `spec` works).
      spec: the environment the caller will use the data with. Defaults to the
        spec the dataset was recorded with; when given, shapes are checked
        against it and it must equal the recorded one.
    """
    info = getattr(dataset, "info", None)
    recorded = getattr(info, "spec", None)
    if spec is None:
        spec = recorded
    if spec is None:
        raise DatasetError(
            "the dataset carries no environment spec; pass spec=envs.make(env_id).spec"
        )
    arrays = _fields(dataset, spec)
    M, T = _check_shapes(arrays, spec)
    if recorded is not None and recorded != spec:
        _spec_mismatch(recorded, spec)
    if info is not None:
        _check_names(info, arrays)
    _check_lengths(arrays, spec, T)
    _check_finite(arrays, spec)
    _check_padding(arrays, T)
    _check_boundaries(arrays)
    _check_actions(arrays, spec)
    _check_returns(arrays)


# -- fields and dtypes -------------------------------------------------------------


def _fields(dataset: Any, spec: EnvSpec) -> dict[str, np.ndarray]:
    out = {}
    for name, dtype in FIELDS.items():
        x = getattr(dataset, name, None)
        if x is None:
            raise DatasetError(
                f"dataset is missing field `{name}`; every jaxil dataset has "
                f"{', '.join(FIELDS)} — build it with Dataset.from_episodes"
            )
        x = np.asarray(x)
        want = action_dtype(spec) if dtype is None else np.dtype(dtype)
        if x.dtype != want:
            kind = ""
            if name == "actions":
                kind = " (discrete)" if spec.discrete else " (continuous)"
            raise DatasetError(
                f"dataset field `{name}` has dtype {x.dtype} but must be {want.name}"
                f"{kind} for {spec.env_id}; convert it with .astype(np.{want.name})"
            )
        out[name] = x
    return out


# -- shapes ------------------------------------------------------------------------


def _check_shapes(a: dict[str, np.ndarray], spec: EnvSpec) -> tuple[int, int]:
    env = spec.env_id
    n, o, s = spec.num_agents, spec.obs_dim, spec.state_dim
    agents = (n, f"the environment {env} has {n} agents")
    if spec.discrete:
        act_dims = [agents]
        width = (spec.num_actions, f"the environment {env} has {spec.num_actions} actions")
    else:
        d = spec.action.dim
        act_dims = [agents, (d, f"the environment {env} has {d}-dimensional actions")]
        width = (0, f"the environment {env} has continuous actions (no action mask)")

    act = a["actions"]
    want_rank = 2 + len(act_dims)
    if act.ndim != want_rank:
        layout = "[M, T, N]" if spec.discrete else "[M, T, N, dim]"
        raise DatasetError(
            f"dataset field `actions` has shape {act.shape} but {env} needs {layout}"
            f" ({'discrete' if spec.discrete else 'continuous'} actions, {n} agents)"
        )
    _match("actions", act.shape, act_dims, offset=2)
    M, T = act.shape[:2]
    traj = (M, f"`actions` holds {M} trajectories")
    steps = (T, f"`actions` has T={T} steps")
    steps1 = (T + 1, f"`actions` has T={T} steps, so observations need T+1={T + 1} entries")
    layouts = {
        "obs": [traj, steps1, agents, (o, f"the environment {env} has obs_dim {o}")],
        "global_state": [traj, steps1, (s, f"the environment {env} has state_dim {s}")],
        "avail_actions": [traj, steps1, agents, width],
        "reward": [traj, steps],
        "done": [traj, steps],
        "truncated": [traj, steps],
        "mask": [traj, steps],
    }
    for name in METADATA_FIELDS:
        layouts[name] = [traj]
    for name, dims in layouts.items():
        x = a[name]
        if x.ndim != len(dims):
            raise DatasetError(
                f"dataset field `{name}` has shape {x.shape} (rank {x.ndim}) but must "
                f"have rank {len(dims)}: expected {tuple(d for d, _ in dims)}"
            )
        _match(name, x.shape, dims)
    return M, T


def _match(name: str, shape: tuple, dims: list, offset: int = 0) -> None:
    for i, (want, why) in enumerate(dims, start=offset):
        if shape[i] != want:
            raise DatasetError(
                f"dataset field `{name}` has shape {tuple(shape)} but {why} (axis {i} "
                f"should be {want}); regenerate the dataset for this environment or "
                f"load it with the spec it was recorded with"
            )


def _spec_mismatch(recorded: EnvSpec, spec: EnvSpec) -> None:
    r, g = _flat(recorded.to_dict()), _flat(spec.to_dict())
    diffs = [
        f"{k}: {r.get(k)!r} in the dataset vs {g.get(k)!r} given"
        for k in sorted(set(r) | set(g))
        if r.get(k) != g.get(k)
    ]
    raise DatasetError(
        f"dataset was recorded on {recorded.env_id} but the given spec differs ("
        + "; ".join(diffs)
        + "); use the environment the data was recorded with, or pass spec=None"
    )


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# -- per-trajectory metadata ---------------------------------------------------------


def _check_names(info: Any, a: dict[str, np.ndarray]) -> None:
    for field, names_attr, dtype in (
        ("tier", "tier_names", np.int8),
        ("source", "source_names", np.int16),
    ):
        names = tuple(getattr(info, names_attr, ()))
        if len(set(names)) != len(names) or not all(isinstance(x, str) and x for x in names):
            raise DatasetError(
                f"dataset {names_attr} {names!r} must be distinct non-empty strings"
            )
        if len(names) > np.iinfo(dtype).max + 1:
            raise DatasetError(
                f"dataset has {len(names)} {names_attr} but `{field}` ({np.dtype(dtype).name}) "
                f"indexes at most {np.iinfo(dtype).max + 1}"
            )
        idx = a[field]
        bad = (idx < 0) | (idx >= len(names))
        if bad.any():
            m = int(np.flatnonzero(bad)[0])
            raise DatasetError(
                f"dataset field `{field}` of trajectory {m} is {int(idx[m])} but there are "
                f"{len(names)} {names_attr} {names!r}; it must index into them"
            )


def _check_lengths(a: dict[str, np.ndarray], spec: EnvSpec, T: int) -> None:
    length = a["length"]
    bad = (length < 1) | (length > T)
    if bad.any():
        m = int(np.flatnonzero(bad)[0])
        raise DatasetError(
            f"dataset field `length` of trajectory {m} is {int(length[m])} but must be in "
            f"[1, T={T}]; {_REGENERATE}"
        )
    over = length > spec.max_steps
    if over.any():
        m = int(np.flatnonzero(over)[0])
        raise DatasetError(
            f"dataset field `length` of trajectory {m} is {int(length[m])}, longer than the "
            f"time limit max_steps={spec.max_steps} of {spec.env_id}; the data comes from "
            f"another environment configuration — load it with that spec"
        )
    want = np.arange(T)[None, :] < length[:, None]
    bad = a["mask"] != want
    if bad.any():
        m, t = (int(i) for i in np.argwhere(bad)[0])
        raise DatasetError(
            f"dataset field `mask` of trajectory {m} is {bool(a['mask'][m, t])} at step {t} "
            f"but length is {int(length[m])}: mask must be True exactly at steps < length "
            f"(rebuild it as np.arange(T) < length[:, None])"
        )


# -- values ----------------------------------------------------------------------------


def _check_finite(a: dict[str, np.ndarray], spec: EnvSpec) -> None:
    names = ["obs", "global_state", "reward", "episode_return"]
    if not spec.discrete:
        names.append("actions")
    for name in names:
        x = a[name]
        bad = ~np.isfinite(x)
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            where = _where(name, idx)
            raise DatasetError(
                f"dataset field `{name}` is {x[idx]} at {where}: float fields must be "
                f"finite; the environment or policy produced NaN/inf — {_REGENERATE}"
            )


def _where(name: str, idx: tuple) -> str:
    if len(idx) == 1:
        return f"trajectory {idx[0]}"
    rest = f", index {idx[2:]}" if len(idx) > 2 else ""
    return f"trajectory {idx[0]}, step {idx[1]}{rest}"


def _check_padding(a: dict[str, np.ndarray], T: int) -> None:
    length = a["length"][:, None]
    pad_steps = np.arange(T)[None, :] >= length  # [M, T]
    pad_obs = np.arange(T + 1)[None, :] > length  # [M, T+1]
    for name, pad in (
        ("reward", pad_steps),
        ("done", pad_steps),
        ("truncated", pad_steps),
        ("actions", pad_steps),
        ("obs", pad_obs),
        ("global_state", pad_obs),
        ("avail_actions", pad_obs),
    ):
        x = a[name]
        nonzero = np.any(x != 0, axis=tuple(range(2, x.ndim)))
        bad = nonzero & pad
        if bad.any():
            m, t = (int(i) for i in np.argwhere(bad)[0])
            first = "steps >= length" if pad is pad_steps else "entries > length"
            raise DatasetError(
                f"dataset field `{name}` of trajectory {m} is non-zero at padding step {t} "
                f"(length {int(a['length'][m])}); padding ({first}) must be zero — "
                f"zero it, or fix `length` if the trajectory is longer"
            )


def _check_boundaries(a: dict[str, np.ndarray]) -> None:
    length = a["length"]
    M, T = a["done"].shape
    last = np.arange(T)[None, :] == (length[:, None] - 1)
    for name in ("done", "truncated"):
        early = a[name] & ~last
        if early.any():
            m, t = (int(i) for i in np.argwhere(early)[0])
            raise DatasetError(
                f"dataset field `{name}` of trajectory {m} is set at step {t} before the last "
                f"valid step {int(length[m]) - 1}: an episode ends at its last step — split "
                f"the trajectory there or fix `length`"
            )
    both = (a["done"] & a["truncated"]).any(axis=1)
    if both.any():
        m = int(np.flatnonzero(both)[0])
        raise DatasetError(
            f"dataset fields `done` and `truncated` are both set at the last step "
            f"{int(length[m]) - 1} of trajectory {m}: a terminated episode is not truncated "
            f"(set truncated = truncated & ~done)"
        )


def _check_actions(a: dict[str, np.ndarray], spec: EnvSpec) -> None:
    act = a["actions"]
    valid = a["mask"]
    if spec.discrete:
        A = spec.num_actions
        out = ((act < 0) | (act >= A)) & valid[..., None]
        if out.any():
            m, t, i = (int(x) for x in np.argwhere(out)[0])
            raise DatasetError(
                f"dataset field `actions` of trajectory {m}, step {t}, agent {i} is "
                f"{int(act[m, t, i])}, outside [0, {A}) for {spec.env_id}; {_REGENERATE}"
            )
        avail = a["avail_actions"][:, :-1]
        safe = np.clip(act, 0, A - 1)[..., None].astype(np.intp)
        ok = np.take_along_axis(avail, safe, -1)[..., 0]
        illegal = ~ok & valid[..., None]
        if illegal.any():
            m, t, i = (int(x) for x in np.argwhere(illegal)[0])
            legal = np.flatnonzero(avail[m, t, i]).tolist()
            raise DatasetError(
                f"dataset field `actions` of trajectory {m}, step {t}, agent {i} is "
                f"{int(act[m, t, i])}, which `avail_actions` forbids there (legal: {legal}); "
                f"record actions after env.legalize, or {_REGENERATE}"
            )
    else:
        lo, hi = spec.action.low, spec.action.high
        tol = BOX_ATOL * max(1.0, abs(lo), abs(hi))
        out = ((act < lo - tol) | (act > hi + tol)) & valid[..., None, None]
        if out.any():
            m, t, i, j = (int(x) for x in np.argwhere(out)[0])
            raise DatasetError(
                f"dataset field `actions` of trajectory {m}, step {t}, agent {i}, dim {j} is "
                f"{float(act[m, t, i, j])}, outside the box [{lo}, {hi}] of {spec.env_id}; "
                f"clip actions into the box (env.legalize does) or {_REGENERATE}"
            )


def _check_returns(a: dict[str, np.ndarray]) -> None:
    r = np.where(a["mask"], a["reward"], 0.0).astype(np.float64)
    total = r.sum(axis=1)
    tol = RETURN_RTOL * (1.0 + np.abs(r).sum(axis=1))
    bad = np.abs(a["episode_return"].astype(np.float64) - total) > tol
    if bad.any():
        m = int(np.flatnonzero(bad)[0])
        raise DatasetError(
            f"dataset field `episode_return` of trajectory {m} is "
            f"{float(a['episode_return'][m])} but its rewards sum to {total[m]:.6g}; "
            f"set episode_return = (reward * mask).sum(axis=1)"
        )
