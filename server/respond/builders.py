"""Turning engine deltas into OpenAI response bodies: stream chunks one delta at a time,
and whole responses by accumulating the same deltas."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.types.outputs import TokenLogprob
from server.api.protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatResponseMessage,
    ChatStreamChoice,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    PromptTokensDetails,
    TopLogprob,
    UsageInfo,
    dump,
    now,
)
from server.respond.chat_format import ChatFormat
from server.respond.reasoning.stream import ReasoningStream
from server.respond.tool_calls import ToolCallStream
from server.runtime.generation import ChoiceEvent


class TokenizedPrompt(Protocol):
    """A prompt as a response shows it: its tokens (usage, prompt logprobs) and its text
    (echo)."""

    @property
    def token_ids(self) -> list[int]: ...

    @property
    def text(self) -> str: ...


@dataclass
class ChoiceState:
    index: int
    prompt: TokenizedPrompt
    text: list[str] = field(default_factory=list)
    num_tokens: int = 0
    num_cached_tokens: int = 0  # of the prompt, from the prefix cache
    started: bool = False
    text_offset: int = 0  # where the next token starts in the choice's full text
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    completion_logprobs: CompletionLogprobs = field(default_factory=CompletionLogprobs)
    chat_logprobs: list[ChatTokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None


def prompt_completion_logprobs(choice: ChoiceState,
                               token_text: Callable[[int], str]) -> CompletionLogprobs:
    """The prompt's tokens in the legacy format: the first token has no logprob (null).
    The engine gives every value already finite (engine/runner/logprob_values.py)."""
    assert choice.prompt_logprobs is not None
    out = CompletionLogprobs()
    offset = 0
    for i, lp in enumerate(choice.prompt_logprobs):
        token = lp.token if lp is not None else token_text(choice.prompt.token_ids[i])
        out.tokens.append(token)
        out.text_offset.append(offset)
        offset += len(token)
        if lp is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        top = {text: value for _, text, value in lp.top}
        top.setdefault(lp.token, lp.logprob)
        out.token_logprobs.append(lp.logprob)
        out.top_logprobs.append(top)
    return out


def concat_logprobs(a: CompletionLogprobs, b: CompletionLogprobs) -> CompletionLogprobs:
    return CompletionLogprobs(text_offset=a.text_offset + b.text_offset,
                              token_logprobs=a.token_logprobs + b.token_logprobs,
                              tokens=a.tokens + b.tokens, top_logprobs=a.top_logprobs + b.top_logprobs)


def vllm_prompt_logprobs(lps: list[TokenLogprob | None] | None
                         ) -> list[dict[str, dict[str, Any]] | None] | None:
    if lps is None:
        return None
    out: list[dict[str, dict[str, Any]] | None] = []
    for lp in lps:
        if lp is None:
            out.append(None)
            continue
        entry = {str(t): {"logprob": v, "rank": r + 1, "decoded_token": text}
                 for r, (t, text, v) in enumerate(lp.top)}
        entry[str(lp.token_id)] = {"logprob": lp.logprob, "rank": lp.rank,
                                   "decoded_token": lp.token}
        out.append(entry)
    return out


def completion_logprobs(logprobs: list[TokenLogprob], state: ChoiceState) -> CompletionLogprobs:
    """The legacy completions format; top_logprobs include the sampled token, as vLLM's."""
    out = CompletionLogprobs()
    for lp in logprobs:
        top = {text: value for _, text, value in lp.top}
        top.setdefault(lp.token, lp.logprob)
        out.tokens.append(lp.token)
        out.token_logprobs.append(lp.logprob)
        out.top_logprobs.append(top)
        out.text_offset.append(state.text_offset)
        state.text_offset += len(lp.token)
    return out


def chat_logprobs(logprobs: list[TokenLogprob], num_top: int) -> list[ChatTokenLogprob]:
    return [
        ChatTokenLogprob(
            token=lp.token, logprob=lp.logprob, bytes=list(lp.token.encode()),
            top_logprobs=[TopLogprob(token=text, logprob=value, bytes=list(text.encode()))
                          for _, text, value in lp.top[:num_top]])
        for lp in logprobs
    ]


