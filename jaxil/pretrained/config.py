"""The architecture of a pretrained decoder, read from a checkpoint.

One frozen [ArchConfig][jaxil.pretrained.config.ArchConfig] covers the two
families jaxil loads:

- **GPT-2**: learned positions, LayerNorm, a GELU MLP with biases, biased
  attention (fused `c_attn` in the checkpoint), a head tied to the embedding;
- **the Llama family** (`llama`, `qwen2`, `qwen3`): RMSNorm, rotary positions
  with the checkpoint's base and scaling, a SwiGLU MLP, grouped-query
  attention, a tied or untied head, q/k/v biases (Qwen2) and per-head q/k
  RMSNorms (Qwen3).

It is read from an HF `config.json`
([from_hf_config][jaxil.pretrained.config.from_hf_config]) or from GGUF
metadata ([from_gguf_metadata][jaxil.pretrained.config.from_gguf_metadata]),
and written back as a `config.json` that transformers loads
([to_hf_config][jaxil.pretrained.config.to_hf_config]).
[rope_inv_freq][jaxil.pretrained.config.rope_inv_freq] gives the rotary
frequencies the checkpoint was trained with, scaling included.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional

import numpy as np

from jaxil.pretrained.errors import CheckpointError

# model_type -> the HF architecture class of its causal LM.
SUPPORTED = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
# RoPE scaling types the decoder implements, with the keys each needs.
ROPE_SCALING = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
}
# HF activation names -> the decoder's.
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_fast": "gelu_tanh", "gelu": "gelu", "silu": "silu", "swish": "silu"}


def supported_names() -> str:
    """`gpt2 (GPT2LMHeadModel), llama (LlamaForCausalLM), ...` for messages."""
    return ", ".join(f"{k} ({v})" for k, v in SUPPORTED.items())


@dataclasses.dataclass(frozen=True)
class ArchConfig:
    """The shape and the choices of a pretrained decoder.

    Attributes:
        model_type: `gpt2`, `llama`, `qwen2` or `qwen3`.
        vocab_size: rows of the embedding (and of the head).
        d_model: the residual width.
        n_layers: the number of blocks.
        n_heads: query heads.
        n_kv_heads: key/value heads (grouped-query attention when fewer than
            `n_heads`; `n_heads % n_kv_heads == 0`).
        head_dim: the width of one head (not always `d_model / n_heads`:
            Qwen3 uses 128).
        d_ff: the MLP's hidden width.
        max_positions: the context the checkpoint was trained for (the
            size of the learned position table for GPT-2).
        norm: `layernorm` (scale and bias) or `rmsnorm` (scale only).
        norm_eps: the norms' epsilon.
        mlp: `gelu` (up, activation, down, with biases) or `swiglu`
            (`down(act(gate(x)) * up(x))`, no biases).
        activation: `gelu_tanh` (GPT-2's `gelu_new`), `gelu` (erf) or `silu`.
        positions: `learned` (a position table added to the embedding) or
            `rope` (rotary, the half-split layout of HF's `rotate_half`).
        rope_theta: the rotary base.
        rope_scaling: `None`, or the sorted `(key, value)` items of HF's
            `rope_scaling` with `rope_type` `linear` or `llama3`.
        tie_embeddings: the head is the transposed embedding (no `lm_head`).
        qkv_bias: q, k and v projections have biases.
        o_bias: the output projection has a bias.
        qk_norm: per-head RMSNorms on q and k before the rotation (Qwen3).
        bos_token_id: the checkpoint's beginning-of-sequence token, or None.
        eos_token_ids: its end-of-sequence tokens (one or several).
        pad_token_id: its padding token, or None.
    """

    model_type: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    max_positions: int
    norm: str
    norm_eps: float
    mlp: str
    activation: str
    positions: str
    rope_theta: float = 10000.0
    rope_scaling: Optional[tuple[tuple[str, Any], ...]] = None
    tie_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: Optional[int] = None

    def __post_init__(self):
        if self.model_type not in SUPPORTED:
            raise CheckpointError(f"model_type {self.model_type!r} is not supported; "
                                  f"supported: {supported_names()}")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
                     "head_dim", "d_ff", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise CheckpointError(f"{self.model_type} config: {name} is {value!r}, "
                                      "expected a positive integer")
        if self.n_heads % self.n_kv_heads:
            raise CheckpointError(f"{self.model_type} config: {self.n_heads} query heads "
                                  f"are not a multiple of {self.n_kv_heads} key/value heads")
        if self.positions == "rope" and self.head_dim % 2:
            raise CheckpointError(f"{self.model_type} config: rotary head_dim {self.head_dim} "
                                  "is odd")
        if self.rope_scaling is not None:
            kind = dict(self.rope_scaling).get("rope_type")
            missing = [k for k in ROPE_SCALING.get(kind, ()) if k not in dict(self.rope_scaling)]
            if kind not in ROPE_SCALING or missing:
                raise CheckpointError(
                    f"rope_scaling {dict(self.rope_scaling)} is not supported: rope_type must be "
                    + " or ".join(f"{k} (with {', '.join(v)})" for k, v in ROPE_SCALING.items()))

    @property
    def rope_scaling_dict(self) -> Optional[dict]:
        """`rope_scaling` as a dict (None without scaling)."""
        return None if self.rope_scaling is None else dict(self.rope_scaling)

    @property
    def q_dim(self) -> int:
        """The width of all query heads, `n_heads * head_dim`."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """The width of all key (or value) heads, `n_kv_heads * head_dim`."""
        return self.n_kv_heads * self.head_dim


def _freeze_scaling(scaling: Optional[Mapping]) -> Optional[tuple]:
    if not scaling:
        return None
    scaling = dict(scaling)
    kind = scaling.pop("rope_type", scaling.pop("type", None))
    scaling.pop("rope_theta", None)
    if kind in (None, "default"):
        return None
    return tuple(sorted({"rope_type": kind, **scaling}.items()))


def _eos(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else (int(value),)


def _opt_int(value) -> Optional[int]:
    return None if value is None else int(value)


def from_hf_config(cfg: Mapping[str, Any]) -> ArchConfig:
    """The architecture of an HF `config.json` (already parsed).

    Reads the transformers 4 keys (`rope_theta`, `rope_scaling`) and the
    transformers 5 ones (`rope_parameters`).

    Raises:
        CheckpointError: the model type or architecture is not supported, or a
            choice inside it is not (sliding windows, an unknown activation or
            RoPE scaling, GPT-2's layer-index attention scaling).
    """
    model_type = cfg.get("model_type")
    archs = cfg.get("architectures") or []
    if model_type not in SUPPORTED:
        raise CheckpointError(f"config.json: model_type {model_type!r} "
                              f"(architectures {archs}) is not supported; "
                              f"supported: {supported_names()}")
    if archs and SUPPORTED[model_type] not in archs:
        raise CheckpointError(f"config.json: architectures {archs} are not a causal LM jaxil "
                              f"loads; supported: {supported_names()}")
    special = dict(bos_token_id=_opt_int(cfg.get("bos_token_id")),
                   eos_token_ids=_eos(cfg.get("eos_token_id")),
                   pad_token_id=_opt_int(cfg.get("pad_token_id")))
    if model_type == "gpt2":
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if cfg.get(flag):
                raise CheckpointError(f"config.json: GPT-2 with {flag} is not supported")
        if cfg.get("scale_attn_weights") is False:
            raise CheckpointError("config.json: GPT-2 with scale_attn_weights false is not "
                                  "supported")
        d = int(cfg.get("n_embd", 768))
        heads = int(cfg.get("n_head", 12))
        act = cfg.get("activation_function", "gelu_new")
        if act not in _ACTIVATIONS:
            raise CheckpointError(f"config.json: activation_function {act!r} is not supported; "
                                  f"supported: {', '.join(_ACTIVATIONS)}")
        return ArchConfig(
            model_type="gpt2", vocab_size=int(cfg.get("vocab_size", 50257)), d_model=d,
            n_layers=int(cfg.get("n_layer", 12)), n_heads=heads, n_kv_heads=heads,
            head_dim=d // heads, d_ff=int(cfg.get("n_inner") or 4 * d),
            max_positions=int(cfg.get("n_positions", 1024)), norm="layernorm",
            norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)), mlp="gelu",
            activation=_ACTIVATIONS[act], positions="learned",
            tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            qkv_bias=True, o_bias=True, **special)
    if cfg.get("use_sliding_window") or (model_type == "llama" and cfg.get("sliding_window")):
        raise CheckpointError(f"config.json: {model_type} with a sliding window is not supported")
    act = cfg.get("hidden_act", "silu")
    if _ACTIVATIONS.get(act) != "silu":
        raise CheckpointError(f"config.json: hidden_act {act!r} is not supported for "
                              f"{model_type}; supported: silu")
    if cfg.get("mlp_bias"):
        raise CheckpointError(f"config.json: {model_type} with mlp_bias is not supported")
    rope = dict(cfg.get("rope_parameters") or {})
    theta = float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0)))
    if rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) != 1.0:
        raise CheckpointError("config.json: a partial_rotary_factor other than 1 is not supported")
    scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type") else None)
    d = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    bias = bool(cfg.get("attention_bias", False))
    return ArchConfig(
        model_type=model_type, vocab_size=int(cfg["vocab_size"]), d_model=d,
        n_layers=int(cfg["num_hidden_layers"]), n_heads=heads,
        n_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or d // heads), d_ff=int(cfg["intermediate_size"]),
        max_positions=int(cfg.get("max_position_embeddings", 2048)), norm="rmsnorm",
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), mlp="swiglu", activation="silu",
        positions="rope", rope_theta=theta, rope_scaling=_freeze_scaling(scaling),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bias or model_type == "qwen2", o_bias=bias and model_type != "qwen2",
        qk_norm=model_type == "qwen3", **special)


def to_hf_config(arch: ArchConfig, dtype: str = "float32") -> dict:
    """A `config.json` transformers loads as the same model.

    `dtype` (`float32` or `bfloat16`) is recorded as `torch_dtype`.
    """
    special = {"bos_token_id": arch.bos_token_id,
               "eos_token_id": (arch.eos_token_ids[0] if len(arch.eos_token_ids) == 1
                                else list(arch.eos_token_ids) or None),
               "pad_token_id": arch.pad_token_id}
    common = {"architectures": [SUPPORTED[arch.model_type]], "model_type": arch.model_type,
              "vocab_size": arch.vocab_size, "tie_word_embeddings": arch.tie_embeddings,
              "torch_dtype": dtype, **{k: v for k, v in special.items() if v is not None}}
    if arch.model_type == "gpt2":
        act = {"gelu_tanh": "gelu_new", "gelu": "gelu"}[arch.activation]
        return {**common, "n_embd": arch.d_model, "n_layer": arch.n_layers,
                "n_head": arch.n_heads, "n_inner": arch.d_ff, "n_positions": arch.max_positions,
                "layer_norm_epsilon": arch.norm_eps, "activation_function": act}
    out = {**common, "hidden_size": arch.d_model, "intermediate_size": arch.d_ff,
           "num_hidden_layers": arch.n_layers, "num_attention_heads": arch.n_heads,
           "num_key_value_heads": arch.n_kv_heads, "head_dim": arch.head_dim,
           "max_position_embeddings": arch.max_positions, "rms_norm_eps": arch.norm_eps,
           "hidden_act": "silu", "rope_theta": arch.rope_theta,
           "rope_scaling": arch.rope_scaling_dict}
    if arch.model_type == "qwen2":
        out["use_sliding_window"] = False
    elif arch.qkv_bias or arch.o_bias:
        out["attention_bias"] = True
    return out


# GGUF general.architecture -> model_type.
GGUF_ARCHITECTURES = {"gpt2": "gpt2", "llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


def from_gguf_metadata(meta: Mapping[str, Any], tensor_names=()) -> ArchConfig:
    """The architecture of a GGUF file from its metadata.

    Args:
        meta: `{key: value}` of the file's key/value fields
            (`general.architecture`, `llama.block_count`, ...).
        tensor_names: the file's tensor names; the head is tied when there is
            no `output.weight`.

    Raises:
        CheckpointError: the architecture or its RoPE scaling is not
            supported, or a key the architecture needs is missing.
    """
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise CheckpointError(f"GGUF general.architecture {arch!r} is not supported; "
                              f"supported: {', '.join(GGUF_ARCHITECTURES)}")
    model_type = GGUF_ARCHITECTURES[arch]

    def key(name, default=None):
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise CheckpointError(f"GGUF metadata has no {arch}.{name}: the file is incomplete")
        return value

    d = int(key("embedding_length"))
    heads = int(key("attention.head_count"))
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = meta.get(f"{arch}.vocab_size", len(tokens) if tokens is not None else None)
    if vocab is None:
        raise CheckpointError(f"GGUF metadata has neither {arch}.vocab_size nor "
                              "tokenizer.ggml.tokens")
    special = dict(bos_token_id=_opt_int(meta.get("tokenizer.ggml.bos_token_id")),
                   eos_token_ids=_eos(meta.get("tokenizer.ggml.eos_token_id")),
                   pad_token_id=_opt_int(meta.get("tokenizer.ggml.padding_token_id")))
    common = dict(model_type=model_type, vocab_size=int(vocab), d_model=d,
                  n_layers=int(key("block_count")), n_heads=heads,
                  d_ff=int(key("feed_forward_length")),
                  max_positions=int(key("context_length")),
                  tie_embeddings="output.weight" not in set(tensor_names), **special)
    if model_type == "gpt2":
        return ArchConfig(n_kv_heads=heads, head_dim=d // heads, norm="layernorm",
                          norm_eps=float(key("attention.layer_norm_epsilon")), mlp="gelu",
                          activation="gelu_tanh", positions="learned", qkv_bias=True,
                          o_bias=True, **common)
    scaling_type = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling_type == "none":
        scaling = None
    elif scaling_type == "linear":
        scaling = (("factor", float(key("rope.scaling.factor"))), ("rope_type", "linear"))
    else:
        raise CheckpointError(f"GGUF {arch}.rope.scaling.type {scaling_type!r} is not "
                              "supported; supported: none, linear")
    names = set(tensor_names)
    return ArchConfig(
        n_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(meta.get(f"{arch}.attention.key_length", d // heads)), norm="rmsnorm",
        norm_eps=float(key("attention.layer_norm_rms_epsilon")), mlp="swiglu",
        activation="silu", positions="rope",
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)), rope_scaling=scaling,
        qkv_bias="blk.0.attn_q.bias" in names, o_bias="blk.0.attn_output.bias" in names,
        qk_norm=model_type == "qwen3", **common)


def rope_inv_freq(arch: ArchConfig) -> np.ndarray:
    """The rotary inverse frequencies `[head_dim // 2]` (float64), scaling applied.

    `theta ** (-2i / head_dim)`; `linear` divides them by `factor`; `llama3`
    divides the low frequencies by `factor`, keeps the high ones and blends
    between, as transformers' `_compute_llama3_parameters` does.
    """
    dim = arch.head_dim
    inv = 1.0 / arch.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    scaling = arch.rope_scaling_dict
    if scaling is None:
        return inv
    factor = float(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return inv / factor
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return np.where(medium, smoothed, scaled)
