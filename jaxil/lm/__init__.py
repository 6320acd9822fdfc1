"""Pretrained language models in one call: [`load`][jaxil.lm.load].

`jaxil.lm.load` takes a short name of a model that ships as a Python package
(`smollm2-135m-instruct`; [`SHIPPED`][jaxil.pretrained.load.SHIPPED]), a
GGUF file or an HF directory, and returns an [`LM`][jaxil.lm.LM]: jaxil's
decoder ([`Transformer`][jaxil.nn.transformer.Transformer]) with its
configuration and parameters, and the checkpoint's tokenizer, special
tokens and chat template. The layers under it are
[`jaxil.pretrained`][jaxil.pretrained] (reading checkpoints) and
[`jaxil.nn.pretrained_params`][jaxil.nn.pretrained_params] (the decoder's
parameters); `jaxil lm generate` is the same load on the command line.

```python
import jax
import jax.numpy as jnp
import numpy as np

import jaxil.lm
from jaxil.nn.generate import generate

lm = jaxil.lm.load("smollm2-135m-instruct", max_context=256)  # or a .gguf path, an HF directory
ids = lm.encode("What is the capital of France?")    # one user turn under the chat template
logits = lm.transformer.logits(lm.params, jnp.asarray([ids]))  # [1, T, 49152]
out = generate(lm.config, lm.params, np.asarray([ids]), np.asarray([len(ids)]),
               jax.random.key(0), 32, stop_ids=lm.stop_ids)  # greedy
print(lm.tokenizer.decode(out.tokens[0, :out.lengths[0]].tolist(), skip_special_tokens=True))
```

The context (`max_context`) is the length of the decoder's KV cache for
[`jaxil.nn.generate`][jaxil.nn.generate]: keep it near the longest prompt
plus the new tokens (None: the checkpoint's trained context, 8192 for
SmolLM2).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

from tokenizers import Tokenizer

from jaxil.nn.pretrained_params import from_checkpoint
from jaxil.nn.task_vocab import chat_model
from jaxil.nn.transformer import Transformer, TransformerConfig, TransformerPolicy
from jaxil.pretrained.errors import CheckpointError
from jaxil.pretrained.load import Checkpoint, load_checkpoint
from jaxil.pretrained.tokenizer import SpecialTokens

__all__ = ["LM", "chat_policy", "encode_prompt", "load", "stop_ids"]


def encode_prompt(ckpt: Checkpoint, text: str, chat: Optional[bool] = None
                  ) -> tuple[list[int], bool]:
    """`(token ids, chat)` of a prompt: one user turn under the checkpoint's
    chat template (`chat` None: when the checkpoint has one), or the raw
    text (with BOS where the checkpoint asks for it).

    Raises:
      CheckpointError: the checkpoint has no tokenizer, or (`chat=True`) no
        chat template.
      ValueError: the prompt tokenizes to nothing.
    """
    if ckpt.tokenizer is None:
        raise CheckpointError(f"{ckpt.path}: the checkpoint has no tokenizer (no tokenizer.json); "
                              "add the model's tokenizer.json to the directory")
    if chat is None:
        chat = ckpt.chat_template is not None
    if chat:
        rendered = ckpt.render_chat([{"role": "user", "content": text}])
        ids = ckpt.tokenizer.encode(rendered, add_special_tokens=False).ids
    else:
        ids = ckpt.tokenizer.encode(text).ids
    if not ids:
        raise ValueError("the prompt is empty after tokenization; pass a non-empty prompt")
    return ids, chat


def stop_ids(ckpt: Checkpoint) -> tuple[int, ...]:
    """The checkpoint's EOS and end-of-turn ids (those it has), sorted."""
    s = ckpt.special
    return tuple(sorted({i for i in (s.eos_id, s.end_of_turn_id) if i is not None}))


