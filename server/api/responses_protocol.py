"""Request bodies of the OpenAI Responses API (POST /v1/responses).

Input items and tools stay loose here (a type and its fields), because which of them pagode
can run is decided once, in server/translate/responses_to_chat.py, which refuses the rest by
name (images, files, built-in tools such as web_search).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from server.api.protocol import OpenAIModel, PositiveInt, StructuredOutputsParams, Temperature, TopP

Item = dict[str, Any]


class TextFormat(OpenAIModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True, allow_inf_nan=False)
    type: Literal["text", "json_object", "json_schema"]
    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def check_schema(self) -> TextFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("text.format of type json_schema needs a schema")
        return self


class TextConfig(OpenAIModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # a hint for OpenAI's models


class ReasoningConfig(OpenAIModel):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # the older name


class ResponsesRequest(OpenAIModel):
    model: str | None = None
    input: str | Annotated[list[Item], Field(fail_fast=True)]
    instructions: str | None = None
    tools: Annotated[list[Item], Field(fail_fast=True)] | None = None
    tool_choice: Literal["none", "auto", "required"] | Item | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    previous_response_id: str | None = None
    store: bool = True
    background: bool = False
    stream: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    # Which extra fields the response carries. Codex asks for the encrypted reasoning, to send
    # it back; pagode's reasoning items carry their text instead, so that one is accepted and
    # adds nothing. Anything else (logprobs, tool results) is refused by name.
    include: Annotated[list[Literal["reasoning.encrypted_content"]], Field(fail_fast=True)] | None = None
    # "auto" would drop the oldest items of a conversation that outgrows the context; pagode
    # answers such a prompt with a 400 instead, so only "disabled" is taken.
    truncation: Literal["disabled"] | None = None
    seed: int | None = None  # not OpenAI's; kept because it makes tests repeatable
    # vLLM's extension, as on chat: constrain the reply with a regex, a choice, a grammar.
    structured_outputs: StructuredOutputsParams | None = None
