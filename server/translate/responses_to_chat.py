"""An OpenAI Responses request as the chat request that the server already runs.

One translation, no second engine path: `instructions` become a system turn, input items
chat turns (a `function_call` an assistant's tool call, a `function_call_output` a `tool`
turn), function tools chat tools, `text.format` a response_format, `reasoning.effort` chat's
reasoning_effort (the family's thinking switch), `max_output_tokens` max_tokens. A stored
conversation (`previous_response_id`) is replayed in front of the new input. Earlier
reasoning items are dropped, as the reasoning models' templates drop earlier reasoning;
images, files and built-in tools are refused by name.
"""

from __future__ import annotations

from typing import Any

from server.api.errors import bad_request
from server.api.protocol import ChatCompletionRequest
from server.api.responses_protocol import Item, ResponsesRequest
from server.translate.fields import refuse_vllm_extensions
from server.translate.messages_to_chat import validated_chat

TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
SKIPPED_ITEMS = ("reasoning",)
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
# Fields of the Responses API whose meaning pagode does not implement, when a value asks for it.
REFUSED_FIELDS = ("conversation", "prompt", "top_logprobs", "max_tool_calls")


def input_items(body: ResponsesRequest) -> list[Item]:
    """The request's input as a list of items (a string is one user message)."""
    if isinstance(body.input, str):
        return [{"type": "message", "role": "user", "content": body.input}]
    return list(body.input)


def chat_from_responses(body: ResponsesRequest, conversation: list[Item]) -> ChatCompletionRequest:
    """The chat request for `body`, whose whole conversation (stored history, then this
    request's input) is `conversation`."""
    if body.background:
        raise bad_request("background responses are not supported by this server", "background")
    refuse_vllm_extensions(body)
    extra = body.model_extra or {}
    for name in REFUSED_FIELDS:
        if extra.get(name):
            raise bad_request(f"{name} is not supported by this server", name)
    turns = [{"role": "system", "content": body.instructions}] if body.instructions else []
    for index, item in enumerate(conversation):
        add_item(turns, item, f"input[{index}]")
    chat: dict[str, Any] = {"model": body.model, "messages": turns, "stream": body.stream,
                            "parallel_tool_calls": body.parallel_tool_calls}
    chat.update(tool_fields(body))
    chat.update(sampling_fields(body))
    return validated_chat(chat)


def sampling_fields(body: ResponsesRequest) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name in ("temperature", "top_p", "user", "seed"):
        value = getattr(body, name)
        if value is not None:
            fields[name] = value
    if body.max_output_tokens is not None:
        fields["max_tokens"] = body.max_output_tokens
    if body.reasoning is not None and body.reasoning.effort is not None:
        effort = body.reasoning.effort
        fields["reasoning_effort"] = "high" if effort == "xhigh" else effort
    if body.structured_outputs is not None:
        fields["structured_outputs"] = body.structured_outputs.model_dump(by_alias=True,
                                                                          exclude_none=True)
    fmt = body.text.format if body.text is not None else None
    if fmt is not None and fmt.type != "text":
        fields["response_format"] = response_format(fmt.type, fmt.name, fmt.json_schema, fmt.strict)
    return fields


def response_format(kind: str, name: str, schema: dict[str, Any] | None,
                    strict: bool | None) -> dict[str, Any]:
    if kind == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                   "strict": strict}}


def tool_fields(body: ResponsesRequest) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if body.tools:
        fields["tools"] = [function_tool(i, tool) for i, tool in enumerate(body.tools)]
    if body.tool_choice is not None:
        choice = chat_tool_choice(body.tool_choice)  # refused when it names no function
        if body.tools or choice != "auto":  # chat refuses a forced call without tools
            fields["tool_choice"] = choice
    return fields


def function_tool(index: int, tool: Item) -> dict[str, Any]:
    kind = str(tool.get("type"))[:40]
    if kind != "function":
        raise bad_request(f"tools[{index}]: {kind} tools are not supported by this server; "
                          "give function tools", "tools")
    if not isinstance(tool.get("name"), str):
        raise bad_request(f"tools[{index}]: a function tool needs a name", "tools")
    function = {key: tool[key] for key in ("name", "description", "parameters", "strict")
                if tool.get(key) is not None}
    return {"type": "function", "function": function}


def chat_tool_choice(choice: str | Item) -> Any:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if choice.get("type") == "allowed_tools":
        raise bad_request("tool_choice of type allowed_tools is not supported by this server",
                          "tool_choice")
    raise bad_request(f"tool_choice {str(choice.get('type'))[:40]!r} names no function tool",
                      "tool_choice")


def add_item(turns: list[dict[str, Any]], item: Item, where: str) -> None:
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        turns.append(message_turn(item, where))
    elif kind == "function_call":
        add_call(turns, item, where)
    elif kind == "function_call_output":
        turns.append(output_turn(item, where))
    elif kind not in SKIPPED_ITEMS:
        raise bad_request(f"{where}: input items of type {str(kind)[:40]!r} are not supported "
                          "by this server", "input")


def message_turn(item: Item, where: str) -> dict[str, Any]:
    role = ROLES.get(str(item.get("role")))
    if role is None:
        raise bad_request(f"{where}: role must be one of {', '.join(ROLES)}", "input")
    return {"role": role, "content": content_text(item.get("content"), where)}


def content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}: content is a string or a list of parts", "input")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            raise bad_request(f"{where}: {str(kind)[:40]} content is not supported by this "
                              "server (it reads text only)", "input")
        texts.append(str(part.get("text") or part.get("refusal") or ""))
    return "\n".join(texts)


def add_call(turns: list[dict[str, Any]], item: Item, where: str) -> None:
    """A function call joins the assistant turn before it, as parallel calls are one turn."""
    if not isinstance(item.get("call_id"), str) or not isinstance(item.get("name"), str):
        raise bad_request(f"{where}: a function_call needs a call_id and a name", "input")
    call = {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": str(item.get("arguments") or "{}")}}
    if turns and turns[-1]["role"] == "assistant":
        turns[-1].setdefault("tool_calls", []).append(call)
    else:
        turns.append({"role": "assistant", "content": "", "tool_calls": [call]})


def output_turn(item: Item, where: str) -> dict[str, Any]:
    if not isinstance(item.get("call_id"), str):
        raise bad_request(f"{where}: a function_call_output needs a call_id", "input")
    return {"role": "tool", "tool_call_id": item["call_id"],
            "content": content_text(item.get("output", ""), where)}
