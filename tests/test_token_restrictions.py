"""vLLM's `allowed_token_ids` and `bad_words`, run as vLLM runs them, on the shared server
with the real `openai` SDK: only the allowed tokens are written, and a banned word is never
written whole (at the start of the text or after a space), where the same request without
them writes it; the agents' APIs, which carry no sampling extension, refuse both by name."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from server_fixtures import ServerProcess

from engine.bad_words import banned_now

openai = pytest.importorskip("openai")

MODEL = "SmolLM2-135M-Instruct"
FRANCE = "The capital of France is"


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[Any]:
    async with openai.AsyncOpenAI(base_url=server.api_url, api_key="local", max_retries=0,
                                  timeout=120) as sdk:
        yield sdk


async def completion(client: Any, **fields: Any) -> str:
    done = await client.completions.create(model=MODEL, prompt=FRANCE, max_tokens=12,
                                           temperature=0, extra_body=fields)
    return str(done.choices[0].text)


@pytest.mark.slow
async def test_only_the_allowed_tokens_are_written(client: Any, http: httpx.AsyncClient) -> None:
    digits = []
    for digit in "0123456789":
        tokens = (await http.post("/tokenize", json={"prompt": digit,
                                                     "add_special_tokens": False})).json()
        digits += tokens["tokens"]
    free = await completion(client, seed=1, temperature=1.0)
    assert not free.strip().isdigit()
    sampled = await completion(client, seed=1, temperature=1.0, allowed_token_ids=digits,
                               ignore_eos=True)
    assert sampled.isdigit() and len(sampled) >= 12, sampled


@pytest.mark.slow
async def test_a_bad_word_is_never_written(client: Any) -> None:
    assert "Paris" in await completion(client)
    banned = await completion(client, bad_words=["Paris"])
    assert "Paris" not in banned and banned.strip()
    chat = await client.chat.completions.create(
        model=MODEL, max_tokens=12, temperature=0, extra_body={"bad_words": ["Paris"]},
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" not in (chat.choices[0].message.content or "")


def test_a_word_of_several_tokens_is_cut_at_its_last() -> None:
    word = [11, 12, 13]
    assert banned_now([word], [5, 11]) == []  # its first tokens stay free
    assert banned_now([word], [5, 11, 12]) == [13]  # its last is banned once the rest is there
    assert banned_now([[7], word], []) == [7]  # a one-token word, at every step


@pytest.mark.slow
@pytest.mark.parametrize("field,value", [("bad_words", ["Paris"]), ("allowed_token_ids", [5])])
async def test_the_agents_apis_refuse_them(http: httpx.AsyncClient, field: str, value: Any) -> None:
    messages = await http.post("/v1/messages", json={
        "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}],
        field: value})
    assert messages.status_code == 400 and field in messages.json()["error"]["message"]
    responses = await http.post("/v1/responses", json={"input": "Hi", field: value})
    assert responses.status_code == 400 and responses.json()["error"]["param"] == field
