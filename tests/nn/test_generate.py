"""jaxil.nn.generate on tiny random checkpoints (written with the helpers'
HF writers) against references that do not use the KV cache: an argmax loop
over `Transformer.logits` recomputed on the growing sequences, and a
float64 numpy top-k / top-p filter."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers.pretrained import write_hf
from jaxil.nn.generate import (ARGMAX_BLOCK, Sampling, filter_logits, generate, greedy_tokens,
                               sample_tokens)
from jaxil.nn.pretrained_params import from_pretrained
from jaxil.nn.transformer import Transformer, TransformerConfig

# Three prompts of different lengths, left-aligned in a [3, 7] batch; the
# columns past each length hold junk tokens that must be ignored.
LENGTHS = np.array([5, 1, 7])
N_NEW = 9


def _prompts(vocab, seed=0):
    ids = np.random.default_rng(seed).integers(1, vocab, size=(len(LENGTHS), LENGTHS.max()))
    return ids.astype(np.int32)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny Llama (GQA, RoPE, untied head; vocab 40, context 32)."""
    return from_pretrained(write_hf(tmp_path_factory.mktemp("llama"), "llama"))


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A tiny GPT-2 (learned positions, fused qkv; vocab 40, 12 positions)."""
    return from_pretrained(write_hf(tmp_path_factory.mktemp("gpt2"), "gpt2"))


def _reference_greedy(config, params, ids, lengths, steps):
    """Greedy tokens by recomputing `Transformer.logits` on each row's whole
    prompt-plus-continuation at every step (no cache). Every row sits in a
    fixed `[B, W]` buffer: the decoder is causal, so the columns after a
    row's last token do not change its logits."""
    net = Transformer(config)
    logits_fn = jax.jit(net.logits)
    W = ids.shape[1] + steps
    fill = 0 if config.pad_id is None else config.pad_id
    seq = np.full((len(ids), W), fill, np.int32)
    for b, n in enumerate(lengths):
        seq[b, :n] = ids[b, :n]
    out = np.zeros((len(ids), steps), np.int32)
    for i in range(steps):
        logits = np.asarray(logits_fn(params, jnp.asarray(seq)))
        for b, n in enumerate(lengths):
            out[b, i] = seq[b, n + i] = int(np.argmax(logits[b, n + i - 1]))
    return out


@pytest.mark.parametrize("family,block", [("llama", 0), ("gpt2", 0), ("llama", 5)])
def test_greedy_equals_argmax_over_recomputed_logits(family, block, request):
    """Greedy generation of a batch of prompts of different lengths equals an
    argmax loop over `Transformer.logits` on the growing sequences. Fails if
    the prefill's junk columns past a prompt are attended to (the cache
    length not reset), if the first decode step reads the logits after the
    wrong token (off by one), if rows are mixed up, or if positions (rotary
    or learned) are offset after the prefill. With `block=5` the decode
    steps read the cache in blocks of 5 up to the longest row's fill (the
    rows' lengths differ, so a block boundary falls inside some rows and not
    others): fails if a block's running softmax is rescaled wrongly, if the
    overlapping last block counts a slot twice, or if the block loop stops
    one block short of the longest row."""
    config, params = request.getfixturevalue(family)
    ids = _prompts(config.vocab_size)
    steps = min(N_NEW, config.max_context - ids.shape[1] + 1)
    got = generate(config, params, ids, LENGTHS, jax.random.key(0), steps, block=block)
    want = _reference_greedy(config, params, ids, LENGTHS, steps)
    np.testing.assert_array_equal(np.asarray(got.tokens), want)
    np.testing.assert_array_equal(np.asarray(got.lengths), [steps] * len(LENGTHS))
    assert len({tuple(r) for r in want}) == len(LENGTHS)  # the rows differ: a real batch


def test_greedy_with_a_padding_token_config():
    """A from-scratch decoder (PAD = 0 is skipped by the cache) generates the
    same greedy tokens as the recomputed reference. Fails if a finished or
    idle row's fed token, or the prompt's padding, shifts the positions of a
    `pad_id` configuration."""
    config = TransformerConfig(vocab_size=30, token_width=1, max_context=24, d_model=32,
                               num_heads=2)
    params = Transformer(config).init(jax.random.key(3))
    params = jax.tree.map(lambda x: x * 20.0 if x.ndim == 2 else x, params)  # peaked logits
    ids = _prompts(config.vocab_size, seed=1)
    got = generate(config, params, ids, LENGTHS, jax.random.key(0), N_NEW)
    want = _reference_greedy(config, params, ids, LENGTHS, N_NEW)
    np.testing.assert_array_equal(np.asarray(got.tokens), want)