@dataclasses.dataclass(frozen=True)
class LM:
    """A pretrained language model, ready to run.

    Attributes:
      config: the decoder's configuration.
      params: its parameters (`{"params": ...}`).
      transformer: the decoder, `Transformer(config)`:
        `transformer.logits(params, tokens [B, T]) -> [B, T, V]`.
      checkpoint: the loaded checkpoint (architecture, canonical table,
        tokenizer, special tokens, chat template, path).
    """

    config: TransformerConfig
    params: Any
    transformer: Transformer
    checkpoint: Checkpoint

    @property
    def tokenizer(self) -> Optional[Tokenizer]:
        """The checkpoint's tokenizer (None for an HF directory without
        `tokenizer.json`)."""
        return self.checkpoint.tokenizer

    @property
    def special(self) -> SpecialTokens:
        """The checkpoint's special tokens."""
        return self.checkpoint.special

    @property
    def chat_template(self) -> Optional[str]:
        """The checkpoint's chat template, or None."""
        return self.checkpoint.chat_template

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """The ids a generation stops on ([`stop_ids`][jaxil.lm.stop_ids])."""
        return stop_ids(self.checkpoint)

    def render_chat(self, messages: Sequence[Mapping[str, Any]],
                    add_generation_prompt: bool = True, **kwargs) -> str:
        """The conversation under the chat template
        ([`Checkpoint.render_chat`][jaxil.pretrained.load.Checkpoint.render_chat])."""
        return self.checkpoint.render_chat(messages, add_generation_prompt, **kwargs)

    def encode(self, text: str, chat: Optional[bool] = None) -> list[int]:
        """The token ids of a prompt ([`encode_prompt`][jaxil.lm.encode_prompt]):
        one user turn under the chat template (`chat` None: when there is
        one), or the raw text."""
        return encode_prompt(self.checkpoint, text, chat)[0]


def load(name_or_path: Any, *, dtype: str = "float32", compute_dtype: Optional[str] = None,
         max_context: Optional[int] = None) -> LM:
    """Load a pretrained language model by short name or path.

    Args:
      name_or_path: a short name of a shipped model
        ([`SHIPPED`][jaxil.pretrained.load.SHIPPED], e.g.
        `smollm2-135m-instruct`), a GGUF file, or an HF directory (or its
        `config.json` / `model.safetensors`).
      dtype: the parameters' dtype, `float32` or `bfloat16`.
      compute_dtype: the forward pass's dtype (None: `dtype`).
      max_context: the decoder's context and KV-cache length (None: the
        checkpoint's trained context; with learned positions at most that).

    Returns:
      The [`LM`][jaxil.lm.LM].

    Raises:
      CheckpointError: a `ValueError` with a one-line message: an unknown
        short name (listing the known ones), a known one whose package is
        not installed (the pip command), a path that is not a checkpoint, an
        unsupported architecture, a missing, extra or misshaped tensor, a
        dtype other than `float32` / `bfloat16`, a context the positions do
        not cover.
    """
    ckpt = load_checkpoint(name_or_path, dtype)
    config, params = from_checkpoint(ckpt, max_context=max_context, compute_dtype=compute_dtype)
    return LM(config, params, Transformer(config), ckpt)


def chat_policy(lm: LM, env: Any) -> tuple[TransformerPolicy, Any]:
    """`(policy network, params)`: the model acting in a chat-form token
    task ([`envs.token_chat.ChatEnv`][jaxil.envs.token_chat.ChatEnv]) as a
    [`TransformerPolicy`][jaxil.nn.transformer.TransformerPolicy]
    ([`chat_model`][jaxil.nn.task_vocab.chat_model]: the decoder with the
    environment's token width and context, token 0 as padding, the model's
    own parameters).

    Raises:
      CheckpointError: `env` is not a chat form of this model's vocabulary,
        or the model has learned positions shorter than the episode's context.
    """
    model = chat_model(lm, env)
    return TransformerPolicy(model.config), model.params
