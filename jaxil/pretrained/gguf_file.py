"""GGUF files: metadata, dequantized tensors, the canonical table.

Read with ggml's own reader (`gguf.GGUFReader`, memory-mapped) and
dequantized with `gguf.quants.dequantize` to float32, one tensor at a time.
Names map with [GGUF_TABLES][jaxil.pretrained.names.GGUF_TABLES]; Llama's q
and k, which llama.cpp's converter stores with the two halves of each rotary
head interleaved, are put back in HF's half-split order (what transformers'
`LlamaTensorProcessor` does when it loads a GGUF).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import quants

from jaxil.pretrained.config import ArchConfig, from_gguf_metadata
from jaxil.pretrained.errors import CheckpointError
from jaxil.pretrained.hf import output_dtype
from jaxil.pretrained.names import GGUF_TABLES, to_canonical

MAGIC = b"GGUF"
# gguf's table of the types it has a (de)quantizer for; dequantize's own
# NotImplementedError is caught as well, should the table move.
_TRAITS = getattr(quants, "_type_traits", {})


def is_gguf(path: Path) -> bool:
    """The file starts with GGUF's magic bytes."""
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == MAGIC


def open_gguf(path: Path) -> gguf.GGUFReader:
    """The reader of a GGUF file.

    Raises:
        CheckpointError: the file is not GGUF or is truncated.
    """
    path = Path(path)
    if not is_gguf(path):
        raise CheckpointError(f"{path}: not a GGUF file (no GGUF magic), nor an HF checkpoint "
                              "directory")
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError) as e:
        raise CheckpointError(f"{path}: a damaged GGUF file ({e})") from e


def metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """`{key: value}` of the file's key/value fields (arrays as lists)."""
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def dequantizable() -> list[str]:
    """The GGML types `gguf` can turn into float32."""
    return ["F32", "F16"] + sorted(t.name for t in _TRAITS)


def dequantize(tensor, where: str) -> np.ndarray:
    """A tensor of the file as float32 (numpy order: `[d_out, d_in]` for a matrix).

    Raises:
        CheckpointError: `gguf` cannot dequantize the tensor's type.
    """
    kind = tensor.tensor_type
    if _TRAITS and kind not in _TRAITS and kind not in (gguf.GGMLQuantizationType.F32,
                                                        gguf.GGMLQuantizationType.F16):
        raise CheckpointError(
            f"{where}: tensor {tensor.name} is {kind.name}, which gguf {_version()} cannot "
            f"dequantize; supported: {', '.join(dequantizable())} (re-quantize the file, e.g. "
            "llama-quantize ... Q8_0)")
    try:
        return np.asarray(quants.dequantize(tensor.data, kind), dtype=np.float32)
    except NotImplementedError as e:
        raise CheckpointError(f"{where}: tensor {tensor.name} is {kind.name}, which gguf "
                              f"{_version()} cannot dequantize ({e})") from e


def _version() -> str:
    try:
        return version("gguf")
    except PackageNotFoundError:
        return ""


def read_gguf(path: Path, dtype: str = "float32") -> tuple[ArchConfig, dict[str, np.ndarray], dict]:
    """`(architecture, canonical table, metadata)` of a GGUF file.

    Args:
        path: the file.
        dtype: `float32` or `bfloat16`, the arrays' dtype.

    Raises:
        CheckpointError: not a GGUF file, an unsupported architecture, a type
            `gguf` cannot dequantize, or a missing, extra or misshaped tensor.
    """
    path = Path(path)
    np_dtype = output_dtype(dtype)
    reader = open_gguf(path)
    meta = metadata(reader)
    names = [t.name for t in reader.tensors]
    arch = from_gguf_metadata(meta, names)
    tensors = ((t.name, (lambda t=t: dequantize(t, str(path)))) for t in reader.tensors)
    return arch, to_canonical(arch, GGUF_TABLES[arch.model_type], tensors, str(path),
                              np_dtype), meta
