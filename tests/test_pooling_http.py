"""/v1/embeddings, /v1/rerank and /v1/score on real servers of tiny pooling checkpoints,
driven by the real openai SDK and langchain-openai's OpenAIEmbeddings, with the numbers
compared to sentence-transformers on the same folder; refusals are 400s in OpenAI's shape
before any work."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
import torch.nn.functional as F
from pooling_zoo import build_bert, build_cross_encoder
from server_fixtures import ServerProcess, json_error, metric_value, running_server

from engine.tuning.gemm_choice import bf16_can_win

TEXTS = ["paris", "the cat sat on the mat", "what is the capital of france where the river is blue", "dog ran far"]
LONG = " ".join(["the cat sat on the mat"] * 40)  # ~240 tokens: past the tiny BERT's 128 positions
COSINE = 0.99999


@pytest.fixture(scope="module")
def embed_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bert(tmp_path_factory.mktemp("bert-embed"))


@pytest.fixture(scope="module")
def embed_server(embed_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # fp32 (--quantization none), so the numbers can be held to sentence-transformers' at 1e-5.
    with running_server(["--model", str(embed_folder), "--served-model-name", "mini-embed", "--quantization", "none"],
                        tmp_path_factory.mktemp("logs")) as server:
        yield server


@pytest.fixture(scope="module")
def score_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    folder = build_cross_encoder(tmp_path_factory.mktemp("cross-encoder"))
    with running_server(["--model", str(folder), "--quantization", "none"], tmp_path_factory.mktemp("logs")) as server:
        yield server, folder


def reference(folder: Path, texts: list[str], **kwargs: object) -> torch.Tensor:
    from sentence_transformers import SentenceTransformer

    return torch.tensor(SentenceTransformer(str(folder), device="cpu").encode(texts, **kwargs))


def assert_same_vectors(got: list[list[float]], want: torch.Tensor) -> None:
    tensor = torch.tensor(got)
    assert tensor.shape == want.shape
    assert F.cosine_similarity(tensor, want).min().item() >= COSINE
    assert (tensor - want).abs().max().item() <= 1e-5


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0)


def test_openai_sdk_embeddings_equal_sentence_transformers(embed_server: ServerProcess, embed_folder: Path) -> None:
    want = reference(embed_folder, TEXTS)
    sdk = client(embed_server)
    as_base64 = sdk.embeddings.create(model="mini-embed", input=TEXTS)  # the SDK asks for base64
    as_floats = sdk.embeddings.create(model="mini-embed", input=TEXTS, encoding_format="float")
    for response in (as_base64, as_floats):
        assert [d.index for d in response.data] == list(range(len(TEXTS)))
        assert_same_vectors([d.embedding for d in response.data], want)
        assert response.model == "mini-embed" and response.usage.prompt_tokens == response.usage.total_tokens
    single = sdk.embeddings.create(model="mini-embed", input=TEXTS[1], user="someone")
    assert_same_vectors([single.data[0].embedding], want[1:2])


def test_default_server_embeds_within_the_bf16_gate(embed_folder: Path,
                                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    """The server's defaults (--quantization auto: bf16 products where the CPU has bf16 matrix
    units and the checkpoint holds the gate) answer the SDK within cosine 0.999 of encode."""
    want = reference(embed_folder, TEXTS)
    with running_server(["--model", str(embed_folder), "--served-model-name", "auto"],
                        tmp_path_factory.mktemp("logs")) as server:
        response = client(server).embeddings.create(model="auto", input=TEXTS)
        log = server.log_path.read_text()
    got = torch.tensor([d.embedding for d in response.data])
    assert F.cosine_similarity(got, want).min().item() >= 0.999
    assert ("pooling model in bf16 products" in log) == bf16_can_win()


def test_dimensions_truncate_and_renormalize(embed_server: ServerProcess, embed_folder: Path) -> None:
    want = reference(embed_folder, TEXTS, truncate_dim=16, normalize_embeddings=True)
    response = client(embed_server).embeddings.create(model="mini-embed", input=TEXTS, dimensions=16)
    assert_same_vectors([d.embedding for d in response.data], want)


def test_token_ids_embed_as_their_text(embed_server: ServerProcess, embed_folder: Path) -> None:
    from transformers import AutoTokenizer

    ids = [AutoTokenizer.from_pretrained(str(embed_folder))(t)["input_ids"] for t in TEXTS[:2]]
    want = reference(embed_folder, TEXTS[:2])
    sdk = client(embed_server)
    many = sdk.embeddings.create(model="mini-embed", input=ids, encoding_format="float")
    one = sdk.embeddings.create(model="mini-embed", input=ids[1], encoding_format="float")
    assert_same_vectors([d.embedding for d in many.data], want)
    assert_same_vectors([one.data[0].embedding], want[1:2])
    assert many.usage.prompt_tokens == len(ids[0]) + len(ids[1])


def test_langchain_openai_embeddings(embed_server: ServerProcess, embed_folder: Path) -> None:
    from langchain_openai import OpenAIEmbeddings

    embedder = OpenAIEmbeddings(model="mini-embed", base_url=embed_server.api_url, api_key="unused",
                                check_embedding_ctx_length=False, chunk_size=3)
    assert_same_vectors(embedder.embed_documents(TEXTS), reference(embed_folder, TEXTS))
    assert_same_vectors([embedder.embed_query(TEXTS[2])], reference(embed_folder, TEXTS[2:3]))


async def test_concurrent_requests_each_get_their_own_vectors(embed_server: ServerProcess,
                                                              embed_folder: Path) -> None:
    want = reference(embed_folder, TEXTS)
    async with httpx.AsyncClient(base_url=embed_server.api_url, timeout=60) as http:
        replies = await asyncio.gather(*(http.post("/embeddings", json={"input": [TEXTS[i % 4], TEXTS[(i + 1) % 4]]})
                                         for i in range(8)))
    for i, reply in enumerate(replies):
        assert reply.status_code == 200, reply.text
        got = [d["embedding"] for d in reply.json()["data"]]
        assert_same_vectors(got, want[[i % 4, (i + 1) % 4]])


async def test_concurrent_requests_share_forwards(embed_server: ServerProcess) -> None:
    """Eight requests sent at once (the default --max-num-queued-reqs; a ninth would be a 429)
    are packed into fewer forwards than requests (the engine takes every waiting request's
    inputs into one step under the token budget), and each forward is counted as one engine
    step of prompt tokens, as a prefill step is."""
    def read() -> tuple[float, float, float]:
        text = httpx.get(f"{embed_server.base_url}/metrics").text
        return (metric_value(text, "pagode:iteration_tokens_total_count"),
                metric_value(text, "pagode:iteration_tokens_total_sum"),
                metric_value(text, "pagode:prompt_tokens_total"))

    steps, step_tokens, prompt_tokens = read()
    async with httpx.AsyncClient(base_url=embed_server.api_url, timeout=60) as http:
        replies = await asyncio.gather(*(http.post("/embeddings", json={"input": TEXTS}) for _ in range(8)))
    assert [reply.status_code for reply in replies] == [200] * len(replies), replies[-1].text
    tokens = sum(reply.json()["usage"]["prompt_tokens"] for reply in replies)
    new_steps, new_step_tokens, new_prompt_tokens = read()
    assert 1 <= new_steps - steps < len(replies)
    assert new_step_tokens - step_tokens == tokens == new_prompt_tokens - prompt_tokens


async def test_requests_past_the_queue_bound_are_429s(embed_server: ServerProcess) -> None:
    """A pooling request holds one queue slot until it is answered: past --max-num-queued-reqs
    (8 by default) the others are refused at once with a 429 in OpenAI's shape and Retry-After,
    as generation requests are, and the admitted ones are all answered."""
    async with httpx.AsyncClient(base_url=embed_server.api_url, timeout=60) as http:
        replies = await asyncio.gather(*(http.post("/embeddings", json={"input": TEXTS * 8}) for _ in range(32)))
    refused = [reply for reply in replies if reply.status_code == 429]
    assert refused and len(refused) <= len(replies) - 8
    assert all(reply.status_code == 200 for reply in replies if reply.status_code != 429)
    for reply in refused:
        assert json_error(reply)["type"] == "RateLimitError" and int(reply.headers["Retry-After"]) >= 1


def test_over_long_input_is_a_400_unless_truncated(embed_server: ServerProcess, embed_folder: Path) -> None:
    sdk = client(embed_server)
    with pytest.raises(openai.BadRequestError, match="maximum context length of 128.*truncate_prompt_tokens"):
        sdk.embeddings.create(model="mini-embed", input=["paris", LONG])
    response = sdk.embeddings.create(model="mini-embed", input=LONG, encoding_format="float",
                                     extra_body={"truncate_prompt_tokens": 20})
    assert response.usage.prompt_tokens == 20
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(embed_folder), device="cpu")
    st.max_seq_length = 20
    assert_same_vectors([response.data[0].embedding], torch.tensor(st.encode([LONG])))


@pytest.mark.parametrize(("body", "param"), [
    ({"input": []}, "input"),
    ({"input": ""}, "input"),
    ({"input": "paris", "dimensions": 65}, "dimensions"),
    ({"input": "paris", "dimensions": 0}, "dimensions"),
    ({"input": [[1, 2], [10 ** 6]]}, "input"),
    ({"input": "paris", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "paris", "prompt_name": "nope"}, "prompt_name"),
    ({"input": "paris", "truncate_prompt_tokens": 4096}, "truncate_prompt_tokens"),
    ({"input": "paris", "model": "another"}, "model"),
    ({"input": "paris", "priority": 1}, "priority"),  # the server runs fcfs
    ({"input": "paris", "normalize": False}, "normalize"),
])
def test_bad_embedding_requests_are_refused_in_openai_shape(embed_server: ServerProcess,
                                                              body: dict[str, object], param: str) -> None:
    before = metric_value(httpx.get(f"{embed_server.base_url}/metrics").text, "pagode:prompt_tokens_total")
    reply = httpx.post(f"{embed_server.api_url}/embeddings", json=body, timeout=30)
    error = json_error(reply)
    assert reply.status_code == (404 if param == "model" else 400) and param in (error["param"] or ""), error
    after = metric_value(httpx.get(f"{embed_server.base_url}/metrics").text, "pagode:prompt_tokens_total")
    assert after == before  # refused before any forward


def test_generation_and_scoring_endpoints_say_what_the_server_runs(embed_server: ServerProcess) -> None:
    reply = httpx.post(f"{embed_server.api_url}/completions", json={"prompt": "paris", "max_tokens": 2}, timeout=30)
    assert reply.status_code == 400 and "/v1/embeddings" in json_error(reply)["message"]
    # An embedding model scores by cosine, as vLLM's bi-encoder scoring does.
    reply = httpx.post(f"{embed_server.api_url}/score", json={"text_1": "paris", "text_2": ["paris", "dog"]},
                       timeout=30)
    scores = [d["score"] for d in reply.json()["data"]]
    assert abs(scores[0] - 1.0) < 1e-5 and scores[1] < scores[0]


def test_metrics_count_pooling_requests(embed_server: ServerProcess) -> None:
    def read() -> tuple[float, float]:
        text = httpx.get(f"{embed_server.base_url}/metrics").text
        return (metric_value(text, "pagode:prompt_tokens_total"),
                metric_value(text, "pagode:request_success_total", {"finished_reason": "stop"}))

    tokens, finished = read()
    response = client(embed_server).embeddings.create(model="mini-embed", input=TEXTS)
    new_tokens, new_finished = read()
    assert new_tokens - tokens == response.usage.prompt_tokens and new_finished == finished + 1


def test_rerank_equals_cross_encoder_predict(score_server: tuple[ServerProcess, Path]) -> None:
    from sentence_transformers import CrossEncoder

    server, folder = score_server
    query = "what is the capital of france"
    want = CrossEncoder(str(folder), device="cpu").predict([(query, t) for t in TEXTS]).tolist()
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        reply = httpx.post(server.base_url + path, json={"query": query, "documents": TEXTS}, timeout=30)
        assert reply.status_code == 200, reply.text
        results = reply.json()["results"]
        assert [r["index"] for r in results] == sorted(range(len(TEXTS)), key=lambda i: -want[i])
        for r in results:
            assert abs(r["relevance_score"] - want[r["index"]]) <= 1e-5 and r["document"]["text"] == TEXTS[r["index"]]
    top = httpx.post(f"{server.api_url}/rerank", json={"query": query, "documents": [{"text": t} for t in TEXTS],
                                                         "top_n": 2, "return_documents": False}, timeout=30).json()
    assert [r["index"] for r in top["results"]] == [r["index"] for r in results[:2]]
    assert "document" not in top["results"][0] and top["usage"]["prompt_tokens"] > 0


def test_score_equals_cross_encoder_predict(score_server: tuple[ServerProcess, Path]) -> None:
    from sentence_transformers import CrossEncoder

    server, folder = score_server
    pairs = list(zip(["paris", "dog", "sky", "cat"], TEXTS, strict=True))
    want = CrossEncoder(str(folder), device="cpu").predict(pairs).tolist()
    reply = httpx.post(f"{server.api_url}/score", json={"text_1": [p[0] for p in pairs],
                                                        "text_2": [p[1] for p in pairs]}, timeout=30)
    body = reply.json()
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1, 2, 3]
    assert max(abs(d["score"] - w) for d, w in zip(body["data"], want, strict=True)) <= 1e-5


def test_scoring_server_refuses_embeddings_and_mismatched_pairs(score_server: tuple[ServerProcess, Path]) -> None:
    server, _ = score_server
    reply = httpx.post(f"{server.api_url}/embeddings", json={"input": "paris"}, timeout=30)
    assert reply.status_code == 400 and "/v1/rerank" in json_error(reply)["message"]
    reply = httpx.post(f"{server.api_url}/score", json={"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, timeout=30)
    assert reply.status_code == 400 and json_error(reply)
    reply = httpx.post(f"{server.api_url}/rerank", json={"query": "paris", "documents": []}, timeout=30)
    assert reply.status_code == 400 and json_error(reply)["param"] == "documents"


def test_request_id_is_echoed_and_logged(embed_server: ServerProcess) -> None:
    reply = httpx.post(f"{embed_server.api_url}/embeddings", json={"input": ["paris", "dog"]},
                       headers={"X-Request-Id": "rag-42"}, timeout=30)
    assert reply.status_code == 200 and reply.headers["X-Request-Id"] == "rag-42"
    assert "request finished id=embd-rag-42 inputs=2 prompt_tokens=" in embed_server.log()


def test_ollama_embed(embed_server: ServerProcess, embed_folder: Path) -> None:
    reply = httpx.post(f"{embed_server.base_url}/api/embed", json={"model": "mini-embed", "input": TEXTS}, timeout=30)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == "mini-embed" and body["prompt_eval_count"] > 0 and body["total_duration"] > 0
    assert_same_vectors(body["embeddings"], reference(embed_folder, TEXTS))
    # Ollama truncates an over-long input by default, and refuses it with truncate false, in its shape.
    cut = httpx.post(f"{embed_server.base_url}/api/embed", json={"model": "mini-embed", "input": LONG}, timeout=30)
    assert cut.status_code == 200 and cut.json()["prompt_eval_count"] == 128
    refused = httpx.post(f"{embed_server.base_url}/api/embed",
                         json={"model": "mini-embed", "input": LONG, "truncate": False}, timeout=30)
    assert refused.status_code == 400 and set(refused.json()) == {"error"}
    assert "maximum context length" in refused.json()["error"]
    unknown = httpx.post(f"{embed_server.base_url}/api/embed", json={"model": "nope", "input": "a"}, timeout=30)
    assert unknown.status_code == 404 and isinstance(unknown.json()["error"], str)
