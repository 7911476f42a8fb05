"""An Anthropic Messages request as the chat request that the server already runs.

One translation, no second engine path: the system prompt becomes a system turn, `tool_use`
blocks an assistant's tool_calls, `tool_result` blocks `tool` turns (before the rest of
their user turn, as the calls they answer came first), `tools` function tools, and
`tool_choice`, `stop_sequences`, `thinking` and the sampling fields their chat equivalents.
What pagode cannot honour (images, documents, server tools, MCP servers) is refused by name.
Earlier turns' thinking blocks are dropped, as the reasoning models' own templates drop
earlier reasoning.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from server.api.body import describe
from server.api.errors import APIError, bad_request
from server.api.messages_protocol import AnthropicMessage, Block, MessagesInput, MessagesRequest
from server.api.protocol import ChatCompletionRequest
from server.translate.fields import refuse_vllm_extensions

# Fields Anthropic defines whose meaning pagode does not implement, when a value asks for it.
REFUSED_FIELDS = ("mcp_servers", "container")
SKIPPED_BLOCKS = ("thinking", "redacted_thinking")


def chat_from_messages(body: MessagesInput) -> ChatCompletionRequest:
    """The chat request for `body` (a count_tokens body too: no sampling fields then)."""
    refuse_unsupported(body)
    chat: dict[str, Any] = {"model": body.model, "messages": chat_messages(body)}
    chat.update(tool_fields(body))
    chat["chat_template_kwargs"] = {"enable_thinking": thinking_on(body)}
    if thinking_on(body) and body.thinking is not None and body.thinking.budget_tokens:
        chat["thinking_token_budget"] = body.thinking.budget_tokens
    if isinstance(body, MessagesRequest):
        chat.update(sampling_fields(body))
    return validated_chat(chat)


def validated_chat(chat: dict[str, Any]) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:
        message, param = describe(exc)
        raise APIError(400, message, param) from None


def refuse_unsupported(body: MessagesInput) -> None:
    refuse_vllm_extensions(body)
    extra = body.model_extra or {}
    for name in REFUSED_FIELDS:
        if extra.get(name):
            raise bad_request(f"{name} is not supported by this server", name)


def thinking_on(body: MessagesInput) -> bool:
    """Anthropic's models think only when asked; so do the reasoning families here."""
    return body.thinking is not None and body.thinking.type != "disabled"


def sampling_fields(body: MessagesRequest) -> dict[str, Any]:
    fields: dict[str, Any] = {"max_tokens": body.max_tokens, "stream": body.stream}
    for name in ("temperature", "top_p", "top_k", "seed"):
        value = getattr(body, name)
        if value is not None:
            fields[name] = value
    if body.stop_sequences:
        fields["stop"] = body.stop_sequences
    if body.structured_outputs is not None:
        fields["structured_outputs"] = body.structured_outputs.model_dump(by_alias=True,
                                                                          exclude_none=True)
    user = (body.metadata or {}).get("user_id")
    if isinstance(user, str):
        fields["user"] = user
    return fields


def tool_fields(body: MessagesInput) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if body.tools:
        fields["tools"] = [function_tool(i, tool) for i, tool in enumerate(body.tools)]
    choice = body.tool_choice
    if choice is not None:
        if choice.type != "auto" or body.tools:  # chat refuses a forced call without tools
            fields["tool_choice"] = chat_tool_choice(choice.type, choice.name)
        fields["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    return fields


def function_tool(index: int, tool: Any) -> dict[str, Any]:
    if tool.type not in (None, "custom"):
        raise bad_request(f"tools[{index}]: server tools ({tool.type}) are not supported by "
                          "this server; give client tools with an input_schema", "tools")
    function = {"name": tool.name, "parameters": tool.input_schema or {"type": "object"}}
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def chat_tool_choice(kind: str, name: str | None) -> Any:
    if kind == "tool":
        return {"type": "function", "function": {"name": name}}
    return {"auto": "auto", "any": "required", "none": "none"}[kind]


def chat_messages(body: MessagesInput) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    system = system_text(body.system)
    if system:
        turns.append({"role": "system", "content": system})
    for index, message in enumerate(body.messages):
        turns.extend(chat_turns(index, message))
    return turns


def system_text(system: str | list[Block] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    return "\n".join(block_text(block, "system") for block in system)


def block_text(block: Block, where: str) -> str:
    """A text block's text; any other block here is refused."""
    if block.get("type") != "text" or not isinstance(block.get("text"), str):
        raise unsupported_block(block, where)
    return str(block["text"])


def unsupported_block(block: Block, where: str) -> APIError:
    kind = str(block.get("type"))[:40]
    if kind in ("image", "document"):
        return bad_request(f"{where}: {kind} blocks are not supported by this server "
                           "(it reads text only)", "messages")
    return bad_request(f"{where}: a {kind} block cannot stand here", "messages")


def chat_turns(index: int, message: AnthropicMessage) -> list[dict[str, Any]]:
    """One Anthropic turn as chat turns: a user turn's tool results come first, as tool turns."""
    where = f"messages[{index}]"
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for block in message.content:
        kind = block.get("type")
        if kind in SKIPPED_BLOCKS and message.role == "assistant":
            continue
        if kind == "tool_use" and message.role == "assistant":
            calls.append(tool_call(block, where))
        elif kind == "tool_result" and message.role == "user":
            results.append(tool_turn(block, where))
        else:
            texts.append(block_text(block, where))
    turns = list(results)
    if texts or calls or not results:
        turn: dict[str, Any] = {"role": message.role, "content": "\n".join(texts)}
        if calls:
            turn["tool_calls"] = calls
        turns.append(turn)
    return turns


def tool_call(block: Block, where: str) -> dict[str, Any]:
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
        raise bad_request(f"{where}: a tool_use block needs an id and a name", "messages")
    arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": arguments}}


def tool_turn(block: Block, where: str) -> dict[str, Any]:
    if not isinstance(block.get("tool_use_id"), str):
        raise bad_request(f"{where}: a tool_result block needs a tool_use_id", "messages")
    content = block.get("content", "")
    if isinstance(content, list):
        content = "\n".join(block_text(part, where) for part in content)
    elif not isinstance(content, str):
        raise bad_request(f"{where}: a tool_result's content is text or text blocks", "messages")
    if block.get("is_error"):
        content = f"Error: {content}"  # the model sees that the call failed
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": content}
