"""Request and response bodies of the OpenAI-compatible API, with vLLM's field names.

Unknown fields are kept (extra="allow") so that clients written for other servers still
work; server/translate/fields.py refuses the ones whose meaning pagode does not implement and
logs the rest once. NaN and Infinity (JSON literals Python accepts) are refused everywhere, and
lists fail fast so that a body of a million wrong items builds one error, not a million.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from engine.sampling_params import MAX_LOGPROBS
from server.api.tool_markup import Mode

# Strict: "5", 5.0 and true are not token counts (vLLM and OpenAI reject them too).
StrictInt = Annotated[int, Field(strict=True)]
StrictBool = Annotated[bool, Field(strict=True)]
PositiveInt = Annotated[int, Field(strict=True, ge=1)]
NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
TokenIds = Annotated[list[StrictInt], Field(fail_fast=True)]
MAX_BAD_WORDS, MAX_BAD_WORD_CHARS = 1024, 256  # each word is encoded, and checked every step


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    def unknown_fields(self) -> list[str]:
        return sorted((self.model_extra or {}).keys())


class StreamOptions(OpenAIModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingFields(OpenAIModel):
    """The sampling and stopping fields that completions and chat share."""

    model: str | None = None
    n: PositiveInt = 1
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: Annotated[int, Field(strict=True, ge=-1)] = 0
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    seed: StrictInt | None = None
    stop: str | Annotated[list[str], Field(fail_fast=True)] | None = None
    stop_token_ids: TokenIds | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: Annotated[float, Field(gt=0.0)] = 1.0
    ignore_eos: bool = False
    min_tokens: NonNegativeInt = 0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    skip_special_tokens: bool = True
    # pagode's own: false keeps this request from drafting when the server runs with
    # --speculative-config (docs/speculative.md); true is a permission, not a demand.
    speculative: StrictBool = True
    # vLLM's: only these token ids may be sampled; these words are never written whole
    allowed_token_ids: Annotated[list[StrictInt], Field(min_length=1, fail_fast=True)] | None = None
    bad_words: Annotated[list[Annotated[str, Field(min_length=1, max_length=MAX_BAD_WORD_CHARS)]],
                         Field(max_length=MAX_BAD_WORDS, fail_fast=True)] | None = None

    @field_validator("stop")
    @classmethod
    def check_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if any(s == "" for s in stops):
            raise ValueError("stop strings must not be empty")
        return stop

    @field_validator("logit_bias")
    @classmethod
    def check_logit_bias(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key in bias or {}:
            if not key.lstrip("-").isdigit() or int(key) < 0:
                raise ValueError(f"logit_bias keys must be token ids, got {key!r}")
        return bias

    @field_validator("stream_options")
    @classmethod
    def check_stream_options(cls, options: StreamOptions | None,
                             info: ValidationInfo) -> StreamOptions | None:
        # `stream` is declared before `stream_options`, so it is validated already.
        if options is not None and not info.data.get("stream", False):
            raise ValueError("stream_options can only be set when stream is true")
        return options

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


# ---- structured outputs, tools and priority ------------------------------------------------
# Request fields that real clients send: OpenAI's response_format and tools, vLLM's
# structured_outputs object and its older guided_* aliases, and vLLM's priority.


class StructuredOutputsParams(OpenAIModel):
    """vLLM's `structured_outputs`: exactly one of json, regex, choice, grammar, json_object,
    structural_tag, plus whitespace options."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    json_schema: dict[str, Any] | str | bool | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None
    # None: pagode's default, single spaces only (so that small models end their JSON).
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


