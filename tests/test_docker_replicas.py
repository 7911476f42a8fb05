"""docker/compose.replicas.yaml, run: vllm-router (cache-aware) and nginx (least_conn)
before two pagode replicas.

On the host's loopback (tests/docker_harness.py says what changes and why):
- both replicas come up healthy, reusing the kernels that the first stack compiled into
  the shared volume (no compile when the volume already holds them), and nginx spreads
  requests over both;
- through the router, the openai SDK's chats (streamed and not) are answered; chats that
  share three long system prompts keep each prompt on one replica, and the replicas'
  prefix-cache hit rate beats a round-robin router's (the same image and flags, started
  beside it in the router's container) on a trace of the same shape;
- a steady stream of requests (streamed and not) runs while one replica is killed with
  `docker kill`: the only requests that fail are ones that nginx had already handed to
  that replica (its access log names every replica a request was sent to, found by the
  client's X-Request-Id); every later request is served by the survivor;
- `docker compose start` brings the killed replica back healthy, and nginx sends it
  requests again.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
import yaml
from docker_harness import (
    Stack,
    built_images,
    free_port,
    model_name,
    record,
    replicas_stack,
    run,
    skip_unless_enabled,
    volume_holds_kernels,
)
from prefix_trace import PREFIXES, REQUESTS_PER_PREFIX, routing_decisions, run_trace
from proxy_support import with_flag

pytestmark = [pytest.mark.slow, skip_unless_enabled, pytest.mark.timeout(2400)]

REPLICAS = ("pagode-1", "pagode-2")
VICTIM = "pagode-2"
WORKERS = 3
MAX_TOKENS = 12
# `docker kill` returns once the signal is sent; the process and its sockets are gone
# a moment later. A request sent within this margin may still reach the dying replica.
SETTLE_S = 1.0
LOG_LINE = re.compile(r'"(?P<request>[^"]*)" (?P<status>\d+) \d+ upstream=(?P<upstream>.*?) '
                      r'upstream_status=(?P<upstream_status>.*?) request_time=\S+ request_id=(?P<rid>\S+)')


@dataclass
class ReplicaStack:
    stack: Stack
    warm: bool  # the kernel volume held compiled kernels before the replicas started


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaStack]:
    images = built_images()
    warm = volume_holds_kernels(images.pagode)
    stack = replicas_stack(tmp_path_factory.mktemp("replicas"), images)
    stack.down()  # an interrupted run's containers (the kernel volume stays)
    stack.up()  # returns once both replicas are healthy: nginx depends on it
    for name in REPLICAS:
        seconds = stack.wait_healthy(name)
        record(f"replica start -> healthy ({'compiled kernels on the volume' if warm else 'cold'})",
               seconds, "s")
    wait_ok(stack.url("nginx") + "/nginx-health")
    wait_ok(stack.url("router") + "/readiness")
    yield ReplicaStack(stack, warm)
    stack.down()


def wait_ok(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"{url} did not answer 200 within {timeout} s")


@dataclass
class Outcome:
    rid: str
    sent: float  # wall clock, to compare with the kill
    ok: bool
    detail: str = ""


@dataclass
class NginxEntry:
    status: int
    upstreams: list[str]
    upstream_statuses: list[str]


def send(url: str, model: str, rid: str, stream: bool) -> Outcome:
    """One chat completion through nginx; ok when it arrived whole."""
    body = {"model": model, "messages": [{"role": "user", "content": "Count to twenty."}],
            "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": stream}
    sent = time.time()
    try:
        with httpx.Client(timeout=120, headers={"X-Request-Id": rid}) as http:
            if not stream:
                response = http.post(f"{url}/v1/chat/completions", json=body)
                ok = response.status_code == 200 and \
                    response.json()["choices"][0]["finish_reason"] == "length"
                return Outcome(rid, sent, ok, f"{response.status_code} {response.text[:200]}")
            with http.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
                events = [line for line in response.iter_lines() if line.startswith("data: ")]
            ok = response.status_code == 200 and events[-1:] == ["data: [DONE]"] and \
                any('"finish_reason":"length"' in e.replace(" ", "") for e in events)
            return Outcome(rid, sent, ok, f"{response.status_code}, {len(events)} events")
    except httpx.HTTPError as err:
        return Outcome(rid, sent, False, repr(err))


class SteadyLoad:
    """WORKERS clients, each sending one request after another (every other one streamed)."""

    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url, model
        self.ids = itertools.count()
        self.lock = threading.Lock()
        self.outcomes: list[Outcome] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.work) for _ in range(WORKERS)]

    def work(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                n = next(self.ids)
            outcome = send(self.url, self.model, f"steady-{n}", stream=n % 2 == 0)
            with self.lock:
                self.outcomes.append(outcome)

    def __enter__(self) -> SteadyLoad:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(180)

    def wait_for(self, count: int, since: float, timeout: float = 300) -> None:
        """Until `count` requests sent after `since` have ended."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if sum(o.sent > since for o in self.outcomes) >= count:
                    return
            time.sleep(0.2)
        pytest.fail(f"fewer than {count} requests ended in {timeout} s")


