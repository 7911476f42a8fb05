"""The test suite looks for the next hostile input by itself, on the session server.

- schemathesis generates requests from the live server's OpenAPI schema for
  /v1/completions, /v1/chat/completions, /tokenize and /detokenize (a bounded budget;
  generation lengths and n are capped so that the budget goes to validation, not to
  decoding). No answer is a 5xx, every error has the OpenAI shape, streams end cleanly.
- hypothesis sends random sampling parameters (NaN, +-inf, 0, negative, huge, wrong types)
  through the validation layer: the answer is a 400 or a valid completion, never anything
  else, every body is strict JSON, and the usage counts the tokens the choices carry.
"""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.core.result import Ok
from server_fixtures import SESSION_ARGS, ServerProcess, json_error

pytestmark = pytest.mark.slow

FUZZED_PATHS = "^/(v1/completions|v1/chat/completions|tokenize|detokenize)$"
EXAMPLES_PER_OPERATION = 60  # x 4 operations: a few hundred cases
MAX_TOKENS = 4
MAX_MODEL_LEN = int(SESSION_ARGS[SESSION_ARGS.index("--max-model-len") + 1])
# schemathesis stops reading an event stream after 20 events by default and closes the
# connection, which the server rightly takes for a client gone: it aborts the choices and
# the body it read ends without [DONE]. A streamed completion with n=2 and the default 16
# tokens is 33 events or more, so the check needs the whole stream.
MAX_STREAM_EVENTS = 100_000


def strict_json(text: str) -> Any:
    def refuse(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name} in {text[:200]}")
    return json.loads(text, parse_constant=refuse)


def cap_generation(body: Any) -> None:
    """Keep generated requests cheap to serve: few tokens, few choices."""
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and MAX_TOKENS < value < 2048:
            body[key] = MAX_TOKENS
    # Without a length, a completion runs 16 tokens (or to max_model_len when null), a chat
    # to max_model_len.
    if ("messages" in body or "prompt" in body) and body.get("max_tokens") is None and \
            body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_TOKENS
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and 2 < n <= 128:
        body["n"] = 2


def check_response(status: int, text: str, streamed: bool, cut_short: bool = False) -> None:
    assert status < 500, text[:500]
    if status >= 400:
        body = strict_json(text)
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert body["error"]["code"] == status and len(body["error"]["message"]) < 1000
    elif streamed:
        assert not cut_short, f"the client stopped reading the stream: {text[-300:]}"
        events = [line.removeprefix("data: ") for line in text.splitlines() if line]
        assert events[-1] == "[DONE]", text[-300:]
        for event in events[:-1]:
            assert "error" not in strict_json(event), event
    else:
        strict_json(text)


def fuzzed_operations(server: ServerProcess) -> list[Any]:
    schema = schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")
    schema.config.max_stream_events = MAX_STREAM_EVENTS
    operations = []
    for result in schema.include(path_regex=FUZZED_PATHS).get_all_operations():
        assert isinstance(result, Ok), result
        operations.append(result.ok())
    assert len(operations) == 4, [op.label for op in operations]
    return operations


def test_openapi_fuzz(server: ServerProcess) -> None:
    """schemathesis' generated cases for each operation, run with hypothesis directly
    (its pytest plugin does not load under this pytest).

    schemathesis reads a stream through its own transport, which stops after
    `max_stream_events` events and closes the connection; with its default of 20 a streamed
    n=2 completion was cut after 10 tokens a choice, both choices ended with
    finish_reason=abort (the server saw the client go) and the text had no [DONE]. The
    schema is loaded with a limit no capped case reaches, and a cut is reported as the
    client's."""
    for operation in fuzzed_operations(server):

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            cap_generation(case.body)
            streamed = isinstance(case.body, dict) and case.body.get("stream") is True
            response = case.call(base_url=server.base_url, timeout=120)
            check_response(response.status_code, response.text, streamed,
                           response.stream_cut_short)

        run()
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def test_the_fuzz_client_reads_a_long_stream_to_its_end(server: ServerProcess) -> None:
    """More events than schemathesis reads by default (20): two choices of 16 tokens."""
    operation = next(op for op in fuzzed_operations(server) if op.path == "/v1/completions")
    body = {"prompt": "Hi", "stream": True, "n": 2, "max_tokens": 16, "ignore_eos": True}
    response = operation.Case(body=body, media_type="application/json").call(
        base_url=server.base_url, timeout=120)
    check_response(response.status_code, response.text, True, response.stream_cut_short)
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line]
    finished = [choice["finish_reason"] for event in events[:-1]
                for choice in strict_json(event)["choices"] if choice["finish_reason"]]
    assert finished == ["length", "length"], events[-3:]


def test_openapi_schema_covers_the_fuzzed_bodies(server: ServerProcess) -> None:
    spec = httpx.get(f"{server.base_url}/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
        ref = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        name = ref["schema"]["$ref"].rsplit("/", 1)[-1]
        assert spec["components"]["schemas"][name]["properties"], name
    assert httpx.get(f"{server.base_url}/health").status_code == 200


SAMPLING_FIELDS = ["temperature", "top_p", "top_k", "min_p", "seed", "max_tokens",
                   "min_tokens", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "n", "logprobs", "stop", "stop_token_ids",
                   "logit_bias", "ignore_eos", "best_of"]
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 0.0, -0.0, -1, 1, 2, 1e-300, -1e-300, 1e300, 2**63, 2**64, 1e-5,
                     math.nan, math.inf, -math.inf]),
)
VALUES = st.one_of(
    NUMBERS, st.none(), st.booleans(), st.text(max_size=6),
    st.lists(st.one_of(NUMBERS, st.text(max_size=4)), max_size=4),
    st.dictionaries(st.text(max_size=6), NUMBERS, max_size=3),
)


