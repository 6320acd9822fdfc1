"""benchmarks/learner_throughput.mlp_step: the bare-MLP yardstick counts and
runs real steps."""

import jax
import numpy as np

from benchmarks.learner_throughput import mlp_step


def test_mlp_step_flops_and_updates():
    rows, d, h, k = 64, 9, (16, 16), 3
    compiled, (params, x), flops = mlp_step(rows, in_dim=d, hidden=h, k=k)
    fwd = 2.0 * rows * (d * h[0] + h[0] * h[1] + h[1] * 1)  # forward matmul flops of one step
    # forward + input/weight gradients ≈ 3 × the forward dots, plus element-wise ops
    assert 2.5 * fwd * k < flops < 4.5 * fwd * k
    new = compiled(params, x)
    leaves_old, leaves_new = jax.tree.leaves(params), jax.tree.leaves(new)
    assert all(a.shape == b.shape for a, b in zip(leaves_old, leaves_new))
    assert any(not np.allclose(a, b) for a, b in zip(leaves_old, leaves_new))