def test_stop_tokens_end_a_row_and_the_rest_is_fill(llama):
    """With a stop token, each row is its unstopped greedy continuation up to
    and including the first stop token, then `fill`; its length counts the
    stop token; a row that never emits it runs to the limit. Fails if
    a row goes on after its stop token, if one row's stop ends the others,
    if the stop token is dropped, or if the lengths are off by one."""
    config, params = llama
    ids = _prompts(config.vocab_size)
    free = np.asarray(generate(config, params, ids, LENGTHS, jax.random.key(0), N_NEW).tokens)
    stop = int(free[0, 3])  # row 0 stops at step 3 at the latest
    out = generate(config, params, ids, LENGTHS, jax.random.key(0), N_NEW, stop_ids=(stop, 39),
                   fill=-7)
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    ends = []
    for b in range(len(LENGTHS)):
        hits = np.flatnonzero(np.isin(free[b], (stop, 39)))
        n = int(hits[0]) + 1 if hits.size else N_NEW
        ends.append(n)
        np.testing.assert_array_equal(tokens[b, :n], free[b, :n])
        assert (tokens[b, n:] == -7).all()
    np.testing.assert_array_equal(lengths, ends)
    assert min(ends) < N_NEW  # the stop token did end a row early


@pytest.mark.parametrize("jit", [False, True])
def test_greedy_tokens_equal_numpy_argmax_on_ties(jit):
    """`greedy_tokens` equals numpy's argmax (the lowest id among ties) on
    random logits rounded to make ties common, over two leading axes and a
    vocabulary of several blocks, the last one partial; a row with NaNs
    gets an id in range. Fails if ties go to the highest id, if a tie across
    blocks goes to the later block, if the padded last block's ids are lost
    or win, or if the reduction runs over the wrong axis."""
    rng = np.random.default_rng(0)
    V = 3 * ARGMAX_BLOCK + 37
    logits = np.round(rng.normal(size=(3, 5, V)), 1).astype(np.float32)
    logits[1, 2, :] = 0.5  # an all-tie row
    logits[1, 3, [ARGMAX_BLOCK + 5, 2 * ARGMAX_BLOCK + 9]] = 9.0  # a tie across blocks
    logits[2, 4, V - 2] = 9.0  # the maximum in the partial block
    logits[0, 0, :] = -1.0  # all equal and negative: id 0, not a padded id
    fn = jax.jit(greedy_tokens) if jit else greedy_tokens
    got = np.asarray(fn(jnp.asarray(logits)))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.argmax(logits, axis=-1))
    assert got[1, 2] == 0 and got[1, 3] == ARGMAX_BLOCK + 5 and got[2, 4] == V - 2
    nan_row = logits[0, 1].copy()
    nan_row[[700, 1200]] = np.nan
    assert 0 <= int(fn(jnp.asarray(nan_row))) < V


# Two sampling programs of generate to compile (8 s CPU): -m slow. By default
# test_filter_keeps_the_smallest_set_reaching_top_p checks top-k and the
# temperature's division in filter_logits, and test_same_key_... samples
# through generate.
@pytest.mark.slow
def test_top_k_one_and_tiny_temperature_are_greedy(llama):
    """Sampling at top-k = 1, or at temperature 1e-4, gives the greedy
    tokens. Fails if top-k keeps the wrong token (e.g. the least likely, an
    ascending sort) or more than k, or if the temperature multiplies the
    logits instead of dividing them."""
    config, params = llama
    ids = _prompts(config.vocab_size)
    greedy = np.asarray(generate(config, params, ids, LENGTHS, jax.random.key(0), N_NEW).tokens)
    for s in (Sampling(temperature=1.0, top_k=1), Sampling(temperature=1e-4)):
        got = generate(config, params, ids, LENGTHS, jax.random.key(5), N_NEW, sampling=s)
        np.testing.assert_array_equal(np.asarray(got.tokens), greedy, err_msg=str(s))


def _reference_filter(logits, temperature, top_k, top_p):
    """float64: `softmax(logits / T)`, cut to the top k, renormalised, cut to
    the smallest most-likely set of mass >= p, renormalised."""
    x = logits.astype(np.float64) / temperature
    out = np.zeros_like(x)
    for r in range(x.shape[0]):
        order = np.argsort(-x[r], kind="stable")
        k = top_k or x.shape[1]
        kept = order[:k]
        p = np.exp(x[r, kept] - x[r, kept].max())
        p /= p.sum()
        mass = np.cumsum(p)
        n = int(np.searchsorted(mass, top_p - 1e-12)) + 1  # first prefix with mass >= p
        if top_p < 1:
            assert np.abs(mass - top_p).min() > 1e-5, "a boundary case: choose another seed"
        kept, p = kept[:n], p[:n] / p[:n].sum()
        out[r, kept] = p
    return out


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 0, 0.5), (0.7, 0, 0.9), (1.3, 0, 0.05), (1.0, 12, 0.8), (0.5, 5, 1.0), (2.0, 0, 1.0)])
def test_filter_keeps_the_smallest_set_reaching_top_p(temperature, top_k, top_p):
    """`softmax(filter_logits)` equals a float64 reference: the smallest set
    of most likely tokens whose mass reaches p (after the top k), renormalised.
    Fails if top-p keeps the tokens whose cumulative mass is below p (one
    token too few, the set then falls short of p), drops the most likely
    token at small p, cuts before top-k renormalises, or scatters the kept
    probabilities back to the wrong ids."""
    logits = np.random.default_rng(11).normal(0, 2.0, size=(6, 50)).astype(np.float32)
    got = jax.nn.softmax(filter_logits(jnp.asarray(logits),
                                       Sampling(temperature, top_k, top_p)), axis=-1)
    want = _reference_filter(logits, temperature, top_k, top_p)
    np.testing.assert_array_equal(np.asarray(got) > 0, want > 0)
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-6)