class ResponseBuilder(ABC):
    """Shared bookkeeping: choices by index, usage over all of them."""

    def __init__(self, request_id: str, model: str, prompts: Sequence[TokenizedPrompt], n: int) -> None:
        self.request_id = request_id
        self.model = model
        self.created = now()
        self.prompts = prompts
        self.n = n
        self.continuous_usage = False  # stream_options.continuous_usage_stats
        self.choices = {p * n + i: ChoiceState(p * n + i, prompt)
                        for p, prompt in enumerate(prompts) for i in range(n)}

    def usage(self) -> UsageInfo:
        prompt_tokens = sum(len(p.token_ids) for p in self.prompts)
        completion_tokens = sum(c.num_tokens for c in self.choices.values())
        cached = sum(max(self.choices[p * self.n + i].num_cached_tokens for i in range(self.n))
                     for p in range(len(self.prompts)))
        return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                         total_tokens=prompt_tokens + completion_tokens,
                         prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))

    def update(self, event: ChoiceEvent) -> tuple[ChoiceState, str]:
        """Fold a delta into its choice; return the choice and the delta's new text."""
        if event.error is not None:
            raise event.error
        delta = event.delta
        assert delta is not None
        choice = self.choices[event.index]
        choice.num_tokens = max(choice.num_tokens + len(delta.token_ids), delta.num_output_tokens)
        choice.text.append(delta.text)
        choice.num_cached_tokens = max(choice.num_cached_tokens, delta.num_cached_tokens)
        if delta.finished:
            choice.finish_reason = delta.finish_reason
            choice.stop_reason = delta.stop_reason
        return choice, delta.text

    @abstractmethod
    def usage_chunk(self) -> dict[str, Any]:
        """The last stream chunk: no choices, the usage of all of them."""

    @abstractmethod
    def fold(self, event: ChoiceEvent) -> tuple[ChoiceState, str, Any]:
        """Fold an event into its choice; return the choice, its new text and logprobs."""

    @abstractmethod
    def chunk(self, event: ChoiceEvent) -> dict[str, Any] | None:
        """Fold an event in; return its stream chunk, or None when it has nothing to show."""

    @abstractmethod
    def response(self) -> dict[str, Any]:
        """The whole non-streaming body, once every choice has finished."""


class CompletionBuilder(ResponseBuilder):
    def __init__(self, request_id: str, model: str, prompts: Sequence[TokenizedPrompt],
                 body: CompletionRequest, token_text: Callable[[int], str]) -> None:
        """`token_text` shows a prompt token that has no logprob (the first)."""
        super().__init__(request_id, model, prompts, body.n)
        self.echo = body.echo
        self.logprobs = body.logprobs
        self.prompt_only = body.max_tokens == 0  # with echo: the prompt and its logprobs only
        self.vllm_prompt_logprobs = body.prompt_logprobs is not None  # vLLM's own format
        self.token_text = token_text
        for choice in self.choices.values():
            choice.text_offset = len(choice.prompt.text) if self.echo else 0

    def update(self, event: ChoiceEvent) -> tuple[ChoiceState, str]:
        choice, text = super().update(event)
        delta = event.delta
        assert delta is not None
        if delta.prompt_logprobs is not None:
            choice.prompt_logprobs = delta.prompt_logprobs
        if self.prompt_only:  # what was generated is not returned
            choice.num_tokens, choice.text = 0, []
            if delta.finished:
                choice.finish_reason, choice.stop_reason = "length", None
            return choice, ""
        return choice, text

    def fold(self, event: ChoiceEvent) -> tuple[ChoiceState, str, CompletionLogprobs | None]:
        choice, text = self.update(event)
        delta = event.delta
        assert delta is not None
        logprobs = None
        if self.echo and not choice.started:
            text = choice.prompt.text + text
            if self.logprobs is not None and choice.prompt_logprobs is not None:
                logprobs = prompt_completion_logprobs(choice, self.token_text)
        choice.started = True
        if self.logprobs is not None and delta.logprobs and not self.prompt_only:
            part = completion_logprobs(delta.logprobs, choice)
            logprobs = part if logprobs is None else concat_logprobs(logprobs, part)
        if logprobs is not None:
            self.merge_logprobs(choice, logprobs)
        return choice, text, logprobs

    def chunk(self, event: ChoiceEvent) -> dict[str, Any] | None:
        choice, text, logprobs = self.fold(event)
        delta = event.delta
        assert delta is not None
        if not text and not delta.finished and not delta.token_ids and logprobs is None:
            return None
        finished = delta.finished
        body = CompletionResponse(
            id=self.request_id, created=self.created, model=self.model,
            choices=[CompletionChoice(index=choice.index, text=text, logprobs=logprobs,
                                      finish_reason=choice.finish_reason if finished else None,
                                      stop_reason=choice.stop_reason if finished else None)])
        return dump(body)

    @staticmethod
    def merge_logprobs(choice: ChoiceState, part: CompletionLogprobs) -> None:
        whole = choice.completion_logprobs
        whole.tokens += part.tokens
        whole.token_logprobs += part.token_logprobs
        whole.top_logprobs += part.top_logprobs
        whole.text_offset += part.text_offset

    def usage_chunk(self) -> dict[str, Any]:
        return dump(CompletionResponse(id=self.request_id, created=self.created,
                                       model=self.model, choices=[], usage=self.usage()))

    def response(self) -> dict[str, Any]:
        choices = []
        for index in sorted(self.choices):
            choice = self.choices[index]
            text = "".join(choice.text)
            choices.append(CompletionChoice(
                index=index, text=(choice.prompt.text + text) if self.echo else text,
                logprobs=choice.completion_logprobs if self.logprobs is not None else None,
                finish_reason=choice.finish_reason, stop_reason=choice.stop_reason,
                prompt_logprobs=vllm_prompt_logprobs(choice.prompt_logprobs)
                if self.vllm_prompt_logprobs else None))
        body = CompletionResponse(id=self.request_id, created=self.created, model=self.model,
                                  choices=choices, usage=self.usage())
        return body.model_dump(mode="json")


