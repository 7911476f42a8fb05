"""Tool calling: rendering tools and tool turns into the prompt, forcing calls with a
grammar, and turning the model's output into OpenAI `tool_calls`, whole or streamed.

- Rendering. A chat template that knows tools gets them (`tools=`) and the turns as they
  are. A template that does not (the default model's ChatML) gets llama-server's "generic"
  treatment: the tools are described in the system prompt with the reply format, an
  assistant's earlier calls become `<tool_call>{...}</tool_call>` blocks, and a `tool`
  turn becomes a user turn wrapped in `<tool_response>`.
- `tool_choice`: "required" forces a JSON array of {"name", "parameters"} (one item when
  parallel_tool_calls is false) and a named function forces its `parameters` schema, both
  through structured outputs, so even a small model returns valid arguments. "auto" lets the
  model write Hermes `<tool_call>` blocks (or one bare generic JSON call), parsed after.
- Streaming: each call's first delta carries index, id, type and name with arguments "";
  later deltas carry argument fragments. Fragments come from partial-json-parser: the
  arguments parsed so far (incomplete strings and numbers left out), serialised, minus the
  closing brackets that the parser added, which is always a prefix of the final arguments.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import partial_json_parser
from partial_json_parser import Allow

from engine.request_limits import RequestLimits
from engine.structured_output import StructuredOutputSpec
from server.prompts import PromptInput, message_dicts, render_message_dicts
from server.protocol import (
    ChatCompletionRequest,
    DeltaFunctionCall,
    DeltaToolCall,
    FunctionCall,
    NamedToolChoice,
    ToolCall,
    ToolDefinition,
)
from server.user_text import PlainTextEncoder

CALL_START, CALL_END = "<tool_call>", "</tool_call>"
PARTIAL = Allow.OBJ | Allow.ARR  # containers may be open; strings, numbers, literals complete
Mode = Literal["auto", "required", "named"]
EMPTY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


# ---- rendering ---------------------------------------------------------------------------

def uses_tools(body: ChatCompletionRequest) -> bool:
    return bool(body.tools) or any(m.tool_calls or m.role == "tool" for m in body.messages)


def template_supports_tools(tokenizer: Any) -> bool:
    return "tools" in str(getattr(tokenizer, "chat_template", "") or "")


def render_chat_with_tools(tokenizer: Any, encoder: PlainTextEncoder,
                           body: ChatCompletionRequest, limits: RequestLimits) -> PromptInput:
    """The chat with its tool definitions, calls and results: through the template where it
    knows tools, else as a generic system prompt and <tool_call> blocks."""
    native = template_supports_tools(tokenizer)
    messages = message_dicts(body.messages)
    for item, message in zip(messages, body.messages, strict=True):
        if native:
            add_native_tool_fields(item, message.tool_calls, message.tool_call_id)
        else:
            rewrite_generic(item, message.tool_calls)
    tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
    kwargs: dict[str, Any] = {}
    if native and tools:
        kwargs["tools"] = tools
    elif tools:
        messages = with_tool_system_prompt(messages, body.tools or [])
    return render_message_dicts(tokenizer, encoder, messages, limits, body.add_generation_prompt,
                                body.continue_final_message, **kwargs)


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


def with_tool_system_prompt(messages: list[dict[str, Any]],
                            tools: list[ToolDefinition]) -> list[dict[str, Any]]:
    prompt = tool_system_prompt(tools)
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

def tool_mode(body: ChatCompletionRequest) -> tuple[Mode, str | None] | None:
    """(mode, function name) when the output is parsed for calls; None for plain content."""
    choice = body.effective_tool_choice()
    if isinstance(choice, NamedToolChoice):
        return "named", choice.function.name
    if choice in ("auto", "required") and body.tools:
        return choice, None  # type: ignore[return-value]
    return None


def tool_spec(body: ChatCompletionRequest) -> StructuredOutputSpec | None:
    """The grammar that forces "required" and named tool choices."""
    mode = tool_mode(body)
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


# ---- parsing, whole and streamed -----------------------------------------------------------

def new_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def parse_partial(text: str) -> Any:
    if not text.strip():
        return None
    try:
        return partial_json_parser.loads(text, PARTIAL)
    except Exception:  # noqa: BLE001 - malformed output is not a call
        return None


def parse_whole(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def stable_prefix(serialised: str) -> str:
    """Drop the closing brackets that completing a partial parse added."""
    return serialised.rstrip("}]")


def held_back(content: str) -> int:
    """How many trailing characters might be the start of CALL_START."""
    for size in range(min(len(content), len(CALL_START) - 1), 0, -1):
        if CALL_START.startswith(content[-size:]):
            return size
    return 0


@dataclass
class CallState:
    id: str = field(default_factory=new_call_id)
    name_sent: bool = False
    arguments_sent: str = ""


class ToolCallStream:
    """One choice's output, fed as it grows; knows its content and its calls."""

    def __init__(self, mode: Mode, name: str | None = None) -> None:
        self.mode = mode
        self.name = name
        self.text = ""
        self.content_sent = ""
        self.calls: list[CallState] = []

    # What the output says so far: visible content and [(name, arguments value)].
    def extract(self, final: bool) -> tuple[str, list[tuple[str | None, Any]]]:
        parse = parse_whole if final else parse_partial
        if self.mode == "named":
            return "", [(self.name, parse(self.text))]
        if self.mode == "required":
            value = parse(self.text)
            items = value if isinstance(value, list) else []
            return "", [item_call(item, "parameters") for item in items if isinstance(item, dict)]
        return self.extract_auto(final)

    def extract_auto(self, final: bool) -> tuple[str, list[tuple[str | None, Any]]]:
        content, _, rest = self.text.partition(CALL_START)
        if not rest and CALL_START not in self.text:
            if final:
                generic = generic_calls(content)
                return ("", generic) if generic else (content, [])
            if content.lstrip().startswith("{"):
                return "", []  # perhaps a generic JSON call: decided at the end
            return content[:len(content) - held_back(content)], []
        calls = []
        for block in rest.split(CALL_START):
            body, closed, _ = block.partition(CALL_END)
            value = parse_whole(body) if (closed or final) else parse_partial(body)
            if isinstance(value, dict):
                calls.append(item_call(value, "arguments"))
        return content.rstrip(), calls

    def feed(self, text: str, final: bool) -> tuple[str, list[DeltaToolCall]]:
        """Add new output; return the content to show and the call deltas to send."""
        self.text += text
        content, calls = self.extract(final)
        new_content = content[len(self.content_sent):] if content.startswith(
            self.content_sent) else ""
        self.content_sent += new_content
        return new_content, self.call_deltas(calls, final)

    def call_deltas(self, calls: list[tuple[str | None, Any]], final: bool) -> list[DeltaToolCall]:
        deltas = []
        for index, (name, arguments) in enumerate(calls):
            if name is None:
                continue
            if index == len(self.calls):
                self.calls.append(CallState())
            state = self.calls[index]
            delta = DeltaToolCall(index=index, function=DeltaFunctionCall())
            if not state.name_sent:
                state.name_sent = True
                delta.id, delta.type = state.id, "function"
                delta.function.name, delta.function.arguments = name, ""
            if arguments is not None:
                target = dumps(arguments)
                target = target if final else stable_prefix(target)
                if target.startswith(state.arguments_sent) and len(target) > len(
                        state.arguments_sent):
                    delta.function.arguments = (delta.function.arguments or "") + target[
                        len(state.arguments_sent):]
                    state.arguments_sent = target
            if delta.id is not None or delta.function.arguments:
                deltas.append(delta)
        return deltas

    def result(self, text: str, finish_reason: str | None) -> tuple[str | None, list[ToolCall], str | None]:
        """Non-streaming: (content, calls, finish_reason) of the whole output `text`."""
        self.text = text
        content, calls = self.extract(final=True)
        if finish_reason == "length" or not calls or any(a is None for _, a in calls):
            return self.text, [], finish_reason
        tool_calls = [ToolCall(id=new_call_id(), function=FunctionCall(
            name=name or "", arguments=dumps(arguments))) for name, arguments in calls]
        return content or None, tool_calls, self.finish_reason(finish_reason)

    def finish_reason(self, reason: str | None) -> str | None:
        if reason == "stop" and self.mode != "named" and (self.calls or self.extract(True)[1]):
            return "tool_calls"
        return reason


def item_call(item: dict[str, Any], key: str) -> tuple[str | None, Any]:
    name = item.get("name")
    arguments = item.get(key, item.get("arguments" if key == "parameters" else "parameters"))
    return (name if isinstance(name, str) else None), arguments


def generic_calls(content: str) -> list[tuple[str | None, Any]]:
    """llama-server's generic form: {"tool_call": {...}}, {"tool_calls": [...]} or one call."""
    value = parse_whole(content.strip())
    if not isinstance(value, dict):
        return []
    if isinstance(value.get("tool_calls"), list):
        items = value["tool_calls"]
    elif isinstance(value.get("tool_call"), dict):
        items = [value["tool_call"]]
    elif "name" in value and "arguments" in value:
        items = [value]
    else:
        return []
    return [item_call(i, "arguments") for i in items if isinstance(i, dict)]
