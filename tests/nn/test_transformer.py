"""The transformer policy (jaxil.nn.transformer): the KV-cached step and
teacher forcing are one function of the tokens, PAD is invisible, attention
is causal, the forward pass matches a float64 numpy reference, acting is
legal, the Policy runs inside jitted rollouts with carry resets, and
teacher-forced SFT learns."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jaxil.envs.token_exchange import ExchangeEnv
from jaxil.envs.token_repair import RepairEnv

from jaxil import envs
from jaxil.nn import distributions as D
from jaxil.nn.transformer import (
    PAD,
    SIZES,
    KVCache,
    Transformer,
    TransformerConfig,
    TransformerPolicy,
    config_for_env,
    keys_slots_last,
    obs_tokens,
    transformer_config,
)


def _config(**kw):
    fields = {"vocab_size": 11, "token_width": 3, "max_context": 20, "d_model": 32,
              "num_layers": 2, "num_heads": 2}
    fields.update(kw)
    return TransformerConfig(**fields)


def _params(net, seed=0, scale=2.0):
    """Random weights of ``net``'s shapes, drawn in numpy (compiling the
    network's initialiser costs seconds): kernels and embeddings
    N(0, scale²/fan_in), biases and LayerNorm offsets N(0, 0.1²), LayerNorm
    scales 1 + N(0, 0.1²). ``scale`` > 1 makes attention and logits sharper
    than at init, so a wrong mask or position moves the logits by far more
    than rounding."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(net.init, jax.random.PRNGKey(0))

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        if "kernel" in name or "embed" in name:
            fan_in = leaf.shape[0] if "attn_out" not in name else leaf.shape[0] * leaf.shape[1]
            std = scale / math.sqrt(net.config.d_model if "embed" in name else fan_in)
            x = rng.normal(0.0, std, leaf.shape)
        elif "scale" in name:
            x = 1.0 + 0.1 * rng.normal(size=leaf.shape)
        else:
            x = 0.1 * rng.normal(size=leaf.shape)
        return jnp.asarray(x, leaf.dtype)

    return jax.tree_util.tree_map_with_path(draw, shapes)


def _random_chunks(rng, steps, width, vocab, p_real=0.6):
    """``[steps, width]`` token ids in [1, vocab) with PAD slots anywhere."""
    tok = rng.integers(1, vocab, size=(steps, width))
    return np.where(rng.uniform(size=(steps, width)) < p_real, tok, PAD).astype(np.int32)


