"""The reasoning parsers on `<think>` outputs, whole and streamed at every character
boundary (the stream adds up to the whole split), with the opening tag missing, with no end,
with thinking switched off; and structured outputs that start after the reasoning ends."""

from __future__ import annotations

import pytest

from server.respond.reasoning import get_reasoning_parser, parser_for_template
from server.respond.reasoning.stream import ReasoningStream

# (parser, thinking, output, reasoning, content)
CASES = [
    ("deepseek_r1", True, "<think>I add 2 and 2.</think>\n\nIt is 4.", "I add 2 and 2.",
     "\n\nIt is 4."),
    ("deepseek_r1", True, "I add 2 and 2.</think>It is 4.", "I add 2 and 2.", "It is 4."),
    ("deepseek_r1", True, "<think>Still <thinking> about </thi", "Still <thinking> about </thi",
     ""),
    ("deepseek_r1", True, "No tags at all", "No tags at all", ""),
    ("qwen3", True, "<think>\nLet me see.\n</think>\n\n<tool_call>x</tool_call>",
     "\nLet me see.\n", "\n\n<tool_call>x</tool_call>"),
    ("qwen3", True, "Let me see.</think>A</think>B", "Let me see.", "AB"),
    ("qwen3", False, "<think>x</think>Plain answer", "", "<think>x</think>Plain answer"),
]


def streamed(parser_name: str, thinking: bool, pieces: list[str]) -> tuple[str, str]:
    parser = get_reasoning_parser(parser_name, None, thinking)
    assert parser is not None
    stream = ReasoningStream(parser)
    reasoning, content = "", ""
    for i, piece in enumerate([*pieces, ""]):
        thought, text = stream.feed(piece, final=i == len(pieces))
        reasoning, content = reasoning + thought, content + text
    return reasoning, content


@pytest.mark.parametrize("name,thinking,text,reasoning,content", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_whole_and_streamed_at_every_boundary(name: str, thinking: bool, text: str,
                                              reasoning: str, content: str) -> None:
    parser = get_reasoning_parser(name, None, thinking)
    assert parser is not None and parser.split(text, True) == (reasoning, content)
    for pieces in [list(text)] + [[text[:k], text[k:]] for k in range(1, len(text))]:
        assert streamed(name, thinking, pieces) == (reasoning, content), pieces


@pytest.mark.parametrize("template,expected", [
    ("{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>"
     "{% endif %}", "qwen3"),
    ("<｜Assistant｜><think>\n", "deepseek_r1"),
    ("<|im_start|>assistant\n", "none"),
    (None, "none"),
])
def test_auto_picks_from_the_template(template: str | None, expected: str) -> None:
    assert parser_for_template(template) == expected
    assert (get_reasoning_parser("auto", template) is None) == (expected == "none")


def test_grammar_starts_after_the_reasoning(default_model_path: str) -> None:
    """A spec started after `</think>` leaves the reasoning free (any text, even JSON-less)
    and holds what follows to the schema; the plain spec refuses the same reasoning."""
    from engine.model.loader import load_tokenizer, resolve_model
    from engine.structured_output import StructuredOutputSpec
    from engine.structured_output.manager import StructuredOutputManager

    tokenizer = load_tokenizer(resolve_model(default_model_path))
    manager = StructuredOutputManager(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    plain = StructuredOutputSpec.json_schema(schema)
    gated = plain.starting_after("</think>")

    def accepts(spec: StructuredOutputSpec, text: str) -> tuple[bool, bool]:
        state = manager.new_state(spec)
        assert state is not None
        ok = all(state.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))
        return ok, ok and state.accept(tokenizer.eos_token_id)

    thinking = "<think>\nHmm, {not json] at all.\n</think>\n\n"
    assert accepts(gated, thinking + '{"x": 12}') == (True, True)
    assert accepts(gated, "Just thinking, no end yet") == (True, False)
    assert not accepts(gated, thinking + "plain text")[0]
    assert not accepts(plain, thinking)[0]
    assert accepts(plain, '{"x": 12}') == (True, True)


@pytest.mark.parametrize("fields,parser,in_reasoning,after", [
    ({}, "qwen3", False, "</think>"),
    ({"chat_template_kwargs": {"enable_thinking": False}}, "qwen3", False, ""),
    ({"reasoning_effort": "none"}, "qwen3", False, ""),
    ({}, "deepseek_r1", False, "</think>"),
    ({}, "none", False, ""),
    ({}, "qwen3", True, ""),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
     "qwen3", False, "</think>"),
], ids=["qwen3", "thinking-off", "effort-none", "deepseek_r1", "no-parser", "in-reasoning",
        "forced-call"])
def test_chat_grammar_starts_after_the_reasoning(default_model_path: str, fields: dict,
                                                 parser: str, in_reasoning: bool,
                                                 after: str) -> None:
    """The chat route's engine requests, as its ChatFormat directs: the request's structured
    output (or the grammar of a forced call) starts after `</think>` when the request reasons
    first, from the first token otherwise; calls are read with special tokens kept."""
    from engine.model.loader import load_tokenizer, resolve_model
    from engine.request_limits import RequestLimits
    from server.api.protocol import ChatCompletionRequest
    from server.respond.chat_format import ChatFormat
    from server.translate.engine_requests import chat_requests

    tokenizer = load_tokenizer(resolve_model(default_model_path))
    limits = RequestLimits(vocab_size=len(tokenizer), max_model_len=2048, max_prompt_tokens=2048)
    body = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "Hi"}],
        "response_format": {"type": "json_object"}, **fields})
    compiled: list = []
    fmt = ChatFormat("hermes", parser, in_reasoning)
    requests = chat_requests("r", body, tokenizer, limits, compiled.append,
                             fmt.grammar_start(body), fmt.tools().keeps_special_tokens)
    assert [spec.after for spec in compiled] == [after]
    assert requests.subs[0].params.structured_outputs.after == after
    assert requests.subs[0].params.skip_special_tokens == ("tools" not in fields)


def test_the_flags_name_the_registered_parsers() -> None:
    """server/settings.py lists the names (it imports no other part of the server): they are
    the registries' own."""
    from server import settings
    from server.respond import reasoning, tool_parsers

    assert settings.TOOL_CALL_PARSERS == tool_parsers.CHOICES
    assert settings.REASONING_PARSERS == reasoning.CHOICES
