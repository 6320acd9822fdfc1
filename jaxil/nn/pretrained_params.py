"""Pretrained checkpoints as configurations and parameters of jaxil's decoder.

A checkpoint read by [`jaxil.pretrained`][jaxil.pretrained] is an
[`ArchConfig`][jaxil.pretrained.config.ArchConfig] and a canonical parameter
table ([`jaxil.pretrained.names`][jaxil.pretrained.names]);
[`config_from_arch`][jaxil.nn.pretrained_params.config_from_arch] turns the
first into a [`TransformerConfig`][jaxil.nn.transformer.TransformerConfig] and
[`params_from_table`][jaxil.nn.pretrained_params.params_from_table] the second
into the [`Transformer`][jaxil.nn.transformer.Transformer]'s parameter tree
([`table_from_params`][jaxil.nn.pretrained_params.table_from_params] is the way
back, for export).
[`from_pretrained`][jaxil.nn.pretrained_params.from_pretrained] does both from
a short name or a path:

```python
from jaxil.nn.pretrained_params import from_pretrained
from jaxil.nn.transformer import Transformer

config, params = from_pretrained("smollm2-135m-instruct", max_context=512)
logits = Transformer(config).logits(params, tokens)   # [B, T] -> [B, T, V]
```

The name map, canonical -> tree (`{i}` the block):

| canonical | tree |
|---|---|
| `embed.embedding` | `token_embed.embedding` |
| `pos_embed.embedding` `[P, d]` | `pos_embed` `[max_context, d]` (the first rows) |
| `layers.{i}.attn_norm.*`, `mlp_norm.*` | `blocks_{i}.ln_attn.*`, `ln_mlp.*` |
| `layers.{i}.attn.q/k/v.kernel` `[d, H·D]` | `blocks_{i}.q/k/v.kernel` `[d, H, D]`, or fused `qkv.kernel` `[d, 3, H, D]` |
| `layers.{i}.attn.q_norm/k_norm.scale` | `blocks_{i}.q_norm/k_norm.scale` |
| `layers.{i}.attn.o.kernel` `[H·D, d]` | `blocks_{i}.attn_out.kernel` `[H, D, d]` |
| `layers.{i}.mlp.gate/up/down.*` | `blocks_{i}.mlp_gate/mlp_in/mlp_out.*` |
| `final_norm.*` | `ln_final.*` |
| `lm_head.kernel` | `head.kernel` (absent when tied) |

Biases follow their kernels (`[H·D]` -> `[H, D]`, fused `[3, H, D]`).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, NamedTuple, Optional

import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from jaxil.nn.transformer import TransformerConfig
from jaxil.pretrained.config import ArchConfig
from jaxil.pretrained.errors import CheckpointError
from jaxil.pretrained.load import Checkpoint, load_checkpoint
from jaxil.pretrained.names import check_params

_DTYPES = ("float32", "bfloat16")


def config_from_arch(arch: ArchConfig, *, max_context: Optional[int] = None,
                     token_width: int = 1, dtype: str = "float32",
                     compute_dtype: Optional[str] = None) -> TransformerConfig:
    """The decoder configuration of a checkpoint's architecture.

    Args:
      arch: the checkpoint's architecture.
      max_context: the KV-cache length and the longest context (None: the
        checkpoint's `max_positions`; with learned positions at most that).
      token_width: how many tokens one
        [`Transformer.step`][jaxil.nn.transformer.Transformer.step] appends.
      dtype: the parameters' dtype, `float32` or `bfloat16`.
      compute_dtype: the forward pass's dtype (None: `dtype`).

    Returns:
      A configuration without a padding token (`pad_id=None`: id 0 is a
      real token of a pretrained vocabulary).

    Raises:
      CheckpointError: a dtype other than `float32` / `bfloat16`, or a
        context longer than a learned position table.
    """
    compute_dtype = compute_dtype or dtype
    for name, value in (("dtype", dtype), ("compute_dtype", compute_dtype)):
        if value not in _DTYPES:
            raise CheckpointError(f"{name} {value!r} is not supported; choose one of "
                                  f"{', '.join(_DTYPES)}")
    context = arch.max_positions if max_context is None else int(max_context)
    if context < 1 or (arch.positions == "learned" and context > arch.max_positions):
        raise CheckpointError(f"max_context {context} does not fit the {arch.model_type} "
                              f"checkpoint's {arch.max_positions} learned positions; choose "
                              f"1 to {arch.max_positions}")
    return TransformerConfig(
        vocab_size=arch.vocab_size, token_width=token_width, max_context=context,
        d_model=arch.d_model, num_layers=arch.n_layers, num_heads=arch.n_heads,
        ln_eps=arch.norm_eps, norm=arch.norm, positions=arch.positions,
        rope_theta=arch.rope_theta, rope_scaling=arch.rope_scaling, mlp=arch.mlp,
        activation=arch.activation, d_ff=arch.d_ff, num_kv_heads=arch.n_kv_heads,
        head_size=arch.head_dim, fused_qkv=arch.model_type == "gpt2",
        qkv_bias=arch.qkv_bias, out_bias=arch.o_bias, mlp_bias=arch.mlp == "gelu",
        qk_norm=arch.qk_norm, tie_head=arch.tie_embeddings, param_dtype=dtype,
        dtype=compute_dtype, pad_id=None)


class _Entry(NamedTuple):
    """One canonical parameter and its place in the tree."""

    name: str            # canonical name
    path: str            # tree path, "."-joined
    shape: tuple         # canonical shape
    tree_shape: tuple    # its shape in the tree (before stacking into a fused qkv)
    slot: Optional[int]  # q, k, v's index in a fused qkv (axis -3), else None


def _entries(config: TransformerConfig) -> list[_Entry]:
    """Every parameter of `config`'s decoder, in the name map's order."""
    c = config
    d, f, H, G, Dh, V = (c.d_model, c.mlp_width, c.num_heads, c.kv_heads, c.head_dim,
                         c.vocab_size)
    out = [_Entry("embed.embedding", "token_embed.embedding", (V, d), (V, d), None)]
    if c.positions == "learned":
        out.append(_Entry("pos_embed.embedding", "pos_embed", (c.max_context, d),
                          (c.max_context, d), None))

    def add(name, path, shape, tree_shape=None, slot=None):
        out.append(_Entry(name, path, shape, tree_shape or shape, slot))

    def norm(name, path):
        add(f"{name}.scale", f"{path}.scale", (d,))
        if c.norm == "layernorm":
            add(f"{name}.bias", f"{path}.bias", (d,))

    for i in range(c.num_layers):
        layer, block = f"layers.{i}", f"blocks_{i}"
        norm(f"{layer}.attn_norm", f"{block}.ln_attn")
        for slot, (part, heads) in enumerate(zip("qkv", (H, G, G))):
            path = f"{block}.qkv" if c.fused_qkv else f"{block}.{part}"
            slot = slot if c.fused_qkv else None
            add(f"{layer}.attn.{part}.kernel", f"{path}.kernel", (d, heads * Dh), (d, heads, Dh),
                slot)
            if c.qkv_bias:
                add(f"{layer}.attn.{part}.bias", f"{path}.bias", (heads * Dh,), (heads, Dh), slot)
        if c.qk_norm:
            add(f"{layer}.attn.q_norm.scale", f"{block}.q_norm.scale", (Dh,))
            add(f"{layer}.attn.k_norm.scale", f"{block}.k_norm.scale", (Dh,))
        add(f"{layer}.attn.o.kernel", f"{block}.attn_out.kernel", (H * Dh, d), (H, Dh, d))
        if c.out_bias:
            add(f"{layer}.attn.o.bias", f"{block}.attn_out.bias", (d,))
        norm(f"{layer}.mlp_norm", f"{block}.ln_mlp")
        mlp = (("gate", "mlp_gate", (d, f)),) if c.mlp == "swiglu" else ()
        for part, module, shape in mlp + (("up", "mlp_in", (d, f)), ("down", "mlp_out", (f, d))):
            add(f"{layer}.mlp.{part}.kernel", f"{block}.{module}.kernel", shape)
            if c.mlp_bias:
                add(f"{layer}.mlp.{part}.bias", f"{block}.{module}.bias", shape[-1:])
    norm("final_norm", "ln_final")
    if not c.tie_head:
        add("lm_head.kernel", "head.kernel", (d, V))
    return out


def params_from_table(config: TransformerConfig, table: Mapping[str, np.ndarray],
                      where: str = "checkpoint") -> dict:
    """The decoder's parameters from a canonical table.

    Args:
      config: the decoder's configuration (usually
        [`config_from_arch`][jaxil.nn.pretrained_params.config_from_arch]).
      table: `{canonical name: array}`, as
        [`load_checkpoint`][jaxil.pretrained.load.load_checkpoint] returns it.
        A learned position table may have more rows than `max_context`:
        the first `max_context` are used.
      where: the checkpoint, for messages.

    Returns:
      `{"params": ...}`, the tree
      [`Transformer.init`][jaxil.nn.transformer.Transformer.init] would give,
      in `config.param_dtype`.

    Raises:
      CheckpointError: one line naming the first parameter the
        configuration needs that the table lacks, the first whose shape
        differs from the configuration's, or the first the configuration has
        no place for.
    """
    flat: dict[str, Any] = {}
    fused: dict[str, list] = {}
    for e in _entries(config):
        if e.name not in table:
            raise CheckpointError(f"{where}: missing parameter {e.name}, which the decoder's "
                                  f"configuration needs ({_summary(config)})")
        x = np.asarray(table[e.name])
        if e.name == "pos_embed.embedding" and x.ndim == 2 and x.shape[0] > e.shape[0]:
            x = x[:e.shape[0]]
        if x.shape != e.shape:
            raise CheckpointError(f"{where}: {e.name} has shape {list(np.shape(table[e.name]))}, "
                                  f"expected {list(e.shape)} ({_summary(config)})")
        x = x.reshape(e.tree_shape)
        if e.slot is None:
            flat[e.path] = x
        else:
            fused.setdefault(e.path, [None] * 3)[e.slot] = x
    flat.update({path: np.stack(parts, axis=-3) for path, parts in fused.items()})
    extra = sorted(set(table) - {e.name for e in _entries(config)}, key=_natural)
    if extra:
        raise CheckpointError(f"{where}: extra parameter {extra[0]} ({len(extra)} in all) that "
                              f"the decoder's configuration has no place for ({_summary(config)})")
    dtype = jnp.dtype(config.param_dtype)
    return {"params": traverse_util.unflatten_dict(
        {k: jnp.asarray(v, dtype) for k, v in flat.items()}, sep=".")}


def table_from_params(config: TransformerConfig, params: Any) -> dict[str, np.ndarray]:
    """The canonical table of the decoder's parameters (the inverse of
    [`params_from_table`][jaxil.nn.pretrained_params.params_from_table]), e.g.
    to export a fine-tuned model with
    [`export_hf`][jaxil.pretrained.hf.export_hf]. A learned position table
    has `max_context` rows: export it with that many `max_positions`.

    Raises:
      CheckpointError: `params` is not the tree of `config`'s decoder
        (naming the first parameter missing or misshaped).
    """
    flat = traverse_util.flatten_dict(params["params"], sep=".")
    out = {}
    for e in _entries(config):
        x = flat.get(e.path)
        want = e.tree_shape if e.slot is None else e.tree_shape[:-2] + (3,) + e.tree_shape[-2:]
        if x is None or tuple(x.shape) != want:
            raise CheckpointError(f"decoder parameter {e.path} is "
                                  f"{'missing' if x is None else list(x.shape)}, expected "
                                  f"{list(want)} ({_summary(config)})")
        x = np.asarray(x)
        out[e.name] = (x if e.slot is None else x[..., e.slot, :, :]).reshape(e.shape)
    return out


def _natural(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _summary(c: TransformerConfig) -> str:
    return (f"d_model {c.d_model}, {c.num_layers} layers, {c.num_heads} heads, {c.kv_heads} kv "
            f"heads x {c.head_dim}, d_ff {c.mlp_width}, vocab {c.vocab_size}")


def from_checkpoint(ckpt: Checkpoint, *, max_context: Optional[int] = None,
                    token_width: int = 1, compute_dtype: Optional[str] = None
                    ) -> tuple[TransformerConfig, dict]:
    """`(config, params)` of a loaded [`Checkpoint`][jaxil.pretrained.load.Checkpoint]
    (its tokenizer and chat template stay on it), parameters in the
    dtype the checkpoint was loaded in.

    Raises:
      CheckpointError: as
        [`params_from_table`][jaxil.nn.pretrained_params.params_from_table].
    """
    where = str(ckpt.path)
    check_params(ckpt.arch, ckpt.params, where)
    dtypes = {str(np.asarray(v).dtype) for v in ckpt.params.values()}
    dtype = "bfloat16" if dtypes == {"bfloat16"} else "float32"
    config = config_from_arch(ckpt.arch, max_context=max_context, token_width=token_width,
                              dtype=dtype, compute_dtype=compute_dtype)
    return config, params_from_table(config, ckpt.params, where)


def from_pretrained(name_or_path, dtype: str = "float32", *, max_context: Optional[int] = None,
                    token_width: int = 1, compute_dtype: Optional[str] = None
                    ) -> tuple[TransformerConfig, dict]:
    """`(config, params)` of a pretrained checkpoint for
    [`Transformer`][jaxil.nn.transformer.Transformer].

    Args:
      name_or_path: a short name of a shipped model
        ([`SHIPPED`][jaxil.pretrained.load.SHIPPED]), a GGUF file or an HF
        directory.
      dtype: the parameters' dtype, `float32` or `bfloat16`.
      max_context: as [`config_from_arch`][jaxil.nn.pretrained_params.config_from_arch].
      token_width: as [`config_from_arch`][jaxil.nn.pretrained_params.config_from_arch].
      compute_dtype: the forward pass's dtype (None: `dtype`).

    Raises:
      CheckpointError: one line: the loader's (an unknown name, not a
        checkpoint, an unsupported architecture, a missing, extra or
        misshaped tensor) or a context the positions do not cover.
    """
    if dtype not in _DTYPES:
        raise CheckpointError(f"dtype {dtype!r} is not supported; choose one of "
                              f"{', '.join(_DTYPES)}")
    return from_checkpoint(load_checkpoint(name_or_path, dtype), max_context=max_context,
                           token_width=token_width, compute_dtype=compute_dtype)
