"""A token task's command grammar as text, and as a token automaton over a
model's vocabulary.

The chat form of a token task ([`envs.token_chat`][jaxil.envs.token_chat])
lets a pretrained model write its command as free text. With constrained
decoding on, the legal-token mask instead follows the task's command grammar:

- [`command_regex`][jaxil.envs.token_grammar.command_regex] writes the
  grammar as a regular expression over text: a command word, then its
  arguments separated by single spaces (`EDIT 3 7`), each argument one of
  the words the task's legal-token mask allows at that position;
- [`token_automaton`][jaxil.envs.token_grammar.token_automaton] has
  `outlines-core` compile it into a deterministic automaton over the
  model's token strings, and stores it densely: `table [S, V]` int32, the
  next state after each token (`-1`: illegal), and `final [S]`, the states
  where the command is complete (where the end-of-turn token is legal).

Inside a jitted rollout the legal mask of state `s` is `table[s] >= 0`
(plus the end-of-turn token where `final[s]`), and the next state is one
lookup, so masked sampling is unchanged.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple, Sequence

import numpy as np

__all__ = ["Automaton", "bytes_to_unicode", "command_regex", "command_texts", "token_automaton",
           "token_bytes"]


def _args_words(env: Any) -> list[tuple[str, list[list[str]], int]]:
    """`(name, words allowed at each argument position, fewest arguments)`
    of each command of a token task."""
    names = env.vocab.names
    out = []
    for c in env.commands:
        words = [[names[int(t)] for t in ids] for ids in c.args]
        need = len(c.args) if c.min_args is None else c.min_args
        out.append((c.name, words, need))
    return out


def command_regex(env: Any) -> str:
    """The task's commands as one regular expression over text.

    A command is its word, then each argument as ` word` (one space before
    it) with the words the legal-token mask allows at that position; a
    command with optional arguments (`min_args`, e.g. `SAY`) is one
    alternative per length. Nothing before or after: the grammar of one
    assistant turn. Longer forms and longer words come first in each
    alternation: `outlines-core` compiles alternations leftmost-first, so
    `(1|11)` would never write `11` (nor `(SAY 1|SAY 1 2)` the second).
    """
    alts = []
    for name, words, need in _args_words(env):
        groups = ["(" + "|".join(re.escape(w) for w in
                                 sorted(set(ws), key=lambda w: (-len(w), w))) + ")"
                  for ws in words]
        for k in range(len(words), need - 1, -1):  # the longest form first
            alts.append(re.escape(name) + "".join(" " + g for g in groups[:k]))
    return "(" + "|".join(alts) + ")"


def command_texts(env: Any, limit: int = 5000, seed: int = 0) -> list[str]:
    """Commands the grammar allows, as text: all of them when there are at
    most `limit`, else `limit` of them drawn at random (every word at
    every position still appears when `limit` allows: the draws cycle
    through each position's words)."""
    rng = np.random.default_rng(seed)
    texts: list[str] = []
    for name, words, need in _args_words(env):
        for k in range(need, len(words) + 1):
            count = int(np.prod([len(w) for w in words[:k]])) if k else 1
            if count <= limit:
                for idx in np.ndindex(*[len(w) for w in words[:k]]):
                    texts.append(" ".join([name] + [words[j][i] for j, i in enumerate(idx)]))
            else:
                for r in range(limit):
                    picks = [words[j][r] if r < len(words[j])
                             else words[j][int(rng.integers(len(words[j])))] for j in range(k)]
                    texts.append(" ".join([name] + picks))
    return texts


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map of byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _byte_level_inverse() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def token_bytes(tokenizer: Any) -> list[bytes]:
    """The bytes each token id of a `tokenizers.Tokenizer` stands for.

    Byte-level vocabularies (GPT-2, Llama 3, SmolLM2) map their printable
    stand-ins back to bytes; SentencePiece-style ones turn `▁` into a space
    and `<0xNN>` into byte `NN`. Added (special) tokens are their content.
    """
    spec = json.loads(tokenizer.to_str())
    decoder = spec.get("decoder") or {}
    kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", []) or []}
    byte_level = "ByteLevel" in kinds
    added = {int(t["id"]): t["content"] for t in spec.get("added_tokens", [])}
    inverse = _byte_level_inverse() if byte_level else {}
    out = []
    for i in range(tokenizer.get_vocab_size()):
        s = tokenizer.id_to_token(i)
        if s is None:
            out.append(b"")
        elif i in added:
            out.append(added[i].encode())
        elif byte_level:
            out.append(bytes(inverse[c] for c in s) if all(c in inverse for c in s) else s.encode())
        elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", s):
            out.append(bytes([int(s[3:5], 16)]))
        else:
            out.append(s.replace("\u2581", " ").encode())
    return out


class Automaton(NamedTuple):
    """A grammar compiled over a vocabulary (numpy; see the module docstring).

    Attributes:
      table: `[S, V]` int32, the state after each token from each state,
        `-1` where the token is illegal. State 0 is the initial state.
      final: `[S]` bool, the states where the text so far is a whole
        command (the end-of-turn token is legal there).
      longest: the most tokens any accepted command takes.
    """

    table: np.ndarray
    final: np.ndarray
    longest: int


def token_automaton(regex: str, vocab_bytes: Sequence[bytes], eot: int,
                    exclude: Sequence[int] = ()) -> Automaton:
    """Compile `regex` over a vocabulary with `outlines-core`.

    Args:
      regex: the language of one turn (e.g.
        [`command_regex`][jaxil.envs.token_grammar.command_regex]).
      vocab_bytes: the bytes of each token id (e.g.
        [`token_bytes`][jaxil.envs.token_grammar.token_bytes]).
      eot: the end-of-turn token: legal exactly at final states, never part
        of the table's transitions.
      exclude: token ids never legal in a command (padding, special tokens).

    Returns:
      The dense [`Automaton`][jaxil.envs.token_grammar.Automaton].

    Raises:
      ValueError: the language is empty over this vocabulary, or infinite
        (a command of unbounded length).
    """
    from outlines_core import Index, Vocabulary

    skip = set(int(i) for i in exclude) | {int(eot)}
    V = len(vocab_bytes)
    # outlines-core 0.2 drops a final state's transitions into non-final
    # states (after `SAY 9` it would refuse ` 27`), so the language gets a
    # terminator, NUL, written by an extra token id V: the final states are
    # those from which the terminator is legal, and none has other moves
    # to lose. Tokens holding a NUL byte never belong to a command.
    groups: dict[bytes, list[int]] = {}
    for i, b in enumerate(vocab_bytes):
        if i not in skip and b and b"\x00" not in bytes(b):
            groups.setdefault(bytes(b), []).append(i)
    groups[b"\x00"] = [V]
    index = Index(f"({regex})\\x00", Vocabulary(int(eot), groups))
    trans = index.get_transitions()
    start = index.get_initial_state()
    states = [start] + sorted(s for s in trans if s != start)
    dense = {s: k for k, s in enumerate(states)}
    table = np.full((len(states), V), -1, np.int32)
    final = np.zeros((len(states),), bool)
    for s, moves in trans.items():
        for tok, nxt in moves.items():
            if int(tok) == V:
                final[dense[s]] = True
            elif int(tok) != int(eot):
                table[dense[s], int(tok)] = dense[nxt]
    # Keep the states the model's tokens reach (not the one after the NUL).
    reach, todo = {0}, [0]
    while todo:
        for nxt in np.unique(table[todo.pop()]):
            if nxt >= 0 and int(nxt) not in reach:
                reach.add(int(nxt))
                todo.append(int(nxt))
    keep = np.asarray(sorted(reach))
    renum = np.full((len(states) + 1,), -1, np.int32)
    renum[keep] = np.arange(len(keep))
    table, final = renum[table[keep]], final[keep]  # renum[-1] is -1
    # The longest accepted path; a cycle means commands of unbounded length.
    depth = np.full((len(keep),), -1)
    onstack = np.zeros((len(keep),), bool)

    def longest(s: int) -> int:
        if depth[s] >= 0:
            return int(depth[s])
        if onstack[s]:
            raise ValueError(f"the grammar {regex!r} accepts commands of any length; a command "
                             "grammar must be finite")
        onstack[s] = True
        best = 0 if final[s] else -(10 ** 9)
        for nxt in np.unique(table[s][table[s] >= 0]):
            best = max(best, 1 + longest(int(nxt)))
        onstack[s] = False
        depth[s] = best
        return best

    most = longest(0)
    if most < 0 or not final.any():
        raise ValueError(f"no command of {regex!r} can be written with this vocabulary's tokens")
    return Automaton(table, final, int(most))
