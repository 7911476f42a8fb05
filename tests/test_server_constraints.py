"""Structured outputs and tools over real HTTP, for the documented fields the surface tests
leave out: EBNF grammars, structural tags, the guided_* aliases and their precedence, bad
specs refused before any work, tool_choice "none" and "auto", and forced calls with and
without parallel_tool_calls, whole and streamed. All against the session server, with
short outputs so that each test takes seconds."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import jsonschema
import pytest
from openai import AsyncOpenAI
from server_fixtures import ServerProcess, json_error, metric_value

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
# A grammar of several rules whose language a regex states exactly.
GRAMMAR = ('root ::= colour ", " colour " and " number\n'
           'colour ::= "red" | "green" | "blue"\n'
           'number ::= [1-9] [0-9]?')
GRAMMAR_LANGUAGE = r"(red|green|blue), (red|green|blue) and [1-9][0-9]?"
SMALL_OBJECT = {"type": "object", "additionalProperties": False, "required": ["x"],
                "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}}}
ANSWER_TAG = {"type": "tag", "begin": "<answer>", "end": "</answer>",
              "content": {"type": "json_schema", "json_schema": SMALL_OBJECT}}

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"type": "string", "maxLength": 12}}}
TIME = {"type": "object", "additionalProperties": False, "required": ["zone"],
        "properties": {"zone": {"type": "string", "maxLength": 8}}}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
TOOLS: list[Any] = [{"type": "function", "function": {"name": name, "parameters": schema,
                                                      "description": f"{name} of a place"}}
                    for name, schema in SCHEMAS.items()]
ASK = [{"role": "user", "content": "What is the weather in Paris and the time in Tokyo?"}]
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
GENERIC_CALL = '{"name": "get_time", "arguments": {"zone": "UTC"}}'


@pytest.fixture
async def client(server: ServerProcess) -> Any:
    async with AsyncOpenAI(base_url=server.api_url, api_key="x", max_retries=0) as sdk:
        yield sdk


async def generate(http: httpx.AsyncClient, endpoint: str, fields: dict[str, Any],
                   max_tokens: int = 16) -> tuple[str, str]:
    """(text, finish_reason) of one greedy request to "completions" or "chat"."""
    if endpoint == "completions":
        path, body = "/v1/completions", {"prompt": "Two colours and a number:"}
    else:
        path, body = "/v1/chat/completions", {"messages": [
            {"role": "user", "content": "Two colours and a number?"}]}
    response = await http.post(path, json={**body, **fields, "max_tokens": max_tokens,
                                           "temperature": 0})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    text = choice["text"] if endpoint == "completions" else choice["message"]["content"]
    return text, choice["finish_reason"]


# ---- structured outputs ------------------------------------------------------------------

@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("fields", [{"structured_outputs": {"grammar": GRAMMAR}},
                                    {"guided_grammar": GRAMMAR}], ids=["canonical", "alias"])
async def test_grammar_output_is_in_its_language(http: httpx.AsyncClient, endpoint: str,
                                                 fields: dict[str, Any]) -> None:
    """An EBNF grammar, canonical or guided_grammar, on both endpoints: the output is a
    sentence of the grammar (a free model would not write "red, blue and 20" by chance)."""
    text, finish = await generate(http, endpoint, fields)
    assert finish == "stop"
    assert re.fullmatch(GRAMMAR_LANGUAGE, text), text


async def test_grammar_streamed_chat(http: httpx.AsyncClient) -> None:
    """The streamed path applies the grammar too: the deltas join into a sentence of it."""
    text, finish = "", None
    async with http.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Two colours and a number?"}],
            "structured_outputs": {"grammar": GRAMMAR}, "stream": True, "temperature": 0,
            "max_tokens": 16}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                text += choice["delta"].get("content") or ""
                finish = choice["finish_reason"] or finish
    assert finish == "stop" and re.fullmatch(GRAMMAR_LANGUAGE, text), text


@pytest.mark.parametrize("fields,check", [
    ({"guided_regex": r"[A-Z]{2}-[0-9]{3}"}, "regex"),
    ({"guided_json": SMALL_OBJECT}, "json"),
    ({"guided_json": json.dumps(SMALL_OBJECT)}, "json"),
    ({"guided_choice": ["alpha", "omega"]}, "choice"),
], ids=["guided_regex", "guided_json", "guided_json_string", "guided_choice"])
async def test_guided_aliases_constrain_chat(http: httpx.AsyncClient, fields: dict[str, Any],
                                             check: str) -> None:
    """Each guided_* alias constrains a chat reply as its structured_outputs form does."""
    text, finish = await generate(http, "chat", fields, max_tokens=24)
    assert finish == "stop", text
    if check == "regex":
        assert re.fullmatch(r"[A-Z]{2}-[0-9]{3}", text), text
    elif check == "json":
        jsonschema.validate(json.loads(text), SMALL_OBJECT)
    else:
        assert text in ("alpha", "omega")


async def test_precedence_of_the_constraint_fields(http: httpx.AsyncClient) -> None:
    """As documented (and in vLLM): response_format wins over structured_outputs, which wins
    over guided_*; the losers are ignored, not an error."""
    choice = {"structured_outputs": {"choice": ["alpha", "omega"]}}
    text, _ = await generate(http, "completions", {**choice, "guided_regex": "[0-9]{3}"})
    assert text in ("alpha", "omega")
    text, finish = await generate(http, "chat", {**choice, "response_format": {
        "type": "json_schema", "json_schema": {"name": "small", "schema": SMALL_OBJECT}}},
        max_tokens=24)
    assert finish == "stop"
    jsonschema.validate(json.loads(text), SMALL_OBJECT)


@pytest.mark.parametrize("fields", [
    {"response_format": {"type": "structural_tag", "format": ANSWER_TAG}},
    {"structured_outputs": {"structural_tag": {"type": "structural_tag", "format": ANSWER_TAG}}},
    {"structured_outputs": {"structural_tag": json.dumps({"type": "structural_tag",
                                                          "format": ANSWER_TAG})}},
], ids=["response_format", "structured_outputs", "structured_outputs_string"])
async def test_structural_tag(http: httpx.AsyncClient, fields: dict[str, Any]) -> None:
    """A structural tag, in each documented place: the reply is the tag around JSON that
    follows the tag's schema."""
    response = await http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Give me a number as x."}], "temperature": 0,
        "max_tokens": 32, **fields})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    match = re.fullmatch(r"<answer>(.*)</answer>", choice["message"]["content"], re.DOTALL)
    assert match, choice
    jsonschema.validate(json.loads(match.group(1)), SMALL_OBJECT)


