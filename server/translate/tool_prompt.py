"""Tool calling, the prompt side: rendering tools and tool turns into the prompt and forcing
calls with a grammar. Parsing the model's output into `tool_calls` is
server/respond/tool_calls.py.

- Rendering. A chat template that knows tools gets them (`tools=`) and the turns as they
  are. A template that does not (the default model's ChatML) gets llama-server's "generic"
  treatment: the tools are described in the system prompt with the reply format (at the
  head of the first user turn where the template renders no system turn), an assistant's
  earlier calls become `<tool_call>{...}</tool_call>` blocks, and a `tool` turn becomes a
  user turn wrapped in `<tool_response>`.
- `tool_choice`: "required" forces a JSON array of {"name", "parameters"} (one item when
  parallel_tool_calls is false) and a named function forces its `parameters` schema, both
  through structured outputs, so even a small model returns valid arguments. "auto" lets the
  model write calls in its own format, parsed after by the server's tool-call parser
  (respond/tool_parsers/); the generic prompt asks for Hermes blocks, which is what `auto`
  picks for a template that knows no tools.
"""

from __future__ import annotations

import json
from typing import Any

from engine.request_limits import RequestLimits
from engine.structured_output import StructuredOutputSpec
from engine.tokenizer import Tokenizer
from server.api.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    ToolCall,
    ToolDefinition,
)
from server.api.tool_markup import CALL_END, CALL_START
from server.translate.prompts import PromptInput, message_dicts, render_message_dicts
from server.translate.system_role import fold_into_first_user, takes_system_turn
from server.translate.user_text import PlainTextEncoder

EMPTY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


# ---- rendering ---------------------------------------------------------------------------

def uses_tools(messages: list[ChatMessage], tools: list[ToolDefinition] | None) -> bool:
    return bool(tools) or any(m.tool_calls or m.role == "tool" for m in messages)


def template_supports_tools(tokenizer: Tokenizer) -> bool:
    return "tools" in str(getattr(tokenizer, "chat_template", "") or "")


def render_chat_with_tools(tokenizer: Tokenizer, encoder: PlainTextEncoder,
                           chat: list[ChatMessage], tool_defs: list[ToolDefinition] | None,
                           limits: RequestLimits, add_generation_prompt: bool = True,
                           continue_final_message: bool = False,
                           extra: dict[str, Any] | None = None) -> PromptInput:
    """The chat with its tool definitions, calls and results: through the template where it
    knows tools, else as a generic system prompt and <tool_call> blocks. The chat route and
    /tokenize both render through here, so that /tokenize counts what the chat runs."""
    native = template_supports_tools(tokenizer)
    messages = message_dicts(chat)
    for item, message in zip(messages, chat, strict=True):
        if native:
            add_native_tool_fields(item, message.tool_calls, message.tool_call_id)
        else:
            rewrite_generic(item, message.tool_calls)
    tools = [t.model_dump(exclude_none=True) for t in tool_defs or []]
    kwargs: dict[str, Any] = dict(extra or {})
    if native and tools:
        kwargs["tools"] = tools
    elif tools:
        messages = with_tool_system_prompt(messages, tool_defs or [], takes_system_turn(tokenizer))
    return render_message_dicts(tokenizer, encoder, messages, limits, add_generation_prompt,
                                continue_final_message, **kwargs)


def add_native_tool_fields(item: dict[str, Any], calls: list[ToolCall] | None,
                           call_id: str | None) -> None:
    if calls:
        item["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.function.name, "arguments": loads_or_text(c.function.arguments)}}
            for c in calls]
    if call_id:
        item["tool_call_id"] = call_id


def rewrite_generic(item: dict[str, Any], calls: list[ToolCall] | None) -> None:
    if calls:
        blocks = [f"{CALL_START}\n{call_json(c.function.name, c.function.arguments)}\n{CALL_END}"
                  for c in calls]
        item["content"] = "\n".join(([item["content"]] if item["content"] else []) + blocks)
    if item["role"] == "tool":
        item["role"] = "user"
        item["content"] = f"<tool_response>\n{item['content']}\n</tool_response>"


def with_tool_system_prompt(messages: list[dict[str, Any]], tools: list[ToolDefinition],
                            system_turn: bool = True) -> list[dict[str, Any]]:
    """The tool prompt in the system turn, or in the first user turn for a template that
    renders no system turn (system_role.py)."""
    prompt = tool_system_prompt(tools)
    if not system_turn and not (messages and messages[0]["role"] == "system"):
        return fold_into_first_user(messages, prompt)
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0], content=f"{messages[0]['content']}\n\n{prompt}".strip())
        return [first, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def tool_system_prompt(tools: list[ToolDefinition]) -> str:
    described = "\n".join(json.dumps(t.model_dump(exclude_none=True)["function"],
                                     ensure_ascii=False) for t in tools)
    return ("You can call functions. To call one, reply with a block per call:\n"
            f'{CALL_START}\n{{"name": <function name>, "arguments": <arguments object>}}\n'
            f"{CALL_END}\nThe functions:\n<tools>\n{described}\n</tools>")


def call_json(name: str, arguments: str) -> str:
    return json.dumps({"name": name, "arguments": loads_or_text(arguments)}, ensure_ascii=False)


def loads_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


# ---- forcing calls -----------------------------------------------------------------------

def tool_spec(body: ChatCompletionRequest) -> StructuredOutputSpec | None:
    """The grammar that forces "required" and named tool choices."""
    mode = body.tool_mode()
    if mode is None or mode[0] == "auto":
        return None
    tools = {t.function.name: t.function.parameters or EMPTY_OBJECT_SCHEMA
             for t in body.tools or []}
    if mode[0] == "named":
        assert mode[1] is not None
        return StructuredOutputSpec.json_schema(tools[mode[1]])
    items = [{"type": "object", "properties": {"name": {"type": "string", "enum": [name]},
                                               "parameters": params},
              "required": ["name", "parameters"]} for name, params in tools.items()]
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": items[0] if len(items) == 1 else {"anyOf": items}}
    if not body.parallel_tool_calls:
        schema["maxItems"] = 1
    return StructuredOutputSpec.json_schema(schema)
