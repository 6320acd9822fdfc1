"""OG-MARL / flashbax vault interchange.

An OG-MARL dataset is a flashbax ``Vault``: a directory
``<rel_dir>/<vault_name>/<vault_uid>/`` (OG-MARL: ``vaults/smac_v1/3m.vlt/Good``)
holding

* ``metadata.json`` — ``{"version": 1.2, "structure_shape": {...},
  "structure_dtype": {...}, ...user keys}``: the experience tree with each
  leaf's buffer shape (as a string) and dtype name;
* a tensorstore OCDBT key-value store (``manifest.ocdbt``, ``d/``) with one
  zarr array per leaf, named by its tree path plus a dot
  (``observations.``, ``infos.legals.``), gzip-compressed, shaped
  ``(B, 10**13, ...)`` (an extendable time axis), and a zarr array
  ``vault_index`` = the number of time steps written.

The experience tree (B = 1, one long time axis of concatenated episodes)::

    observations [1, K, N, O]     actions [1, K, N] (or [1, K, N, d])
    rewards      [1, K, N]        terminals / truncations [1, K, N]
    infos: {legals [1, K, N, A], state [1, K, S]}

An episode ends where ``terminals | truncations`` is set (for all agents at
once; asynchronous per-agent endings are refused). Vaults do not store the
observation after an episode's last action: on import it is filled with a
copy of the last one (terminal steps never bootstrap from it; for truncated
ones it is an approximation). Per-agent rewards become the team reward by
their mean (identical team rewards pass through exactly); vaults without
``infos.state`` get the concatenated observations as global state.

:func:`export_vault` writes that layout, with team rewards and episode flags
broadcast over agents (float32, as OG-MARL's released vaults) and cut
trajectories (neither done nor truncated) marked as truncations, so OG-MARL
code reads it as is. Beside ``metadata.json`` it leaves a small
``jaxil_episodes.npz`` (final observations and per-trajectory metadata: tier,
source, seed, expert flag, success, exact episode boundaries), which
:func:`import_vault` uses when present and consistent, so that
``import_vault(export_vault(ds))`` gives back ``ds`` exactly.

Backends: flashbax's own ``Vault`` when it is installed
(``pip install 'jaxil[vault]'``), otherwise the same layout through
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
    """Create a new vault at ``vault_dir`` holding ``exp`` (leaves [1, K, ...])."""
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
    """Write ``dataset`` as an OG-MARL vault at ``<path>/<vault_name>/<vault_uid>``.

    Atomic: the vault is built in a hidden sibling directory and renamed into
    place, so an interrupted export leaves no vault at the destination. With
    ``overwrite`` the old vault is first renamed to a hidden sibling and put
    back if the swap fails (a hard kill between the two renames leaves it at
    ``.<vault_uid>.old-*``). Returns the vault directory.

    Raises:
      FileExistsError: the vault exists and ``overwrite`` is False (flashbax
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
    """Read an OG-MARL / flashbax vault into a validated :class:`Dataset`.

    Args:
      path: the vault directory ``<rel_dir>/<vault_name>`` (OG-MARL:
        ``vaults/smac_v1/3m.vlt``), or the ``<vault_uid>`` directory itself.
      vault_uid: e.g. ``"Good"``; optional when ``path`` holds one vault.
      spec: the environment the data belongs to. Defaults to the spec stored by
        :func:`export_vault`, else one inferred from the shapes (env id
        ``vault:<name>/<uid>``, max_steps = the longest episode).
      tier, source, expert: per-trajectory labels for a plain OG-MARL vault
        (source defaults to ``<vault_name>/<vault_uid>``); a vault written by
        :func:`export_vault` keeps its own.
      reward_reduction: how per-agent rewards become the team reward:
        ``"mean"``, ``"sum"`` or ``"first"`` (agent 0).
      backend: ``"auto"`` (flashbax if installed, else tensorstore),
        ``"flashbax"`` or ``"tensorstore"``.
    """
    backend = _resolve_backend(backend)
    if reward_reduction not in ("mean", "sum", "first"):
        raise ValueError(
            f"reward_reduction must be 'mean', 'sum' or 'first', got {reward_reduction!r}"
        )
    vdir = _vault_dir(path, vault_uid)
    name = f"{vdir.parent.name}/{vdir.name}"
    _, exp = _read_experience(vdir, backend)
    flat = _flatten_streams(exp, vdir)
    K = flat["observations"].shape[0]
    if K == 0:
        raise DatasetError(f"vault {vdir} is empty (vault_index 0)")

    side = _read_sidecar(vdir, flat, K)
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

    info = _info_from(side, spec, flat, length, name, tier, source)
    spec = spec if spec is not None else info.spec
    T = int(side["num_steps"]) if side is not None else max(int(spec.max_steps), int(length.max()))
    T = max(T, int(length.max()))

    m_of_k = np.repeat(np.arange(M), length)
    t_of_k = np.arange(K) - starts[m_of_k]
    if flat["legals"] is None:  # no action mask stored: every action is legal
        width = spec.num_actions if spec.discrete else 0
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


def _flatten_streams(exp: dict, vdir: Path) -> dict[str, np.ndarray]:
    """Merge the B streams of a vault into one time axis [B*K, ...] and derive
    per-step episode-end flags (a stream's last step always ends an episode)."""
    for key in ("observations", "actions", "rewards", "terminals", "truncations"):
        if key not in exp:
            raise DatasetError(
                f"vault {vdir} has no `{key}`; it is not an OG-MARL vault (keys: {sorted(exp)})"
            )
    obs = exp["observations"]
    if obs.ndim != 4:
        raise DatasetError(
            f"vault {vdir}: `observations` has shape {obs.shape}, expected [B, K, N, O]"
        )
    B, K, N = obs.shape[:3]
    infos = exp.get("infos", {}) if isinstance(exp.get("infos"), dict) else {}

    def flat(x, key):
        x = np.asarray(x)
        if x.shape[:2] != (B, K):
            raise DatasetError(
                f"vault {vdir}: `{key}` has shape {x.shape} but `observations` has {obs.shape}"
            )
        return x.reshape((B * K,) + x.shape[2:])

    out = {
        "observations": flat(obs, "observations"),
        "actions": flat(exp["actions"], "actions"),
        "rewards": flat(exp["rewards"], "rewards"),
    }
    if "state" in infos:
        out["state"] = flat(infos["state"], "infos.state")
    else:
        out["state"] = out["observations"].reshape(B * K, -1)
    ends = []
    for key in ("terminals", "truncations"):
        x = flat(exp[key], key) != 0
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
    out["legals"] = flat(infos["legals"], "infos.legals") != 0 if "legals" in infos else None
    return out


def _episode_bounds(flat: dict, vdir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ended = flat["end_terminal"] | flat["end_truncation"]
    boundary = ended | flat["stream_end"]
    stops = np.flatnonzero(boundary) + 1
    starts = np.concatenate([[0], stops[:-1]])
    cut = ~ended[stops - 1]
    return starts.astype(np.int64), stops.astype(np.int64), cut


def _read_sidecar(vdir: Path, flat: dict, K: int) -> Optional[dict]:
    path = vdir / SIDECAR_FILE
    if not path.exists():
        return None
    try:
        meta, arrays = read_archive(path, format_name=SIDECAR_FORMAT, required=_SIDECAR_FIELDS)
    except DatasetError as e:
        warnings.warn(f"ignoring {path}: {e}", stacklevel=3)
        return None
    length = arrays["length"].astype(np.int64)
    stops = np.cumsum(length)
    ended = flat["end_terminal"] | flat["end_truncation"]
    ok = (
        flat["stream_end"].sum() == 1
        and (length >= 1).all()
        and stops[-1] == K
        and set(np.flatnonzero(ended).tolist()) == set((stops - 1).tolist())
    )
    if not ok:
        warnings.warn(
            f"ignoring {path}: its episode boundaries do not match the vault (was the vault "
            f"appended to after export?); reading it as a plain OG-MARL vault",
            stacklevel=3,
        )
        return None
    return {**arrays, "meta": meta, "num_steps": meta.get("num_steps", int(length.max()))}


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