def _reference_rows(flat, width, max_context):
    """For each K-wide chunk, the flat index of the last stored (non-PAD,
    within max_context) token at or before its end; -1 if none."""
    kept = np.flatnonzero(flat != PAD)[:max_context]
    rows = []
    for t in range(len(flat) // width):
        before = kept[kept < (t + 1) * width]
        rows.append(int(before[-1]) if len(before) else -1)
    return rows


# -- sizes -------------------------------------------------------------------------


def test_sizes_and_parameter_counts():
    """Every named size builds, and ``num_params`` counts the parameters the
    network really has (a formula that drifts from the modules, e.g. after
    adding a bias or the agent embedding, fails)."""
    assert next(iter(SIZES)) == "tiny" and "small" in SIZES
    for name in SIZES:
        for agents in (0, 3):
            cfg = transformer_config(name, vocab_size=64, token_width=4, max_context=256,
                                     num_agents=agents)
            shapes = jax.eval_shape(Transformer(cfg).init, jax.random.PRNGKey(0))
            assert sum(x.size for x in jax.tree.leaves(shapes)) == cfg.num_params(), name
    tiny = transformer_config("tiny", vocab_size=64, token_width=4, max_context=256)
    assert (tiny.d_model, tiny.num_layers, tiny.num_heads) == (64, 2, 2)
    assert tiny.num_params() == 124_672
    repair = RepairEnv()  # (envs.make would import every family)
    cfg = config_for_env(repair, "small")
    assert (cfg.vocab_size, cfg.token_width, cfg.max_context, cfg.d_model) == (
        repair.spec.num_actions, repair.token_width, repair.max_context, 256)
    assert config_for_env(ExchangeEnv(), agent_ids=True).num_agents == 2
    with pytest.raises(ValueError, match="not a token environment"):
        config_for_env(_EchoTokens())  # no token_width / max_context
    with pytest.raises(ValueError, match="multiple of num_heads"):
        TransformerConfig(vocab_size=8, token_width=2, max_context=8, d_model=30, num_heads=4)
    with pytest.raises(ValueError, match="unknown transformer size"):
        transformer_config("huge", vocab_size=8, token_width=2, max_context=8)


# -- (1) cached decoding equals recomputation -----------------------------------------


#: The tiny architecture on a small task, shared by the exactness tests (the
#: same shapes: eager ops and jitted programs compiled once); 10 steps of
#: 4-wide chunks at 60 % real tokens overflow its 16-token context.
_EXACT = transformer_config("tiny", vocab_size=13, token_width=4, max_context=16, num_agents=2)
_EXACT_STEPS = 10


def _exact_chunks(seed):
    """``[T, N=2, K]`` random chunks of ``_EXACT`` with PAD slots anywhere
    (the first step never empty) that overflow the context."""
    rng = np.random.default_rng(seed)
    K, V, C = _EXACT.token_width, _EXACT.vocab_size, _EXACT.max_context
    chunks = np.stack([_random_chunks(rng, _EXACT_STEPS, K, V) for _ in range(2)], 1)
    chunks[0, :, 0] = 1 + rng.integers(0, 5, size=2)
    assert ((chunks != PAD).sum((0, 2)) > C).any(), "some agent should overflow the context"
    return chunks


# One policy and its jitted programs for the tests of _EXACT's shapes.
_EXACT_POL = TransformerPolicy(_EXACT)
_seq = jax.jit(_EXACT_POL.net.sequence_logits)
_step = jax.jit(_EXACT_POL.net.step)
_step_logits = jax.jit(_EXACT_POL.step_logits)
_chunk_logits = jax.jit(_EXACT_POL.chunk_logits)


@pytest.mark.parametrize("jit", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["eager", "jit"])  # eager: ~15 s of op-by-op dispatch, -m slow
def test_cached_decoding_equals_full_recomputation(jit):
    """Step-by-step decoding through the KV cache gives the logits of teacher
    forcing over the concatenated chunks (and, jitted, of the per-step
    ``chunk_logits`` and the cache-free recompute policy) to float32
    rounding, on random PAD patterns that overflow the context. Kills:
    keys/values written at the wrong cache slot, a query that misses the
    keys written in its own step (no causal attention within the K slots), a
    cache length off by the PAD count, overflow handled differently in the
    two paths, the agent-id embedding applied in one path only."""
    pol = _EXACT_POL
    net, K, C = pol.net, _EXACT.token_width, _EXACT.max_context
    params = _params(net)
    chunks = _exact_chunks(1)
    steps, n = chunks.shape[:2]
    step = _step if jit else net.step
    seq = _seq if jit else net.sequence_logits
    want = np.zeros((steps, n, _EXACT.vocab_size), np.float32)
    # Eagerly (slow, op by op) the agent with an id embedding ≠ 0 only.
    for i in range(n) if jit else [1]:
        flat = chunks[:, i].reshape(-1)
        full = np.asarray(seq(params, jnp.asarray(flat), i))
        rows = _reference_rows(flat, K, C)
        cache = net.empty_cache()
        for t in range(steps):
            logits, cache = step(params, jnp.asarray(chunks[t, i]), cache, i)
            assert int(cache.length) == min(int((flat[: (t + 1) * K] != PAD).sum()), C)
            want[t, i] = full[rows[t]]
            np.testing.assert_allclose(logits, want[t, i], atol=1e-4, rtol=1e-4)
    if not jit:
        return
    rng = np.random.default_rng(2)
    obs = np.concatenate([chunks.astype(np.float32),
                          rng.normal(size=(steps, n, 2)).astype(np.float32)], -1)
    teacher = np.asarray(_chunk_logits(params, jnp.asarray(obs)))
    np.testing.assert_allclose(teacher, want, atol=1e-4, rtol=1e-4)
    recompute = pol.recompute_policy(deterministic=True)
    re_act, buf = jax.jit(recompute.act), recompute.init(None, n)
    avail = jnp.ones((n, _EXACT.vocab_size), bool).at[:, PAD].set(False)
    for t in range(steps):
        acts, buf = re_act(params, jnp.asarray(obs[t]), avail, jax.random.PRNGKey(t), buf)
        np.testing.assert_array_equal(acts, np.asarray(D.categorical_mode(want[t], avail)))


# _EXACT with grouped-query attention: 4 query heads on 2 key/value heads,
# so a 4-token step has 8 query rows per key/value head (the fused
# multiply-and-sum path) and the key cache is laid out slots last.
_EXACT_GQA = dataclasses.replace(_EXACT, num_heads=4, num_kv_heads=2, fused_qkv=False)


_ROW_PROGRAMS = {id(_EXACT): (_EXACT_POL.net, _step, _seq)}


def _row_programs(config):
    """``config``'s network and its jitted ``step`` and ``sequence_logits``,
    made once per module (the mha and gqa cases run with two block sizes)."""
    if id(config) not in _ROW_PROGRAMS:
        net = Transformer(config)
        _ROW_PROGRAMS[id(config)] = (net, jax.jit(net.step), jax.jit(net.sequence_logits))
    return _ROW_PROGRAMS[id(config)]


@pytest.mark.parametrize("block", [0, 3])
@pytest.mark.parametrize("config", [_EXACT, _EXACT_GQA], ids=["mha", "gqa"])
def test_batched_decode_equals_each_row_alone(config, block):
    """`Transformer.decode` over a batch of contexts that fill at different
    rates (their own PAD patterns, overflowing the context) returns, row by
    row and step by step, what `Transformer.step` gives that row alone, and
    leaves each row's cache equal to its own; and each row's logits equal
    the teacher-forced pass over its kept tokens. With `block=3` attention
    reads the cache in blocks up to the longest row's fill. Fails if the
    scatter writes a row's keys into another row, at the batch's slot
    instead of the row's own, or along the wrong axis of the slots-last key
    layout; if one row's fill decides another row's mask; or if the block
    loop drops or double-counts a slot."""
    net, step, seq = _row_programs(config)
    C = config.max_context
    params = _params(net)
    chunks = np.concatenate([_exact_chunks(3), _exact_chunks(4)], axis=1)  # [T, 4, K]
    steps, rows = chunks.shape[:2]
    agents = jnp.asarray([0, 1, 1, 0])
    decode = jax.jit(lambda p, t, c: net.decode(p, t, c, agents, block))
    batch = net.empty_cache((rows,))
    alone = [net.empty_cache() for _ in range(rows)]
    kept = [[] for _ in range(rows)]
    differ = False
    for t in range(steps):
        logits, batch = decode(params, jnp.asarray(chunks[t]), batch)
        differ |= len(set(np.asarray(batch.length).tolist())) > 1
        for r in range(rows):
            want, alone[r] = step(params, jnp.asarray(chunks[t, r]), alone[r], int(agents[r]))
            np.testing.assert_allclose(logits[r], want, atol=1e-4, rtol=1e-4)
            kept[r] += [int(x) for x in chunks[t, r] if x != PAD]
            if len(kept[r]) <= C and chunks[t, r].max() > PAD:
                # the kept tokens, then PAD (invisible) to one length: one compile
                toks = np.full(C, PAD, np.int32)
                toks[:len(kept[r])] = kept[r]
                full = seq(params, jnp.asarray(toks), int(agents[r]))
                np.testing.assert_allclose(logits[r], full[len(kept[r]) - 1], atol=1e-4, rtol=1e-4)
    lengths = np.asarray(batch.length)
    assert differ and lengths.max() == C  # the rows' fills differed; one overflowed
    slots_last = keys_slots_last(config)
    assert slots_last == (config is _EXACT_GQA)
    for r in range(rows):
        n = int(alone[r].length)
        assert int(lengths[r]) == n
        for layer in range(config.num_layers):
            keys, own = batch.k[layer][r], alone[r].k[layer]
            if slots_last:
                keys, own = np.swapaxes(keys, -1, -2), np.swapaxes(own, -1, -2)
            np.testing.assert_allclose(keys[:, :n], own[:, :n], atol=1e-5)
            np.testing.assert_allclose(batch.v[layer][r, :, :n], alone[r].v[layer][:, :n],
                                       atol=1e-5)


def test_fresh_chunk_read_at_a_column_equals_the_prefix_alone():
    """A fresh chunk read out at `read_at [B]` gives, per row, the logits of
    that row's tokens up to and including column `read_at[b]` stepped
    alone, whatever follows it in the chunk; the cache holds the whole
    chunk. Fails if `read_at` is ignored (the last column is read), off by
    one, or applied to the wrong row."""
    net = _EXACT_POL.net
    params = _params(net, seed=5)
    rng = np.random.default_rng(4)
    rows, width = 3, 6
    tokens = rng.integers(1, _EXACT.vocab_size, size=(rows, width)).astype(np.int32)
    read_at = np.array([1, 5, 3], np.int32)
    logits, cache = jax.jit(lambda p, t, r: net.decode(p, t, net.empty_cache((rows,)),
                                                       fresh=True, read_at=r))(
        params, jnp.asarray(tokens), jnp.asarray(read_at))
    np.testing.assert_array_equal(cache.length, [width] * rows)
    for b in range(rows):
        want, _ = _step(params, jnp.asarray(tokens[b, :read_at[b] + 1]), net.empty_cache(), 0)
        np.testing.assert_allclose(logits[b], want, atol=1e-4, rtol=1e-4)


# -- (2) PAD is invisible -----------------------------------------------------------------


def test_pad_slots_are_ignored():
    """Moving PAD slots around inside the chunks, adding all-PAD chunks and
    changing the privileged obs columns leave every step's logits
    unchanged, and an all-PAD step keeps the cache length and the previous
    logits; in teacher forcing, PAD tokens spread through the sequence
    change no real token's logits. Kills: PAD advancing the position, PAD
    keys attended to, logits read at the chunk's last slot instead of its
    last real token, an empty step that appends a token or returns garbage,
    a policy that reads obs past token_width."""
    params = _params(_EXACT_POL.net, seed=3)
    rng = np.random.default_rng(2)
    steps, n, K = 8, 2, _EXACT.token_width
    counts = rng.integers(1, 3, size=(steps, n))  # 16 tokens at most: no overflow
    real = [[rng.integers(1, _EXACT.vocab_size, size=c) for c in row] for row in counts]
    left = np.zeros((steps, n, K), np.int32)
    scattered = np.zeros((steps, n, K), np.int32)
    for t in range(steps):
        for i in range(n):
            left[t, i, : counts[t, i]] = real[t][i]
            slots = np.sort(rng.choice(K, size=counts[t, i], replace=False))
            scattered[t, i, slots] = real[t][i]

    def run(chunks, extra):
        obs = np.concatenate([chunks.astype(np.float32), extra], -1)  # [T, N, O]
        carry, out = _EXACT_POL.init_carry(None, n), []
        for t in range(len(chunks)):
            logits, carry = _step_logits(params, jnp.asarray(obs[t]), carry)
            out.append(np.asarray(logits))
        return np.stack(out), carry

    extra = rng.normal(size=(steps, n, 3)).astype(np.float32)
    base, carry = run(left, extra)
    moved, _ = run(scattered, 100.0 * rng.normal(size=extra.shape).astype(np.float32))
    np.testing.assert_allclose(moved, base, atol=1e-5, rtol=1e-5)
    # An all-PAD chunk after every step: the same logits, repeated.
    with_empty = np.zeros((2 * steps, n, K), np.int32)
    with_empty[::2] = left
    doubled, carry2 = run(with_empty, np.zeros((2 * steps, n, 3), np.float32))
    np.testing.assert_allclose(doubled[::2], base, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(doubled[1::2], doubled[::2])
    np.testing.assert_array_equal(carry2.length, counts.sum(0))
    np.testing.assert_array_equal(carry.length, counts.sum(0))
    # Teacher forcing (one length, 40, for both; trailing PAD changes nothing
    # before it by causality).
    T = _EXACT_STEPS * K
    flat = np.concatenate([r[0] for r in real]).astype(np.int32)
    compact = np.zeros(T, np.int32)
    compact[: len(flat)] = flat
    spread = np.zeros(T, np.int32)
    slots = np.sort(rng.choice(T, size=len(flat), replace=False))
    spread[slots] = flat
    np.testing.assert_allclose(np.asarray(_seq(params, jnp.asarray(spread), 0))[slots],
                               np.asarray(_seq(params, jnp.asarray(compact), 0))[: len(flat)],
                               atol=1e-5, rtol=1e-5)


# -- (3) causality ----------------------------------------------------------------------


def test_attention_is_causal():
    """Changing a token changes no logits before it (teacher forcing and the
    per-step chunk logits) nor any of another agent, and does change the
    logits at it. Kills: a missing or transposed causal mask, an off-by-one
    that lets a row see the next token, a chunk that reads the logits of a
    later slot, agents that share a context."""
    params = _params(_EXACT_POL.net, seed=4)
    chunks = _exact_chunks(3)
    flat = chunks[:, 0].reshape(-1)
    base = np.asarray(_seq(params, jnp.asarray(flat), 0))
    kept = np.flatnonzero(flat != PAD)[: _EXACT.max_context]
    for j in (kept[0], kept[len(kept) // 2], kept[-1]):
        changed = flat.copy()
        changed[j] = 1 + (changed[j] % (_EXACT.vocab_size - 1))
        out = np.asarray(_seq(params, jnp.asarray(changed), 0))
        np.testing.assert_array_equal(out[:j], base[:j])
        assert np.abs(out[j] - base[j]).max() > 1e-4, j
    # Per-step chunks: agent 0's token at step 4 changes nothing at steps
    # 0..3 and nothing of agent 1.
    obs = chunks.astype(np.float32)
    later = obs.copy()
    later[4, 0, 0] = 1 + (later[4, 0, 0] % (_EXACT.vocab_size - 1))
    a = np.asarray(_chunk_logits(params, jnp.asarray(obs)))
    b = np.asarray(_chunk_logits(params, jnp.asarray(later)))
    np.testing.assert_array_equal(a[:4], b[:4])
    np.testing.assert_array_equal(a[:, 1], b[:, 1])
    assert np.abs(a[4:, 0] - b[4:, 0]).max() > 1e-4


# -- (4) legal sampling ---------------------------------------------------------------


def test_sampling_respects_the_legal_mask():
    """``act`` draws only legal tokens (PAD never), with the frequencies of
    ``step_log_probs``; deterministic acting is the most likely legal token.
    Kills: the mask dropped or applied to the wrong agent's row, sampling
    from logits other than the scored ones, a greedy mode over all tokens."""
    cfg = _config()
    pol = TransformerPolicy(cfg)
    params = _params(pol.net, seed=5, scale=1.0)
    rng = np.random.default_rng(4)
    n, V = 3, cfg.vocab_size
    obs = jnp.asarray(np.concatenate([_random_chunks(rng, n, cfg.token_width, V, 1.0),
                                      np.zeros((n, 2))], -1), jnp.float32)
    avail = jnp.asarray(rng.uniform(size=(n, V)) < 0.5).at[:, 2].set(True).at[:, PAD].set(False)
    carry = pol.init_carry(None, n)

    @jax.jit
    def probe(params, obs, avail, carry, keys):
        acts = jax.vmap(lambda k: pol.act(params, obs, avail, k, carry)[0])(keys)
        greedy, _ = pol.act(params, obs, avail, keys[0], carry, deterministic=True)
        return acts, greedy, pol.step_log_probs(params, obs, avail, carry)[0]

    keys = jax.random.split(jax.random.PRNGKey(0), 3000)
    acts, greedy, log_p = (np.asarray(x) for x in probe(params, obs, avail, carry, keys))
    assert np.take_along_axis(np.asarray(avail), acts.T, axis=1).all()
    p = np.exp(log_p.astype(np.float64))
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)
    for i in range(n):
        freq = np.bincount(acts[:, i], minlength=V) / len(keys)
        se = np.sqrt(p[i] * (1 - p[i]) / len(keys)) + 1e-3
        assert (np.abs(freq - p[i]) < 5 * se).all(), (i, freq, p[i])
    np.testing.assert_array_equal(greedy, np.argmax(np.where(avail, p, -1.0), -1))


# -- (5) float64 reference -------------------------------------------------------------


def _np_forward(p, tokens, cfg, agent):
    """Float64 numpy forward of ``sequence_logits``: embeddings, pre-LN
    causal attention over non-PAD tokens, tanh-GELU MLP, head."""
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), p["params"])

    def ln(x, q):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + cfg.ln_eps) * q["scale"] + q["bias"]

    real = tokens != PAD
    pos = np.cumsum(real) - 1
    real &= pos < cfg.max_context  # tokens past the context are dropped
    x = p["token_embed"]["embedding"][tokens] + p["pos_embed"][np.clip(pos, 0, cfg.max_context - 1)]
    if cfg.num_agents:
        x = x + p["agent_embed"][agent]
    T = len(tokens)
    mask = real[None, :] & (np.arange(T)[None, :] <= np.arange(T)[:, None])
    for layer in range(cfg.num_layers):
        b = p[f"blocks_{layer}"]
        qkv = np.einsum("td,dshe->tshe", ln(x, b["ln_attn"]), b["qkv"]["kernel"]) + b["qkv"]["bias"]
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        s = np.einsum("qhe,khe->hqk", q, k) / math.sqrt(cfg.d_model // cfg.num_heads)
        s = np.where(mask[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        att = np.einsum("hqk,khe->qhe", s / s.sum(-1, keepdims=True), v)
        x = x + np.einsum("the,hed->td", att, b["attn_out"]["kernel"]) + b["attn_out"]["bias"]
        h = ln(x, b["ln_mlp"]) @ b["mlp_in"]["kernel"] + b["mlp_in"]["bias"]
        h = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
        x = x + h @ b["mlp_out"]["kernel"] + b["mlp_out"]["bias"]
    return ln(x, p["ln_final"]) @ p["head"]["kernel"]


# eager: ~10 s of op-by-op dispatch, -m slow; the jitted case runs both paths
# (sequence_logits and step) against the reference by default
@pytest.mark.parametrize("jit", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["eager", "jit"])
def test_forward_matches_float64_numpy_reference(jit):
    """Both paths of the tiny network equal an independent float64 numpy
    forward (pre-LN, learned positions, causal masked multi-head attention,
    tanh-GELU MLP, untied head, context truncation) on random weights and
    tokens with PAD slots. Kills: a missing 1/√d scaling, heads mixed up in
    the reshape, post-LN instead of pre-LN, a dropped residual or bias, the
    agent embedding missing or taken from another agent."""
    net = _EXACT_POL.net
    params = _params(net, seed=6, scale=1.5)
    chunks = _exact_chunks(5)
    seq = _seq if jit else net.sequence_logits
    step = _step if jit else net.step
    for agent in range(2):
        flat = chunks[:, agent].reshape(-1)
        want = _np_forward(params, flat, _EXACT, agent)
        got = np.asarray(seq(params, jnp.asarray(flat), agent))
        kept = np.flatnonzero(flat != PAD)[: _EXACT.max_context]
        np.testing.assert_allclose(got[kept], want[kept], atol=2e-4, rtol=1e-4)
        if agent == 0:
            continue
        cache = net.empty_cache()
        rows = _reference_rows(flat, _EXACT.token_width, _EXACT.max_context)
        for t in range(len(chunks)):
            logits, cache = step(params, jnp.asarray(chunks[t, agent]), cache, agent)
            np.testing.assert_allclose(logits, want[rows[t]], atol=2e-4, rtol=1e-4)


# -- (6) inside jitted rollouts ---------------------------------------------------------


class _EchoTokens(envs.core.MultiAgentEnv):
    """A toy token environment of the token-env contract: per agent, BOS and
    a prompt token at reset; each step the agent's token echoed, and after
    the end-turn token 2 two tool tokens; a legal-token mask that changes
    with the step; two privileged (noise) obs columns; random lengths."""

    V, K, N, MAX = 10, 3, 2, 8

    def __init__(self):
        self.spec = envs.core.EnvSpec("test:echo_tokens", num_agents=self.N,
                                      obs_dim=self.K + 2, state_dim=1,
                                      action=envs.core.DiscreteActions(self.V),
                                      max_steps=self.MAX)

    def _avail(self, t, prompt):
        j = jnp.arange(self.V)[None, :]
        return (j >= 2) & (((j + t + prompt[:, None]) % 3 != 0) | (j == 2))

    def _out(self, key, inner, tokens, **kw):
        t, prompt, _ = inner
        noise = 50.0 * jax.random.uniform(key, (self.N, 2))
        obs = jnp.concatenate([tokens.astype(jnp.float32), noise], -1)
        return envs.core.Step(inner=inner, obs=obs, global_state=jnp.zeros((1,)),
                    avail_actions=self._avail(t, prompt), **kw)

    def _reset(self, key):
        k1, k2, k3 = jax.random.split(key, 3)
        prompt = jax.random.randint(k1, (self.N,), 3, self.V)
        length = jax.random.randint(k2, (), 2, self.MAX + 1)
        tokens = jnp.stack([jnp.ones_like(prompt), prompt, jnp.zeros_like(prompt)], -1)
        return self._out(k3, (jnp.int32(0), prompt, length), tokens)

    def _step(self, key, inner, actions):
        t, prompt, length = inner
        t = t + 1
        turn = actions == 2
        tool = (prompt + t) % (self.V - 3) + 3
        tokens = jnp.stack([actions, jnp.where(turn, tool, 0), jnp.where(turn, 1 + tool % 2, 0)], -1)
        return self._out(key, (t, prompt, length), tokens, done=t >= length)


def _tiny_policy(num_agents=0):
    # One layer: the multi-layer cache is checked above; compiling a rollout
    # is most of this test's time.
    env = _EchoTokens()
    cfg = transformer_config("tiny", vocab_size=env.V, token_width=env.K,
                             max_context=3 * env.MAX + 2, num_agents=num_agents, num_layers=1)
    return env, TransformerPolicy(cfg)


def test_policy_runs_inside_a_jitted_auto_reset_rollout():
    """The KV-cache Policy runs in the jitted, auto-resetting ``envs.rollout``
    across several episode boundaries, and every greedy action is the
    teacher-forced argmax of its own episode alone; the cache-free policy,
    sampling with the same keys, acts the same. Kills: a carry the rollout
    cannot reset or batch (wrong leading axes), a cache that keeps the
    previous episode's tokens, teacher forcing that scores other
    distributions than the ones acted on, a Policy that claims stateless
    log_prob/entropy."""
    env, pol = _tiny_policy(num_agents=_EchoTokens.N)
    params = _params(pol.net, seed=7, scale=1.5)
    greedy = pol.policy(deterministic=True)
    assert isinstance(greedy, envs.policies.Policy)
    assert greedy.log_prob is None and greedy.entropy is None
    steps, E, T = 24, 3, env.spec.max_steps
    traj = jax.jit(lambda p, k: envs.rollout(env, greedy, p, k, E, steps))(
        params, jax.random.PRNGKey(1))
    traj = jax.tree.map(np.asarray, traj)  # sliced below: numpy, not one XLA op per slice
    ends = traj.done | traj.truncated
    assert ends.sum() >= 2 * E, "the rollout should cross several episode boundaries"
    # Each episode alone, padded to max_steps (one compiled shape).
    segments = []
    for e in range(E):
        start = 0
        for t in np.flatnonzero(ends[:, e]).tolist() + [steps - 1]:
            segments.append((e, start, t + 1))
            start = t + 1
    seg_obs = np.zeros((len(segments), T) + traj.obs.shape[2:], np.float32)
    for j, (e, a, b) in enumerate(segments):
        seg_obs[j, : b - a] = traj.obs[a:b, e]
    logits = np.asarray(jax.jit(jax.vmap(pol.chunk_logits, in_axes=(None, 0)))(
        params, jnp.asarray(seg_obs)))
    for j, (e, a, b) in enumerate(segments):
        legal = np.asarray(traj.avail_actions[a:b, e])
        want = np.argmax(np.where(legal, logits[j, : b - a], -np.inf), -1)
        np.testing.assert_array_equal(traj.actions[a:b, e], want)


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["tokens:repair", "tokens:arith", "tokens:exchange"])
def test_run_episodes_on_token_envs_records_the_cache_and_scores_match(env_id):
    """On the ``tokens:`` tasks, in a jitted ``run_episodes`` with
    ``record_carry``: the recorded cache length counts each agent's tokens
    (within the environment's ``max_context``), the recorded logits are the
    teacher-forced ones of ``chunk_logits`` on the ``Episodes`` layout, the
    played (sampled) tokens score finitely under ``episode_scores``, and the
    cache-free policy plays the same tokens with the same key. Kills: a
    cache length that counts PAD or misses tool answers, scoring that reads
    the wrong obs step (``obs[:, 1:]``), a context the environment overflows,
    the recompute baseline drifting from the cached policy."""
    env = envs.make(env_id)
    cfg = config_for_env(env, "tiny", agent_ids=env.spec.num_agents > 1)
    pol = TransformerPolicy(cfg)
    params = _params(pol.net, seed=8, scale=1.5)
    E, K, T = 4, cfg.token_width, env.spec.max_steps
    run = jax.jit(lambda p, k: envs.run_episodes(env, pol.policy(), p, k, E, record_carry=True))
    eps = run(params, jax.random.PRNGKey(0))
    assert isinstance(eps.carry, KVCache)
    mask = np.asarray(eps.mask)
    tokens = np.asarray(obs_tokens(eps.obs[:, :T], K))
    counts = np.cumsum((tokens != PAD).sum(-1), axis=1)  # [E, T, N]
    assert counts[mask].max() <= cfg.max_context
    np.testing.assert_array_equal(np.asarray(eps.carry.length)[mask], counts[mask])
    teacher = jax.jit(jax.vmap(pol.chunk_logits, in_axes=(None, 0)))(params, eps.obs[:, :T])
    np.testing.assert_allclose(np.asarray(teacher)[mask], np.asarray(eps.carry.logits)[mask],
                               atol=1e-4, rtol=1e-4)
    scores = jax.jit(jax.vmap(pol.episode_scores, in_axes=(None, 0, 0, 0)))
    log_p, ent = scores(params, eps.obs[:, :T], eps.avail_actions[:, :T], eps.actions)
    log_p, ent = np.asarray(log_p)[mask], np.asarray(ent)[mask]
    assert np.isfinite(log_p).all() and (log_p > -30).all() and (ent >= 0).all()
    again = jax.jit(lambda p, k: envs.run_episodes(env, pol.recompute_policy(), p, k, E))
    np.testing.assert_array_equal(again(params, jax.random.PRNGKey(0)).actions, eps.actions)


# -- (7) learning ------------------------------------------------------------------------

_CYCLE = np.arange(2, 10)  # the agent's tokens; 1 is BOS, 10 and 11 are tool noise


def _pattern_episodes(rng, batch, steps, prefix=True):
    """Chunks ``[B, T, 3]``, actions ``[B, T]`` and a loss mask ``[B, T]`` of
    a deterministic task: the prompt is a cycle token, and the expert counts
    on around the cycle from the last token it saw (a_t = next(a_{t-1}),
    a_{-1} = the prompt). With ``prefix`` an OEC-style random-policy prefix
    of random length comes first (random tokens, masked out of the loss).
    Every third step a random tool token follows the echo, which the agent
    must look past."""
    n = len(_CYCLE)
    prompt = rng.integers(0, n, size=batch)
    switch = rng.integers(0, steps // 2 + 1, size=batch) if prefix else np.zeros(batch, int)
    idx = np.zeros((batch, steps), int)
    last = prompt
    for t in range(steps):
        last = np.where(t < switch, rng.integers(0, n, size=batch), (last + 1) % n)
        idx[:, t] = last
    actions = _CYCLE[idx]
    chunks = np.zeros((batch, steps, 3), np.int32)
    chunks[:, 0, 0], chunks[:, 0, 1] = 1, _CYCLE[prompt]
    chunks[:, 1:, 0] = actions[:, :-1]
    tool_steps = np.arange(1, steps) % 3 == 0
    chunks[:, 1:, 1] = np.where(tool_steps, rng.integers(10, 12, size=(batch, steps - 1)), 0)
    return chunks, actions, np.arange(steps)[None, :] >= switch[:, None]


@pytest.mark.slow
def test_teacher_forced_sft_learns_a_token_pattern():
    """Eighty optax updates of teacher-forced SFT (``episode_scores``,
    the loss masked to the expert's segment after a random prefix) drive the
    loss from the uniform baseline to near 0, and the trained Policy then
    decodes the pattern greedily through its KV cache. Kills: gradients that
    do not reach the parameters, scores at the wrong chunk slot (targets
    shifted by one: the next step's echo makes the answer visible, so the
    teacher-forced loss would fall but greedy decoding would fail), a
    training path that differs from the acting path."""
    V, steps, batch = 12, 8, 32
    cfg = transformer_config("tiny", vocab_size=V, token_width=3, max_context=3 * steps,
                             num_layers=1)  # one layer suffices; compiling is the cost
    pol = TransformerPolicy(cfg)
    params = _params(pol.net, seed=0, scale=1.0)  # LeCun-like, as flax's init
    chunks, actions, mask = _pattern_episodes(np.random.default_rng(6), 16 * batch, steps)
    obs = jnp.asarray(chunks[:, :, None, :], jnp.float32)  # [B, T, N=1, K]
    acts = jnp.asarray(actions[:, :, None])
    loss_mask = jnp.asarray(mask[:, :, None], jnp.float32)
    legal = jnp.zeros((1, V), bool).at[:, _CYCLE].set(True)
    avail = jnp.broadcast_to(legal, (steps, 1, V))

    def loss_fn(params, obs, acts, m):
        lp, _ = jax.vmap(pol.episode_scores, in_axes=(None, 0, None, 0))(params, obs, avail, acts)
        return -jnp.sum(m * lp) / jnp.sum(m)

    opt = optax.adam(3e-3)

    @jax.jit
    def train(params, data, key):
        def update(c, k):
            params, state = c
            idx = jax.random.randint(k, (batch,), 0, data[0].shape[0])
            loss, grads = jax.value_and_grad(loss_fn)(params, *(x[idx] for x in data))
            upd, state = opt.update(grads, state, params)
            return (optax.apply_updates(params, upd), state), loss

        (params, _), losses = jax.lax.scan(update, (params, opt.init(params)),
                                           jax.random.split(key, 80))
        return params, losses

    params, losses = train(params, (obs, acts, loss_mask), jax.random.PRNGKey(1))
    losses = np.asarray(losses)
    uniform = math.log(len(_CYCLE))
    assert losses[:5].mean() > 0.8 * uniform, losses[:5]
    assert losses[-20:].mean() < 0.05 * uniform, losses[-20:]

    # Greedy decoding through the cache from the prompt, fed its own tokens.
    policy = pol.policy(deterministic=True)
    test_chunks, test_actions, _ = _pattern_episodes(np.random.default_rng(7), 64, steps,
                                                     prefix=False)

    @jax.jit
    def decode(params, first, tools):
        def body(c, tool):
            carry, obs = c
            a, carry = jax.vmap(policy.act, in_axes=(None, 0, None, None, 0))(
                params, obs, legal, jax.random.PRNGKey(0), carry)
            nxt = jnp.stack([a[:, 0], tool, jnp.zeros_like(tool)], -1)[:, None]
            return (carry, nxt.astype(jnp.float32)), a[:, 0]

        carry = jax.vmap(lambda _: policy.init(None, 1))(jnp.arange(first.shape[0]))
        return jax.lax.scan(body, (carry, first), tools)[1].T

    tools = np.concatenate([test_chunks[:, 1:, 1], np.zeros((64, 1), np.int32)], 1)
    out = np.asarray(decode(params, jnp.asarray(test_chunks[:, :1].astype(np.float32)),
                            jnp.asarray(tools.T)))
    assert (out == test_actions).mean() > 0.95, (out[:3], test_actions[:3])
