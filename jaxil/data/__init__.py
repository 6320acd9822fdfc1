"""Offline datasets: format and validation, on-device sampling, vault interchange.

* [`jaxil.data.format`][jaxil.data.format] — the
  [`Dataset`][jaxil.data.format.Dataset] pytree,
  [`save`][jaxil.data.format.save] / [`load`][jaxil.data.format.load] (atomic,
  checksummed, byte-deterministic single file).
* [`jaxil.data.validate`][jaxil.data.validate] — the schema rules and
  [`DatasetError`][jaxil.data.validate.DatasetError].
* [`jaxil.data.sampling`][jaxil.data.sampling] — jittable transition /
  segment-pair samplers.
* [`jaxil.data.vault`][jaxil.data.vault] — OG-MARL / flashbax vault import and export.
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
