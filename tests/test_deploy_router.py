"""vllm-router, as docker/compose.replicas.yaml runs it, before two real pagode replicas.

No Docker: two `pagode serve` processes and the real router (the `vllm-router` wheel's
Rust binary, in the test extra) on loopback ports. The router starts through the image's
entry point (docker/router-entrypoint.py) with the compose file's own router command, its
addresses moved to the loopback; a second router with the same flags but
`--policy round_robin`, over the same replicas, is the baseline.
- a streamed completion flows through the router token by token and intact (the same text,
  event for event, as a replica sends directly), and the openai SDK's chat works;
- cache-aware routing: two clients send chats that share three long system prompts. Every
  chat with a given system prompt lands on one replica (the replica is found by the
  request's X-Request-Id in the replicas' logs), so each prompt is computed once, and the
  replicas' prefix-cache hit rate beats round robin's on a trace of the same shape.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import httpx
import openai
import pytest
import yaml
from prefix_trace import PREFIXES, REQUESTS_PER_PREFIX, routing_decisions, run_trace
from proxy_support import (
    ROOT,
    PinnedPair,
    Process,
    Stream,
    completion_body,
    later_modules_use,
    router_args,
    spawn,
    stream,
    wait_ok,
)

from loadgen.server_process import free_port

COMPOSE_REPLICAS = ROOT / "docker" / "compose.replicas.yaml"
ENTRYPOINT = ROOT / "docker" / "router-entrypoint.py"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def load_entrypoint() -> ModuleType:
    spec = importlib.util.spec_from_file_location("router_entrypoint", ENTRYPOINT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shipped_router_command() -> list[str]:
    compose = yaml.safe_load(COMPOSE_REPLICAS.read_text(encoding="utf-8"))
    command: list[str] = [str(a) for a in compose["services"]["router"]["command"]]
    return command


def router_executable_dir() -> str:
    """Where the `vllm-router` script lies: beside this interpreter (the test extra's venv)."""
    folder = Path(sys.executable).parent
    if not (folder / "vllm-router").exists():
        pytest.fail(f"vllm-router is not installed in {folder}: `pip install -e .[test]` installs it")
    return str(folder)


def start_router(replicas: list[Process], log: Path, policy: str | None = None) -> Process:
    port = free_port()
    argv = router_args(shipped_router_command(), port, free_port(), [r.url for r in replicas], policy)
    path = f"{router_executable_dir()}{os.pathsep}{os.environ.get('PATH', '')}"
    return spawn([sys.executable, str(ENTRYPOINT), *argv], f"http://127.0.0.1:{port}", log, {"PATH": path})


@dataclass
class Fleet:
    replicas: list[Process]
    router: Process  # the shipped command: cache_aware
    baseline: Process  # the same flags, round_robin
    model: str


@pytest.fixture(scope="module")
def fleet(request: pytest.FixtureRequest, pinned_pair: PinnedPair,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("router")
    routers: list[Process] = []
    try:
        replicas = pinned_pair.ready()
        router = start_router(replicas, tmp / "router.log")
        routers.append(router)
        baseline = start_router(replicas, tmp / "baseline.log", policy="round_robin")
        routers.append(baseline)
        for process in (router, baseline):
            wait_ok(process, "/readiness")
        model = httpx.get(f"{router.url}/v1/models", timeout=10).json()["data"][0]["id"]
        yield Fleet(replicas, router, baseline, model)
    finally:
        for process in routers:
            process.stop()
        if not later_modules_use(request, "pinned_pair"):
            pinned_pair.stop()


# --- the entry point ------------------------------------------------------------------


def test_entrypoint_gives_each_address_of_a_worker_name_its_own_url() -> None:
    entry = load_entrypoint()
    records = {"pagode": ["172.18.0.5", "172.18.0.3"], "solo": ["172.18.0.9"]}
    argv = ["--port", "8000", "--worker-urls", "http://pagode:8000", "http://solo:8000",
            "http://10.0.0.7:8000", "--policy", "cache_aware"]
    assert entry.expand_worker_urls(argv, records.__getitem__) == [
        "--port", "8000", "--worker-urls", "http://172.18.0.3:8000", "http://172.18.0.5:8000",
        "http://solo:8000", "http://10.0.0.7:8000", "--policy", "cache_aware"]
    # The real resolver: a name with one address stays a name.
    assert entry.expand_worker_urls(["--worker-urls", "http://localhost:8000"]) == \
        ["--worker-urls", "http://localhost:8000"]


# --- requests through the router ---------------------------------------------------------


def test_stream_flows_token_by_token_and_intact_through_the_router(fleet: Fleet) -> None:
    body = completion_body(fleet.model, "The history of the printing press", 48)
    proxied = stream(fleet.router.url, body)
    assert proxied.ok, proxied.error
    content_reads = proxied.content_reads
    assert len(content_reads) == proxied.events[-1]["usage"]["completion_tokens"] >= 32
    # Buffered to the end, the events would come in a handful of reads; flowing, each
    # token's event comes in a read of its own (a few may share one).
    assert len(set(content_reads)) >= len(content_reads) // 2, content_reads
    direct = Stream()
    stream(fleet.replicas[0].url, body, direct)
    assert direct.ok, direct.error
    assert proxied.text == direct.text
    assert len(direct.content_reads) == len(content_reads)


def test_openai_sdk_chat_through_the_router(fleet: Fleet) -> None:
    client = openai.OpenAI(base_url=f"{fleet.router.url}/v1", api_key="unused", timeout=120)
    reply = client.chat.completions.create(
        model=fleet.model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8,
        extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    chunks = list(client.chat.completions.create(
        model=fleet.model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8,
        stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


# --- cache-aware routing --------------------------------------------------------------------


def metrics_url(router: Process) -> str:
    argv = router.proc.args
    assert isinstance(argv, list)
    return f"http://127.0.0.1:{argv[argv.index('--prometheus-port') + 1]}/metrics"


def test_cache_aware_routing_keeps_each_prefix_on_one_replica(fleet: Fleet) -> None:
    urls = [r.url for r in fleet.replicas]

    def logs() -> list[str]:
        return [r.log.read_text(errors="replace") for r in fleet.replicas]

    decisions = [routing_decisions(metrics_url(fleet.router), o) for o in ("prefix_miss", "prefix_hit")]
    aware = run_trace(fleet.router.url, fleet.model, urls, logs, "aware")
    decisions = [routing_decisions(metrics_url(fleet.router), o) - before
                 for o, before in zip(("prefix_miss", "prefix_hit"), decisions, strict=True)]
    baseline = run_trace(fleet.baseline.url, fleet.model, urls, logs, "round-robin")
    print(f"prefix-cache hit rate over {PREFIXES}x{REQUESTS_PER_PREFIX} chats: cache_aware "
          f"{aware.hit_rate:.2f}, round_robin {baseline.hit_rate:.2f}; replicas per prefix: "
          f"{aware.replica_of} vs {baseline.replica_of}")
    assert all(len(replicas) == 1 for replicas in aware.replica_of.values()), aware.replica_of
    assert any(len(replicas) == 2 for replicas in baseline.replica_of.values()), \
        f"round robin should have split some prefix over both replicas: {baseline.replica_of}"
    assert aware.hit_rate > baseline.hit_rate
    # The router's own account: each system prompt missed once, then was found.
    assert decisions == [PREFIXES, PREFIXES * (REQUESTS_PER_PREFIX - 1)]
