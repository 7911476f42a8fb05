"""Pythonic calls, as Llama 3.2/4 and vLLM's Gemma 3 template write them: the whole output is
a Python list of calls with keyword arguments, `[get_weather(city="Paris"), f()]`, argument
values Python literals. Llama 4 may wrap the list in <|python_start|>...<|python_end|>.
Output that does not start with `[` is content; output that does but is no such list is
content too, once it ends. While streaming, a call is shown once its `)` closes it (a
partial Python expression has no partial parse to take arguments from)."""

from __future__ import annotations

import ast
from typing import Any, ClassVar

from server.respond.tool_parsers.base import MALFORMED, Call, ToolParser

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
# The call example pythonic templates (vLLM's Llama 3.2, Llama 4 and Gemma 3 ones) write,
# by which `auto` knows them.
PYTHONIC_EXAMPLE = "[func_name1("


class PythonicParser(ToolParser):
    name: ClassVar[str] = "pythonic"

    def extract(self, text: str, final: bool) -> tuple[str, list[Call]]:
        body = unwrapped(text.strip())
        if not body.startswith("["):
            undecided = not final and (not body or PYTHON_START.startswith(body))
            return ("" if undecided else text), []
        if final:
            calls = list_calls(body)
            return "", calls if calls is not None else [MALFORMED]
        return "", closed_calls(body)


def unwrapped(text: str) -> str:
    if text.startswith(PYTHON_START):
        text = text[len(PYTHON_START):].strip()
        if text.endswith(PYTHON_END):
            text = text[:-len(PYTHON_END)].strip()
    return text


def list_calls(text: str) -> list[Call] | None:
    """The calls of a whole `[f(a=1), ...]`; None when the text is not such a list."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls = [call_of(node) for node in tree.body.elts]
    return None if MALFORMED in calls else calls


def closed_calls(text: str) -> list[Call]:
    """While the list grows: the calls up to the last one whose `)` closes it."""
    for end in range(len(text) - 1, 0, -1):
        if text[end] == ")":
            calls = list_calls(text[:end + 1] + "]")
            if calls is not None:
                return calls
    return []


def call_of(node: ast.expr) -> Call:
    """`name(key=literal, ...)` as (name, {key: value}); MALFORMED for anything else."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return MALFORMED
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            return MALFORMED
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            return MALFORMED
    return node.func.id, arguments
