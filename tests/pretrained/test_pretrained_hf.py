"""HF directories: tiny checkpoints written in transformers' layout, loaded,
compared with the hand-mapped arrays, exported back, and each malformed one
refused with its one-line error."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from helpers.pretrained import CONFIGS, canonical_of_hf, hf_tensors, write_hf
from jaxil.pretrained import CheckpointError, export_hf, load_checkpoint, param_shapes, read_hf


@pytest.mark.parametrize("kind,shards", [("gpt2", 1), ("llama", 1), ("qwen2", 3), ("qwen3", 1)])
def test_hf_checkpoints_load_exactly_as_mapped_by_hand(tmp_path, kind, shards):
    """Fails when a rule maps a tensor to the wrong name, forgets a transpose
    (q_proj is [d_out, d_in], GPT-2's Conv1D [d_in, d_out]), splits GPT-2's
    c_attn in the wrong order, drops Qwen2's biases or Qwen3's q/k norms, or
    reads only one shard of an index."""
    hf = hf_tensors(kind)
    arch, params = read_hf(write_hf(tmp_path, kind, hf, shards=shards))
    want = canonical_of_hf(kind, hf, CONFIGS[kind])
    assert sorted(params) == sorted(want) == sorted(param_shapes(arch))
    for name, value in want.items():
        np.testing.assert_array_equal(params[name], value, err_msg=name)
        assert params[name].dtype == np.float32 and params[name].flags.c_contiguous
    assert arch.qkv_bias == (kind in ("gpt2", "qwen2")) and arch.qk_norm == (kind == "qwen3")
    assert arch.tie_embeddings == CONFIGS[kind].get("tie_word_embeddings", True)
    assert arch.head_dim == (6 if kind == "qwen3" else 4)


def test_bfloat16_tensors_and_the_bfloat16_output_option(tmp_path):
    """Fails when bf16 safetensors do not load without torch, or the bf16
    option does not cast (or casts a float32 checkpoint wrongly)."""
    hf = {k: v.astype(ml_dtypes.bfloat16) for k, v in hf_tensors("llama").items()}
    directory = write_hf(tmp_path, "llama", hf)
    _, f32 = read_hf(directory)
    _, bf16 = read_hf(directory, dtype="bfloat16")
    name = "layers.1.attn.k.kernel"
    assert f32[name].dtype == np.float32 and bf16[name].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(f32[name], hf["model.layers.1.self_attn.k_proj.weight"].T
                                  .astype(np.float32))
    np.testing.assert_array_equal(bf16[name].astype(np.float32), f32[name])


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_export_writes_the_original_hf_names_and_arrays(tmp_path, kind):
    """Fails when export does not invert the load mapping: a transpose left
    out, c_attn re-fused in another order, GPT-2 names without the
    `transformer.` prefix transformers' GPT2LMHeadModel expects, or a config
    that reads back as another architecture."""
    hf = hf_tensors(kind)
    arch, params = read_hf(write_hf(tmp_path / "in", kind, hf))
    out = export_hf(tmp_path / "out", arch, params)
    written = load_file(str(out / "model.safetensors"))
    want = {k: v for k, v in hf.items() if not k.endswith("attn.bias") or "c_attn" in k}
    assert sorted(written) == sorted(want)
    for name, value in want.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)
    arch2, params2 = read_hf(out)
    assert arch2 == arch
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [CONFIGS[kind]["architectures"][0]]


def test_export_refuses_a_table_that_does_not_match_and_writes_nothing(tmp_path):
    """Fails when a misshaped table is exported (a checkpoint transformers
    then refuses or, worse, loads wrong)."""
    arch, params = read_hf(write_hf(tmp_path / "in", "llama"))
    params["layers.0.attn.k.kernel"] = params["layers.0.attn.k.kernel"].T.copy()
    with pytest.raises(CheckpointError, match=r"attn\.k\.kernel has shape \[8, 16\], expected "
                                              r"\[16, 8\]"):
        export_hf(tmp_path / "out", arch, params)
    params["layers.0.attn.k.kernel"] = params["layers.0.attn.k.kernel"].T.copy()
    with pytest.raises(CheckpointError, match="extra parameter layers.0.attn.q.bias"):
        export_hf(tmp_path / "out", arch, {**params, "layers.0.attn.q.bias": np.ones(16)})
    assert not (tmp_path / "out").exists()


def _one_line(excinfo):
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_unsupported_architectures_name_the_supported_ones(tmp_path):
    """Fails when an unknown model type loads as some default, or its error
    does not say what is supported."""
    config = {**CONFIGS["llama"], "model_type": "mamba", "architectures": ["MambaForCausalLM"]}
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(write_hf(tmp_path / "a", "llama", config=config))
    assert "mamba" in _one_line(e) and "llama (LlamaForCausalLM)" in str(e.value) \
        and "qwen3" in str(e.value)
    config = {**CONFIGS["llama"], "architectures": ["LlamaForSequenceClassification"]}
    with pytest.raises(CheckpointError, match="not a causal LM.*supported: gpt2"):
        load_checkpoint(write_hf(tmp_path / "b", "llama", config=config))
    config = {**CONFIGS["llama"], "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    with pytest.raises(CheckpointError, match="rope_scaling .*yarn.* not supported: rope_type "
                                              "must be linear"):
        load_checkpoint(write_hf(tmp_path / "c", "llama", config=config))


def test_missing_extra_and_misshaped_tensors_are_named(tmp_path):
    """Fails when a checkpoint with a tensor too few, one too many, or one
    of the wrong shape loads (the decoder would fail later, far from the cause,
    or run on garbage), or when the message does not name the tensor."""
    hf = hf_tensors("llama")
    del hf["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(CheckpointError) as e:
        read_hf(write_hf(tmp_path / "a", "llama", hf))
    assert "missing tensor model.layers.1.mlp.up_proj.weight (layers.1.mlp.up.kernel" \
        in _one_line(e)
    hf = {**hf_tensors("llama"), "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(2)}
    with pytest.raises(CheckpointError, match="extra tensor model.layers.0.self_attn.rotary_emb"):
        read_hf(write_hf(tmp_path / "b", "llama", hf))
    hf = {**hf_tensors("llama"), "model.layers.0.self_attn.q_proj.bias": np.ones(16, np.float32)}
    with pytest.raises(CheckpointError, match=r"extra tensor .*q_proj.bias \(layers.0.attn.q.bias\)"):
        read_hf(write_hf(tmp_path / "c", "llama", hf))
    hf = hf_tensors("llama")
    hf["model.layers.0.self_attn.k_proj.weight"] = np.ones((16, 16), np.float32)
    with pytest.raises(CheckpointError) as e:
        read_hf(write_hf(tmp_path / "d", "llama", hf))
    assert "tensor model.layers.0.self_attn.k_proj.weight (layers.0.attn.k.kernel) has shape " \
           "[16, 16], which gives [16, 16], expected [16, 8]" in _one_line(e)


def test_a_tied_head_stored_anyway_loads_only_when_it_is_the_embedding(tmp_path):
    """Fails when a tied checkpoint that also stores its (equal) head is
    refused, or one whose stored head differs loads with the embedding as head."""
    hf = hf_tensors("qwen2")
    hf["lm_head.weight"] = hf["model.embed_tokens.weight"].copy()
    _, params = read_hf(write_hf(tmp_path / "a", "qwen2", hf))
    assert "lm_head.kernel" not in params
    hf["lm_head.weight"] = hf["lm_head.weight"] + 1
    with pytest.raises(CheckpointError, match="extra tensor lm_head.weight: the config ties"):
        read_hf(write_hf(tmp_path / "b", "qwen2", hf))


def test_paths_that_are_not_checkpoints(tmp_path):
    """Fails when a directory without config.json, one with only
    pytorch_model.bin, a corrupt safetensors file or a stray file are not
    refused with a line that says what was expected."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json, so not an HF checkpoint"):
        load_checkpoint(tmp_path / "empty")
    d = tmp_path / "bin"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIGS["llama"]))
    (d / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="holds pytorch_model.bin: convert to safetensors"):
        load_checkpoint(d)
    (d / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="model.safetensors: not a safetensors file"):
        load_checkpoint(d)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match="notes.txt: not a checkpoint"):
        load_checkpoint(tmp_path / "notes.txt")
    save_file({"a": np.ones(2, np.float32)}, str(tmp_path / "loose.safetensors"))
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(tmp_path / "loose.safetensors")
