"""Offline datasets: format and validation, on-device sampling, vault interchange.

* :mod:`jaxil.data.format` — the :class:`Dataset` pytree, :func:`save` /
  :func:`load` (atomic, checksummed, byte-deterministic single file).
* :mod:`jaxil.data.validate` — the schema rules and :class:`DatasetError`.
* :mod:`jaxil.data.sampling` — jittable transition / segment-pair samplers.
* :mod:`jaxil.data.vault` — OG-MARL / flashbax vault import and export.
"""

from jaxil.data.format import Dataset, DatasetInfo, concatenate, load, save
from jaxil.data.sampling import (
    Segments,
    TrajectoryArrays,
    Transitions,
    flatten_transitions,
    sample_segment_pairs,
    sample_transitions,
    sample_where,
    trajectory_arrays,
)
from jaxil.data.validate import SCHEMA_VERSION, DatasetError, validate
from jaxil.data.vault import export_vault, import_vault

__all__ = [
    "SCHEMA_VERSION",
    "Dataset",
    "DatasetError",
    "DatasetInfo",
    "Segments",
    "TrajectoryArrays",
    "Transitions",
    "concatenate",
    "export_vault",
    "flatten_transitions",
    "import_vault",
    "load",
    "sample_segment_pairs",
    "sample_transitions",
    "sample_where",
    "save",
    "trajectory_arrays",
    "validate",
]
