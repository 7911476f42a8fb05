"""LoRA adapters over HTTP, on a real `pagode serve` and the real openai SDK: base and adapter
requests in flight together answer what transformers + PEFT (merged) generate; an adapter
loaded and unloaded while another request streams; an unknown adapter is OpenAI's 404, a rank
over --max-lora-rank a 400 before anything is loaded; vLLM's lora_requests_info names the
adapters that run."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from lora_adapters import save_random_adapter
from server_fixtures import ServerProcess, running_server
from tiny_models import TinyZoo, cached_greedy, prompts, tiny_spec

SPEC = tiny_spec("llama", "LlamaConfig", "LlamaForCausalLM", "llama")
NEW_TOKENS = 16
LONG_TOKENS = 480  # the stream on `a` outlasts the loads, requests and unloads made beside it
SPECIALS = 3  # <unk>, <s>, </s>: the tiny tokenizer's words are w0.. from id 3 (tests/tiny_models.py)


class Served:
    def __init__(self, server: ServerProcess, refs: dict[str | None, torch.nn.Module],
                 paths: dict[str, Path]) -> None:
        self.server, self.refs, self.paths = server, refs, paths


@pytest.fixture(scope="module")
def served(tiny_zoo: TinyZoo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tiny_zoo.folder(SPEC)
    root = tmp_path_factory.mktemp("lora-http")
    refs: dict[str | None, torch.nn.Module] = {None: tiny_zoo.reference(SPEC)}
    paths: dict[str, Path] = {}
    for name, rank, seed in (("a", 8, 11), ("b", 16, 12), ("c", 16, 14), ("wide", 32, 13)):
        paths[name] = root / name
        refs[name] = save_random_adapter(base, paths[name], rank, seed)
    args = ["--model", str(base), "--served-model-name", "tiny", "--quantization", "none", "--kv-cache-dtype",
            "fp32", "--kv-cache-memory", "32MiB", "--max-model-len", "512", "--max-num-seqs", "8",
            "--lora-modules", f"a={paths['a']}", "--lora-modules", f"b={paths['b']}", "--max-loras", "3",
            "--max-lora-rank", "16", "--enable-lora-runtime-updates"]
    with running_server(args, root) as server:
        yield Served(server, refs, paths)


def words(token_ids: list[int]) -> list[str]:
    """The text's words of these ids (specials are skipped in the text)."""
    return [f"w{t - SPECIALS}" for t in token_ids if t >= SPECIALS]


def sdk(server: ServerProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.api_url, api_key="x", max_retries=0)


async def complete(client: openai.AsyncOpenAI, model: str, prompt: list[int]) -> list[str]:
    out = await client.completions.create(model=model, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0,
                                          extra_body={"ignore_eos": True})
    return out.choices[0].text.split()


def expected(served: Served, lora: str | None, prompt: list[int]) -> list[str]:
    return words(cached_greedy(served.refs[lora], prompt, NEW_TOKENS))


async def post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60.0) as client:
        return await client.post(path, json=body)


async def test_mixed_batch_matches_peft(served: Served) -> None:
    ids = prompts(6)
    models: list[str | None] = [None, "a", "b", "a", None, "b"]
    async with sdk(served.server) as client:
        outs = await asyncio.gather(*(complete(client, m or "tiny", p) for m, p in zip(models, ids, strict=True)))
    for model, prompt, out in zip(models, ids, outs, strict=True):
        assert out == expected(served, model, prompt), f"model {model}"
    # Each adapter changes the output, so the equalities above say which deltas were added.
    assert len({tuple(expected(served, m, ids[1])) for m in (None, "a", "b")}) == 3


async def test_chat_runs_on_the_named_adapter(served: Served) -> None:
    """/v1/chat/completions picks the adapter by `model` as /v1/completions does."""
    messages = [{"role": "user", "content": "w5 w17 w42 w9 w100 w3"}]
    tokenized = await post(served.server, "/tokenize", {"model": "tiny", "messages": messages})
    assert tokenized.status_code == 200, tokenized.text
    prompt = tokenized.json()["tokens"]
    async with sdk(served.server) as client:
        reply = await client.chat.completions.create(model="b", messages=messages,  # type: ignore[arg-type]
                                                     max_tokens=NEW_TOKENS, temperature=0,
                                                     extra_body={"ignore_eos": True})
    assert (reply.choices[0].message.content or "").split() == expected(served, "b", prompt)
    assert expected(served, "b", prompt) != expected(served, None, prompt)


