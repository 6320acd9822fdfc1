"""Expert labels of a dataset: ground truth, none, all, or a labels file, and
their digest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional
import numpy as np
from jaxil.data.preferences import dataset_id


def expert_labels(dataset, labels: str) -> Optional[np.ndarray]:
    """Per-trajectory expert flags: ground truth, none, all, or a file.

    A file is the `.labels.json` sidecar of `jaxil label` (its
    `source_id` must be this dataset's) or a `.npy` array; either holds
    one boolean (or 0/1) per trajectory.
    """
    m = dataset.num_trajectories
    if labels == "ground_truth":
        return np.asarray(dataset.expert, bool)
    if labels == "none":
        return None
    if labels == "all":  # the no-Phase-1 ablation: everything counts as expert
        return np.ones(m, bool)
    path = Path(labels)
    if not path.is_file():
        raise FileNotFoundError(f"--labels {labels!r}: use ground_truth, none, all or a "
                                ".labels.json / .npy file")
    if path.suffix == ".json":
        raw = _labels_json(path, dataset)
    elif path.suffix == ".npy":
        try:
            raw = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise ValueError(f"--labels {path} is not a readable .npy array ({e})") from None
    else:
        raise ValueError(f"--labels {path}: expected the .labels.json of `jaxil label` or a "
                         f".npy array of booleans, not a {path.suffix or 'suffix-less'} file")
    try:
        arr = np.asarray(raw)
    except ValueError:
        raise ValueError(f"--labels {path}: the labels must be a flat list of booleans, one "
                         "per trajectory") from None
    if arr.dtype != bool:
        if arr.dtype.kind not in "iuf":
            raise ValueError(f"--labels {path}: labels must be true/false (or 0/1), found "
                             f"values of type {arr.dtype}")
        off = arr[(arr != 0) & (arr != 1)]
        if off.size:
            raise ValueError(f"--labels {path}: labels must be true/false (or 0/1), found "
                             f"{off.reshape(-1)[0].item()!r}")
    if arr.shape != (m,):
        raise ValueError(f"--labels {path} has shape {arr.shape}; the dataset has {m} trajectories")
    return arr.astype(bool)


class _DuplicateKey(ValueError):
    pass


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    """A JSON object's `dict`, refusing a key given twice (`json` would keep
    the last one silently)."""
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen.add(key)
    return dict(pairs)


def _labels_json(path: Path, dataset) -> Any:
    try:
        doc = json.loads(path.read_text(), object_pairs_hook=_refuse_duplicates)
    except _DuplicateKey as e:
        raise ValueError(f"--labels {path} gives the key `{e.args[0]}` twice, and only one can "
                         "be meant; keep the right one, or pass the .labels.json that "
                         "`jaxil label` wrote") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--labels {path} is not valid JSON ({e.msg} at line {e.lineno}); "
                         "pass the .labels.json that `jaxil label` wrote") from None
    if not isinstance(doc, dict) or "expert" not in doc:
        raise ValueError(f"--labels {path} has no `expert` key (it holds a JSON "
                         f"{type(doc).__name__}); expected the .labels.json of `jaxil label`: "
                         '{"source_id": ..., "expert": [true, false, ...]}')
    src, want = doc.get("source_id"), dataset_id(dataset)
    if src is not None and src != want:
        raise ValueError(f"--labels {path} were made for dataset {src}, but --dataset is "
                         f"{want}; label this dataset with `jaxil label`")
    return doc["expert"]


def labels_digest(flags: Optional[np.ndarray]) -> Optional[str]:
    """A short digest of the expert flags a run trains with (part of its identity)."""
    if flags is None:
        return None
    import hashlib

    return hashlib.sha256(np.packbits(np.asarray(flags, bool)).tobytes()
                          + str(len(flags)).encode()).hexdigest()[:16]
