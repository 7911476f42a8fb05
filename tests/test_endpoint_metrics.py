"""/metrics counts requests and errors per endpoint, on the shared server: vLLM's
`http_requests_total{handler, method, status}` (the route's template, the status by its
hundred) and `pagode:http_request_errors_total{handler, method, code, error_type}`, for the
four generation endpoints and the stored responses' routes, refusals that a middleware
sends before any route runs included; /metrics and /health are left out, as vLLM leaves
them out."""

from __future__ import annotations

import httpx
import pytest
from server_fixtures import metric_value

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "Hi"}]
# Each endpoint with a body it serves and one it refuses with a 400.
ENDPOINTS = {
    "/v1/completions": ({"prompt": "Hi", "max_tokens": 2}, {"prompt": "Hi", "n": 0}),
    "/v1/chat/completions": ({"messages": CHAT, "max_tokens": 2},
                             {"messages": CHAT, "logits_processors": ["x"]}),
    "/v1/messages": ({"model": "SmolLM2-135M-Instruct", "max_tokens": 2, "messages": CHAT},
                     {"model": "SmolLM2-135M-Instruct", "messages": CHAT}),
    "/v1/responses": ({"input": "Hi", "max_output_tokens": 2, "store": False},
                      {"input": "Hi", "background": True}),
    "/v1/messages/count_tokens": ({"model": "SmolLM2-135M-Instruct", "messages": CHAT},
                                  {"model": "SmolLM2-135M-Instruct"}),
}


def requests(text: str, handler: str, status: str, method: str = "POST") -> float:
    try:
        return metric_value(text, "http_requests_total",
                            {"handler": handler, "method": method, "status": status})
    except KeyError:
        return 0.0


def errors(text: str, handler: str, code: str, method: str = "POST") -> float:
    try:
        return metric_value(text, "pagode:http_request_errors_total",
                            {"handler": handler, "method": method, "code": code})
    except KeyError:
        return 0.0


async def scrape(http: httpx.AsyncClient) -> str:
    response = await http.get("/metrics")
    assert response.status_code == 200
    return response.text


@pytest.mark.parametrize("path", list(ENDPOINTS))
async def test_each_endpoint_counts_its_successes_and_its_errors(http: httpx.AsyncClient,
                                                                 path: str) -> None:
    served, refused = ENDPOINTS[path]
    before = await scrape(http)
    for _ in range(2):
        assert (await http.post(path, json=served)).status_code == 200
    answer = await http.post(path, json=refused)
    assert answer.status_code == 400, answer.text
    after = await scrape(http)
    assert requests(after, path, "2xx") == requests(before, path, "2xx") + 2
    assert requests(after, path, "4xx") == requests(before, path, "4xx") + 1
    assert errors(after, path, "400") == errors(before, path, "400") + 1
    others = [p for p in ENDPOINTS if p != path]  # nothing leaks into another endpoint
    assert [requests(after, p, "2xx") for p in others] == \
        [requests(before, p, "2xx") for p in others]


async def test_a_stored_response_is_counted_under_its_template_not_its_id(
        http: httpx.AsyncClient) -> None:
    handler = "/v1/responses/{response_id}"
    before = await scrape(http)
    created = await http.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 2})
    assert created.status_code == 200
    assert (await http.get(f"/v1/responses/{created.json()['id']}")).status_code == 200
    assert (await http.get("/v1/responses/resp_nothing_here")).status_code == 404
    after = await scrape(http)
    assert requests(after, handler, "2xx", "GET") == requests(before, handler, "2xx", "GET") + 1
    assert errors(after, handler, "404", "GET") == errors(before, handler, "404", "GET") + 1
    assert created.json()["id"] not in after


async def test_refusals_before_routing_and_unknown_paths_are_counted(
        http: httpx.AsyncClient) -> None:
    before = await scrape(http)
    not_json = await http.post("/v1/messages", content=b"{}",
                               headers={"content-type": "text/plain"})
    assert not_json.status_code == 415
    assert (await http.get("/v1/nowhere")).status_code == 404
    after = await scrape(http)
    assert errors(after, "/v1/messages", "415") == errors(before, "/v1/messages", "415") + 1
    assert requests(after, "none", "4xx", "GET") == requests(before, "none", "4xx", "GET") + 1


async def test_scrapes_and_probes_are_not_counted(http: httpx.AsyncClient) -> None:
    assert (await http.get("/health")).status_code == 200
    text = await scrape(http)
    assert 'handler="/metrics"' not in text and 'handler="/health"' not in text
    assert "# TYPE http_requests_total counter" in text
