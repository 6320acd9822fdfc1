"""Batched generation with [`Transformer`][jaxil.nn.transformer.Transformer]:
prefill, then decode.

[`generate`][jaxil.nn.generate.generate] continues a batch of prompts of
different lengths in one jitted program:

1. **Prefill.** The prompts `[B, T]` are left-aligned (a prompt starts at
   column 0; columns at and past its length may hold anything) and enter
   the decoder's batched step,
   [`Transformer.decode`][jaxil.nn.transformer.Transformer.decode], as one
   chunk attending to itself (`fresh`: `O(T²)`, the empty cache is only
   written), read out at each prompt's last token (`read_at`): its logits
   give the first new token. The cache's `length` is each prompt's length,
   so the columns past a prompt are never attended to and are overwritten
   as the row grows.
2. **Decode.** A `lax.while_loop` of one-token steps, each feeding the
   token sampled before it: `max_new_tokens − 1` steps at most (the last
   token is not fed back). It ends when every row has emitted a stop token.

Sampling ([`Sampling`][jaxil.nn.generate.Sampling]) is greedy at
temperature 0; otherwise the logits are divided by the temperature, cut to
the `top_k` most likely tokens, then to the smallest set whose probability
reaches `top_p` ([`filter_logits`][jaxil.nn.generate.filter_logits]), and
one token is drawn. A row ends at its first stop token (kept in the
output); the slots after it hold `fill`.

```python
import jax
from jaxil.nn.generate import Sampling, generate

out = generate(config, params, prompt_ids, prompt_lengths, jax.random.key(0),
               max_new_tokens=64, sampling=Sampling(temperature=0.7, top_p=0.9),
               stop_ids=(2,))
out.tokens[b, :out.lengths[b]]          # row b's new tokens, its stop token last
jax.vmap(lambda k: generate(config, params, prompt_ids, prompt_lengths, k, 64,
                            Sampling(temperature=1.0)).tokens)(jax.random.split(key, 8))
```

What a decode step costs: it is the decoder's batched step,
[`Transformer.decode`][jaxil.nn.transformer.Transformer.decode]. Each layer
keeps its keys and values in buffers of its own (values `[B, H_kv, C, D]`, keys
the same or, with grouped-query attention, `[B, H_kv, D, C]`; see
[`KVCache`][jaxil.nn.transformer.KVCache]) that the step updates in place (a
scatter of the new token's slot inside the `while_loop`): the cache is never
copied or restacked, and a step's memory traffic is the weights plus one read
of the attended cache slots. With `block=0` attention reads all `max_context`
slots (masked past each row's length), so keep `max_context` close to the
longest prompt plus `max_new_tokens`; with `block > 0` it reads blocks of
`block` slots, only as many as the longest row has filled, under a running
softmax. On XLA's CPU backend the block loop copies each block before its
matrix product, so it pays off only when the filled length is well below
`max_context` ([`attention_block`][jaxil.nn.generate.attention_block] chooses
blocks for contexts longer than `2 · DEFAULT_BLOCK`;
`benchmarks/decode_engine.py` measures both).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxil.nn.transformer import Transformer, TransformerConfig


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How the next token is chosen (hashable: a static argument).

    Attributes:
      temperature: 0 for greedy (the most likely token; the lowest id among
        ties); otherwise the logits are divided by it before sampling.
      top_k: keep only the `top_k` most likely tokens (0: all).
      top_p: keep only the smallest set of most likely tokens whose
        probability reaches `top_p` (nucleus sampling; 1: all), after
        `top_k`.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        t, k, p = self.temperature, self.top_k, self.top_p
        if not (isinstance(t, (int, float)) and np.isfinite(t) and t >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {t}; "
                             "pass 0 for greedy decoding or a positive temperature such as 0.7")
        if not (isinstance(k, (int, np.integer)) and k >= 0):
            raise ValueError(f"top_k must be an integer >= 0 (0: no cut), got {k!r}")
        if not (isinstance(p, (int, float)) and 0 < p <= 1):
            raise ValueError(f"top_p must be in (0, 1] (1: no cut), got {p}; pass e.g. 0.9, "
                             "or 1 to sample from the whole distribution")

    @property
    def greedy(self) -> bool:
        """Temperature 0: the most likely token, no randomness."""
        return self.temperature == 0


class Generation(NamedTuple):
    """The output of [`generate`][jaxil.nn.generate.generate].

    Attributes:
      tokens: `int32 [B, max_new_tokens]` the new tokens of each row, its
        stop token (if it emitted one) last, `fill` after it.
      lengths: `int32 [B]` how many new tokens each row has (its stop token
        included).
    """

    tokens: jax.Array
    lengths: jax.Array


def filter_logits(logits: jax.Array, sampling: Sampling) -> jax.Array:
    """The logits a token is drawn from: divided by the temperature, `-inf`
    outside the `top_k` most likely tokens and outside the smallest set of
    most likely tokens whose probability (after `top_k`) reaches `top_p`.

    Args:
      logits: `[..., V]` next-token logits.
      sampling: a sampling setting with a positive temperature.

    Returns:
      `float32 [..., V]`; `softmax` of it is the sampling distribution. Ties
      are ordered by token id (the lower id counts as more likely).
    """
    if sampling.greedy:
        raise ValueError("filter_logits needs a positive temperature; greedy decoding takes the "
                         "argmax of the logits")
    x = jnp.asarray(logits, jnp.float32) / jnp.float32(sampling.temperature)
    V = x.shape[-1]
    cut_k = 0 < sampling.top_k < V
    if not cut_k and sampling.top_p >= 1:
        return x
    shape = x.shape
    x = x.reshape(-1, V)
    order = jnp.argsort(-x, axis=-1, stable=True)  # most likely first, ties by id
    ranked = jnp.take_along_axis(x, order, axis=-1)
    keep = jnp.ones(ranked.shape, bool)
    if cut_k:
        keep = jnp.arange(V) < sampling.top_k
        keep = jnp.broadcast_to(keep, ranked.shape)
    if sampling.top_p < 1:
        p = jax.nn.softmax(jnp.where(keep, ranked, -jnp.inf), axis=-1)
        before = jnp.cumsum(p, axis=-1) - p  # mass of the more likely tokens
        keep = keep & (before < sampling.top_p)
    rows = jnp.arange(x.shape[0])[:, None]
    out = jnp.full_like(x, -jnp.inf).at[rows, order].set(jnp.where(keep, ranked, -jnp.inf))
    return out.reshape(shape)


#: The block width of [`greedy_tokens`][jaxil.nn.generate.greedy_tokens]'s
#: first pass.
ARGMAX_BLOCK = 512


def greedy_tokens(logits: jax.Array) -> jax.Array:
    """`argmax` over the last axis of `logits [..., V]`, `int32 [...]`: the
    lowest id among ties (as `jnp.argmax`). A row with a NaN gets some id in
    `0 .. V − 1` (XLA's CPU max may or may not propagate the NaN).

    In two passes: the maximum of each block of `ARGMAX_BLOCK` ids (a plain
    reduction, which XLA's CPU backend vectorizes), then `jnp.argmax` inside
    the first block that attains the row's maximum. `jnp.argmax` over the
    whole row is one reduction over (value, index) pairs, which that backend
    runs element by element: at `[256, 49152]` this is about 7× faster
    (`benchmarks/decode_engine.py` times both)."""
    V = logits.shape[-1]
    nb = -(-V // ARGMAX_BLOCK)
    x = logits
    if nb * ARGMAX_BLOCK != V:  # pad the last block with ids that never win
        pad = jnp.full(x.shape[:-1] + (nb * ARGMAX_BLOCK - V,), -jnp.inf, x.dtype)
        x = jnp.concatenate([x, pad], axis=-1)
    blocks = x.reshape(x.shape[:-1] + (nb, ARGMAX_BLOCK))
    block_max = jnp.max(blocks, axis=-1)
    top = jnp.max(block_max, axis=-1, keepdims=True)
    first = jnp.argmax(block_max == top, axis=-1)
    inside = jnp.take_along_axis(blocks, first[..., None, None], axis=-2)[..., 0, :]
    return (first * ARGMAX_BLOCK + jnp.argmax(inside, axis=-1)).astype(jnp.int32)


def sample_tokens(key: jax.Array, logits: jax.Array, sampling: Sampling) -> jax.Array:
    """One token per row of `logits [B, V]`, `int32 [B]`: the argmax when
    greedy ([`greedy_tokens`][jaxil.nn.generate.greedy_tokens]), else a draw
    from `softmax(filter_logits(logits, sampling))`."""
    if sampling.greedy:
        return greedy_tokens(logits)
    return jax.random.categorical(key, filter_logits(logits, sampling), axis=-1).astype(jnp.int32)


#: The decode step's attention block when `generate` chooses (`block=None`):
#: caches longer than two blocks are read block by block, up to the filled
#: length.
DEFAULT_BLOCK = 128


def attention_block(config: TransformerConfig, block: Optional[int] = None) -> int:
    """The block size the decode step reads the cache in (0: the whole
    cache at once): `block` itself when given, else `DEFAULT_BLOCK` for
    contexts longer than two blocks and 0 for shorter ones."""
    if block is None:
        return DEFAULT_BLOCK if config.max_context > 2 * DEFAULT_BLOCK else 0
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 0:
        raise ValueError(f"block must be an integer >= 0 (0: attend to the whole cache at once), "
                         f"got {block!r}")
    return int(block)


@functools.lru_cache(maxsize=32)
def make_generate(config: TransformerConfig, max_new_tokens: int, sampling: Sampling = Sampling(),
                  stop_ids: tuple[int, ...] = (), fill: int = -1,
                  block: Optional[int] = None) -> Callable:
    """The jitted `(params, prompt_ids [B, T], prompt_lengths [B], key) ->
    Generation` of [`generate`][jaxil.nn.generate.generate] for these static
    settings, unchecked (one compiled program per setting and shape; the
    function is cached, so calling this again returns the same one). For
    `.lower(...).compile()` to time the compilation apart from the run."""
    net = Transformer(config)
    step = functools.partial(net.decode, block=attention_block(config, block))
    stops = jnp.asarray(stop_ids if stop_ids else (-1,), jnp.int32)
    idle = config.pad_id if config.pad_id is not None else 0  # what a finished row feeds

    def run(params: Any, prompt_ids: jax.Array, prompt_lengths: jax.Array,
            key: jax.Array) -> Generation:
        B = prompt_ids.shape[0]
        prompt_ids = prompt_ids.astype(jnp.int32)
        prompt_lengths = prompt_lengths.astype(jnp.int32)
        # The prompts are one chunk: a sequence pass over all T columns,
        # read out at each prompt's last token. The cache keeps the prompt's
        # slots; the columns after it are never attended to (a slot is read
        # only up to the row's length) and are overwritten as the row grows.
        logits, cache = net.decode(params, prompt_ids, net.empty_cache((B,)), fresh=True,
                                   read_at=prompt_lengths - 1)
        cache = cache._replace(length=prompt_lengths)

        def emit(i, logits, out, done, lengths, key):
            """Sample token `i` of each row from `logits` and record it."""
            key, sub = jax.random.split(key)
            token = jnp.where(done, fill, sample_tokens(sub, logits, sampling))
            out = jax.lax.dynamic_update_slice(out, token[:, None], (0, i))
            lengths = lengths + (~done).astype(jnp.int32)
            done = done | jnp.isin(token, stops)
            return out, jnp.where(done, idle, token), done, lengths, key

        def cond(state):
            i, _, _, _, done, _, _ = state
            return (i < max_new_tokens) & ~jnp.all(done)

        def body(state):
            i, out, cache, last, done, lengths, key = state
            logits, cache = step(params, last[:, None], cache)
            out, last, done, lengths, key = emit(i, logits, out, done, lengths, key)
            return i + 1, out, cache, last, done, lengths, key

        # The first new token comes from the prefill's logits; each later one
        # costs one decode step (the last token is never fed back).
        out, last, done, lengths, key = emit(
            0, logits, jnp.full((B, max_new_tokens), fill, jnp.int32), jnp.zeros((B,), bool),
            jnp.zeros((B,), jnp.int32), key)
        state = (jnp.int32(1), out, cache, last, done, lengths, key)
        _, out, _, _, _, lengths, _ = jax.lax.while_loop(cond, body, state)
        return Generation(out, lengths)

    return jax.jit(run)


def check_request(config: TransformerConfig, prompt_shape: tuple[int, ...],
                  max_new_tokens: int) -> None:
    """Raise a one-line `ValueError` naming the fix when a batch of prompts
    of shape `[B, T]` and `max_new_tokens` do not fit `config`'s context
    (`T + max_new_tokens − 1` positions: the last new token is not fed
    back)."""
    if len(prompt_shape) != 2 or prompt_shape[0] < 1 or prompt_shape[1] < 1:
        raise ValueError(f"prompt_ids must be [B, T] with B, T >= 1, got shape "
                         f"{list(prompt_shape)}; pass a batch of at least one non-empty prompt")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
            or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    T, C = prompt_shape[1], config.max_context
    if T > C:
        raise ValueError(f"the prompt has {T} tokens but the model's context holds {C}; "
                         f"shorten the prompt or raise max_context to at least "
                         f"{T + max_new_tokens - 1}")
    if T + max_new_tokens - 1 > C:
        raise ValueError(f"a {T}-token prompt and {max_new_tokens} new tokens need a context of "
                         f"{T + max_new_tokens - 1} but the model's holds {C}; lower "
                         f"max_new_tokens to {C - T + 1} or raise max_context")


def generate(config: TransformerConfig, params: Any, prompt_ids: jax.Array,
             prompt_lengths: jax.Array, key: jax.Array, max_new_tokens: int,
             sampling: Sampling = Sampling(), stop_ids: Sequence[int] = (),
             fill: int = -1, block: Optional[int] = None) -> Generation:
    """Continue a batch of prompts (see the module docstring).

    Args:
      config: the decoder's configuration.
      params: its parameters.
      prompt_ids: `int [B, T]` the prompts, left-aligned (row `b` is
        `prompt_ids[b, :prompt_lengths[b]]`; the rest is ignored).
      prompt_lengths: `int [B]`, each in `1 .. T`.
      key: a PRNG key (unused when greedy).
      max_new_tokens: the token limit per row.
      sampling: greedy (the default), or temperature / top-k / top-p.
      stop_ids: token ids that end a row (e.g. the checkpoint's EOS and
        end-of-turn ids).
      fill: the token id of the slots after a row's end.
      block: how a decode step reads the cache: 0 all `max_context` slots,
        else blocks of `block` slots up to the longest row's filled length;
        None chooses ([`attention_block`][jaxil.nn.generate.attention_block]).

    Returns:
      A [`Generation`][jaxil.nn.generate.Generation]: `tokens [B,
      max_new_tokens]` and `lengths [B]`.

    Raises:
      ValueError: a prompt batch that is not `[B, T]`, a context too short
        for `T + max_new_tokens − 1` positions, or (when the lengths are
        concrete) a length outside `1 .. T`.
    """
    prompt_ids = jnp.asarray(prompt_ids)
    prompt_lengths = jnp.asarray(prompt_lengths)
    check_request(config, prompt_ids.shape, max_new_tokens)
    if prompt_lengths.shape != prompt_ids.shape[:1]:
        raise ValueError(f"prompt_lengths must be [B] = [{prompt_ids.shape[0]}], got shape "
                         f"{list(prompt_lengths.shape)}")
    if not isinstance(prompt_lengths, jax.core.Tracer):
        bad = np.asarray(prompt_lengths)
        bad = bad[(bad < 1) | (bad > prompt_ids.shape[1])]
        if bad.size:
            raise ValueError(f"prompt lengths must be in 1 .. {prompt_ids.shape[1]} (the prompt "
                             f"width), got {bad.tolist()}; every prompt needs at least one token "
                             "(e.g. BOS)")
    run = make_generate(config, int(max_new_tokens), sampling,
                        tuple(int(s) for s in stop_ids), int(fill), attention_block(config, block))
    return run(params, prompt_ids, prompt_lengths, key)
