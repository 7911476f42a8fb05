"""POST /v1/responses and the stored responses, driven by the real `openai` SDK against the
shared server (the default model): whole and streamed responses with their event sequence,
a function-call round trip through previous_response_id, structured output parsed by
responses.parse, retrieve and delete, and refusals in OpenAI's error shape."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel, Field
from server_fixtures import ServerProcess, json_error

pytestmark = pytest.mark.slow

WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}


class Weather(BaseModel):
    # A bounded name, so that the grammar closes the object within max_output_tokens whatever
    # the small model samples (an unbounded string once ran past the budget, unparsable).
    city: str = Field(max_length=40)
    sunny: bool


@pytest.fixture(scope="module")
def model(server: ServerProcess) -> str:
    return str(httpx.get(f"{server.api_url}/models").json()["data"][0]["id"])


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=server.api_url, api_key="local", max_retries=0,
                                  timeout=120) as sdk:
        yield sdk


async def test_whole_response_is_stored_retrieved_and_deleted(client: openai.AsyncOpenAI,
                                                              model: str) -> None:
    response = await client.responses.create(
        model=model, input="Name a colour.", instructions="You are terse.",
        max_output_tokens=12, metadata={"run": "test"}, temperature=0.5, top_p=0.9)
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete") and response.output_text
    assert response.instructions == "You are terse." and response.metadata == {"run": "test"}
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and 0 < usage.output_tokens <= 12
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0
    if response.status == "incomplete":
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
        assert response.output[-1].status == "incomplete"
    again = await client.responses.retrieve(response.id)
    assert again.output_text == response.output_text and again.usage == response.usage
    items = await client.responses.input_items.list(response.id)
    assert [item.type for item in items.data] == ["message"]
    deleted = await client.responses.delete(response.id)
    assert deleted is None  # the SDK returns nothing for a 200
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(response.id)


async def test_the_streamed_event_sequence(client: openai.AsyncOpenAI, model: str) -> None:
    stream = await client.responses.create(model=model, input="Tell me about the sea.",
                                           max_output_tokens=10, stream=True, store=False)
    events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    final = events[-1].response
    assert events[-4].text == text == final.output_text
    assert final.usage is not None and final.usage.output_tokens == 10
    assert final.output[-1].status == "incomplete"  # the limit cut the message
    assert events[0].response.id == final.id and not final.store
    with pytest.raises(openai.NotFoundError):  # store=False: nothing kept
        await client.responses.retrieve(final.id)


async def test_function_call_round_trip(client: openai.AsyncOpenAI, model: str) -> None:
    first = await client.responses.create(
        model=model, input="What is the weather in Paris?", tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=64, temperature=0)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    second = await client.responses.create(
        model=model, previous_response_id=first.id, tools=[WEATHER_TOOL], max_output_tokens=8,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}])
    assert second.previous_response_id == first.id and second.output
    assert second.usage is not None and first.usage is not None
    # The continuation replays the stored turns: a longer prompt, whose start the prefix
    # cache already holds.
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0
    items = await client.responses.input_items.list(second.id)
    assert [item.type for item in items.data] == ["message", "function_call",
                                                  "function_call_output"]


async def test_streamed_function_call_arguments(client: openai.AsyncOpenAI, model: str) -> None:
    stream = await client.responses.create(
        model=model, input="What is the weather in Paris?", tools=[WEATHER_TOOL],
        tool_choice="required", parallel_tool_calls=False, max_output_tokens=64, stream=True,
        store=False, temperature=0)
    events = [event async for event in stream]
    deltas = "".join(event.delta for event in events
                     if event.type == "response.function_call_arguments.delta")
    (done,) = [event for event in events if event.type == "response.function_call_arguments.done"]
    assert done.name == "get_weather" and done.arguments == deltas
    assert isinstance(json.loads(deltas)["city"], str)
    assert events[-1].type == "response.completed"


async def test_parse_with_a_schema(client: openai.AsyncOpenAI, model: str) -> None:
    parsed = await client.responses.parse(model=model, input="The weather in Rome, as JSON.",
                                          text_format=Weather, max_output_tokens=80, store=False)
    assert isinstance(parsed.output_parsed, Weather)
    assert parsed.output_parsed.city


async def test_json_object_format(client: openai.AsyncOpenAI, model: str) -> None:
    response = await client.responses.create(
        model=model, input="A JSON object about a cat.", text={"format": {"type": "json_object"}},
        max_output_tokens=48, store=False)
    if response.status == "completed":
        assert isinstance(json.loads(response.output_text), dict)
    else:
        assert response.output_text.lstrip().startswith("{")


@pytest.mark.parametrize(("body", "status", "param", "words"), [
    ({"input": "Hi", "tools": [{"type": "web_search"}]}, 400, "tools", "web_search"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400,
     "input", "input_image"),
    ({"input": "Hi", "background": True}, 400, "background", "background"),
    ({"input": "Hi", "previous_response_id": "resp_nothing"}, 404, "previous_response_id",
     "resp_nothing"),
    ({"instructions": "Hi"}, 400, "input", "field required"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, 400, "input", "item_reference"),
    ({"input": "Hi", "tool_choice": {"type": "file_search"}}, 400, "tool_choice", "file_search"),
    ({"input": "Hi", "max_output_tokens": 0}, 400, "max_output_tokens", "greater than"),
    ({"input": "Hi", "model": "no-such-model"}, 404, "model", "does not exist"),
], ids=["builtin-tool", "image", "background", "unknown-previous", "no-input", "item-reference",
        "builtin-tool-choice", "zero-tokens", "unknown-model"])
async def test_refusals_in_openai_shape(server: ServerProcess, body: dict[str, Any], status: int,
                                        param: str, words: str) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        response = await http.post("/v1/responses", json=body)
        assert response.status_code == status, response.text
        error = json_error(response)
        assert error["param"] == param and words in error["message"], error
        for method in ("GET", "DELETE"):
            missing = await http.request(method, "/v1/responses/resp_nothing")
            assert missing.status_code == 404 and "resp_nothing" in json_error(missing)["message"]
        assert (await http.get("/health")).status_code == 200


class Answer(BaseModel):
    sunny: bool


async def test_an_agents_sdk_agent_runs_to_its_final_output(server: ServerProcess,
                                                            model: str) -> None:
    """The openai-agents SDK on its default Responses model: the forced first turn calls the
    tool, the SDK runs it and sends its output back, and the structured final turn ends."""
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    cities: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return "Sunny"

    async with openai.AsyncOpenAI(base_url=server.api_url, api_key="local", max_retries=0,
                                  timeout=120) as sdk:
        agent = agents.Agent(
            name="weather", instructions="Answer briefly.", tools=[get_weather],
            output_type=Answer, model=agents.OpenAIResponsesModel(model, sdk),
            model_settings=agents.ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                                max_tokens=64))
        result = await agents.Runner.run(agent, "Is it sunny in Paris?", max_turns=4)
    assert len(cities) == 1 and cities[0]
    assert isinstance(result.final_output, Answer)
    assert len(result.raw_responses) == 2
