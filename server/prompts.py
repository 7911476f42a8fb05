"""Turning request prompts and chat messages into token ids, and checking them against
the context, with vLLM's wording so that clients that parse these messages keep working."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from server.errors import bad_request
from server.protocol import ChatMessage, Prompt


@dataclass
class PromptInput:
    token_ids: list[int]
    text: str  # what `echo` returns, and what --log-requests-text logs


def is_token_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) for t in value)


def split_prompts(prompt: Prompt) -> list[str | list[int]]:
    """A completions prompt is one string, a list of strings, a token list, or a batch of
    token lists; return the batch."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise bad_request("prompt must not be empty", "prompt")
    if is_token_list(prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    return list(prompt)  # type: ignore[arg-type]


def encode_prompts(tokenizer: Any, prompt: Prompt) -> list[PromptInput]:
    inputs: list[PromptInput] = []
    vocab_size = len(tokenizer)
    for item in split_prompts(prompt):
        if isinstance(item, str):
            if not item:
                raise bad_request("prompt must not be empty", "prompt")
            inputs.append(PromptInput(tokenizer.encode(item, add_special_tokens=True), item))
        else:
            check_token_ids(item, vocab_size, "prompt")
            inputs.append(PromptInput(list(item), tokenizer.decode(item)))
    return inputs


def check_token_ids(token_ids: list[int], vocab_size: int, param: str) -> None:
    if not token_ids:
        raise bad_request(f"{param} must not be empty", param)
    bad = [t for t in token_ids if not 0 <= t < vocab_size]
    if bad:
        raise bad_request(f"token ids out of the vocabulary [0, {vocab_size}): {bad[:5]}", param)


def message_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: text content flattened to a string."""
    rendered = []
    for i, message in enumerate(messages):
        content = message.content
        if isinstance(content, list):
            parts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise bad_request(f"messages[{i}]: only text content is supported, "
                                      f"got a {part.type!r} part", "messages")
                parts.append(part.text)
            content = "\n".join(parts)
        item: dict[str, Any] = {"role": message.role, "content": content or ""}
        if message.name:
            item["name"] = message.name
        rendered.append(item)
    return rendered


def render_chat(tokenizer: Any, messages: list[ChatMessage], add_generation_prompt: bool = True,
                continue_final_message: bool = False) -> PromptInput:
    """Render with the model's chat template. The template already writes the special
    tokens, so the text is encoded without adding them a second time."""
    if not getattr(tokenizer, "chat_template", None):
        raise bad_request("this model has no chat template; use /v1/completions", "messages")
    try:
        text = tokenizer.apply_chat_template(
            message_dicts(messages), add_generation_prompt=add_generation_prompt and not
            continue_final_message, continue_final_message=continue_final_message,
            tokenize=False)
    except Exception as exc:  # jinja raises TemplateError for roles it cannot render
        raise bad_request(f"cannot render messages with the chat template: {exc}",
                          "messages") from exc
    return PromptInput(tokenizer.encode(text, add_special_tokens=False), text)


def check_context(num_prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> None:
    if num_prompt_tokens >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {num_prompt_tokens} input tokens. Please reduce the length of the "
            "input messages.", "input_tokens")
    if max_tokens is not None and num_prompt_tokens + max_tokens > max_model_len:
        raise bad_request(
            f"'max_tokens' is too large: {max_tokens}. This model's maximum context length "
            f"is {max_model_len} tokens and your request has {num_prompt_tokens} input tokens "
            f"({max_tokens} > {max_model_len} - {num_prompt_tokens}).", "max_tokens")
