"""Chat episodes of the token tasks: the same instances, as text a chat model
reads and writes.

A token task ([`envs.tokens`][jaxil.envs.tokens]) speaks a private vocabulary
in which a malformed command cannot be typed, so a pretrained model cannot act
in it. [`ChatEnv`][jaxil.envs.token_chat.ChatEnv] gives the same task a text
form under a model's own tokenizer and chat template, as in the scaffolds the
OEC and AfD papers train chat models in:

- the **system message** states the task and its command syntax
  (`TokenEnv.chat_intro`);
- the **user message** is the instance's prompt (the same hidden instance
  from the same reset key as the token task);
- an **agent turn** is free text in the model's vocabulary, up to its
  end-of-turn token (at most `turn_tokens` tokens, the last forced to be
  the end of turn);
- the environment **parses** the turn: a valid command runs in the task and
  its answer comes back as a user message; anything else gets an error
  message naming the syntax, and costs a turn.

The token contract of [`envs.tokens`][jaxil.envs.tokens] holds unchanged, in
the model's vocabulary, so [`TransformerPolicy`][jaxil.nn.transformer.TransformerPolicy]
and every learner run on it as they are:

- one step is one model token per agent; `obs[:, :K]` are the tokens that
  enter the agent's context (its own token echoed in column 0, then the
  environment's text), `<pad>` = token 0 skipped anywhere;
- long text (the system prompt at reset, an answer) is **streamed** `K`
  tokens per step; while an agent's text is still arriving, or while it is
  off turn (`tokens:exchange`), its only legal token is `wait_token`, which
  is echoed as `<pad>` (it never enters a context) and which
  [`speaking`][jaxil.algorithms.lm.turns.speaking] leaves out of every loss;
- `env.eot_token` is the model's end-of-turn token, so loss masks and
  OEC's switch fall at assistant-turn boundaries;
- the privileged columns `obs[:, K:]` carry what the chat experts
  ([`chat_expert`][jaxil.envs.token_chat.chat_expert]) need.

**Constrained decoding** (`constrained=True`): the task's command grammar
([`envs.token_grammar`][jaxil.envs.token_grammar]) compiled by
`outlines-core` into a token automaton over the model's vocabulary; the
legal mask of an agent on turn is the automaton's, so every command parses.
Off, the agent writes free text and the parser judges.

```python
import jaxil.lm
from jaxil import envs
from jaxil.envs.token_chat import ChatEnv

lm = jaxil.lm.load("smollm2-135m-instruct")
env = ChatEnv.from_model(envs.make("tokens:repair"), lm, constrained=True)
```
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .core import DiscreteActions, EnvSpec, MultiAgentEnv, Step
from .policies import Policy, as_policy
from .token_grammar import command_regex, token_automaton, token_bytes
from .token_tasks import token_expert
from .tokens import PAD, TokenEnv

__all__ = ["ChatEnv", "ChatState", "chat_expert", "chat_text", "ERROR_TEXT"]

#: The error message of a turn that is not a command (`{syntax}` is the
#: task's command list).
ERROR_TEXT = "Error: that is not a command. Write exactly one of: {syntax}"

_SPACES = (9, 10, 13, 32)


def _compact(x: jax.Array) -> jax.Array:
    """The non-`<pad>` entries of `x [..., M]` moved to the front, in order."""
    order = jnp.argsort(x == PAD, axis=-1, stable=True)
    return jnp.take_along_axis(x, order, axis=-1)


@struct.dataclass
class ChatState:
    """The state of a chat episode (leading axis of the per-agent fields: N).

    Attributes:
      task: the token task's hidden state.
      chars: [N, Lc] uint8 the text of each agent's current turn.
      nchars: [N] int32 its length (`Lc + 1`: it overflowed).
      turn: [N, turn_tokens] int32 the model tokens of the current turn.
      turn_len: [N] int32 how many.
      fsm: [N] int32 the constrained-decoding automaton's state (0 unused).
      queue: [N, Q] int32 tokens still to enter each agent's context.
      qlen: [N] int32 how many.
      opened: [N] bool the assistant header of the agent's next turn is queued.
      turns: [] int32 turns ended so far (all agents together).
      t: [] int32 steps so far.
    """

    task: Any
    chars: jax.Array
    nchars: jax.Array
    turn: jax.Array
    turn_len: jax.Array
    fsm: jax.Array
    queue: jax.Array
    qlen: jax.Array
    opened: jax.Array
    turns: jax.Array
    t: jax.Array


def _pieces(render: Callable[[list, bool], str], system: str) -> dict[str, str]:
    """The chat template's fixed text around messages, found by rendering
    conversations with sentinel contents and cutting between them."""
    U, A, W = "\u00a7U\u00a7", "\u00a7A\u00a7", "\u00a7W\u00a7"
    sys_msg = [{"role": "system", "content": system}]
    one = render(sys_msg + [{"role": "user", "content": U}], False)
    gen = render(sys_msg + [{"role": "user", "content": U}], True)
    two = render(sys_msg + [{"role": "user", "content": U}, {"role": "user", "content": W}], False)
    turn = render(sys_msg + [{"role": "user", "content": U}, {"role": "assistant", "content": A},
                             {"role": "user", "content": W}], False)
    if one.count(U) != 1 or not gen.startswith(one) or not two.startswith(one[:one.index(U)]):
        raise ValueError("the chat template does not render a conversation as its messages in "
                         "order; ChatEnv needs a template that does")
    head = one[:one.index(U)]
    user_close = one[one.index(U) + len(U):]
    header = gen[len(one):]
    between = two[len(head) + len(U):two.index(W)]
    if not between.startswith(user_close):
        raise ValueError("the chat template closes a user message differently when another "
                         "follows; ChatEnv needs consecutive user messages (tokens:exchange)")
    user_open = between[len(user_close):]
    after = turn[turn.index(A) + len(A):turn.index(W)]
    before_a = turn[len(head) + len(U):turn.index(A)]
    if before_a != user_close + header or not after.endswith(user_open):
        raise ValueError("the chat template renders an assistant turn differently from its "
                         "generation prompt; ChatEnv cannot cut it into pieces")
    return dict(head=head, user_close=user_close, header=header, user_open=user_open,
                after_turn=after[:len(after) - len(user_open)])


class ChatEnv(MultiAgentEnv):
    """A token task as chat episodes under a model's tokenizer and template.

    Args:
      inner: the token task (a [`TokenEnv`][jaxil.envs.tokens.TokenEnv]).
      tokenizer: the model's `tokenizers.Tokenizer`.
      render: `render(messages, add_generation_prompt) ->
        str`, the chat template (e.g.
        [`Checkpoint.render_chat`][jaxil.pretrained.load.Checkpoint.render_chat]).
      eot: the model's end-of-turn token id (it ends an assistant turn).
      constrained: legal masks from the command grammar's token automaton.
      turn_tokens: the most tokens of one turn, its end included (the last
        is forced to be `eot` when unconstrained); None for 16, or the
        grammar's longest command plus one when that is more.
      token_width: K, the tokens entering a context per step.
      system: the system message (None: `inner.chat_intro()`).

    Raises:
      ValueError: a bad argument, a template ChatEnv cannot cut into pieces
        or that does not end an assistant turn with `eot`, a tokenizer that
        uses token 0 in the chat's text, a turn limit below the longest
        command (one line each, naming the problem).
    """

    stochastic_step = False

    def __init__(self, inner: TokenEnv, tokenizer: Any, render: Callable[[list, bool], str],
                 eot: int, *, constrained: bool = False, turn_tokens: Optional[int] = None,
                 token_width: int = 16, system: Optional[str] = None):
        if not isinstance(inner, TokenEnv):
            raise ValueError(f"ChatEnv wraps a token task (a TokenEnv such as "
                             f"envs.make('tokens:repair')), got {type(inner).__name__}")
        if not isinstance(token_width, int) or token_width < 2:
            raise ValueError(f"token_width must be an int >= 2, got {token_width!r}")
        V = int(tokenizer.get_vocab_size())
        if not 0 < int(eot) < V:
            raise ValueError(f"eot={eot} is not a token id of the vocabulary of {V} (0 is "
                             "padding); pass the model's end-of-turn id")
        self.inner, self.tokenizer, self.constrained = inner, tokenizer, bool(constrained)
        self.eot_token = int(eot)
        #: The only token of an agent off turn (the lowest id that is neither
        #: padding nor the end of turn); echoed as `<pad>`.
        self.wait_token = 1 if self.eot_token != 1 else 2
        self.system = inner.chat_intro() if system is None else str(system)
        names = inner.vocab.names
        syntax = " | ".join(
            " ".join([c.name] + [f"<{_arg_label(inner, c, i)}>" for i in range(len(c.args))])
            for c in inner.commands)
        self.error_text = ERROR_TEXT.format(syntax=syntax)

        def enc(text: str) -> list[int]:
            return list(tokenizer.encode(text, add_special_tokens=False).ids)

        pieces = _pieces(render, self.system)
        self.pieces = pieces
        P = {k: enc(v) for k, v in pieces.items()}
        err = enc(self.error_text)
        # Each task word as it begins a message and as it follows a space.
        bare = [enc(w) if i else [] for i, w in enumerate(names)]
        spaced = [enc(" " + w) if i else [] for i, w in enumerate(names)]
        used = [t for v in P.values() for t in v] + err + [t for b in bare + spaced for t in b]
        if PAD in used:
            raise ValueError(f"token 0 ({tokenizer.id_to_token(0)!r}) appears in the chat's "
                             "text; ChatEnv pads with token 0, so it needs a tokenizer whose "
                             "id 0 is a special token the text never uses")
        Wm = max(1, max(len(b) for b in bare + spaced))
        self._bare = _table(bare, Wm)
        self._spaced = _table(spaced, Wm)
        self._head, self._user_close = np.asarray(P["head"], np.int32), P["user_close"]
        self._user_open, self._header = P["user_open"], P["header"]
        if not P["after_turn"] or P["after_turn"][0] != self.eot_token:
            raise ValueError(f"the chat template does not end an assistant turn with the "
                             f"end-of-turn token {eot} ({tokenizer.id_to_token(int(eot))!r}); "
                             "pass the eot the template uses")
        self._after_turn = P["after_turn"][1:]  # the model writes the end of turn itself
        self._error = np.asarray(P["user_open"] + err + P["user_close"], np.int32)
        n = inner.spec.num_agents
        A_in = inner.answer_width
        msg = len(P["user_open"]) + A_in * Wm + len(P["user_close"])
        #: The most tokens one step adds to an agent's context.
        self.max_addition = len(P["after_turn"]) + max(msg, len(self._error)) + len(P["header"])
        #: The tokens of the reset text (system, user prompt, header).
        self.reset_width = (len(P["head"]) + inner.prompt_len * Wm + len(P["user_close"])
                            + len(P["header"]))
        self.queue_width = self.reset_width + 2 * self.max_addition + token_width

        # The turn's text: each token's bytes; a turn's text is parsed into
        # the task's words (at most cmd_width of at most word_chars bytes).
        vb = token_bytes(tokenizer)
        self.word_chars = max(len(w) for w in names)
        C = inner.cmd_width
        self.max_chars = C * (self.word_chars + 1) + 8
        Lc = self.max_chars
        tb = np.zeros((V, Lc), np.uint8)
        tl = np.zeros((V,), np.int32)
        for i, b in enumerate(vb):
            b = bytes(b)
            tl[i] = len(b)
            tb[i, :min(len(b), Lc)] = np.frombuffer(b[:Lc], np.uint8)
        self._tok_chars, self._tok_len = tb, tl
        wt = np.zeros((len(names), self.word_chars), np.uint8)
        for i, w in enumerate(names):
            if i:  # <pad> never matches
                wt[i, :len(w)] = np.frombuffer(w.encode(), np.uint8)
        self._word_table = wt

        self.automaton = None
        longest = 0
        if self.constrained:
            self.automaton = token_automaton(command_regex(inner), vb, self.eot_token,
                                             exclude=(PAD, self.wait_token))
            longest = self.automaton.longest
        # The longest command as the experts write it (words in their own
        # tokens), and as the automaton lets any tokenization write it.
        spelled = max(len(bare[names.index(c.name)])
                      + sum(max(len(spaced[int(t)]) for t in ids) for ids in c.args)
                      for c in inner.commands)
        longest = max(longest, spelled)
        if turn_tokens is None:
            turn_tokens = max(16, longest + 1)
        if not isinstance(turn_tokens, int) or turn_tokens < 2:
            raise ValueError(f"turn_tokens must be an int >= 2, got {turn_tokens!r}")
        if turn_tokens < longest + 1:
            raise ValueError(f"turn_tokens={turn_tokens} cannot hold the longest command "
                             f"({longest} tokens and the end of turn); pass turn_tokens >= "
                             f"{longest + 1} or leave it out")
        self.turn_tokens = turn_tokens
        #: K: the token columns at the front of every observation row.
        self.token_width = token_width
        K = token_width
        stream = -(-self.max_addition // (K - 1))
        per_turn = turn_tokens + stream
        #: Upper bound on the tokens of one agent's context in one episode.
        self.max_context = self.reset_width + inner.max_turns * (turn_tokens + self.max_addition)
        self.cmd_width = C
        priv = self._priv_width()
        self.spec = EnvSpec(
            env_id=inner.spec.env_id + "+chat",
            num_agents=n,
            obs_dim=K + priv,
            state_dim=n * priv,
            action=DiscreteActions(num_actions=V),
            max_steps=-(-self.reset_width // K) + inner.max_turns * per_turn * n,
            has_win=True,
        )
        free = np.ones((V,), bool)
        free[[PAD, self.wait_token]] = False
        self._free = free

    @property
    def token_names(self) -> tuple[str, ...]:
        """The model's token strings, by id (the chat form's vocabulary)."""
        if getattr(self, "_token_names", None) is None:
            tok = self.tokenizer
            self._token_names = tuple(tok.id_to_token(i) or ""
                                      for i in range(self.spec.num_actions))
        return self._token_names

    # -- construction helpers -----------------------------------------------------
    @classmethod
    def from_model(cls, inner: TokenEnv, model: Any, **kwargs: Any) -> "ChatEnv":
        """The chat form of `inner` for a loaded model: a
        [`jaxil.lm.LM`][jaxil.lm.LM] or a
        [`Checkpoint`][jaxil.pretrained.load.Checkpoint] (its tokenizer,
        chat template and end-of-turn token).

        Raises:
          ValueError: the model has no tokenizer, no chat template or no
            end-of-turn / EOS token.
        """
        ckpt = getattr(model, "checkpoint", model)
        if ckpt.tokenizer is None:
            raise ValueError(f"{ckpt.path}: the model has no tokenizer (tokenizer.json); the "
                             "chat form renders text with it")
        if ckpt.chat_template is None:
            raise ValueError(f"{ckpt.path}: the model has no chat template; the chat form needs "
                             "an instruction-tuned model's (e.g. smollm2-135m-instruct)")
        eot = ckpt.special.end_of_turn_id
        eot = ckpt.special.eos_id if eot is None else eot
        if eot is None:
            raise ValueError(f"{ckpt.path}: the model has no end-of-turn or EOS token")
        return cls(inner, ckpt.tokenizer,
                   lambda messages, gen: ckpt.render_chat(messages, gen), int(eot), **kwargs)

    def _priv_width(self) -> int:
        i = self.inner
        return i.token_width + self.cmd_width + 1 + i.num_features + self.turn_tokens + 1

    # -- text <-> tokens inside jit ------------------------------------------------
    def words_to_tokens(self, words: jax.Array) -> jax.Array:
        """Task words `[M]` (ids of `inner.vocab`, `<pad>` skipped) →
        the model tokens of their text, words joined by single spaces,
        `[M * Wm]` left-aligned and `<pad>`-padded."""
        words = jnp.asarray(words, jnp.int32)
        real = words != PAD
        first = real & (jnp.cumsum(real) == 1)
        rows = jnp.where(first[:, None], jnp.asarray(self._bare)[words],
                         jnp.asarray(self._spaced)[words])
        return _compact(jnp.where(real[:, None], rows, PAD).reshape(-1))

    def parse(self, chars: jax.Array, nchars: jax.Array):
        """One turn's text → `(ok, cmd [C], cmd_len)`: whether it is exactly
        one command of the task (words separated by whitespace), and the
        command in the task's vocabulary."""
        Lc, Lw, C = self.max_chars, self.word_chars, self.cmd_width
        inner = self.inner
        idx = jnp.arange(Lc)
        c = chars.astype(jnp.int32)
        inside = idx < jnp.minimum(nchars, Lc)
        space = jnp.isin(c, jnp.asarray(_SPACES))
        letter = inside & ~space
        start = letter & ~jnp.concatenate([jnp.zeros((1,), bool), letter[:-1]])
        count = jnp.sum(start)
        wid = jnp.cumsum(start) - 1
        pos = idx - jax.lax.cummax(jnp.where(start, idx, 0))
        fits = letter & (pos < Lw) & (wid < C)
        words = jnp.zeros((C + 1, Lw + 1), jnp.int32).at[
            jnp.where(fits, wid, C), jnp.where(fits, pos, Lw)].set(c, mode="drop")[:C, :Lw]
        eq = jnp.all(words[:, None, :] == jnp.asarray(self._word_table, jnp.int32)[None], -1)
        found = eq.any(-1)
        ids = jnp.argmax(eq, -1).astype(jnp.int32)
        j = jnp.arange(C)
        used = j < count
        grammar = jnp.asarray(inner._grammar)
        head = ids[0]
        args_ok = jnp.where((j >= 1) & used, grammar[head, j, ids], True).all()
        ok = ((nchars <= Lc) & (count >= 1) & (count <= C) & ~jnp.any(letter & (pos >= Lw))
              & jnp.all(found | ~used) & jnp.asarray(inner._first)[head] & args_ok
              & grammar[head, jnp.clip(count, 0, C), inner.eot_token])
        return ok, jnp.where(used, ids, PAD), count.astype(jnp.int32)

    # -- the environment -----------------------------------------------------------
    def _on_turn(self, s: ChatState) -> jax.Array:
        return (s.qlen == 0) & self.inner._on_turn(s.task)

    def _avail(self, s: ChatState) -> jax.Array:
        V = self.spec.num_actions
        eot_only = jnp.arange(V) == self.eot_token
        if self.constrained:
            table = jnp.asarray(self.automaton.table)
            final = jnp.asarray(self.automaton.final)
            legal = (table[s.fsm] >= 0) | (final[s.fsm][:, None] & eot_only[None])
        else:
            legal = jnp.where((s.turn_len >= self.turn_tokens - 1)[:, None], eot_only[None],
                              jnp.asarray(self._free)[None])
        wait = (jnp.arange(V) == self.wait_token)[None]
        return jnp.where(self._on_turn(s)[:, None], legal, wait)

    def _append(self, queue: jax.Array, qlen: jax.Array, add: jax.Array):
        add = _compact(add)
        n_add = jnp.sum(add != PAD)
        queue = queue.at[qlen + jnp.arange(add.shape[0])].set(add, mode="drop")
        return queue, qlen + n_add

    def _deliver(self, queue: jax.Array, qlen: jax.Array, width: int):
        """`(the first width tokens, the rest)` of a queue."""
        take = jnp.minimum(qlen, width)
        head = jnp.where(jnp.arange(width) < take, queue[:width], PAD)
        Q = queue.shape[0]
        src = jnp.arange(Q) + take
        rest = jnp.where(src < qlen, queue[jnp.clip(src, 0, Q - 1)], PAD)
        return head, rest, qlen - take

    def _out(self, s: ChatState, tokens, inner_row, sent, sent_len, reward=0.0, done=False,
             truncated=False, won=False) -> Step:
        feats = self.inner._features(s.task).astype(jnp.int32)
        priv = jnp.concatenate([inner_row, sent, sent_len[:, None], feats, s.turn,
                                s.turn_len[:, None]], axis=1)
        obs = jnp.concatenate([tokens, priv], axis=1).astype(jnp.float32)
        return Step(s, obs, priv.reshape(-1).astype(jnp.float32), self._avail(s),
                    reward=reward, done=done, truncated=truncated, won=won)

    def _reset(self, key: jax.Array) -> Step:
        inner = self.inner
        n, K, Q = self.spec.num_agents, self.token_width, self.queue_width
        task, prompt = inner._generate(key)
        prompt = jnp.asarray(prompt, jnp.int32)
        on = inner._on_turn(task)
        body = jax.vmap(self.words_to_tokens)(prompt)
        close = jnp.asarray(self._user_close, jnp.int32)
        header = jnp.asarray(self._header, jnp.int32)
        rows = jnp.concatenate([jnp.broadcast_to(jnp.asarray(self._head), (n, len(self._head))),
                                body, jnp.broadcast_to(close, (n, close.shape[0])),
                                jnp.where(on[:, None], header[None], PAD)], axis=1)
        queue = jnp.zeros((n, Q), jnp.int32)
        qlen = jnp.zeros((n,), jnp.int32)
        queue, qlen = jax.vmap(self._append)(queue, qlen, rows)
        tokens, queue, qlen = jax.vmap(self._deliver, in_axes=(0, 0, None))(queue, qlen, K)
        C, T, Lc = self.cmd_width, self.turn_tokens, self.max_chars
        s = ChatState(task=task, chars=jnp.zeros((n, Lc), jnp.uint8),
                      nchars=jnp.zeros((n,), jnp.int32), turn=jnp.zeros((n, T), jnp.int32),
                      turn_len=jnp.zeros((n,), jnp.int32), fsm=jnp.zeros((n,), jnp.int32),
                      queue=queue, qlen=qlen, opened=on, turns=jnp.int32(0), t=jnp.int32(0))
        inner_row = jnp.zeros((n, inner.token_width), jnp.int32).at[:, 0].set(inner.bos_token)
        inner_row = inner_row.at[:, 1:1 + inner.prompt_len].set(prompt)
        return self._out(s, tokens, inner_row, jnp.zeros((n, C), jnp.int32),
                         jnp.zeros((n,), jnp.int32))

    def _step(self, key: jax.Array, s: ChatState, actions: jax.Array) -> Step:
        inner = self.inner
        n, K, C, T, Lc = (self.spec.num_agents, self.token_width, self.cmd_width,
                          self.turn_tokens, self.max_chars)
        tok = actions.astype(jnp.int32)
        speak = self._on_turn(s)
        ended = speak & (tok == self.eot_token)
        grow = speak & ~ended
        # The turn's text and tokens so far.
        tl = jnp.asarray(self._tok_len)[tok]
        tc = jnp.asarray(self._tok_chars)[tok]  # [N, Lc]
        at = s.nchars[:, None] + jnp.arange(Lc)[None]
        rows = jnp.arange(n)[:, None]
        put = grow[:, None] & (jnp.arange(Lc)[None] < tl[:, None])
        chars = s.chars.at[rows, jnp.where(put, at, Lc)].set(tc, mode="drop")
        nchars = jnp.where(grow, jnp.minimum(s.nchars + tl, Lc + 1), s.nchars)
        turn = s.turn.at[jnp.arange(n), jnp.minimum(s.turn_len, T - 1)].set(
            jnp.where(grow, tok, s.turn[jnp.arange(n), jnp.minimum(s.turn_len, T - 1)]))
        turn_len = s.turn_len + grow.astype(jnp.int32)
        fsm = s.fsm
        if self.constrained:
            nxt = jnp.asarray(self.automaton.table)[s.fsm, tok]
            fsm = jnp.where(grow, jnp.maximum(nxt, 0), s.fsm)
        # Ended turns: parse, run the valid commands in the task.
        ok, cmd, cmd_len = jax.vmap(self.parse)(chars, nchars)
        ok = ok & ended
        out = inner._execute(s.task, cmd, cmd_len, ok)
        answer = jnp.where(ok.any(), jnp.asarray(out.answer, jnp.int32), PAD)
        heard = (answer != PAD).any(-1)
        err = ended & ~ok
        words = jax.vmap(self.words_to_tokens)(answer)
        msg = jnp.concatenate([jnp.broadcast_to(jnp.asarray(self._user_open, jnp.int32),
                                                (n, len(self._user_open))),
                               words,
                               jnp.broadcast_to(jnp.asarray(self._user_close, jnp.int32),
                                                (n, len(self._user_close)))], axis=1)
        width = max(msg.shape[1], self._error.shape[0])
        msg = jnp.pad(msg, ((0, 0), (0, width - msg.shape[1])))
        error = jnp.pad(jnp.asarray(self._error), (0, width - self._error.shape[0]))
        msg = jnp.where(err[:, None], error[None], jnp.where(heard[:, None], msg, PAD))
        done = jnp.asarray(out.done, jnp.bool_) & ok.any()
        on_next = inner._on_turn(out.task) & ~done  # no header after the last answer
        opened = s.opened & ~ended
        header = on_next & ~opened
        after = jnp.asarray(self._after_turn, jnp.int32)
        add = jnp.concatenate([
            jnp.where(ended[:, None], after[None], PAD), msg,
            jnp.where(header[:, None], jnp.asarray(self._header, jnp.int32)[None], PAD)], axis=1)
        queue, qlen = jax.vmap(self._append)(s.queue, s.qlen, add)
        head, queue, qlen = jax.vmap(self._deliver, in_axes=(0, 0, None))(queue, qlen, K - 1)
        echo = jnp.where(speak, tok, PAD)
        tokens = jnp.concatenate([echo[:, None], head], axis=1)
        won = done & jnp.asarray(out.won, jnp.bool_)
        reward = jnp.where(done, won.astype(jnp.float32)
                           + inner.score_weight * jnp.asarray(out.score, jnp.float32), 0.0)
        turns = s.turns + ended.sum(dtype=jnp.int32)
        state = ChatState(
            task=out.task,
            chars=jnp.where(ended[:, None], 0, chars).astype(jnp.uint8),
            nchars=jnp.where(ended, 0, nchars),
            turn=jnp.where(ended[:, None], 0, turn), turn_len=jnp.where(ended, 0, turn_len),
            fsm=jnp.where(ended, 0, fsm), queue=queue, qlen=qlen, opened=opened | header,
            turns=turns, t=s.t + 1)
        truncated = (turns >= inner.max_turns) | (state.t >= self.spec.max_steps)
        # What the token task's agents would have seen: the end of turn (or
        # <wait>) with the answer, where a command ran or an answer arrived.
        event = ok | heard
        inner_row = jnp.zeros((n, inner.token_width), jnp.int32)
        inner_row = inner_row.at[:, 0].set(jnp.where(ok, inner.eot_token, inner.wait_token))
        inner_row = inner_row.at[:, 1:1 + answer.shape[1]].set(answer)
        inner_row = jnp.where(event[:, None], inner_row, 0)
        sent = jnp.where(ok[:, None], cmd, 0)
        sent_len = jnp.where(ok, cmd_len, 0)
        return self._out(state, tokens, inner_row, sent, sent_len, reward, done, truncated, won)

    # -- reading observations --------------------------------------------------------
    def privileged(self, obs: jax.Array) -> dict[str, jax.Array]:
        """The chat experts' columns of `obs [..., O]` (int32): `inner_row`
        (the token task's view of this step's event), `sent` / `sent_len`
        (the command that ran), `features` (the task's hidden state),
        `turn` / `turn_len` (the agent's model tokens of its turn so far)."""
        i = self.inner
        p = jnp.asarray(obs)[..., self.token_width:].astype(jnp.int32)
        widths = dict(inner_row=i.token_width, sent=self.cmd_width, sent_len=1,
                      features=i.num_features, turn=self.turn_tokens, turn_len=1)
        out, at = {}, 0
        for k, w in widths.items():
            out[k] = p[..., at:at + w] if w > 1 or k == "features" else p[..., at]
            at += w
        return out