class JsonSchemaFormat(OpenAIModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    format: dict[str, Any] | None = None  # structural_tag's body, as vLLM takes it

    @model_validator(mode="after")
    def check_schema(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs a json_schema object")
        return self


class StructuredFields(OpenAIModel):
    """What both endpoints accept to constrain the output, and the request's priority."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsParams | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    priority: StrictInt = 0


class FunctionDefinition(OpenAIModel):
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(OpenAIModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIModel):
    name: str


class NamedToolChoice(OpenAIModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class FunctionCall(OpenAIModel):
    name: str
    arguments: str = "{}"


class ToolCall(OpenAIModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolFields(OpenAIModel):
    """Chat's tools: the definitions, which may be called, and whether several at once."""

    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    @model_validator(mode="after")
    def check_tools(self) -> ToolFields:
        if self.tools is not None and not self.tools:
            raise ValueError("tools must not be empty; leave it out instead")
        if self.tool_choice not in (None, "none") and not self.tools:
            raise ValueError("tool_choice needs tools")
        if isinstance(self.tool_choice, NamedToolChoice):
            names = {t.function.name for t in self.tools or []}
            if self.tool_choice.function.name not in names:
                raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, "
                                 f"which is not among the tools {sorted(names)}")
        return self

    def effective_tool_choice(self) -> str | NamedToolChoice:
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    def tool_mode(self) -> tuple[Mode, str | None] | None:
        """(mode, function name) when the output is parsed for calls; None for plain content."""
        choice = self.effective_tool_choice()
        if isinstance(choice, NamedToolChoice):
            return "named", choice.function.name
        if choice in ("auto", "required") and self.tools:
            return choice, None  # type: ignore[return-value]
        return None


Prompt = (str | Annotated[list[str], Field(fail_fast=True)] | TokenIds
          | Annotated[list[TokenIds], Field(fail_fast=True)])


class CompletionRequest(SamplingFields, StructuredFields):
    prompt: Prompt
    echo: bool = False  # before max_tokens, whose check reads it
    max_tokens: NonNegativeInt | None = 16  # 0 only with echo (scoring the prompt)
    logprobs: Annotated[int, Field(strict=True, ge=0, le=MAX_LOGPROBS)] | None = None
    prompt_logprobs: Annotated[int, Field(strict=True, ge=0, le=MAX_LOGPROBS)] | None = None

    @field_validator("max_tokens")
    @classmethod
    def check_max_tokens(cls, max_tokens: int | None, info: ValidationInfo) -> int | None:
        if max_tokens == 0 and not info.data.get("echo", False):
            raise ValueError("max_tokens must be at least 1, or 0 together with echo")
        return max_tokens

    @model_validator(mode="after")
    def check_scoring(self) -> CompletionRequest:
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs is not available when streaming")
        return self

    def wanted_prompt_logprobs(self) -> int | None:
        """vLLM: echo with logprobs returns the prompt's logprobs too."""
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return self.logprobs if self.echo else None


class TextPart(OpenAIModel):
    type: str
    text: str | None = None


class ChatMessage(OpenAIModel):
    role: str
    content: str | Annotated[list[TextPart], Field(fail_fast=True)] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # role "tool": which call this answers


class ChatCompletionRequest(SamplingFields, StructuredFields, ToolFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1, fail_fast=True)]
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(strict=True, ge=0, le=MAX_LOGPROBS)] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # Extra variables for the chat template (Qwen3's enable_thinking, ...); the reasoning
    # parser reads enable_thinking too.
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    # vLLM's: after this many tokens of thinking its end tag is forced and the answer follows
    thinking_token_budget: NonNegativeInt | None = None

    @field_validator("top_logprobs")
    @classmethod
    def check_top_logprobs(cls, top: int | None, info: ValidationInfo) -> int | None:
        if top and not info.data.get("logprobs", False):
            raise ValueError("top_logprobs requires logprobs to be true")
        return top


class TokenizeRequest(OpenAIModel):
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(fail_fast=True)] | None = None
    tools: Annotated[list[ToolDefinition], Field(fail_fast=True)] | None = None  # as in chat
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # as in chat

    @model_validator(mode="after")
    def check_one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        if self.tools is not None and self.messages is None:
            raise ValueError("tools go with messages")
        return self


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: TokenIds


# ---- responses (plain models: the routes build them, clients read them) ----

def now() -> int:
    return int(time.time())


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    # vLLM's: [None, {token_id: {"logprob", "rank", "decoded_token"}}, ...]
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None
    # vLLM's field, and the older name that many clients still read: both carry the same.
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo | None = None


class DeltaMessage(BaseModel):
    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


def dump(model: BaseModel) -> dict[str, Any]:
    """JSON-ready dict; `usage: null` is left out of stream chunks as vLLM does."""
    data = model.model_dump(mode="json")
    if "usage" in data and data["usage"] is None:
        del data["usage"]
    return data
