"""Parameter helpers shared by the LM wiring tests."""

from __future__ import annotations

import jax
import numpy as np


def sharp(params, factor: float = 3.0):
    """`params` with every kernel and embedding scaled by `factor` (in
    numpy): sharper distributions than at init, so that two networks'
    log-probabilities (a policy's and its reference's, a reward model's
    per-token reads) differ clearly."""
    def scale(path, x):
        name = jax.tree_util.keystr(path)
        return x * np.float32(factor) if ("kernel" in name or "embed" in name) else x
    return jax.tree_util.tree_map_with_path(scale, jax.device_get(params))