def nginx_log(stack: Stack) -> dict[str, NginxEntry]:
    """The access log's entries by request id."""
    entries: dict[str, NginxEntry] = {}
    for match in LOG_LINE.finditer(stack.logs("nginx")):
        entries[match["rid"]] = NginxEntry(int(match["status"]), match["upstream"].split(", "),
                                           match["upstream_status"].split(", "))
    return entries


def address(stack: Stack, service: str) -> str:
    return f"127.0.0.1:{stack.ports[service]}"


def test_replicas_start_healthy_and_nginx_spreads_requests(replicas: ReplicaStack) -> None:
    stack = replicas.stack
    if replicas.warm:
        for name in REPLICAS:
            assert "compiling" not in stack.logs(name), "kernels on the volume must be reused"
    config = run(["docker", "exec", stack.container("nginx"), "nginx", "-T"]).stdout
    assert "least_conn;" in config
    for name in REPLICAS:
        assert f"server {address(stack, name)} max_fails=1 fail_timeout=10s;" in config
    url = stack.url("nginx")
    model = model_name(url)
    rids = [f"spread-{i}" for i in range(6)]
    threads = [threading.Thread(target=send, args=(url, model, rid, False)) for rid in rids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    log = nginx_log(stack)
    served = {log[rid].upstreams[-1] for rid in rids if rid in log and log[rid].status == 200}
    assert served == {address(stack, name) for name in REPLICAS}, \
        "six concurrent requests: least_conn sends some to each replica"


def test_router_answers_chats_streamed_and_not(replicas: ReplicaStack) -> None:
    stack = replicas.stack
    readiness = httpx.get(stack.url("router") + "/readiness", timeout=10).json()
    assert (readiness["healthy_workers"], readiness["total_workers"]) == (2, 2), readiness
    url = stack.url("router")
    model = model_name(url)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=300)
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Count to twenty."}], max_tokens=MAX_TOKENS,
        extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Count to twenty."}], max_tokens=MAX_TOKENS,
        stream=True, extra_body={"ignore_eos": True}))
    assert sum(bool(c.choices and c.choices[0].delta.content) for c in chunks) >= MAX_TOKENS - 2
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def baseline_router(stack: Stack) -> tuple[str, str]:
    """A round-robin router with the shipped flags, started in the router's container (the
    host's network): its API and metrics URLs, once it is ready."""
    command = yaml.safe_load(stack.file.read_text(encoding="utf-8"))["services"]["router"]["command"]
    port, metrics_port = free_port(), free_port()
    for flag, value in (("--port", port), ("--prometheus-port", metrics_port), ("--policy", "round_robin")):
        command = with_flag(command, flag, str(value))
    run(["docker", "exec", "-d", stack.container("router"), "vllm-router", *command])
    wait_ok(f"http://127.0.0.1:{port}/readiness")
    return f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"


