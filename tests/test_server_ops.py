"""Operations, each on a small server of its own: authentication, the bounded queue (429),
an engine loop that dies (/health 503, errors instead of hangs), and SIGTERM's drain."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from dying_server import DYING_MESSAGE
from server_fixtures import (
    SMALL_ARGS,
    ServerProcess,
    json_error,
    launch_server,
    metric_value,
    wait_all_healthy,
)

pytestmark = pytest.mark.slow

API_KEY = "test-key-123"
SERVED_NAME = "smol-test"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
SHUTDOWN_TIMEOUT_S = 5
# Longer than any CPU writes in SHUTDOWN_TIMEOUT_S (it would take 800 tokens/s for one
# stream), so the drain's timeout, not the request, ends it; an aborted request costs no
# more than the timeout.
LONG_TOKENS = 4000
LONG = {"prompt": "Count:", "max_tokens": LONG_TOKENS, "temperature": 0, "ignore_eos": True,
        "stream": True}
WAIT_S = 60.0


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    """Both small servers, loading their models at the same time."""
    log_dir = tmp_path_factory.mktemp("ops-logs")
    ops = launch_server([*SMALL_ARGS, "--api-key", API_KEY, "--served-model-name", SERVED_NAME,
                         "--max-num-seqs", "1", "--max-model-len", str(LONG_TOKENS + 64),
                         "--max-num-queued-reqs", "2", "--shutdown-timeout",
                         str(SHUTDOWN_TIMEOUT_S)], log_dir, name="ops")
    dying = launch_server([*SMALL_ARGS, "--max-model-len", str(LONG_TOKENS + 64), "--log-requests-text",
                           "--engine-factory", "tests.dying_server:DyingEngine"], log_dir,
                          name="dying")
    try:
        wait_all_healthy([ops, dying])
        yield {"ops": ops, "dying": dying}
    finally:
        ops.stop()
        dying.stop()


@pytest.fixture
async def ops(servers: dict[str, ServerProcess]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=servers["ops"].base_url, timeout=30.0) as client:
        yield client


class OpenStream:
    """A streaming request held open by the test, read event by event."""

    def __init__(self, client: httpx.AsyncClient, body: dict[str, Any]) -> None:
        self.client = client
        self.body = body
        self.stack = contextlib.AsyncExitStack()
        self.response: httpx.Response | None = None
        self.lines: AsyncIterator[str] | None = None

    async def open(self) -> OpenStream:
        self.response = await self.stack.enter_async_context(
            self.client.stream("POST", "/v1/completions", json=self.body, headers=AUTH))
        assert self.response.status_code == 200, await self.response.aread()
        self.lines = self.response.aiter_lines()
        return self

    async def next_data(self) -> str:
        assert self.lines is not None
        async for line in self.lines:
            if line.startswith("data: "):
                return line[len("data: "):]
        raise EOFError

    async def rest(self) -> list[str]:
        data = []
        with contextlib.suppress(EOFError):
            while True:
                data.append(await asyncio.wait_for(self.next_data(), WAIT_S))
        return data

    async def close(self) -> None:
        await self.stack.aclose()


async def test_api_key_required_on_api_routes(ops: httpx.AsyncClient) -> None:
    body = {"prompt": "Hi", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY},
                    {"Authorization": f"Basic {API_KEY}"}):
        for path, payload in (("/v1/completions", body), ("/tokenize", {"prompt": "Hi"}),
                              ("/detokenize", {"tokens": [1]})):
            response = await ops.post(path, json=payload, headers=headers)
            assert response.status_code == 401, (path, headers)
            assert json_error(response)["type"] == "AuthenticationError"
        models = await ops.get("/v1/models", headers=headers)
        assert models.status_code == 401
    assert (await ops.get("/health")).status_code == 200
    assert (await ops.get("/metrics")).status_code == 200
    assert (await ops.get("/v1/models", headers=AUTH)).status_code == 200
    ok = await ops.post("/v1/completions", json=body, headers=AUTH)
    assert ok.status_code == 200
    assert ok.json()["usage"]["completion_tokens"] >= 1
    # No fault-injection route in production (tests/dying_server.py is the test double).
    assert (await ops.post("/debug/kill-engine-loop", headers=AUTH)).status_code == 404


async def test_served_model_name(ops: httpx.AsyncClient) -> None:
    models = (await ops.get("/v1/models", headers=AUTH)).json()
    assert [m["id"] for m in models["data"]] == [SERVED_NAME]
    body = {"prompt": "Hi", "max_tokens": 2, "model": SERVED_NAME}
    ok = await ops.post("/v1/completions", json=body, headers=AUTH)
    assert ok.status_code == 200 and ok.json()["model"] == SERVED_NAME
    text = (await ops.get("/metrics")).text
    assert metric_value(text, "pagode:request_success_total",
                        {"model_name": SERVED_NAME, "finished_reason": "length"}) >= 1


def test_health_is_503_while_the_model_loads(servers: dict[str, ServerProcess]) -> None:
    # Both servers answered /health while loading; it said 503 until the engine was up.
    for server in servers.values():
        statuses = server.health_statuses
        assert statuses[-1] == 200
        assert 503 in statuses and set(statuses[:-1]) == {503}, statuses


async def test_log_requests_text_logs_prompt_and_output(
        servers: dict[str, ServerProcess]) -> None:
    server = servers["dying"]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30.0) as client:
        body = {"prompt": "Sing about a teapot", "max_tokens": 3, "temperature": 0}
        result = (await client.post("/v1/completions", json=body)).json()
    line = next(line for line in server.log().splitlines()
                if f"id={result['id']}-0 " in line)
    assert "prompt='Sing about a teapot'" in line
    assert f"output={result['choices'][0]['text']!r}" in line


async def test_steps_run_in_the_thread_that_loaded_the_model(
        servers: dict[str, ServerProcess]) -> None:
    # One OpenMP master thread per process: the runner warns when a step runs in another
    # thread than the model's loader (each gets its own throttled worker pool, a slower step).
    server = servers["dying"]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30.0) as client:
        body = {"prompt": "Sing about a kettle", "max_tokens": 4, "temperature": 0}
        (await client.post("/v1/completions", json=body)).raise_for_status()
    assert "id=" in server.log()  # the request reached the engine and was logged
    assert "another thread than the one that loaded it" not in server.log()


async def wait_for_metric(client: httpx.AsyncClient, name: str, value: float) -> str:
    deadline = time.monotonic() + WAIT_S
    while True:
        text = (await client.get("/metrics")).text
        if metric_value(text, name) == value:
            return text
        assert time.monotonic() < deadline, f"{name} never reached {value}"
        await asyncio.sleep(0.05)


async def test_queue_bound_answers_429_at_once(ops: httpx.AsyncClient) -> None:
    running = await OpenStream(ops, LONG).open()
    await running.next_data()  # it runs: the only batch slot (--max-num-seqs 1) is taken
    waiting = [await OpenStream(ops, {**LONG, "max_tokens": 4}).open() for _ in range(2)]
    try:
        await wait_for_metric(ops, "pagode:num_requests_queued", 2)
        # Past the bound: refused now, not left hanging.
        refused = await ops.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                                 headers=AUTH, timeout=10.0)
        assert refused.status_code == 429
        assert int(refused.headers["Retry-After"]) >= 1
        assert json_error(refused)["type"] == "RateLimitError"
        refused_stream = await ops.post("/v1/completions", json={**LONG, "max_tokens": 2},
                                        headers=AUTH, timeout=10.0)
        assert refused_stream.status_code == 429
        text = (await ops.get("/metrics")).text
        assert metric_value(text, "pagode:num_requests_rejected_total",
                            {"reason": "queue_full"}) == 2
        assert metric_value(text, "pagode:num_requests_queued") == 2
    finally:
        await running.close()  # the running stream goes: the waiting two can run
    for stream in waiting:
        data = await stream.rest()
        assert data[-1] == "[DONE]"
        assert json.loads(data[-2])["choices"][0]["finish_reason"] == "length"
        await stream.close()
    await wait_for_metric(ops, "pagode:num_requests_queued", 0)
    ok = await ops.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                        headers=AUTH)
    assert ok.status_code == 200


async def test_dead_engine_loop_fails_requests_and_health(
        servers: dict[str, ServerProcess]) -> None:
    async with httpx.AsyncClient(base_url=servers["dying"].base_url, timeout=30.0) as client:
        assert (await client.get("/health")).status_code == 200
        in_flight = await OpenStream(client, LONG).open()
        await in_flight.next_data()
        servers["dying"].signal(signal.SIGUSR1)  # the double's engine loop dies
        # The stream in flight ends with an error event and [DONE] instead of hanging.
        data = await in_flight.rest()
        await in_flight.close()
        assert data[-1] == "[DONE]"
        error = json.loads(data[-2])["error"]
        assert error["code"] in (500, 503) and error["message"]
        health = await client.get("/health")
        assert health.status_code == 503
        assert "engine loop" in json_error(health)["message"]
        bodies = [*data, health.text]
        for body in ({"prompt": "Hi", "max_tokens": 2}, {**LONG, "max_tokens": 2}):
            response = await client.post("/v1/completions", json=body, timeout=10.0)
            assert response.status_code == 503
            assert json_error(response)["type"] == "ServiceUnavailableError"
            bodies.append(response.text)
        chat = await client.post("/v1/chat/completions", timeout=10.0,
                                 json={"messages": [{"role": "user", "content": "Hi"}]})
        assert chat.status_code == 503
        bodies.append(chat.text)
    # The engine's exception text is for the log, never for clients.
    assert all(DYING_MESSAGE not in body for body in bodies), bodies
    assert DYING_MESSAGE in servers["dying"].log()


def finish_reason(data: list[str]) -> str:
    chunks = [json.loads(d) for d in data if d != "[DONE]"]
    return str(chunks[-1]["choices"][0]["finish_reason"])


async def test_sigterm_drains_then_aborts_and_exits_0(
        servers: dict[str, ServerProcess]) -> None:
    # Whatever the machine's speed, all three are in flight at SIGTERM: the first runs (it
    # has sent one token), the others wait behind it (--max-num-seqs 1). The client lets
    # the first go once the drain has begun, so the short one (one token: one step) runs and
    # finishes inside --shutdown-timeout, and the long one after it is still running when
    # that ends.
    server = servers["ops"]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30.0) as client:
        await wait_for_metric(client, "pagode:num_requests_running", 0)
        first = await OpenStream(client, LONG).open()
        await first.next_data()  # running
        short = await OpenStream(client, {**LONG, "max_tokens": 1}).open()
        await wait_for_metric(client, "pagode:num_requests_waiting", 1)
        long = await OpenStream(client, LONG).open()
        await wait_for_metric(client, "pagode:num_requests_waiting", 2)
        server.signal(signal.SIGTERM)
        deadline = time.monotonic() + WAIT_S
        while (await client.get("/health")).status_code == 200:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await first.close()  # its client leaves: the batch slot frees for the short one
        # Draining: no new work, an honest 503.
        refused = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                                    headers=AUTH)
        assert refused.status_code == 503
        assert json_error(refused)["type"] == "ServiceUnavailableError"
        short_data = await short.rest()
        long_data = await long.rest()
        await short.close()
        await long.close()
    assert short_data[-1] == "[DONE]" and finish_reason(short_data) == "length"
    # The long request outlived --shutdown-timeout: aborted, its stream closed properly.
    assert long_data[-1] == "[DONE]" and finish_reason(long_data) == "abort"
    assert server.wait_exit() == 0
    log = server.log()
    assert "draining 3 in-flight request(s)" in log
    assert "aborting 1 request(s)" in log
