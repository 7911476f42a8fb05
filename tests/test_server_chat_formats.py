"""Chat templates, tool-call formats and reasoning over real HTTP, through the openai SDK.

One small server of the default model runs a Qwen3-style template given with
`--chat-template` (tests/qwen3_template.jinja), so `auto` picks the qwen3 reasoning parser,
with `--tool-call-parser mistral` (Hermes calls go end to end on the shared server, in
test_server_constraints.py) and `--structured-outputs-in-reasoning`, so that a forced reply
can hold a whole `<think>` block: a small model writes no call by itself, so the replies are
forced with structured outputs. That structured outputs otherwise wait for `</think>` is
tested without a server, on the engine requests the chat route builds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from chat_reply import read_chat
from server_fixtures import SMALL_ARGS, ServerProcess, json_error, running_server

pytestmark = pytest.mark.slow

TEMPLATE = Path(__file__).with_name("qwen3_template.jinja")
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS: list[Any] = [{"type": "function", "function": {"name": "get_weather",
                                                      "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
THOUGHT = "\nI call get_weather.\n"
MISTRAL_CALL = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def qwen3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = [*SMALL_ARGS, "--chat-template", str(TEMPLATE), "--tool-call-parser", "mistral",
            "--structured-outputs-in-reasoning"]
    with running_server(args, tmp_path_factory.mktemp("chat-format-logs"), name="qwen3") as proc:
        yield proc


async def reply(qwen3_server: ServerProcess, stream: bool, **fields: Any) -> dict[str, Any]:
    """The reply's content, reasoning, reasoning_content, calls [(id, name, arguments)] and
    finish_reason, streamed or whole, as the SDK reads them; an absent text is None."""
    request = {"model": "SmolLM2-135M-Instruct", "messages": ASK, "temperature": 0, **fields}
    out = await read_chat(qwen3_server.api_url, request, stream)
    return {k: v or None if isinstance(v, str) else v for k, v in out.items()}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_think_block_and_mistral_call(qwen3_server: ServerProcess, stream: bool) -> None:
    """A forced `<think>` block lands in reasoning and reasoning_content, and the Mistral call
    after it in tool_calls, with Mistral's 9-character ids; only the blank lines between them
    stay content."""
    forced = f"<think>{THOUGHT}</think>\n\n{MISTRAL_CALL}"
    got = await reply(qwen3_server, stream, tools=TOOLS, max_tokens=80,
                      extra_body={"structured_outputs": {"choice": [forced]}})
    assert got["reasoning"] == got["reasoning_content"] == THOUGHT
    assert [(name, args) for _, name, args in got["calls"]] == [("get_weather", {"city": "Paris"})]
    call_id = got["calls"][0][0]
    assert len(call_id) == 9 and call_id.isalnum()
    assert (got["content"] or "").strip() == "" and got["finish"] == "tool_calls"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_no_thinking_is_all_content(qwen3_server: ServerProcess, stream: bool) -> None:
    """With enable_thinking false the template closes the reasoning in the prompt and the
    parser reads the whole reply as content, `<think>` tags and all."""
    forced = "<think>x</think>Hello"
    got = await reply(qwen3_server, stream, max_tokens=20, extra_body={
        **NO_THINKING, "structured_outputs": {"choice": [forced]}})
    assert got["reasoning"] is None and got["reasoning_content"] is None
    assert got["content"] == forced and got["finish"] == "stop"


async def test_template_kwargs_change_the_prompt(qwen3_server: ServerProcess) -> None:
    """chat_template_kwargs reach the template, in /tokenize as in chat: enable_thinking false
    appends the empty think block to the same prompt."""
    async with httpx.AsyncClient(base_url=qwen3_server.base_url, timeout=60) as http:
        default = (await http.post("/tokenize", json={"messages": ASK})).json()["tokens"]
        off = (await http.post("/tokenize", json={"messages": ASK, **NO_THINKING})).json()
        tail = (await http.post("/detokenize", json={"tokens": off["tokens"][len(default):]}))
    assert off["tokens"][:len(default)] == default and len(off["tokens"]) > len(default)
    assert tail.json()["prompt"] == "<think>\n\n</think>\n\n"


@pytest.mark.parametrize("fields,words", [
    ({"chat_template_kwargs": "enable_thinking"}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"tokenize": True}}, "may not set tokenize"),
    ({"messages": [{"role": "robot", "content": "beep"}]}, "Unexpected message role: robot"),
], ids=["not-an-object", "reserved-name", "template-raises"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
async def test_bad_template_input_is_a_400(qwen3_server: ServerProcess,
                                           fields: dict[str, Any], words: str,
                                           path: str) -> None:
    async with httpx.AsyncClient(base_url=qwen3_server.base_url, timeout=60) as http:
        response = await http.post(path, json={"messages": ASK, "max_tokens": 4, **fields})
    assert response.status_code == 400, response.text
    assert words in json_error(response)["message"]
