"""Tool calls and thinking land in the right blocks and items of /v1/messages and
/v1/responses, whole and streamed, on tiny random checkpoints of two families with their
own templates and call formats: Qwen3 (Hermes `<tool_call>` blocks after a `<think>`
block) and Llama 3.2 (JSON calls). A tiny random model writes no call by itself, so its
reply is forced with vLLM's `structured_outputs` choice (which both APIs pass on, as chat
does); what is under test is the rest: the family's parsers and the translation of their
output into each API's shape. The two servers load side by side in one module fixture, as
tests/test_family_chat_http.py's do."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from family_chat import CITY, FAMILIES, MAX_POSITIONS, THOUGHT, FamilyChat
from server_fixtures import STARTUP_TIMEOUT_S, ServerProcess, launch_server, wait_all_healthy
from tiny_models import TinyZoo

pytestmark = pytest.mark.slow

CHOSEN = [f for f in FAMILIES if f.family in ("qwen3", "llama")]
IDS = [f.family for f in CHOSEN]
SERVE_ARGS = ["--served-model-name", "tiny", "--kv-cache-memory", "32MiB", "--max-model-len",
              str(MAX_POSITIONS), "--fused-decode-limit", "8", "--max-num-seqs", "8"]
ASK = "What is the weather in Paris?"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture(scope="module")
def servers(tiny_zoo: TinyZoo, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[str, ServerProcess]]:
    logs = tmp_path_factory.mktemp("agent-family-logs")
    started: dict[str, ServerProcess] = {}
    try:
        for family in CHOSEN:
            args = ["--model", str(tiny_zoo.folder(family.chat_spec)), *SERVE_ARGS,
                    "--tool-call-parser", family.tool_parser]
            if family.reasoning:  # the forced reply's grammar covers its think block
                args.append("--structured-outputs-in-reasoning")
            started[family.family] = launch_server(args, logs, name=family.family)
        wait_all_healthy(list(started.values()), STARTUP_TIMEOUT_S)
        yield started
    finally:
        for server in started.values():
            server.signal()
        for server in started.values():
            server.stop()


def forced(family: FamilyChat) -> dict[str, Any]:
    return {"structured_outputs": {"choice": [family.reply]}, "temperature": 0}


def budget(family: FamilyChat) -> int:
    return len(family.reply.encode()) + 8  # mostly a token per byte


async def sse(server: ServerProcess, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=120) as http, http.stream(
            "POST", server.base_url + path, json={**body, "stream": True}) as response:
        assert response.status_code == 200, await response.aread()
        return [json.loads(line[6:]) async for line in response.aiter_lines()
                if line.startswith("data: ")]


async def post(server: ServerProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=120) as http:
        response = await http.post(server.base_url + path, json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


def messages_body(family: FamilyChat) -> dict[str, Any]:
    body = {"model": "tiny", "max_tokens": budget(family), **forced(family),
            "messages": [{"role": "user", "content": ASK}],
            "tools": [{"name": "get_weather", "description": "The weather in a city",
                       "input_schema": WEATHER}]}
    if family.reasoning:
        body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    return body


@pytest.mark.parametrize("family", CHOSEN, ids=IDS)
async def test_messages_blocks(servers: dict[str, ServerProcess], family: FamilyChat) -> None:
    server = servers[family.family]
    whole = await post(server, "/v1/messages", messages_body(family))
    expected = ["thinking", "tool_use"] if family.reasoning else ["tool_use"]
    assert [block["type"] for block in whole["content"]] == expected, whole
    if family.reasoning:
        assert whole["content"][0]["thinking"] == THOUGHT
    assert whole["content"][-1]["name"] == "get_weather" and whole["content"][-1]["input"] == CITY
    assert whole["stop_reason"] == "tool_use"

    events = await sse(server, "/v1/messages", messages_body(family))
    started = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert started == expected, events
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    thought = "".join(d["thinking"] for d in deltas if d["type"] == "thinking_delta")
    arguments = "".join(d["partial_json"] for d in deltas if d["type"] == "input_json_delta")
    assert thought == (THOUGHT if family.reasoning else "")
    assert json.loads(arguments) == CITY
    assert [e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta"] == ["tool_use"]


def responses_body(family: FamilyChat) -> dict[str, Any]:
    body = {"model": "tiny", "input": ASK, "max_output_tokens": budget(family), "store": False,
            **forced(family), "tools": [{"type": "function", "name": "get_weather",
                                         "description": "The weather in a city",
                                         "parameters": WEATHER}]}
    if family.reasoning:
        body["reasoning"] = {"effort": "high"}
    return body


@pytest.mark.parametrize("family", CHOSEN, ids=IDS)
async def test_responses_items(servers: dict[str, ServerProcess], family: FamilyChat) -> None:
    server = servers[family.family]
    whole = await post(server, "/v1/responses", responses_body(family))
    expected = ["reasoning", "function_call"] if family.reasoning else ["function_call"]
    assert [item["type"] for item in whole["output"]] == expected, whole
    call = whole["output"][-1]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == CITY
    reasoning_tokens = whole["usage"]["output_tokens_details"]["reasoning_tokens"]
    if family.reasoning:
        assert whole["output"][0]["content"] == [{"type": "reasoning_text", "text": THOUGHT}]
        assert 0 < reasoning_tokens < whole["usage"]["output_tokens"]
    else:
        assert reasoning_tokens == 0

    events = await sse(server, "/v1/responses", responses_body(family))
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert added == expected, events
    thought = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert thought == (THOUGHT if family.reasoning else "")
    (done,) = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert done["name"] == "get_weather" and json.loads(done["arguments"]) == CITY
    assert events[-1]["type"] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
