"""Each served family chats over HTTP through its own template, and a tool call round-trips
in its own format: the real server (`python -m server.cli serve`) on each family's tiny
checkpoint, driven through the openai SDK.

A tiny random model writes no call by itself, so its reply is forced with structured
outputs (a `choice` grammar holding the family's call); what is under test is the rest:
the template's rendering of the prompt (checked against transformers' apply_chat_template
on the same folder, with the family's special tokens as single ids), the family's
tool-call parser turning the reply into `tool_calls`, whole and streamed, the reasoning
split where the template thinks first, and the call and its result rendered back through
the template in the next turn.

The servers (one per family: a server serves one model) load side by side in one module
fixture, with the shipped defaults but for what a dozen tiny models at once force: a
byte-level prompt needs a longer context than SMALL_ARGS', a dozen KV caches a small one
each, and the fused-decode limit and the batch size are given rather than timed at each
start (seconds of a start's CPU each, not what these tests hold, and timed beside a dozen
other starting servers they would measure only the contention).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from chat_reply import read_chat
from chat_tokenizer import token_id
from family_chat import CITY, FAMILIES, MAX_POSITIONS, THOUGHT, FamilyChat
from server_fixtures import STARTUP_TIMEOUT_S, ServerProcess, launch_server, wait_all_healthy
from tiny_models import TinyZoo

from server.respond.tool_parsers import parser_for_template

pytestmark = pytest.mark.slow

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS: list[Any] = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city", "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
RESULT = "sunny"
SERVE_ARGS = ["--served-model-name", "tiny", "--kv-cache-memory", "32MiB", "--max-model-len", str(MAX_POSITIONS),
              "--fused-decode-limit", "8", "--max-num-seqs", "8"]
IDS = [f.family for f in FAMILIES]


def serve_args(zoo: TinyZoo, family: FamilyChat) -> list[str]:
    args = ["--model", str(zoo.folder(family.chat_spec)), *SERVE_ARGS, "--enable-auto-tool-choice",
            "--tool-call-parser", family.tool_parser]
    # A thinking template's grammar would otherwise wait for a `</think>` the model never writes.
    return args + ["--structured-outputs-in-reasoning"] if family.reasoning else args


def selected(session: pytest.Session) -> list[FamilyChat]:
    """The families this run's selected tests of this module ask for."""
    names = {item.callspec.params["family"].family for item in session.items
             if getattr(getattr(item, "module", None), "__name__", None) == __name__
             and "family" in getattr(getattr(item, "callspec", None), "params", {})}
    return [f for f in FAMILIES if f.family in names]


@pytest.fixture(scope="module")
def servers(request: pytest.FixtureRequest, tiny_zoo: TinyZoo,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    """One server per selected family, all loading at once (a start is mostly imports, and
    the cores are better shared than waited on in turn)."""
    logs = tmp_path_factory.mktemp("family-chat-logs")
    started: dict[str, ServerProcess] = {}
    try:
        for family in selected(request.session):
            started[family.family] = launch_server(serve_args(tiny_zoo, family), logs, name=family.family)
        wait_all_healthy(list(started.values()), STARTUP_TIMEOUT_S)
        yield started
    finally:
        for server in started.values():  # all drain at once, then each is waited for
            server.signal()
        for server in started.values():
            server.stop()


@functools.cache
def hf_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def hf_prompt(zoo: TinyZoo, family: FamilyChat, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    """transformers' rendering of the same folder's template, tokenized."""
    tokenizer = hf_tokenizer(zoo.folder(family.chat_spec))
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


async def tokenize(server: ServerProcess, **body: Any) -> tuple[list[int], str]:
    """The server's prompt for a chat body: its token ids and their text."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        response = await http.post("/tokenize", json=body)
        assert response.status_code == 200, response.text
        tokens = response.json()["tokens"]
        text = (await http.post("/detokenize", json={"tokens": tokens})).json()["prompt"]
    return tokens, text


async def chat(server: ServerProcess, stream: bool, **fields: Any) -> dict[str, Any]:
    """content, reasoning, calls [(id, name, arguments)], finish and usage, as the SDK reads
    them from a whole or a streamed response."""
    return await read_chat(server.api_url, {"model": "tiny", "temperature": 0, **fields}, stream)


def native_tools(family: FamilyChat) -> bool:
    """The template renders tools itself; else the server's generic tool prompt does."""
    return "tools" in family.template.read_text()


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_auto_picks_the_family_parser(family: FamilyChat) -> None:
    """`--tool-call-parser auto` would read each family's template as its parser."""
    assert parser_for_template(family.template.read_text()) == family.tool_parser


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
async def test_chat_goes_through_the_family_template(servers: dict[str, ServerProcess], tiny_zoo: TinyZoo,
                                                    family: FamilyChat) -> None:
    """The prompt is the family's template as transformers renders it, its markup special
    ids; a chat request on it answers and counts that prompt."""
    server = servers[family.family]
    tokens, text = await tokenize(server, messages=ASK)
    assert tokens == hf_prompt(tiny_zoo, family, ASK), text
    assert token_id(family.turn) in tokens and tokens.count(token_id("<unk>")) == 0
    got = await chat(server, False, messages=ASK, max_tokens=3)
    assert got["usage"].prompt_tokens == len(tokens)
    assert got["usage"].completion_tokens >= 1 and got["finish"] in ("length", "stop")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
async def test_tool_call_round_trip(servers: dict[str, ServerProcess], tiny_zoo: TinyZoo, family: FamilyChat,
                                    stream: bool) -> None:
    """A reply in the family's call format comes back as tool_calls (a thinking family's
    think block as reasoning); the call and its result then render through the template."""
    server = servers[family.family]
    tokens, text = await tokenize(server, messages=ASK, tools=TOOLS)
    assert TOOLS[0]["function"]["description"] in text, text
    if native_tools(family):
        assert tokens == hf_prompt(tiny_zoo, family, ASK, tools=TOOLS)
    got = await chat(server, stream, messages=ASK, tools=TOOLS, max_tokens=len(family.reply.encode()) + 8,
                     extra_body={"structured_outputs": {"choice": [family.reply]}})
    assert [(name, args) for _, name, args in got["calls"]] == [("get_weather", CITY)], got
    assert got["finish"] == "tool_calls" and got["content"].strip() == ""
    assert got["reasoning"] == got["reasoning_content"] == (THOUGHT if family.reasoning else "")
    call_id = got["calls"][0][0]
    turns = [*ASK, {"role": "assistant", "content": None, "tool_calls": [{
        "id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(CITY)}}]},
        {"role": "tool", "tool_call_id": call_id, "content": RESULT}]
    tokens, text = await tokenize(server, messages=turns, tools=TOOLS)
    assert family.result in text, text
    if native_tools(family):  # as vLLM, the template gets the arguments as an object
        dicts = [*turns[:1], {**turns[1], "content": "", "tool_calls": [{**turns[1]["tool_calls"][0], "function": {
            "name": "get_weather", "arguments": CITY}}]}, turns[2]]
        assert tokens == hf_prompt(tiny_zoo, family, dicts, tools=TOOLS)
    answer = await chat(server, stream, messages=turns, tools=TOOLS, max_tokens=2)
    assert answer["usage"].prompt_tokens == len(tokens) and answer["usage"].completion_tokens >= 1
