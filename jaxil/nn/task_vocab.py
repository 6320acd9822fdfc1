"""A pretrained language model speaking a token task's vocabulary.

The token tasks ([`jaxil.envs.tokens`][jaxil.envs.tokens]) act in a private
vocabulary of a few dozen words (`<bos>`, `TEST`, `EDIT`, `=`, `0` … `31`).
A pretrained model reads and writes them through its own embeddings: each
task token is spelled as text and mapped onto the model's tokenizer, and the
decoder for the task is the pretrained configuration with `vocab_size` the
task's `V`, whose `token_embed` rows (and head columns, when the head is
untied) are gathered from the pretrained table at the mapped ids
([`task_decoder`][jaxil.nn.task_vocab.task_decoder]).

- **Exact tokens.** A task token whose spelling is one model token takes
  that token's row. With a tied head the task decoder's logit of such a token
  is exactly the model's logit of its id, so the masked categorical over the
  legal tokens is the model's own distribution restricted to them. Spellings
  are tried in order, `" WORD"`, `"WORD"`, `" word"`, `"word"` (the
  brackets of `<wait>` dropped); `<bos>` and `<eot>` take the model's BOS
  and end-of-turn tokens.
- **Composed tokens.** A task token no spelling of which is one model token
  (SmolLM2 splits every number into digits, so `12` is `1`, `2`) takes the
  mean of its pieces' rows (the spelling with the fewest pieces), the usual
  initialisation of a new token; `compose=False` refuses them instead.
- **PAD** (task id 0) stays a skipped slot (`pad_id=0`), with a zero row.

Two task tokens mapped to the same model token (or composed of the same
pieces) are refused in one line, naming both. `token_width` and
`max_context` come from the environment, as for students trained from
scratch.

Export ([`export_table`][jaxil.nn.task_vocab.export_table],
[`export_model`][jaxil.nn.task_vocab.export_model]) scatters the rows of the
exact tokens back into the pretrained table and appends the composed ones
after the model's vocabulary (ids `V_model`, `V_model + 1`, …; see
[`TaskVocab.export_ids`][jaxil.nn.task_vocab.TaskVocab.export_ids]), so the
exported model gives the task decoder's logits on every task token:

```python
from jaxil import envs
from jaxil.nn.task_vocab import task_decoder

env = envs.make("tokens:arith", num_ops=1)
model = task_decoder("smollm2-135m-instruct", env)
model.vocab.describe()   # which tokens are exact, which composed
model.config.vocab_size, model.params   # 57, the gathered parameter tree
```
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from jaxil.nn.pretrained_params import config_from_arch, params_from_table, table_from_params
from jaxil.nn.transformer import PAD, TransformerConfig
from jaxil.pretrained.config import ArchConfig
from jaxil.pretrained.errors import CheckpointError
from jaxil.pretrained.hf import export_hf
from jaxil.pretrained.load import Checkpoint, load_checkpoint
from jaxil.pretrained.tokenizer import SpecialTokens

# Task tokens spelled by the model's own special tokens (SpecialTokens fields).
_BY_SPECIAL = {"<bos>": ("bos_id",), "<eot>": ("end_of_turn_id", "eos_id")}


@dataclasses.dataclass(frozen=True)
class TaskVocab:
    """How each token of a task's vocabulary sits in a model's vocabulary.

    Attributes:
      names: the task's token names (`names[i]` is task token `i`).
      texts: the spelling each token was mapped by (`""` for PAD; the
        special token's text for `<bos>` / `<eot>`).
      pieces: the model token ids of each spelling (one for an exact token,
        several for a composed one, none for PAD).
      model_vocab_size: the model's vocabulary size.
    """

    names: tuple[str, ...]
    texts: tuple[str, ...]
    pieces: tuple[tuple[int, ...], ...]
    model_vocab_size: int

    def __len__(self) -> int:
        return len(self.names)

    @property
    def composed(self) -> tuple[str, ...]:
        """The names of the tokens composed of several model tokens."""
        return tuple(n for n, p in zip(self.names, self.pieces) if len(p) > 1)

    @property
    def export_ids(self) -> np.ndarray:
        """`[V]` int64: each task token's id in the exported model (its model
        id when exact, `model_vocab_size + j` for the `j`-th composed token;
        -1 for PAD)."""
        out, j = [], 0
        for p in self.pieces:
            if len(p) == 1:
                out.append(p[0])
            elif p:
                out.append(self.model_vocab_size + j)
                j += 1
            else:
                out.append(-1)
        return np.asarray(out, np.int64)

    def gather(self, table: np.ndarray) -> np.ndarray:
        """`[V, ...]` rows of a model table `[V_model, ...]` for the task
        tokens: the mapped row, the mean of the pieces' rows (composed), zeros
        (PAD)."""
        table = np.asarray(table)
        rows = [table[list(p)].astype(np.float64).mean(0) if p
                else np.zeros(table.shape[1:], np.float64) for p in self.pieces]
        return np.stack(rows).astype(table.dtype)

    def scatter(self, table: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The model table `[V_model, ...]` with the task rows `[V, ...]`
        written back: exact tokens at their ids, composed ones appended in
        order (`[V_model + #composed, ...]`, matching
        [`export_ids`][jaxil.nn.task_vocab.TaskVocab.export_ids]); PAD's row
        is not written."""
        table, rows = np.asarray(table), np.asarray(rows)
        if rows.shape != (len(self),) + table.shape[1:]:
            raise ValueError(f"task rows have shape {list(rows.shape)}; the vocabulary of "
                             f"{len(self)} tokens over a table {list(table.shape)} needs "
                             f"{[len(self), *table.shape[1:]]}")
        ids = self.export_ids
        out = np.concatenate([table, np.zeros((len(self.composed),) + table.shape[1:],
                                              table.dtype)])
        keep = ids >= 0
        out[ids[keep]] = rows[keep].astype(table.dtype)
        return out

    @property
    def is_identity(self) -> bool:
        """Whether this is the model's own vocabulary (task token `i` is model
        token `i`, every one of them: a chat-form task's)."""
        return len(self.pieces) == self.model_vocab_size and all(
            p == (i,) for i, p in enumerate(self.pieces))

    def describe(self) -> str:
        """One line: how many tokens are exact and which are composed."""
        if self.is_identity:
            return f"the model's own vocabulary of {self.model_vocab_size} tokens"
        exact = sum(len(p) == 1 for p in self.pieces)
        comp = self.composed
        tail = f"; {len(comp)} composed of their pieces' mean: {' '.join(comp)}" if comp else ""
        return f"{exact} of {len(self) - 1} task tokens are one model token each{tail}"


