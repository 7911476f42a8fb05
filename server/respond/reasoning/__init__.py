"""Reasoning formats, one module each, behind one interface (base.py) and this registry.

`--reasoning-parser NAME` picks one; `auto` (the default) picks from the chat template's
text (`parser_for_template`); `none` turns reasoning parsing off.
"""

from __future__ import annotations

from server.respond.reasoning.base import THINK_START, ReasoningParser
from server.respond.reasoning.deepseek_r1 import DeepSeekR1Parser
from server.respond.reasoning.qwen3 import Qwen3Parser

PARSERS: dict[str, type[ReasoningParser]] = {cls.name: cls for cls in (
    Qwen3Parser, DeepSeekR1Parser)}
AUTO, NONE = "auto", "none"
CHOICES = (AUTO, NONE, *PARSERS)


def parser_for_template(template: str | None) -> str:
    """A template that writes `<think>` has a reasoning model behind it: qwen3 when the
    template reads `enable_thinking` (the switch qwen3's parser honours), else deepseek_r1;
    none for a template without `<think>`."""
    text = template or ""
    if THINK_START not in text:
        return NONE
    return Qwen3Parser.name if "enable_thinking" in text else DeepSeekR1Parser.name


def resolve_name(name: str, template: str | None) -> str:
    if name == AUTO:
        return parser_for_template(template)
    if name not in CHOICES:
        raise ValueError(f"unknown reasoning parser {name!r}; choose from {', '.join(CHOICES)}")
    return name


def get_reasoning_parser(name: str, template: str | None, thinking: bool = True
                         ) -> ReasoningParser | None:
    """The parser for a request, or None when reasoning is not parsed."""
    name = resolve_name(name, template)
    return None if name == NONE else PARSERS[name](thinking)