@given(fields=st.dictionaries(st.sampled_from(SAMPLING_FIELDS), VALUES, max_size=5),
       chat=st.booleans())
@settings(max_examples=120, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_random_sampling_params_get_400_or_a_valid_completion(
        server: ServerProcess, fields: dict[str, Any], chat: bool) -> None:
    body: dict[str, Any] = {"max_tokens": 2, **fields}
    if chat:
        body["messages"] = [{"role": "user", "content": "Hi"}]
    else:
        body["prompt"] = "Hi"
    cap_generation(body)
    # Unless the fuzz chose it, ask for per-token logprobs: the tokens each choice carries.
    body.setdefault("logprobs", True if chat else 0)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    raw = json.dumps(body)  # NaN and Infinity go out as the JSON literals Python writes
    response = httpx.post(server.base_url + path, content=raw, timeout=120,
                          headers={"content-type": "application/json"})
    assert response.status_code in (200, 400), (body, response.status_code, response.text)
    if response.status_code == 400:
        json_error(response)
        return
    result = strict_json(response.text)
    assert len(result["choices"]) == body.get("n", 1)
    check_usage(result, body["max_tokens"])


def choice_tokens(choice: dict[str, Any]) -> list[str] | None:
    """The tokens a choice generated, from its logprobs (None when it has none)."""
    logprobs = choice.get("logprobs")
    if not logprobs:
        return None
    if "tokens" in logprobs:
        return list(logprobs["tokens"])
    return None if logprobs.get("content") is None else [t["token"] for t in logprobs["content"]]


def check_usage(result: dict[str, Any], max_tokens: Any) -> None:
    """completion_tokens is the sum of the choices' tokens, each within its limit: exactly
    the limit when it ended on length, at least one (an EOS or a stop string's token is
    counted) when it stopped."""
    usage = result["usage"]
    # One prompt: the limit is max_tokens (which the server took as an integer), or what
    # the context leaves.
    limit = MAX_MODEL_LEN - usage["prompt_tokens"]
    if max_tokens is not None:
        limit = min(int(max_tokens), limit)
    low, high = 0, 0
    for choice in result["choices"]:
        assert choice["finish_reason"] in ("stop", "length"), choice
        tokens = choice_tokens(choice)
        if choice["finish_reason"] == "length":
            low, high = low + limit, high + limit
            assert tokens is None or len(tokens) == limit, (limit, choice)
        else:
            low, high = low + 1, high + limit
            assert tokens is None or 1 <= len(tokens) <= limit, (limit, choice)
    assert low <= usage["completion_tokens"] <= high, (low, high, result)
    counted = [choice_tokens(choice) for choice in result["choices"]]
    if all(tokens is not None for tokens in counted):
        assert usage["completion_tokens"] == sum(len(t or []) for t in counted), result
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_server_healthy_after_fuzzing(server: ServerProcess) -> None:
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    text = httpx.get(f"{server.base_url}/metrics").text
    assert "pagode:http_responses_total" in text
    assert 'code="500"' not in text


# The agents' APIs, fuzzed the same way: Anthropic's error shape on /v1/messages, OpenAI's
# on /v1/responses, and each stream ends with its API's last event.
AGENT_FUZZED_PATHS = "^/v1/(messages|messages/count_tokens|responses)$"
AGENT_EXAMPLES_PER_OPERATION = 25
LAST_EVENTS = {"/v1/messages": {"message_stop"},
               "/v1/responses": {"response.completed", "response.incomplete"}}


def cap_agent_generation(body: Any) -> None:
    """Few tokens: both APIs cut an output limit to what the context leaves, not to 4."""
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_output_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
            body[key] = MAX_TOKENS
    if "input" in body and body.get("max_output_tokens") is None:
        body["max_output_tokens"] = MAX_TOKENS


def check_agent_response(path: str, status: int, text: str, streamed: bool) -> None:
    assert status < 500, text[:500]
    if status >= 400:
        body = strict_json(text)
        if path.startswith("/v1/messages"):
            assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        else:
            assert set(body) == {"error"} and body["error"]["code"] == status, body
    elif streamed:
        events = [strict_json(line.removeprefix("data: ")) for line in text.splitlines()
                  if line.startswith("data: ")]
        assert events[-1]["type"] in LAST_EVENTS[path], text[-300:]
    else:
        strict_json(text)


def test_agent_api_fuzz(server: ServerProcess) -> None:
    schema = schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")
    schema.config.max_stream_events = MAX_STREAM_EVENTS
    operations = [result.ok() for result in
                  schema.include(path_regex=AGENT_FUZZED_PATHS).get_all_operations()
                  if isinstance(result, Ok)]
    assert sorted(op.path for op in operations) == [
        "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"]
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=AGENT_EXAMPLES_PER_OPERATION, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            path = case.operation.path
            cap_agent_generation(case.body)
            streamed = isinstance(case.body, dict) and case.body.get("stream") is True
            response = case.call(base_url=server.base_url, timeout=120)
            assert not response.stream_cut_short
            check_agent_response(path, response.status_code, response.text, streamed)

        run()
    assert httpx.get(f"{server.base_url}/health").status_code == 200
