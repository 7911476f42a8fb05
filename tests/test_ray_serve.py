"""pagode on a real two-node Ray cluster (server/fleet/): two replicas of the default model
behind the ingress, prefix-affinity routing against random routing on the same kind of trace,
a replica killed mid-load, and autoscaling from one replica to two and back.

The tests share one cluster and one application, and run in file order: the last one
redeploys the app with autoscaling from one replica."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from ray_cluster import RayCluster, two_node_cluster  # noqa: E402

from loadgen.server_process import free_port  # noqa: E402
from server.fleet.ray_app import REPLICA_DEPLOYMENT, ROUTING_HEADER, build_app  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

APP = "pagode"
# 36 KV blocks of 16 tokens a replica: two of the trace's system prompts (16 blocks each) fit,
# four do not, so where a prompt goes decides whether its prefix is still cached.
PAGODE_ARGS = ["--kv-cache-memory", "13MiB", "--max-model-len", "512", "--max-num-seqs", "8",
               "--log-level", "warning"]
FIXED = {"pagode_args": PAGODE_ARGS, "min_replicas": 2, "max_replicas": 2, "routing_stats_period_s": 1.0,
         "router_seed": 0,
         "max_ongoing_requests": 8}
REPLICA_START_S = 240.0  # a model load on a busy 2-core machine
REQUEST_TIMEOUT_S = 120.0
TOPICS = ["a lighthouse keeper on a rocky northern island", "a bakery that opens before dawn",
          "a river barge carrying grain between two cities", "an observatory on a desert mountain"]


def system_prompt(topic: str, tag: str) -> str:
    """About 250 tokens, distinct from the first words on (the tag comes first, so that no
    two prompts share even their first block)."""
    lines = [f"({tag}) {topic.capitalize()} is the setting of every answer you give."]
    for i in range(6):
        lines.append(f"Rule {i + 1} of {topic}: keep the answer short, mention {topic} once, and never "
                     f"repeat rule {i + 1}.")
    return " ".join(lines)


@dataclass
class Deployed:
    cluster: RayCluster
    url: str


def replica_count() -> int:
    status = serve.status().applications[APP].deployments[REPLICA_DEPLOYMENT]
    return int(status.replica_states.get("RUNNING", 0))


def wait_replicas(count: int, timeout: float) -> float:
    """Seconds until exactly `count` replicas run."""
    start = time.monotonic()
    while replica_count() != count:
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{replica_count()} replicas running, not {count}, after {timeout:.0f}s")
        time.sleep(0.5)
    return time.monotonic() - start


def deploy(args: dict[str, Any]) -> None:
    serve.run(build_app(args), name=APP, route_prefix="/", blocking=False)
    deadline = time.monotonic() + REPLICA_START_S
    while serve.status().applications[APP].status != "RUNNING":
        if time.monotonic() > deadline:
            raise TimeoutError(f"the app did not start: {serve.status().applications[APP]}")
        time.sleep(0.25)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    with two_node_cluster(tmp_path_factory.mktemp("ray")) as cluster:
        ray.init(address=cluster.address, logging_level="warning")
        try:
            port = free_port()
            serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
            deploy(FIXED)
            yield Deployed(cluster, f"http://127.0.0.1:{port}")
        finally:
            with contextlib.suppress(Exception):  # the cluster is torn down next anyway
                serve.shutdown()
            ray.shutdown()


def cluster_metric(text: str, name: str) -> float:
    """The sum of a series over every replica on the merged page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rpartition(" ")[2])
    return total


async def prefix_counters(client: httpx.AsyncClient) -> tuple[float, float]:
    page = (await client.get("/metrics")).text
    replicas = set(re.findall(r'replica="([^"]+)"', page))
    assert len(replicas) == 2, f"the page holds replicas {replicas}, not two"
    return (cluster_metric(page, "pagode:prefix_cache_hits_total"),
            cluster_metric(page, "pagode:prefix_cache_queries_total"))


async def timed_chat(client: httpx.AsyncClient, system: str, question: str, policy: str) -> float:
    """TTFT of one streamed chat request, the answer read to its end."""
    body = {"stream": True, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    start = time.monotonic()
    ttft = None
    async with client.stream("POST", "/v1/chat/completions", json=body,
                             headers={ROUTING_HEADER: policy}) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and ttft is None:
                ttft = time.monotonic() - start
            if line == "data: [DONE]":
                break
            assert '"error"' not in line, line
    assert ttft is not None
    return ttft


async def run_trace(url: str, systems: list[str], policy: str, tag: str) -> tuple[float, float]:
    """24 chat requests cycling through the system prompts, two at a time (six rounds: each
    prompt misses once under affinity, and thrashes both 13MiB caches under random); the cluster's
    prefix-cache hit rate over them and their TTFT p50."""
    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S) as client:
        hits0, queries0 = await prefix_counters(client)
        gate = asyncio.Semaphore(2)

        async def one(i: int) -> float:
            async with gate:
                return await timed_chat(client, systems[i % 4], f"Question {tag}-{i}: what happens at hour {i}?",
                                        policy)

        ttfts = await asyncio.gather(*(one(i) for i in range(24)))
        await asyncio.sleep(0.5)
        hits1, queries1 = await prefix_counters(client)
    assert queries1 > queries0
    return (hits1 - hits0) / (queries1 - queries0), statistics.median(ttfts)


