"""Tests of benchmarks/decode_engine.py: its accounting (KV-cache bytes,
FLOPs per decode token, parameter bytes) against counts made another way,
the jaxil prefill side against generate's, and (slow) the quick run."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import decode_engine as de
from jaxil.nn.transformer import Transformer, TransformerConfig

_LLAMA = TransformerConfig(vocab_size=37, token_width=1, max_context=11, d_model=24,
                           num_layers=3, num_heads=6, num_kv_heads=2, head_size=4,
                           fused_qkv=False, norm="rmsnorm", positions="rope", mlp="swiglu",
                           activation="silu", d_ff=40, qkv_bias=False, out_bias=False,
                           mlp_bias=False, tie_head=True, pad_id=None)


def test_kv_cache_bytes_are_the_empty_cache_arrays():
    """The reported KV bytes equal the arrays `Transformer.empty_cache`
    allocates (the engine's real cache). Fails if the count uses the query
    heads instead of the key/value heads, or forgets the values or a
    layer."""
    cache = Transformer(_LLAMA).empty_cache((5,))
    want = sum(x.nbytes for x in cache.k) + sum(x.nbytes for x in cache.v)
    assert de.kv_cache_bytes(_LLAMA, 5) == want


def test_matmul_params_are_the_kernels_a_token_multiplies():
    """`matmul_params` equals the number of entries of the parameter arrays
    a token's decode step multiplies: every 2-D-or-more kernel of the
    blocks, plus the (tied) embedding as the head. Fails if the MLP's gate
    is left out, or the head counted twice or not at all."""
    params = Transformer(_LLAMA).init(jax.random.key(0))["params"]
    kernels = sum(np.asarray(x).size for path, x in jax.tree_util.tree_leaves_with_path(params)
                  if any(getattr(k, "key", None) == "kernel" for k in path))
    head = params["token_embed"]["embedding"].size
    assert de.matmul_params(_LLAMA) == kernels + head
    flops = de.decode_flops_per_token(_LLAMA, attended=7.0)
    assert flops == 2 * (kernels + head) + 4 * 3 * 6 * 4 * 7.0


def test_jaxil_prefill_side_gives_the_logits_after_each_prompt():
    """The timed prefill is the real work: its logits equal
    `Transformer.logits` at each prompt's last token and the cache holds the
    whole prompt. Fails if the side timed a program that skips the blocks
    or reads another position."""
    net = Transformer(_LLAMA)
    params = net.init(jax.random.key(1))
    prompts = jnp.asarray(np.random.default_rng(0).integers(0, 37, size=(3, 6)), jnp.int32)
    logits, lengths = jax.jit(de.jaxil_prefill(_LLAMA))(params, prompts)
    np.testing.assert_allclose(logits, net.logits(params, prompts)[:, -1], atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(lengths, [6, 6, 6])


@pytest.mark.slow  # loads two tiny models and times ten sides: about a minute; run with -m slow
def test_quick_run_writes_one_json(tmp_path):
    doc = de.main(["--quick", "--batches", "2", "--no-sft", "--out-dir", str(tmp_path)])
    (path,) = tmp_path.glob("decode_engine-*.json")
    assert json.loads(path.read_text())["benchmark"] == "decode_engine"
    assert {r["model"] for r in doc["rows"]} == {"gpt2-tiny", "llama-tiny"}
    for row in doc["rows"]:
        assert math.isfinite(row["jaxil_generate_tokens_per_s"])
        if not doc["peer"]["skipped"]:
            assert row["greedy_tokens_equal"], row  # same weights, same greedy tokens