def _spellings(name: str) -> list[str]:
    word = name[1:-1] if name.startswith("<") and name.endswith(">") and len(name) > 2 else name
    out: list[str] = []
    for s in (" " + word, word, " " + word.lower(), word.lower()):
        if s not in out:
            out.append(s)
    return out


def map_vocab(names: Sequence[str], tokenizer: Any, special: SpecialTokens,
              model_vocab_size: int, *, spellings: Optional[Mapping[str, str]] = None,
              compose: bool = True) -> TaskVocab:
    """Map a task's token names onto a model's tokenizer.

    Args:
      names: the task's token names, `<pad>` first (`env.vocab.names`).
      tokenizer: the model's `tokenizers.Tokenizer`.
      special: the model's special tokens (`<bos>` and `<eot>` take its
        BOS and end-of-turn ids when it has them).
      model_vocab_size: the model's vocabulary size (ids past it are refused).
      spellings: `{task token: text}` replacing the default spellings of
        those tokens (e.g. `{"<wait>": " pause"}`).
      compose: map a token that no spelling makes one model token to the
        mean of its pieces (False: refuse it).

    Returns:
      The [`TaskVocab`][jaxil.nn.task_vocab.TaskVocab].

    Raises:
      CheckpointError: one line: no tokenizer, a spelling of an unknown task
        token, a token that is not one model token (with `compose=False`) or
        that encodes to nothing, or two tokens mapped to the same model
        token(s).
    """
    names = tuple(names)
    if not names or names[0] != "<pad>":
        raise CheckpointError(f"a task vocabulary starts with <pad> (id {PAD}); got "
                              f"{names[:1]}")
    if tokenizer is None:
        raise CheckpointError("the model has no tokenizer to spell the task's tokens with; load "
                              "a GGUF file or an HF directory with tokenizer.json")
    spellings = dict(spellings or {})
    unknown = sorted(set(spellings) - set(names))
    if unknown:
        raise CheckpointError(f"spellings name {unknown[0]!r}, which is not a token of the task "
                              f"({len(names)} tokens: {' '.join(names[:8])} …)")
    texts, pieces, single_missing = [""], [()], []
    for name in names[1:]:
        ids = None
        if name not in spellings:
            for field in _BY_SPECIAL.get(name, ()):
                sid = getattr(special, field)
                if sid is not None:
                    ids, text = (int(sid),), tokenizer.id_to_token(int(sid)) or f"#{sid}"
                    break
        if ids is None:
            options = [spellings[name]] if name in spellings else _spellings(name)
            encoded = [(t, tuple(tokenizer.encode(t, add_special_tokens=False).ids))
                       for t in options]
            encoded = [(t, e) for t, e in encoded if e]
            if not encoded:
                raise CheckpointError(f"task token {name!r} spelled {options[0]!r} encodes to "
                                      "no model token; give it another spelling")
            text, ids = min(encoded, key=lambda te: len(te[1]))  # the first of the shortest
        if len(ids) > 1:
            single_missing.append(f"{name!r} ({text!r} is {len(ids)} tokens)")
        bad = [i for i in ids if not 0 <= i < model_vocab_size]
        if bad:
            raise CheckpointError(f"task token {name!r} maps to id {bad[0]}, outside the model's "
                                  f"{model_vocab_size} tokens")
        texts.append(text)
        pieces.append(ids)
    if single_missing and not compose:
        raise CheckpointError(f"{len(single_missing)} task tokens are not one model token: "
                              f"{', '.join(single_missing[:4])}"
                              f"{' …' if len(single_missing) > 4 else ''}; spell them otherwise "
                              "(spellings=...) or allow composed tokens (compose=True)")
    seen: dict[tuple[int, ...], int] = {}
    for i, p in enumerate(pieces[1:], 1):
        if p in seen:
            j = seen[p]
            raise CheckpointError(f"task tokens {names[j]!r} ({texts[j]!r}) and {names[i]!r} "
                                  f"({texts[i]!r}) map to the same model token{'s' * (len(p) > 1)} "
                                  f"{list(p)}; spell one of them otherwise (spellings=...)")
        seen[p] = i
    return TaskVocab(names, tuple(texts), tuple(pieces), int(model_vocab_size))


