"""/tokenize and /detokenize bodies, answered with the model's tokenizer: chat messages, with
their tools, tool calls and tool results, tokenize exactly as the chat route renders them
(content stays plain text), and every input is checked against the engine's limits first.
CPU-bound: the routes run these in the worker pool."""

from __future__ import annotations

from engine.request_limits import RequestLimits, check_prompt_chars, check_token_ids
from engine.tokenizer import Tokenizer
from server.api.errors import bad_request
from server.api.protocol import DetokenizeRequest, TokenizeRequest
from server.translate.prompts import render_chat, template_kwargs
from server.translate.tool_prompt import render_chat_with_tools, uses_tools
from server.translate.user_text import plain_text_encoder


def tokenize_body(body: TokenizeRequest, tokenizer: Tokenizer, limits: RequestLimits) -> list[int]:
    if body.messages is not None:
        encoder = plain_text_encoder(tokenizer)
        extra = template_kwargs(body.chat_template_kwargs)
        if uses_tools(body.messages, body.tools):
            return render_chat_with_tools(tokenizer, encoder, body.messages, body.tools or None,
                                          limits, body.add_generation_prompt,
                                          extra=extra).token_ids
        return render_chat(tokenizer, encoder, body.messages, limits,
                           body.add_generation_prompt, extra=extra).token_ids
    text = body.prompt or ""
    check_prompt_chars(text, limits)
    add_special = True if body.add_special_tokens is None else body.add_special_tokens
    return list(tokenizer.encode(text, add_special_tokens=add_special))


def detokenize_body(body: DetokenizeRequest, tokenizer: Tokenizer, limits: RequestLimits) -> str:
    check_token_ids(body.tokens, limits, "tokens")
    if len(body.tokens) > limits.max_prompt_chars:
        raise bad_request("too many tokens to detokenize", "tokens")
    return str(tokenizer.decode(body.tokens))
