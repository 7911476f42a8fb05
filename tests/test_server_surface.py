"""What real OpenAI clients send: structured outputs, tools, request ids, CORS, usage
details, checked with the unmodified openai SDK against the session server."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel, Field
from server_fixtures import ServerProcess, json_error

pytestmark = pytest.mark.slow


class City(BaseModel):
    name: str = Field(max_length=12)
    population: int


WEATHER_PARAMS = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                  "properties": {"city": {"type": "string", "maxLength": 12},
                                 "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}
TOOLS: list[Any] = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": WEATHER_PARAMS}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture
async def client(server: ServerProcess) -> Any:
    async with AsyncOpenAI(base_url=server.api_url, api_key="x", max_retries=0) as sdk:
        yield sdk


async def test_sdk_parse_returns_a_parsed_object(client: AsyncOpenAI) -> None:
    completion = await client.chat.completions.parse(
        model="SmolLM2-135M-Instruct", response_format=City, temperature=0, max_tokens=40,
        messages=[{"role": "user", "content": "Name a big city and its population."}])
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, City), completion
    assert completion.choices[0].finish_reason == "stop"


async def test_required_tool_call(client: AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=ASK, tools=TOOLS, tool_choice="required",
        temperature=0, max_tokens=48)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls and calls[0].function.name == "get_weather" and calls[0].id
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER_PARAMS)


async def test_required_tool_call_streamed(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=ASK, tools=TOOLS, tool_choice="required",
        temperature=0, max_tokens=48, stream=True)
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    fragments = 0
    finish = None
    async for chunk in stream:
        choice = chunk.choices[0]
        for call in choice.delta.tool_calls or []:
            if call.function and call.function.name:
                assert call.id and call.type == "function" and call.index not in names
                names[call.index] = call.function.name
            if call.function and call.function.arguments:
                assert call.index in names  # the name comes first
                arguments[call.index] = arguments.get(call.index, "") + call.function.arguments
                fragments += 1
        finish = choice.finish_reason or finish
    assert finish == "tool_calls" and names == {0: "get_weather"}
    assert fragments > 1  # the arguments arrive in pieces
    jsonschema.validate(json.loads(arguments[0]), WEATHER_PARAMS)


async def test_named_tool_choice(client: AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=ASK, tools=TOOLS, temperature=0, max_tokens=48,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = reply.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)


async def test_tool_turns_are_rendered(http: httpx.AsyncClient) -> None:
    """A tool round trip: the tools, the assistant's call and the tool's result all reach
    the prompt the model runs on, and the reply after them is an ordinary completion."""
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees and sunny"}]
    response = await http.post("/v1/chat/completions", json={
        "messages": messages, "tools": TOOLS, "max_tokens": 4, "temperature": 0})
    assert response.status_code == 200, response.text
    body = response.json()
    choice = body["choices"][0]
    assert choice["finish_reason"] in ("stop", "length") and choice["message"]["content"]
    assert 1 <= body["usage"]["completion_tokens"] <= 4
    # /tokenize renders as chat does: the same count, and its text holds every tool turn
    # in the generic format.
    tokenized = (await http.post("/tokenize", json={"messages": messages, "tools": TOOLS})).json()
    assert body["usage"]["prompt_tokens"] == tokenized["count"]
    text = (await http.post("/detokenize", json={"tokens": tokenized["tokens"]})).json()["prompt"]
    assert '"name": "get_weather"' in text and "<tools>" in text
    assert ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
            '"unit": "celsius"}}\n</tool_call>') in text
    assert "<tool_response>\n21 degrees and sunny\n</tool_response>" in text


async def test_tokenize_tools_need_messages(http: httpx.AsyncClient) -> None:
    """Tools only mean something in a chat: with a plain prompt they are a 400, not ignored."""
    response = await http.post("/tokenize", json={"prompt": "Hi", "tools": TOOLS})
    assert response.status_code == 400
    assert "tools go with messages" in json_error(response)["message"]


@pytest.mark.parametrize("fields,needle", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}}},
     "JSON schema"),
    ({"structured_outputs": {"regex": "a(b"}}, "regex"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "exactly one"),
    ({"tool_choice": "required"}, "tool_choice needs tools"),
    ({"priority": 3}, "scheduling-policy"),
    ({"speculative": "no"}, "speculative"),
    ({"speculative": 0}, "speculative"),
    ({"speculative": None}, "speculative"),
])
async def test_bad_constraints_are_400(http: httpx.AsyncClient, fields: dict[str, Any],
                                       needle: str) -> None:
    response = await http.post("/v1/chat/completions",
                               json={"messages": ASK, "max_tokens": 4, **fields})
    assert response.status_code == 400, response.text
    assert needle in json_error(response)["message"]


async def test_completions_regex_choice_and_guided_alias(http: httpx.AsyncClient) -> None:
    cases = [({"structured_outputs": {"regex": r"[0-9]{4}"}}, r"[0-9]{4}"),
             ({"structured_outputs": {"choice": ["red", "blue"]}}, "red|blue"),
             ({"guided_choice": ["up", "down"]}, "up|down")]
    for fields, pattern in cases:
        response = await http.post("/v1/completions", json={
            "prompt": "The answer is", "max_tokens": 8, "temperature": 0, **fields})
        body = response.json()
        assert response.status_code == 200, body
        import re
        assert re.fullmatch(pattern, body["choices"][0]["text"]), body


async def test_json_object_streamed(http: httpx.AsyncClient) -> None:
    text = ""
    async with http.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "A JSON object with a colour name."}],
            "response_format": {"type": "json_object"}, "stream": True, "temperature": 0,
            "max_tokens": 40}) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                text += chunk["choices"][0]["delta"].get("content", "")
                finish = chunk["choices"][0]["finish_reason"]
    if finish == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert finish == "length" and text.startswith("{")


async def test_request_id_header_and_cors(http: httpx.AsyncClient) -> None:
    response = await http.post("/v1/completions", headers={"X-Request-Id": "trace-42"},
                               json={"prompt": "Hi", "max_tokens": 1})
    assert response.headers["x-request-id"] == "trace-42"
    assert response.json()["id"] == "cmpl-trace-42"
    generated = await http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
    assert generated.headers["x-request-id"] in generated.json()["id"]
    preflight = await http.options("/v1/chat/completions", headers={
        "Origin": "http://example.com", "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] in ("*", "http://example.com")


async def test_cached_tokens_and_continuous_usage(http: httpx.AsyncClient) -> None:
    prompt = "The history of the river and its mills, told in full detail: " * 8
    first = await http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
    second = await http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
    assert first.status_code == second.status_code == 200
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16
    usages = []
    async with http.stream("POST", "/v1/completions", json={
            "prompt": "Hi", "max_tokens": 3, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                usages.append(json.loads(line[6:]).get("usage"))
    assert all(u is not None for u in usages)
    assert [u["completion_tokens"] for u in usages[:3]] == [1, 2, 3]


async def test_replies_validate_against_openai_types(http: httpx.AsyncClient) -> None:
    """The SDK builds its objects without validation; validate the raw bodies here so that
    the shapes cannot drift from the openai package's types."""
    from openai.types import Completion
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "temperature": 0,
            "max_tokens": 24}  # the shapes are checked, not the calls: keep it short
    reply = await http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    ChatCompletion.model_validate(reply.json(), strict=False)
    async with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                ChatCompletionChunk.model_validate(json.loads(line[6:]))
    # With echo the first prompt token's logprob is null, as in vLLM and as
    # lm-evaluation-harness reads it; openai's type has no null there, so check without echo.
    completion = await http.post("/v1/completions", json={
        "prompt": "Hi there", "max_tokens": 2, "logprobs": 2})
    parsed = Completion.model_validate(completion.json())
    assert parsed.choices[0].logprobs is not None
    assert len(parsed.choices[0].logprobs.tokens or []) == 2
