"""Bad input gets 400 with the OpenAI error body (never 422 or 500); an unknown model gets
404; none of it disturbs requests in flight."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from server_fixtures import json_error

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "Hi"}]

# (id, path, JSON body or raw bytes, status, param)
BAD_REQUESTS: list[tuple[str, str, Any, int, str | None]] = [
    ("prompt-over-context", COMPLETIONS, {"prompt": [100] * 1100}, 400, "input_tokens"),
    ("prompt-at-context", COMPLETIONS, {"prompt": [100] * 1024}, 400, "input_tokens"),
    ("prompt-plus-max-tokens", COMPLETIONS, {"prompt": [100] * 10, "max_tokens": 1015}, 400,
     "max_tokens"),
    ("chat-max-tokens-over", CHAT, {"messages": MESSAGES, "max_tokens": 5000}, 400,
     "max_tokens"),
    ("max-tokens-negative", COMPLETIONS, {"prompt": "a", "max_tokens": -1}, 400, "max_tokens"),
    ("max-tokens-zero", COMPLETIONS, {"prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
    ("max-tokens-float", COMPLETIONS, {"prompt": "a", "max_tokens": 2.5}, 400, "max_tokens"),
    ("max-tokens-string", COMPLETIONS, {"prompt": "a", "max_tokens": "ten"}, 400,
     "max_tokens"),
    ("chat-max-completion-tokens-negative", CHAT,
     {"messages": MESSAGES, "max_completion_tokens": -3}, 400, "max_completion_tokens"),
    ("temperature-high", COMPLETIONS, {"prompt": "a", "temperature": 2.5}, 400,
     "temperature"),
    ("temperature-negative", CHAT, {"messages": MESSAGES, "temperature": -0.1}, 400,
     "temperature"),
    ("top-p-zero", COMPLETIONS, {"prompt": "a", "top_p": 0}, 400, "top_p"),
    ("top-p-high", CHAT, {"messages": MESSAGES, "top_p": 1.5}, 400, "top_p"),
    ("top-k-negative", COMPLETIONS, {"prompt": "a", "top_k": -2}, 400, "top_k"),
    ("min-p-high", COMPLETIONS, {"prompt": "a", "min_p": 1.5}, 400, "min_p"),
    ("presence-penalty", COMPLETIONS, {"prompt": "a", "presence_penalty": 3}, 400,
     "presence_penalty"),
    ("repetition-penalty", COMPLETIONS, {"prompt": "a", "repetition_penalty": 0}, 400,
     "repetition_penalty"),
    ("min-tokens-over-max", COMPLETIONS, {"prompt": "a", "max_tokens": 2, "min_tokens": 5},
     400, "min_tokens"),
    ("empty-prompt", COMPLETIONS, {"prompt": ""}, 400, "prompt"),
    ("empty-prompt-list", COMPLETIONS, {"prompt": []}, 400, "prompt"),
    ("empty-token-list", COMPLETIONS, {"prompt": [[]]}, 400, "prompt"),
    ("empty-string-in-batch", COMPLETIONS, {"prompt": ["a", ""]}, 400, "prompt"),
    ("token-out-of-vocab", COMPLETIONS, {"prompt": [10**9]}, 400, "prompt"),
    ("prompt-wrong-type", COMPLETIONS, {"prompt": {"text": "a"}}, 400, "prompt"),
    ("prompt-missing", COMPLETIONS, {"max_tokens": 3}, 400, "prompt"),
    ("messages-string", CHAT, {"messages": "hello"}, 400, "messages"),
    ("messages-empty", CHAT, {"messages": []}, 400, "messages"),
    ("messages-missing", CHAT, {"model": None}, 400, "messages"),
    ("message-without-role", CHAT, {"messages": [{"content": "hi"}]}, 400, "messages"),
    ("malformed-json", COMPLETIONS, b'{"prompt": "a", ', 400, None),
    ("json-array-body", COMPLETIONS, b'["a"]', 400, None),
    ("stop-empty-string", COMPLETIONS, {"prompt": "a", "stop": ""}, 400, "stop"),
    ("stop-list-with-empty", CHAT, {"messages": MESSAGES, "stop": ["x", ""]}, 400, "stop"),
    ("n-zero", COMPLETIONS, {"prompt": "a", "n": 0}, 400, "n"),
    ("n-zero-chat", CHAT, {"messages": MESSAGES, "n": 0}, 400, "n"),
    ("logprobs-too-large", COMPLETIONS, {"prompt": "a", "logprobs": 21}, 400, "logprobs"),
    ("top-logprobs-too-large", CHAT,
     {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ("top-logprobs-without-logprobs", CHAT, {"messages": MESSAGES, "top_logprobs": 2}, 400,
     "top_logprobs"),
    ("stream-options-without-stream", COMPLETIONS,
     {"prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("stream-options-stream-false", CHAT,
     {"messages": MESSAGES, "stream": False, "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    ("logit-bias-bad-key", COMPLETIONS, {"prompt": "a", "logit_bias": {"abc": 1}}, 400,
     "logit_bias"),
    ("unknown-model", COMPLETIONS, {"prompt": "a", "model": "gpt-17"}, 404, "model"),
    ("unknown-model-chat", CHAT, {"messages": MESSAGES, "model": "gpt-17"}, 404, "model"),
    ("tokenize-neither", "/tokenize", {"add_special_tokens": True}, 400, None),
    ("detokenize-wrong-type", "/detokenize", {"tokens": "abc"}, 400, "tokens"),
]


async def post(http: httpx.AsyncClient, path: str, body: Any) -> httpx.Response:
    if isinstance(body, bytes):
        return await http.post(path, content=body, headers={"content-type": "application/json"})
    return await http.post(path, json=body)


@pytest.mark.parametrize(("path", "body", "status", "param"),
                         [case[1:] for case in BAD_REQUESTS],
                         ids=[case[0] for case in BAD_REQUESTS])
async def test_bad_request(http: httpx.AsyncClient, path: str, body: Any, status: int,
                           param: str | None) -> None:
    response = await post(http, path, body)
    assert response.status_code == status, response.text
    error = json_error(response)
    assert error["param"] == param, error
    assert error["type"] == {400: "BadRequestError", 404: "NotFoundError"}[status]


async def test_context_messages_use_vllm_wording(http: httpx.AsyncClient) -> None:
    response = await post(http, COMPLETIONS, {"prompt": [100] * 1100})
    assert json_error(response)["message"].startswith(
        "This model's maximum context length is 1024 tokens. However, your request has "
        "1100 input tokens")
    response = await post(http, COMPLETIONS, {"prompt": [100] * 10, "max_tokens": 1015})
    assert "max_tokens" in json_error(response)["message"]


async def test_unknown_route_and_method_are_openai_shaped(http: httpx.AsyncClient) -> None:
    missing = await http.get("/v1/nothing-here")
    assert missing.status_code == 404
    json_error(missing)
    wrong_method = await http.get("/v1/completions")
    assert wrong_method.status_code == 405
    json_error(wrong_method)


async def test_bad_requests_do_not_disturb_a_stream_in_flight(http: httpx.AsyncClient) -> None:
    body = {"prompt": "List the planets of the solar system:", "max_tokens": 24,
            "temperature": 0, "ignore_eos": True}
    reference = (await http.post(COMPLETIONS, json=body)).json()["choices"][0]["text"]
    async with http.stream("POST", COMPLETIONS, json={**body, "stream": True}) as stream:
        lines = stream.aiter_lines()
        first = await anext(lines)  # the stream is running
        responses = await asyncio.gather(*(post(http, case[1], case[2])
                                           for case in BAD_REQUESTS))
        rest = [first] + [line async for line in lines]
    assert [r.status_code for r in responses] == [case[3] for case in BAD_REQUESTS]
    data = [d for d in (line.removeprefix("data: ") for line in rest if line) if d]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == reference
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
