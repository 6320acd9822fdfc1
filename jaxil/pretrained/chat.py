"""A checkpoint's chat template, rendered the way transformers renders it.

`apply_chat_template` compiles the template in jinja2's immutable sandbox
with `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a
`tojson` filter that does not escape HTML, and the globals
`raise_exception`, `strftime_now`, `dict` and `namespace` (one that refuses
underscore names); it renders with `messages`, `tools`, `documents`,
`add_generation_prompt` and the tokenizer's special tokens (`bos_token`,
`eos_token` ...). [render_chat][jaxil.pretrained.chat.render_chat] does the
same, and raises [ChatTemplateError][jaxil.pretrained.chat.ChatTemplateError]
with the template's own message where it calls `raise_exception`.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, Mapping, Optional, Sequence

import jinja2
import jinja2.ext
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """A chat template that refuses the conversation (its `raise_exception`)
    or does not parse; the message is one line."""


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _Dict:
    """`dict(...)` inside a template, without attribute access to the type."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """jinja2's namespace, refusing underscore-prefixed attributes."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes ({name!r})")


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask
    marker) renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


@functools.lru_cache(maxsize=16)
def compile_template(template: str) -> jinja2.Template:
    """The compiled template (cached).

    Raises:
        ChatTemplateError: the template does not parse.
    """
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                       dict=_Dict(), namespace=_Namespace)
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template does not parse: {e.message} "
                                f"(line {e.lineno})") from e


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], *,
                add_generation_prompt: bool = False,
                special_tokens: Optional[Mapping[str, str]] = None,
                tools: Optional[Sequence] = None, documents: Optional[Sequence] = None,
                **kwargs) -> str:
    """The text of a conversation under a chat template.

    Args:
        template: the checkpoint's template (`tokenizer.chat_template`).
        messages: `[{"role": ..., "content": ...}, ...]`.
        add_generation_prompt: end with the opening of an assistant turn.
        special_tokens: `bos_token`, `eos_token` ... as the template reads them
            ([SpecialTokens.template_variables][jaxil.pretrained.tokenizer.SpecialTokens.template_variables]).
        tools: tool schemas, for templates that read `tools`.
        documents: documents, for templates that read `documents`.
        **kwargs: further template variables (they override the special tokens).

    Raises:
        ChatTemplateError: the template calls `raise_exception` (its message)
            or fails while rendering.
    """
    compiled = compile_template(template)
    variables = {**(special_tokens or {}), **kwargs}
    try:
        return compiled.render(messages=[dict(m) for m in messages], tools=tools,
                               documents=documents,
                               add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.exceptions.TemplateError as e:
        raise ChatTemplateError(f"the chat template refused the conversation: {e}") from e
