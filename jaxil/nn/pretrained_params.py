"""Pretrained checkpoints as configurations and parameters of jaxil's decoder.

A checkpoint read by [`jaxil.pretrained`][jaxil.pretrained] is an
[`ArchConfig`][jaxil.pretrained.config.ArchConfig] and a canonical parameter
table ([`jaxil.pretrained.names`][jaxil.pretrained.names]);
[`config_from_arch`][jaxil.nn.pretrained_params.config_from_arch] turns the
first into a [`TransformerConfig`][jaxil.nn.transformer.TransformerConfig]
and [`params_from_table`][jaxil.nn.pretrained_params.params_from_table] the
second into the [`Transformer`][jaxil.nn.transformer.Transformer]'s
parameter tree. [`from_pretrained`][jaxil.nn.pretrained_params.from_pretrained]
does both from a short name or a path:

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
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from jaxil.nn.transformer import Transformer, TransformerConfig
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
      token_width: how many tokens one [`Transformer.step`][jaxil.nn.transformer.Transformer.step] appends.
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


def _block_tree(config: TransformerConfig, get) -> dict:
    """One block's subtree from `get(canonical name without 'layers.{i}.',
    [its shape, the tree's shape])`."""
    H, G, Dh = config.num_heads, config.kv_heads, config.head_dim
    split = {"q": H, "k": G, "v": G}
    out: dict[str, Any] = {}
    for norm, ln in (("attn_norm", "ln_attn"), ("mlp_norm", "ln_mlp")):
        out[ln] = {"scale": get(f"{norm}.scale")}
        if config.norm == "layernorm":
            out[ln]["bias"] = get(f"{norm}.bias")
    fields = {"kernel": (config.d_model,), "bias": ()} if config.qkv_bias \
        else {"kernel": (config.d_model,)}
    heads = {part: {f: get(f"attn.{part}.{f}", lead + (split[part] * Dh,),
                           lead + (split[part], Dh)) for f, lead in fields.items()}
             for part in "qkv"}
    if config.fused_qkv:
        out["qkv"] = {f: np.stack([heads[p][f] for p in "qkv"], axis=-3) for f in fields}
    else:
        out.update(heads)
    if config.qk_norm:
        out["q_norm"] = {"scale": get("attn.q_norm.scale")}
        out["k_norm"] = {"scale": get("attn.k_norm.scale")}
    out["attn_out"] = {"kernel": get("attn.o.kernel", (H * Dh, config.d_model),
                                     (H, Dh, config.d_model))}
    if config.out_bias:
        out["attn_out"]["bias"] = get("attn.o.bias")
    mlp = {"mlp_in": "up", "mlp_out": "down"}
    if config.mlp == "swiglu":
        mlp["mlp_gate"] = "gate"
    for tree_name, part in mlp.items():
        out[tree_name] = {"kernel": get(f"mlp.{part}.kernel")}
        if config.mlp_bias:
            out[tree_name]["bias"] = get(f"mlp.{part}.bias")
    return out


def params_from_table(config: TransformerConfig, table: Mapping[str, np.ndarray],
                      where: str = "checkpoint") -> dict:
    """The decoder's parameters from a canonical table.

    Args:
      config: the decoder's configuration (usually
        [`config_from_arch`][jaxil.nn.pretrained_params.config_from_arch]).
      table: `{canonical name: array}`, as
        [`load_checkpoint`][jaxil.pretrained.load.load_checkpoint] returns it.
      where: the checkpoint, for messages.

    Returns:
      `{"params": ...}`, the tree [`Transformer.init`][jaxil.nn.transformer.Transformer.init] would give, in
      `config.param_dtype`.

    Raises:
      CheckpointError: one line naming the first table entry the
        configuration has no place for, the first it needs that is missing,
        or the first whose shape differs from the configuration's.
    """
    used = set()

    def get(name, shape=None, tree_shape=None):
        """The table's `name`, checked against `shape` and reshaped to `tree_shape`."""
        if name not in table:
            raise CheckpointError(f"{where}: missing parameter {name}, which the decoder's "
                                  f"configuration needs ({_summary(config)})")
        used.add(name)
        x = np.asarray(table[name])
        if shape is not None and x.shape != tuple(shape):
            raise CheckpointError(f"{where}: {name} has shape {list(x.shape)}, expected "
                                  f"{list(shape)} ({_summary(config)})")
        return x if tree_shape is None else x.reshape(tree_shape)

    tree: dict[str, Any] = {"token_embed": {"embedding": get("embed.embedding")}}
    if config.positions == "learned":
        positions = get("pos_embed.embedding")
        if positions.shape[0] < config.max_context:
            raise CheckpointError(f"{where}: pos_embed.embedding has {positions.shape[0]} "
                                  f"positions, fewer than max_context {config.max_context}")
        tree["pos_embed"] = positions[:config.max_context]
    for i in range(config.num_layers):
        tree[f"blocks_{i}"] = _block_tree(config, lambda n, *shapes, i=i: get(f"layers.{i}.{n}",
                                                                            *shapes))
    tree["ln_final"] = {"scale": get("final_norm.scale")}
    if config.norm == "layernorm":
        tree["ln_final"]["bias"] = get("final_norm.bias")
    if not config.tie_head:
        tree["head"] = {"kernel": get("lm_head.kernel")}
    extra = sorted(set(table) - used, key=_natural)
    if extra:
        raise CheckpointError(f"{where}: extra parameter {extra[0]} ({len(extra)} in all) that "
                              f"the decoder's configuration has no place for ({_summary(config)})")
    expected = traverse_util.flatten_dict(
        jax.eval_shape(Transformer(config).init, jax.random.PRNGKey(0))["params"], sep=".")
    got = traverse_util.flatten_dict(tree, sep=".")
    for name in sorted(set(expected) | set(got), key=_natural):
        if name not in got or name not in expected:
            raise CheckpointError(f"{where}: the decoder's parameter {name} is "
                                  f"{'missing' if name not in got else 'not one it has'} "
                                  f"({_summary(config)})")
        if got[name].shape != expected[name].shape:
            raise CheckpointError(f"{where}: {name} has shape {list(got[name].shape)}, expected "
                                  f"{list(expected[name].shape)} ({_summary(config)})")
    dtype = jnp.dtype(config.param_dtype)
    return {"params": traverse_util.unflatten_dict(
        {k: jnp.asarray(v, dtype) for k, v in got.items()}, sep=".")}


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
      CheckpointError: as [`params_from_table`][jaxil.nn.pretrained_params.params_from_table].
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
    """`(config, params)` of a pretrained checkpoint for [`Transformer`][jaxil.nn.transformer.Transformer].

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