async def test_prefix_affinity_beats_random_routing(deployed: Deployed) -> None:
    wait_replicas(2, REPLICA_START_S)
    # Each run has its own four system prompts, so neither finds the other's prefixes cached.
    random_rate, random_ttft = await run_trace(deployed.url, [system_prompt(t, "A") for t in TOPICS],
                                               "random", "r")
    prefix_rate, prefix_ttft = await run_trace(deployed.url, [system_prompt(t, "B") for t in TOPICS],
                                               "prefix", "p")
    print(f"\nprefix-cache hit rate: prefix-affinity {prefix_rate:.3f}, random {random_rate:.3f} "
          f"({prefix_rate / max(random_rate, 1e-9):.2f}x); TTFT p50: prefix-affinity {prefix_ttft * 1000:.0f} ms, "
          f"random {random_ttft * 1000:.0f} ms")
    assert prefix_rate >= 2 * random_rate
    assert prefix_ttft < random_ttft


def replica_actor_names() -> list[str]:
    prefix = f"SERVE_REPLICA::{APP}#{REPLICA_DEPLOYMENT}#"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix))


async def outcome(client: httpx.AsyncClient, i: int, stream: bool, policy: str = "prefix") -> str:
    """ok, or how the request failed: it must fail cleanly (a 5xx with an OpenAI error body,
    or an error event that ends a stream), never hang or break off silently."""
    body = {"stream": stream, "max_tokens": 48, "temperature": 0,
            "messages": [{"role": "user", "content": f"Count from {i} to {i + 20}, one number a line."}]}
    headers = {ROUTING_HEADER: policy}
    if not stream:
        response = await client.post("/v1/chat/completions", json=body, headers=headers)
        if response.status_code == 200:
            assert response.json()["choices"][0]["message"]["content"] is not None
            return "ok"
        assert response.status_code >= 500, response.text
        assert json.loads(response.text)["error"]["message"], response.text
        return f"http {response.status_code}"
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode()
            assert response.status_code >= 500 and json.loads(text)["error"]["message"], text
            return f"http {response.status_code}"
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                return "ok"
            if line.startswith("data: ") and '"error"' in line:
                assert json.loads(line[6:])["error"]["message"], line
                return "stream error event"
    raise AssertionError("the stream ended without [DONE] or an error event")


async def test_replica_killed_mid_load(deployed: Deployed) -> None:
    wait_replicas(2, REPLICA_START_S)
    victim = replica_actor_names()[0]
    async with httpx.AsyncClient(base_url=deployed.url, timeout=REQUEST_TIMEOUT_S) as client:
        gate = asyncio.Semaphore(4)

        async def one(i: int) -> str:
            async with gate:
                # At random: these prompts share the template's default system prompt, and
                # prefix affinity would put them all on one replica, maybe not the victim.
                return await outcome(client, i, stream=i % 2 == 0, policy="random")

        load = [asyncio.create_task(asyncio.wait_for(one(i), REQUEST_TIMEOUT_S)) for i in range(24)]
        await asyncio.sleep(1.5)  # requests in flight on both replicas
        assert not all(task.done() for task in load), "the load ended before the kill"
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
        killed_at = time.monotonic()
        outcomes = await asyncio.gather(*load)  # a hang fails here, with wait_for's TimeoutError
        back_s = await asyncio.to_thread(wait_replaced, victim, REPLICA_START_S)
        after = await outcome(client, 99, stream=True)
    counts = {kind: outcomes.count(kind) for kind in sorted(set(outcomes))}
    print(f"\nreplica killed mid-load: {counts}; two replicas again {time.monotonic() - killed_at:.0f}s "
          f"after the kill ({back_s:.0f}s after the load ended)")
    assert "ok" in counts
    assert after == "ok"


def wait_replaced(victim: str, timeout: float) -> float:
    """Seconds until two replicas run again, neither of them `victim`."""
    start = time.monotonic()
    while True:
        names = replica_actor_names()
        if victim not in names and len(names) == 2 and replica_count() == 2:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"replicas {names} ({replica_count()} running) {timeout:.0f}s after the kill")
        time.sleep(0.5)


async def test_autoscaling_from_one_replica_to_two_and_back(deployed: Deployed) -> None:
    await asyncio.to_thread(deploy, {**FIXED, "min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1,
                                     "upscale_delay_s": 1, "downscale_delay_s": 2, "look_back_period_s": 2,
                                     "metrics_interval_s": 0.5})
    await asyncio.to_thread(wait_replicas, 1, 120)
    async with httpx.AsyncClient(base_url=deployed.url, timeout=REQUEST_TIMEOUT_S) as client:
        start = time.monotonic()
        bursting = True

        async def keep_busy(worker: int) -> list[str]:
            results = []
            while bursting:
                results.append(await outcome(client, worker, stream=False))
            return results

        burst = [asyncio.create_task(keep_busy(w)) for w in range(6)]
        try:
            while replica_count() < 2:
                assert time.monotonic() - start < REPLICA_START_S, "no second replica during the burst"
                await asyncio.sleep(0.5)
            up_s = time.monotonic() - start
        finally:
            bursting = False
            results = [r for task in await asyncio.gather(*burst) for r in task]
    down_s = await asyncio.to_thread(wait_replicas, 1, 120)
    print(f"\nautoscaling: 1 -> 2 replicas {up_s:.0f}s into the burst ({len(results)} requests), "
          f"back to 1 {down_s:.0f}s after it ended")
    assert results and set(results) == {"ok"}
