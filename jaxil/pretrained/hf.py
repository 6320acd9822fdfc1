"""HF checkpoint directories: read into the canonical table, and export.

A directory holds `config.json` and the weights as `model.safetensors` or as
shards listed in `model.safetensors.index.json`. The weights are read with
safetensors' numpy API (no torch; bf16 comes back as `ml_dtypes.bfloat16`),
mapped with [HF_TABLES][jaxil.pretrained.names.HF_TABLES] and checked
against the shapes the config implies.
[export_hf][jaxil.pretrained.hf.export_hf] writes the same layout back
(one `model.safetensors` and a `config.json` transformers loads).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Optional

import ml_dtypes
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from jaxil.pretrained.config import ArchConfig, from_hf_config, to_hf_config
from jaxil.pretrained.errors import CheckpointError
from jaxil.pretrained.names import HF_TABLES, check_params, from_canonical, to_canonical

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def read_hf_config(directory: Path) -> ArchConfig:
    """The architecture of an HF directory's `config.json`.

    Raises:
        CheckpointError: no `config.json`, one that is not JSON, or an
            unsupported architecture.
    """
    directory = Path(directory)
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no config.json, so not an HF checkpoint directory "
                              f"(expected config.json with {SINGLE} or {INDEX}), nor a GGUF file")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not JSON ({e})") from e
    return from_hf_config(cfg)


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of an HF directory (one, or the index's shards).

    Raises:
        CheckpointError: neither file is there (naming what is, e.g. a
            `pytorch_model.bin` jaxil does not read), or a shard the index
            lists is missing.
    """
    directory = Path(directory)
    if (directory / INDEX).is_file():
        try:
            weight_map = json.loads((directory / INDEX).read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{directory / INDEX}: not a safetensors index (no "
                                  "weight_map)") from e
        files = [directory / f for f in dict.fromkeys(weight_map.values())]
        absent = [f for f in files if not f.is_file()]
        if absent:
            raise CheckpointError(f"{directory / INDEX}: shard {absent[0].name} is missing")
        return files
    if (directory / SINGLE).is_file():
        return [directory / SINGLE]
    other = sorted(p.name for p in directory.iterdir()
                   if p.suffix in (".bin", ".pt", ".pth", ".h5", ".msgpack", ".safetensors"))
    hint = (f"; it holds {', '.join(other)}: convert to safetensors (transformers' "
            "save_pretrained(..., safe_serialization=True))" if other else "")
    raise CheckpointError(f"{directory}: no {SINGLE} or {INDEX}{hint}")


def _tensors(files: list[Path]):
    """`(name, get)` for every tensor of the files, opened one file at a time."""
    for file in files:
        try:
            handle = safe_open(str(file), framework="np")
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{file}: not a safetensors file ({e})") from e
        with handle as f:
            for name in f.keys():
                yield name, (lambda f=f, name=name: f.get_tensor(name))


def output_dtype(dtype: str):
    """The numpy dtype of `float32` or `bfloat16`.

    Raises:
        CheckpointError: any other name.
    """
    if dtype == "float32":
        return np.float32
    if dtype == "bfloat16":
        return ml_dtypes.bfloat16
    raise CheckpointError(f"dtype {dtype!r} is not supported; use float32 or bfloat16")


def read_hf(directory: Path, dtype: str = "float32") -> tuple[ArchConfig, dict[str, np.ndarray]]:
    """`(architecture, canonical table)` of an HF directory.

    Args:
        directory: the directory with `config.json` and the weights.
        dtype: `float32` or `bfloat16`, the arrays' dtype.

    Raises:
        CheckpointError: see [read_hf_config][jaxil.pretrained.hf.read_hf_config],
            [weight_files][jaxil.pretrained.hf.weight_files] and
            [to_canonical][jaxil.pretrained.names.to_canonical].
    """
    directory = Path(directory)
    arch = read_hf_config(directory)
    np_dtype = output_dtype(dtype)
    files = weight_files(directory)
    where = str(files[0]) if len(files) == 1 else str(directory / INDEX)
    return arch, to_canonical(arch, HF_TABLES[arch.model_type], _tensors(files), where, np_dtype)


def export_hf(directory: Path, arch: ArchConfig, params: Mapping[str, np.ndarray],
              dtype: Optional[str] = None, tokenizer=None, chat_template: Optional[str] = None,
              special_tokens=None) -> Path:
    """Write an HF directory transformers (and vLLM) load as the same model.

    Writes `model.safetensors` (metadata `format: pt`), `config.json` and,
    when given, `tokenizer.json`, `tokenizer_config.json` (the special tokens
    and the chat template) and `generation_config.json`. The table is checked
    against `arch` first, so a wrong table writes nothing.

    Args:
        directory: created if needed; existing files of these names are
            replaced.
        arch: the architecture.
        params: the canonical table.
        dtype: `float32` or `bfloat16` for the stored tensors; default: the
            table's own (float32 unless it is bfloat16).
        tokenizer: a `tokenizers.Tokenizer`, saved as `tokenizer.json`.
        chat_template: saved in `tokenizer_config.json`.
        special_tokens: a [SpecialTokens][jaxil.pretrained.tokenizer.SpecialTokens].

    Returns:
        The directory.

    Raises:
        CheckpointError: the table does not match `arch` (a missing, extra
            or misshaped parameter).
    """
    first = next(iter(params.values()))
    if dtype is None:
        dtype = "bfloat16" if first.dtype.name == "bfloat16" else "float32"
    np_dtype = output_dtype(dtype)
    table = HF_TABLES[arch.model_type]
    check_params(arch, params, "the parameter table")
    tensors = from_canonical(arch, table, {k: np.asarray(v, np_dtype) for k, v in params.items()})
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / SINGLE), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(to_hf_config(arch, dtype), indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(str(directory / "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
        if special_tokens is not None:
            config.update({k: v for k, v in special_tokens.template_variables().items()})
            config["add_bos_token"] = special_tokens.add_bos
        if chat_template is not None:
            config["chat_template"] = chat_template
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {k: v for k, v in (("bos_token_id", arch.bos_token_id),
                                    ("eos_token_id", list(arch.eos_token_ids) or None),
                                    ("pad_token_id", arch.pad_token_id)) if v is not None}
    if generation:
        (directory / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return directory