@pytest.mark.parametrize("fields,needle", [
    ({"structured_outputs": {"grammar": "root ::= ("}}, "grammar"),
    ({"guided_grammar": 'root ::= "a" | undefined_rule'}, "grammar"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_"),
    ({"structured_outputs": {"grammar": GRAMMAR, "regex": "a"}}, "exactly one"),
    ({"guided_json": "{not json"}, "not valid JSON"),
    ({"structured_outputs": {"structural_tag": {"type": "structural_tag"}}}, "structural tag"),
    ({"response_format": {"type": "structural_tag"}}, "needs a format"),
    ({"structured_outputs": {"regex": "[^\\s\\S]"}}, "matches no output"),  # an empty language
])
async def test_bad_specs_are_400_before_any_work(http: httpx.AsyncClient,
                                                 fields: dict[str, Any], needle: str) -> None:
    """A spec that cannot be used is refused in OpenAI's error shape, on both endpoints, and
    no prompt token reaches the engine."""
    before = metric_value((await http.get("/metrics")).text, "pagode:prompt_tokens_total")
    for path, body in (("/v1/completions", {"prompt": "Hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
        response = await http.post(path, json={**body, "max_tokens": 4, **fields})
        assert response.status_code == 400, response.text
        message = json_error(response)["message"]
        assert needle in message and ".cc:" not in message  # xgrammar's source path stays out
    after = metric_value((await http.get("/metrics")).text, "pagode:prompt_tokens_total")
    assert after == before


async def test_a_grammar_that_dead_ends_fails_its_request_alone_with_a_400(
        http: httpx.AsyncClient) -> None:
    """The regex `a[^\\s\\S]` lets "a" begin and then allows no token: that request ends
    with a 400 naming structured_outputs, whole and streamed, and is not counted as an
    engine failure. Requests beside it, and after it, are served."""
    def failures(text: str) -> float:
        return metric_value(text, "pagode:request_engine_failures_total")

    before = failures((await http.get("/metrics")).text)
    dead = {"prompt": "Say a:", "max_tokens": 8, "temperature": 0,
            "structured_outputs": {"regex": "a[^\\s\\S]"}}
    plain = {"prompt": "Two colours and a number:", "max_tokens": 8, "temperature": 0}
    whole, beside = await asyncio.gather(http.post("/v1/completions", json=dead),
                                         http.post("/v1/completions", json=plain))
    assert whole.status_code == 400, whole.text
    error = json_error(whole)
    assert error["param"] == "structured_outputs" and "allows no token" in error["message"]
    assert beside.status_code == 200 and beside.json()["choices"][0]["text"]

    async with http.stream("POST", "/v1/completions", json={**dead, "stream": True}) as response:
        events = [json.loads(line[len("data: "):]) async for line in response.aiter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert events[-1]["error"]["code"] == 400 and events[-1]["error"]["param"] == "structured_outputs"
    assert (await http.post("/v1/completions", json=plain)).status_code == 200
    assert failures((await http.get("/metrics")).text) == before


# ---- tools ---------------------------------------------------------------------------------

async def collect_stream(stream: Any) -> tuple[str, dict[int, list[str]], str | None]:
    """(content, {index: [name, arguments]}, finish_reason) of a streamed SDK reply, checking
    that each call's name, id and type come first and once."""
    content, calls, finish = "", {}, None
    async for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for call in choice.delta.tool_calls or []:
            assert call.function is not None
            if call.function.name:
                assert call.id and call.type == "function" and call.index not in calls
                calls[call.index] = [call.function.name, ""]
            calls[call.index][1] += call.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, calls, finish


async def reply_calls(client: AsyncOpenAI, stream: bool,
                      **fields: Any) -> tuple[str | None, list[tuple[str, str]], str | None]:
    """(content, [(name, arguments)], finish_reason), streamed or whole, through the SDK."""
    request = {"model": MODEL, "messages": ASK, "tools": TOOLS, "temperature": 0, **fields}
    if stream:
        content, calls, finish = await collect_stream(
            await client.chat.completions.create(**request, stream=True))
        return content or None, [(n, a) for _, (n, a) in sorted(calls.items())], finish
    reply = await client.chat.completions.create(**request)
    choice = reply.choices[0]
    whole = choice.message.tool_calls or []
    assert len({c.id for c in whole}) == len(whole) and all(c.id for c in whole)
    return (choice.message.content,
            [(c.function.name, c.function.arguments) for c in whole],  # type: ignore[union-attr]
            choice.finish_reason)


def check_call(name: str, arguments: str) -> None:
    assert name in SCHEMAS, name
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_tool_choice_none_leaves_call_markup_as_content(client: AsyncOpenAI,
                                                              stream: bool) -> None:
    """With tool_choice "none" the output is not parsed for calls: a reply forced to be a
    <tool_call> block comes back as content, with no tool_calls and no "tool_calls" finish."""
    content, calls, finish = await reply_calls(
        client, stream, tool_choice="none", max_tokens=40,
        extra_body={"structured_outputs": {"choice": [HERMES_CALL]}})
    assert (content, calls, finish) == (HERMES_CALL, [], "stop")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("written,expected", [
    (HERMES_CALL, ("get_weather", {"city": "Paris"})),
    (GENERIC_CALL, ("get_time", {"zone": "UTC"})),
], ids=["hermes", "generic"])
async def test_tool_choice_auto_parses_calls(client: AsyncOpenAI, stream: bool, written: str,
                                             expected: tuple[str, dict[str, Any]]) -> None:
    """With tool_choice "auto" a Hermes block or one bare generic JSON call in the output
    becomes tool_calls with finish_reason "tool_calls" and no content."""
    content, calls, finish = await reply_calls(
        client, stream, tool_choice="auto", max_tokens=40,
        extra_body={"structured_outputs": {"choice": [written]}})
    assert not content and finish == "tool_calls"
    assert [(name, json.loads(arguments)) for name, arguments in calls] == [expected]


async def test_tool_choice_auto_free_output_is_calls_or_content(client: AsyncOpenAI) -> None:
    """Unforced, whatever the model writes under "auto" (four sampled replies) is either
    valid calls among the tools or plain content, never an error."""
    reply = await client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto", n=4, temperature=1.0,
        seed=11, max_tokens=24)
    assert len(reply.choices) == 4
    for choice in reply.choices:
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            for call in choice.message.tool_calls:
                check_call(call.function.name, call.function.arguments)  # type: ignore[union-attr]
        else:
            assert choice.message.content and choice.finish_reason in ("stop", "length")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("tool_choice,parallel", [
    ("required", False), ("required", True),
    ({"type": "function", "function": {"name": "get_time"}}, False),
], ids=["required-single", "required-parallel", "named"])
async def test_forced_calls(client: AsyncOpenAI, stream: bool, tool_choice: Any,
                            parallel: bool) -> None:
    """Forced calls: "required" without parallel calls and a named function give exactly
    one call, "required" with them at least one; every call's arguments follow its schema."""
    content, calls, finish = await reply_calls(
        client, stream, tool_choice=tool_choice, parallel_tool_calls=parallel, max_tokens=40)
    assert not content
    if parallel:
        assert calls
    else:
        assert len(calls) == 1
    for name, arguments in calls:
        check_call(name, arguments)
    if isinstance(tool_choice, dict):
        assert calls[0][0] == "get_time" and finish == "stop"  # vLLM: a named call "stop"s
    else:
        assert finish == "tool_calls"
