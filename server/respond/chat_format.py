"""How the served model writes tool calls and reasoning, resolved once per chat template:
the `--tool-call-parser` and `--reasoning-parser` choices, with `auto` read from the
template's text, and what one request makes of them (its enable_thinking)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from server.api.protocol import ChatCompletionRequest
from server.respond import reasoning, tool_parsers
from server.respond.reasoning.base import THINK_START, ReasoningParser
from server.respond.tool_parsers.base import ToolParser


@dataclass(frozen=True)
class ChatFormat:
    tool_parser: str  # a name in tool_parsers.PARSERS
    reasoning_parser: str  # a name in reasoning.PARSERS, or "none"
    # vLLM's enable_in_reasoning: structured outputs constrain the reasoning too, instead of
    # starting after it.
    structured_in_reasoning: bool = False

    def tools(self) -> ToolParser:
        return tool_parsers.get_tool_parser(self.tool_parser)

    def reasoning(self, body: ChatCompletionRequest) -> ReasoningParser | None:
        return reasoning.get_reasoning_parser(self.reasoning_parser, None, thinking_on(body))

    def thinking_markers(self, body: ChatCompletionRequest) -> tuple[str, str] | None:
        """The tags that open and close this request's thinking; None when it does not
        think (a thinking budget then has nothing to cut)."""
        parser = self.reasoning(body)
        if parser is None or not parser.active:
            return None
        return THINK_START, parser.end_tag

    def grammar_start(self, body: ChatCompletionRequest) -> str:
        """The marker after which a structured output applies: the reasoning's end tag when
        this request reasons first, else "" (from the first token)."""
        parser = self.reasoning(body)
        if parser is None or not parser.active or self.structured_in_reasoning:
            return ""
        return parser.end_tag


@lru_cache(maxsize=16)
def chat_format(tool_flag: str, reasoning_flag: str, template: str | None,
                structured_in_reasoning: bool = False) -> ChatFormat:
    """The flags resolved against the template (`auto` picks from its text)."""
    return ChatFormat(tool_parsers.get_tool_parser(tool_flag, template).name,
                      reasoning.resolve_name(reasoning_flag, template), structured_in_reasoning)


def thinking_on(body: ChatCompletionRequest) -> bool:
    """chat_template_kwargs.enable_thinking; else, as vLLM, reasoning_effort other than
    "none"; else on."""
    kwargs = body.chat_template_kwargs or {}
    if "enable_thinking" in kwargs:
        return bool(kwargs["enable_thinking"])
    if body.reasoning_effort is not None:
        return body.reasoning_effort != "none"
    return True
