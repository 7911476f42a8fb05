"""Every tool-call format's parser on the strings its models write (from vLLM's tests and the
models' chat templates), whole and streamed: split at every character boundary, the stream
adds up to the whole parse. A call written badly comes back as plain text."""

from __future__ import annotations

import json
from typing import Any

import pytest

from server.respond.tool_calls import ToolCallStream
from server.respond.tool_parsers import PARSERS, get_tool_parser, parser_for_template

WEATHER = {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}
NESTED = {"city": "Pa}ri]s", "days": [1, 23], "deep": {"x": True, "y": None}}
W, N = json.dumps(WEATHER), json.dumps(NESTED)
PY_NESTED = {**NESTED, "city": "Pa)ri]s"}  # a `)` in a string does not close a pythonic call

# (parser, output, expected content, expected [(name, arguments)])
CASES: list[tuple[str, str, str | None, list[tuple[str, Any]]]] = [
    ("hermes", f'<tool_call>\n{{"name": "get_current_weather", "arguments": {W}}}\n</tool_call>',
     None, [("get_current_weather", WEATHER)]),
    ("hermes", f'Let me check. <tool_call>\n{{"name": "a", "arguments": {N}}}\n</tool_call>\n'
     '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>',
     "Let me check. ", [("a", NESTED), ("b", {})]),
    ("hermes", '<tool_call>\n{"name": "a", "arguments": {"q": 1}}', None, [("a", {"q": 1})]),
    ("llama3_json", f'<|python_tag|>{{"name": "get_current_weather", "parameters": {W}}}', None,
     [("get_current_weather", WEATHER)]),
    ("llama3_json", f'{{"name": "a", "parameters": {N}}}; {{"name": "b", "arguments": {{}}}}',
     None, [("a", NESTED), ("b", {})]),
    ("mistral", f'[TOOL_CALLS] [{{"name": "get_current_weather", "arguments": {W}}}, '
     '{"name": "b", "arguments": {}}]', None, [("get_current_weather", WEATHER), ("b", {})]),
    ("mistral", f"Sure.[TOOL_CALLS]get_current_weather[ARGS]{W}[TOOL_CALLS]a[ARGS]{N}",
     "Sure.", [("get_current_weather", WEATHER), ("a", NESTED)]),
    ("mistral", f"[TOOL_CALLS]get_current_weather{W}", None,
     [("get_current_weather", WEATHER)]),
    ("phi4_mini_json", f'functools[{{"name": "get_current_weather", "arguments": {W}}}, '
     f'{{"name": "a", "arguments": {N}}}]', None, [("get_current_weather", WEATHER),
                                                   ("a", NESTED)]),
    ("granite", f'<|tool_call|>[{{"name": "get_current_weather", "arguments": {W}}}]', None,
     [("get_current_weather", WEATHER)]),
    ("granite", f'<tool_call>[{{"name": "a", "arguments": {N}}}, {{"name": "b", "arguments": '
     '{}}]', None, [("a", NESTED), ("b", {})]),
    ("pythonic", '[get_current_weather(city="Dallas", state="TX", unit="fahrenheit")]', None,
     [("get_current_weather", WEATHER)]),
    ("pythonic", '[a(city="Pa)ri]s", days=[1, 23], deep={"x": True, "y": None}), b()]', None,
     [("a", PY_NESTED), ("b", {})]),
    ("pythonic", '<|python_start|>[b(q=1.5)]<|python_end|>', None, [("b", {"q": 1.5})]),
]

MALFORMED = [
    ("hermes", 'Hi <tool_call>\n{"name": "f", "arguments": {"a": }\n</tool_call>'),
    ("hermes", "<tool_call>\nnot json\n</tool_call>"),
    ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {"a": 1}'),
    ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}'),
    ("mistral", "[TOOL_CALLS]f[ARGS]{oops}"),
    ("phi4_mini_json", 'functools[{"name": "f", "arguments": ]'),
    ("granite", '<|tool_call|>{"name": "f"}'),
    ("pythonic", "[f(a=1), g(x)]"),
    ("pythonic", "[1] is a footnote"),
    ("pythonic", "[f(a=open())]"),
]

PLAIN = ["Hello <tool there", "The answer is 42.", "a [TOOL brace { }"]


