"""POST /v1/messages and /v1/messages/count_tokens, driven by the real `anthropic` SDK
against the shared server (the default model): whole and streamed messages, the event
sequence on the wire, stop sequences, a tool_use / tool_result round trip, token counting,
and refusals in Anthropic's error shape."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from server_fixtures import ServerProcess

anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.slow

WEATHER_TOOL = {"name": "get_weather", "description": "The weather in a city.",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                 "required": ["city"]}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def model(server: ServerProcess) -> str:
    return str(httpx.get(f"{server.api_url}/models").json()["data"][0]["id"])


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[Any]:
    # The SDK appends /v1/messages to the base URL, as Claude Code does.
    async with anthropic.AsyncAnthropic(base_url=server.base_url, api_key="local",
                                        max_retries=0, timeout=120) as sdk:
        yield sdk


def text_of(message: Any) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


async def test_whole_message_with_a_system_prompt(client: Any, model: str) -> None:
    message = await client.messages.create(
        model=model, max_tokens=12, system=[{"type": "text", "text": "You are terse."}],
        messages=[{"role": "user", "content": "Name a colour."}], extra_body={"temperature": 0})
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.model == model
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert text_of(message)
    assert 0 < message.usage.output_tokens <= 12
    counted = await client.messages.count_tokens(
        model=model, system=[{"type": "text", "text": "You are terse."}],
        messages=[{"role": "user", "content": "Name a colour."}])
    # count_tokens renders exactly what the message ran (cache reads are counted apart).
    assert counted.input_tokens == (message.usage.input_tokens
                                    + message.usage.cache_read_input_tokens)


async def test_stream_text_matches_the_final_message(client: Any, model: str) -> None:
    async with client.messages.stream(model=model, max_tokens=16, messages=[
            {"role": "user", "content": "Tell me about the sea."}]) as stream:
        pieces = [piece async for piece in stream.text_stream]
        final = await stream.get_final_message()
    assert len(pieces) > 1
    assert "".join(pieces) == text_of(final)
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 0


async def sse_events(server: ServerProcess, body: dict[str, Any]) -> list[tuple[str, Any]]:
    events = []
    async with httpx.AsyncClient(timeout=120) as http, http.stream(
            "POST", f"{server.base_url}/v1/messages", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        name = None
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name  # the event name is the data's type
                events.append((name, data))
    return events


async def test_the_event_sequence_on_the_wire(server: ServerProcess, model: str) -> None:
    events = await sse_events(server, {"model": model, "max_tokens": 6, "stream": True,
                                       "messages": [{"role": "user", "content": "Hi"}]})
    names = [name for name, _ in events]
    assert names[:4] == ["message_start", "ping", "content_block_start", "content_block_delta"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert events[0][1]["message"]["content"] == []
    assert events[2][1]["content_block"] == {"type": "text", "text": ""}
    assert all(data["delta"]["type"] == "text_delta" for _, data in events[3:-3])
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 6


async def test_a_stop_sequence_is_reported(client: Any, model: str) -> None:
    prompt = [{"role": "user", "content": "Count from one to ten in words."}]
    free = await client.messages.create(model=model, max_tokens=24, messages=prompt,
                                        extra_body={"temperature": 0})
    words = text_of(free).split()
    assert len(words) > 3, text_of(free)
    stop = words[2]
    stopped = await client.messages.create(model=model, max_tokens=24, messages=prompt,
                                           extra_body={"temperature": 0}, stop_sequences=[stop])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert stop not in text_of(stopped)


async def test_tool_use_round_trip(client: Any, model: str) -> None:
    first = await client.messages.create(  # greedy: a sampled call may run past its budget
        model=model, max_tokens=64, messages=QUESTION, tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0})
    assert first.stop_reason == "tool_use"
    (call,) = [block for block in first.content if block.type == "tool_use"]
    assert call.name == "get_weather" and isinstance(call.input.get("city"), str)
    second = await client.messages.create(
        model=model, max_tokens=12, tools=[WEATHER_TOOL], messages=[
            *QUESTION, {"role": "assistant", "content": first.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                          "content": "Sunny, 21 C"}]}])
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert second.content
    # The tool turn reached the prompt: it counts more tokens than the question alone.
    with_result = await client.messages.count_tokens(
        model=model, tools=[WEATHER_TOOL], messages=[
            *QUESTION, {"role": "assistant", "content": first.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                          "content": "Sunny, 21 C"}]}])
    alone = await client.messages.count_tokens(model=model, tools=[WEATHER_TOOL], messages=QUESTION)
    bare = await client.messages.count_tokens(model=model, messages=QUESTION)
    assert with_result.input_tokens > alone.input_tokens > bare.input_tokens


async def test_streamed_tool_use_arrives_as_input_json(client: Any, model: str) -> None:
    async with client.messages.stream(model=model, max_tokens=60, messages=QUESTION,
                                      tools=[WEATHER_TOOL], tool_choice={
                                          "type": "any", "disable_parallel_tool_use": True},
                                      extra_body={"temperature": 0}) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert "input_json" in kinds  # the SDK's event for each input_json_delta
    assert final.stop_reason == "tool_use"
    (call,) = [block for block in final.content if block.type == "tool_use"]
    assert call.name == "get_weather" and isinstance(call.input.get("city"), str)


@pytest.mark.parametrize(("body", "status", "kind", "words"), [
    ({"messages": QUESTION}, 400, "invalid_request_error", "max_tokens"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "AAAA"}}]}]}, 400, "invalid_request_error", "image"),
    ({"max_tokens": 5, "messages": QUESTION,
      "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400,
     "invalid_request_error", "server tools"),
    ({"max_tokens": 5, "messages": QUESTION, "model": "claude-no-such-model"}, 404,
     "not_found_error", "does not exist"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, 400,
     "invalid_request_error", "role"),
    ({"max_tokens": 5, "messages": QUESTION, "mcp_servers": [{"url": "http://x"}]}, 400,
     "invalid_request_error", "mcp_servers"),
    ({"max_tokens": 5, "messages": QUESTION, "temperature": float("nan")}, 400,
     "invalid_request_error", "temperature"),
], ids=["no-max-tokens", "image", "server-tool", "unknown-model", "system-role", "mcp",
        "nan-temperature"])
async def test_refusals_in_anthropic_shape(server: ServerProcess, body: dict[str, Any],
                                           status: int, kind: str, words: str) -> None:
    raw = json.dumps(body)  # writes NaN, as a lax client would
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(f"{server.base_url}/v1/messages", content=raw,
                                   headers={"content-type": "application/json"})
        assert response.status_code == status, response.text
        error = response.json()
        assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
        assert error["error"]["type"] == kind and words in error["error"]["message"], error
        # Before any work: the server stays healthy and the wrong media type is refused too.
        wrong_type = await http.post(f"{server.base_url}/v1/messages", content=b"{}",
                                     headers={"content-type": "text/plain"})
        assert wrong_type.status_code == 415
        assert wrong_type.json()["error"]["type"] == "invalid_request_error"
        assert (await http.get(f"{server.base_url}/health")).status_code == 200


async def test_the_sdk_raises_its_own_errors(client: Any, model: str) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        await client.messages.create(model="claude-x", max_tokens=5, messages=QUESTION)
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError):
        await client.messages.count_tokens(model=model, messages=[])
