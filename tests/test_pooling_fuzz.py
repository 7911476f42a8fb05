"""schemathesis on the pooling endpoints of a tiny embedding server, from its live OpenAPI
schema: whatever body it generates for /v1/embeddings, /v1/rerank and /v1/score, the answer is
never a 5xx, every error is in OpenAI's shape, every success strict JSON, and the server stays
healthy."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from pooling_zoo import build_bert
from schemathesis.core.result import Ok
from server_fixtures import ServerProcess, running_server

pytestmark = pytest.mark.slow

PATHS = "^/v1/(embeddings|rerank|score)$"
EXAMPLES_PER_OPERATION = 40


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = build_bert(tmp_path_factory.mktemp("bert-fuzz"))
    with running_server(["--model", str(folder)], tmp_path_factory.mktemp("logs")) as server:
        yield server


def strict_json(text: str) -> Any:
    def refuse(constant: str) -> float:
        raise AssertionError(f"non-standard JSON constant {constant}")

    value = json.loads(text, parse_constant=refuse)
    assert not isinstance(value, float) or math.isfinite(value)
    return value


def test_pooling_endpoints_fuzz(embed_server: ServerProcess) -> None:
    schema = schemathesis.openapi.from_url(f"{embed_server.base_url}/openapi.json")
    operations = [r.ok() for r in schema.include(path_regex=PATHS).get_all_operations() if isinstance(r, Ok)]
    assert sorted(op.path for op in operations) == ["/v1/embeddings", "/v1/rerank", "/v1/score"]
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            response = case.call(base_url=embed_server.base_url, timeout=120)
            assert response.status_code < 500, response.text[:500]
            body = strict_json(response.text)
            if response.status_code >= 400:
                assert set(body) == {"error"} and body["error"]["code"] == response.status_code, body
                assert set(body["error"]) == {"message", "type", "param", "code"}, body

        run()
    assert httpx.get(f"{embed_server.base_url}/health").status_code == 200