def test_sampled_tokens_follow_the_filtered_distribution():
    """Draws from `sample_tokens` land only in the top-p set and match its
    probabilities (20,000 draws, 3 standard errors). Fails if sampling
    ignores the filter or draws from unscaled logits."""
    logits = np.random.default_rng(2).normal(0, 1.5, size=(1, 20)).astype(np.float32)
    s = Sampling(temperature=0.8, top_p=0.7)
    want = _reference_filter(logits, 0.8, 0, 0.7)[0]
    keys = jax.random.split(jax.random.key(0), 20000)
    draws = np.asarray(jax.jit(jax.vmap(lambda k: sample_tokens(k, jnp.asarray(logits), s)))(keys))
    freq = np.bincount(draws.ravel(), minlength=20) / draws.size
    assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(want))
    np.testing.assert_allclose(freq, want, atol=3 * np.sqrt(0.25 / draws.size))


def test_same_key_same_tokens_and_vmapped_seeds_differ(llama):
    """Sampling is a function of the key: the same key gives the same tokens,
    `vmap` over keys gives each key's own call's tokens, and different keys
    give different tokens. At a temperature of 1000 the draws are nearly
    uniform, so a row's tokens are mostly distinct. Fails if the loop reuses
    one key every step (the same Gumbel noise then picks the same token at
    every step), ignores the key, or if vmapping the while loop changes the
    result."""
    config, params = llama
    ids = _prompts(config.vocab_size)
    s = Sampling(temperature=1000.0)
    keys = jax.random.split(jax.random.key(1), 4)
    one = generate(config, params, ids, LENGTHS, keys[2], N_NEW, sampling=s)
    again = generate(config, params, ids, LENGTHS, keys[2], N_NEW, sampling=s)
    np.testing.assert_array_equal(np.asarray(one.tokens), np.asarray(again.tokens))
    many = jax.vmap(lambda k: generate(config, params, ids, LENGTHS, k, N_NEW, sampling=s,
                                       stop_ids=(7,)).tokens)(keys)
    single = generate(config, params, ids, LENGTHS, keys[2], N_NEW, sampling=s, stop_ids=(7,))
    np.testing.assert_array_equal(np.asarray(many[2]), np.asarray(single.tokens))
    many = np.asarray(many)
    assert len({m.tobytes() for m in many}) == len(keys)
    for row in np.asarray(one.tokens):  # fresh noise at every step
        assert len(set(row.tolist())) > N_NEW // 2, row


@pytest.mark.parametrize("kwargs,match", [
    (dict(top_p=0.0), r"top_p must be in \(0, 1\].*pass e\.g\. 0\.9"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(temperature=-0.5), r"temperature must be a finite number >= 0.*pass 0 for greedy"),
    (dict(temperature=float("nan")), r"temperature must be a finite number"),
    (dict(top_k=-1), r"top_k must be an integer >= 0"),
])
def test_bad_sampling_settings_are_one_line_errors(kwargs, match):
    """A top-p outside (0, 1], a negative or NaN temperature, a negative
    top-k are refused with a one-line message naming the allowed range.
    Fails if a bad setting is accepted (top-p 0 would keep one token, a
    negative temperature would flip the distribution)."""
    with pytest.raises(ValueError, match=match) as e:
        Sampling(**kwargs)
    assert "\n" not in str(e.value)


def test_bad_requests_are_one_line_errors(llama):
    """A prompt longer than the context, a continuation that does not fit,
    a zero or too-long prompt length, an empty batch are refused naming the
    fix. Fails if they run (tokens past the context are dropped: the row
    would repeat its last logits silently)."""
    config, params = llama  # context 32
    key = jax.random.key(0)
    cases = [
        (np.ones((1, 40), np.int32), [40], 4, r"the prompt has 40 tokens but the model's context "
                                              r"holds 32; shorten the prompt or raise max_context"),
        (np.ones((1, 30), np.int32), [30], 8, r"need a context of 37 .* lower max_new_tokens to 3"),
        (np.ones((2, 5), np.int32), [5, 0], 4, r"prompt lengths must be in 1 \.\. 5.*got \[0\]"),
        (np.ones((2, 5), np.int32), [6, 5], 4, r"got \[6\]"),
        (np.ones((0, 5), np.int32), [], 4, r"prompt_ids must be \[B, T\]"),
        (np.ones((1, 5), np.int32), [5], 0, r"max_new_tokens must be an integer >= 1"),
    ]
    for ids, lengths, n, match in cases:
        with pytest.raises(ValueError, match=match) as e:
            generate(config, params, ids, np.asarray(lengths, np.int32), key, n)
        assert "\n" not in str(e.value)
