"""Tokenizers: the byte-level BPE built from GGUF metadata against one built
directly with the tokenizers library from the same vocabulary and merges,
and the special tokens of GGUF metadata and of HF files."""

from __future__ import annotations

import json

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from helpers.pretrained import bpe_vocab
from jaxil.pretrained import CheckpointError, gguf_tokenizer, hf_tokenizer

STRINGS = [
    "the weather", " the  the\tthe\n\nthe", "123 1234 12 3 x123y", "héllo wörld ünïcode 日本語 🤖",
    "<|im_start|>user\nhi<|im_end|>\n", "def f(x):\n    return x * 2  # 12\n", "  leading",
    "trailing   ", "", "<think>1 2 3</think>", "where were we? we'll see.", "ÿ\x00\x7f\u00a0",
]


def meta(pre="smollm", add_bos=False):
    tokens, merges, types = bpe_vocab()
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.padding_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_bos_token": add_bos}


def reference(digits: bool) -> Tokenizer:
    """The same BPE assembled directly: ByteLevel (GPT-2 regex), digits
    isolated first when `digits`, control tokens special, `<think>` added."""
    tokens, merges, _ = bpe_vocab()
    vocab = {t: i for i, t in enumerate(tokens[:-1])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split()) for m in merges]))
    level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), level]) if digits else level
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in tokens[:3]])
    tok.add_tokens([AddedToken("<think>", normalized=False)])
    return tok


@pytest.mark.parametrize("pre,reading,digits", [
    ("smollm", "llama.cpp", True), ("smollm", "transformers", False), ("gpt2", "llama.cpp", False),
    (None, "transformers", False)])
def test_gguf_bpe_equals_the_tokenizers_bpe_of_the_same_vocabulary(pre, reading, digits):
    """Fails when the GGUF tokenizer pre-tokenizes other than its `pre` asks
    under each reading (llama.cpp's SmolLM isolates digits, so the merge `1 2`
    never applies; transformers' GPT-2 regex lets it), splits a control token
    such as `<|im_end|>` into pieces, cuts the user-defined `<think>`, or does
    not decode back to the text."""
    tok, _ = gguf_tokenizer(meta(pre), reading=reading)
    ref = reference(digits)
    for s in STRINGS:
        ids = tok.encode(s, add_special_tokens=False).ids
        assert ids == ref.encode(s, add_special_tokens=False).ids, s
        assert tok.decode(ids, skip_special_tokens=False) == s
    ids = tok.encode("<|im_end|>123").ids
    assert ids[0] == 2 and (len(ids) == 4) == digits
    if digits:  # whitespace before a digit: its own piece once digits are isolated
        assert tok.encode("  1").ids != reference(False).encode("  1").ids
    assert tok.get_vocab_size() == len(bpe_vocab()[0])


def test_gguf_special_tokens_and_add_bos():
    """Fails when BOS/EOS/pad are not read from the metadata ids, the end of
    turn is not found, or `add_bos_token` does not put BOS in front."""
    tok, special = gguf_tokenizer(meta(add_bos=True))
    assert (special.bos, special.eos, special.pad, special.unk) == (
        "<|im_start|>", "<|im_end|>", "<|im_end|>", "<|endoftext|>")
    assert (special.bos_id, special.eos_id, special.end_of_turn_id) == (1, 2, 2)
    assert tok.encode("the").ids[0] == 1 and tok.encode("the", add_special_tokens=False).ids[0] != 1
    assert special.template_variables()["eos_token"] == "<|im_end|>"
    _, plain = gguf_tokenizer(meta())
    assert not plain.add_bos


def test_gguf_tokenizers_jaxil_does_not_build_are_refused():
    """Fails when a sentencepiece GGUF is silently built as byte-level BPE."""
    with pytest.raises(CheckpointError, match="tokenizer.ggml.model 'llama' is not supported"):
        gguf_tokenizer({**meta(), "tokenizer.ggml.model": "llama"})


def test_hf_tokenizer_json_and_its_special_tokens(tmp_path):
    """Fails when tokenizer.json is not the tokenizer used, or the special
    tokens of tokenizer_config.json (dicts or strings) are not read."""
    ref = reference(digits=True)
    ref.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<|im_start|>"}, "eos_token": "<|im_end|>",
        "add_bos_token": False}))
    tok, special = hf_tokenizer(tmp_path)
    assert tok.encode(STRINGS[2]).ids == ref.encode(STRINGS[2]).ids
    assert (special.bos_id, special.eos_id, special.end_of_turn) == (1, 2, "<|im_end|>")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="tokenizer.json: not a tokenizers file"):
        hf_tokenizer(tmp_path)
