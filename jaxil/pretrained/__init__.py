"""Pretrained language-model checkpoints: read, check, export.

Everything here is numpy and the checkpoint libraries (safetensors, gguf,
tokenizers, jinja2); no network is built. A decoder consumes the
[ArchConfig][jaxil.pretrained.config.ArchConfig] and the canonical parameter
table of [jaxil.pretrained.names][].

```python
from jaxil.pretrained import load_checkpoint

ckpt = load_checkpoint("smollm2-135m-instruct")   # or a GGUF file, an HF directory
ckpt.arch.n_layers, ckpt.params["layers.0.attn.q.kernel"].shape   # 30, (576, 576)
prompt = ckpt.render_chat([{"role": "user", "content": "Hi"}])
ids = ckpt.tokenizer.encode(prompt, add_special_tokens=False).ids
```
"""

from jaxil.pretrained.chat import ChatTemplateError, render_chat
from jaxil.pretrained.config import ArchConfig, from_gguf_metadata, from_hf_config, rope_inv_freq, to_hf_config
from jaxil.pretrained.errors import CheckpointError
from jaxil.pretrained.gguf_file import read_gguf
from jaxil.pretrained.hf import export_hf, read_hf
from jaxil.pretrained.load import SHIPPED, Checkpoint, load_checkpoint, resolve
from jaxil.pretrained.names import param_shapes, stack_layers
from jaxil.pretrained.tokenizer import SpecialTokens, gguf_tokenizer, hf_tokenizer

__all__ = [
    "ArchConfig", "ChatTemplateError", "Checkpoint", "CheckpointError", "SHIPPED", "SpecialTokens",
    "export_hf", "from_gguf_metadata", "from_hf_config", "gguf_tokenizer", "hf_tokenizer",
    "load_checkpoint", "param_shapes", "read_gguf", "read_hf", "render_chat", "resolve",
    "rope_inv_freq", "stack_layers", "to_hf_config",
]
