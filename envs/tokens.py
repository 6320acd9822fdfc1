"""Multi-turn token environments: the shared vocabulary and machinery.

The `tokens:` family puts language-model agents (multi-turn tool use, as in
SWE-bench) in miniature, JAX-native and cheap on a CPU. A token environment is
an ordinary [`envs.core.MultiAgentEnv`][jaxil.envs.core.MultiAgentEnv]; the
tasks live one per module:

- `tokens:repair` ([`envs.token_repair`][jaxil.envs.token_repair]): find and
  fix the faults of a hidden list with `TEST` / `VIEW` / `EDIT` / `SUBMIT`
  commands;
- `tokens:arith` ([`envs.token_arith`][jaxil.envs.token_arith]): evaluate a
  chain of modular operations with a `CALC` calculator tool, then `SUBMIT` the
  result;
- `tokens:exchange` ([`envs.token_exchange`][jaxil.envs.token_exchange]): two
  agents each hold half of a list and must `SAY` what they know before one of
  them `SUBMIT` s the whole list.

The contract every task keeps (policies such as a decoder-only transformer
are written against it):

- **One step is one token per agent.** `spec.action` is
  `DiscreteActions(V)` over the task's vocabulary `env.vocab`
  (`V = len(env.vocab)`; the shipped tasks share `VOCAB`, a task may
  extend it with its own words). Token 0 (`<pad>`)
  is never legal.
- **The legal-token mask** `avail_actions [N, V]` is a grammar over
  commands: at the start of a turn only the task's command tokens are legal,
  after a command only its argument tokens (e.g. a location after `EDIT`),
  and `<eot>` exactly where the command is complete. Malformed commands
  cannot be typed. An agent that is not on turn (`tokens:exchange`) may
  only emit `<wait>`.
- **Observation** `obs [N, O]` float32. The FIRST `K = env.token_width`
  columns are the token ids (as floats) that ENTER THE AGENT'S CONTEXT at
  this step, left-aligned and right-padded with `<pad>` (0): at reset
  `<bos>` and the task prompt; at every later step the agent's own previous
  token (echoed, `<wait>` included), followed, when that token ended a
  turn, by the environment's answer (tool output). A policy that appends
  every non-`<pad>` token of `obs[:, :K]` to its context (a transformer's
  KV cache) sees the whole history; `env.max_context` bounds their number
  in one episode (the KV-cache length).
- **PRIVILEGED COLUMNS.** `obs[:, K:]` are features for the scripted experts
  only: the agent's partial command (`cmd_width` tokens, then its length)
  followed by the task's hidden state (the true list, the chain of intermediate
  results, the other agent's half...). **Students must ignore them** (slice
  `obs[:, :env.token_width]`); they reveal the answer.
  [`TokenEnv.privileged`][jaxil.envs.tokens.TokenEnv.privileged] splits them.
  `global_state` is the privileged columns of all agents, flattened.
- **Turns.** `env.eot_token` (`<eot>`) ends an agent's turn; the
  environment answers after it. An episode ends (`done`) on `SUBMIT`,
  or is truncated after `max_turns` turns (all agents together);
  `spec.max_steps` (the token limit) is `max_turns` times the longest
  command, so the turn limit always comes first.
- **Reward.** 0 on every step but the last; at `SUBMIT` the verifier plus a
  graded term: `reward = won + score_weight * score` with `won` the
  verifier (`TimeStep.won`) and `score` in `[0, 1]` the task's partial
  credit (fraction of tests passing, of chain steps computed, of list entries
  right). A truncated episode returns 0. `spec.has_win` is True.
- **Instances** are drawn from the reset key (an unbounded, fixed-seed
  instance set); difficulty knobs are constructor keywords
  (`envs.make("tokens:repair", faults=5)`).

[`transcript`][jaxil.envs.tokens.transcript] renders an episode as text with
[`Vocab.decode`][jaxil.envs.tokens.Vocab.decode].
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .core import DiscreteActions, EnvSpec, MultiAgentEnv, Step
from .token_tasks import register_token_task

#: Number tokens `"0"` … `"31"`: every numeric value a task uses.
MAX_NUMBER = 32


#: The special tokens every token vocabulary holds; `<pad>` is id 0.
SPECIALS = ("<pad>", "<bos>", "<eot>", "<wait>")


class Vocab:
    """The token names of a token task (`names[i]` is token `i`).

    The three shipped tasks share [VOCAB][jaxil.envs.tokens.VOCAB]; a task
    that needs other words sets `vocab = VOCAB.extend([...])` on its
    [TokenEnv][jaxil.envs.tokens.TokenEnv] subclass (the shipped ids stay
    where they are, so [number][jaxil.envs.tokens.number] and the specials
    keep their meaning). The vocabulary is per task: extending it never
    changes another task's.
    """

    def __init__(self, names: Sequence[str]):
        self.names = tuple(names)
        bad = [n for n in self.names if not isinstance(n, str) or not n or n != n.strip()
               or len(n.split()) != 1]
        if bad:
            raise ValueError(f"token names must be non-empty words without spaces, got {bad}")
        dup = sorted({n for n in self.names if self.names.count(n) > 1})
        if dup:
            raise ValueError(f"token names must be unique; repeated: {dup}")
        self._ids = {n: i for i, n in enumerate(self.names)}

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self._ids

    def __getitem__(self, name: str) -> int:
        """The id of token `name` (`VOCAB["EDIT"]`)."""
        try:
            return self._ids[name]
        except KeyError:
            raise KeyError(
                f"no token {name!r} in this vocabulary of {len(self)} tokens; a task brings its "
                "own words with `vocab = VOCAB.extend([...])` on its TokenEnv subclass") from None

    def extend(self, words: Sequence[str]) -> "Vocab":
        """A new vocabulary: these names, then `words` (ids `len(self)`,
        `len(self) + 1`, ...). This one is left as it is.

        Raises:
          ValueError: a word is already a token, repeated, empty or has spaces.
        """
        if isinstance(words, str):
            raise ValueError(f"extend takes a list of words, got the string {words!r}")
        words = tuple(words)
        clash = [w for w in words if w in self._ids]
        if clash:
            raise ValueError(f"{clash} are already tokens of this vocabulary; extend it with new "
                             "words only")
        return Vocab(self.names + words)

    def encode(self, text: str) -> np.ndarray:
        """Whitespace-separated token names → int32 ids (`"EDIT 3 7 <eot>"`)."""
        return np.asarray([self[w] for w in text.split()], np.int32)

    def decode(self, ids: Any, skip_pad: bool = True) -> str:
        """Token ids (any int or float array) → their names joined by spaces;
        `<pad>` is left out unless `skip_pad=False`."""
        flat = np.asarray(ids).reshape(-1).astype(np.int64)
        return " ".join(self.names[i] for i in flat if not (skip_pad and i == 0))


VOCAB = Vocab(
    SPECIALS
    + ("repair", "arith", "exchange")  # task names (first prompt token)
    + ("TEST", "VIEW", "EDIT", "SUBMIT", "CALC", "SAY")  # commands
    + ("OK", "PASS", "FAIL", "WANT", "GOT", "=", "HEAR")  # answer words
    + ("+", "-", "*")  # calculator operators
    + ("A", "B")  # roles in tokens:exchange
    + tuple(str(v) for v in range(MAX_NUMBER))  # numbers
)
"""The words of the three shipped token tasks: the specials, the task names,
their commands and answer words, the calculator's operators, the roles of
`tokens:exchange` and the numbers `0 … MAX_NUMBER-1`."""
PAD, BOS, EOT, WAIT = (VOCAB[n] for n in ("<pad>", "<bos>", "<eot>", "<wait>"))
NUM0 = VOCAB["0"]  # the token of number v is NUM0 + v
OP0 = VOCAB["+"]  # the operators +, -, * are OP0 + 0, 1, 2


def number(v: Any) -> Any:
    """The token id of number `v` (an int or an int array)."""
    return NUM0 + v


def numbers(lo: int, hi: int) -> tuple[int, ...]:
    """The token ids of the numbers `lo … hi - 1`."""
    if not 0 <= lo < hi <= MAX_NUMBER:
        raise ValueError(f"numbers run from 0 to {MAX_NUMBER - 1}; got [{lo}, {hi})")
    return tuple(range(NUM0 + lo, NUM0 + hi))


def value_of(token: jax.Array) -> jax.Array:
    """The number a token stands for (meaningful only for number tokens)."""
    return token - NUM0


def random_ints(key: jax.Array, shape: tuple[int, ...], high: int) -> jax.Array:
    """Uniform int32 draws in `0 … high-1` from ONE call of the key's bit
    generator (each call is a sizeable piece of every program that resets,
    so a task draws all its randomness at once and slices it). The modulo
    bias is below `high / 2**32`."""
    return (jax.random.bits(key, shape, jnp.uint32) % jnp.uint32(high)).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Command:
    """One command of a task's grammar: `name arg_1 … arg_k <eot>`.

    Attributes:
      name: the command token's name (`"EDIT"`).
      args: the legal token ids at each argument position.
      min_args: arguments needed before `<eot>` is legal (None: all of them;
        fewer make the tail optional, as in `SAY`).
      answer: the most tokens the environment answers any agent with after it.
    """

    name: str
    args: tuple[tuple[int, ...], ...] = ()
    min_args: int | None = None
    answer: int = 0


@struct.dataclass
class TokenState:
    """The inner state of every token environment.

    Attributes:
      task: the task's own hidden state (a pytree of small arrays).
      cmd: [N, cmd_width] int32 the tokens of each agent's current turn so
        far (the command first), 0 past `cmd_len`.
      cmd_len: [N] int32 tokens in `cmd`.
      turns: [] int32 turns ended so far (all agents together).
      t: [] int32 steps (tokens per agent) so far.
    """

    task: Any
    cmd: jax.Array
    cmd_len: jax.Array
    turns: jax.Array
    t: jax.Array


class Outcome(NamedTuple):
    """What a task's `_execute` returns for one step.

    `answer [N, answer_width]` int32: the tokens each agent receives
    (`<pad>`-padded; ignored on steps where no turn ended).
    """

    task: Any
    answer: jax.Array
    done: Any = False
    won: Any = False
    score: Any = 0.0


class Privileged(NamedTuple):
    """The expert-only columns of `obs`, as int32 (see
    [`TokenEnv.privileged`][jaxil.envs.tokens.TokenEnv.privileged])."""

    cmd: jax.Array  # [..., cmd_width] the current turn's tokens
    cmd_len: jax.Array  # [...]
    features: jax.Array  # [..., num_features] the task's hidden state


class TokenEnv(MultiAgentEnv):
    """Base class of the token tasks: grammar, echo, answers, turns, rewards.

    A task subclasses it, calls `super().__init__` with its commands, and
    implements:

    - `_generate(key) -> (task, prompt [N, prompt_len] int32)`: a fresh
      instance; the prompt follows `<bos>`.
    - `_execute(task, cmd, cmd_len, ended) -> Outcome`: runs the commands
      of the agents whose turn ends this step (`ended [N]`: they emitted
      `<eot>`; `cmd`/`cmd_len` hold their complete commands) and
      returns the answers.
    - `_features(task) -> [N, num_features]` int32: the privileged columns.
    - optionally `_on_turn(task) -> [N]` bool (default: every agent is
      always on turn); an agent off turn may only emit `<wait>`.
    """

    stochastic_step = False  # instances come from the reset key; steps are deterministic
    #: The task's words (a subclass sets its own, e.g. `VOCAB.extend([...])`).
    vocab: Vocab = VOCAB

    def __init__(self, env_id: str, num_agents: int, prompt_len: int,
                 commands: Sequence[Command], num_features: int, max_turns: int,
                 score_weight: float):
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be a positive int, got {max_turns!r}")
        if not score_weight >= 0:
            raise ValueError(f"score_weight must be >= 0, got {score_weight!r}")
        vocab = self.vocab
        if not isinstance(vocab, Vocab):
            raise ValueError(f"{env_id}: vocab must be a Vocab (e.g. VOCAB.extend([...])), got "
                             f"{type(vocab).__name__}")
        if vocab.names[:len(SPECIALS)] != SPECIALS:
            raise ValueError(f"{env_id}: a token vocabulary starts with {list(SPECIALS)}; "
                             "build it with VOCAB.extend([...])")
        V = len(vocab)
        for c in commands:
            if c.name not in vocab:
                raise ValueError(
                    f"{env_id}: command {c.name!r} is not a word of the task's vocabulary; add "
                    f"it with `vocab = VOCAB.extend([{c.name!r}, ...])` on the TokenEnv subclass")
            for i, ids in enumerate(c.args):
                out = [t for t in ids if not 0 < int(t) < V]
                if not ids or out:
                    raise ValueError(
                        f"{env_id}: argument {i + 1} of {c.name} allows token ids {list(ids)}; "
                        f"each position needs at least one id in 1 … {V - 1} (vocab[word])")
        #: The id of `<bos>`, which opens every prompt.
        self.bos_token = vocab["<bos>"]
        #: The id of `<eot>`, which ends a turn.
        self.eot_token = vocab["<eot>"]
        #: The id of `<wait>`, the only token of an agent off turn.
        self.wait_token = vocab["<wait>"]
        self.commands = tuple(commands)
        self.prompt_len = int(prompt_len)
        self.max_turns = max_turns
        self.score_weight = float(score_weight)
        self.num_features = int(num_features)
        #: Tokens of the longest command without its `<eot>`.
        self.cmd_width = max(1 + len(c.args) for c in self.commands)
        #: The longest answer (tool output) the environment gives.
        self.answer_width = max(1, max(c.answer for c in self.commands))
        #: K: the token columns at the front of every observation row.
        self.token_width = max(1 + self.prompt_len, 1 + self.answer_width)
        # A turn is a command, its arguments and <eot> (echoed one per step)
        # plus the answer; every agent gets at most that many tokens per turn
        # (the listener of tokens:exchange gets <wait> echoes instead).
        per_turn = max(len(c.args) + 2 + c.answer for c in self.commands)
        #: Upper bound on the non-`<pad>` tokens of `obs[:, :K]` in one
        #: episode, per agent: the KV-cache length a student needs.
        self.max_context = 1 + self.prompt_len + max_turns * per_turn
        priv = self.cmd_width + 1 + self.num_features
        self.spec = EnvSpec(
            env_id=env_id,
            num_agents=num_agents,
            obs_dim=self.token_width + priv,
            state_dim=num_agents * priv,
            action=DiscreteActions(num_actions=V),
            max_steps=max_turns * (self.cmd_width + 1),
            has_win=True,
        )
        C = self.cmd_width
        first = np.zeros((V,), bool)
        grammar = np.zeros((V, C + 1, V), bool)  # [command, tokens so far, next]
        for c in self.commands:
            tok = vocab[c.name]
            first[tok] = True
            need = len(c.args) if c.min_args is None else c.min_args
            for given in range(len(c.args) + 1):
                if given < len(c.args):
                    grammar[tok, 1 + given, list(c.args[given])] = True
                if given >= need:
                    grammar[tok, 1 + given, self.eot_token] = True
        assert not first[PAD] and not grammar[..., PAD].any()
        self._first, self._grammar = first, grammar

    # -- to implement -----------------------------------------------------------
    def _generate(self, key: jax.Array) -> tuple[Any, jax.Array]:
        raise NotImplementedError  # pragma: no cover - abstract

    def _execute(self, task: Any, cmd: jax.Array, cmd_len: jax.Array,
                 ended: jax.Array) -> Outcome:
        raise NotImplementedError  # pragma: no cover - abstract

    def _features(self, task: Any) -> jax.Array:
        raise NotImplementedError  # pragma: no cover - abstract

    def _on_turn(self, task: Any) -> jax.Array:
        return jnp.ones((self.spec.num_agents,), jnp.bool_)

    def chat_intro(self) -> str:
        """The system message of the task's chat form
        ([`envs.token_chat`][jaxil.envs.token_chat]): what the task is and
        its command syntax. A task overrides it with its own description;
        this default lists the commands."""
        lines = [f"You act in the task {self.spec.env_id}. Each of your turns is exactly one "
                 "command, its words separated by single spaces. The commands:"]
        names = self.vocab.names
        for c in self.commands:
            args = " ".join("<" + "|".join(names[int(t)] for t in ids[:4])
                            + ("|..." if len(ids) > 4 else "") + ">" for ids in c.args)
            lines.append(f"{c.name} {args}".rstrip())
        return "\n".join(lines)

    # -- the machinery ----------------------------------------------------------
    def privileged(self, obs: jax.Array) -> Privileged:
        """Split the expert-only columns of `obs [..., O]` (int32)."""
        K, C = self.token_width, self.cmd_width
        p = jnp.asarray(obs)[..., K:].astype(jnp.int32)
        return Privileged(p[..., :C], p[..., C], p[..., C + 1:])

    def _avail(self, s: TokenState) -> jax.Array:
        grammar, first = jnp.asarray(self._grammar), jnp.asarray(self._first)
        mid = grammar[s.cmd[:, 0], jnp.clip(s.cmd_len, 0, self.cmd_width)]  # [N, V]
        legal = jnp.where((s.cmd_len == 0)[:, None], first[None], mid)
        wait = (jnp.arange(self.spec.num_actions) == self.wait_token)[None]
        return jnp.where(self._on_turn(s.task)[:, None], legal, wait)

    def _out(self, s: TokenState, tokens: jax.Array, reward=0.0, done=False,
             truncated=False, won=False) -> Step:
        priv = jnp.concatenate(
            [s.cmd, s.cmd_len[:, None], self._features(s.task).astype(jnp.int32)], axis=1)
        obs = jnp.concatenate([tokens, priv], axis=1).astype(jnp.float32)
        return Step(s, obs, priv.reshape(-1).astype(jnp.float32), self._avail(s),
                    reward=reward, done=done, truncated=truncated, won=won)

    def _reset(self, key: jax.Array) -> Step:
        n, K = self.spec.num_agents, self.token_width
        task, prompt = self._generate(key)
        tokens = jnp.zeros((n, K), jnp.int32).at[:, 0].set(self.bos_token)
        tokens = tokens.at[:, 1:1 + self.prompt_len].set(jnp.asarray(prompt, jnp.int32))
        s = TokenState(task=task, cmd=jnp.zeros((n, self.cmd_width), jnp.int32),
                       cmd_len=jnp.zeros((n,), jnp.int32), turns=jnp.int32(0), t=jnp.int32(0))
        return self._out(s, tokens)

    def _step(self, key: jax.Array, s: TokenState, actions: jax.Array) -> Step:
        n, K, C = self.spec.num_agents, self.token_width, self.cmd_width
        tok = actions.astype(jnp.int32)
        ended = tok == self.eot_token
        grow = ~ended & (tok != self.wait_token)
        rows = jnp.arange(n)
        at = jnp.minimum(s.cmd_len, C - 1)
        cmd = s.cmd.at[rows, at].set(jnp.where(grow, tok, s.cmd[rows, at]))
        cmd_len = s.cmd_len + grow.astype(jnp.int32)
        out = self._execute(s.task, cmd, cmd_len, ended)
        answer = jnp.where(ended.any(), jnp.asarray(out.answer, jnp.int32), PAD)
        state = TokenState(
            task=out.task,
            cmd=jnp.where(ended[:, None], 0, cmd),
            cmd_len=jnp.where(ended, 0, cmd_len),
            turns=s.turns + ended.sum(dtype=jnp.int32),
            t=s.t + 1,
        )
        tokens = jnp.zeros((n, K), jnp.int32).at[:, 0].set(tok)
        tokens = tokens.at[:, 1:1 + answer.shape[1]].set(answer)
        done = jnp.asarray(out.done, jnp.bool_)
        won = done & jnp.asarray(out.won, jnp.bool_)
        reward = jnp.where(done, won.astype(jnp.float32)
                           + self.score_weight * jnp.asarray(out.score, jnp.float32), 0.0)
        truncated = (state.turns >= self.max_turns) | (state.t >= self.spec.max_steps)
        return self._out(state, tokens, reward, done, truncated, won)


class TokenSpecials(NamedTuple):
    """The special token ids a learner reads from a token environment."""

    eot: int  # ends an agent's turn
    wait: int  # the only legal token of an agent off turn


def token_specials(env: Any) -> TokenSpecials:
    """`env.eot_token` and `env.wait_token`, checked.

    Every [TokenEnv][jaxil.envs.tokens.TokenEnv] has them; a token
    environment written without the base class must set both (distinct
    ints, legal action ids other than 0), or turns would be miscounted.

    Raises:
      ValueError: one is missing or out of range (one line, naming it).
    """
    spec = env.spec
    V = spec.num_actions if spec.discrete else 0
    ids = {}
    for name in ("eot_token", "wait_token"):
        v = getattr(env, name, None)
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) \
                or not 0 < int(v) < V:
            raise ValueError(
                f"{spec.env_id} has no valid `{name}` (got {v!r}); a token environment sets "
                f"`eot_token` and `wait_token` to token ids in 1 … {V - 1} "
                "(TokenEnv does this from its vocabulary)")
        ids[name] = int(v)
    if ids["eot_token"] == ids["wait_token"]:
        raise ValueError(f"{spec.env_id}: eot_token and wait_token are both {ids['eot_token']}; "
                         "they must be different tokens")
    return TokenSpecials(eot=ids["eot_token"], wait=ids["wait_token"])


def transcript(env: TokenEnv, obs: Any, agent: int = 0, length: int | None = None,
               show_wait: bool = False) -> str:
    """One agent's view of one episode as text, a line per turn.

    `obs [T+1, N, O]` are the observations of one episode (e.g.
    `envs.run_episodes(...).obs[i]`); `length` (default: all) the steps
    it took. The agent's own tokens (the echoes) are prefixed `>`, the
    environment's answers `<`; `<wait>` echoes are left out unless
    `show_wait`.
    """
    obs = np.asarray(obs)
    K = env.token_width
    steps = obs.shape[0] - 1 if length is None else int(length)
    decode = env.vocab.decode
    lines = [decode(obs[0, agent, :K])]
    mine: list[int] = []
    for t in range(1, steps + 1):
        row = obs[t, agent, :K].astype(np.int64)
        echo, answer = int(row[0]), row[1:]
        if echo != env.wait_token or show_wait:
            mine.append(echo)
        if (answer != PAD).any() or echo == env.eot_token:
            if mine:
                lines.append("> " + decode(mine))
                mine = []
            if (answer != PAD).any():
                lines.append("< " + decode(answer))
    if mine:
        lines.append("> " + decode(mine))
    return "\n".join(lines)


def _lazy(module: str, name: str):
    """A factory (of an environment or an expert) that imports the task's
    module when first called."""

    def make(*args, **kwargs) -> Any:
        return getattr(importlib.import_module(module, __package__), name)(*args, **kwargs)

    return make


# The family's ids and their experts; each task lives in its own module.
register_token_task(
    "tokens:repair", _lazy(".token_repair", "RepairEnv"),
    expert=_lazy(".token_repair", "repair_expert"), source="repair-test-edit",
    description="TEST, EDIT the reported location with the wanted value, repeat; SUBMIT after "
                "PASS (envs.token_repair.repair_expert)",
    transcript_expert=_lazy(".token_repair", "repair_transcript_expert"),
    transcript_source="repair-transcript",
    transcript_description="the same procedure with every choice read from the transcript; a "
                           "partial command completed from what the answers showed "
                           "(envs.token_repair.repair_transcript_expert)")
register_token_task(
    "tokens:arith", _lazy(".token_arith", "ArithEnv"),
    expert=_lazy(".token_arith", "arith_expert"), source="arith-calc-chain",
    description="one CALC per chain step in order, copying the last result; SUBMIT the final "
                "value (envs.token_arith.arith_expert)",
    transcript_expert=_lazy(".token_arith", "arith_transcript_expert"),
    transcript_source="arith-transcript",
    transcript_description="one CALC per chain step in order, copying the last value the "
                           "calculator showed; SUBMIT it "
                           "(envs.token_arith.arith_transcript_expert)")
register_token_task(
    "tokens:exchange", _lazy(".token_exchange", "ExchangeEnv"),
    expert=_lazy(".token_exchange", "exchange_expert"), source="exchange-say-submit",
    description="on turn: SAY the own half, or SUBMIT both halves once the other's was heard "
                "correctly (envs.token_exchange.exchange_expert)",
    transcript_expert=_lazy(".token_exchange", "exchange_transcript_expert"),
    transcript_source="exchange-transcript",
    transcript_description="on turn: SAY the own half until the same half was heard twice, "
                           "then SUBMIT both (envs.token_exchange.exchange_transcript_expert)")