async def test_load_and_unload_while_streaming(served: Served) -> None:
    prompt = prompts(2, seed=3)[1]
    async with sdk(served.server) as client:
        stream = await client.completions.create(model="a", prompt=prompt, max_tokens=LONG_TOKENS, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True})
        pieces: list[str] = []
        first = await anext(aiter(stream))
        pieces.append(first.choices[0].text)
        loaded = await post(served.server, "/v1/load_lora_adapter",
                            {"lora_name": "c", "lora_path": str(served.paths["c"])})
        assert loaded.status_code == 200, loaded.text
        assert "added successfully" in loaded.text
        listed = {m.id: m for m in (await client.models.list()).data}  # vLLM's cards: name, folder, base
        assert set(listed) == {"tiny", "a", "b", "c"}
        assert listed["c"].parent == "tiny" and listed["c"].root == str(served.paths["c"])
        assert listed["tiny"].parent is None
        # c serves at once, in the same batch as the stream on a and a base request.
        c_out, base_out = await asyncio.gather(complete(client, "c", prompt), complete(client, "tiny", prompt))
        assert c_out == expected(served, "c", prompt)
        assert base_out == expected(served, None, prompt)
        metrics = httpx.get(f"{served.server.base_url}/metrics").text
        info = next(line for line in metrics.splitlines() if line.startswith("vllm:lora_requests_info{"))
        assert 'running_lora_adapters="a"' in info and 'max_lora="3"' in info
        unloaded = await post(served.server, "/v1/unload_lora_adapter", {"lora_name": "c"})
        assert unloaded.status_code == 200, unloaded.text
        busy = await post(served.server, "/v1/unload_lora_adapter", {"lora_name": "a"})
        assert busy.status_code == 409 and "requests running" in busy.json()["error"]["message"]
        async for chunk in stream:
            pieces.append(chunk.choices[0].text)
        with pytest.raises(openai.NotFoundError) as gone:
            await complete(client, "c", prompt)
        assert {m.id for m in (await client.models.list()).data} == {"tiny", "a", "b"}
    assert gone.value.status_code == 404 and "`c` does not exist" in gone.value.message
    long_ref = words(cached_greedy(served.refs["a"], prompt, LONG_TOKENS))
    assert "".join(pieces).split() == long_ref  # the stream on a never saw c come and go


async def test_unknown_adapter_is_openai_404(served: Served) -> None:
    async with sdk(served.server) as client:
        with pytest.raises(openai.NotFoundError) as err:
            await complete(client, "nope", [1, 5, 6])
    body: Any = err.value.body
    assert body["param"] == "model" and "`nope` does not exist" in body["message"]
    missing = await post(served.server, "/v1/unload_lora_adapter", {"lora_name": "nope"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"


async def test_rank_over_limit_is_400_and_loads_nothing(served: Served) -> None:
    response = await post(served.server, "/v1/load_lora_adapter",
                          {"lora_name": "wide", "lora_path": str(served.paths["wide"])})
    assert response.status_code == 400
    error = response.json()["error"]
    assert "rank 32, above --max-lora-rank 16" in error["message"] and error["param"] == "lora_path"
    bad = await post(served.server, "/v1/load_lora_adapter", {"lora_name": "x"})
    assert bad.status_code == 400  # lora_path missing: the body's own 400
    async with sdk(served.server) as client:
        with pytest.raises(openai.NotFoundError):
            await complete(client, "wide", [1, 5, 6])


def stream_events(server: ServerProcess, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON data of each SSE event of a streamed POST."""
    import json

    events = []
    with httpx.stream("POST", f"{server.base_url}{path}", json={**body, "stream": True}, timeout=60.0) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                events.append(json.loads(line[5:]))
    return events


async def test_responses_name_the_adapter(served: Served) -> None:
    """As vLLM does, a response carries the adapter its request named, not the base model, in
    every API and in every stream chunk; a base request still carries the base's name. The
    metrics keep vLLM's labels: the adapter's requests count under the base model's
    `model_name` (vLLM's series are per served model; lora_requests_info names adapters)."""
    prompt = prompts(1, seed=5)[0]
    text_prompt = " ".join(words(prompt))
    short = {"max_tokens": 4, "temperature": 0}
    async with sdk(served.server) as client:
        for model in ("b", "tiny"):
            done = await client.completions.create(model=model, prompt=prompt, **short)  # type: ignore[call-overload]
            turn = [{"role": "user", "content": text_prompt}]
            chat = await client.chat.completions.create(model=model, messages=turn, **short)  # type: ignore[arg-type]
            assert done.model == model and chat.model == model
    chunks = stream_events(served.server, "/v1/completions", {"model": "b", "prompt": prompt, **short})
    chat_chunks = stream_events(served.server, "/v1/chat/completions",
                                {"model": "b", "messages": [{"role": "user", "content": text_prompt}], **short})
    assert len(chunks) >= 4 and {c["model"] for c in chunks} == {"b"}
    assert len(chat_chunks) >= 4 and {c["model"] for c in chat_chunks} == {"b"}
    message = {"model": "b", "max_tokens": 4, "messages": [{"role": "user", "content": text_prompt}]}
    reply = await post(served.server, "/v1/messages", message)
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "b"
    started = [e for e in stream_events(served.server, "/v1/messages", message) if e["type"] == "message_start"]
    assert [e["message"]["model"] for e in started] == ["b"]
    asked = {"model": "b", "input": text_prompt, "max_output_tokens": 4, "store": False}
    response = await post(served.server, "/v1/responses", asked)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "b"
    events = [e for e in stream_events(served.server, "/v1/responses", asked) if "response" in e]
    assert len(events) >= 2 and {e["response"]["model"] for e in events} == {"b"}
    metrics = httpx.get(f"{served.server.base_url}/metrics").text
    success = [line for line in metrics.splitlines() if line.startswith("pagode:request_success_total{")]
    assert success and all('model_name="tiny"' in line for line in success)
    assert 'model_name="b"' not in metrics
