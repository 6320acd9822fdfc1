"""A pretrained model in a token task's vocabulary (jaxil.nn.task_vocab).

Tiny GGUF checkpoints written by the test (tests/helpers/pretrained.py): a
byte-level BPE of 270 tokens, so single characters and `12` (a merge) are
one model token and longer words are composed of their bytes. Llama (untied
head) and Qwen2 (tied head) cover both head layouts.
"""

import dataclasses

import jax
import numpy as np
import pytest

from jaxil import envs
from jaxil.nn.pretrained_params import from_checkpoint
from jaxil.nn.task_vocab import export_model, map_vocab, task_decoder
from jaxil.nn.transformer import Transformer
from jaxil.pretrained import CheckpointError, load_checkpoint

from helpers.pretrained import GGUF_MODELS, hf_tensors, write_gguf


@pytest.fixture(scope="module")
def env():
    return envs.make("tokens:arith", num_ops=1)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def ckpt(request, tmp_path_factory):
    kind = request.param
    path = tmp_path_factory.mktemp(kind) / "m.gguf"
    config = GGUF_MODELS[kind]
    write_gguf(path, hf_tensors(kind, config=config), config, kind=kind)
    return load_checkpoint(path)


def _exact_context(vocab, names):
    return np.asarray([vocab.names.index(n) for n in names], np.int32)


def test_spellings_pick_single_tokens_specials_by_id_and_the_fewest_pieces(ckpt, env):
    """Against the tokenizer read by hand: `<bos>` / `<eot>` take the
    model's BOS and end-of-turn ids (not their text `"<bos>"` spelled in
    bytes), a one-character word its byte token, `12` its merge, a word
    with no single token the spelling with the fewest pieces (`TEST`: 4
    bytes rather than `" TEST"`'s 5; of two spellings as short, the first),
    PAD nothing. Kills spellings tried
    in the wrong order, the first spelling taken whatever its length, and
    specials spelled as text."""
    tok = ckpt.tokenizer
    v = map_vocab(env.vocab.names, tok, ckpt.special, ckpt.arch.vocab_size)
    pieces = dict(zip(v.names, v.pieces))
    assert pieces["<pad>"] == ()
    assert pieces["<bos>"] == (ckpt.special.bos_id,) == (1,)
    assert pieces["<eot>"] == (ckpt.special.end_of_turn_id,) == (2,)
    for word in ("A", "B", "=", "+", "7"):
        assert pieces[word] == (tok.token_to_id(word),)
    assert pieces["12"] == (tok.token_to_id("12"),)
    assert pieces["TEST"] == tuple(tok.token_to_id(c) for c in "TEST")
    # " 13" (Ġ1, 3) and "13" (1, 3) tie at two pieces: the first spelling wins
    assert pieces["13"] == (tok.token_to_id("Ġ1"), tok.token_to_id("3"))
    assert "TEST" in v.composed and "12" not in v.composed and "A" not in v.composed
    ids = v.export_ids
    assert ids[0] == -1 and ids[v.names.index("A")] == tok.token_to_id("A")
    composed = [v.names.index(n) for n in v.composed]
    assert ids[composed].tolist() == list(range(270, 270 + len(composed)))


def test_task_decoder_rows_are_the_pretrained_rows_at_the_mapped_ids(ckpt, env):
    """The task decoder's embedding rows (and untied head columns) against a
    float64 numpy gather of the checkpoint's table: the mapped row, the mean
    of a composed token's pieces, zero for PAD; every other parameter is the
    checkpoint's. Kills rows gathered off by one, head columns taken from the
    embedding (or not gathered), and PAD given a real token's row."""
    m = task_decoder(ckpt, env)
    emb = np.asarray(ckpt.params["embed.embedding"], np.float64)
    want = np.stack([emb[list(p)].mean(0) if p else np.zeros(emb.shape[1])
                     for p in m.vocab.pieces])
    p = m.params["params"]
    np.testing.assert_allclose(np.asarray(p["token_embed"]["embedding"]), want, atol=1e-6)
    assert m.config.vocab_size == len(env.vocab) and m.config.pad_id == 0
    assert (m.config.token_width, m.config.max_context) == (env.token_width, env.max_context)
    if "lm_head.kernel" in ckpt.params:
        head = np.asarray(ckpt.params["lm_head.kernel"], np.float64)
        want_h = np.stack([head[:, list(q)].mean(1) if q else np.zeros(head.shape[0])
                           for q in m.vocab.pieces], axis=1)
        np.testing.assert_allclose(np.asarray(p["head"]["kernel"]), want_h, atol=1e-6)
    else:
        assert "head" not in p
    _, full = from_checkpoint(ckpt)
    np.testing.assert_array_equal(np.asarray(p["blocks_1"]["mlp_out"]["kernel"]),
                                  np.asarray(full["params"]["blocks_1"]["mlp_out"]["kernel"]))


