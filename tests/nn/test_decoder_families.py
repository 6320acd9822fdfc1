"""The one decoder (jaxil.nn.transformer) in its pretrained configurations,
loaded through jaxil.nn.pretrained_params: GPT-2 (learned positions,
LayerNorm, GELU, fused qkv, tied head), Llama (GQA, RoPE with llama3
scaling, SwiGLU, untied head), Qwen2 (q/k/v biases, tied head) and Qwen3 (q/k
norms, a head width other than d/H).

Tiny checkpoints are written in transformers' own layout with numpy and
safetensors (tests/helpers/pretrained.py); the float64 reference below reads
that layout directly (`x @ W.T` for Linear weights, GPT-2's Conv1D `x @ W`
with a fused `c_attn`), so a transpose, a head split or a rotary layout that
the loader or the decoder gets wrong does not agree with it.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil.nn.pretrained_params import (config_from_arch, from_pretrained, params_from_table,
                                        table_from_params)
from jaxil.nn.transformer import (SIZES, Transformer, TransformerConfig, keys_slots_last,
                                  transformer_config)
from jaxil.pretrained import CheckpointError, export_hf, from_hf_config, load_checkpoint
from tests.helpers.pretrained import CONFIGS, GGUF_LLAMA, hf_tensors, write_gguf, write_hf

# The helper's tiny configs; Llama gets llama3 rope scaling (old context 8:
# of head width 4's two frequencies one is scaled, one blended).
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
FAMILY_CONFIGS = {**CONFIGS, "llama": {**CONFIGS["llama"], "rope_scaling": LLAMA3}}
KINDS = ("gpt2", "llama", "qwen2", "qwen3")


# -- the float64 reference, in transformers' layout -------------------------------------


def _layernorm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b


def _rmsnorm(x, w, eps):
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _silu(x):
    return x / (1 + np.exp(-x))


def _attention(q, k, v):
    """Causal attention, `q [T, H, D]`, `k, v [T, G, D]`: query head h reads
    key/value head h // (H / G) (transformers' repeat_kv)."""
    T, H, D = q.shape
    k, v = np.repeat(k, H // k.shape[1], axis=1), np.repeat(v, H // v.shape[1], axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
    s = np.where(np.tril(np.ones((T, T), bool))[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, v).reshape(T, H * D)


def _inv_freq(cfg, dim):
    """transformers' default rotary frequencies, with `_compute_llama3_parameters`."""
    inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, dim, 2) / dim)
    sc = cfg.get("rope_scaling")
    if not sc:
        return inv
    factor, low, high = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
    old = sc["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def _rope(x, pos, inv):
    """`x [T, H, D]` rotated, `rotate_half` layout."""
    ang = pos[:, None] * inv[None]
    cos, sin = np.concatenate([np.cos(ang)] * 2, -1), np.concatenate([np.sin(ang)] * 2, -1)
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, None] + rot * sin[:, None]


