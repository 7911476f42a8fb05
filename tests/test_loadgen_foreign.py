"""loadgen against foreign servers written here: it assumes nothing only pagode provides.

The first server streams the way llama-server does (choices[0].text or delta.content,
a usage chunk, then `data: [DONE]`), with no /tokenize and no /metrics; its bytes are
written in odd pieces with CRLF line ends and keep-alive comments. The second adds a
toy /tokenize and a vLLM-style /metrics, to check exact prompt cutting and scraping.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from rich.console import Console
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from loadgen.bench import Settings
from loadgen.cli import main, run_loadgen
from loadgen.client import Target
from loadgen.datasets import NO_TOKENIZE_WARNING

MODEL = "toy-llama"
TOKEN_DELAY = 0.003


def toy_tokens(text: str) -> list[str]:
    """A toy tokenizer: words cut in pieces of at most 3 letters, and punctuation."""
    return re.findall(r"[A-Za-z0-9]{1,3}|[^\sA-Za-z0-9]", text)


@dataclass
class ToyServer:
    with_tokenize: bool = False
    tokenize_dialect: str = "vllm"  # vllm: {"prompt"} -> {"count", "tokens"}; llama: {"content"}
    with_metrics: bool = False
    api_key: str | None = None  # when set, every route wants 'Authorization: Bearer KEY'
    received: list[dict[str, Any]] = field(default_factory=list)
    running: int = 0
    max_running: int = 0

    def app(self) -> Starlette:
        routes = [
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.completions, methods=["POST"]),
            Route("/v1/models", self.models),
        ]
        if self.with_tokenize:
            routes.append(Route("/tokenize", self.tokenize, methods=["POST"]))
        if self.with_metrics:
            routes.append(Route("/metrics", self.metrics))
        return Starlette(routes=routes, middleware=[Middleware(BaseHTTPMiddleware, dispatch=self.check_key)])

    async def check_key(self, request: Request, call_next: Any) -> Response:
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return JSONResponse({"error": {"message": "bad key", "type": "auth", "param": None,
                                           "code": 401}}, status_code=401)
        response: Response = await call_next(request)
        return response

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def tokenize(self, request: Request) -> Response:
        body = await request.json()
        key = "prompt" if self.tokenize_dialect == "vllm" else "content"
        if key not in body and self.tokenize_dialect == "vllm":
            return JSONResponse({"error": {"message": f"missing {key}"}}, status_code=400)
        # llama-server answers a body without "content" with 200 and no tokens, as here.
        tokens = list(range(len(toy_tokens(body.get(key, "")))))
        if self.tokenize_dialect == "vllm":
            return JSONResponse({"count": len(tokens), "max_model_len": 4096, "tokens": tokens})
        return JSONResponse({"tokens": tokens})

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(
            f'vllm:num_requests_running{{model_name="{MODEL}"}} {self.running}\n'
            f'vllm:num_requests_waiting{{model_name="{MODEL}"}} 0\n'
            f'vllm:kv_cache_usage_perc{{model_name="{MODEL}"}} {self.running / 100}\n'
        )

    async def completions(self, request: Request) -> Response:
        body = await request.json()
        self.received.append(body)
        chat = "messages" in body
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        usage = {"prompt_tokens": len(toy_tokens(prompt)), "completion_tokens": n,
                 "total_tokens": len(toy_tokens(prompt)) + n}
        return StreamingResponse(self.stream(n, chat, usage), media_type="text/event-stream")

    async def stream(self, n: int, chat: bool, usage: dict[str, int]) -> AsyncIterator[bytes]:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            out = bytearray()
            if chat:  # llama-server opens with a role-only delta, which carries no text
                out += self.event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}, chat)
            sent = 0
            while sent < n:
                # Two tokens in one event now and then: counts must come from usage.
                k = 2 if sent % 5 == 3 and sent + 2 <= n else 1
                text = "é " * k
                fields: dict[str, Any] = {"delta": {"content": text}} if chat else {"text": text}
                out += self.event({"choices": [{"index": 0, **fields, "finish_reason": None}]}, chat)
                out += b": keep-alive\r\n\r\n"
                sent += k
                async for part in split_oddly(bytes(out)):
                    yield part
                out.clear()
                await asyncio.sleep(TOKEN_DELAY)
            last: dict[str, Any] = {"delta": {}} if chat else {"text": ""}
            out += self.event({"choices": [{"index": 0, **last, "finish_reason": "length"}]}, chat)
            out += self.event({"choices": [], "usage": usage}, chat)
            out += b"data: [DONE]\r\n\r\n"
            async for part in split_oddly(bytes(out)):
                yield part
        finally:
            self.running -= 1

    @staticmethod
    def event(body: dict[str, Any], chat: bool) -> bytes:
        body = {"id": "x", "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": MODEL, **body}
        return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\r\n\r\n"


async def split_oddly(data: bytes, size: int = 7) -> AsyncIterator[bytes]:
    """Write in 7-byte pieces: lines, CRLFs and UTF-8 characters get cut across reads."""
    for i in range(0, len(data), size):
        yield data[i : i + size]
        await asyncio.sleep(0)


@contextmanager
def serve(toy: ToyServer) -> Iterator[str]:
    """Run the toy app with uvicorn in a thread on a free loopback port."""
    config = uvicorn.Config(toy.app(), host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("toy server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def load(out: Path) -> dict[str, Any]:
    return json.loads((out / "results.json").read_text())


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_runs_against_a_llama_server_like_stream(tmp_path: Path, endpoint: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    toy = ToyServer()
    with serve(toy) as url:
        code = main(["--url", url + "/v1", "--endpoint", endpoint, "--rate", "30", "60",
                     "--num-prompts", "12", "--input-len", "8:24", "--output-len", "3:17",
                     "--ignore-eos", "--seed", "3", "--no-progress", "--out", str(tmp_path)])
    assert code == 0
    results = load(tmp_path)
    # No /tokenize: lengths are estimated, and the user is told so.
    assert results["dataset"]["warnings"] == [NO_TOKENIZE_WARNING]
    assert not results["dataset"]["exact_prompt_lengths"]
    assert NO_TOKENIZE_WARNING.split(":")[0] in capsys.readouterr().out
    assert results["target"]["model"] == MODEL
    assert [run["offered_rate"] for run in results["runs"]] == [30.0, 60.0]
    for run in results["runs"]:
        summary, requests = run["summary"], run["requests"]
        assert summary["completed"] == 12 and summary["failed"] == 0 and summary["errors"] == []
        assert run["server"] == {"available": False}  # no /metrics: not scraped
        for rec in requests:
            # Token counts are usage's, though some events carried two tokens.
            assert rec["usage_reported"] and rec["output_tokens"] == rec["max_tokens"]
            assert len(rec["content_times"]) < rec["max_tokens"] or rec["max_tokens"] < 5
            assert rec["generated_chars"] == 2 * rec["max_tokens"]  # "é" + " " per token
            assert 0 < rec["ttft"] <= rec["e2e"]
            assert rec["finish_reason"] == "length"
        assert summary["total_output_tokens"] == sum(r["max_tokens"] for r in requests)
    # The same seeded prompts and lengths at both rates.
    first, second = ([(r["prompt_len"], r["max_tokens"]) for r in run["requests"]] for run in results["runs"])
    assert first == second
    # Every request streamed with usage, and asked for exactly its length.
    assert len(toy.received) == 24
    for body in toy.received:
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["ignore_eos"] is True and body["model"] == MODEL
        if endpoint.endswith("chat/completions"):
            assert body["messages"][0]["role"] == "user" and body["max_completion_tokens"] == body["max_tokens"]
        else:
            assert isinstance(body["prompt"], str)
    for png in ("latency_cdf.png", "latency_vs_rate.png", "throughput_vs_rate.png"):
        assert (tmp_path / png).stat().st_size > 1000
    assert not (tmp_path / "server_timeline.png").exists()


@pytest.mark.parametrize("dialect", ["vllm", "llama"])
def test_prompts_are_cut_to_exact_token_counts_with_tokenize(tmp_path: Path, dialect: str) -> None:
    toy = ToyServer(with_tokenize=True, tokenize_dialect=dialect)
    settings = Settings(num_prompts=25, input_len=(5, 60), output_len=(2, 4), seed=11,
                        show_progress=False)
    with serve(toy) as url:
        _, prompts, results = asyncio.run(
            run_loadgen(Target(url), settings, [float("inf")], Console(quiet=True)))
    assert prompts.exact and results["dataset"]["warnings"] == []
    assert results["dataset"]["prompts_off_target"] == 0
    lengths = [p.prompt_len for p in prompts.prompts]
    assert len(set(lengths)) > 10  # drawn uniformly, not all alike
    for spec in prompts.prompts:
        assert 5 <= spec.prompt_len <= 60
        assert len(toy_tokens(spec.prompt)) == spec.prompt_len
    # The server's own usage agrees with the planned lengths.
    for rec in results["runs"][0]["requests"]:
        assert rec["prompt_tokens"] == rec["prompt_len"]


def test_prompts_are_fixed_by_the_seed_and_are_prose(tmp_path: Path) -> None:
    toy = ToyServer(with_tokenize=True)
    settings = Settings(num_prompts=6, input_len=(16, 128), output_len=(2, 3), seed=5, show_progress=False)
    with serve(toy) as url:
        runs = [asyncio.run(run_loadgen(Target(url), settings, [float("inf")], Console(quiet=True)))[1]
                for _ in range(2)]
    assert [p.prompt for p in runs[0].prompts] == [p.prompt for p in runs[1].prompts]
    words = " ".join(p.prompt for p in runs[0].prompts).split()
    assert sum(w.isalpha() for w in words) > 0.6 * len(words)


def test_scrapes_a_vllm_style_metrics_endpoint(tmp_path: Path) -> None:
    toy = ToyServer(with_metrics=True)
    with serve(toy) as url:
        code = main(["--url", url, "--rate", "inf", "--num-prompts", "8", "--output-len", "60:80",
                     "--scrape-interval", "0.05", "--no-progress", "--out", str(tmp_path)])
    assert code == 0
    run = load(tmp_path)["runs"][0]
    assert run["server"]["available"] and run["server"]["samples"] >= 3
    assert run["server"]["max_running"] >= 1
    assert run["timeline"][0]["running"] == 0  # sampled before the first request
    assert (tmp_path / "server_timeline.png").stat().st_size > 1000


def test_compare_prints_one_table_with_ratios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serve(ToyServer()) as url:
        for name, rate in (("a", "100"), ("b", "inf")):
            assert main(["--url", url, "--rate", rate, "--num-prompts", "5", "--output-len", "4:6",
                         "--no-progress", "--no-plots", "--out", str(tmp_path / name)]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b" / "results.json")]) == 0
    out = capsys.readouterr().out
    assert "Comparison" in out and "x1.00" in out and str(tmp_path / "a") in out.replace("\n", "")


def test_failures_are_recorded_with_their_messages(tmp_path: Path) -> None:
    toy = ToyServer()
    with serve(toy) as url:
        code = main(["--url", url + "/nowhere", "--rate", "inf", "--num-prompts", "3",
                     "--no-progress", "--no-plots", "--out", str(tmp_path)])
    assert code == 1
    summary = load(tmp_path)["runs"][0]["summary"]
    assert summary["failed"] == 3 and summary["completed"] == 0
    assert summary["errors"][0]["count"] == 3 and "HTTP 404" in summary["errors"][0]["message"]


def test_max_concurrency_caps_requests_in_flight(tmp_path: Path) -> None:
    toy = ToyServer()
    with serve(toy) as url:
        assert main(["--url", url, "--rate", "inf", "--num-prompts", "10", "--output-len", "10:20",
                     "--max-concurrency", "2", "--no-progress", "--no-plots", "--out", str(tmp_path)]) == 0
    assert toy.max_running == 2
    assert all("ignore_eos" not in body for body in toy.received)  # only with --ignore-eos
    assert load(tmp_path)["runs"][0]["summary"]["completed"] == 10


def test_api_key_reaches_every_endpoint(tmp_path: Path) -> None:
    toy = ToyServer(with_tokenize=True, api_key="sesame")
    with serve(toy) as url:
        assert main(["--url", url, "--api-key", "sesame", "--rate", "inf", "--num-prompts", "3",
                     "--output-len", "3:5", "--no-progress", "--no-plots", "--out", str(tmp_path)]) == 0
        results = load(tmp_path)
        assert results["dataset"]["exact_prompt_lengths"] and results["target"]["model"] == MODEL
        assert results["runs"][0]["summary"]["completed"] == 3
        assert main(["--url", url, "--rate", "inf", "--num-prompts", "3", "--no-progress",
                     "--no-plots", "--out", str(tmp_path)]) == 1
    assert "HTTP 401: bad key" in load(tmp_path)["runs"][0]["summary"]["errors"][0]["message"]