def test_tied_task_decoder_gives_the_models_logits_at_the_mapped_ids(ckpt, env):
    """With a tied head, on a context of exact tokens the task decoder's
    logits are the full model's logits at the mapped ids, also with PAD
    slots inside the context (skipped: they take no position). Kills a
    task config without `pad_id=0` (PAD would shift the rotary positions),
    and any misalignment between the gathered rows and the ids."""
    if not ckpt.arch.tie_embeddings:
        pytest.skip("the identity holds for a tied head")
    m = task_decoder(ckpt, env)
    names = ["<bos>", "A", "=", "1", "2", "+", "B", "12", "<eot>", "7"]
    ctx = _exact_context(m.vocab, names)
    full_cfg, full = from_checkpoint(ckpt, max_context=env.max_context)
    mapped = np.asarray([m.vocab.pieces[i][0] for i in ctx], np.int32)
    ref = np.asarray(jax.jit(Transformer(full_cfg).sequence_logits)(full, mapped))
    exact = np.asarray([len(q) == 1 for q in m.vocab.pieces])
    ids = np.asarray([q[0] if len(q) == 1 else 0 for q in m.vocab.pieces])
    net = jax.jit(Transformer(m.config).sequence_logits)
    got = np.asarray(net(m.params, ctx))
    np.testing.assert_allclose(got[:, exact], ref[:, ids[exact]], atol=2e-5, rtol=1e-5)
    padded = np.insert(ctx, [2, 2, 5], 0)
    got_pad = np.asarray(net(m.params, padded))
    real = padded != 0
    np.testing.assert_allclose(got_pad[real][:, exact], ref[:, ids[exact]], atol=2e-5, rtol=1e-5)


def test_exported_model_gives_the_fine_tuned_logits_on_every_task_token(ckpt, env, tmp_path):
    """Perturb every parameter of the task decoder (a stand-in for
    fine-tuning), export it as an HF directory, load that with jaxil's
    loader: on a context of task tokens (composed ones included, read at
    their appended ids) the full model's logits at the export ids equal
    the task decoder's. Kills an export that writes the pretrained rows back
    instead of the fine-tuned ones, scatters to the wrong ids, drops the
    composed rows, or leaves a non-vocabulary parameter unwritten."""
    m = task_decoder(ckpt, env)
    rng = np.random.default_rng(3)
    tuned = jax.tree.map(lambda x: x + 0.05 * rng.standard_normal(x.shape).astype(np.float32),
                         m.params)
    export_model(tmp_path / "hf", m, tuned)
    back = load_checkpoint(tmp_path / "hf")
    assert back.arch.vocab_size == ckpt.arch.vocab_size + len(m.vocab.composed)
    full_cfg, full = from_checkpoint(back, max_context=env.max_context)
    ctx = _exact_context(m.vocab, ["<bos>", "arith", "CALC", "13", "+", "A", "<eot>", "GOT",
                                   "31", "SUBMIT"])
    ids = m.vocab.export_ids
    full_logits = jax.jit(Transformer(full_cfg).sequence_logits)
    ref = np.asarray(full_logits(full, ids[ctx].astype(np.int32)))
    got = np.asarray(jax.jit(Transformer(m.config).sequence_logits)(tuned, ctx))
    np.testing.assert_allclose(got[:, 1:], ref[:, ids[1:]], atol=5e-5, rtol=1e-5)
    untouched = np.setdiff1d(np.arange(ckpt.arch.vocab_size), ids[1:])
    np.testing.assert_array_equal(np.asarray(back.params["embed.embedding"])[untouched],
                                  np.asarray(ckpt.params["embed.embedding"])[untouched])


def test_vocabularies_that_do_not_map_are_refused_in_one_line(ckpt, env):
    """`compose=False` names the tokens that are not one model token; two
    task tokens spelled onto one model token are named together; a spelling
    of a word the task lacks, and a model without a tokenizer, are refused.
    Kills a silent duplicate (two task tokens sharing one row and one
    logit) and a strict mode that composes anyway."""
    names, tok, sp, n = env.vocab.names, ckpt.tokenizer, ckpt.special, ckpt.arch.vocab_size
    cases = [
        (dict(compose=False), "are not one model token: '<wait>'"),
        (dict(spellings={"A": "B"}), "task tokens 'A' ('B') and 'B' ('B') map to the same"),
        (dict(spellings={"NOPE": "x"}), "'NOPE', which is not a token of the task"),
    ]
    for kwargs, msg in cases:
        with pytest.raises(CheckpointError, match=msg.replace("(", r"\(").replace(")", r"\)")) \
                as info:
            map_vocab(names, tok, sp, n, **kwargs)
        assert "\n" not in str(info.value)
    with pytest.raises(CheckpointError, match="no tokenizer"):
        map_vocab(names, None, sp, n)
    with pytest.raises(CheckpointError, match="outside the model's 20 tokens"):
        map_vocab(names, tok, dataclasses.replace(sp, bos_id=25), 20)
