"""Matmul precision of a run: fp32, TF32 or bf16 operands in the dots.

`jax.default_matmul_precision` decides how XLA computes the float32
matrix products and convolutions traced inside it; it is part of jit's
cache key, so the same learner compiles once per precision. Parameters,
optimiser state and every element-wise operation stay float32; only the
operands of the products are rounded (TF32: 10-bit mantissa, bf16: 7-bit),
with float32 accumulation.

- `default`: XLA's choice: float32 on CPU; on NVIDIA GPUs from Ampere on,
  TF32 (JAX's default is fast, not exact, there).
- `fp32`: full float32 products everywhere (`"float32"`).
- `tf32`: TF32 tensor cores where the GPU has them (`"tensorfloat32"`).
- `bf16`: bfloat16 operands, one pass (`"bfloat16"`).

On a CPU the three named precisions compute the same float32 products.
`benchmarks/gpu_suite.py` measures the speed and how much one update's
losses move at each precision.
"""

from __future__ import annotations

import contextlib

import jax

PRECISIONS = {"default": None, "fp32": "float32", "tf32": "tensorfloat32", "bf16": "bfloat16"}


def matmul_precision(name: str):
    """A context in which jitted code traces its products at precision `name`."""
    if name not in PRECISIONS:
        raise ValueError(f"--precision {name!r}: choose one of {', '.join(PRECISIONS)}")
    value = PRECISIONS[name]
    return contextlib.nullcontext() if value is None else jax.default_matmul_precision(value)