class ChatBuilder(ResponseBuilder):
    def __init__(self, request_id: str, model: str, prompt: TokenizedPrompt,
                 body: ChatCompletionRequest, chat_format: ChatFormat | None = None) -> None:
        """`chat_format`: how the model writes calls and reasoning (hermes, none if not given)."""
        super().__init__(request_id, model, [prompt], body.n)
        self.logprobs = body.logprobs
        self.top_logprobs = body.top_logprobs or 0
        fmt = chat_format or ChatFormat("hermes", "none")
        # Each choice's output is split into reasoning and content (respond/reasoning/), then
        # the content is parsed for calls (respond/tool_calls.py).
        tools = body.tool_mode()
        self.tool_streams = {index: ToolCallStream(*tools, parser=fmt.tools())
                             for index in self.choices} if tools else {}
        parser = fmt.reasoning(body)
        self.reasoning_streams = {index: ReasoningStream(parser)
                                  for index in self.choices} if parser else {}

    def fold(self, event: ChoiceEvent) -> tuple[ChoiceState, str, ChatLogprobs | None]:
        choice, text = self.update(event)
        delta = event.delta
        assert delta is not None
        logprobs = None
        if self.logprobs and delta.logprobs:
            content = chat_logprobs(delta.logprobs, self.top_logprobs)
            choice.chat_logprobs += content
            logprobs = ChatLogprobs(content=content)
        return choice, text, logprobs

    def chunk(self, event: ChoiceEvent) -> dict[str, Any] | None:
        first = not self.choices[event.index].started
        choice, text, logprobs = self.fold(event)
        delta = event.delta
        assert delta is not None
        choice.started = True
        if not first and not text and not delta.finished and not delta.token_ids:
            return None
        message = DeltaMessage(role="assistant" if first else None, content=text)
        finish_reason = delta.finish_reason if delta.finished else None
        reasoning = self.reasoning_streams.get(choice.index)
        if reasoning is not None:
            thought, text = reasoning.feed(text, delta.finished)
            message.content = text or None
            message.reasoning = message.reasoning_content = thought or None
        tools = self.tool_streams.get(choice.index)
        if tools is not None:
            shown, calls = tools.feed(text, delta.finished)
            message.content, message.tool_calls = shown or None, calls or None
            finish_reason = tools.finish_reason(finish_reason)
        parsed = reasoning is not None or tools is not None
        if parsed and not first and not delta.finished and not logprobs and not (
                message.content or message.reasoning or message.tool_calls):
            return None
        body = ChatCompletionChunk(
            id=self.request_id, created=self.created, model=self.model,
            choices=[ChatStreamChoice(index=choice.index, delta=message, logprobs=logprobs,
                                      finish_reason=finish_reason,
                                      stop_reason=delta.stop_reason if delta.finished else None)])
        data = dump(body)
        # Clients read `role` only on a choice's first chunk; vLLM leaves it out after.
        data["choices"][0]["delta"] = drop_nones(data["choices"][0]["delta"])
        return data

    def usage_chunk(self) -> dict[str, Any]:
        return dump(ChatCompletionChunk(id=self.request_id, created=self.created,
                                        model=self.model, choices=[], usage=self.usage()))

    def response(self) -> dict[str, Any]:
        choices = []
        for index in sorted(self.choices):
            choice = self.choices[index]
            text = "".join(choice.text)
            message = ChatResponseMessage(content=text)
            finish_reason = choice.finish_reason
            if index in self.reasoning_streams:
                thought, text = self.reasoning_streams[index].parser.split(text, True)
                message.content = text or None
                message.reasoning = message.reasoning_content = thought or None
            if index in self.tool_streams:
                message.content, message.tool_calls, finish_reason = \
                    self.tool_streams[index].result(text, finish_reason)
            choices.append(ChatChoice(
                index=index, message=message,
                logprobs=ChatLogprobs(content=choice.chat_logprobs) if self.logprobs else None,
                finish_reason=finish_reason, stop_reason=choice.stop_reason))
        body = ChatCompletionResponse(id=self.request_id, created=self.created,
                                      model=self.model, choices=choices, usage=self.usage())
        return body.model_dump(mode="json")


def drop_nones(value: Any) -> Any:
    """Leave out null fields, in nested tool-call deltas too, as vLLM's chunks do."""
    if isinstance(value, dict):
        return {k: drop_nones(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nones(v) for v in value]
    return value


def consume_event(builder: ResponseBuilder, event: ChoiceEvent) -> None:
    """Non-streaming: fold an event in, raising the APIError of a failed choice."""
    if event.error is not None:
        raise event.error
    builder.fold(event)