def whole(parser: str, text: str) -> tuple[str | None, list[tuple[str, Any]], str | None]:
    content, calls, finish = ToolCallStream("auto", parser=get_tool_parser(parser)).result(
        text, "stop")
    return content, [(c.function.name, json.loads(c.function.arguments)) for c in calls], finish


def streamed(parser: str, pieces: list[str]) -> tuple[str | None, list[tuple[str, str]]]:
    """Feed the pieces (then an empty final delta, as the engine's last one may be); check
    each call's id, type and name come once, first."""
    stream = ToolCallStream("auto", parser=get_tool_parser(parser))
    content, calls = "", {}
    for i, piece in enumerate([*pieces, ""]):
        shown, deltas = stream.feed(piece, final=i == len(pieces))
        content += shown
        for d in deltas:
            if d.function.name is not None:
                assert d.id and d.type == "function" and d.index not in calls
                calls[d.index] = [d.function.name, ""]
            else:
                assert d.id is None and d.type is None
            calls[d.index][1] += d.function.arguments or ""
    return content or None, [(n, a) for _, (n, a) in sorted(calls.items())]


def loaded(result: tuple[str | None, list[tuple[str, str]]]) -> tuple[str | None, list[Any]]:
    return result[0], [(n, json.loads(a)) for n, a in result[1]]


def splits(text: str) -> list[list[str]]:
    """Character by character, and cut in two at every boundary."""
    return [list(text)] + [[text[:k], text[k:]] for k in range(1, len(text))]


@pytest.mark.parametrize("parser,text,content,calls", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_whole_and_streamed_at_every_boundary(parser: str, text: str, content: str | None,
                                              calls: list[tuple[str, Any]]) -> None:
    assert whole(parser, text) == (content, calls, "tool_calls")
    for pieces in splits(text):
        assert loaded(streamed(parser, pieces)) == (content, calls), pieces


@pytest.mark.parametrize("parser,text", MALFORMED, ids=[f"{m[0]}-{i}" for i, m in
                                                        enumerate(MALFORMED)])
def test_malformed_call_is_text(parser: str, text: str) -> None:
    assert whole(parser, text) == (text, [], "stop")
    for pieces in (list(text), [text]):
        assert streamed(parser, pieces)[0] == text


@pytest.mark.parametrize("parser", sorted(PARSERS))
@pytest.mark.parametrize("text", PLAIN)
def test_plain_text_is_content(parser: str, text: str) -> None:
    assert whole(parser, text) == (text, [], "stop")
    assert streamed(parser, list(text)) == (text, [])


def test_mistral_ids_and_special_tokens() -> None:
    _, calls, _ = ToolCallStream("auto", parser=get_tool_parser("mistral")).result(
        "[TOOL_CALLS]f[ARGS]{}", "stop")
    assert len(calls[0].id) == 9 and calls[0].id.isalnum()
    assert all(cls.keeps_special_tokens for cls in PARSERS.values())


@pytest.mark.parametrize("template,expected", [
    ("{{ bos_token }}[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]", "mistral"),
    ("<|start_header_id|>ipython<|end_header_id|>{% if tools %}<|python_tag|>{% endif %}",
     "llama3_json"),
    ("<|start_header_id|>system<|end_header_id|>{% if tools %}{{ tools }}{% endif %}",
     "llama3_json"),
    ("<|system|>{% if tools %}<|tool|>{{ tools }}<|/tool|>{% endif %} functools[...]",
     "phi4_mini_json"),
    ("<|start_of_role|>available_tools<|end_of_role|>{{ tools }}", "granite"),
    ("<|start_header_id|>system<|end_header_id|>{% if tools %}Respond as [func_name1(params_name1="
     "params_value1), func_name2(params)]{% endif %}", "pythonic"),
    ("<|im_start|>system\n<tools>{{ tools }}</tools><tool_call></tool_call>", "hermes"),
    ("{% for m in messages %}{{ m.content }}{% endfor %}", "hermes"),
    (None, "hermes"),
])
def test_auto_picks_from_the_template(template: str | None, expected: str) -> None:
    assert parser_for_template(template) == expected
    assert get_tool_parser("auto", template).name == expected