def _arg_label(env: TokenEnv, c: Any, i: int) -> str:
    """A word for argument `i` of command `c` in the syntax line."""
    names = env.vocab.names
    ids = c.args[i]
    words = [names[int(t)] for t in ids]
    if all(w.isdigit() for w in words):
        lo, hi = min(int(w) for w in words), max(int(w) for w in words)
        return f"{lo}-{hi}"
    return "|".join(words)


def _table(rows: Sequence[Sequence[int]], width: int) -> np.ndarray:
    out = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def chat_text(env: ChatEnv, obs: Any, agent: int = 0, length: Optional[int] = None) -> str:
    """One agent's whole chat of one episode as text: every token that
    entered its context (`obs [T+1, N, O]` of one episode, `length` its
    steps), decoded with the model's tokenizer, special tokens kept."""
    obs = np.asarray(obs)
    steps = obs.shape[0] - 1 if length is None else int(length)
    ids = np.round(obs[:steps + 1, agent, :env.token_width]).astype(np.int64).reshape(-1)
    return env.tokenizer.decode([int(i) for i in ids if i != PAD], skip_special_tokens=False)


def _agent_where(mask: jax.Array, a: Any, b: Any) -> Any:
    """`a` where `mask [N]`, else `b`, leaf by leaf (a leaf without a
    leading agent axis, such as a stateless policy's placeholder, takes
    `a` where any agent's mask is set)."""
    n = mask.shape[0]

    def pick(x, y):
        if x.ndim and x.shape[0] == n:
            return jnp.where(mask.reshape((n,) + (1,) * (x.ndim - 1)), x, y)
        return jnp.where(mask.any(), x, y)

    return jax.tree.map(pick, a, b)


