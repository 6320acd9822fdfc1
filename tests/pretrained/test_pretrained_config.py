"""ArchConfig from config.json (transformers 4 and 5 keys) and GGUF
metadata, back to config.json, and the rotary frequencies with scaling."""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.pretrained import CONFIGS
from jaxil.pretrained import (ArchConfig, CheckpointError, from_gguf_metadata, from_hf_config,
                              param_shapes, rope_inv_freq, stack_layers, to_hf_config)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_config_json_round_trips(kind):
    """Fails when export writes a config.json that reads back as another
    architecture (a head count, the tie, a bias or the norm epsilon lost)."""
    arch = from_hf_config(CONFIGS[kind])
    assert from_hf_config(to_hf_config(arch)) == arch


def test_the_families_choices():
    """Fails when a family's defaults are wrong: GPT-2's d_ff (n_inner null ->
    4d) and tanh GELU, Llama's kv heads defaulting to the query heads, Qwen2's
    q/k/v (not o) biases, Qwen3's head_dim and q/k norms."""
    gpt2 = from_hf_config({**CONFIGS["gpt2"], "n_inner": None})
    assert (gpt2.d_ff, gpt2.activation, gpt2.positions, gpt2.norm) == (
        64, "gelu_tanh", "learned", "layernorm")
    assert gpt2.tie_embeddings and gpt2.qkv_bias and gpt2.o_bias
    llama = from_hf_config({k: v for k, v in CONFIGS["llama"].items()
                            if k != "num_key_value_heads"})
    assert llama.n_kv_heads == 4 and not llama.qkv_bias and llama.eos_token_ids == (2,)
    qwen2 = from_hf_config(CONFIGS["qwen2"])
    assert qwen2.qkv_bias and not qwen2.o_bias and qwen2.tie_embeddings
    qwen3 = from_hf_config(CONFIGS["qwen3"])
    assert (qwen3.head_dim, qwen3.q_dim, qwen3.kv_dim, qwen3.qk_norm) == (6, 24, 6, True)
    shapes = param_shapes(qwen3)
    assert shapes["layers.1.attn.q.kernel"] == (16, 24) and shapes["layers.1.attn.o.kernel"] == (24, 16)
    assert shapes["layers.0.attn.k_norm.scale"] == (6,) and shapes["lm_head.kernel"] == (16, 40)


def test_transformers_5_rope_parameters_and_llama3_scaling():
    """Fails when transformers 5's `rope_parameters` is not read (the base
    falls back to 10,000), or llama3 scaling does not divide the low
    frequencies, keep the high ones and blend the middle."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    cfg = {k: v for k, v in CONFIGS["llama"].items() if k != "rope_theta"}
    arch = from_hf_config({**cfg, "head_dim": 16, "num_attention_heads": 1,
                           "num_key_value_heads": 1,
                           "rope_parameters": {"rope_theta": 5e5, **scaling}})
    assert arch.rope_theta == 5e5 and arch.rope_scaling_dict == scaling
    inv = rope_inv_freq(arch)
    base = 1.0 / 5e5 ** (np.arange(0, 16, 2) / 16)
    wavelen = 2 * math.pi / base
    for j in range(8):
        if wavelen[j] < 64 / 4:
            assert inv[j] == base[j]
        elif wavelen[j] > 64:
            assert inv[j] == pytest.approx(base[j] / 8)
        else:
            s = (64 / wavelen[j] - 1) / 3
            assert inv[j] == pytest.approx((1 - s) * base[j] / 8 + s * base[j])
    assert (inv == base).any() and (inv < base).any()
    linear = from_hf_config({**CONFIGS["llama"], "rope_scaling": {"type": "linear", "factor": 2}})
    np.testing.assert_allclose(rope_inv_freq(linear) * 2, 1 / 500.0 ** (np.arange(0, 4, 2) / 4))
    assert from_hf_config({**CONFIGS["llama"], "rope_scaling": {"rope_type": "default"}}
                          ).rope_scaling is None


def test_gguf_metadata():
    """Fails when a GGUF key is read under the wrong name (kv heads, rms
    epsilon, the rope base, Qwen3's key_length as head_dim) or the biases and
    the tie are not inferred from the tensors present."""
    meta = {"general.architecture": "qwen3", "qwen3.block_count": 2,
            "qwen3.context_length": 64, "qwen3.embedding_length": 16,
            "qwen3.feed_forward_length": 24, "qwen3.attention.head_count": 4,
            "qwen3.attention.head_count_kv": 2, "qwen3.attention.key_length": 8,
            "qwen3.rope.freq_base": 1e6, "qwen3.attention.layer_norm_rms_epsilon": 1e-6,
            "tokenizer.ggml.tokens": ["a"] * 50, "tokenizer.ggml.eos_token_id": 3}
    arch = from_gguf_metadata(meta, ["token_embd.weight", "blk.0.attn_q.bias"])
    assert (arch.n_kv_heads, arch.head_dim, arch.vocab_size, arch.rope_theta) == (2, 8, 50, 1e6)
    assert arch.qk_norm and arch.qkv_bias and arch.tie_embeddings and arch.eos_token_ids == (3,)
    with pytest.raises(CheckpointError, match="GGUF metadata has no qwen3.block_count"):
        from_gguf_metadata({k: v for k, v in meta.items() if k != "qwen3.block_count"})
    with pytest.raises(CheckpointError, match="rope.scaling.type 'yarn' is not supported"):
        from_gguf_metadata({**meta, "qwen3.rope.scaling.type": "yarn"})


def test_impossible_configs_are_refused():
    """Fails when a config whose heads do not group (9 query heads over 2 kv
    heads) or a sliding-window model is accepted."""
    with pytest.raises(CheckpointError, match="9 query heads are not a multiple of 2"):
        from_hf_config({**CONFIGS["llama"], "num_attention_heads": 9, "head_dim": 4})
    with pytest.raises(CheckpointError, match="sliding window is not supported"):
        from_hf_config({**CONFIGS["qwen2"], "use_sliding_window": True})
    with pytest.raises(CheckpointError, match="model_type 'bert'"):
        ArchConfig(model_type="bert", vocab_size=1, d_model=1, n_layers=1, n_heads=1,
                   n_kv_heads=1, head_dim=1, d_ff=1, max_positions=1, norm="layernorm",
                   norm_eps=1e-5, mlp="gelu", activation="gelu", positions="learned")


def test_stack_layers_gives_a_scan_ready_tree():
    """Fails when stacking mixes up the block order or drops non-block names."""
    table = {"embed.embedding": np.zeros((3, 2)),
             **{f"layers.{i}.attn.q.kernel": np.full((2, 2), i) for i in range(12)}}
    stacked = stack_layers(table, 12)
    assert sorted(stacked) == ["embed.embedding", "layers.attn.q.kernel"]
    assert stacked["layers.attn.q.kernel"].shape == (12, 2, 2)
    np.testing.assert_array_equal(stacked["layers.attn.q.kernel"][:, 0, 0], np.arange(12))
