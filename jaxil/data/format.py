"""The offline dataset: M padded trajectories plus their provenance.

In memory a [`Dataset`][jaxil.data.format.Dataset] is a pytree of numpy arrays
(see [`jaxil.data.validate`][jaxil.data.validate] for every field, its dtype
and the episode boundary rules) with a static
[`DatasetInfo`][jaxil.data.format.DatasetInfo] (environment spec, tier and
source names, recipe, library versions, creation arguments).

On disk a dataset is ONE uncompressed zip file in the `.npz` layout that
`np.load` also reads: a `metadata.json` member followed by one `.npy`
member per field. Why this format:

* Fast load. Members are stored uncompressed, so
  [`load`][jaxil.data.format.load] reads each field with one `readinto`
  straight into its destination array (no decompression, no per-chunk copies);
  verifying the SHA-256 checksums costs more than the read itself. Observations
  are float noise to a compressor anyway.
* Atomic. One file can be written to a temporary sibling, fsynced and moved
  over the destination with `os.replace`: a reader sees the old file or the new
  one, never a half-written one, and an interrupted write leaves at most a
  hidden `.<name>.*.tmp` file that [`load`][jaxil.data.format.load] never picks
  up and the next write to the same path removes
  ([`jaxil.runs.io_atomic`][jaxil.runs.io_atomic]). A directory of `.npy` files
  cannot replace an existing directory atomically.
* Deterministic. Members are written in a fixed order with a fixed zip
  timestamp and attributes, and `metadata.json` has sorted keys and no
  creation time, so the same content gives byte-identical files (the basis of
  "same seed, same dataset" checks).
* Portable and safe. `np.load(path)` and `unzip -p path metadata.json`
  inspect a file without jaxil; pickled (object) arrays are never read.

`metadata.json` holds: `format`, `schema_version`, `env_id`, `spec`
(`EnvSpec.to_dict`), `recipe`, `tier_names`, `source_names`,
`versions` (jax, jaxlib, jaxmarl, jumanji, jaxil, mujoco, ..., and
`xla-target`, the hardware XLA compiled for), `creation_args`,
`num_trajectories`, `num_steps` and `fields` (dtype, shape and SHA-256
of each array).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import struct as _struct
import zipfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import jax
import numpy as np
from flax import struct

from jaxil.envs.core import EnvSpec
from jaxil.data.validate import (
    FIELDS,
    SCHEMA_VERSION,
    DatasetError,
    action_dtype,
    check_env_id,
    check_metadata,
    validate,
)
from jaxil.runs.io_atomic import atomic_path
from jaxil.runs.measure import compute_target
from jaxil.runs.rundir import installed_versions

FORMAT_NAME = "jaxil.dataset"
METADATA_MEMBER = "metadata.json"
VERSION_PACKAGES = ("jax", "jaxlib", "jaxmarl", "jumanji", "jaxil", "flax", "numpy", "mujoco",
                    "mujoco-mjx")
#: The `versions` entry that names what XLA compiled the collection for
#: ([`compute_target`][jaxil.runs.measure.compute_target]).
TARGET_KEY = "xla-target"

PathLike = Union[str, os.PathLike]


def library_versions() -> dict[str, Optional[str]]:
    """Installed versions of the packages that shape a dataset (None if
    absent), and under `TARGET_KEY` the hardware XLA compiled for: the same
    packages on another CPU can record other last bits (`jaxil data diff`
    then shows both)."""
    return dict(installed_versions(VERSION_PACKAGES), **{TARGET_KEY: compute_target()})


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """Dataset-level metadata. Frozen and hashable, so a
    [`Dataset`][jaxil.data.format.Dataset] can be passed through `jax.jit` (it
    is the static part of the pytree).

    Attributes:
      spec: the environment the data was recorded on.
      tier_names: quality tier of each `tier` index, e.g. `("expert", "random")`.
      source_names: source policy of each `source` index.
      recipe: name of the recipe that built the dataset ("" if none).
      versions: `(package, version)` pairs at creation time, and
        `(TARGET_KEY, what XLA compiled for)`.
      creation_args_json: canonical JSON of the arguments that created it.
    """

    spec: EnvSpec
    tier_names: tuple[str, ...]
    source_names: tuple[str, ...]
    recipe: str = ""
    versions: tuple[tuple[str, Optional[str]], ...] = ()
    creation_args_json: str = "{}"

    @property
    def env_id(self) -> str:
        return self.spec.env_id

    @property
    def creation_args(self) -> dict[str, Any]:
        return json.loads(self.creation_args_json)

    @property
    def env_kwargs(self) -> dict[str, Any]:
        """The `envs.make` keywords the data was recorded with (`{}` for
        defaults; a concatenation's parts must agree), so a learner is
        evaluated in the environment its data came from."""
        def leaves(args):
            if "concatenate" in args:
                return [k for part in args["concatenate"] for k in leaves(part)]
            return [dict(args.get("env_kwargs") or {})]

        kws = leaves(self.creation_args)
        if any(k != kws[0] for k in kws[1:]):
            raise ValueError(
                "the dataset concatenates data recorded with different environment keywords "
                f"({', '.join(sorted({json.dumps(k, sort_keys=True) for k in kws}))}); "
                "concatenate datasets recorded in one environment")
        return kws[0] if kws else {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "env_id": self.spec.env_id,
            "spec": self.spec.to_dict(),
            "recipe": self.recipe,
            "tier_names": list(self.tier_names),
            "source_names": list(self.source_names),
            "versions": dict(self.versions),
            "creation_args": self.creation_args,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "DatasetInfo":
        return DatasetInfo(
            spec=EnvSpec.from_dict(d["spec"]),
            tier_names=tuple(d["tier_names"]),
            source_names=tuple(d["source_names"]),
            recipe=d.get("recipe", ""),
            versions=tuple(sorted(d.get("versions", {}).items())),
            creation_args_json=canonical_json(d.get("creation_args", {})),
        )


def canonical_json(obj: Any) -> str:
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"creation_args must be JSON-serialisable (str, numbers, bools, lists, "
            f"dicts): {e}"
        ) from None


@struct.dataclass
class Dataset:
    """M padded trajectories; every array leads with `[M]`.

    Fields (`T` steps, `N` agents): `obs [M,T+1,N,O]` float32,
    `global_state [M,T+1,S]` float32, `avail_actions [M,T+1,N,A]` bool,
    `actions [M,T,N]` int32 or `[M,T,N,d]` float32, `reward [M,T]`
    float32, `done/truncated/mask [M,T]` bool; per trajectory
    `episode_return` float32, `length` int32, `success` bool, `tier`
    int8 (into `info.tier_names`), `source` int16 (into
    `info.source_names`), `seed` int64, `expert` bool (ground truth;
    learners that must not see it are not given it).

    Methods return new datasets; nothing is modified in place.
    """

    obs: np.ndarray
    global_state: np.ndarray
    avail_actions: np.ndarray
    actions: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    truncated: np.ndarray
    mask: np.ndarray
    episode_return: np.ndarray
    length: np.ndarray
    success: np.ndarray
    tier: np.ndarray
    source: np.ndarray
    seed: np.ndarray
    expert: np.ndarray
    info: DatasetInfo = struct.field(pytree_node=False)

    # -- construction -------------------------------------------------------------
    @staticmethod
    def from_episodes(
        episodes: Any,
        spec: EnvSpec,
        tier: str,
        source: str,
        seed: Union[int, Sequence[int], np.ndarray],
        *,
        expert: Union[bool, Sequence[bool], np.ndarray] = False,
        recipe: str = "",
        creation_args: Optional[Mapping[str, Any]] = None,
        check: bool = True,
    ) -> "Dataset":
        """Wrap [`envs.run_episodes`][jaxil.envs.rollout.run_episodes] output
        (`Episodes`) as a dataset.

        Args:
          episodes: batch-major complete episodes `[E, T(+1), ...]`.
          spec: the spec of the environment that produced them.
          tier: quality tier of all E episodes, e.g. `"expert"`.
          source: name of the policy that produced them.
          seed: the collection seed, one for all or one per episode `[E]`.
          expert: ground-truth expert flag, one for all or `[E]`.
          recipe: name of the recipe building the dataset.
          creation_args: JSON-serialisable arguments that created it.
          check: run [`validate`][jaxil.data.format.Dataset.validate]
            (recommended; costs one pass).
        """
        length = np.asarray(episodes.length, np.int32)
        M = length.shape[0]
        arrays = dict(
            obs=np.asarray(episodes.obs, np.float32),
            global_state=np.asarray(episodes.global_state, np.float32),
            avail_actions=np.asarray(episodes.avail_actions, np.bool_),
            actions=np.asarray(episodes.actions, action_dtype(spec)),
            reward=np.asarray(episodes.reward, np.float32),
            done=np.asarray(episodes.done, np.bool_),
            truncated=np.asarray(episodes.truncated, np.bool_),
            mask=np.asarray(episodes.mask, np.bool_),
            episode_return=np.asarray(episodes.episode_return, np.float32),
            length=length,
            success=np.asarray(episodes.won, np.bool_),
            tier=np.zeros((M,), np.int8),
            source=np.zeros((M,), np.int16),
            seed=_per_trajectory(seed, M, np.int64, "seed"),
            expert=_per_trajectory(expert, M, np.bool_, "expert"),
        )
        info = DatasetInfo(
            spec=spec,
            tier_names=(str(tier),),
            source_names=(str(source),),
            recipe=recipe,
            versions=tuple(sorted(library_versions().items())),
            creation_args_json=canonical_json(dict(creation_args or {})),
        )
        ds = Dataset(info=info, **arrays)
        if check:
            validate(ds)
        return ds

    # -- shape ----------------------------------------------------------------------
    @property
    def spec(self) -> EnvSpec:
        return self.info.spec

    @property
    def num_trajectories(self) -> int:
        return int(self.length.shape[0])

    def __len__(self) -> int:
        return self.num_trajectories

    @property
    def num_steps(self) -> int:
        """T, the padded time axis of `actions` (observations have T+1)."""
        return int(self.actions.shape[1])

    @property
    def num_transitions(self) -> int:
        """Valid (unpadded) steps over all trajectories."""
        return int(np.asarray(self.length, np.int64).sum())

    def arrays(self) -> dict[str, np.ndarray]:
        """Field name -> numpy array, in schema order."""
        return {name: np.asarray(getattr(self, name)) for name in FIELDS}

    # -- transformations ------------------------------------------------------------
    def select(self, indices: Any) -> "Dataset":
        """The trajectories at `indices` (ints, in that order, or a bool mask [M])."""
        idx = np.asarray(indices)
        M = self.num_trajectories
        if idx.dtype == np.bool_:
            if idx.shape != (M,):
                raise IndexError(f"boolean selection has shape {idx.shape}, expected ({M},)")
            idx = np.flatnonzero(idx)
        elif idx.size == 0:
            idx = idx.astype(np.intp)
        elif not np.issubdtype(idx.dtype, np.integer):
            raise IndexError(f"select takes integer indices or a bool mask, got dtype {idx.dtype}")
        idx = idx.reshape(-1)
        if idx.size and (idx.min() < -M or idx.max() >= M):
            raise IndexError(f"trajectory index out of range for a dataset of {M} trajectories")
        return self.replace(**{k: v[idx] for k, v in self.arrays().items()})

    def shuffle(self, seed: Any) -> "Dataset":
        """Trajectories in a random order: `seed` an int or a JAX PRNG key."""
        M = self.num_trajectories
        if isinstance(seed, (int, np.integer)):
            perm = np.random.default_rng(int(seed)).permutation(M)
        else:
            perm = np.asarray(jax.random.permutation(seed, M))
        return self.select(perm)

    def validate(self, spec: Optional[EnvSpec] = None) -> "Dataset":
        """Raise [`DatasetError`][jaxil.data.validate.DatasetError] if any rule
        is broken; return self."""
        validate(self, spec)
        return self

    # -- reporting -----------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Per-tier and overall statistics as a JSON-friendly dict.

        Each group has `count`, `transitions`, `mean_return`,
        `std_return`, `win_rate`, `mean_length` and `expert_fraction`
        (None where the group is empty).
        """
        ret = np.asarray(self.episode_return, np.float64)
        tiers = {}
        for i, name in enumerate(self.info.tier_names):
            tiers[name] = self._stats(np.asarray(self.tier) == i, ret)
        sources = {
            name: int((np.asarray(self.source) == i).sum())
            for i, name in enumerate(self.info.source_names)
        }
        return {
            "env_id": self.info.env_id,
            "recipe": self.info.recipe,
            "num_trajectories": self.num_trajectories,
            "num_transitions": self.num_transitions,
            "overall": self._stats(np.ones(len(ret), bool), ret),
            "tiers": tiers,
            "sources": sources,
        }

    def _stats(self, sel: np.ndarray, ret: np.ndarray) -> dict[str, Any]:
        n = int(sel.sum())
        if n == 0:
            return {"count": 0, "transitions": 0, "mean_return": None, "std_return": None,
                    "win_rate": None, "mean_length": None, "expert_fraction": None}
        length = np.asarray(self.length)[sel]
        return {
            "count": n,
            "transitions": int(length.sum()),
            "mean_return": float(ret[sel].mean()),
            "std_return": float(ret[sel].std()),
            "win_rate": float(np.asarray(self.success)[sel].mean()),
            "mean_length": float(length.mean()),
            "expert_fraction": float(np.asarray(self.expert)[sel].mean()),
        }

    def metadata(self) -> dict[str, Any]:
        """The `metadata.json` that [`save`][jaxil.data.format.save] writes
        (with checksums)."""
        arrays = self.arrays()
        return _metadata(self.info, arrays)


def _per_trajectory(value: Any, M: int, dtype: Any, name: str) -> np.ndarray:
    x = np.asarray(value)
    if x.ndim == 0:
        return np.full((M,), x, dtype)
    if x.shape != (M,):
        raise ValueError(f"`{name}` must be a scalar or have shape ({M},), got {x.shape}")
    return x.astype(dtype)


def concatenate(datasets: Iterable[Dataset]) -> Dataset:
    """Stack datasets recorded on the same environment, in order.

    Tier and source names are merged (first appearance order) and the indices
    remapped; datasets with fewer steps are zero-padded to the longest T.
    """
    datasets = list(datasets)
    if not datasets:
        raise ValueError("concatenate needs at least one dataset")
    spec = datasets[0].spec
    for i, d in enumerate(datasets[1:], start=1):
        if d.spec != spec:
            raise DatasetError(
                f"cannot concatenate datasets of different environments: dataset 0 is "
                f"{spec} but dataset {i} is {d.spec}"
            )
    tier_names = _merged_names(d.info.tier_names for d in datasets)
    source_names = _merged_names(d.info.source_names for d in datasets)
    T = max(d.num_steps for d in datasets)
    parts: dict[str, list[np.ndarray]] = {k: [] for k in FIELDS}
    for d in datasets:
        a = d.arrays()
        tier_map = np.array([tier_names.index(n) for n in d.info.tier_names], np.int8)
        source_map = np.array([source_names.index(n) for n in d.info.source_names], np.int16)
        a["tier"] = tier_map[a["tier"]] if len(a["tier"]) else a["tier"]
        a["source"] = source_map[a["source"]] if len(a["source"]) else a["source"]
        pad = T - d.num_steps
        for k, v in a.items():
            if pad and k in ("obs", "global_state", "avail_actions", "actions", "reward",
                             "done", "truncated", "mask"):
                widths = [(0, 0)] * v.ndim
                widths[1] = (0, pad)
                v = np.pad(v, widths)
            parts[k].append(v)
    recipes = list(dict.fromkeys(d.info.recipe for d in datasets))
    versions: dict[str, list] = {}
    for d in datasets:
        for k, v in d.info.versions:
            versions.setdefault(k, [])
            if v not in versions[k]:
                versions[k].append(v)
    info = DatasetInfo(
        spec=spec,
        tier_names=tuple(tier_names),
        source_names=tuple(source_names),
        recipe="+".join(r for r in recipes if r) if len(recipes) > 1 else recipes[0],
        versions=tuple(sorted((k, v[0] if len(v) == 1 else ",".join(map(str, v)))
                              for k, v in versions.items())),
        creation_args_json=canonical_json(
            {"concatenate": [d.info.creation_args for d in datasets]}
        ),
    )
    return Dataset(info=info, **{k: np.concatenate(v, axis=0) for k, v in parts.items()})


def _merged_names(groups: Iterable[Sequence[str]]) -> list[str]:
    out: list[str] = []
    for names in groups:
        for n in names:
            if n not in out:
                out.append(n)
    return out


# -- on disk --------------------------------------------------------------------


def checksum(x: np.ndarray) -> str:
    """SHA-256 of an array's C-order bytes (dtype and shape are stored beside it)."""
    x = np.ascontiguousarray(x)
    return hashlib.sha256(x.reshape(-1).view(np.uint8)).hexdigest()


def describe_fields(arrays: Mapping[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """`{name: {"dtype", "shape", "sha256"}}` as stored in `metadata.json`."""
    return {
        k: {"dtype": v.dtype.name, "shape": list(v.shape), "sha256": checksum(v)}
        for k, v in arrays.items()
    }


def _metadata(info: DatasetInfo, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    return {
        "format": FORMAT_NAME,
        "schema_version": SCHEMA_VERSION,
        **info.to_dict(),
        "num_trajectories": int(arrays["length"].shape[0]),
        "num_steps": int(arrays["actions"].shape[1]),
        "fields": describe_fields(arrays),
    }


def save(dataset: Dataset, path: PathLike, *, check: bool = True) -> Path:
    """Write `dataset` to `path` atomically; return the path.

    The file is written to a hidden temporary sibling, fsynced, then moved
    over `path` with `os.replace`; an existing file at `path` stays
    intact until that moment. Identical datasets give byte-identical files.
    """
    if check:
        validate(dataset)
    arrays = dataset.arrays()
    write_archive(path, arrays, _metadata(dataset.info, arrays))
    return Path(path)


# Fixed zip-entry attributes keep files byte-identical across runs and hosts.
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def _zip_info(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
    info.compress_type = zipfile.ZIP_STORED
    info.create_system = 3
    info.external_attr = 0o644 << 16
    return info


def write_archive(
    path: PathLike, arrays: Mapping[str, np.ndarray], metadata: Mapping[str, Any]
) -> None:
    """Atomically write `metadata.json` + one `<name>.npy` per array."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(
            f"{path} is a directory; give a file path such as {path / 'data.npz'}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = json.dumps(metadata, sort_keys=True, indent=1, allow_nan=False).encode()
    try:
        with atomic_path(path) as tmp:
            with open(tmp, "xb") as f:
                with zipfile.ZipFile(f, "w", allowZip64=True) as zf:
                    zf.writestr(_zip_info(METADATA_MEMBER), meta)
                    for name, arr in arrays.items():
                        _write_array(zf, f"{name}.npy", arr)
            os.chmod(tmp, 0o644)
    except OSError as e:
        if e.filename is not None:
            raise
        # a write into the zip stream names no file: name the one being written
        raise type(e)(e.errno, e.strerror or str(e), str(path)) from e


def size_bound(spec: EnvSpec, num_trajectories: int, max_steps: Optional[int] = None) -> int:
    """Bytes of the arrays of `num_trajectories` trajectories padded to
    `max_steps` (default `spec.max_steps`), the size a file of them reaches at
    most: every field of [`Dataset`][jaxil.data.format.Dataset], stored
    uncompressed."""
    T = spec.max_steps if max_steps is None else int(max_steps)
    n = spec.num_agents
    action = n * (spec.action.dim * 4 if not spec.discrete else 4)
    per_step = n * spec.obs_dim * 4 + spec.state_dim * 4 + n * spec.num_actions
    per_traj = (T + 1) * per_step + T * (action + 4 + 3) + 4 + 4 + 1 + 1 + 2 + 8 + 1
    return int(num_trajectories) * per_traj


def _write_array(zf: zipfile.ZipFile, member: str, arr: np.ndarray) -> None:
    arr = np.asarray(arr)
    if arr.dtype.hasobject:
        raise TypeError(f"{member}: object arrays cannot be stored")
    with zf.open(_zip_info(member), "w", force_zip64=True) as out:
        np.lib.format.write_array(out, np.ascontiguousarray(arr), allow_pickle=False)


def read_archive(
    path: PathLike,
    *,
    verify: bool = True,
    required: Sequence[str] = (),
    format_name: str = FORMAT_NAME,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read `(metadata, arrays)` written by
    [`write_archive`][jaxil.data.format.write_archive].

    Every problem becomes a [`DatasetError`][jaxil.data.validate.DatasetError]
    naming the file: not a zip (truncated or corrupt), no or bad
    `metadata.json`, wrong `format` or `schema_version`, missing fields, member
    sizes, dtypes or shapes that disagree with the metadata, SHA-256 mismatches
    (when `verify`).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no dataset at {path}")
    if path.is_dir():
        raise DatasetError(f"{path} is a directory, not a jaxil dataset file")
    fix = (
        "the file is truncated or corrupt (an interrupted copy or download?): "
        "re-create or re-download it"
    )
    try:
        with zipfile.ZipFile(path) as zf:
            infos = {i.filename: i for i in zf.infolist()}
            if METADATA_MEMBER not in infos:
                raise DatasetError(f"{path} has no {METADATA_MEMBER}: it is not a jaxil dataset")
            raw = zf.read(METADATA_MEMBER)
    except DatasetError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, _struct.error) as e:
        raise DatasetError(
            f"{path} is not a readable jaxil dataset ({type(e).__name__}: {e}); {fix}"
        ) from None
    try:
        meta = json.loads(raw)
    except ValueError as e:
        raise DatasetError(f"{path}: {METADATA_MEMBER} is not valid JSON ({e}); {fix}") from None
    if not isinstance(meta, dict) or meta.get("format") != format_name:
        raise DatasetError(
            f"{path} is not a jaxil dataset ({METADATA_MEMBER} `format` is "
            f"{meta.get('format') if isinstance(meta, dict) else None!r}, expected {format_name!r})"
        )
    if "schema_version" not in meta:
        raise DatasetError(
            f"{path}: {METADATA_MEMBER} has no `schema_version`; the file was not written by "
            f"jaxil.data.save or was edited — re-create it"
        )
    version = meta.get("schema_version")
    if version != SCHEMA_VERSION:
        raise DatasetError(
            f"{path} was written with dataset schema version {version} but this jaxil "
            f"reads version {SCHEMA_VERSION}; use the jaxil version that wrote it, or "
            f"re-create the dataset with this one"
        )
    fields = meta.get("fields")
    if not isinstance(fields, dict):
        raise DatasetError(f"{path}: {METADATA_MEMBER} lists no `fields`; {fix}")
    for name in required:
        if name not in fields or f"{name}.npy" not in infos:
            raise DatasetError(
                f"{path} is missing field `{name}`; the file was not written by "
                f"jaxil.data.save or was altered — re-create it"
            )
    arrays = {}
    try:
        with open(path, "rb") as f:
            for name, desc in fields.items():
                member = f"{name}.npy"
                if member not in infos:
                    raise DatasetError(
                        f"{path} is missing field `{name}` listed in its metadata; {fix}"
                    )
                arr = _read_array(f, infos[member], path, name)
                shape = list(desc.get("shape", []))
                if arr.dtype.name != desc.get("dtype") or list(arr.shape) != shape:
                    raise DatasetError(
                        f"{path}: field `{name}` has dtype {arr.dtype.name} and shape "
                        f"{arr.shape} but its metadata says {desc.get('dtype')} "
                        f"{tuple(desc.get('shape', []))}; {fix}"
                    )
                if verify and checksum(arr) != desc.get("sha256"):
                    raise DatasetError(
                        f"{path}: field `{name}` fails its SHA-256 checksum (expected "
                        f"{desc.get('sha256')}, got {checksum(arr)}): the data was corrupted "
                        f"or edited after writing; re-create or re-download the file"
                    )
                arrays[name] = arr
    except OSError as e:
        raise DatasetError(f"{path} could not be read ({e}); {fix}") from None
    return meta, arrays


def _read_array(f: io.BufferedReader, zinfo: zipfile.ZipInfo, path: Path, name: str) -> np.ndarray:
    """One stored `.npy` member, read straight into a fresh array."""
    bad = f"{path}: field `{name}` is truncated or corrupt; re-create or re-download the file"
    if zinfo.compress_type != zipfile.ZIP_STORED:
        raise DatasetError(
            f"{path}: field `{name}` is compressed; jaxil datasets are stored "
            f"uncompressed — re-save it with jaxil.data.save"
        )
    f.seek(zinfo.header_offset)
    local = f.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise DatasetError(bad)
    name_len, extra_len = _struct.unpack("<HH", local[26:30])
    start = zinfo.header_offset + 30 + name_len + extra_len
    f.seek(start)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except ValueError as e:
        raise DatasetError(f"{bad} ({e})") from None
    if dtype.hasobject:
        raise DatasetError(
            f"{path}: field `{name}` holds Python objects; jaxil never unpickles data"
        )
    count = int(np.prod(shape, dtype=np.int64))
    if zinfo.file_size != (f.tell() - start) + count * dtype.itemsize:
        raise DatasetError(f"{bad} (member size disagrees with its header)")
    arr = np.empty(shape, dtype, order="F" if fortran else "C")
    buf = memoryview(arr.reshape(-1, order="A").view(np.uint8)) if count else None
    if buf is not None and f.readinto(buf) != buf.nbytes:
        raise DatasetError(bad)
    return arr


def load(
    path: PathLike,
    spec: Optional[EnvSpec] = None,
    *,
    verify: bool = True,
    registered: bool = False,
) -> Dataset:
    """Read and fully validate a dataset written by [`save`][jaxil.data.format.save].

    Args:
      path: the dataset file.
      spec: the environment it will be used with; shapes are checked against
        it and it must match the recorded spec. Defaults to the recorded spec.
      verify: check the per-field SHA-256 checksums (recommended).
      registered: also require the recorded `env_id` to be registered with
        [`envs`][jaxil.envs] (`jaxil data validate` does); off by default so data of
        test or out-of-tree environments still loads.

    Raises:
      FileNotFoundError: nothing at `path`.
      DatasetError: anything wrong with the file or its contents; the message
        names the file, the field, the trajectory (and step) and the fix.
    """
    meta, arrays = read_archive(path, verify=verify, required=tuple(FIELDS))
    try:
        check_metadata(meta, arrays)
        if registered:
            check_env_id(meta["env_id"])
    except DatasetError as e:
        raise DatasetError(f"{path}: {e}") from None
    try:
        info = DatasetInfo.from_dict(meta)
    except (KeyError, TypeError, ValueError) as e:
        raise DatasetError(
            f"{path}: {METADATA_MEMBER} has a bad dataset description "
            f"({type(e).__name__}: {e}); re-create the file"
        ) from None
    ds = Dataset(info=info, **{k: arrays[k] for k in FIELDS})
    try:
        validate(ds, spec)
    except DatasetError as e:
        raise DatasetError(f"{path}: {e}") from None
    return ds