def test_router_keeps_each_shared_prefix_on_one_replica(replicas: ReplicaStack) -> None:
    stack = replicas.stack
    url, metrics = stack.url("router"), stack.url("router-metrics") + "/metrics"
    model = model_name(url)
    urls = [stack.url(name) for name in REPLICAS]

    def logs() -> list[str]:
        return [stack.logs(name) for name in REPLICAS]

    before = [routing_decisions(metrics, o) for o in ("prefix_miss", "prefix_hit")]
    aware = run_trace(url, model, urls, logs, "docker-aware")
    decisions = [routing_decisions(metrics, o) - b for o, b in zip(("prefix_miss", "prefix_hit"), before, strict=True)]
    baseline_url, _ = baseline_router(stack)
    baseline = run_trace(baseline_url, model, urls, logs, "docker-round-robin")
    record("router: prefix-cache hit rate, cache_aware / round_robin "
           f"({PREFIXES} system prompts x {REQUESTS_PER_PREFIX} chats)",
           f"{aware.hit_rate:.2f} / {baseline.hit_rate:.2f}")
    assert all(len(r) == 1 for r in aware.replica_of.values()), aware.replica_of
    assert any(len(r) == 2 for r in baseline.replica_of.values()), baseline.replica_of
    assert aware.hit_rate > baseline.hit_rate
    assert decisions == [PREFIXES, PREFIXES * (REQUESTS_PER_PREFIX - 1)]


def test_killing_a_replica_fails_only_the_requests_it_held(replicas: ReplicaStack) -> None:
    stack = replicas.stack
    url = stack.url("nginx")
    model = model_name(url)
    victim, survivor = address(stack, VICTIM), address(stack, "pagode-1")
    with SteadyLoad(url, model) as load:
        load.wait_for(2 * WORKERS, since=0)
        killed_at = time.time()
        run(["docker", "kill", stack.container(VICTIM)])
        killed_after = time.time()
        record("docker kill of a replica: the command", killed_after - killed_at, "s")
        load.wait_for(4 * WORKERS, since=killed_after + SETTLE_S)
    log = nginx_log(stack)
    outcomes = load.outcomes
    before = [o for o in outcomes if o.sent < killed_at and o.ok]
    assert {log[o.rid].upstreams[-1] for o in before if o.rid in log} == {victim, survivor}, \
        "before the kill both replicas served the load"
    for o in outcomes:
        if o.ok:
            continue
        entry = log.get(o.rid)
        assert entry is not None, f"{o.rid} failed without reaching nginx: {o.detail}"
        assert entry.upstreams[-1] == victim, \
            f"{o.rid} failed on {entry.upstreams} (not the killed replica): {o.detail}"
        assert o.sent < killed_after + SETTLE_S, \
            f"{o.rid}, sent {o.sent - killed_after:.2f} s after the kill, reached the dead replica"
    after = [o for o in outcomes if o.sent > killed_after + SETTLE_S]
    assert len(after) >= 4 * WORKERS and all(o.ok for o in after)
    assert all(log[o.rid].upstreams[-1] == survivor for o in after), \
        "after the kill nginx routes every request around the dead replica"
    record("steady load over the kill: requests / failed (all on the killed replica)",
           f"{len(outcomes)} / {sum(not o.ok for o in outcomes)}")


def test_killed_replica_comes_back_and_serves_again(replicas: ReplicaStack) -> None:
    stack = replicas.stack
    state = stack.inspect(VICTIM)["State"]
    assert state["Status"] == "exited" and state["ExitCode"] == 137, state
    stack.compose("start", VICTIM)
    seconds = stack.wait_healthy(VICTIM)
    record("killed replica: docker compose start -> healthy", seconds, "s")
    url = stack.url("nginx")
    model = model_name(url)
    victim = address(stack, VICTIM)
    # nginx takes a failed replica out for fail_timeout (10 s), then tries it again.
    deadline = time.monotonic() + 60
    for n in itertools.count():
        outcome = send(url, model, f"back-{n}", stream=False)
        assert outcome.ok, outcome.detail
        entry = nginx_log(stack).get(outcome.rid)
        if entry is not None and entry.upstreams[-1] == victim:
            break
        assert time.monotonic() < deadline, "nginx never sent a request to the restarted replica"
        time.sleep(1)
