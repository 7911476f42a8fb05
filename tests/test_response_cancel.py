"""POST /v1/responses/{id}/cancel stops a running response, on the shared server with the
real `openai` SDK: the engine's request is aborted (counted as an abort, its KV blocks
freed, far fewer tokens than asked), the stream ends with response.cancelled, the cancel
answers the cancelled response, and the stored copy says "cancelled". A response that has
ended cannot be cancelled (400), and an unknown id is a 404, in OpenAI's error shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from server_fixtures import ServerProcess, metric_value

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow

LONG = 600  # output tokens asked for: far more than the cancel lets run
PROMPT = "Count from 1 to 1000, one number per line."


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[Any]:
    async with openai.AsyncOpenAI(base_url=server.api_url, api_key="local", max_retries=0,
                                  timeout=120) as sdk:
        yield sdk


async def scrape(server: ServerProcess) -> str:
    async with httpx.AsyncClient(timeout=30) as http:
        return (await http.get(f"{server.base_url}/metrics")).text


def aborts(text: str) -> float:
    return metric_value(text, "pagode:request_success_total", {"finished_reason": "abort"})


async def test_cancel_stops_a_streaming_response(client: Any, server: ServerProcess) -> None:
    before = await scrape(server)
    stream = await client.responses.create(model="SmolLM2-135M-Instruct", input=PROMPT,
                                           max_output_tokens=LONG, temperature=0, stream=True)
    kinds: list[str] = []
    response_id, deltas, cancelled, last = "", 0, None, None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.created":
            response_id = event.response.id
        if event.type == "response.output_text.delta":
            deltas += 1
            if deltas == 3:
                cancelled = await client.responses.cancel(response_id)
        last = event
    assert cancelled is not None, kinds  # the model ran long enough to be cancelled
    assert cancelled.id == response_id and cancelled.status == "cancelled"
    assert kinds[-1] == "response.cancelled", kinds[-5:]
    # The SDK knows no response.cancelled event and hands it over as it came, unparsed.
    assert last is not None and last.response["status"] == "cancelled"
    assert 3 <= cancelled.usage.output_tokens < LONG // 2
    stored = await client.responses.retrieve(response_id)
    assert stored.status == "cancelled" and stored.output == cancelled.output
    after = await scrape(server)
    assert aborts(after) == aborts(before) + 1  # the engine's request was aborted
    assert metric_value(after, "pagode:num_requests_running") == 0
    assert metric_value(after, "pagode:kv_cache_usage_perc") == 0
    with pytest.raises(openai.BadRequestError) as again:  # it has ended now
        await client.responses.cancel(response_id)
    assert "cancelled" in again.value.message


async def test_an_ended_or_unknown_response_cannot_be_cancelled(client: Any) -> None:
    done = await client.responses.create(model="SmolLM2-135M-Instruct", input="Hi",
                                         max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as ended:
        await client.responses.cancel(done.id)
    assert ended.value.body["param"] == "response_id"
    assert "incomplete" in ended.value.message or "completed" in ended.value.message
    with pytest.raises(openai.NotFoundError):
        await client.responses.cancel("resp_nothing_here")