class _ExpertCarry(struct.PyTreeNode):
    inner: Any  # the token task's expert's carry
    plan: jax.Array  # [N, turn_tokens] the model tokens of the planned turn (eot included)
    plan_len: jax.Array  # [N]


def chat_expert(env: ChatEnv, kind: str = "transcript") -> Policy:
    """The token task's expert, acting in the chat form.

    The task's registered expert (`kind`: `"transcript"`, acting on the
    agent's own context only, or `"scripted"`, which may read the hidden
    state; [`envs.token_tasks`][jaxil.envs.token_tasks]) chooses each command
    in the task's words; this policy writes it as text in the model's
    tokens (words joined by single spaces, then the end of turn).

    It keeps the task expert's carry in step with the chat: at every event
    (the reset, a command that ran, an answer that arrived) it feeds the
    expert what the token task's agent would have seen (its command's echoes,
    then the end of turn with the answer; for the transcript kind with the
    hidden columns zeroed, so it cannot read them), then plans the next
    command by asking the expert token by token. On turn, it plays the
    plan while the turn so far matches it; on a turn that has left the plan
    (a student's, when it labels), it ends the turn where that is legal,
    else plays the first legal token.
    """
    inner = env.inner
    pol, _, _ = token_expert(inner, kind)
    pol = as_policy(pol)
    K_in, C, F = inner.token_width, inner.cmd_width, inner.num_features
    T = env.turn_tokens
    n = inner.spec.num_agents
    hide = kind == "transcript"

    def inner_obs(row, cmd, cmd_len, feats):
        """[N, O_in] rows of the token task: `row [N, K_in]`, then the
        partial command and the features (zeros for the transcript kind)."""
        f = jnp.zeros_like(feats) if hide else feats
        c = jnp.zeros_like(cmd) if hide else cmd
        cl = jnp.zeros_like(cmd_len) if hide else cmd_len
        return jnp.concatenate([row, c, cl[:, None], f], axis=1).astype(jnp.float32)

    def feed(carry, obs_rows, mask, key):
        """Feed rows `[R, N, O_in]` where `mask [R, N]`; the last token chosen."""
        def one(c, xs):
            o, m, k = xs
            a, new = pol.act(None, o, jnp.ones((n, inner.spec.num_actions), bool), k, c)
            return _agent_where(m, new, c), a
        keys = jax.random.split(key, obs_rows.shape[0])
        carry, acts = jax.lax.scan(one, carry, (obs_rows, mask, keys))
        return carry, acts

    def echo_rows(sent, sent_len, feats):
        """The token task's echo rows of a command `sent [N, C]`: `[C, N, O_in]`."""
        rows = []
        for j in range(C):
            r = jnp.zeros((n, K_in), jnp.int32).at[:, 0].set(sent[:, j])
            part = jnp.where(jnp.arange(C)[None] <= j, sent, 0)
            rows.append(inner_obs(r, part, jnp.full((n,), j + 1, jnp.int32), feats))
        return jnp.stack(rows)

    def plan(carry, first, feats, key):
        """The expert's command from its first token `first [N]` on:
        `[N, C]` task words (then its end of turn)."""
        def one(c, k):
            cmd, length, going, tok, pc = c
            rows = jnp.arange(n)
            cmd = cmd.at[rows, jnp.minimum(length, C - 1)].set(
                jnp.where(going & (tok != inner.eot_token), tok,
                          cmd[rows, jnp.minimum(length, C - 1)]))
            going = going & (tok != inner.eot_token) & (length < C)
            length = length + going.astype(jnp.int32)
            r = jnp.zeros((n, K_in), jnp.int32).at[:, 0].set(tok)
            o = inner_obs(r, cmd, length, feats)
            nxt, pc = pol.act(None, o, jnp.ones((n, inner.spec.num_actions), bool), k, pc)
            return (cmd, length, going, jnp.where(going, nxt, inner.eot_token), pc), None
        init = (jnp.zeros((n, C), jnp.int32), jnp.zeros((n,), jnp.int32),
                jnp.ones((n,), bool), first, carry)
        (cmd, length, _, _, _), _ = jax.lax.scan(one, init, jax.random.split(key, C))
        return cmd, length

    def spell(cmd):
        toks = jax.vmap(env.words_to_tokens)(cmd)  # [N, C * Wm]
        width = max(T, toks.shape[1] + 1)
        toks = jnp.pad(toks, ((0, 0), (0, width - toks.shape[1])))
        at = jnp.sum(toks != PAD, axis=1)
        toks = toks.at[jnp.arange(n), at].set(env.eot_token, mode="drop")
        return toks[:, :T], jnp.minimum(at + 1, T)

    def init(key, num_agents):
        return _ExpertCarry(pol.init(key, num_agents), jnp.zeros((num_agents, T), jnp.int32),
                            jnp.zeros((num_agents,), jnp.int32))

    def act(params, obs, avail, key, carry):
        p = env.privileged(obs)
        k1, k2 = jax.random.split(key)
        row, feats = p["inner_row"], p["features"]
        fresh = row[:, 0] == inner.bos_token
        event = row[:, 0] != PAD
        nothing = jnp.zeros((n, C), jnp.int32)
        zero = jnp.zeros((n,), jnp.int32)
        # The command's echoes (where one ran), then the event row itself.
        echoes = echo_rows(p["sent"], p["sent_len"], feats)
        mask = (jnp.arange(C)[:, None] < p["sent_len"][None])
        rows = jnp.concatenate([echoes, inner_obs(row, nothing, zero, feats)[None]])
        mask = jnp.concatenate([mask, event[None]])
        start = init(k1, n).inner
        base = _agent_where(fresh, start, carry.inner)
        inner_carry, firsts = feed(base, rows, mask, k1)
        cmd, _ = plan(inner_carry, firsts[-1], feats, k2)
        toks, length = spell(cmd)
        planned = jnp.where(event[:, None], toks, carry.plan)
        plan_len = jnp.where(event, length, carry.plan_len)
        # Play the plan while the turn matches it.
        tl = p["turn_len"]
        match = jnp.all((planned == p["turn"]) | (jnp.arange(T)[None] >= tl[:, None]), axis=1)
        on_plan = match & (tl < plan_len)
        want = planned[jnp.arange(n), jnp.minimum(tl, T - 1)]
        eot_ok = avail[:, env.eot_token]
        fallback = jnp.where(eot_ok, env.eot_token, jnp.argmax(avail, axis=1))
        a = jnp.where(on_plan & avail[jnp.arange(n), want], want, fallback)
        return a.astype(jnp.int32), _ExpertCarry(inner_carry, planned, plan_len)

    return Policy(init=init, act=act)
