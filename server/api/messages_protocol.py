"""Request bodies of the Anthropic Messages API (POST /v1/messages and its count_tokens).

Blocks are kept loose here (a type and whatever fields it brings), because which block may
stand where depends on the role; server/translate/messages_to_chat.py reads them and refuses
the ones pagode cannot honour (images, documents, server tools) by name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from server.api.protocol import OpenAIModel, PositiveInt, StrictInt, StructuredOutputsParams

Block = dict[str, Any]


class AnthropicMessage(OpenAIModel):
    role: Literal["user", "assistant"]
    content: str | Annotated[list[Block], Field(fail_fast=True)]


class AnthropicTool(OpenAIModel):
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # "custom" or absent; anything else is a server tool


class AnthropicToolChoice(OpenAIModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def check_name(self) -> AnthropicToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice of type tool needs a name")
        return self


class ThinkingConfig(OpenAIModel):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[int, Field(strict=True, ge=1)] | None = None


class MessagesInput(OpenAIModel):
    """What both /v1/messages and /v1/messages/count_tokens take: the conversation."""

    model: str | None = None
    messages: Annotated[list[AnthropicMessage], Field(min_length=1, fail_fast=True)]
    system: str | Annotated[list[Block], Field(fail_fast=True)] | None = None
    tools: Annotated[list[AnthropicTool], Field(fail_fast=True)] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: ThinkingConfig | None = None


class MessagesRequest(MessagesInput):
    max_tokens: PositiveInt  # required, as Anthropic requires it
    stop_sequences: Annotated[list[str], Field(fail_fast=True)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(strict=True, ge=0)] | None = None
    metadata: dict[str, Any] | None = None
    stream: bool = False
    seed: StrictInt | None = None  # not Anthropic's; kept because it makes tests repeatable
    # vLLM's extension, as on chat: constrain the reply with a regex, a choice, a grammar.
    structured_outputs: StructuredOutputsParams | None = None


class CountTokensRequest(MessagesInput):
    pass
