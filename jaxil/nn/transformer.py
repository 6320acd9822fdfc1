"""A decoder-only causal transformer whose policy carry is its KV cache.

On a token environment one step is one token per agent: `spec.action` is a
`DiscreteActions(num_actions=V)` over the vocabulary, `avail_actions
[N, V]` is the legal-token mask (token 0, `PAD`, is never legal), and
the first `K = token_width` columns of `obs [N, O]` are the token ids (as
floats) that enter the agent's context at this step, right-padded with PAD:
at reset BOS and the prompt; afterwards the agent's own previous token,
followed by tool-output tokens when its turn ended. Columns after `K` are
privileged features for scripted experts and are never read here.

[`Transformer`][jaxil.nn.transformer.Transformer] is the network (flax
linen): a token embedding, `num_layers` pre-norm blocks (causal
self-attention, then an MLP), a final norm and an output head. Its
[`TransformerConfig`][jaxil.nn.transformer.TransformerConfig] chooses the
family; the defaults are jaxil's from-scratch architecture (the `SIZES`):

| option | default (from scratch, GPT-2) | Llama family |
|---|---|---|
| `norm` | `layernorm` (scale and bias) | `rmsnorm` (scale) |
| `positions` | `learned` absolute embeddings | `rope` (`rope_theta`, `rope_scaling`) |
| `mlp`, `activation` | `gelu`, `gelu_tanh` (`up`, act, `down`) | `swiglu`, `silu` (`down(act(gate) * up)`) |
| `num_kv_heads` | all heads (fused `qkv`) | fewer: grouped-query attention |
| biases | on q/k/v, attention output and MLP | none; q/k/v only (Qwen2) |
| `qk_norm` | off | per-head RMSNorms of q and k (Qwen3) |
| `tie_head` | an untied `head` | tied or untied |

Pretrained checkpoints become configurations and parameters of this one
network through [`jaxil.nn.pretrained_params`][jaxil.nn.pretrained_params].
Parameters are stored in `param_dtype` (`float32` or `bfloat16`) and the
forward pass runs in `dtype`; attention softmaxes, norm statistics and the
returned logits are float32.

The network has two paths over the same parameters:

- [`Transformer.decode`][jaxil.nn.transformer.Transformer.decode] — append up
  to `K` new tokens to each row of a batch of
  [`KVCache`][jaxil.nn.transformer.KVCache]s and return the next-token logits
  at the last of them (`O(K·C)` attention per layer, `C = max_context`); each
  layer's cache is its own pair of `[B, H_kv, ·, ·]` buffers (layouts in
  [`KVCache`][jaxil.nn.transformer.KVCache]), written only at the new tokens'
  slots (in place inside a compiled loop) and read where it lies.
  [`Transformer.step`][jaxil.nn.transformer.Transformer.step] is the same for
  one agent;
- [`Transformer.sequence_logits`][jaxil.nn.transformer.Transformer.sequence_logits]
  — teacher forcing over a whole token sequence (`O(T²)`), the training path;
  it also serves, re-run on the growing prefix every step, as the cache-free
  reference
  ([`TransformerPolicy.recompute_policy`][jaxil.nn.transformer.TransformerPolicy.recompute_policy]).
  [`Transformer.logits`][jaxil.nn.transformer.Transformer.logits] is the same
  over a batch, `[B, T] -> [B, T, V]`.

PAD slots (token `pad_id`, 0 by default) may appear anywhere in either
input: they neither advance the position (learned or rotary) nor are
attended to, so the logits of a real token depend only on the real tokens up
to it. The two paths agree to float32 rounding. A pretrained vocabulary has a
real token at id 0: with `pad_id=None` every token is real and the position
of a token is its index.

The context is bounded by `max_context` (the cache length; for learned
positions also the size of the position table). A context longer than
`max_context` is truncated: tokens past it are not stored and the logits
stay those of the last stored token (both paths alike); environments keep
their episodes within it.

[`TransformerPolicy`][jaxil.nn.transformer.TransformerPolicy] turns the network
into an [`envs.policies.Policy`][jaxil.envs.policies.Policy] for N agents with
shared parameters (an optional learned agent-id embedding, `num_agents > 0`,
lets them differ): `init(key, N)` is an empty cache per agent and `act` appends
the step's tokens and samples a legal token with
[`jaxil.nn.distributions`][jaxil.nn.distributions].

Scoring needs the context, which the protocol's stateless `log_prob(params,
obs, avail, actions)` and `entropy(params, obs, avail)` do not receive: the
distribution of a token is a function of the whole episode so far, not of
`obs`. Scoring an action from one step's obs alone would be a different
policy (an empty context), silently, so the Policy leaves both `None`
(like a scripted expert) and the context-aware scores are methods:

- [`TransformerPolicy.step_log_probs`][jaxil.nn.transformer.TransformerPolicy.step_log_probs]
  — `(params, obs, avail, carry) -> (log π [N, V], carry)`, one step along a
  rollout;
- [`TransformerPolicy.episode_scores`][jaxil.nn.transformer.TransformerPolicy.episode_scores]
  — `(params, obs [T, N, O], avail [T, N, V], actions [T, N]) -> (log π(a_t)
  [T, N], entropy [T, N])`, teacher-forced over one recorded episode in one
  pass per agent: exactly the distributions `act` sampled from. Behaviour
  cloning / SFT on episodes is `−Σ mask·log π / Σ mask` with a loss mask over
  steps (the agent's own tokens; for OEC only the expert's segment). A
  per-token KL to a reference policy compares the two policies'
  [`TransformerPolicy.chunk_logits`][jaxil.nn.transformer.TransformerPolicy.chunk_logits]
  under the same mask (`D.categorical_log_probs`); its one-sample estimate is
  the difference of two `episode_scores`;
- [`TransformerPolicy.sequence_log_probs`][jaxil.nn.transformer.TransformerPolicy.sequence_log_probs]
  — flat token sequences, `log π(targets[t] | tokens[:t+1])`, for token data
  that is not an environment episode.

[`TransformerPolicy.chunk_features`][jaxil.nn.transformer.TransformerPolicy.chunk_features]
is the same teacher-forced pass stopped before the head: the final hidden
states `[T, N, d_model]` (after the final norm) at the positions `chunk_logits`
reads, which
[`Transformer.read_out`][jaxil.nn.transformer.Transformer.read_out] maps to
those logits — the student's representation of its context, for diagnostics
such as covariate shift.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple, Optional

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxil.envs.policies import Policy
from jaxil.nn import distributions as D
from jaxil.pretrained.config import ROPE_SCALING, rope_inv_freq

#: The padding token of the token tasks: never legal, never attended to,
#: never a position (`TransformerConfig.pad_id`'s default).
PAD = 0

#: Architectures by name; vocabulary, token width and context come from the
#: task (`transformer_config`). Parameters at V = 64, C = 256
#: (`TransformerConfig.num_params`; in the blocks alone): tiny 124,672
#: (99,968); mini 644,224 (594,816); small 3,257,856 (3,159,040); base
#: 19,111,936 (18,914,304).
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"d_model": 64, "num_layers": 2, "num_heads": 2},
    "mini": {"d_model": 128, "num_layers": 3, "num_heads": 4},
    "small": {"d_model": 256, "num_layers": 4, "num_heads": 4},
    "base": {"d_model": 512, "num_layers": 6, "num_heads": 8},
}

# A large negative, finite attention score: a fully masked row (a PAD query
# with nothing before it) is uniform instead of NaN, in values and gradients.
_MASKED = -1e9

# The choices of each string option (the first is the default).
_CHOICES = {
    "norm": ("layernorm", "rmsnorm"),
    "positions": ("learned", "rope"),
    "mlp": ("gelu", "swiglu"),
    "activation": ("gelu_tanh", "gelu", "silu"),
    "param_dtype": ("float32", "bfloat16"),
    "dtype": ("float32", "bfloat16"),
}
_ACTIVATIONS = {"gelu_tanh": lambda x: nn.gelu(x, approximate=True),
                "gelu": lambda x: nn.gelu(x, approximate=False), "silu": nn.silu}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Static structure of a [`Transformer`][jaxil.nn.transformer.Transformer]
    (hashable; no dropout).

    The defaults after `num_agents` are jaxil's from-scratch architecture;
    the other choices are those of pretrained families (see the module
    docstring's table).

    Attributes:
      vocab_size: V, the number of token ids (the environment's
        `num_actions`).
      token_width: K, how many leading `obs` columns are token ids.
      max_context: C, the KV-cache length (and the number of learned
        positions).
      d_model: residual width.
      num_layers: number of transformer blocks.
      num_heads: query heads.
      mlp_ratio: MLP hidden width as a multiple of `d_model` (when `d_ff`
        is 0).
      num_agents: 0 for no agent-id embedding; N for a learned embedding of
        the agent index added to every token (agents then may differ while
        sharing all other parameters).
      ln_eps: the norms' epsilon (LayerNorm or RMSNorm).
      norm: `layernorm` or `rmsnorm`.
      positions: `learned` (a `[C, d]` table added to the embedding) or
        `rope` (rotary, HF's half-split layout).
      rope_theta: the rotary base.
      rope_scaling: None, or the sorted `(key, value)` items of an HF
        `rope_scaling` (`rope_type` `linear` or `llama3`).
      mlp: `gelu` (`mlp_out(act(mlp_in x))`) or `swiglu`
        (`mlp_out(act(mlp_gate x) * mlp_in x)`).
      activation: `gelu_tanh`, `gelu` (erf) or `silu`.
      d_ff: the MLP hidden width; 0 for `mlp_ratio * d_model`.
      num_kv_heads: key/value heads (grouped-query attention when fewer than
        `num_heads`); 0 for `num_heads`.
      head_size: the width of one head; 0 for `d_model // num_heads`.
      fused_qkv: one `qkv` projection `[d, 3, H, D]` (needs as many key/value
        heads as query heads) instead of `q`, `k`, `v`.
      qkv_bias: the q/k/v projections have biases.
      out_bias: the attention output projection has a bias.
      mlp_bias: the MLP projections have biases.
      qk_norm: per-head RMSNorms of q and k before the rotation.
      tie_head: the head is the transposed token embedding (no `head`).
      param_dtype: the parameters' dtype, `float32` or `bfloat16`.
      dtype: the compute dtype of the forward pass (and of the KV cache).
      pad_id: the padding token (never attended to, never a position), or
        None when every id is a real token (pretrained vocabularies).
    """

    vocab_size: int
    token_width: int
    max_context: int
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 2
    mlp_ratio: int = 4
    num_agents: int = 0
    ln_eps: float = 1e-5
    norm: str = "layernorm"
    positions: str = "learned"
    rope_theta: float = 10000.0
    rope_scaling: Optional[tuple[tuple[str, Any], ...]] = None
    mlp: str = "gelu"
    activation: str = "gelu_tanh"
    d_ff: int = 0
    num_kv_heads: int = 0
    head_size: int = 0
    fused_qkv: bool = True
    qkv_bias: bool = True
    out_bias: bool = True
    mlp_bias: bool = True
    qk_norm: bool = False
    tie_head: bool = False
    param_dtype: str = "float32"
    dtype: str = "float32"
    pad_id: Optional[int] = PAD

    def __post_init__(self):
        for name in ("vocab_size", "token_width", "max_context", "d_model", "num_layers",
                     "num_heads", "mlp_ratio"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"TransformerConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("d_ff", "num_kv_heads", "head_size"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"TransformerConfig.{name} must be >= 0 (0: derived), "
                                 f"got {getattr(self, name)}")
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices:
                raise ValueError(f"TransformerConfig.{name}={getattr(self, name)!r}; "
                                 f"choose one of {list(choices)}")
        if self.vocab_size < 2:
            raise ValueError(f"TransformerConfig.vocab_size must be >= 2 (PAD and one token), "
                             f"got {self.vocab_size}")
        if self.pad_id is not None and not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"TransformerConfig.pad_id={self.pad_id} is not a token id of the "
                             f"vocabulary of {self.vocab_size}; use None for no padding token")
        if self.num_agents < 0:
            raise ValueError(f"TransformerConfig.num_agents must be >= 0, got {self.num_agents}")
        if not self.head_size and self.d_model % self.num_heads:
            raise ValueError(f"TransformerConfig.d_model={self.d_model} is not a multiple of "
                             f"num_heads={self.num_heads}")
        if self.num_heads % self.kv_heads:
            raise ValueError(f"TransformerConfig.num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.kv_heads}")
        if self.fused_qkv and self.kv_heads != self.num_heads:
            raise ValueError(f"TransformerConfig.fused_qkv needs num_kv_heads == num_heads "
                             f"({self.kv_heads} != {self.num_heads}); set fused_qkv=False")
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError(f"TransformerConfig: rotary positions need an even head width, "
                             f"got {self.head_dim}")
        if self.rope_scaling is not None:
            kind = dict(self.rope_scaling).get("rope_type")
            missing = [k for k in ROPE_SCALING.get(kind, ()) if k not in dict(self.rope_scaling)]
            if kind not in ROPE_SCALING or missing:
                raise ValueError(f"TransformerConfig.rope_scaling={dict(self.rope_scaling)}: "
                                 f"rope_type must be one of {list(ROPE_SCALING)} with its keys "
                                 f"{dict(ROPE_SCALING)}")

    @property
    def head_dim(self) -> int:
        """The width of one head."""
        return self.head_size or self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads."""
        return self.num_kv_heads or self.num_heads

    @property
    def mlp_width(self) -> int:
        """The MLP hidden width."""
        return self.d_ff or self.mlp_ratio * self.d_model

    @property
    def rope_scaling_dict(self) -> Optional[dict]:
        """`rope_scaling` as a dict (None without scaling)."""
        return None if self.rope_scaling is None else dict(self.rope_scaling)

    def num_params(self) -> int:
        """The number of parameters, counted from the architecture."""
        d, f, D_, H, G = self.d_model, self.mlp_width, self.head_dim, self.num_heads, self.kv_heads
        norm = 2 * d if self.norm == "layernorm" else d
        attn = d * (H + 2 * G) * D_ + H * D_ * d
        attn += self.qkv_bias * (H + 2 * G) * D_ + self.out_bias * d + self.qk_norm * 2 * D_
        mats = 3 if self.mlp == "swiglu" else 2
        mlp = mats * d * f + self.mlp_bias * ((mats - 1) * f + d)
        embed = (self.vocab_size + self.num_agents
                 + self.max_context * (self.positions == "learned")) * d
        head = 0 if self.tie_head else d * self.vocab_size
        return embed + self.num_layers * (2 * norm + attn + mlp) + norm + head


def transformer_config(size: str, *, vocab_size: int, token_width: int, max_context: int,
                       **overrides: Any) -> TransformerConfig:
    """The `SIZES` architecture `size` for a task's vocabulary,
    token width and context length (`overrides` replace any field)."""
    if size not in SIZES:
        raise ValueError(f"unknown transformer size {size!r}; choose one of {list(SIZES)}")
    fields = dict(SIZES[size], vocab_size=vocab_size, token_width=token_width,
                  max_context=max_context)
    fields.update(overrides)
    return TransformerConfig(**fields)


def config_for_env(env: Any, size: str = "tiny", agent_ids: bool = False,
                   **overrides: Any) -> TransformerConfig:
    """The `SIZES` architecture `size` for a token environment: the
    vocabulary from `env.spec`, `token_width` and `max_context` from
    the environment's attributes of those names (every `tokens:` task has
    them); `agent_ids` adds the agent-id embedding (`num_agents` from the
    spec). `overrides` replace any field."""
    spec = env.spec
    missing = [a for a in ("token_width", "max_context") if not hasattr(env, a)]
    if missing or not spec.discrete:
        raise ValueError(f"{spec.env_id} is not a token environment (discrete actions and "
                         f"token_width / max_context attributes); missing: {missing}")
    fields = {"num_agents": spec.num_agents if agent_ids else 0}
    fields.update(overrides)
    return transformer_config(size, vocab_size=spec.num_actions, token_width=env.token_width,
                              max_context=env.max_context, **fields)


class KVCache(NamedTuple):
    """One agent's context (leading batch axes, e.g. `[N]`, allowed).

    Attributes:
      k: one array per layer (a tuple of `L`): the keys (rotated, with
        rotary positions), in the layout attention reads fastest
        ([`keys_slots_last`][jaxil.nn.transformer.keys_slots_last]):
        `[..., H_kv, D, C]` with grouped-query attention, where a decode
        step's scores are a sum over `D` of rows contiguous in the slots,
        else `[..., H_kv, C, D]`, where they are one matrix-vector product
        per head.
      v: one array per layer, each `[..., H_kv, C, D]`: the values.
        Both are in the compute dtype, heads before slots; slots at and past
        `length` are unused (stale entries there are never attended to).
      length: `[...]` int32, the number of tokens in the context.
      logits: `[..., V]` float32 next-token logits at the last token (zeros
        for an empty context), returned again by a step that brings no token.
    """

    k: jax.Array
    v: jax.Array
    length: jax.Array
    logits: jax.Array


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Softmax attention `[Q, H, D] × [M, G, D] -> [Q, H, D]` under `mask
    [Q, M]`; query head `h` reads key/value head `h // (H / G)`."""
    Q, H, Dh = q.shape
    G = k.shape[1]
    q = q.reshape(Q, G, H // G, Dh)
    scores = jnp.einsum("qgrd,mgd->grqm", q, k).astype(jnp.float32) / math.sqrt(Dh)
    scores = jnp.where(mask[None, None], scores, jnp.float32(_MASKED))
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("grqm,mgd->qgrd", weights, v).reshape(Q, H, Dh)


# With grouped-query attention (R > 1 query heads per key/value head) and
# up to this many query rows per key/value head (new tokens × R), a step's
# scores are one fused multiply-and-sum over `D` of the key cache's `[D, C]`
# rows, vectorised over the slots, instead of a batched matrix product,
# which XLA's CPU backend runs as one small product per (row, head).
_FEW_QUERIES = 8


def keys_slots_last(config: "TransformerConfig") -> bool:
    """Whether the key cache is laid out `[H_kv, D, C]` (slots last) rather
    than `[H_kv, C, D]`: with grouped-query attention. On XLA's CPU backend,
    side by side, slots last makes SmolLM2's batched decode 3-7 % faster at
    B = 256 and 512 (its scores 1.7x faster); with one query head per
    key/value head (GPT-2) the `[C, D]` layout's matrix-vector products
    decode 1.2x faster than either form over `[D, C]`."""
    return config.kv_heads < config.num_heads


def _attend_cache(q: jax.Array, k: jax.Array, v: jax.Array, pos: jax.Array,
                  block: int = 0) -> jax.Array:
    """Attention of a batch of new queries to their caches: `q [B, Q, H,
    D]` against keys `k [B, G, D, C]` (with `G < H`) or `[B, G, C, D]` (with
    `G == H`) and values `v [B, G, C, D]` (the
    [`KVCache`][jaxil.nn.transformer.KVCache] layouts), slot `m` read by
    query `(b, j)` iff `m <= pos[b, j]`. Returns `[B, Q, H, D]`.

    With `0 < block < C` the slots are read in blocks of `block`, only as
    many as the longest row has filled (`max(pos) + 1`), with a running
    softmax (max, sum and weighted values carried from block to block), so
    the cost follows the filled length instead of `C`; the result is the
    same softmax up to float32 rounding. The loop's trip count is a scalar
    only when the batch is not itself under `vmap`."""
    B, Q, H, Dh = q.shape
    G, C = v.shape[1], v.shape[2]
    R = H // G
    slots_last = R > 1  # the key layout (keys_slots_last)
    q = jnp.swapaxes(q.reshape(B, Q, G, R, Dh), 1, 2).reshape(B, G, Q * R, Dh)
    # Query rows are (j, r) pairs: row j·R + r is query j's head g·R + r.
    qpos = jnp.repeat(pos, R, axis=1)[:, None, :, None]  # [B, 1, Q·R, 1]

    def scores_at(kb, slots):
        if slots_last and Q * R <= _FEW_QUERIES:  # a decode step: multiply-and-sum over D
            s = jnp.sum(q[:, :, :, :, None].astype(jnp.float32)
                        * kb[:, :, None, :, :].astype(jnp.float32), axis=-2)
        else:  # a batched matrix product
            s = jnp.einsum("bgqd,bgdm->bgqm" if slots_last else "bgqd,bgmd->bgqm",
                           q, kb).astype(jnp.float32)
        s = s / math.sqrt(Dh)
        return jnp.where(slots[None, None, None, :] <= qpos, s, jnp.float32(_MASKED))

    if not 0 < block < C:
        s = scores_at(k, jnp.arange(C))
        w = jax.nn.softmax(s, axis=-1).astype(v.dtype)
        out = jnp.einsum("bgqm,bgmd->bgqd", w, v)
    else:
        nb = jnp.maximum((jnp.max(pos) + block) // block, 1)

        def one(i, carry):
            m_run, l_run, acc = carry
            start = jnp.minimum(i * block, C - block)  # the last block may overlap the one before
            slots = start + jnp.arange(block)
            kb = jax.lax.dynamic_slice_in_dim(k, start, block, axis=3 if slots_last else 2)
            vb = jax.lax.dynamic_slice_in_dim(v, start, block, axis=2)
            s = scores_at(kb, slots)
            s = jnp.where(slots[None, None, None, :] >= i * block, s, jnp.float32(_MASKED))
            m_new = jnp.maximum(m_run, jnp.max(s, axis=-1))
            p = jnp.exp(s - m_new[..., None])
            scale = jnp.exp(m_run - m_new)
            acc = acc * scale[..., None] + jnp.einsum("bgqm,bgmd->bgqd", p.astype(vb.dtype),
                                                      vb).astype(jnp.float32)
            return m_new, l_run * scale + jnp.sum(p, axis=-1), acc

        rows = (B, G, Q * R)
        init = (jnp.full(rows, -jnp.inf, jnp.float32), jnp.zeros(rows, jnp.float32),
                jnp.zeros(rows + (Dh,), jnp.float32))
        m_run, l_run, acc = jax.lax.fori_loop(0, nb, one, init)
        out = (acc / l_run[..., None]).astype(v.dtype)
    return jnp.swapaxes(out.reshape(B, G, Q, R, Dh), 1, 2).reshape(B, Q, H, Dh)


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotary positions on `x [..., Q, H, D]` with `cos, sin [..., Q, D /
    2]` (HF's `rotate_half` layout: dimension `i` pairs with `i + D / 2`)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos[..., None, :].astype(x.dtype), sin[..., None, :].astype(x.dtype)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _norm(c: TransformerConfig, **kw) -> nn.Module:
    cls = nn.LayerNorm if c.norm == "layernorm" else nn.RMSNorm
    return cls(epsilon=c.ln_eps, dtype=c.dtype, param_dtype=c.param_dtype, **kw)


class _Block(nn.Module):
    """Pre-norm block: `x + Attn(norm(x))`, then `x + MLP(norm(x))`."""

    config: TransformerConfig

    def setup(self):
        c = self.config
        H, G, Dh = c.num_heads, c.kv_heads, c.head_dim

        def dense(features, **kw):
            return nn.DenseGeneral(features, dtype=c.dtype, param_dtype=c.param_dtype, **kw)

        self.ln_attn = _norm(c)
        if c.fused_qkv:
            self.qkv = dense((3, H, Dh), use_bias=c.qkv_bias)
        else:
            self.q = dense((H, Dh), use_bias=c.qkv_bias)
            self.k = dense((G, Dh), use_bias=c.qkv_bias)
            self.v = dense((G, Dh), use_bias=c.qkv_bias)
        if c.qk_norm:
            self.q_norm = nn.RMSNorm(epsilon=c.ln_eps, dtype=c.dtype, param_dtype=c.param_dtype)
            self.k_norm = nn.RMSNorm(epsilon=c.ln_eps, dtype=c.dtype, param_dtype=c.param_dtype)
        self.attn_out = dense(c.d_model, axis=(-2, -1), use_bias=c.out_bias)
        self.ln_mlp = _norm(c)
        if c.mlp == "swiglu":
            self.mlp_gate = dense(c.mlp_width, use_bias=c.mlp_bias)
        self.mlp_in = dense(c.mlp_width, use_bias=c.mlp_bias)
        self.mlp_out = dense(c.d_model, use_bias=c.mlp_bias)

    def project(self, x, rope=None):
        """`(q [..., Q, H, D], k, v [..., Q, H_kv, D])` of `x [..., Q, d]`:
        normed, projected, q/k-normed and rotated by `rope` (None, or
        `(cos, sin) [..., Q, D / 2]` of the tokens' positions)."""
        c = self.config
        h = self.ln_attn(x)
        if c.fused_qkv:
            qkv = self.qkv(h)
            q, k, v = qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]
        else:
            q, k, v = self.q(h), self.k(h), self.v(h)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = _rotate(q, *rope), _rotate(k, *rope)
        return q, k, v

    def finish(self, x, attended):
        """The rest of the block after attention: `x + out(attended)`, then
        `x + MLP(norm(x))`; `attended [..., Q, H, D]`."""
        c = self.config
        x = x + self.attn_out(attended)
        h = self.ln_mlp(x)
        act = _ACTIVATIONS[c.activation]
        if c.mlp == "swiglu":
            h = act(self.mlp_gate(h)) * self.mlp_in(h)
        else:
            h = act(self.mlp_in(h))
        return x + self.mlp_out(h)

    def __call__(self, x, mask, rope=None):
        """Teacher forcing: `x [Q, d]` attends to itself under `mask [Q, Q]`."""
        q, k, v = self.project(x, rope)
        return self.finish(x, _attend(q, k, v, mask))


class _Decoder(nn.Module):
    config: TransformerConfig

    def setup(self):
        c = self.config
        emb_init = nn.initializers.normal(0.02)
        self.token_embed = nn.Embed(c.vocab_size, c.d_model, embedding_init=emb_init,
                                    dtype=c.dtype, param_dtype=c.param_dtype)
        if c.positions == "learned":
            self.pos_embed = self.param("pos_embed", emb_init, (c.max_context, c.d_model),
                                        c.param_dtype)
        if c.num_agents:
            self.agent_embed = self.param("agent_embed", emb_init, (c.num_agents, c.d_model),
                                          c.param_dtype)
        self.blocks = [_Block(c) for _ in range(c.num_layers)]
        self.ln_final = _norm(c)
        if not c.tie_head:
            self.head = nn.Dense(c.vocab_size, use_bias=False, dtype=c.dtype,
                                 param_dtype=c.param_dtype)

    def _embed(self, tokens, positions, agent):
        """`(x [..., T, d], rope)`: the input of the first block for tokens
        and positions `[..., T]` (agent `[...]`), and the rotary `(cos,
        sin)` of `positions` (None for learned positions)."""
        c = self.config
        x = self.token_embed(tokens)
        rope = None
        if c.positions == "learned":
            x = x + self.pos_embed[jnp.minimum(positions, c.max_context - 1)].astype(c.dtype)
        else:
            inv_freq = jnp.asarray(rope_inv_freq(c), jnp.float32)
            angles = positions.astype(jnp.float32)[..., None] * inv_freq
            rope = (jnp.cos(angles), jnp.sin(angles))
        if c.num_agents:
            x = x + self.agent_embed[agent][..., None, :].astype(c.dtype)
        return x, rope

    def read_out(self, features):
        if self.config.tie_head:
            return self.token_embed.attend(features).astype(jnp.float32)
        return self.head(features).astype(jnp.float32)

    def sequence_features(self, tokens, agent):
        """`[T, d]` the final norm's output: what the head reads."""
        c = self.config
        kept, pos = _kept_positions(tokens, 0, c.max_context, c.pad_id)
        x, rope = self._embed(tokens, pos, agent)
        t = jnp.arange(tokens.shape[0])
        mask = kept[None, :] & (t[None, :] <= t[:, None])
        for block in self.blocks:
            x = block(x, mask, rope)
        return self.ln_final(x)

    def sequence(self, tokens, agent):
        return self.read_out(self.sequence_features(tokens, agent))

    def step(self, tokens, cache: KVCache, agent, block: int = 0, fresh: bool = False,
             read_at=None):
        """A batch of rows `tokens [B, K]` appended to their caches (leading
        `[B]`): each layer writes only the new tokens' slots (a scatter into
        the layer's own buffer, which XLA updates in place inside a loop),
        and attention reads the cache where it lies (`_attend_cache`); with
        `fresh` (empty caches: a prefill) the chunk attends to itself
        instead, `O(K²)` rather than `O(K·C)`, never reading the cache.
        The logits are read at column `read_at [B]` when given, else at each
        row's last non-PAD token."""
        c = self.config
        kept, pos = jax.vmap(lambda t, n: _kept_positions(t, n, c.max_context, c.pad_id))(
            tokens, cache.length)
        x, rope = self._embed(tokens, pos, agent)
        write = jnp.where(kept, pos, c.max_context)
        rows = jnp.arange(tokens.shape[0])[:, None]
        # A fresh chunk's token reads the chunk's stored tokens up to its position.
        own = kept[:, None, :] & (pos[:, None, :] <= pos[:, :, None])
        ks, vs = [], []
        # The new tokens' key slots: `[B, G, D, C]` or `[B, G, C, D]` (keys_slots_last).
        heads = (slice(None),) * (2 if keys_slots_last(c) else 1)
        at = (rows,) + heads + (write,)
        for layer, blk in enumerate(self.blocks):
            q, k, v = blk.project(x, rope)
            ck = cache.k[layer].at[at].set(k.astype(cache.k[layer].dtype), mode="drop")
            cv = cache.v[layer].at[rows, :, write].set(v.astype(cache.v[layer].dtype), mode="drop")
            if fresh:
                attended = jax.vmap(_attend)(q, k, v, own)
            else:
                attended = _attend_cache(q, ck, cv, pos, block)
            x = blk.finish(x, attended)
            ks.append(ck)
            vs.append(cv)
        n = jnp.sum(kept, axis=1)
        if read_at is None:
            last = tokens.shape[1] - 1 - jnp.argmax(kept[:, ::-1], axis=1)
        else:
            last = read_at
        out = self.read_out(self.ln_final(x[rows[:, 0], last]))
        logits = jnp.where((n > 0)[:, None], out, cache.logits)
        return logits, KVCache(tuple(ks), tuple(vs), cache.length + n, logits)


def _kept_positions(tokens: jax.Array, start: jax.Array, max_context: int,
                    pad_id: Optional[int] = PAD):
    """`(kept [T], positions [T])`: non-PAD tokens that fit in the context,
    and the position of each (PAD slots do not advance it; with `pad_id`
    None every token is real)."""
    real = jnp.ones(tokens.shape, bool) if pad_id is None else tokens != pad_id
    pos = start + jnp.cumsum(real) - 1
    return real & (pos < max_context), pos


class Transformer:
    """The network of [`jaxil.nn.transformer`][jaxil.nn.transformer] as pure
    functions of one agent's tokens (`vmap` them over agents and batches).

    Parameters: `{"params": {"token_embed", ("pos_embed" [C, d]), ("agent_embed"
    [N, d]), "blocks_i" {ln_attn, qkv (or q, k, v), (q_norm, k_norm), attn_out,
    ln_mlp, (mlp_gate), mlp_in, mlp_out}, "ln_final", ("head")}}`; the
    parenthesised entries exist under their options (learned positions, agent
    ids, `fused_qkv` or not, `qk_norm`, `swiglu`, an untied head).
    """

    def __init__(self, config: TransformerConfig):
        self.config = config
        self.module = _Decoder(config)

    def init(self, key: jax.Array) -> Any:
        """The network's variables, drawn from `key` (compiled: eagerly,
        drawing every parameter op by op takes longer than compiling)."""
        tokens = jnp.zeros((self.config.token_width,), jnp.int32)
        return jax.jit(lambda k: self.module.init(k, tokens, jnp.int32(0),
                                                  method=_Decoder.sequence))(key)

    def empty_cache(self, batch_shape: tuple[int, ...] = ()) -> KVCache:
        """An empty context (zeros, length 0) with leading `batch_shape`."""
        c = self.config
        keys = (c.head_dim, c.max_context) if keys_slots_last(c) else (c.max_context, c.head_dim)
        k = tuple(jnp.zeros(batch_shape + (c.kv_heads,) + keys, c.dtype)
                  for _ in range(c.num_layers))
        v = tuple(jnp.zeros(batch_shape + (c.kv_heads, c.max_context, c.head_dim), c.dtype)
                  for _ in range(c.num_layers))
        return KVCache(k, v, jnp.zeros(batch_shape, jnp.int32),
                       jnp.zeros(batch_shape + (c.vocab_size,), jnp.float32))

    def step(self, params: Any, tokens: jax.Array, cache: KVCache,
             agent: jax.Array | int = 0) -> tuple[jax.Array, KVCache]:
        """Append one step's tokens to an agent's context.

        Args:
          params: the network's variables.
          tokens: `[K]` integer token ids; PAD slots anywhere are skipped.
          cache: the agent's [`KVCache`][jaxil.nn.transformer.KVCache] (no batch axes).
          agent: the agent index (used only with an agent-id embedding).

        Returns:
          `(logits [V], cache)`: next-token logits at the last non-PAD token
          (the previous ones if `tokens` is all PAD), and the extended cache.
        """
        chex.assert_rank(tokens, 1)
        chex.assert_type(tokens, int)
        logits, cache = self.decode(params, tokens[None], jax.tree.map(lambda a: a[None], cache),
                                    jnp.asarray(agent, jnp.int32)[None])
        return logits[0], jax.tree.map(lambda a: a[0], cache)

    def decode(self, params: Any, tokens: jax.Array, cache: KVCache,
               agents: Optional[jax.Array] = None, block: int = 0,
               fresh: bool = False, read_at: Optional[jax.Array] = None
               ) -> tuple[jax.Array, KVCache]:
        """Append one step's tokens to each row of a batch of contexts: the
        decode step of rollouts and of [`jaxil.nn.generate`][jaxil.nn.generate].

        Each layer computes only the new tokens and writes only their cache
        slots (a scatter into that layer's `[B, H_kv, ·, ·]` buffers; inside a
        `lax.scan` or `while_loop` XLA performs it in place, so the cache is
        never copied or restacked per step), and attention reads the cache
        in its stored layout.

        Args:
          params: the network's variables.
          tokens: `[B, K]` integer token ids, one row per context; PAD slots
            anywhere are skipped.
          cache: the rows' [`KVCache`][jaxil.nn.transformer.KVCache] (leading
            axis `[B]`).
          agents: `[B]` agent indices (used only with an agent-id
            embedding); None for 0.
          block: 0 to attend to all `C` slots; else read the slots in blocks
            of `block`, only up to the longest row's filled length (a static
            choice; see `_attend_cache`). Worth it when the batch is not
            vmapped further, as in `generate`.
          fresh: the caches are empty (a prefill): the chunk attends to its
            own tokens (`O(K²)` per layer) and the cache is only written.
            Wrong for a cache that holds tokens.
          read_at: `int [B]` the column of `tokens` whose next-token logits
            each row returns (e.g. a left-aligned prompt's last token, with
            other tokens after it); None for each row's last non-PAD token.

        Returns:
          `(logits [B, V], cache)`: each row's next-token logits at its last
          non-PAD token or at `read_at` (its previous ones if the row is all
          PAD), and the extended caches.
        """
        chex.assert_rank(tokens, 2)
        chex.assert_type(tokens, int)
        if agents is None:
            agents = jnp.zeros(tokens.shape[:1], jnp.int32)
        if read_at is not None:
            read_at = jnp.asarray(read_at, jnp.int32)
            chex.assert_shape(read_at, tokens.shape[:1])
        return self.module.apply(params, tokens, cache, agents, int(block), bool(fresh),
                                 read_at, method=_Decoder.step)

    def sequence_logits(self, params: Any, tokens: jax.Array,
                        agent: jax.Array | int = 0) -> jax.Array:
        """Teacher-forced next-token logits of one token sequence.

        Args:
          params: the network's variables.
          tokens: `[T]` integer token ids, PAD slots anywhere (e.g. an
            episode's per-step `K`-wide chunks concatenated).
          agent: the agent index (used only with an agent-id embedding).

        Returns:
          `[T, V]`: row `t` is the distribution of the token after `tokens[t]`
          given the non-PAD tokens up to `t` — what
          [`step`][jaxil.nn.transformer.Transformer.step] returns after the
          chunk ending at `t`. Rows at PAD slots are finite but meaningless.
        """
        chex.assert_rank(tokens, 1)
        chex.assert_type(tokens, int)
        return self.module.apply(params, tokens, agent, method=_Decoder.sequence)

    def logits(self, params: Any, tokens: jax.Array) -> jax.Array:
        """Next-token logits of a batch of token sequences, `[B, T] -> [B, T, V]`
        float32: row `t` of sequence `b` given its tokens up to `t`
        ([`sequence_logits`][jaxil.nn.transformer.Transformer.sequence_logits]
        of each, agent 0). Causal, so right-padding a shorter sequence with
        any token leaves its rows unchanged."""
        chex.assert_rank(tokens, 2)
        chex.assert_type(tokens, int)
        return jax.vmap(self.sequence_logits, in_axes=(None, 0))(params, tokens)

    def sequence_features(self, params: Any, tokens: jax.Array,
                          agent: jax.Array | int = 0) -> jax.Array:
        """Teacher-forced final hidden states `[T, d_model]` of one token
        sequence: the final norm's output, which the head maps to
        [`sequence_logits`][jaxil.nn.transformer.Transformer.sequence_logits]
        (`read_out(params, features)`)."""
        chex.assert_rank(tokens, 1)
        chex.assert_type(tokens, int)
        return self.module.apply(params, tokens, agent, method=_Decoder.sequence_features)

    def read_out(self, params: Any, features: jax.Array) -> jax.Array:
        """The output head: final hidden states `[..., d_model]` to
        next-token logits `[..., V]`."""
        return self.module.apply(params, features, method=_Decoder.read_out)


def obs_tokens(obs: jax.Array, token_width: int) -> jax.Array:
    """The token ids `int32 [..., K]` in the first `K` columns of `obs`."""
    return jnp.round(obs[..., :token_width]).astype(jnp.int32)


class TokenBuffer(NamedTuple):
    """Carry of
    [`TransformerPolicy.recompute_policy`][jaxil.nn.transformer.TransformerPolicy.recompute_policy]:
    the context as tokens `[..., C]` (PAD after `length`) and its
    `length [...]`."""

    tokens: jax.Array
    length: jax.Array


class TransformerPolicy:
    """A [`Transformer`][jaxil.nn.transformer.Transformer] acting for the N
    agents of one token environment (parameters shared; see the module
    docstring for scoring).

    Args:
      config: the network's
        [`TransformerConfig`][jaxil.nn.transformer.TransformerConfig].
    """

    def __init__(self, config: TransformerConfig):
        self.config = config
        self.net = Transformer(config)

    def init(self, key: jax.Array) -> Any:
        """The network's parameters."""
        return self.net.init(key)

    # -- per-agent plumbing --------------------------------------------------------
    def _agents(self, obs: jax.Array) -> jax.Array:
        n = obs.shape[-2]
        if self.config.num_agents and n != self.config.num_agents:
            raise ValueError(f"the transformer's agent-id embedding has num_agents="
                             f"{self.config.num_agents} but obs has {n} agents")
        return jnp.arange(n)

    def _check_obs(self, obs: jax.Array) -> None:
        if obs.shape[-1] < self.config.token_width:
            raise ValueError(f"obs has {obs.shape[-1]} columns but the transformer reads "
                             f"token_width={self.config.token_width} token ids from them")

    def init_carry(self, key: jax.Array, num_agents: int) -> KVCache:
        """An empty [`KVCache`][jaxil.nn.transformer.KVCache] per agent (`[N, ...]`)."""
        return self.net.empty_cache((num_agents,))

    def reset_carry(self, carry: KVCache, done: jax.Array) -> KVCache:
        """The carry of a new episode where `done` (a scalar) is true: only
        the lengths and logits are reset; the stale keys and values stay
        where they are, past the new length, where nothing reads them (a new
        episode's tokens overwrite them from slot 0), so an auto-resetting
        rollout does not rewrite the whole cache every step."""
        return carry._replace(length=jnp.where(done, 0, carry.length),
                              logits=jnp.where(done, 0.0, carry.logits))

    def step_logits(self, params: Any, obs: jax.Array, carry: KVCache) -> tuple[jax.Array, KVCache]:
        """`obs [N, O]`, `carry [N]` -> `(logits [N, V], carry)`: append
        the step's tokens and return the raw next-token logits."""
        self._check_obs(obs)
        tokens = obs_tokens(obs, self.config.token_width)
        return self.net.decode(params, tokens, carry, self._agents(obs))

    def step_log_probs(self, params: Any, obs: jax.Array, avail: jax.Array,
                       carry: KVCache) -> tuple[jax.Array, KVCache]:
        """`(log π [N, V], carry)`: the masked categorical `act` samples from
        at this step (log π(a) = `out[i, a]`; entropy:
        `D.categorical_entropy(logits, avail)` of
        [`step_logits`][jaxil.nn.transformer.TransformerPolicy.step_logits])."""
        logits, carry = self.step_logits(params, obs, carry)
        return D.categorical_log_probs(logits, avail), carry

    def act(self, params: Any, obs: jax.Array, avail: jax.Array, key: jax.Array,
            carry: KVCache, deterministic: bool = False) -> tuple[jax.Array, KVCache]:
        """One legal token per agent `int32 [N]` (sampled, or the most likely
        legal one) and the extended cache."""
        logits, carry = self.step_logits(params, obs, carry)
        if deterministic:
            return D.categorical_mode(logits, avail), carry
        return D.categorical_sample(key, logits, avail), carry

    # -- the protocol --------------------------------------------------------------
    def policy(self, deterministic: bool = False, key: str | None = None) -> Policy:
        """This network as an
        [`envs.policies.Policy`][jaxil.envs.policies.Policy] whose carry is the
        KV cache; `log_prob` / `entropy` are `None` (they need the context: use
        [`step_log_probs`][jaxil.nn.transformer.TransformerPolicy.step_log_probs]
        or
        [`episode_scores`][jaxil.nn.transformer.TransformerPolicy.episode_scores]).
        With `key`, the policy takes a learner's parameter dict and uses
        `params[key]`."""
        sub = (lambda params: params) if key is None else (lambda params: params[key])

        def act(params, obs, avail, rng, carry):
            return self.act(sub(params), obs, avail, rng, carry, deterministic)

        return Policy(init=self.init_carry, act=act, reset=self.reset_carry)

    def recompute_policy(self, deterministic: bool = False, key: str | None = None) -> Policy:
        """The same policy without a KV cache: the carry keeps the context's
        tokens and every step re-runs
        [`Transformer.sequence_logits`][jaxil.nn.transformer.Transformer.sequence_logits]
        over all `max_context` of them (`O(C²)` per step). A baseline for
        benchmarks and a reference for tests; it acts exactly as
        [`policy`][jaxil.nn.transformer.TransformerPolicy.policy] up to float32
        rounding."""
        sub = (lambda params: params) if key is None else (lambda params: params[key])
        c = self.config

        def init(rng, num_agents):
            return TokenBuffer(jnp.zeros((num_agents, c.max_context), jnp.int32),
                               jnp.zeros((num_agents,), jnp.int32))

        def one_agent(params, tokens, buf, agent):
            kept, pos = _kept_positions(tokens, buf.length, c.max_context, c.pad_id)
            ctx = buf.tokens.at[jnp.where(kept, pos, c.max_context)].set(tokens, mode="drop")
            length = buf.length + jnp.sum(kept)
            logits = self.net.sequence_logits(params, ctx, agent)[jnp.maximum(length - 1, 0)]
            return jnp.where(length > 0, logits, 0.0), TokenBuffer(ctx, length)

        def act(params, obs, avail, rng, carry):
            self._check_obs(obs)
            tokens = obs_tokens(obs, c.token_width)
            logits, carry = jax.vmap(one_agent, in_axes=(None, 0, 0, 0))(
                sub(params), tokens, carry, self._agents(obs))
            if deterministic:
                return D.categorical_mode(logits, avail), carry
            return D.categorical_sample(rng, logits, avail), carry

        return Policy(init=init, act=act)

    # -- teacher-forced scoring ------------------------------------------------------
    def _chunks(self, per_token: Any, obs: jax.Array, finish: Any = None) -> jax.Array:
        """`per_token(context [C], agent) -> [C, X]` run once per agent
        over its context (the non-PAD tokens of its `K`-wide chunks,
        packed left into `max_context` slots, PAD after), read at each
        step's last stored token: `[T, N, X]` (zeros before the first
        token). Packing first makes the pass cost `C` positions instead of
        `T·K` (most chunks hold one token and `K − 1` PADs). `finish`, when
        given, maps the `[T, X]` rows read (e.g. features to logits by the
        head, at `T` positions rather than `C`)."""
        chex.assert_rank(obs, 3)
        self._check_obs(obs)
        T, n, _ = obs.shape
        K, C = self.config.token_width, self.config.max_context
        tokens = jnp.swapaxes(obs_tokens(obs, K), 0, 1).reshape(n, T * K)  # [N, T·K]

        def one_agent(tokens, agent):
            kept, pos = _kept_positions(tokens, 0, C, self.config.pad_id)
            fill = self.config.pad_id or 0
            context = jnp.full((C,), fill, jnp.int32).at[jnp.where(kept, pos, C)].set(
                tokens, mode="drop")
            out = per_token(context, agent)
            # Each chunk reads the last stored token at or before its end.
            at = jnp.cumsum(kept).reshape(T, K)[:, -1] - 1
            rows = out[jnp.maximum(at, 0)]
            if finish is not None:
                rows = finish(rows)
            return jnp.where((at >= 0)[:, None], rows, 0.0)

        return jnp.swapaxes(jax.vmap(one_agent)(tokens, self._agents(obs)), 0, 1)

    def chunk_logits(self, params: Any, obs: jax.Array) -> jax.Array:
        """Teacher-forced logits of every step of one episode.

        Args:
          params: the network's variables.
          obs: `[T, N, O]` the observations the agents acted on (an
            [`envs.rollout.Episodes`][jaxil.envs.rollout.Episodes]'
            `obs[e, :-1]`); steps past the episode's end may hold anything,
            they do not affect earlier ones.

        Returns:
          `[T, N, V]`: the logits `act` saw at each step, from one
          [`Transformer.sequence_features`][jaxil.nn.transformer.Transformer.sequence_features]
          pass per agent over its whole context (the chunks' tokens packed into
          `max_context` slots), the head applied at the steps' positions only.
        """
        # The head reads only the T steps' positions: [T, V] logits rather
        # than [C, V] (a pretrained vocabulary makes the latter the largest
        # array of a training step). Steps before the first token stay zero.
        return self._chunks(
            lambda tokens, agent: self.net.sequence_features(params, tokens, agent), obs,
            finish=lambda features: self.net.read_out(params, features))

    def chunk_features(self, params: Any, obs: jax.Array) -> jax.Array:
        """Teacher-forced final hidden states of every step of one episode.

        Args:
          params: the network's variables.
          obs: `[T, N, O]` as for
            [`chunk_logits`][jaxil.nn.transformer.TransformerPolicy.chunk_logits].

        Returns:
          `[T, N, d_model]`: at the positions
          [`chunk_logits`][jaxil.nn.transformer.TransformerPolicy.chunk_logits]
          reads, the final norm's output, which the head maps to those logits
          (`self.net.read_out(params, features)`); zeros where an agent has no
          token yet. The student's representation of its context, e.g. for
          measuring covariate shift
          ([`jaxil.algorithms.lm.diagnostics`][jaxil.algorithms.lm.diagnostics]).
        """
        return self._chunks(
            lambda tokens, agent: self.net.sequence_features(params, tokens, agent), obs)

    def episode_scores(self, params: Any, obs: jax.Array, avail: jax.Array,
                       actions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Teacher-forced `(log π(a_t) [T, N], entropy [T, N])` of one
        recorded episode (`obs [T, N, O]`, `avail [T, N, V]`, `actions
        [T, N]`): the distributions `act` drew from along the episode.

        SFT on episodes: `−Σ_t,i m_ti·log π / Σ m_ti` with a loss mask
        `m [T, N]` (the episode's valid steps, and for OEC only the
        expert's segment); `vmap` over episodes."""
        chex.assert_rank([obs, avail, actions], [3, 3, 2])
        logits = self.chunk_logits(params, obs)
        return (D.categorical_log_prob(logits, avail, actions),
                D.categorical_entropy(logits, avail))

    def sequence_log_probs(self, params: Any, tokens: jax.Array, targets: jax.Array,
                           avail: jax.Array | None = None, agent: jax.Array | int = 0) -> jax.Array:
        """`log π(targets[t] | tokens[:t+1])`, `[T]`, for one flat token
        sequence (`tokens`, `targets` `[T]`; usually `targets[t] =
        tokens[t+1]`), under the legal mask `avail [T, V]` (None: every
        token but `pad_id`). Weight by a loss mask for SFT; `vmap` over
        sequences."""
        chex.assert_rank([tokens, targets], 1)
        logits = self.net.sequence_logits(params, tokens, agent)
        if avail is None:
            pad = self.config.pad_id
            legal = jnp.arange(self.config.vocab_size) != (-1 if pad is None else pad)
            avail = jnp.broadcast_to(legal, logits.shape)
        return D.categorical_log_prob(logits, avail, targets)