def reference_logits(kind, cfg, tensors, tokens):
    """`[T, V]` float64 logits of one token sequence."""
    t = {k.removeprefix("transformer."): np.asarray(v, np.float64) for k, v in tensors.items()}
    T = len(tokens)
    if kind == "gpt2":
        d, H, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
        x = t["wte.weight"][tokens] + t["wpe.weight"][:T]
        for i in range(cfg["n_layer"]):
            p = f"h.{i}."
            h = _layernorm(x, t[p + "ln_1.weight"], t[p + "ln_1.bias"], eps)
            qkv = h @ t[p + "attn.c_attn.weight"] + t[p + "attn.c_attn.bias"]
            q, k, v = (a.reshape(T, H, d // H) for a in np.split(qkv, 3, -1))
            x = x + _attention(q, k, v) @ t[p + "attn.c_proj.weight"] + t[p + "attn.c_proj.bias"]
            h = _layernorm(x, t[p + "ln_2.weight"], t[p + "ln_2.bias"], eps)
            h = _gelu_tanh(h @ t[p + "mlp.c_fc.weight"] + t[p + "mlp.c_fc.bias"])
            x = x + h @ t[p + "mlp.c_proj.weight"] + t[p + "mlp.c_proj.bias"]
        return _layernorm(x, t["ln_f.weight"], t["ln_f.bias"], eps) @ t["wte.weight"].T
    d, H, G = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, eps = cfg.get("head_dim", d // H), cfg["rms_norm_eps"]
    inv, pos = _inv_freq(cfg, D), np.arange(T, dtype=np.float64)

    def linear(name, h, heads):
        y = h @ t[name + ".weight"].T
        if name + ".bias" in t:
            y = y + t[name + ".bias"]
        return y.reshape(T, heads, D)

    x = t["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = _rmsnorm(x, t[p + "input_layernorm.weight"], eps)
        q, k = linear(p + "self_attn.q_proj", h, H), linear(p + "self_attn.k_proj", h, G)
        v = linear(p + "self_attn.v_proj", h, G)
        if kind == "qwen3":
            q = _rmsnorm(q, t[p + "self_attn.q_norm.weight"], eps)
            k = _rmsnorm(k, t[p + "self_attn.k_norm.weight"], eps)
        x = x + _attention(_rope(q, pos, inv), _rope(k, pos, inv), v) @ t[
            p + "self_attn.o_proj.weight"].T
        h = _rmsnorm(x, t[p + "post_attention_layernorm.weight"], eps)
        h = _silu(h @ t[p + "mlp.gate_proj.weight"].T) * (h @ t[p + "mlp.up_proj.weight"].T)
        x = x + h @ t[p + "mlp.down_proj.weight"].T
    head = t["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else t["lm_head.weight"]
    return _rmsnorm(x, t["model.norm.weight"], eps) @ head.T


def _tensors(kind, cfg, seed=0):
    """The helper's random tensors, norm scales moved near 1 (a unit-normal
    scale gives near-zero and negative gains that hide little, but the
    logits stay O(10) either way)."""
    out = hf_tensors(kind, seed=seed, config=cfg)
    for name in out:
        if name.endswith(("norm.weight", "ln_1.weight", "ln_2.weight", "ln_f.weight")):
            out[name] = (1.0 + 0.1 * out[name]).astype(np.float32)
        elif out[name].ndim == 2 and not any(s in name for s in ("embed", "wte", "wpe", "lm_head")):
            out[name] = (out[name] / math.sqrt(min(out[name].shape))).astype(np.float32)
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """`{kind: (config.json dict, HF tensors, directory)}`, plus `llama-gguf`
    (the Llama tensors through a GGUF file, q/k interleaved as llama.cpp
    stores them)."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for seed, kind in enumerate(KINDS):
        cfg = FAMILY_CONFIGS[kind]
        tensors = _tensors(kind, cfg, seed)
        out[kind] = (cfg, tensors, write_hf(root / kind, kind, tensors, cfg))
    tensors = _tensors("llama", GGUF_LLAMA, 7)
    path = root / "llama.gguf"
    write_gguf(path, tensors, GGUF_LLAMA)
    out["llama-gguf"] = (GGUF_LLAMA, tensors, path)
    return out


def _tokens(rng, vocab, shape):
    """Random ids with id 0 at the start (a real token of a pretrained
    vocabulary, not PAD)."""
    tok = rng.integers(0, vocab, size=shape)
    tok[..., 0] = 0
    return tok.astype(np.int32)


_programs: dict = {}


def _logits_program(config, jit):
    key = (config, jit)
    if key not in _programs:
        f = Transformer(config).logits
        _programs[key] = jax.jit(f) if jit else f
    return _programs[key]


def _family_cases():
    """Every family jitted; eagerly (op by op, seconds of compiling each
    new shape) Llama and Qwen2 by default, the others with -m slow: the
    eager path is the same code on other shapes."""
    for kind in KINDS + ("llama-gguf",):
        for jit in (False, True):
            slow = not jit and kind not in ("llama", "qwen2")
            yield pytest.param(kind, jit, id=f"{kind}-{'jit' if jit else 'eager'}",
                               marks=pytest.mark.slow if slow else ())


@pytest.mark.parametrize("kind,jit", list(_family_cases()))
def test_pretrained_family_logits_equal_float64_reference(checkpoints, kind, jit):
    """Logits `[B, T, V]` of each family, loaded from its files, equal the
    float64 forward pass in transformers' layout. Fails with a transposed or
    mis-split projection (fused c_attn, heads of [d, H·D]), GQA heads grouped
    by tiling instead of repeating, an interleaved instead of half-split
    rotation (or GGUF's interleaving left in), rotary frequencies without the
    llama3 scaling, q/k norms after the rotation or left out, a SwiGLU with
    gate and up swapped, a dropped q/k/v or output bias, a tied head read
    from the wrong matrix, LayerNorm for RMSNorm, or id 0 treated as PAD."""
    cfg, tensors, path = checkpoints[kind]
    base = "llama" if kind == "llama-gguf" else kind
    config, params = from_pretrained(path)
    assert config.pad_id is None and config.max_context == load_checkpoint(
        path).arch.max_positions
    rng = np.random.default_rng(len(kind))
    T = min(11, config.max_context)
    tokens = _tokens(rng, config.vocab_size, (2, T))
    got = np.asarray(_logits_program(config, jit)(params, jnp.asarray(tokens)))
    assert got.shape == (2, T, config.vocab_size) and got.dtype == np.float32
    want = np.stack([reference_logits(base, cfg, tensors, t) for t in tokens])
    assert np.abs(want).max() > 3, "logits this small would hide errors"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def _chunks(tokens, width, pad, rng):
    """`tokens` cut into `width`-wide chunks with `pad` slots inserted at
    random, the tokens kept in order (every chunk holds at least one real
    token): `[S, width]`."""
    out, i = [], 0
    while i < len(tokens):
        n_real = 1 + rng.integers(0, width)
        take = list(tokens[i:i + n_real])
        i += len(take)
        row = np.full(width, pad)
        row[np.sort(rng.choice(width, len(take), replace=False))] = take  # in order
        out.append(row)
    return np.asarray(out, np.int32)


@pytest.mark.parametrize("kind", KINDS)
def test_cached_steps_equal_the_sequence_pass(checkpoints, kind):
    """Appending the tokens in 3-wide chunks through the KV cache
    (`Transformer.step`, jitted) gives, after each chunk, the sequence
    pass's logits at its last token, for every family option: fails when the
    cached keys are stored before the rotation or the q/k norm, when the
    rotary positions of a chunk restart at 0 instead of the cache length,
    when the cache keeps H instead of H_kv heads wrongly grouped, or when the
    learned positions of a chunk are offset."""
    cfg, tensors, path = checkpoints[kind]
    config, params = from_pretrained(path, token_width=3, max_context=12)
    net = Transformer(config)
    rng = np.random.default_rng(3)
    tokens = _tokens(rng, config.vocab_size, (12,))
    full = np.asarray(jax.jit(net.sequence_logits)(params, jnp.asarray(tokens)))
    step = jax.jit(net.step)
    cache = net.empty_cache()
    assert len(cache.k) == config.num_layers
    keys = (config.head_dim, 12) if keys_slots_last(config) else (12, config.head_dim)
    assert cache.k[0].shape == (config.kv_heads,) + keys
    assert cache.v[0].shape == (config.kv_heads, 12, config.head_dim)
    for s, chunk in enumerate(tokens.reshape(4, 3)):
        logits, cache = step(params, jnp.asarray(chunk), cache)
        np.testing.assert_allclose(np.asarray(logits), full[3 * s + 2], rtol=1e-4,
                                   atol=1e-4 * np.abs(full).max())
    assert int(cache.length) == 12


def test_pad_slots_do_not_advance_rotary_positions(checkpoints):
    """The Llama configuration with a padding token (`pad_id=1`, as on a
    token task): PAD slots scattered through the chunks change nothing, in
    the cached steps and in the sequence pass, against the PAD-free
    sequence. Fails when a PAD slot advances the rotary position (the
    positions would then count slots, not real tokens) or is attended to."""
    cfg, tensors, path = checkpoints["llama"]
    config, params = from_pretrained(path, token_width=4, max_context=16)
    config = dataclasses.replace(config, pad_id=1)
    net = Transformer(config)
    rng = np.random.default_rng(5)
    real = rng.integers(2, config.vocab_size, size=10).astype(np.int32)
    chunks = _chunks(real, 4, 1, rng)
    assert (chunks == 1).sum() >= 5, "the test needs PAD slots"
    clean = np.asarray(jax.jit(net.sequence_logits)(params, jnp.asarray(real)))
    padded = np.asarray(jax.jit(net.sequence_logits)(params, jnp.asarray(chunks.reshape(-1))))
    tol = dict(rtol=1e-4, atol=1e-4 * np.abs(clean).max())
    flat = chunks.reshape(-1)
    np.testing.assert_allclose(padded[flat != 1], clean, **tol)
    step, cache, seen = jax.jit(net.step), net.empty_cache(), 0
    for chunk in chunks:
        logits, cache = step(params, jnp.asarray(chunk), cache)
        seen += int((chunk != 1).sum())
        np.testing.assert_allclose(np.asarray(logits), clean[seen - 1], **tol)


def test_default_options_keep_the_from_scratch_parameter_tree():
    """The defaults are today's from-scratch architecture: the same parameter
    names and shapes (saved students and experiments load unchanged), PAD =
    0, and `num_params` counts what each family's network has. Fails when a
    default option changes (e.g. RMSNorm, separate q/k/v, a tied head or no
    biases by default), or when the parameter count drifts from the
    modules."""
    cfg = transformer_config("tiny", vocab_size=13, token_width=4, max_context=16, num_agents=2)
    d, H, D, V, C = 64, 2, 32, 13, 16
    ln = {"bias": (d,), "scale": (d,)}
    block = {"ln_attn": ln, "qkv": {"kernel": (d, 3, H, D), "bias": (3, H, D)},
             "attn_out": {"kernel": (H, D, d), "bias": (d,)}, "ln_mlp": ln,
             "mlp_in": {"kernel": (d, 4 * d), "bias": (4 * d,)},
             "mlp_out": {"kernel": (4 * d, d), "bias": (d,)}}
    want = {"params": {"token_embed": {"embedding": (V, d)}, "pos_embed": (C, d),
                       "agent_embed": (2, d), "blocks_0": block, "blocks_1": block,
                       "ln_final": ln, "head": {"kernel": (d, V)}}}
    shapes = jax.eval_shape(Transformer(cfg).init, jax.random.PRNGKey(0))
    assert jax.tree.map(lambda x: x.shape, shapes) == want
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(shapes))
    assert cfg.pad_id == 0 and cfg.head_dim == 32 and cfg.kv_heads == 2
    assert cfg.mlp_width == 256
    for name in SIZES:
        c = transformer_config(name, vocab_size=64, token_width=4, max_context=256)
        assert (c.norm, c.positions, c.mlp, c.fused_qkv, c.tie_head) == (
            "layernorm", "learned", "gelu", True, False)
    for kind in KINDS:
        c = config_from_arch(load_arch(kind), max_context=12)
        count = sum(x.size for x in jax.tree.leaves(jax.eval_shape(
            Transformer(c).init, jax.random.PRNGKey(0))))
        assert count == c.num_params(), kind


def load_arch(kind):
    return from_hf_config(FAMILY_CONFIGS[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_parameter_map_is_the_decoders_tree_and_round_trips(checkpoints, tmp_path, kind):
    """The tree `params_from_table` builds is exactly the one the decoder's
    `init` declares (names, shapes, dtypes), and `table_from_params` gives
    the table back bit for bit, which `export_hf` writes and jaxil reads
    again to the same parameters. Fails when the name map drifts from the
    modules (a parameter renamed or added in transformer.py but not in the
    map would otherwise surface only as a flax error at apply time), or when
    the fused qkv is unstacked in the wrong order on export."""
    _, _, path = checkpoints[kind]
    ckpt = load_checkpoint(path)
    config = config_from_arch(ckpt.arch, max_context=ckpt.arch.max_positions)
    params = params_from_table(config, ckpt.params)
    declared = jax.eval_shape(Transformer(config).init, jax.random.PRNGKey(0))
    assert jax.tree.map(lambda x: (x.shape, x.dtype), params) == jax.tree.map(
        lambda x: (x.shape, x.dtype), declared)
    back = table_from_params(config, params)
    assert sorted(back) == sorted(ckpt.params)
    for name, value in ckpt.params.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)
    export_hf(tmp_path / "out", ckpt.arch, back)
    config2, params2 = from_pretrained(tmp_path / "out")
    assert config2 == config
    jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_mismatched_tables_and_options_fail_in_one_line(checkpoints):
    """A table entry of the wrong shape, one missing, one extra, a context
    past GPT-2's position table, an unknown dtype, and configurations the
    decoder cannot build each raise one line naming the problem. Fails when
    a misshaped array is reshaped silently into the tree (a [d, H·D] q
    kernel of the wrong width still reshapes when H·D divides) or when the
    error is a traceback from deep inside flax."""
    _, _, path = checkpoints["qwen3"]
    ckpt = load_checkpoint(path)
    config = config_from_arch(ckpt.arch, max_context=12)
    table = dict(ckpt.params)
    params_from_table(config, table)
    bad = dict(table, **{"layers.1.attn.k.kernel": np.zeros((16, 12), np.float32)})
    with pytest.raises(CheckpointError, match=r"layers\.1\.attn\.k\.kernel has shape \[16, 12\], "
                                              r"expected \[16, 6\]") as e:
        params_from_table(config, bad)
    assert "\n" not in str(e.value)
    missing = {k: v for k, v in table.items() if k != "layers.0.attn.q_norm.scale"}
    with pytest.raises(CheckpointError, match="missing parameter layers.0.attn.q_norm.scale"):
        params_from_table(config, missing)
    with pytest.raises(CheckpointError, match="extra parameter layers.0.attn.o.bias"):
        params_from_table(config, dict(table, **{"layers.0.attn.o.bias": np.zeros(16)}))
    with pytest.raises(CheckpointError, match="max_context 13 does not fit .* 12 learned"):
        from_pretrained(checkpoints["gpt2"][2], max_context=13)
    with pytest.raises(CheckpointError, match="dtype 'float16' is not supported"):
        from_pretrained(path, dtype="float16")
    base = dict(vocab_size=8, token_width=1, max_context=8, d_model=16, num_heads=4)
    with pytest.raises(ValueError, match="fused_qkv needs num_kv_heads == num_heads"):
        TransformerConfig(**base, num_kv_heads=2)
    with pytest.raises(ValueError, match="norm='batchnorm'; choose one of"):
        TransformerConfig(**base, norm="batchnorm")
    with pytest.raises(ValueError, match="pad_id=8 is not a token id"):
        TransformerConfig(**base, pad_id=8)


def test_bfloat16_parameters_and_compute(checkpoints):
    """`dtype="bfloat16"` stores bf16 parameters; with float32 compute the
    logits equal the float32 decoder's on the bf16-rounded weights, and with
    bf16 compute they stay close to float32's. Fails when the parameter
    dtype is ignored (float32 storage), when bf16 parameters are not
    promoted to the compute dtype, or when the cache or logits leave their
    dtypes."""
    _, _, path = checkpoints["qwen2"]
    c32, p32 = from_pretrained(path, max_context=12)
    cbf, pbf = from_pretrained(path, "bfloat16", max_context=12, compute_dtype="float32")
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(pbf))
    tokens = jnp.asarray(_tokens(np.random.default_rng(1), c32.vocab_size, (1, 9)))
    rounded = jax.tree.map(lambda x: x.astype(jnp.float32), pbf)
    want = np.asarray(_logits_program(c32, True)(rounded, tokens))
    got = np.asarray(_logits_program(cbf, True)(pbf, tokens))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    cb, pb = from_pretrained(path, "bfloat16", max_context=12)
    assert cb.dtype == "bfloat16" and all(k.dtype == jnp.bfloat16 for k in Transformer(cb).empty_cache().k)
    low = np.asarray(_logits_program(cb, True)(pb, tokens))
    assert low.dtype == np.float32
    assert np.abs(low - want).max() < 0.05 * np.abs(want).max()
    assert np.abs(low - want).max() > 0, "bf16 compute should round somewhere"
