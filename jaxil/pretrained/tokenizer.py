"""A checkpoint's tokenizer as a `tokenizers.Tokenizer`, with its special tokens.

- An HF directory: its `tokenizer.json`, and the special tokens of
  `tokenizer_config.json` / `special_tokens_map.json` (or `config.json`'s ids).
- A GGUF file: the byte-level BPE its metadata describes
  (`tokenizer.ggml.model = gpt2`: `tokens`, `merges`, `token_type`, `pre`,
  the BOS/EOS/pad/unknown ids, `add_bos_token`), built the way transformers'
  GGUF converter builds it: tokens respelled in GPT-2's byte alphabet, control
  tokens (type 3) added as special tokens and user-defined ones (type 4) as
  plain added tokens, and the pre-tokenizer named by `tokenizer.ggml.pre`
  ([PRE_TOKENIZER_SPLITS][jaxil.pretrained.tokenizer.PRE_TOKENIZER_SPLITS];
  others get GPT-2's byte-level regex).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping, Optional

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from jaxil.envs.token_grammar import bytes_to_unicode
from jaxil.pretrained.errors import CheckpointError

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
}
"""`tokenizer.ggml.pre` -> the split regex applied before the byte-level
mapping (as transformers' GGUF converter and llama.cpp's `llama-vocab.cpp`)."""
DIGIT_SPLIT_PRE = ("smollm",)
"""Pre-tokenizers that llama.cpp reads as "isolate every digit, then GPT-2's
regex" (its `llama-vocab.cpp` splits on `\\p{N}` first), as SmolLM's own
`tokenizer.json` does (`Digits(individual)` + `ByteLevel`). transformers'
GGUF converter has no entry for them and uses GPT-2's regex alone, which
differs on whitespace before a digit (`"  4"` -> `Ġ`, `Ġ`, `4` against `ĠĠ`, `4`)."""
PRE_TOKENIZER_READINGS = ("transformers", "llama.cpp")
"""Whose reading of `tokenizer.ggml.pre`
[gguf_tokenizer][jaxil.pretrained.tokenizer.gguf_tokenizer] follows."""

_CONTROL, _USER_DEFINED = 3, 4


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """The checkpoint's special tokens (strings and ids; None where it has none).

    Attributes:
        bos: beginning of sequence.
        eos: end of sequence (what generation stops on by default).
        pad: padding.
        unk: unknown.
        end_of_turn: the token that closes a chat turn (`<|im_end|>`,
            `<|eot_id|>`, `<end_of_turn>` ...), the EOS when the vocabulary
            has none of those.
        add_bos: the checkpoint asks for BOS before every encoded text.
    """

    bos: Optional[str] = None
    eos: Optional[str] = None
    pad: Optional[str] = None
    unk: Optional[str] = None
    end_of_turn: Optional[str] = None
    bos_id: Optional[int] = None
    eos_id: Optional[int] = None
    pad_id: Optional[int] = None
    unk_id: Optional[int] = None
    end_of_turn_id: Optional[int] = None
    add_bos: bool = False

    def template_variables(self) -> dict[str, str]:
        """`bos_token`, `eos_token`, `pad_token`, `unk_token` for a chat template
        (the special tokens transformers passes)."""
        return {f"{k}_token": v for k, v in (("bos", self.bos), ("eos", self.eos),
                                             ("pad", self.pad), ("unk", self.unk))
                if v is not None}


_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>")


def _special(tok: Tokenizer, bos, eos, pad, unk, add_bos) -> SpecialTokens:
    def ident(t):
        return None if t is None else tok.token_to_id(t)

    eot = next((t for t in _END_OF_TURN if tok.token_to_id(t) is not None), eos)
    return SpecialTokens(bos=bos, eos=eos, pad=pad, unk=unk, end_of_turn=eot,
                         bos_id=ident(bos), eos_id=ident(eos), pad_id=ident(pad),
                         unk_id=ident(unk), end_of_turn_id=ident(eot), add_bos=bool(add_bos))


def gguf_tokenizer(meta: Mapping[str, Any], where: str = "GGUF",
                   reading: str = "transformers") -> tuple[Tokenizer, SpecialTokens]:
    """The byte-level BPE tokenizer and special tokens of GGUF metadata.

    Args:
        meta: the file's metadata.
        where: the file, for messages.
        reading: `transformers` builds what transformers' GGUF converter
            builds (the same ids as a transformers model loaded from the same
            file); `llama.cpp` also isolates digits for the pre-tokenizers of
            [DIGIT_SPLIT_PRE][jaxil.pretrained.tokenizer.DIGIT_SPLIT_PRE], as
            llama.cpp and SmolLM's own `tokenizer.json` do.

    Raises:
        CheckpointError: the metadata has no tokenizer, or one other than
            byte-level BPE (`tokenizer.ggml.model` other than `gpt2`).
    """
    if reading not in PRE_TOKENIZER_READINGS:
        raise CheckpointError(f"reading {reading!r} is not one of "
                              f"{', '.join(PRE_TOKENIZER_READINGS)}")
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise CheckpointError(f"{where}: tokenizer.ggml.model {kind!r} is not supported; "
                              "jaxil builds byte-level BPE (gpt2) tokenizers")
    tokens = list(meta["tokenizer.ggml.tokens"])
    merges = meta.get("tokenizer.ggml.merges")
    if merges is None:
        raise CheckpointError(f"{where}: tokenizer.ggml.merges is missing: a BPE tokenizer "
                              "needs its merges")
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {(t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))): i
             for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges],
                               fuse_unk=False, byte_fallback=False))
    pre = meta.get("tokenizer.ggml.pre")
    if pre in PRE_TOKENIZER_SPLITS:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre in DIGIT_SPLIT_PRE and reading == "llama.cpp":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    types = list(meta.get("tokenizer.ggml.token_type") or ())
    control = [AddedToken(t, normalized=False, special=True)
               for t, kind in zip(tokens, types) if kind == _CONTROL and set(t) <= alphabet]
    if control:
        tok.add_special_tokens(control)
    user = [AddedToken(t, normalized=False, special=False)
            for t, kind in zip(tokens, types) if kind == _USER_DEFINED and t in vocab]
    if user:
        tok.add_tokens(user)

    def name(key):
        i = meta.get(f"tokenizer.ggml.{key}")
        return None if i is None or not 0 <= int(i) < len(tokens) else tokens[int(i)]

    bos = name("bos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    if add_bos and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tok.token_to_id(bos))])
    return tok, _special(tok, bos, name("eos_token_id"), name("padding_token_id"),
                         name("unknown_token_id"), add_bos)


def _token_text(value) -> Optional[str]:
    if isinstance(value, dict):
        return value.get("content")
    return value


def hf_tokenizer(directory: Path) -> tuple[Tokenizer, SpecialTokens]:
    """The `tokenizer.json` of an HF directory and its special tokens.

    The special tokens come from `tokenizer_config.json`
    (`bos_token` ...), then `special_tokens_map.json`, then the ids in
    `config.json`.

    Raises:
        CheckpointError: there is no `tokenizer.json`, or it does not parse.
    """
    directory = Path(directory)
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no tokenizer.json (jaxil reads the tokenizers "
                              "library's file; save it with tokenizer.save_pretrained)")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # the tokenizers library raises a bare Exception
        raise CheckpointError(f"{path}: not a tokenizers file ({str(e).splitlines()[0]})") from e
    found: dict[str, Any] = {}
    for file in ("config.json", "special_tokens_map.json", "tokenizer_config.json"):
        if (directory / file).is_file():
            data = json.loads((directory / file).read_text())
            if file == "config.json":
                for key in ("bos", "eos", "pad"):
                    ident = data.get(f"{key}_token_id")
                    if isinstance(ident, list):
                        ident = ident[0] if ident else None
                    if ident is not None and tok.id_to_token(int(ident)) is not None:
                        found[key] = tok.id_to_token(int(ident))
                continue
            for key in ("bos", "eos", "pad", "unk"):
                if _token_text(data.get(f"{key}_token")) is not None:
                    found[key] = _token_text(data[f"{key}_token"])
            if "add_bos_token" in data:
                found["add_bos"] = data["add_bos_token"]
    return tok, _special(tok, found.get("bos"), found.get("eos"), found.get("pad"),
                         found.get("unk"), found.get("add_bos", False))


def hf_chat_template(directory: Path) -> Optional[str]:
    """The chat template of an HF directory: `chat_template.jinja`, else
    `tokenizer_config.json`'s `chat_template` (the default one when it is a
    list of named templates), else None."""
    directory = Path(directory)
    if (directory / "chat_template.jinja").is_file():
        return (directory / "chat_template.jinja").read_text()
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return None
    template = json.loads(config.read_text()).get("chat_template")
    if isinstance(template, list):
        named = {t["name"]: t["template"] for t in template}
        template = named.get("default", next(iter(named.values()), None))
    return template