@dataclasses.dataclass(frozen=True)
class TaskModel:
    """A pretrained decoder in a task's vocabulary.

    Attributes:
      vocab: the vocabulary mapping.
      config: the task decoder's configuration (`vocab_size = len(vocab)`,
        `pad_id = 0`, the environment's `token_width` and `max_context`).
      params: its parameters (the pretrained tree with the gathered rows).
      checkpoint: the loaded checkpoint (its table is what export writes
        the task rows back into).
    """

    vocab: TaskVocab
    config: TransformerConfig
    params: Any
    checkpoint: Checkpoint

    @property
    def source(self) -> str:
        """The checkpoint's path."""
        return str(self.checkpoint.path)


def task_config(arch: ArchConfig, vocab: TaskVocab, token_width: int, max_context: int,
                compute_dtype: Optional[str] = None) -> TransformerConfig:
    """The decoder configuration of `arch` in a task's vocabulary (float32
    parameters; PAD, id 0, skipped)."""
    base = config_from_arch(arch, max_context=max_context, token_width=token_width,
                            compute_dtype=compute_dtype)
    return dataclasses.replace(base, vocab_size=len(vocab), pad_id=PAD)


def task_table(vocab: TaskVocab, table: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A canonical table with the vocabulary axes gathered for the task
    (`embed.embedding` rows, `lm_head.kernel` columns)."""
    out = dict(table)
    out["embed.embedding"] = vocab.gather(table["embed.embedding"])
    if "lm_head.kernel" in table:
        out["lm_head.kernel"] = vocab.gather(np.asarray(table["lm_head.kernel"]).T).T
    return out


def task_decoder(name_or_path: Any, env: Any, *, spellings: Optional[Mapping[str, str]] = None,
                 compose: bool = True, compute_dtype: Optional[str] = None) -> TaskModel:
    """A pretrained model as a decoder of a token environment's vocabulary.

    Args:
      name_or_path: a short name of a shipped model, a GGUF file, an HF
        directory, or a loaded [`Checkpoint`][jaxil.pretrained.load.Checkpoint].
      env: a token environment (`env.vocab`, `token_width`, `max_context`).
      spellings: as [`map_vocab`][jaxil.nn.task_vocab.map_vocab].
      compose: as [`map_vocab`][jaxil.nn.task_vocab.map_vocab].
      compute_dtype: the forward pass's dtype (None: float32).

    Returns:
      The [`TaskModel`][jaxil.nn.task_vocab.TaskModel] (float32 parameters).

    Raises:
      CheckpointError: one line: the loader's (unknown name, not a
        checkpoint, ...), a vocabulary that does not map, a context longer
        than learned positions cover.
    """
    ckpt = name_or_path if isinstance(name_or_path, Checkpoint) else load_checkpoint(name_or_path)
    vocab_names = getattr(getattr(env, "vocab", None), "names", None)
    if vocab_names is None or not hasattr(env, "token_width"):
        raise CheckpointError(f"{env.spec.env_id} is not a token environment with a vocabulary "
                              "(tokens:repair, tokens:arith, tokens:exchange, a TokenEnv task)")
    vocab = map_vocab(vocab_names, ckpt.tokenizer, ckpt.special, ckpt.arch.vocab_size,
                      spellings=spellings, compose=compose)
    config = task_config(ckpt.arch, vocab, env.token_width, env.max_context, compute_dtype)
    table = {k: np.asarray(v, np.float32) for k, v in ckpt.params.items()}
    params = params_from_table(config, task_table(vocab, table), str(ckpt.path))
    return TaskModel(vocab, config, params, ckpt)


def chat_model(model: Any, env: Any, *, compute_dtype: Optional[str] = None) -> TaskModel:
    """A pretrained model in its own vocabulary, as the decoder of a
    chat-form task ([`envs.token_chat.ChatEnv`][jaxil.envs.token_chat.ChatEnv]
    built for this model): the identity vocabulary, the environment's
    `token_width` and `max_context`, token 0 as padding (the chat form never
    writes it). Everything that takes a [`TaskModel`][jaxil.nn.task_vocab.TaskModel]
    (SFT, export) takes it.

    Args:
      model: a short name of a shipped model, a GGUF file, an HF directory, a
        loaded [`Checkpoint`][jaxil.pretrained.load.Checkpoint] or a
        [`jaxil.lm.LM`][jaxil.lm.LM] (its parameters are used as they are).
      env: the chat-form environment.
      compute_dtype: the forward pass's dtype (None: the parameters').

    Raises:
      CheckpointError: the loader's one-line errors, an environment that is
        not a chat form of this model's vocabulary, a context longer than
        learned positions cover.
    """
    ckpt = getattr(model, "checkpoint", model)
    if not isinstance(ckpt, Checkpoint):
        ckpt = load_checkpoint(ckpt)
    V = ckpt.arch.vocab_size
    if getattr(env, "tokenizer", None) is None or env.spec.num_actions != V:
        raise CheckpointError(f"{env.spec.env_id} is not a chat form of this model ({V} tokens "
                              f"against the environment's {env.spec.num_actions}); build it with "
                              "ChatEnv.from_model(task, model)")
    vocab = TaskVocab(tuple(env.token_names), tuple(env.token_names),
                      tuple((i,) for i in range(V)), V)
    config = task_config(ckpt.arch, vocab, env.token_width, env.max_context, compute_dtype)
    if hasattr(model, "params") and hasattr(model, "config") and not isinstance(model, Checkpoint):
        config = dataclasses.replace(config, param_dtype=model.config.param_dtype,
                                     dtype=compute_dtype or model.config.dtype)
        params = model.params
    else:
        table = {k: np.asarray(v, np.float32) for k, v in ckpt.params.items()}
        params = params_from_table(config, table, str(ckpt.path))
    return TaskModel(vocab, config, params, ckpt)


def export_table(model: TaskModel, params: Any) -> tuple[ArchConfig, dict[str, np.ndarray]]:
    """`(architecture, canonical table)` of the full model with the task
    decoder's `params` written back: every non-vocabulary parameter replaced,
    the task rows scattered into the pretrained embedding (and head) with
    composed tokens appended
    ([`TaskVocab.scatter`][jaxil.nn.task_vocab.TaskVocab.scatter]; the
    architecture's `vocab_size` grows by their number). A learned position
    table keeps only the task's `max_context` rows.

    Raises:
      CheckpointError: `params` is not the task decoder's tree.
    """
    table = table_from_params(model.config, params)
    base = model.checkpoint.params
    vocab = model.vocab
    table["embed.embedding"] = vocab.scatter(np.asarray(base["embed.embedding"], np.float32),
                                             table["embed.embedding"])
    if "lm_head.kernel" in table:
        table["lm_head.kernel"] = vocab.scatter(np.asarray(base["lm_head.kernel"], np.float32).T,
                                                table["lm_head.kernel"].T).T
    arch = dataclasses.replace(model.checkpoint.arch,
                               vocab_size=vocab.model_vocab_size + len(vocab.composed))
    if arch.positions == "learned":
        arch = dataclasses.replace(arch, max_positions=model.config.max_context)
    return arch, table


def export_model(directory: str | Path, model: TaskModel, params: Any,
                 dtype: Optional[str] = None) -> Path:
    """Write the fine-tuned model as an HF directory transformers loads
    ([`export_table`][jaxil.nn.task_vocab.export_table] then
    [`export_hf`][jaxil.pretrained.hf.export_hf], with the checkpoint's
    tokenizer, chat template and special tokens). In the exported model
    task token `i` is id `model.vocab.export_ids[i]`."""
    arch, table = export_table(model, params)
    ckpt = model.checkpoint
    return export_hf(Path(directory), arch, table, dtype=dtype, tokenizer=ckpt.tokenizer,
                     chat_template=ckpt.chat_template, special_tokens=ckpt.special)

