"""A Qwen3-Reranker-style checkpoint served over HTTP: /v1/rerank scores equal transformers'
sigmoid(logit(yes) - logit(no)) on the judging prompt, and the same folder with `--task embed`
serves last-token embeddings equal to transformers' final hidden state (vLLM's convert), both
in fp32 (--quantization none); the server's defaults (auto: bf16 products where the CPU has
them and the checkpoint holds the gate) rerank within 0.02 of transformers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
import torch.nn.functional as F
from pooling_zoo import build_qwen3_reranker
from server_fixtures import ServerProcess, running_server

from engine.tuning.gemm_choice import bf16_can_win

DOCS = ["paris is the capital of france", "the cat sat on the mat", "a river of blue sky"]
QUERY = "what is the capital of france"
INSTRUCTION = "Judge the passage"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen3_reranker(tmp_path_factory.mktemp("qwen3-reranker"))


@pytest.fixture(scope="module")
def reference(folder: Path) -> tuple[torch.nn.Module, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(str(folder)))


def serve(folder: Path, tmp_path_factory: pytest.TempPathFactory, *args: str) -> Iterator[ServerProcess]:
    """fp32 unless args say otherwise, so the numbers can be held to transformers' at 1e-5."""
    with running_server(["--model", str(folder), "--max-model-len", "512", "--quantization", "none", *args],
                        tmp_path_factory.mktemp("logs")) as server:
        yield server


@pytest.fixture(scope="module")
def rerank_server(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serve(folder, tmp_path_factory)


def yes_no_score(reference: tuple[torch.nn.Module, object], doc: str) -> float:
    model, tokenizer = reference
    text = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and "
            "the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
            f"<|im_start|>user\n<Instruct>: {INSTRUCTION}\n<Query>: {QUERY}\n<Document>: {doc}<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])  # type: ignore[operator]
    yes, no = tokenizer.convert_tokens_to_ids(["yes", "no"])  # type: ignore[attr-defined]
    with torch.no_grad():
        last = model(ids).logits[0, -1]
    return torch.sigmoid(last[yes] - last[no]).item()


def test_rerank_equals_transformers_yes_no_logits(rerank_server: ServerProcess,
                                                  reference: tuple[torch.nn.Module, object]) -> None:
    want = [yes_no_score(reference, d) for d in DOCS]
    reply = httpx.post(f"{rerank_server.api_url}/rerank",
                       json={"query": QUERY, "documents": DOCS, "instruction": INSTRUCTION}, timeout=60)
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    assert [r["index"] for r in results] == sorted(range(len(DOCS)), key=lambda i: -want[i])
    assert max(abs(r["relevance_score"] - want[r["index"]]) for r in results) <= 1e-5


def test_default_server_reranks_within_the_bf16_gate(folder: Path, tmp_path_factory: pytest.TempPathFactory,
                                                     reference: tuple[torch.nn.Module, object]) -> None:
    """--quantization auto (the last flag wins): the packed decoder in bf16 products where the
    CPU has bf16 matrix units, its scores within 0.02 of transformers' fp32 ones (measured 0.010
    on the equality tests' batch)."""
    want = [yes_no_score(reference, d) for d in DOCS]
    for server in serve(folder, tmp_path_factory, "--quantization", "auto"):
        reply = httpx.post(f"{server.api_url}/rerank",
                           json={"query": QUERY, "documents": DOCS, "instruction": INSTRUCTION}, timeout=60)
        log = server.log_path.read_text()
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    assert max(abs(r["relevance_score"] - want[r["index"]]) for r in results) <= 0.02
    assert ("pooling model in bf16 products" in log) == bf16_can_win()


def test_task_embed_serves_the_last_token_state(folder: Path, tmp_path_factory: pytest.TempPathFactory,
                                                 reference: tuple[torch.nn.Module, object]) -> None:
    model, tokenizer = reference
    want = []
    for doc in DOCS:
        ids = torch.tensor([tokenizer(doc)["input_ids"]])  # type: ignore[operator]
        with torch.no_grad():
            hidden = model(ids, output_hidden_states=True).hidden_states[-1][0, -1]
        want.append(F.normalize(hidden, dim=-1))
    for server in serve(folder, tmp_path_factory, "--task", "embed"):
        sdk = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0)
        got = torch.tensor([d.embedding for d in sdk.embeddings.create(model=folder.name, input=DOCS).data])
        assert F.cosine_similarity(got, torch.stack(want)).min().item() >= 0.99999
        assert (got - torch.stack(want)).abs().max().item() <= 1e-5
