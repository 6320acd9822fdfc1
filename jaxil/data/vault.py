"""OG-MARL / flashbax vault interchange.

An OG-MARL dataset is a flashbax `Vault`: a directory
`<rel_dir>/<vault_name>/<vault_uid>/` (OG-MARL: `vaults/smac_v1/3m.vlt/Good`)
holding

* `metadata.json` — `{"version": 1.2, "structure_shape": {...},
  "structure_dtype": {...}, ...user keys}`: the experience tree with each
  leaf's buffer shape (as a string) and dtype name;
* a tensorstore OCDBT key-value store (`manifest.ocdbt`, `d/`) with one
  zarr array per leaf, named by its tree path plus a dot
  (`observations.`, `infos.legals.`), gzip-compressed, shaped
  `(B, 10**13, ...)` (an extendable time axis), and a zarr array
  `vault_index` = the number of time steps written.

The experience tree (B = 1, one long time axis of concatenated episodes):

```text
observations [1, K, N, O]     actions [1, K, N] (or [1, K, N, d])
rewards      [1, K, N]        terminals / truncations [1, K, N]
infos: {legals [1, K, N, A], state [1, K, S]}
```

An episode ends where `terminals | truncations` is set (for all agents at
once; asynchronous per-agent endings are refused). Steps after a stream's
last episode end are an unfinished episode and become one cut trajectory
(neither done nor truncated); a vault in which no step ends an episode is
refused, since it cannot be told apart from one whose episode ends were lost.
Vaults do not store the observation after an episode's last action: on
import it is filled with a copy of the last one (terminal steps never
bootstrap from it; for truncated ones it is an approximation). Per-agent
rewards become the team reward by their mean (identical team rewards pass
through exactly); vaults without `infos.state` get the concatenated
observations as global state.

Import checks every field's shape against the others (B, K and N shared by
all fields, the `infos.legals` width covering every action taken) and
against the environment's spec (the one given, else the one stored with the
vault), and names the vault, the field, the expected and the actual shape.

[`export_vault`][jaxil.data.vault.export_vault] writes that layout, with team
rewards and episode flags broadcast over agents (float32, as OG-MARL's released
vaults) and cut trajectories (neither done nor truncated) marked as
truncations, so OG-MARL code reads it as is. The environment's spec is stored
in `metadata.json` (user key `jaxil.spec`); beside it a small
`jaxil_episodes.npz` holds final observations and per-trajectory metadata
(tier, source, seed, expert flag, success, exact episode boundaries).
[`import_vault`][jaxil.data.vault.import_vault] uses the stored spec, and the
episode file when present and consistent, so that
`import_vault(export_vault(ds))` gives back `ds` exactly; a vault whose episode
file no longer matches (appended to after export) keeps its spec.

Backends: flashbax's own `Vault` when it is installed
(`pip install 'jaxil[vault]'`), otherwise the same layout through
tensorstore directly (a dependency of orbax-checkpoint). Both read each
other's vaults.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import warnings
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from jaxil.envs.core import ContinuousActions, DiscreteActions, EnvSpec
from jaxil.data.format import (
    Dataset,
    DatasetInfo,
    canonical_json,
    describe_fields,
    library_versions,
    read_archive,
    write_archive,
)
from jaxil.data.validate import SCHEMA_VERSION, DatasetError, validate
from jaxil.runs.io_atomic import atomic_dir

PathLike = Union[str, os.PathLike]

VAULT_VERSION = 1.2  # flashbax.vault.vault.VERSION this layout follows
TIME_AXIS_MAX_LENGTH = int(10e12)
COMPRESSION = {"id": "gzip", "level": 5}
METADATA_FILE = "metadata.json"
SIDECAR_FILE = "jaxil_episodes.npz"
SIDECAR_FORMAT = "jaxil.vault_episodes"
INSTALL_HINT = "pip install 'jaxil[vault]'"
BACKENDS = ("auto", "flashbax", "tensorstore")

_PER_TRAJECTORY = ("episode_return", "success", "tier", "source", "seed", "expert")
_SIDECAR_FIELDS = (
    "length", "cut", "final_obs", "final_global_state", "final_avail", *_PER_TRAJECTORY,
)


# -- backends -----------------------------------------------------------------------


def _resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend in ("auto", "flashbax"):
        try:
            import flashbax.vault  # noqa: F401
            return "flashbax"
        except ImportError:
            if backend == "flashbax":
                raise ImportError(
                    f"backend='flashbax' needs flashbax, which is not installed: {INSTALL_HINT}"
                ) from None
    try:
        import tensorstore  # noqa: F401
    except ImportError:
        raise ImportError(
            f"reading or writing OG-MARL vaults needs flashbax (or tensorstore): {INSTALL_HINT}"
        ) from None
    return "tensorstore"


def _leaf_name(keys: tuple[str, ...]) -> str:
    # flashbax's _path_to_ds_name: every key followed by a dot.
    return "".join(f"{k}." for k in keys)


def _leaves(tree: dict, prefix: tuple[str, ...] = ()):
    for k in sorted(tree):
        v = tree[k]
        if isinstance(v, dict):
            yield from _leaves(v, prefix + (k,))
        else:
            yield prefix + (k,), v


def _set(tree: dict, keys: tuple[str, ...], value: Any) -> None:
    for k in keys[:-1]:
        tree = tree.setdefault(k, {})
    tree[keys[-1]] = value


def _ts_spec(vault_dir: Path, name: str) -> dict:
    return {
        "driver": "zarr",
        "kvstore": {"driver": "ocdbt", "base": f"file://{vault_dir}", "path": name},
    }


def _read_experience(vault_dir: Path, backend: str) -> tuple[dict, dict]:
    """(metadata, experience tree of numpy arrays [B, K, ...])."""
    try:
        meta = json.loads((vault_dir / METADATA_FILE).read_text())
    except (OSError, ValueError) as e:
        raise DatasetError(
            f"vault {vault_dir}: cannot read {METADATA_FILE} ({e}); the vault is "
            f"incomplete or corrupt"
        ) from None
    version = meta.get("version")
    if not isinstance(version, (int, float)) or int(version) != int(VAULT_VERSION):
        raise DatasetError(
            f"vault {vault_dir} has layout version {version!r}; jaxil reads flashbax "
            f"vault version {int(VAULT_VERSION)}.x"
        )
    if not isinstance(meta.get("structure_shape"), dict):
        raise DatasetError(f"vault {vault_dir}: {METADATA_FILE} has no experience structure")
    try:
        if backend == "flashbax":
            import jax
            from flashbax.vault import Vault

            with contextlib.redirect_stdout(io.StringIO()):
                v = Vault(
                    vault_name=vault_dir.parent.name,
                    rel_dir=str(vault_dir.parent.parent),
                    vault_uid=vault_dir.name,
                )
                exp = v.read().experience
            exp = jax.tree.map(np.asarray, exp)
        else:
            import tensorstore as ts

            ctx = ts.Context()
            index = ts.open(_ts_spec(vault_dir, "vault_index"), context=ctx, open=True).result()
            k = int(index.read().result()[0])
            exp = {}
            for keys, _ in _leaves(meta["structure_shape"]):
                ds = ts.open(_ts_spec(vault_dir, _leaf_name(keys)), context=ctx, open=True).result()
                _set(exp, keys, np.asarray(ds[:, :k].read().result()))
    except DatasetError:
        raise
    except Exception as e:  # tensorstore/flashbax raise many types on damaged stores
        raise DatasetError(
            f"vault {vault_dir} could not be read ({type(e).__name__}: {e}); it is "
            f"incomplete or corrupt — re-download or re-export it"
        ) from None
    return meta, exp


def _write_experience(vault_dir: Path, exp: dict, user_meta: dict, backend: str) -> None:
    """Create a new vault at `vault_dir` holding `exp` (leaves [1, K, ...])."""
    vault_dir = Path(vault_dir).absolute()  # tensorstore's file:// URLs need absolute paths
    k = int(next(iter(_leaves(exp)))[1].shape[1])
    if backend == "flashbax":
        import jax.numpy as jnp
        from flashbax.buffers.trajectory_buffer import TrajectoryBufferState
        from flashbax.vault import Vault

        state = TrajectoryBufferState(
            experience=exp, current_index=jnp.asarray(k), is_full=jnp.asarray(False)
        )
        with contextlib.redirect_stdout(io.StringIO()):
            v = Vault(
                vault_name=vault_dir.parent.name,
                experience_structure=exp,
                rel_dir=str(vault_dir.parent.parent),
                vault_uid=vault_dir.name,
                metadata=user_meta,
            )
            written = v.write(state, source_interval=(0, k))
        if written != k:
            raise RuntimeError(f"flashbax wrote {written} of {k} steps to {vault_dir}")
        return
    import tensorstore as ts

    vault_dir.mkdir(parents=True)
    shapes, dtypes = {}, {}
    for keys, x in _leaves(exp):
        _set(shapes, keys, str(tuple(int(d) for d in x.shape)))
        _set(dtypes, keys, np.dtype(x.dtype).name)
    meta = {
        "version": VAULT_VERSION,
        "structure_shape": shapes,
        "structure_dtype": dtypes,
        **user_meta,
    }
    (vault_dir / METADATA_FILE).write_text(json.dumps(meta))
    ctx = ts.Context()
    for keys, x in _leaves(exp):
        spec = _ts_spec(vault_dir, _leaf_name(keys))
        spec["metadata"] = {"compressor": dict(COMPRESSION)}
        ds = ts.open(
            spec,
            shape=(x.shape[0], TIME_AXIS_MAX_LENGTH, *x.shape[2:]),
            dtype=np.dtype(x.dtype).name,
            create=True,
            context=ctx,
        ).result()
        ds[:, 0:k].write(x).result()
    index = ts.open(
        _ts_spec(vault_dir, "vault_index"), dtype="int32", shape=(1,), create=True, context=ctx
    ).result()
    index.write(np.asarray([k], np.int32)).result()


# -- export -------------------------------------------------------------------------


def export_vault(
    dataset: Dataset,
    path: PathLike,
    vault_name: str,
    vault_uid: str,
    *,
    overwrite: bool = False,
    backend: str = "auto",
) -> Path:
    """Write `dataset` as an OG-MARL vault at `<path>/<vault_name>/<vault_uid>`.

    Atomic: the vault is built in a hidden sibling directory and renamed into
    place, so an interrupted export leaves no vault at the destination. With
    `overwrite` the old vault is first renamed to a hidden sibling and put
    back if the swap fails (a hard kill between the two renames leaves it at
    `.<vault_uid>.old-*`). Returns the vault directory.

    Raises:
      FileExistsError: the vault exists and `overwrite` is False (flashbax
        would silently append to it).
      ImportError: neither flashbax nor tensorstore is available.
    """
    backend = _resolve_backend(backend)
    validate(dataset)
    spec = dataset.spec
    if dataset.num_transitions == 0:
        raise ValueError("cannot export an empty dataset to a vault")
    for name in (vault_name, vault_uid):
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"vault names must be plain, non-hidden directory names, got {name!r}")
    a = dataset.arrays()
    n = spec.num_agents
    traj, step = np.nonzero(a["mask"])
    length = a["length"]
    last = step == length[traj] - 1
    cut = last & ~a["done"][traj, step] & ~a["truncated"][traj, step]

    def per_agent(x):
        return np.repeat(x.astype(np.float32)[:, None], n, axis=1)

    exp = {
        "observations": a["obs"][traj, step],
        "actions": a["actions"][traj, step],
        "rewards": per_agent(a["reward"][traj, step]),
        "terminals": per_agent(a["done"][traj, step]),
        "truncations": per_agent(a["truncated"][traj, step] | cut),
        "infos": {"state": a["global_state"][traj, step]},
    }
    if spec.discrete:
        exp["infos"]["legals"] = a["avail_actions"][traj, step].astype(np.float32)
    exp = _map(lambda x: np.ascontiguousarray(x)[None], exp)

    m = np.arange(len(length))
    sidecar = {
        "length": length,
        "cut": ~(a["done"] | a["truncated"]).any(axis=1),
        "final_obs": a["obs"][m, length],
        "final_global_state": a["global_state"][m, length],
        "final_avail": a["avail_actions"][m, length],
        **{k: a[k] for k in _PER_TRAJECTORY},
    }
    side_meta = {
        "format": SIDECAR_FORMAT,
        "schema_version": SCHEMA_VERSION,
        **dataset.info.to_dict(),
        "num_trajectories": len(length),
        "num_steps": dataset.num_steps,
        "fields": describe_fields(sidecar),
    }
    user_meta = {
        "jaxil": {
            "format": "jaxil.vault",
            "schema_version": SCHEMA_VERSION,
            "env_id": spec.env_id,
            "spec": spec.to_dict(),
            "num_trajectories": len(length),
            "episodes_file": SIDECAR_FILE,
        }
    }

    parent = Path(path) / vault_name
    target = parent / vault_uid
    if target.exists() and not overwrite:
        raise FileExistsError(
            f"vault {target} already exists; pass overwrite=True or choose another vault_uid"
        )
    with atomic_dir(target) as tmp:
        _write_experience(tmp, exp, user_meta, backend)
        write_archive(tmp / SIDECAR_FILE, sidecar, side_meta)
    return target


def _map(fn, tree):
    return {k: _map(fn, v) if isinstance(v, dict) else fn(v) for k, v in tree.items()}


# -- import -------------------------------------------------------------------------


def _vault_dir(path: PathLike, vault_uid: Optional[str]) -> Path:
    path = Path(path)
    if vault_uid is not None:
        d = path / vault_uid
        if not (d / METADATA_FILE).exists():
            raise FileNotFoundError(
                f"no vault {vault_uid!r} in {path} (missing {d / METADATA_FILE})"
            )
        return d.resolve()
    if (path / METADATA_FILE).exists():
        return path.resolve()
    uids = []
    if path.is_dir():
        uids = sorted(p.name for p in path.iterdir() if (p / METADATA_FILE).exists())
    if not uids:
        raise FileNotFoundError(
            f"no OG-MARL vault at {path}: expected {path}/<vault_uid>/{METADATA_FILE}"
        )
    if len(uids) > 1:
        raise ValueError(f"{path} holds several vaults {uids}; pass vault_uid=one of them")
    return (path / uids[0]).resolve()


def import_vault(
    path: PathLike,
    vault_uid: Optional[str] = None,
    spec: Optional[EnvSpec] = None,
    *,
    tier: str = "vault",
    source: Optional[str] = None,
    expert: bool = False,
    reward_reduction: str = "mean",
    backend: str = "auto",
) -> Dataset:
    """Read an OG-MARL / flashbax vault into a validated
    [`Dataset`][jaxil.data.format.Dataset].

    Args:
      path: the vault directory `<rel_dir>/<vault_name>` (OG-MARL:
        `vaults/smac_v1/3m.vlt`), or the `<vault_uid>` directory itself.
      vault_uid: e.g. `"Good"`; optional when `path` holds one vault.
      spec: the environment the data belongs to. Defaults to the spec stored by
        [`export_vault`][jaxil.data.vault.export_vault] (`metadata.json`, else
        `jaxil_episodes.npz`), else one inferred from the shapes (env id
        `vault:<name>/<uid>`, max_steps = the longest episode). The vault's
        fields must fit it.
      tier, source, expert: per-trajectory labels for a plain OG-MARL vault
        (source defaults to `<vault_name>/<vault_uid>`); a vault written by
        [`export_vault`][jaxil.data.vault.export_vault] keeps its own.
      reward_reduction: how per-agent rewards become the team reward:
        `"mean"`, `"sum"` or `"first"` (agent 0).
      backend: `"auto"` (flashbax if installed, else tensorstore),
        `"flashbax"` or `"tensorstore"`.

    Raises:
      FileNotFoundError: no vault at `path`.
      DatasetError: (a ValueError) the vault cannot be read, a field's shape
        disagrees with another field's or with the spec, no step ends an
        episode, or the data breaks the dataset schema; the one-line message
        names the vault, the field, the expected and actual shape, and the fix.
    """
    backend = _resolve_backend(backend)
    if reward_reduction not in ("mean", "sum", "first"):
        raise ValueError(
            f"reward_reduction must be 'mean', 'sum' or 'first', got {reward_reduction!r}"
        )
    vdir = _vault_dir(path, vault_uid)
    name = f"{vdir.parent.name}/{vdir.name}"
    meta, exp = _read_experience(vdir, backend)
    side = _load_sidecar(vdir)
    stored = _stored_spec(vdir, meta, side, required=spec is None)
    _check_fields(exp, vdir, spec if spec is not None else stored, given=spec is not None)
    flat = _flatten_streams(exp, vdir)
    K = flat["observations"].shape[0]
    if K == 0:
        raise DatasetError(f"vault {vdir} is empty (vault_index 0)")
    if not (flat["end_terminal"] | flat["end_truncation"]).any():
        raise DatasetError(
            f"vault {vdir}: no step of `terminals` or `truncations` is set, so none of its "
            f"{K} steps ends an episode; a vault must mark each episode's last step (terminals "
            f"where it ended, truncations where it was cut): re-export it with its episode ends"
        )

    if side is not None and not _sidecar_matches(side, meta, flat, K, vdir):
        side = None
    if side is not None:
        length = side["length"].astype(np.int64)
        stops = np.cumsum(length)
        starts = stops - length
        cut = side["cut"]
    else:
        starts, stops, cut = _episode_bounds(flat, vdir)
        length = stops - starts
    M = len(length)
    last = stops - 1
    term = flat["end_terminal"][last] & ~cut
    trunc = flat["end_truncation"][last] & ~term & ~cut

    info = _info_from(side, spec if spec is not None else stored, flat, length, name, tier, source)
    spec = spec if spec is not None else info.spec
    T = int(side["num_steps"]) if side is not None else max(int(spec.max_steps), int(length.max()))
    T = max(T, int(length.max()))

    m_of_k = np.repeat(np.arange(M), length)
    t_of_k = np.arange(K) - starts[m_of_k]
    if flat["legals"] is None:  # no action mask stored: every action is legal
        width = side["final_avail"].shape[-1] if side is not None else spec.num_actions
        flat["legals"] = np.ones(flat["observations"].shape[:2] + (width,), bool)

    def steps(x, extra_entry):
        out = np.zeros((M, T + int(extra_entry)) + x.shape[1:], x.dtype)
        out[m_of_k, t_of_k] = x
        return out

    obs = steps(flat["observations"], True)
    state = steps(flat["state"], True)
    avail = steps(flat["legals"], True)
    m = np.arange(M)
    if side is not None:
        obs[m, length] = side["final_obs"]
        state[m, length] = side["final_global_state"]
        avail[m, length] = side["final_avail"]
    else:  # vaults do not store the observation after the last action
        obs[m, length] = flat["observations"][last]
        state[m, length] = flat["state"][last]
        avail[m, length] = flat["legals"][last]

    rewards = flat["rewards"]
    if rewards.ndim == 2:
        if reward_reduction == "first":
            rewards = rewards[:, 0]
        elif reward_reduction == "sum":
            rewards = rewards.astype(np.float64).sum(axis=1)
        else:
            rewards = rewards.astype(np.float64).mean(axis=1)
    reward = steps(rewards.astype(np.float32), False)
    done = np.zeros((M, T), bool)
    truncated = np.zeros((M, T), bool)
    done[m, length - 1] = term
    truncated[m, length - 1] = trunc
    mask = np.arange(T)[None, :] < length[:, None]

    if side is not None:
        per_traj = {k: side[k] for k in _PER_TRAJECTORY}
    else:
        per_traj = dict(
            episode_return=reward.astype(np.float64).sum(axis=1).astype(np.float32),
            success=np.zeros((M,), bool),
            tier=np.zeros((M,), np.int8),
            source=np.zeros((M,), np.int16),
            seed=np.full((M,), -1, np.int64),
            expert=np.full((M,), bool(expert)),
        )
    if spec.discrete:
        actions = flat["actions"]
        if not np.issubdtype(actions.dtype, np.integer):
            if not np.all(np.isfinite(actions)) or not np.all(actions == np.round(actions)):
                raise DatasetError(f"vault {vdir}: discrete `actions` hold non-integer values")
        actions = actions.astype(np.int32)
    else:
        actions = flat["actions"].astype(np.float32)
    ds = Dataset(
        obs=obs.astype(np.float32),
        global_state=state.astype(np.float32),
        avail_actions=avail,
        actions=steps(actions, False),
        reward=reward,
        done=done,
        truncated=truncated,
        mask=mask,
        length=length.astype(np.int32),
        info=info,
        **per_traj,
    )
    try:
        validate(ds, spec)
    except DatasetError as e:
        raise DatasetError(f"vault {vdir}: {e}") from None
    return ds


_AXIS_NOUNS = {
    "B": "streams", "K": "time steps", "N": "agents", "O": "observation features",
    "S": "state features", "A": "actions", "d": "action dimensions",
}


def _count(size: int, axis: str) -> str:
    noun = _AXIS_NOUNS[axis]
    return f"{size} {noun if size != 1 else noun[:-1]}"


def _check_fields(exp: dict, vdir: Path, spec: EnvSpec | None, given: bool) -> None:
    """Check the experience tree's layout before anything is read from it.

    Every field must have its layout (`observations [B, K, N, O]`,
    `actions [B, K, N]` or `[B, K, N, d]`, `rewards` / `terminals` /
    `truncations [B, K, N]` or `[B, K]`, `infos.legals [B, K, N, A]`,
    `infos.state [B, K, S]`), every named axis must have one size across the
    fields, and N, O, S, A and d must be `spec`'s (`given` by the caller,
    else stored with the vault). Without a spec the `infos.legals` width is
    the number of actions, so it must cover every action taken.

    Raises:
      DatasetError: one line naming the vault, the field, its shape, the
        expected shape, why, and the fix.
    """
    for key in ("observations", "actions", "rewards", "terminals", "truncations"):
        if key not in exp:
            raise DatasetError(
                f"vault {vdir} has no `{key}`; it is not an OG-MARL vault (keys: {sorted(exp)})"
            )
    infos = exp["infos"] if isinstance(exp.get("infos"), dict) else {}
    fields = {k: np.asarray(exp[k]) for k in ("observations", "actions", "rewards",
                                             "terminals", "truncations")}
    fields.update({f"infos.{k}": np.asarray(infos[k]) for k in ("legals", "state") if k in infos})
    actions = fields["actions"]
    discrete = spec.discrete if spec is not None else actions.ndim == 3

    # axis name -> (size, why it must be that size, what to do otherwise)
    sizes: dict[str, tuple[int, str, str]] = {}
    if spec is not None:
        env = f"the environment {spec.env_id}"
        if given:
            fix = "import the vault with the spec of the environment it was recorded on"
        else:
            env += " (the spec stored with the vault)"
            fix = ("the vault's arrays do not match the spec stored with it: re-export the "
                   "vault, or import it with the spec (--env) of the environment it was "
                   "recorded on")
        dims = {"N": spec.num_agents, "O": spec.obs_dim, "S": spec.state_dim}
        if discrete:
            dims["A"] = spec.num_actions
        else:
            dims["d"] = spec.action.dim
        for axis, size in dims.items():
            sizes[axis] = (size, f"{env} has {_count(size, axis)}", fix)
        if not discrete:
            sizes["A"] = (0, f"{env} has continuous actions, which take no legal-action mask",
                          "drop `infos.legals` from the vault, or " + fix)
    elif not discrete:
        sizes["A"] = (0, "`actions` is [B, K, N, d]: continuous actions take no legal-action mask",
                      "drop `infos.legals`, or store discrete actions as [B, K, N]")
    flag_layouts = (("B", "K", "N"), ("B", "K"))
    layouts = {
        "observations": (("B", "K", "N", "O"),),
        "actions": (("B", "K", "N"),) if discrete else (("B", "K", "N", "d"),),
        "rewards": flag_layouts,
        "terminals": flag_layouts,
        "truncations": flag_layouts,
        "infos.legals": (("B", "K", "N", "A"),),
        "infos.state": (("B", "K", "S"),),
    }
    for key, x in fields.items():
        names = next((n for n in layouts[key] if len(n) == x.ndim), None)
        if names is None:
            wanted = " or ".join("[" + ", ".join(n) + "]" for n in layouts[key])
            why = ""
            if key == "actions" and spec is not None:
                kind = "discrete" if discrete else "continuous"
                why = f" for the {kind} actions of the environment {spec.env_id}"
            elif key == "actions":
                wanted = "[B, K, N] (discrete) or [B, K, N, d] (continuous)"
            raise DatasetError(
                f"vault {vdir}: `{key}` has shape {x.shape} (rank {x.ndim}), expected "
                f"{wanted}{why}; the vault is corrupt or not an OG-MARL vault: re-export it"
            )
        for axis, name in enumerate(names):
            sizes.setdefault(name, (
                x.shape[axis], f"`{key}` has {_count(x.shape[axis], name)}",
                "the vault's fields disagree: re-export it",
            ))
        expected = tuple(sizes[name][0] for name in names)
        if x.shape != expected:
            name = next(n for a, n in enumerate(names) if x.shape[a] != sizes[n][0])
            _, why, fix = sizes[name]
            raise DatasetError(
                f"vault {vdir}: `{key}` has shape {x.shape} but {why} (expected {expected} "
                f"[{', '.join(names)}]); {fix}"
            )
    legals = fields.get("infos.legals")
    if spec is None and discrete and legals is not None and actions.size:
        hi = np.max(actions)
        if np.isfinite(hi) and hi >= legals.shape[-1]:
            raise DatasetError(
                f"vault {vdir}: `actions` reach action {int(hi)} but `infos.legals` has shape "
                f"{legals.shape}, expected a width of at least {int(hi) + 1}: its width is the "
                f"number of actions; re-export the vault, or import it with the spec (--env) "
                f"of the environment it was recorded on"
            )


def _flatten_streams(exp: dict, vdir: Path) -> dict[str, np.ndarray]:
    """Merge the B streams of a vault into one time axis [B*K, ...] and derive
    per-step episode-end flags (a stream's last step always ends an episode).
    The fields' shapes are checked by `_check_fields` first."""
    obs = exp["observations"]
    B, K, N = obs.shape[:3]
    infos = exp["infos"] if isinstance(exp.get("infos"), dict) else {}

    def flat(x):
        x = np.asarray(x)
        return x.reshape((B * K,) + x.shape[2:])

    out = {
        "observations": flat(obs),
        "actions": flat(exp["actions"]),
        "rewards": flat(exp["rewards"]),
    }
    if "state" in infos:
        out["state"] = flat(infos["state"])
    else:
        out["state"] = out["observations"].reshape(B * K, -1)
    ends = []
    for key in ("terminals", "truncations"):
        x = flat(exp[key]) != 0
        if x.ndim == 1:
            x = np.repeat(x[:, None], N, axis=1)
        some, every = x.any(axis=1), x.all(axis=1)
        if (some & ~every).any():
            k = int(np.flatnonzero(some & ~every)[0])
            raise DatasetError(
                f"vault {vdir}: `{key}` at time step {k} is set for agents "
                f"{np.flatnonzero(x[k]).tolist()} but not for the others; jaxil datasets "
                f"need team-level episode ends"
            )
        ends.append(every)
    out["end_terminal"], out["end_truncation"] = ends
    out["stream_end"] = (np.arange(B * K) % K) == K - 1
    out["legals"] = flat(infos["legals"]) != 0 if "legals" in infos else None
    return out


def _episode_bounds(flat: dict, vdir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ended = flat["end_terminal"] | flat["end_truncation"]
    boundary = ended | flat["stream_end"]
    stops = np.flatnonzero(boundary) + 1
    starts = np.concatenate([[0], stops[:-1]])
    cut = ~ended[stops - 1]
    return starts.astype(np.int64), stops.astype(np.int64), cut


def _load_sidecar(vdir: Path) -> dict | None:
    """The episode file written by
    [`export_vault`][jaxil.data.vault.export_vault] (arrays, `meta` and
    `num_steps`), or None when absent or unreadable (with a warning)."""
    path = vdir / SIDECAR_FILE
    if not path.exists():
        return None
    try:
        meta, arrays = read_archive(path, format_name=SIDECAR_FORMAT, required=_SIDECAR_FIELDS)
    except DatasetError as e:
        warnings.warn(f"ignoring {path}: {e}", stacklevel=3)
        return None
    length = arrays["length"]
    longest = int(length.max()) if length.size else 0
    return {**arrays, "meta": meta, "num_steps": meta.get("num_steps", longest)}


def _stored_spec(vdir: Path, meta: dict, side: dict | None, required: bool
                 ) -> EnvSpec | None:
    """The spec [`export_vault`][jaxil.data.vault.export_vault] stored:
    `metadata.json`'s `jaxil.spec`, else the episode file's. An unreadable one
    is an error when `required` (no spec was given), else ignored."""
    jaxil = meta.get("jaxil") if isinstance(meta.get("jaxil"), dict) else {}
    if jaxil.get("spec") is not None:
        where, d = f"{METADATA_FILE} (jaxil.spec)", jaxil["spec"]
    elif side is not None and side["meta"].get("spec") is not None:
        where, d = SIDECAR_FILE, side["meta"]["spec"]
    else:
        return None
    try:
        return EnvSpec.from_dict(d)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        if not required:
            return None
        raise DatasetError(
            f"vault {vdir}: the spec in {where} is unreadable ({type(e).__name__}: {e}); "
            f"re-export the vault, or import it with the spec (--env) of the environment it "
            f"was recorded on"
        ) from None


def _sidecar_matches(side: dict, meta: dict, flat: dict, K: int, vdir: Path) -> bool:
    """Whether the episode file still describes the vault: the same episode
    boundaries, final entries shaped like the vault's fields, per-trajectory
    arrays of one length, the spec of `metadata.json`. Warns when not."""
    length = side["length"].astype(np.int64)
    M = len(length)
    stops = np.cumsum(length)
    ended = flat["end_terminal"] | flat["end_truncation"]
    problem = None
    if not (
        flat["stream_end"].sum() == 1
        and length.ndim == 1
        and M >= 1
        and (length >= 1).all()
        and stops[-1] == K
        and set(np.flatnonzero(ended).tolist()) == set((stops - 1).tolist())
    ):
        problem = ("its episode boundaries do not match the vault (was the vault appended to "
                   "after export?)")
    else:
        N = flat["observations"].shape[1]
        avail = side["final_avail"]
        expected = {
            **{k: (M,) for k in ("cut", *_PER_TRAJECTORY)},
            "final_obs": (M,) + flat["observations"].shape[1:],
            "final_global_state": (M,) + flat["state"].shape[1:],
            "final_avail": ((M,) + flat["legals"].shape[1:] if flat["legals"] is not None
                            else (M, N, avail.shape[-1] if avail.ndim == 3 else -1)),
        }
        for key, shape in expected.items():
            if side[key].shape != shape:
                problem = (f"its `{key}` has shape {side[key].shape} but the vault's fields "
                           f"need {shape}")
                break
    jaxil = meta.get("jaxil") if isinstance(meta.get("jaxil"), dict) else {}
    stored = jaxil.get("spec")
    if problem is None and stored is not None and side["meta"].get("spec") != stored:
        problem = f"its spec differs from the one in {METADATA_FILE}"
    if problem is not None:
        warnings.warn(
            f"ignoring {vdir / SIDECAR_FILE}: {problem}; reading it as a plain OG-MARL vault",
            stacklevel=3,
        )
        return False
    return True


def _info_from(side, spec, flat, length, name, tier, source) -> DatasetInfo:
    if side is not None:
        try:
            return DatasetInfo.from_dict(side["meta"])
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(
                f"vault {name}: {SIDECAR_FILE} has a bad dataset description ({e})"
            ) from None
    if spec is None:
        spec = _infer_spec(flat, length, name)
    return DatasetInfo(
        spec=spec,
        tier_names=(tier,),
        source_names=(source or name,),
        recipe="og-marl-vault",
        versions=tuple(sorted(library_versions().items())),
        creation_args_json=canonical_json({"import_vault": name}),
    )


def _infer_spec(flat: dict, length: np.ndarray, name: str) -> EnvSpec:
    obs, actions = flat["observations"], flat["actions"]
    n, o = obs.shape[1:]
    if actions.ndim == 2:
        legals = flat["legals"]
        width = legals.shape[-1] if legals is not None else int(np.max(actions)) + 1
        action = DiscreteActions(num_actions=int(width))
    elif actions.ndim == 3:
        lo = float(min(-1.0, np.min(actions)))
        hi = float(max(1.0, np.max(actions)))
        action = ContinuousActions(dim=int(actions.shape[-1]), low=lo, high=hi)
    else:
        raise DatasetError(
            f"vault {name}: `actions` has per-step shape {actions.shape[1:]}, "
            f"expected [N] or [N, d]"
        )
    return EnvSpec(
        env_id=f"vault:{name}",
        num_agents=int(n),
        obs_dim=int(o),
        state_dim=int(flat["state"].shape[-1]),
        action=action,
        max_steps=int(length.max()),
        has_win=False,
    )

