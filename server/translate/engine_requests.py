"""From a parsed request body to engine requests, in two steps that the route runs in order.

- `check_completion` / `check_chat`: the cheap 400s, before tokenizing (unsupported fields,
  priority, prompt shapes, fan-out, prompt characters and vocabulary), against the engine's
  limits. ServerState.admit runs them between the 404 and the 429, and the plan they return
  says how many sequences the request will run.
- `completion_requests` / `chat_requests`: the prompts tokenized or rendered with the chat
  template, the structured-output grammar compiled by the engine, and one sub-request per
  choice with its sampling parameters and seed. CPU-bound: the route runs them in the worker
  pool.

All of them are functions of their arguments: the body, the engine's limits, its tokenizer
and its grammar compiler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.request_limits import RequestLimits
from engine.structured_output import StructuredOutputSpec
from engine.tokenizer import Tokenizer
from server.api.protocol import ChatCompletionRequest, CompletionRequest
from server.translate.bad_words import bad_words_token_ids
from server.translate.choices import Constraints, SubRequest, fan_out
from server.translate.fields import check_fields, check_priority
from server.translate.prompts import (
    PromptInput,
    check_fan_out,
    check_prompt_items,
    encode_prompts,
    render_chat,
    split_prompts,
    template_kwargs,
)
from server.translate.structured import spec_from_request
from server.translate.thinking_budget import Markers, thinking_budget
from server.translate.tool_prompt import render_chat_with_tools, tool_spec, uses_tools
from server.translate.user_text import plain_text_encoder

CompileGrammar = Callable[[StructuredOutputSpec], None]


@dataclass(frozen=True)
class Plan:
    """What the checks before tokenizing found: the completion prompts (none for a chat),
    and how many sequences the request runs (prompts x n)."""

    num_seqs: int
    prompts: list[str | list[int]] = field(default_factory=list)


@dataclass
class EngineRequests:
    """One HTTP request's choices, ready for the engine."""

    prompts: list[PromptInput]
    subs: list[SubRequest]


def check_completion(request_id: str, body: CompletionRequest, limits: RequestLimits,
                     config: EngineConfig) -> Plan:
    check_fields(request_id, body)
    check_priority(body.priority, config.scheduling_policy)
    items = split_prompts(body.prompt)
    check_fan_out(len(items), body.n, limits)
    check_prompt_items(items, limits)
    return Plan(len(items) * body.n, items)


def check_chat(request_id: str, body: ChatCompletionRequest, limits: RequestLimits,
               config: EngineConfig) -> Plan:
    check_fields(request_id, body)
    check_priority(body.priority, config.scheduling_policy)
    check_fan_out(1, body.n, limits)
    return Plan(body.n)


def completion_requests(request_id: str, body: CompletionRequest, plan: Plan,
                        tokenizer: Tokenizer, limits: RequestLimits,
                        compile_grammar: CompileGrammar) -> EngineRequests:
    prompts = encode_prompts(tokenizer, plan.prompts)
    spec = spec_from_request(body)
    if spec is not None:
        compile_grammar(spec)
    # An explicit null means "up to the context" (check_prompt resolves it); 0 (echo): one
    # token is computed, none is returned.
    max_tokens = None if body.max_tokens is None else body.max_tokens or 1
    constraints = Constraints(spec, body.priority, body.wanted_prompt_logprobs(),
                              bad_words=bad_words_token_ids(body.bad_words, tokenizer))
    subs = fan_out(request_id, prompts, body, max_tokens, body.logprobs, constraints, limits)
    return EngineRequests(prompts, subs)


def render_chat_prompt(body: ChatCompletionRequest, tokenizer: Tokenizer,
                       limits: RequestLimits) -> PromptInput:
    """The chat rendered with the model's template, tools included; what the chat runs and
    what /v1/messages/count_tokens counts."""
    encoder = plain_text_encoder(tokenizer)
    extra = template_kwargs(body.chat_template_kwargs, body.reasoning_effort)
    if uses_tools(body.messages, body.tools):
        return render_chat_with_tools(tokenizer, encoder, body.messages, body.tools, limits,
                                      body.add_generation_prompt, body.continue_final_message,
                                      extra)
    return render_chat(tokenizer, encoder, body.messages, limits, body.add_generation_prompt,
                       body.continue_final_message, extra)


def chat_requests(request_id: str, body: ChatCompletionRequest, tokenizer: Tokenizer,
                  limits: RequestLimits, compile_grammar: CompileGrammar,
                  grammar_start: str = "", keep_special_tokens: bool = True,
                  clamp_max_tokens: bool = False,
                  default_max_tokens: int | None = None,
                  thinking_markers: Markers | None = None) -> EngineRequests:
    """`grammar_start`: the marker after which structured outputs apply (the reasoning's end
    when this request reasons first; "" from the first token). `keep_special_tokens`: the
    tool-call format's markers are special tokens, which the output must keep when it is
    parsed for calls (as vLLM's parsers ask for). `clamp_max_tokens`: max_tokens is a
    ceiling that may exceed what the context leaves (Anthropic's and the Responses API's
    agents send their model's whole output budget), so it is cut to fit instead of refused.
    `default_max_tokens`: the limit of a request that sets none (--default-max-tokens).
    `thinking_markers`: the tags of this request's thinking (None when it does not think),
    which its thinking budget forces the end of."""
    prompt = render_chat_prompt(body, tokenizer, limits)
    spec = tool_spec(body) or spec_from_request(body)
    if spec is not None and grammar_start:
        spec = spec.starting_after(grammar_start)  # the reasoning is left free
    if spec is not None:
        compile_grammar(spec)
    if body.tool_mode() is not None and keep_special_tokens:
        body = body.model_copy(update={"skip_special_tokens": False})
    # None of them: whatever the context leaves (check_prompt resolves None).
    given = body.max_completion_tokens or body.max_tokens
    max_tokens = given or default_max_tokens
    if max_tokens is not None and (clamp_max_tokens or given is None):
        room = limits.max_model_len - len(prompt.token_ids)
        max_tokens = min(max_tokens, room) if room > 0 else max_tokens
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    budget = thinking_budget(body.thinking_token_budget, thinking_markers, tokenizer, prompt.text)
    subs = fan_out(request_id, [prompt], body, max_tokens, logprobs,
                   Constraints(spec, body.priority, thinking_budget=budget,
                               bad_words=bad_words_token_ids(body.bad_words, tokenizer)), limits)
    return EngineRequests([prompt], subs)
