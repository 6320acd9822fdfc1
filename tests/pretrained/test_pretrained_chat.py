"""Chat templates rendered the way transformers' apply_chat_template renders
them, on the checkpoint's own template."""

from __future__ import annotations

import pytest

from helpers.pretrained import CHAT_TEMPLATE, GGUF_LLAMA, hf_tensors, write_gguf
from jaxil.pretrained import ChatTemplateError, load_checkpoint, render_chat

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}


def test_a_template_renders_with_the_special_tokens_and_the_generation_prompt():
    """Fails when the special tokens are not template variables, a filter
    (`trim`) is missing, or `add_generation_prompt` is ignored."""
    messages = [{"role": "user", "content": " Hi \n"}, {"role": "assistant", "content": "Hello"}]
    assert render_chat(CHAT_TEMPLATE, messages, special_tokens=SPECIAL) == (
        "<s>user\nHi</s>\n<s>assistant\nHello</s>\n")
    assert render_chat(CHAT_TEMPLATE, messages[:1], add_generation_prompt=True,
                       special_tokens=SPECIAL).endswith("Hi</s>\n<s>assistant\n")


def test_whitespace_control_tojson_loopcontrols_and_namespace_as_transformers():
    """Fails when the environment lacks trim_blocks/lstrip_blocks (a block
    tag leaves its newline and indentation), `tojson` escapes HTML or ASCII
    (jinja2's own does), `break` is unknown, or namespace is missing."""
    template = ("{% set ns = namespace(n=0) %}\n"
                "  {% for m in messages %}\n"
                "    {% if loop.index > 2 %}{% break %}{% endif %}\n"
                "{% set ns.n = ns.n + 1 %}{{ m | tojson }}|\n"
                "  {% endfor %}\n"
                "{{ ns.n }}")
    messages = [{"role": "user", "content": "<b>é</b>"}, {"role": "user", "content": "&"},
                {"role": "user", "content": "dropped"}]
    assert render_chat(template, messages) == (
        '{"role": "user", "content": "<b>é</b>"}|\n{"role": "user", "content": "&"}|\n2')


def test_raise_exception_and_a_broken_template_are_one_line_errors():
    """Fails when the template's raise_exception does not surface its message,
    or a syntax error escapes as a jinja2 traceback."""
    with pytest.raises(ChatTemplateError, match="refused the conversation: tool turns are not "
                                                "supported"):
        render_chat(CHAT_TEMPLATE, [{"role": "tool", "content": "x"}], special_tokens=SPECIAL)
    with pytest.raises(ChatTemplateError, match=r"does not parse: .*\(line 1\)"):
        render_chat("{% for m in messages %}", [])


def test_the_sandbox_refuses_attribute_escapes():
    """Fails when templates (untrusted text from a checkpoint) run outside
    jinja2's immutable sandbox: a mutation or a dunder attribute gets through."""
    with pytest.raises(ChatTemplateError):
        render_chat("{{ messages.append(1) }}", [])
    with pytest.raises(ChatTemplateError, match="unsafe"):
        render_chat("{{ ''.__class__.__mro__ }}", [])


def test_a_gguf_checkpoint_renders_its_own_template(tmp_path):
    """Fails when the GGUF's `tokenizer.chat_template` or its special tokens are
    not the ones the checkpoint renders with."""
    write_gguf(tmp_path / "m.gguf", hf_tensors("llama", config=GGUF_LLAMA), GGUF_LLAMA)
    ckpt = load_checkpoint(tmp_path / "m.gguf")
    assert ckpt.chat_template == CHAT_TEMPLATE
    text = ckpt.render_chat([{"role": "user", "content": "the 12"}])
    assert text == "<|im_start|>user\nthe 12<|im_end|>\n<|im_start|>assistant\n"
    ids = ckpt.tokenizer.encode(text, add_special_tokens=False).ids
    assert ids[0] == 1 and ids.count(2) == 1
