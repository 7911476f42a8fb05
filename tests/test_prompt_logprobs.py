"""Prompt logprobs equal transformers' log-softmax on the same prompt (fp32, 1e-4), through
chunked prefill, and a cached prefix neither hides them nor breaks the cache."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import torch
from server_fixtures import ServerProcess

from engine import LLM, SamplingParams

pytestmark = pytest.mark.slow

PROMPT = "The river rises in the mountains, crosses three valleys and reaches the sea. " * 4


def reference_logprobs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_prompt_logprobs_match_transformers(hf_reference: torch.nn.Module, small_llm: LLM,
                                            overrides: Any) -> None:
    overrides(max_num_batched_tokens=16)
    llm = small_llm
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3)
    first = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=2))[0]  # fills the cache
    ids = first.prompt_token_ids
    assert len(ids) > 3 * 16  # read in several chunks
    hits = llm.engine.stats().prefix_cache_hits_total
    out = llm.generate(PROMPT, params)[0]
    assert llm.engine.stats().prefix_cache_hits_total == hits  # it read its whole prompt
    lps = out.prompt_logprobs
    assert lps is not None and lps[0] is None and len(lps) == len(ids)
    got = torch.tensor([lp.logprob for lp in lps[1:]])  # type: ignore[union-attr]
    torch.testing.assert_close(got, reference_logprobs(hf_reference, ids), atol=1e-4, rtol=0)
    assert all(len(lp.top) == 3 and lp.rank >= 1 for lp in lps[1:])  # type: ignore[union-attr,operator]
    assert out.token_ids == first.token_ids
    # The blocks it computed are published as usual: a later request hits them.
    llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=1))
    assert llm.engine.stats().prefix_cache_hits_total > hits


async def test_echo_logprobs_for_loglikelihood(server: ServerProcess) -> None:
    # What lm-evaluation-harness's local-completions sends for log-likelihood tasks.
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        response = await http.post("/v1/completions", json={
            "prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0})
        body = response.json()
        assert response.status_code == 200, body
        choice = body["choices"][0]
        assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
        lps = choice["logprobs"]
        assert lps["token_logprobs"][0] is None and lps["top_logprobs"][0] is None
        assert len(lps["tokens"]) == body["usage"]["prompt_tokens"]
        assert body["usage"]["completion_tokens"] == 0
        assert all(v <= 0 for v in lps["token_logprobs"][1:])
        vllm = await http.post("/v1/completions", json={
            "prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0})
        entries = vllm.json()["choices"][0]["prompt_logprobs"]
        assert entries[0] is None and len(entries) == len(lps["tokens"])
        for entry, value in zip(entries[1:], lps["token_logprobs"][1:], strict=True):
            (only,) = entry.values()
            assert abs(only["logprob"] - value) < 1e-4
        refused = await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})
        assert refused.status_code == 400
