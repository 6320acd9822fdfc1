"""Low-rank adapters (LoRA) on the decoder's projection kernels.

LoRA (Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large Language
Models") freezes a pretrained kernel `W` and trains a low-rank update,

    W' = W + (α / r) · A B,    A: [d_in, r],  B: [r, d_out],

with `A` drawn at random and `B` zero, so training starts from the
pretrained model exactly. A kernel of the decoder
([`jaxil.nn.transformer`][jaxil.nn.transformer]) is a flax `DenseGeneral`
kernel, its input axes first: `q`/`k`/`v` `[d, H, D]`, a fused `qkv`
`[d, 3, H, D]`, `attn_out` `[H, D, d]` (two input axes), the MLP's
`[d, f]` / `[f, d]`; `A B` is reshaped to the kernel's shape.

The adapters are a pytree of their own
([`init_adapters`][jaxil.nn.lora.init_adapters]); [`merge`][jaxil.nn.lora.merge]
adds them to the frozen parameters, and the merged tree is an ordinary
parameter tree of the same decoder. Training differentiates the loss of
`merge(base, adapters)` with respect to `adapters` only, so only the
adapters change, every path of the decoder (the teacher-forced pass, the
cached step of rollouts and of [`jaxil.nn.generate`][jaxil.nn.generate]) sees
the same adapted weights, and export is the merge itself.

Why not `qwix`: qwix's LoRA (`qwix.apply_lora_to_model`) intercepts the
matrix products inside chosen *methods* of a flax module, by overriding them
on a subclass. [`Transformer`][jaxil.nn.transformer.Transformer] applies its
module with the base class's unbound methods (`method=_Decoder.step`), so
the override is bypassed: with qwix the teacher-forced pass is adapted (its
inner `read_out`/`sequence_features` calls resolve on the subclass) but the
cached decode step adapts only the head, and rollouts would act with a model
other than the one trained. The merged adapters here need nothing from the
module.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import jax
import jax.numpy as jnp
from flax import traverse_util

#: The kernels adapted by default: every attention and MLP projection of
#: every block (the embedding, the head and the norms stay frozen).
DEFAULT_TARGETS = r"blocks_\d+\.(q|k|v|qkv|attn_out|mlp_gate|mlp_in|mlp_out)\.kernel"

# DenseGeneral modules whose kernel has more than one input axis.
_INPUT_AXES = {"attn_out": 2}


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Settings of the adapters.

    Attributes:
      rank: r, the rank of each update (>= 1).
      alpha: α; the update is scaled by `α / r`.
      targets: a regular expression matched in full against each kernel's
        path in the parameter tree (`"."`-joined under `params`, e.g.
        `blocks_3.mlp_in.kernel`).
    """

    rank: int = 8
    alpha: float = 16.0
    targets: str = DEFAULT_TARGETS

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"LoRA rank must be an integer >= 1, got {self.rank!r} (--lora); "
                             "use e.g. 8, or leave it out for full fine-tuning")
        if not self.alpha > 0:
            raise ValueError(f"LoRA alpha must be positive, got {self.alpha!r}")
        try:
            re.compile(self.targets)
        except re.error as e:
            raise ValueError(f"LoRA targets {self.targets!r} is not a regular expression: "
                             f"{e}") from None

    @property
    def scale(self) -> float:
        """`α / r`."""
        return self.alpha / self.rank


def _split(path: tuple[str, ...], shape: tuple[int, ...]) -> tuple[int, int]:
    """`(d_in, d_out)` of a kernel flattened to a matrix."""
    n_in = _INPUT_AXES.get(path[-2], 1) if len(path) > 1 else 1
    return math.prod(shape[:n_in]), math.prod(shape[n_in:])


def _targets(params: Any, config: LoraConfig) -> dict[tuple[str, ...], jax.Array]:
    flat = traverse_util.flatten_dict(params["params"])
    pattern = re.compile(config.targets)
    found = {k: v for k, v in flat.items() if pattern.fullmatch(".".join(k))}
    if not found:
        raise ValueError(f"LoRA targets {config.targets!r} match no kernel of the decoder "
                         f"(its kernels are e.g. {'.'.join(next(iter(flat)))}); choose another "
                         "pattern")
    return found


def init_adapters(params: Any, config: LoraConfig, key: jax.Array) -> dict:
    """Fresh adapters for the kernels of `params` that `config.targets`
    matches: `{"params": {... kernel path ...: {"a": [d_in, r], "b": [r,
    d_out]}}}`, `a` He-uniform (as qwix's default), `b` zero, float32.

    Raises:
      ValueError: the targets match no kernel.
    """
    found = _targets(params, config)
    keys = jax.random.split(key, len(found))
    out = {}
    for k, (path, w) in zip(keys, sorted(found.items())):
        d_in, d_out = _split(path, w.shape)
        out[path + ("a",)] = jax.nn.initializers.he_uniform()(k, (d_in, config.rank), jnp.float32)
        out[path + ("b",)] = jnp.zeros((config.rank, d_out), jnp.float32)
    return {"params": traverse_util.unflatten_dict(out)}


def merge(params: Any, adapters: Any, config: LoraConfig) -> Any:
    """`params` with every adapted kernel `W` replaced by `W + (α / r) · A B`
    (in `W`'s dtype); all other leaves are `params`' own.

    Raises:
      ValueError: an adapter for a kernel `params` lacks, or of another shape.
    """
    flat = dict(traverse_util.flatten_dict(params["params"]))
    pairs = traverse_util.flatten_dict(adapters["params"])
    for path in sorted({k[:-1] for k in pairs}):
        a, b = pairs[path + ("a",)], pairs[path + ("b",)]
        w = flat.get(path)
        if w is None or _split(path, w.shape) != (a.shape[0], b.shape[-1]):
            raise ValueError(f"adapter {'.'.join(path)} ({a.shape[0]} -> {b.shape[-1]}) does not "
                             f"fit the parameters ({'missing' if w is None else list(w.shape)})")
        delta = (config.scale * (a.astype(jnp.float32) @ b.astype(jnp.float32)))
        flat[path] = (w.astype(jnp.float32) + delta.reshape(w.shape)).astype(w.dtype)
    return {**params, "params": traverse_util.unflatten_dict(flat)}


def num_adapter_params(adapters: Any) -> int:
    """The number of trained numbers in `adapters`."""
    return sum(int(x.size) for x in jax.tree.leaves(adapters))
