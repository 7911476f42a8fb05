"""`--chat-template`: a file, or the template's text inline (as vLLM takes either), that
replaces the model's own template (HF tokenizer_config.json `chat_template`, or GGUF
`tokenizer.chat_template`, which transformers carries over when it builds the tokenizer)."""

from __future__ import annotations

from pathlib import Path

JINJA_MARKS = ("{{", "{%")


def load_chat_template(value: str) -> str:
    """The template's text; ValueError for a path that names no file, or a template that
    does not parse, so that the server refuses to start rather than fail every chat."""
    path = Path(value).expanduser()
    if not any(mark in value for mark in JINJA_MARKS):
        if not path.is_file():
            raise ValueError(f"--chat-template {value!r}: no such file, and not a Jinja template")
        text = path.read_text(encoding="utf-8")
    else:
        text = value
    check_syntax(text)
    return text


def check_syntax(text: str) -> None:
    """Parse with the environment transformers renders in (sandboxed, loop controls)."""
    from jinja2 import TemplateSyntaxError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        ImmutableSandboxedEnvironment(extensions=[loopcontrols]).parse(text)
    except TemplateSyntaxError as exc:
        raise ValueError(f"the chat template does not parse: {exc.message} (line {exc.lineno})") \
            from exc
