"""The tool-call parser and streamer on model-like outputs, and the generic rendering."""

from __future__ import annotations

import json

import pytest

from engine.request_limits import RequestLimits
from server.api.protocol import ChatCompletionRequest
from server.respond.tool_calls import ToolCallStream
from server.translate.tool_prompt import render_chat_with_tools
from server.translate.user_text import PlainTextEncoder


def stream(mode: str, text: str, name: str | None = None, step: int = 2) -> tuple[str, dict]:
    parser = ToolCallStream(mode, name)  # type: ignore[arg-type]
    content, calls = "", {}
    pieces = [text[i:i + step] for i in range(0, len(text), step)] + [""]
    for i, piece in enumerate(pieces):
        shown, deltas = parser.feed(piece, i == len(pieces) - 1)
        content += shown
        for d in deltas:
            if d.function.name:
                assert d.id and d.index not in calls
                calls[d.index] = [d.function.name, ""]
            calls[d.index][1] += d.function.arguments or ""
    return content, calls


@pytest.mark.parametrize("step", [1, 3, 7])
def test_hermes_blocks_stream_and_parse(step: int) -> None:
    text = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa}ris",'
            ' "days": [1, 23], "deep": {"x": true}}}\n</tool_call>\n<tool_call>\n'
            '{"name": "get_time", "arguments": {}}\n</tool_call>')
    content, calls = stream("auto", text, step=step)
    assert content == "Let me check. "
    assert calls[0][0] == "get_weather" and calls[1] == ["get_time", "{}"]
    assert json.loads(calls[0][1]) == {"city": "Pa}ris", "days": [1, 23], "deep": {"x": True}}
    content_whole, tool_calls, finish = ToolCallStream("auto").result(text, "stop")
    assert finish == "tool_calls" and content_whole == content  # streamed and whole agree
    assert [c.function.arguments for c in tool_calls] == [calls[0][1], "{}"]


def test_plain_text_and_generic_json() -> None:
    assert stream("auto", "Hello <tool there")[0] == "Hello <tool there"
    content, calls = stream("auto", '{"name": "f", "arguments": {"a": 1}}')
    assert content == "" and calls == {0: ["f", '{"a": 1}']}


def test_required_array_and_length() -> None:
    text = '[{"name": "a", "parameters": {"q": "x"}}, {"name": "b", "parameters": {"n": 5}}]'
    assert stream("required", text)[1] == {0: ["a", '{"q": "x"}'], 1: ["b", '{"n": 5}']}
    content, calls, finish = ToolCallStream("required").result(text[:20], "length")
    assert finish == "length" and calls == [] and content == text[:20]


def test_generic_rendering_of_tool_turns(default_model_path: str) -> None:
    from engine.model.loader import load_tokenizer, resolve_model

    tokenizer = load_tokenizer(resolve_model(default_model_path))
    body = ChatCompletionRequest.model_validate({"messages": [
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}}]})
    limits = RequestLimits(vocab_size=len(tokenizer), max_model_len=2048, max_prompt_tokens=2048)
    text = render_chat_with_tools(tokenizer, PlainTextEncoder(tokenizer), body.messages,
                                  body.tools, limits).text
    assert '"name": "get_weather"' in text and "<tools>" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>' in text
    assert "<tool_response>\nsunny\n</tool_response>" in text


def test_tool_prompt_heads_the_user_turn_where_the_template_has_no_system_turn(
        default_model_path: str) -> None:
    """Gemma 2's template raises on a system turn: the generic tool prompt goes at the head of
    the first user turn instead of failing the request."""
    import copy
    from pathlib import Path

    from engine.model.loader import load_tokenizer, resolve_model

    tokenizer = copy.copy(load_tokenizer(resolve_model(default_model_path)))
    tokenizer.chat_template = (Path(__file__).with_name("chat_templates") / "gemma2.jinja").read_text()
    body = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "Weather in Rome?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather"}}]})
    limits = RequestLimits(vocab_size=len(tokenizer), max_model_len=2048, max_prompt_tokens=2048)
    text = render_chat_with_tools(tokenizer, PlainTextEncoder(tokenizer), body.messages,
                                  body.tools, limits).text
    assert text.startswith(f"{tokenizer.bos_token}<start_of_turn>user\nYou can call functions.")
    assert text.endswith("</tools>\n\nWeather in Rome?<end_of_turn>\n<start_of_turn>model\n")
