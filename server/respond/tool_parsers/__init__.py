"""Tool-call formats, one module each, behind one interface (base.py) and this registry.

`--tool-call-parser NAME` picks one; `auto` (the default) picks from the chat template's
text (`parser_for_template`).
"""

from __future__ import annotations

from server.respond.tool_parsers.base import ToolParser
from server.respond.tool_parsers.granite import GraniteParser
from server.respond.tool_parsers.hermes import HermesParser
from server.respond.tool_parsers.llama3_json import PYTHON_TAG, Llama3JsonParser
from server.respond.tool_parsers.mistral import TOOL_CALLS, MistralParser
from server.respond.tool_parsers.phi4_mini_json import FUNCTOOLS, Phi4MiniJsonParser
from server.respond.tool_parsers.pythonic import PYTHONIC_EXAMPLE, PythonicParser

PARSERS: dict[str, type[ToolParser]] = {cls.name: cls for cls in (
    HermesParser, Llama3JsonParser, MistralParser, Phi4MiniJsonParser, GraniteParser, PythonicParser)}
AUTO = "auto"
CHOICES = (AUTO, *PARSERS)


def parser_for_template(template: str | None) -> str:
    """The format a chat template teaches its model, from markers only that format's
    templates write; hermes otherwise, since a template that knows no tools gets pagode's
    generic prompt, which asks for <tool_call> blocks (translate/tool_prompt.py)."""
    text = template or ""
    if TOOL_CALLS in text:
        return MistralParser.name
    if FUNCTOOLS in text:
        return Phi4MiniJsonParser.name
    if "<|start_of_role|>" in text or "<|tool_call|>" in text:
        return GraniteParser.name
    if PYTHONIC_EXAMPLE in text:
        return PythonicParser.name
    if PYTHON_TAG in text or ("<|start_header_id|>" in text and "tools" in text):
        return Llama3JsonParser.name
    return HermesParser.name


def get_tool_parser(name: str, template: str | None = None) -> ToolParser:
    """The parser called `name`, or the template's for `auto`."""
    if name == AUTO:
        name = parser_for_template(template)
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}; choose from {', '.join(CHOICES)}")
    return PARSERS[name]()
