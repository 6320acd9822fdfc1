"""Tiny checkpoints written by hand in each file format's own layout.

The HF tensors are written the way transformers stores them (`[d_out, d_in]`
Linear weights, GPT-2's Conv1D `[d_in, d_out]` with a fused `c_attn`), the
GGUF ones the way llama.cpp's converter does (Llama q/k interleaved per
rotary head), independently of jaxil's name tables, so a loader that gets a
transpose or a permutation wrong does not agree with them.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from gguf import quants
from safetensors.numpy import save_file

from jaxil.pretrained.tokenizer import bytes_to_unicode

# HF config.json of the tiny models: d 16, 2 blocks, vocab 40.
CONFIGS = {
    "gpt2": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 40,
             "n_embd": 16, "n_layer": 2, "n_head": 4, "n_positions": 12, "n_inner": 24,
             "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
             "bos_token_id": 0, "eos_token_id": 0},
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 40,
              "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
              "rms_norm_eps": 1e-5, "rope_theta": 500.0, "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2},
    "qwen2": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 40,
              "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True,
              "use_sliding_window": False},
    "qwen3": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 40,
              "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 6,
              "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
              "tie_word_embeddings": False},
}


def hf_tensors(kind: str, seed: int = 0, config=None) -> dict[str, np.ndarray]:
    """`{HF name: array}` of a tiny model in transformers' layout (of
    `config`, default `CONFIGS[kind]`)."""
    c = CONFIGS[kind] if config is None else config
    r = np.random.default_rng(seed)

    def w(*shape):
        return r.standard_normal(shape).astype(np.float32)

    v = c["vocab_size"]
    if kind == "gpt2":
        d, f, p = c["n_embd"], c["n_inner"], c["n_positions"]
        out = {"transformer.wte.weight": w(v, d), "transformer.wpe.weight": w(p, d),
               "transformer.ln_f.weight": w(d), "transformer.ln_f.bias": w(d)}
        for i in range(c["n_layer"]):
            h = f"transformer.h.{i}."
            out.update({h + "ln_1.weight": w(d), h + "ln_1.bias": w(d),
                        h + "attn.c_attn.weight": w(d, 3 * d), h + "attn.c_attn.bias": w(3 * d),
                        h + "attn.c_proj.weight": w(d, d), h + "attn.c_proj.bias": w(d),
                        h + "ln_2.weight": w(d), h + "ln_2.bias": w(d),
                        h + "mlp.c_fc.weight": w(d, f), h + "mlp.c_fc.bias": w(f),
                        h + "mlp.c_proj.weight": w(f, d), h + "mlp.c_proj.bias": w(d),
                        h + "attn.bias": np.tril(np.ones((1, 1, p, p), np.float32))})
        return out
    d, f = c["hidden_size"], c["intermediate_size"]
    hd = c.get("head_dim", d // c["num_attention_heads"])
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = {"model.embed_tokens.weight": w(v, d), "model.norm.weight": w(d)}
    if not c["tie_word_embeddings"]:
        out["lm_head.weight"] = w(v, d)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": w(d), p + "post_attention_layernorm.weight": w(d),
                    p + "self_attn.q_proj.weight": w(q, d), p + "self_attn.k_proj.weight": w(kv, d),
                    p + "self_attn.v_proj.weight": w(kv, d), p + "self_attn.o_proj.weight": w(d, q),
                    p + "mlp.gate_proj.weight": w(f, d), p + "mlp.up_proj.weight": w(f, d),
                    p + "mlp.down_proj.weight": w(d, f)})
        if kind == "qwen2":
            out.update({p + "self_attn.q_proj.bias": w(q), p + "self_attn.k_proj.bias": w(kv),
                        p + "self_attn.v_proj.bias": w(kv)})
        if kind == "qwen3":
            out.update({p + "self_attn.q_norm.weight": w(hd), p + "self_attn.k_norm.weight": w(hd)})
    return out


def expected_llama(hf, c):
    """The canonical table of Llama-family HF tensors, mapped by hand."""
    out = {"embed.embedding": hf["model.embed_tokens.weight"],
           "final_norm.scale": hf["model.norm.weight"]}
    if "lm_head.weight" in hf:
        out["lm_head.kernel"] = hf["lm_head.weight"].T
    for i in range(c["num_hidden_layers"]):
        p, a = f"model.layers.{i}.", f"layers.{i}."
        out[a + "attn_norm.scale"] = hf[p + "input_layernorm.weight"]
        out[a + "mlp_norm.scale"] = hf[p + "post_attention_layernorm.weight"]
        for x in "qkvo":
            out[a + f"attn.{x}.kernel"] = hf[p + f"self_attn.{x}_proj.weight"].T
            if p + f"self_attn.{x}_proj.bias" in hf:
                out[a + f"attn.{x}.bias"] = hf[p + f"self_attn.{x}_proj.bias"]
        for x in "qk":
            if p + f"self_attn.{x}_norm.weight" in hf:
                out[a + f"attn.{x}_norm.scale"] = hf[p + f"self_attn.{x}_norm.weight"]
        for x in ("gate", "up", "down"):
            out[a + f"mlp.{x}.kernel"] = hf[p + f"mlp.{x}_proj.weight"].T
    return out


def expected_gpt2(hf, c):
    """The canonical table of GPT-2 HF tensors (Conv1D, fused c_attn), by hand."""
    t, d = "transformer.", c["n_embd"]
    out = {"embed.embedding": hf[t + "wte.weight"], "pos_embed.embedding": hf[t + "wpe.weight"],
           "final_norm.scale": hf[t + "ln_f.weight"], "final_norm.bias": hf[t + "ln_f.bias"]}
    for i in range(c["n_layer"]):
        h, a = f"{t}h.{i}.", f"layers.{i}."
        for j, x in enumerate("qkv"):
            out[a + f"attn.{x}.kernel"] = hf[h + "attn.c_attn.weight"][:, j * d:(j + 1) * d]
            out[a + f"attn.{x}.bias"] = hf[h + "attn.c_attn.bias"][j * d:(j + 1) * d]
        out[a + "attn.o.kernel"] = hf[h + "attn.c_proj.weight"]
        out[a + "attn.o.bias"] = hf[h + "attn.c_proj.bias"]
        for n, src in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2")):
            out[a + f"{n}.scale"] = hf[h + f"{src}.weight"]
            out[a + f"{n}.bias"] = hf[h + f"{src}.bias"]
        out[a + "mlp.up.kernel"] = hf[h + "mlp.c_fc.weight"]
        out[a + "mlp.up.bias"] = hf[h + "mlp.c_fc.bias"]
        out[a + "mlp.down.kernel"] = hf[h + "mlp.c_proj.weight"]
        out[a + "mlp.down.bias"] = hf[h + "mlp.c_proj.bias"]
    return out


def canonical_of_hf(kind: str, hf, config) -> dict[str, np.ndarray]:
    """The canonical table of HF tensors, mapped by hand (not with jaxil's tables)."""
    return (expected_gpt2 if kind == "gpt2" else expected_llama)(hf, config)


def write_hf(directory: Path, kind: str, tensors=None, config=None, shards: int = 1) -> Path:
    """An HF directory of a tiny model (`shards > 1`: an index and shards)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = hf_tensors(kind) if tensors is None else tensors
    (directory / "config.json").write_text(json.dumps(config or CONFIGS[kind]))
    if shards == 1:
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return directory
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, str(directory / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: HF's half-split rotary rows of
    each head interleaved as llama.cpp stores them."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


# The GGUF model: d 32 (Q8_0 blocks are 32 wide), the BPE vocabulary's 270 rows.
GGUF_LLAMA = {**CONFIGS["llama"], "vocab_size": 270, "hidden_size": 32, "intermediate_size": 64}

# GGUF GPT-2 and Qwen models of the same vocabulary (GPT-2 ties its head).
GGUF_MODELS = {
    "llama": GGUF_LLAMA,
    "gpt2": {**CONFIGS["gpt2"], "vocab_size": 270, "n_embd": 32, "n_inner": 128,
             "n_positions": 1024},
    "qwen2": {**CONFIGS["qwen2"], "vocab_size": 270, "hidden_size": 32, "intermediate_size": 64},
    "qwen3": {**CONFIGS["qwen3"], "vocab_size": 270, "hidden_size": 32, "intermediate_size": 64},
}

# A byte-level BPE of a few merges (byte-level spelling, `Ġ` is the space).
BPE_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BPE_MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "1 2", "12 3", "Ġ 1", "e r", "Ġ w"]


def bpe_vocab() -> tuple[list[str], list[str], list[int]]:
    """`(tokens, merges, token types)`: 3 control tokens, the 256 byte
    characters, one token per merge, and `<think>` as a user-defined token."""
    tokens = list(BPE_TOKENS) + [bytes_to_unicode()[b] for b in range(256)]
    tokens += ["".join(m.split(" ")) for m in BPE_MERGES] + ["<think>"]
    types = [3] * len(BPE_TOKENS) + [1] * (len(tokens) - len(BPE_TOKENS) - 1) + [4]
    return tokens, list(BPE_MERGES), types


CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'tool' %}"
    "{{ raise_exception('tool turns are not supported') }}{% endif %}"
    "{{ bos_token + message['role'] + '\n' + message['content'] | trim + eos_token + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ bos_token + 'assistant\n' }}{% endif %}")


def gguf_layout(hf: dict[str, np.ndarray], config: dict, kind: str) -> dict[str, np.ndarray]:
    """`{GGUF name: array}` of HF tensors, converted as llama.cpp's
    convert_hf_to_gguf converts them: Llama's q/k permuted, GPT-2's Conv1D
    weights transposed to `[d_out, d_in]`, its causal-mask buffers dropped."""
    out = {}
    if kind == "gpt2":
        top = {"wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
               "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias"}
        sub = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
               "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
        for name, value in hf.items():
            name = name.removeprefix("transformer.")
            if name in top:
                out[top[name]] = value
            elif not name.endswith(".attn.bias"):  # the mask buffer, not c_attn.bias
                _, i, rest = name.split(".", 2)
                part, _, leaf = rest.rpartition(".")
                transpose = leaf == "weight" and part != "ln_1" and part != "ln_2"
                out[f"blk.{i}.{sub[part]}.{leaf}"] = value.T.copy() if transpose else value
        return out
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}
    sub = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
           "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
           "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
           "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
           "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, value in hf.items():
        if name in top:
            g = top[name]
        else:
            _, _, i, rest = name.split(".", 3)
            part, _, leaf = rest.rpartition(".")
            g = f"blk.{i}.{sub[part]}.{leaf}"
        if kind == "llama" and ".attn_q." in g:
            value = llama_cpp_permute(value, heads)
        elif kind == "llama" and ".attn_k." in g:
            value = llama_cpp_permute(value, kv)
        out[g] = value
    return out


def write_gguf(path: Path, hf: dict[str, np.ndarray], config: dict, quantize=(),
               extra=None, pre="smollm", drop=(), kind: str = "llama") -> dict[str, np.ndarray]:
    """A GGUF of HF-layout tensors the way llama.cpp converts them.

    Args:
        path: the file.
        hf: HF tensors of `config` (`hf_tensors(kind, config=config)`).
        config: its config.json.
        quantize: GGUF names stored as Q8_0.
        extra: `{GGUF name: (raw bytes array, GGMLQuantizationType)}` stored as given.
        pre: `tokenizer.ggml.pre`.
        drop: GGUF names left out.
        kind: `llama`, `qwen2`, `qwen3` or `gpt2` (`general.architecture`).

    Returns:
        `{GGUF name: what a reader should dequantize}` (the Q8_0 round trip
        for quantized tensors).
    """
    c = config
    stored = {g: v for g, v in gguf_layout(hf, c, kind).items() if g not in drop}
    w = gguf.GGUFWriter(str(path), kind)
    if kind == "gpt2":
        w.add_block_count(c["n_layer"])
        w.add_context_length(c["n_positions"])
        w.add_embedding_length(c["n_embd"])
        w.add_feed_forward_length(c["n_inner"])
        w.add_head_count(c["n_head"])
        w.add_layer_norm_eps(c["layer_norm_epsilon"])
    else:
        w.add_block_count(c["num_hidden_layers"])
        w.add_context_length(c["max_position_embeddings"])
        w.add_embedding_length(c["hidden_size"])
        w.add_feed_forward_length(c["intermediate_size"])
        w.add_head_count(c["num_attention_heads"])
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_rope_freq_base(c["rope_theta"])
        w.add_layer_norm_rms_eps(c["rms_norm_eps"])
        if "head_dim" in c:
            w.add_key_length(c["head_dim"])
            w.add_value_length(c["head_dim"])
    w.add_vocab_size(c["vocab_size"])
    tokens, merges, types = bpe_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_chat_template(CHAT_TEMPLATE)
    expected = {}
    for g, value in stored.items():
        if g in quantize:
            q = quants.quantize(value, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(g, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            expected[g] = quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(g, value)
            expected[g] = value
    for g, (raw, kind) in (extra or {}).items():
        w.add_tensor(g, raw, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected
