"""A trace of chats that share a few long system prompts, sent through a router before pagode
replicas: where each chat ran, and the replicas' prefix-cache hit rate over the trace.

Each chat carries an X-Request-Id; pagode logs `request finished id=chatcmpl-<id>-<n>`,
so the replica that served a chat is found in the replicas' logs. Each trace starts its
system prompts with its phase's name, so that no two phases share a cached prefix.
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from proxy_support import counter_sum

PREFIXES = 3
REQUESTS_PER_PREFIX = 4
CLIENTS = 2
TOPICS = ["lighthouses", "volcanoes", "orchards", "glaciers", "harbours"]


def system_prompt(phase: str, topic: str) -> str:
    """About 300 tokens that only the chats about `topic` in `phase` share."""
    facts = " ".join(f"Fact {i} about {topic} is worth remembering." for i in range(36))
    return f"[{phase}] You are an expert on {topic}. {facts}"


def chats(phase: str) -> list[tuple[int, list[dict[str, str]]]]:
    """(prefix, messages): PREFIXES system prompts, REQUESTS_PER_PREFIX questions each,
    shuffled (the same order in every phase)."""
    trace = [(p, [{"role": "system", "content": system_prompt(phase, topic)},
                  {"role": "user", "content": f"Question {q}: what matters most?"}])
             for p, topic in enumerate(TOPICS[:PREFIXES]) for q in range(REQUESTS_PER_PREFIX)]
    random.Random(7).shuffle(trace)
    return trace


@dataclass
class TraceResult:
    replica_of: dict[int, set[int]]  # prefix -> the replicas (indices) that served its chats
    hit_rate: float  # prompt tokens found in the replicas' prefix caches / tokens looked up


def cache_counters(replica_urls: list[str]) -> tuple[float, float]:
    hits = sum(counter_sum(url, "prefix_cache_hits_total") for url in replica_urls)
    queries = sum(counter_sum(url, "prefix_cache_queries_total") for url in replica_urls)
    return hits, queries


def run_trace(url: str, model: str, replica_urls: list[str], replica_logs: Callable[[], list[str]],
              phase: str) -> TraceResult:
    """Send the phase's chats through the router at `url` from CLIENTS concurrent clients."""
    hits_before, queries_before = cache_counters(replica_urls)
    trace = chats(phase)
    lock = threading.Lock()
    sent: list[tuple[int, str]] = []

    def send(index: int) -> None:
        prefix, messages = trace[index]
        rid = f"{phase}-{index}"
        response = httpx.post(f"{url}/v1/chat/completions", timeout=300, headers={"X-Request-Id": rid},
                              json={"model": model, "messages": messages, "max_tokens": 2})
        assert response.status_code == 200, response.text
        with lock:
            sent.append((prefix, rid))

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(send, range(len(trace))))
    logs = replica_logs()
    replica_of: dict[int, set[int]] = {}
    for prefix, rid in sent:
        served = [i for i, log in enumerate(logs) if re.search(rf"request finished id=\S*-{rid}-\d+ ", log)]
        assert len(served) == 1, f"{rid} was served by replicas {served}"
        replica_of.setdefault(prefix, set()).add(served[0])
    hits, queries = cache_counters(replica_urls)
    assert queries > queries_before
    return TraceResult(replica_of, (hits - hits_before) / (queries - queries_before))


def routing_decisions(metrics_url: str, outcome: str) -> float:
    """vllm-router's own count of cache-aware decisions that found a prefix (`prefix_hit`)
    or did not (`prefix_miss`)."""
    text = httpx.get(metrics_url, timeout=10).text
    return sum(float(v) for v in re.findall(
        rf'^vllm_router_prefix_routing_decisions_total{{[^}}]*outcome="{outcome}"[^}}]*}} (\S+)$', text, re.M))
