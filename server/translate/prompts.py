"""Turning request prompts and chat messages into token ids. These functions are
synchronous and CPU-bound: the routes run them in the worker pool (server/runtime/worker_pool.py).
Limits (vocabulary, context, characters) come from the engine's RequestLimits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.request_limits import RequestLimits, check_prompt_chars, check_token_ids, too_many
from engine.tokenizer import Tokenizer
from server.api.errors import bad_request
from server.api.protocol import ChatMessage, Prompt
from server.translate.user_text import PlainTextEncoder, encode_chat


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


def check_fan_out(num_prompts: int, n: int, limits: RequestLimits) -> None:
    """Refuse a fan-out over the server's caps before any prompt is tokenized."""
    caps = limits.caps
    if n > caps.max_n:
        raise too_many("n", n, caps.max_n, "max-n", "n")
    if num_prompts * n > caps.max_seqs_per_request:
        raise too_many(f"sequences in one request ({num_prompts} prompts x n={n})",
                       num_prompts * n, caps.max_seqs_per_request, "max-seqs-per-request", "n")


def check_prompt_items(items: list[str | list[int]], limits: RequestLimits) -> None:
    """Cheap checks before any tokenizing: emptiness, characters, vocabulary."""
    for item in items:
        if not item:
            raise bad_request("prompt must not be empty", "prompt")
        if isinstance(item, str):
            check_prompt_chars(item, limits)
        else:
            check_token_ids(item, limits, "prompt")


def encode_prompts(tokenizer: Tokenizer, items: list[str | list[int]]) -> list[PromptInput]:
    inputs: list[PromptInput] = []
    for item in items:
        if isinstance(item, str):
            inputs.append(PromptInput(tokenizer.encode(item, add_special_tokens=True), item))
        else:
            inputs.append(PromptInput(list(item), tokenizer.decode(item)))
    return inputs


def message_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: text content flattened to a string."""
    rendered = []
    for i, message in enumerate(messages):
        content = message.content
        if isinstance(content, list):
            parts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise bad_request(f"messages[{i}]: only text content is supported",
                                      "messages")
                parts.append(part.text)
            content = "\n".join(parts)
        item: dict[str, Any] = {"role": message.role, "content": content or ""}
        if message.name:
            item["name"] = message.name
        rendered.append(item)
    return rendered


# Names that apply_chat_template or the render itself sets: a request may not pass them
# as template variables.
RESERVED_TEMPLATE_KWARGS = frozenset({
    "messages", "conversation", "tools", "documents", "add_generation_prompt",
    "continue_final_message", "tokenize", "return_dict", "return_tensors", "padding",
    "truncation", "max_length", "chat_template", "tokenizer_kwargs",
    "return_assistant_tokens_mask"})


def template_kwargs(chat_template_kwargs: dict[str, Any] | None,
                    reasoning_effort: str | None = None) -> dict[str, Any]:
    """The request's extra template variables. As vLLM, a reasoning_effort without an
    explicit enable_thinking sets it (off for "none")."""
    kwargs = dict(chat_template_kwargs or {})
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & kwargs.keys())
    if reserved:
        raise bad_request(f"chat_template_kwargs may not set {', '.join(reserved)}",
                          "chat_template_kwargs")
    if reasoning_effort is not None and "enable_thinking" not in kwargs:
        kwargs["enable_thinking"] = reasoning_effort != "none"
    return kwargs


def render_chat(tokenizer: Tokenizer, encoder: PlainTextEncoder, messages: list[ChatMessage],
                limits: RequestLimits, add_generation_prompt: bool = True,
                continue_final_message: bool = False,
                extra: dict[str, Any] | None = None) -> PromptInput:
    """Render with the model's chat template (see render_message_dicts); `extra`: the
    request's template variables (template_kwargs)."""
    return render_message_dicts(tokenizer, encoder, message_dicts(messages), limits,
                                add_generation_prompt, continue_final_message, **(extra or {}))


def render_message_dicts(tokenizer: Tokenizer, encoder: PlainTextEncoder, dicts: list[dict[str, Any]],
                         limits: RequestLimits, add_generation_prompt: bool = True,
                         continue_final_message: bool = False,
                         **template_kwargs: Any) -> PromptInput:
    """Render with the model's chat template. The template already writes the special
    tokens, so the text is encoded without adding them a second time; message content is
    encoded as plain text (server/translate/user_text.py)."""
    if not getattr(tokenizer, "chat_template", None):
        raise bad_request("this model has no chat template; use /v1/completions", "messages")
    check_prompt_chars("".join(str(m["content"]) for m in dicts), limits, "messages")
    options = {"add_generation_prompt": add_generation_prompt and not continue_final_message,
               "continue_final_message": continue_final_message, **template_kwargs}
    try:
        text = tokenizer.apply_chat_template(dicts, tokenize=False, **options)
        ids = encode_chat(tokenizer, encoder, dicts, text, **options)
    except Exception as exc:  # jinja raises TemplateError for roles it cannot render
        if getattr(exc, "status", None) == 400:
            raise
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise bad_request(f"cannot render messages with the chat template: "
                          f"{type(exc).__name__}{': ' + reason if reason else ''}",
                          "messages") from exc
    return PromptInput(ids, text)
