"""The canonical parameter table and the name maps into it, as data.

A loaded checkpoint is a flat `{name: numpy array}` table whose names and
shapes depend only on the [ArchConfig][jaxil.pretrained.config.ArchConfig]
(`{i}` is the block, `0 .. n_layers - 1`; every matrix is `[d_in, d_out]`,
applied as `x @ kernel`):

| name | shape | when |
|---|---|---|
| `embed.embedding` | `[vocab, d]` | always |
| `pos_embed.embedding` | `[max_positions, d]` | learned positions (GPT-2) |
| `layers.{i}.attn_norm.scale` (`.bias`) | `[d]` | always (bias: LayerNorm) |
| `layers.{i}.attn.q.kernel` | `[d, n_heads * head_dim]` | always |
| `layers.{i}.attn.k.kernel`, `.v.kernel` | `[d, n_kv_heads * head_dim]` | always |
| `layers.{i}.attn.q.bias`, `.k.bias`, `.v.bias` | `[n_heads * head_dim]`, `[n_kv_heads * head_dim]` | `qkv_bias` |
| `layers.{i}.attn.q_norm.scale`, `.k_norm.scale` | `[head_dim]` | `qk_norm` (Qwen3) |
| `layers.{i}.attn.o.kernel` | `[n_heads * head_dim, d]` | always |
| `layers.{i}.attn.o.bias` | `[d]` | `o_bias` |
| `layers.{i}.mlp_norm.scale` (`.bias`) | `[d]` | always (bias: LayerNorm) |
| `layers.{i}.mlp.gate.kernel` | `[d, d_ff]` | SwiGLU |
| `layers.{i}.mlp.up.kernel` | `[d, d_ff]` | always |
| `layers.{i}.mlp.up.bias` | `[d_ff]` | GELU MLP (GPT-2) |
| `layers.{i}.mlp.down.kernel` | `[d_ff, d]` | always |
| `layers.{i}.mlp.down.bias` | `[d]` | GELU MLP (GPT-2) |
| `final_norm.scale` (`.bias`) | `[d]` | always (bias: LayerNorm) |
| `lm_head.kernel` | `[d, vocab]` | untied head |

Heads are laid out head-major inside a projection (`q.kernel[:, h * head_dim
: (h + 1) * head_dim]` is head `h`), and the rotary layout is HF's half-split
`rotate_half` one, whatever the file stored (GGUF's interleaved Llama q/k
are undone on load). The names follow flax's (`kernel`, `bias`, `scale`,
`embedding`), so `flax.traverse_util.unflatten_dict(table, sep=".")` gives a
nested tree, and [stack_layers][jaxil.pretrained.names.stack_layers] a
`layers.*` tree with a leading `[n_layers]` axis for a scanned decoder.

Each checkpoint format has a [Rule][jaxil.pretrained.names.Rule] table: a
checkpoint name (with `{i}` for the block) -> canonical name(s) and the steps
that turn the stored array into the canonical one. The same table, read
backwards, exports.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Optional, Union

import numpy as np

from jaxil.pretrained.config import ArchConfig
from jaxil.pretrained.errors import CheckpointError


@dataclasses.dataclass(frozen=True)
class Rule:
    """One checkpoint tensor and where it goes.

    Attributes:
        source: the checkpoint's name, `{i}` standing for the block index.
        target: the canonical name (`{i}` likewise), a tuple of three for a
            fused q/k/v split along the last axis, or None for a tensor that
            holds no parameter (GPT-2's causal-mask buffers) and is skipped.
        steps: applied in order on load and undone in reverse on export:
            `T` transposes, `split3` splits the last axis in three (q, k,
            v), `unrope_q` / `unrope_k` undo llama.cpp's interleaving of the
            rotary pairs (per query / key-value head) on the output axis.
    """

    source: str
    target: Union[str, tuple[str, ...], None]
    steps: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Table:
    """The rules of one checkpoint format.

    Attributes:
        rules: the rules.
        optional_prefix: a prefix the checkpoint names may carry or not
            (GPT-2's `transformer.`); export writes it.
    """

    rules: tuple[Rule, ...]
    optional_prefix: str = ""

    def match(self, name: str) -> Optional[tuple[Rule, Optional[str]]]:
        """`(rule, block index or None)` for a checkpoint name, or None."""
        for rule, pattern in _compiled(self):
            m = pattern.match(name)
            if m:
                return rule, m.group("i") if "i" in m.groupdict() else None
        return None


_CACHE: dict[int, list] = {}


def _compiled(table: Table) -> list:
    key = id(table)
    if key not in _CACHE:
        prefix = f"(?:{re.escape(table.optional_prefix)})?" if table.optional_prefix else ""
        _CACHE[key] = [(r, re.compile("^" + prefix + re.escape(r.source).replace(
            re.escape("{i}"), r"(?P<i>\d+)") + "$")) for r in table.rules]
    return _CACHE[key]


def _fill(template, i):
    if template is None:
        return None
    if isinstance(template, tuple):
        return tuple(t.format(i=i) for t in template)
    return template.format(i=i)


def _attn(prefix: str, q: str, k: str, v: str, o: str, weight: str, bias: str,
          qk_steps: tuple[str, str] = ((), ()), kernel_steps=("T",)):
    rules = []
    for part, src, extra in (("q", q, qk_steps[0]), ("k", k, qk_steps[1]), ("v", v, ()),
                             ("o", o, ())):
        rules.append(Rule(f"{prefix}{src}.{weight}", f"layers.{{i}}.attn.{part}.kernel",
                          tuple(extra) + kernel_steps))
        rules.append(Rule(f"{prefix}{src}.{bias}", f"layers.{{i}}.attn.{part}.bias", tuple(extra)))
    return rules


HF_LLAMA = Table(tuple([
    Rule("model.embed_tokens.weight", "embed.embedding"),
    Rule("model.norm.weight", "final_norm.scale"),
    Rule("lm_head.weight", "lm_head.kernel", ("T",)),
    Rule("model.layers.{i}.input_layernorm.weight", "layers.{i}.attn_norm.scale"),
    Rule("model.layers.{i}.post_attention_layernorm.weight", "layers.{i}.mlp_norm.scale"),
    *_attn("model.layers.{i}.self_attn.", "q_proj", "k_proj", "v_proj", "o_proj",
           "weight", "bias"),
    Rule("model.layers.{i}.self_attn.q_norm.weight", "layers.{i}.attn.q_norm.scale"),
    Rule("model.layers.{i}.self_attn.k_norm.weight", "layers.{i}.attn.k_norm.scale"),
    Rule("model.layers.{i}.mlp.gate_proj.weight", "layers.{i}.mlp.gate.kernel", ("T",)),
    Rule("model.layers.{i}.mlp.up_proj.weight", "layers.{i}.mlp.up.kernel", ("T",)),
    Rule("model.layers.{i}.mlp.down_proj.weight", "layers.{i}.mlp.down.kernel", ("T",)),
]))

# GPT-2's Conv1D stores [d_in, d_out] already: no transposes; c_attn is q|k|v.
_QKV = ("layers.{i}.attn.q", "layers.{i}.attn.k", "layers.{i}.attn.v")
HF_GPT2 = Table(tuple([
    Rule("wte.weight", "embed.embedding"),
    Rule("wpe.weight", "pos_embed.embedding"),
    Rule("ln_f.weight", "final_norm.scale"),
    Rule("ln_f.bias", "final_norm.bias"),
    Rule("lm_head.weight", "lm_head.kernel", ("T",)),
    Rule("h.{i}.ln_1.weight", "layers.{i}.attn_norm.scale"),
    Rule("h.{i}.ln_1.bias", "layers.{i}.attn_norm.bias"),
    Rule("h.{i}.attn.c_attn.weight", tuple(f"{p}.kernel" for p in _QKV), ("split3",)),
    Rule("h.{i}.attn.c_attn.bias", tuple(f"{p}.bias" for p in _QKV), ("split3",)),
    Rule("h.{i}.attn.c_proj.weight", "layers.{i}.attn.o.kernel"),
    Rule("h.{i}.attn.c_proj.bias", "layers.{i}.attn.o.bias"),
    Rule("h.{i}.attn.bias", None),
    Rule("h.{i}.attn.masked_bias", None),
    Rule("h.{i}.ln_2.weight", "layers.{i}.mlp_norm.scale"),
    Rule("h.{i}.ln_2.bias", "layers.{i}.mlp_norm.bias"),
    Rule("h.{i}.mlp.c_fc.weight", "layers.{i}.mlp.up.kernel"),
    Rule("h.{i}.mlp.c_fc.bias", "layers.{i}.mlp.up.bias"),
    Rule("h.{i}.mlp.c_proj.weight", "layers.{i}.mlp.down.kernel"),
    Rule("h.{i}.mlp.c_proj.bias", "layers.{i}.mlp.down.bias"),
]), optional_prefix="transformer.")

# GGUF stores every matrix [d_out, d_in] (numpy order).
_GGUF_COMMON = [
    Rule("token_embd.weight", "embed.embedding"),
    Rule("output_norm.weight", "final_norm.scale"),
    Rule("output.weight", "lm_head.kernel", ("T",)),
    Rule("blk.{i}.attn_norm.weight", "layers.{i}.attn_norm.scale"),
    Rule("blk.{i}.ffn_norm.weight", "layers.{i}.mlp_norm.scale"),
]
_GGUF_SWIGLU = [
    Rule("blk.{i}.attn_q_norm.weight", "layers.{i}.attn.q_norm.scale"),
    Rule("blk.{i}.attn_k_norm.weight", "layers.{i}.attn.k_norm.scale"),
    Rule("blk.{i}.ffn_gate.weight", "layers.{i}.mlp.gate.kernel", ("T",)),
    Rule("blk.{i}.ffn_up.weight", "layers.{i}.mlp.up.kernel", ("T",)),
    Rule("blk.{i}.ffn_down.weight", "layers.{i}.mlp.down.kernel", ("T",)),
]
# llama.cpp interleaves the rotary pairs of Llama's q and k (and their
# biases), as convert_hf_to_gguf's LlamaModel.permute; Qwen2/3 are stored as is.
GGUF_LLAMA = Table(tuple(_GGUF_COMMON + _attn(
    "blk.{i}.", "attn_q", "attn_k", "attn_v", "attn_output", "weight", "bias",
    qk_steps=(("unrope_q",), ("unrope_k",))) + _GGUF_SWIGLU))
GGUF_QWEN = Table(tuple(_GGUF_COMMON + _attn(
    "blk.{i}.", "attn_q", "attn_k", "attn_v", "attn_output", "weight", "bias") + _GGUF_SWIGLU))
GGUF_GPT2 = Table(tuple(_GGUF_COMMON + [
    Rule("position_embd.weight", "pos_embed.embedding"),
    Rule("output_norm.bias", "final_norm.bias"),
    Rule("blk.{i}.attn_norm.bias", "layers.{i}.attn_norm.bias"),
    Rule("blk.{i}.ffn_norm.bias", "layers.{i}.mlp_norm.bias"),
    Rule("blk.{i}.attn_qkv.weight", tuple(f"{p}.kernel" for p in _QKV), ("T", "split3")),
    Rule("blk.{i}.attn_qkv.bias", tuple(f"{p}.bias" for p in _QKV), ("split3",)),
    Rule("blk.{i}.attn_output.weight", "layers.{i}.attn.o.kernel", ("T",)),
    Rule("blk.{i}.attn_output.bias", "layers.{i}.attn.o.bias"),
    Rule("blk.{i}.ffn_up.weight", "layers.{i}.mlp.up.kernel", ("T",)),
    Rule("blk.{i}.ffn_up.bias", "layers.{i}.mlp.up.bias"),
    Rule("blk.{i}.ffn_down.weight", "layers.{i}.mlp.down.kernel", ("T",)),
    Rule("blk.{i}.ffn_down.bias", "layers.{i}.mlp.down.bias"),
]))

HF_TABLES = {"gpt2": HF_GPT2, "llama": HF_LLAMA, "qwen2": HF_LLAMA, "qwen3": HF_LLAMA}
"""`model_type` -> the [Table][jaxil.pretrained.names.Table] of its HF
checkpoint names."""
GGUF_TABLES = {"gpt2": GGUF_GPT2, "llama": GGUF_LLAMA, "qwen2": GGUF_QWEN, "qwen3": GGUF_QWEN}
"""`model_type` -> the [Table][jaxil.pretrained.names.Table] of its GGUF tensor
names (Llama's with llama.cpp's q/k interleaving undone)."""


def param_shapes(arch: ArchConfig) -> dict[str, tuple[int, ...]]:
    """`{canonical name: shape}` of every parameter `arch` has (the table above)."""
    d, f = arch.d_model, arch.d_ff
    out = {"embed.embedding": (arch.vocab_size, d)}
    if arch.positions == "learned":
        out["pos_embed.embedding"] = (arch.max_positions, d)
    layernorm = arch.norm == "layernorm"

    def norm(name):
        out[f"{name}.scale"] = (d,)
        if layernorm:
            out[f"{name}.bias"] = (d,)

    for i in range(arch.n_layers):
        p = f"layers.{i}"
        norm(f"{p}.attn_norm")
        for part, width in (("q", arch.q_dim), ("k", arch.kv_dim), ("v", arch.kv_dim)):
            out[f"{p}.attn.{part}.kernel"] = (d, width)
            if arch.qkv_bias:
                out[f"{p}.attn.{part}.bias"] = (width,)
        if arch.qk_norm:
            out[f"{p}.attn.q_norm.scale"] = (arch.head_dim,)
            out[f"{p}.attn.k_norm.scale"] = (arch.head_dim,)
        out[f"{p}.attn.o.kernel"] = (arch.q_dim, d)
        if arch.o_bias:
            out[f"{p}.attn.o.bias"] = (d,)
        norm(f"{p}.mlp_norm")
        if arch.mlp == "swiglu":
            out[f"{p}.mlp.gate.kernel"] = (d, f)
        out[f"{p}.mlp.up.kernel"] = (d, f)
        out[f"{p}.mlp.down.kernel"] = (f, d)
        if arch.mlp == "gelu":
            out[f"{p}.mlp.up.bias"] = (f,)
            out[f"{p}.mlp.down.bias"] = (d,)
    norm("final_norm")
    if not arch.tie_embeddings:
        out["lm_head.kernel"] = (d, arch.vocab_size)
    return out


def _rope_heads(arch: ArchConfig, step: str) -> int:
    return arch.n_heads if step.endswith("_q") else arch.n_kv_heads


def apply_steps(x: np.ndarray, steps, arch: ArchConfig):
    """The canonical array(s) of a stored one (load direction)."""
    for step in steps:
        if step == "T":
            x = x.T
        elif step == "split3":
            x = tuple(np.split(x, 3, axis=-1))
        elif step in ("unrope_q", "unrope_k"):
            # llama.cpp stored head h's rows as (dim, 2) pairs; HF keeps (2, dim).
            n = _rope_heads(arch, step)
            x = x.reshape(n, x.shape[0] // n // 2, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)
        else:
            raise ValueError(f"unknown step {step!r}")
    return x


def undo_steps(x, steps, arch: ArchConfig) -> np.ndarray:
    """The stored array of canonical array(s) (export direction; inverse of
    [apply_steps][jaxil.pretrained.names.apply_steps])."""
    for step in reversed(steps):
        if step == "T":
            x = x.T
        elif step == "split3":
            x = np.concatenate(x, axis=-1)
        elif step in ("unrope_q", "unrope_k"):
            n = _rope_heads(arch, step)
            x = x.reshape(n, 2, x.shape[0] // n // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)
        else:
            raise ValueError(f"unknown step {step!r}")
    return x


def stack_layers(table: Mapping[str, np.ndarray], n_layers: int) -> dict[str, np.ndarray]:
    """The table with `layers.{i}.X` stacked into `layers.X` of shape
    `[n_layers, ...]`."""
    out, per = {}, {}
    for name, value in table.items():
        m = re.match(r"^layers\.(\d+)\.(.+)$", name)
        if m:
            per.setdefault(m.group(2), {})[int(m.group(1))] = value
        else:
            out[name] = value
    for rest, by_layer in per.items():
        out[f"layers.{rest}"] = np.stack([by_layer[i] for i in range(n_layers)])
    return out


def _expand(rule: Rule, n_layers: int):
    """`(checkpoint name without prefix, target(s))` for every block of a rule."""
    if "{i}" in rule.source:
        return [(rule.source.format(i=i), _fill(rule.target, i)) for i in range(n_layers)]
    return [(rule.source, rule.target)]


def checkpoint_name(table: Table, canonical: str, n_layers: int) -> str:
    """The checkpoint name that holds a canonical parameter (for messages)."""
    for rule in table.rules:
        for source, target in _expand(rule, n_layers):
            if canonical == target or (isinstance(target, tuple) and canonical in target):
                return table.optional_prefix + source
    return canonical


def to_canonical(arch: ArchConfig, table: Table, tensors, where: str, dtype) -> dict:
    """The canonical table of a checkpoint's tensors, checked against `arch`.

    Args:
        arch: the architecture (from the same checkpoint).
        table: the checkpoint format's rules.
        tensors: `(name, get)` pairs; `get()` reads the stored array.
        where: the file, for messages.
        dtype: the numpy dtype of the output arrays.

    Raises:
        CheckpointError: a tensor no rule maps or `arch` does not have
            (extra), a shape other than `arch`'s (named with both shapes), or a
            parameter the file lacks (missing).
    """
    shapes = param_shapes(arch)
    out, tied_head = {}, None
    for name, get in tensors:
        found = table.match(name)
        if found is None:
            raise CheckpointError(f"{where}: extra tensor {name}: no {arch.model_type} parameter "
                                  "is stored under that name")
        rule, i = found
        targets = _fill(rule.target, i)
        if targets is None:
            continue
        if targets == "lm_head.kernel" and arch.tie_embeddings:
            tied_head = (name, get())  # read now: the file closes after the loop
            continue
        unexpected = [t for t in (targets if isinstance(targets, tuple) else (targets,))
                      if t not in shapes]
        if unexpected:
            raise CheckpointError(f"{where}: extra tensor {name} ({unexpected[0]}): the config's "
                                  f"{arch.model_type} has no such parameter")
        stored = get()
        try:
            values = apply_steps(stored, rule.steps, arch)
        except ValueError as e:  # np.split / reshape: the shape does not divide
            raise CheckpointError(f"{where}: tensor {name} has shape {list(stored.shape)}, which "
                                  f"does not {'split into q, k and v' if 'split3' in rule.steps else 'split into the config heads'}") from e
        for target, value in zip(*((targets, values) if isinstance(targets, tuple)
                                   else ((targets,), (values,)))):
            if tuple(value.shape) != shapes[target]:
                raise CheckpointError(
                    f"{where}: tensor {name} ({target}) has shape {list(stored.shape)}, which "
                    f"gives {list(value.shape)}, expected {list(shapes[target])} from the config "
                    f"(d_model {arch.d_model}, {arch.n_heads} heads, {arch.n_kv_heads} kv heads "
                    f"x {arch.head_dim}, d_ff {arch.d_ff}, vocab {arch.vocab_size})")
            out[target] = np.ascontiguousarray(value, dtype=dtype)
    missing = [t for t in shapes if t not in out]
    if missing:
        raise CheckpointError(
            f"{where}: missing tensor {checkpoint_name(table, missing[0], arch.n_layers)} "
            f"({missing[0]}; {len(missing)} missing in all) that the config's {arch.model_type} needs")
    if tied_head is not None:
        head = tied_head[1]
        if head.shape != out["embed.embedding"].shape or not np.array_equal(
                np.asarray(head, dtype), out["embed.embedding"]):
            raise CheckpointError(f"{where}: extra tensor {tied_head[0]}: the config ties the head "
                                  "to the embedding (tie_word_embeddings) but the file holds a "
                                  "different head; set tie_word_embeddings false in config.json")
    return out


def check_params(arch: ArchConfig, params: Mapping[str, np.ndarray], where: str) -> None:
    """Check a canonical table against `arch`: the same names, the same shapes.

    Raises:
        CheckpointError: a missing, extra or misshaped parameter (named).
    """
    shapes = param_shapes(arch)
    extra = [n for n in params if n not in shapes]
    if extra:
        raise CheckpointError(f"{where}: extra parameter {extra[0]}: the {arch.model_type} "
                              "config has no such parameter")
    missing = [n for n in shapes if n not in params]
    if missing:
        raise CheckpointError(f"{where}: missing parameter {missing[0]} ({len(missing)} missing "
                              "in all)")
    for name, shape in shapes.items():
        if tuple(np.shape(params[name])) != shape:
            raise CheckpointError(f"{where}: parameter {name} has shape "
                                  f"{list(np.shape(params[name]))}, expected {list(shape)}")


def from_canonical(arch: ArchConfig, table: Table, params: Mapping[str, np.ndarray]) -> dict:
    """`{checkpoint name: stored array}` of a canonical table (export direction),
    with the table's optional prefix written."""
    out = {}
    for rule in table.rules:
        if rule.target is None:
            continue
        for source, target in _expand(rule, arch.n_layers):
            names = target if isinstance(target, tuple) else (target,)
            if all(n in params for n in names):
                value = tuple(params[n] for n in names) if isinstance(target, tuple) \
                    else params[target]
                out[table.optional_prefix + source] = np.ascontiguousarray(
                    undo_steps(value, rule.steps, arch))
    return out
