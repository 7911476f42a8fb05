"""Running one chat request, from its parsed body to the running choices and the builder
that reads their output. /v1/chat/completions, /v1/messages and /v1/responses all come
through here (the last two translated into a chat request first), so that every dialect
gets the same admission, template, tool calls, reasoning split, grammars and limits."""

from __future__ import annotations

from server.api.protocol import ChatCompletionRequest
from server.respond.builders import ChatBuilder
from server.respond.chat_format import ChatFormat, chat_format
from server.runtime.generation import ChoiceStream
from server.runtime.state import ServerState
from server.translate.engine_requests import chat_requests, check_chat
from server.worker_pool import run_blocking


async def start_chat(state: ServerState, body: ChatCompletionRequest, request_id: str,
                     clamp_max_tokens: bool = False) -> tuple[ChoiceStream, ChatBuilder]:
    """Admit, translate and start the request; the caller sends what the builder makes of it.
    `clamp_max_tokens`: see chat_requests."""
    admitted = state.admit(body.model, lambda engine: check_chat(
        request_id, body, engine.limits, engine.config))
    engine = admitted.engine
    fmt = served_format(state, engine.tokenizer.chat_template)
    requests = await run_blocking(chat_requests, request_id, body, engine.tokenizer,
                                  engine.limits, engine.compile_grammar, fmt.grammar_start(body),
                                  fmt.tools().keeps_special_tokens, clamp_max_tokens,
                                  state.settings.default_max_tokens, fmt.thinking_markers(body))
    builder = ChatBuilder(request_id, state.name_for(body.model), requests.prompts[0], body, fmt)
    return admitted.start_choices(requests.subs), builder


def served_format(state: ServerState, template: str | None) -> ChatFormat:
    settings = state.settings
    return chat_format(settings.tool_call_parser, settings.reasoning_parser, template,
                       settings.structured_outputs_in_reasoning)
