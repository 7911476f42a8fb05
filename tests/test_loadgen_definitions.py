"""Definitions: percentiles, SSE parsing, and TTFT/ITL/TPOT/E2E exactly as vLLM defines them."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest

from loadgen.client import StreamHandler, extract_text
from loadgen.compare import compare_rows
from loadgen.metrics import (
    SLO,
    describe,
    max_overlap,
    meets_slo,
    parse_slo,
    percentile,
    summarize,
)
from loadgen.records import RequestRecord
from loadgen.scrape import extract_fields, parse_prometheus
from loadgen.sse import SSEEvent, aiter_events

# ---------------------------------------------------------------- percentiles


@pytest.mark.parametrize("q", [0, 1, 50, 90, 99, 99.9, 100])
def test_percentile_matches_numpy(q: float) -> None:
    values = np.random.default_rng(0).lognormal(size=997).tolist()
    assert percentile(values, q) == pytest.approx(np.percentile(values, q), rel=1e-12)


def test_percentile_interpolates_linearly() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    assert np.isnan(percentile([], 50))


def test_describe_reports_mean_and_percentiles() -> None:
    values = [0.1, 0.2, 0.3, 0.4, 10.0]
    stats = describe(values)
    assert stats["count"] == 5
    assert stats["mean"] == pytest.approx(np.mean(values))
    for q in (50, 90, 99):
        assert stats[f"p{q}"] == pytest.approx(np.percentile(values, q))
    assert describe([])["p99"] is None


# ---------------------------------------------------------------- SSE parsing


class Chunks(httpx.AsyncByteStream):
    """A response body delivered in the given pieces; remembers how many were read."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces
        self.read = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            self.read += 1
            yield piece


def sse_events(pieces: list[bytes], reads: list[int] | None = None) -> list[SSEEvent]:
    """Parse a body through loadgen's real path (httpx-sse on an httpx.Response)."""
    body = Chunks(pieces)

    async def collect() -> list[SSEEvent]:
        resp = httpx.Response(200, headers={"content-type": "text/event-stream; charset=utf-8"},
                              stream=body)
        out = []
        async for event, _ in aiter_events(resp, time.perf_counter()):
            out.append(event)
            if reads is not None:
                reads.append(body.read)
        return out

    return asyncio.run(collect())


STREAM = (
    ": keep-alive comment\r\n"
    "data: {\"choices\": [{\"text\": \"caf\u00e9 \u2014 \U0001f600\"}]}\r\n\r\n"
    "event: message\n"
    "data: first line\n"
    "data: second line\n\n"
    "data:no-space\r\r"
    "retry: 3000\r\n\r\n"
    "id: 7\ndata: [DONE]\n\n"
).encode()
EXPECTED = [
    '{"choices": [{"text": "caf\u00e9 \u2014 \U0001f600"}]}',
    "first line\nsecond line",
    "no-space",
    "[DONE]",
]


def test_sse_parses_a_whole_stream() -> None:
    events = sse_events([STREAM])
    assert [e.data for e in events] == EXPECTED
    assert events[-1].id == "7"


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 13])
def test_sse_survives_any_split_of_the_bytes(size: int) -> None:
    # Splits fall mid-line, between \r and \n, and inside multi-byte UTF-8 characters.
    pieces = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    assert [e.data for e in sse_events(pieces)] == EXPECTED


def test_sse_every_two_way_split() -> None:
    for cut in range(len(STREAM) + 1):
        assert [e.data for e in sse_events([STREAM[:cut], STREAM[cut:]])] == EXPECTED, cut


def test_sse_dispatches_an_event_at_its_blank_line_only() -> None:
    reads: list[int] = []
    events = sse_events([b'data: {"a"', b": 1}\n", b"\n", b"data: 2\n\n"], reads)
    assert [e.data for e in events] == ['{"a": 1}', "2"]
    assert reads == [3, 4]  # the first event came out only once its blank line was read


def test_sse_nasty_cases() -> None:
    body = (
        b"data: first\n\n"
        b": comment with data: inside\n"
        b"retry: 10\n"
        b"data\n"  # a field without a colon: an empty data line
        b"data:  two spaces keep one\n\n"
        b"event: custom\r\ndata: {\"x\": \"a\\nb\"}\r\n\r\n"
        b"retry: 5\n\n"  # no data: nothing to pass on
        b": only a comment\r\n\r\n"
        b"data: unterminated at the end"
    )
    events = sse_events([body])
    assert [(e.event, e.data) for e in events] == [
        ("message", "first"),
        ("message", "\n two spaces keep one"),
        ("custom", '{"x": "a\\nb"}'),
    ]
    assert events[1].retry == 10


# ---------------------------------------------------------------- TTFT, ITL, TPOT, E2E


def chunk(text: str | None = None, usage: dict[str, int] | None = None, chat: bool = False) -> SSEEvent:
    choices = []
    if text is not None:
        choices = [{"index": 0, "delta": {"content": text}}] if chat else [{"index": 0, "text": text}]
    body: dict[str, object] = {"choices": choices}
    if usage:
        body["usage"] = usage
    return SSEEvent(json.dumps(body))


def replay(events: list[tuple[float, SSEEvent]]) -> RequestRecord:
    record = RequestRecord(index=0, prompt_len=10, max_tokens=5, arrival=0.0, start=0.0)
    handler = StreamHandler(record, None)
    for t, event in events:
        handler.handle(event, t)
    record.success = record.error is None
    return record


def test_latencies_from_a_synthetic_timeline() -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    record = replay([
        (0.05, SSEEvent(json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))),
        (0.25, chunk("Hello", chat=True)),  # first event that carries text: TTFT
        (0.30, chunk(" wor", chat=True)),
        (0.45, chunk("ld", chat=True)),
        (0.46, chunk("", chat=True)),  # no text: not a content event
        (0.50, chunk("!", chat=True)),
        (0.52, chunk(None, usage=usage)),
        (0.53, SSEEvent("[DONE]")),
    ])
    assert record.ttft == pytest.approx(0.25)
    assert record.itls == pytest.approx([0.05, 0.15, 0.05])
    assert record.e2e == pytest.approx(0.53)  # the last event
    assert record.output_tokens == 5 and record.prompt_tokens == 10 and record.usage_reported
    # TPOT uses usage's token count (5), not the 4 content events.
    assert record.tpot == pytest.approx((0.53 - 0.25) / 4)


def test_tpot_undefined_for_a_single_token() -> None:
    record = replay([(0.1, chunk("x")), (0.2, chunk(None, usage={"completion_tokens": 1}))])
    assert record.ttft == pytest.approx(0.1) and record.itls == [] and record.tpot is None


def test_without_usage_tokens_are_counted_from_events() -> None:
    record = replay([(0.1, chunk("a")), (0.2, chunk("b")), (0.4, chunk("c")), (0.5, SSEEvent("[DONE]"))])
    assert record.output_tokens is None and not record.usage_reported
    assert record.counted_output_tokens == 3
    assert record.tpot == pytest.approx((0.5 - 0.1) / 2)


def test_a_stream_error_fails_the_request() -> None:
    record = replay([(0.1, chunk("a")), (0.2, SSEEvent('{"error": {"message": "engine died"}}'))])
    assert not record.success and "engine died" in (record.error or "")


def test_text_dialects() -> None:
    assert extract_text({"choices": [{"text": "a"}]}) == "a"
    assert extract_text({"choices": [{"delta": {"content": "b"}}]}) == "b"
    assert extract_text({"choices": [{"delta": {"role": "assistant"}}]}) == ""
    assert extract_text({"choices": []}) == ""
    assert extract_text({"content": "c", "stop": False}) == "c"


def test_itl_is_pooled_over_requests() -> None:
    a = RequestRecord(0, 1, 3, 0.0, content_times=[0.1, 0.2, 0.4], last_event_time=0.4,
                      output_tokens=3, success=True)
    b = RequestRecord(1, 1, 2, 0.0, content_times=[1.0, 2.0], last_event_time=2.0,
                      output_tokens=2, success=True)
    failed = RequestRecord(2, 1, 2, 0.0, content_times=[0.1, 9.0], success=False, error="x")
    s = summarize([a, b, failed], duration=4.0)
    gaps = [0.1, 0.2, 1.0]
    assert s["itl_s"]["count"] == 3
    assert s["itl_s"]["p50"] == pytest.approx(np.percentile(gaps, 50))
    assert s["itl_s"]["mean"] == pytest.approx(np.mean(gaps))
    assert s["tpot_s"]["mean"] == pytest.approx(np.mean([(0.4 - 0.1) / 2, (2.0 - 1.0) / 1]))
    assert s["completed"] == 2 and s["failed"] == 1
    assert s["errors"] == [{"message": "x", "count": 1}]
    assert s["request_throughput"] == pytest.approx(0.5)
    assert s["output_throughput"] == pytest.approx(5 / 4)
    assert s["total_token_throughput"] == pytest.approx(7 / 4)


def test_goodput_counts_requests_meeting_every_slo() -> None:
    fast = RequestRecord(0, 1, 3, 0.0, content_times=[0.1, 0.15, 0.2], last_event_time=0.2,
                         output_tokens=3, success=True)
    slow_start = RequestRecord(1, 1, 3, 0.0, content_times=[0.9, 0.95, 1.0], last_event_time=1.0,
                               output_tokens=3, success=True)
    slow_tokens = RequestRecord(2, 1, 3, 0.0, content_times=[0.1, 0.5, 0.9], last_event_time=0.9,
                                output_tokens=3, success=True)
    slo = parse_slo("ttft=500,itl=100,e2e=5")
    assert slo == SLO(ttft=0.5, tpot=0.1, e2e=5.0)
    assert [meets_slo(r, slo) for r in (fast, slow_start, slow_tokens)] == [True, False, False]
    s = summarize([fast, slow_start, slow_tokens], duration=2.0, slo=slo)
    assert s["good_requests"] == 1 and s["goodput"] == pytest.approx(0.5)


@pytest.mark.parametrize("bad", ["", "ttft", "foo=1", "ttft=-3"])
def test_bad_slo_is_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_slo(bad)


def test_max_concurrent_streaming_counts_overlapping_decodes() -> None:
    assert max_overlap([]) == 0
    assert max_overlap([(0, 1), (1, 2), (2, 3)]) == 1  # back to back: never two at once
    assert max_overlap([(0, 10), (1, 2), (1.5, 3), (2.5, 4)]) == 3
    recs = [RequestRecord(i, 1, 2, 0.0, start=s, content_times=[0.5, 1.0], last_event_time=1.0,
                          output_tokens=2, success=True) for i, s in enumerate([0.0, 0.2, 0.4, 5.0])]
    assert summarize(recs, duration=6.0)["max_concurrent_streaming"] == 3


# ---------------------------------------------------------------- /metrics


PROM = """# HELP pagode:num_requests_running Running requests.
# TYPE pagode:num_requests_running gauge
pagode:num_requests_running{model_name="m"} 7.0
pagode:num_requests_waiting{model_name="m"} 3.0
pagode:kv_cache_usage_perc{model_name="m"} 0.25
pagode:num_preemptions_total{model_name="m"} 2.0
pagode:request_queue_time_seconds_bucket{le="0.3",model_name="m"} 4.0
pagode:request_queue_time_seconds_sum{model_name="m"} 1.5
pagode:request_queue_time_seconds_count{model_name="m"} 6.0
"""


# A server that does not speculate exports no spec-decode counters.
NO_SPEC = {"spec_drafts": None, "spec_draft_tokens": None, "spec_accepted_tokens": None}


def test_prometheus_fields_with_either_prefix() -> None:
    fields = extract_fields(parse_prometheus(PROM))
    assert fields == {"waiting": 3.0, "running": 7.0, "kv_usage": 0.25, "preemptions": 2.0,
                      "queue_time_sum": 1.5, "queue_time_count": 6.0, **NO_SPEC}
    vllm = extract_fields(parse_prometheus(PROM.replace("pagode:", "vllm:")))
    assert vllm == fields


def test_prometheus_sums_label_sets_and_skips_unknown() -> None:
    text = 'vllm:num_requests_running{model_name="a"} 2\nvllm:num_requests_running{model_name="b"} 3\nother 9\n'
    fields = extract_fields(parse_prometheus(text))
    assert fields["running"] == 5.0 and fields["waiting"] is None


# ---------------------------------------------------------------- compare


def fake_results(rate: float, req_s: float, e2e_p99: float) -> dict[str, object]:
    lat = {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": e2e_p99, "count": 1}
    summary = {"request_throughput": req_s, "output_throughput": 10 * req_s, "ttft_s": lat,
               "itl_s": lat, "tpot_s": lat, "e2e_s": lat}
    return {"runs": [{"offered_rate": rate, "summary": summary}]}


def test_compare_ratios_against_the_first_run() -> None:
    rows = compare_rows([("static", fake_results(4.0, 1.0, 8.0)), ("paged", fake_results(4.0, 1.5, 2.0))])
    assert rows[0]["req/s ratio"] == pytest.approx(1.0)
    assert rows[1]["req/s ratio"] == pytest.approx(1.5)
    assert rows[1]["E2E p99 s ratio"] == pytest.approx(0.25)


def test_loadgen_imports_neither_engine_server_nor_torch() -> None:
    """Every loadgen module, imported in a fresh process, pulls in none of them."""
    import subprocess
    import sys

    code = "\n".join([
        "import importlib, pkgutil, sys, loadgen",
        "names = [m.name for m in pkgutil.iter_modules(loadgen.__path__, 'loadgen.')",
        "         if m.name != 'loadgen.__main__']",
        "for name in names: importlib.import_module(name)",
        "print(len(names), sorted(m for m in ('torch', 'engine', 'server', 'planner') if m in sys.modules))",
    ])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    count, loaded = out.stdout.strip().split(" ", 1)
    assert int(count) >= 15 and loaded == "[]"


def test_prometheus_nasty_label_values() -> None:
    # Label values with braces, spaces, commas, '=' and escaped quotes / backslashes / newlines;
    # a timestamp after a value; NaN and +Inf. The old regex split such lines wrongly.
    text = (
        '# HELP pagode:num_requests_running Running {requests}, "quoted".\n'
        '# TYPE pagode:num_requests_running gauge\n'
        'pagode:num_requests_running{model_name="a} 99 {b",x="1"} 2\n'
        'pagode:num_requests_running{model_name="with \\"quotes\\" and \\\\ and \\n"} 3 1700000000000\n'
        'pagode:num_requests_waiting{model_name="m, n=1 } {"} 4.5\n'
        'pagode:kv_cache_usage_perc{model_name="m"} 0.5\n'
        'pagode:request_queue_time_seconds_bucket{le="+Inf",model_name="m"} 6\n'
        'pagode:request_queue_time_seconds_sum{model_name="m"} NaN\n'
    )
    values = parse_prometheus(text)
    assert values["pagode:num_requests_running"] == 5.0
    assert values["pagode:num_requests_waiting"] == 4.5
    assert values["pagode:request_queue_time_seconds_bucket"] == 6.0
    fields = extract_fields(values)
    assert fields["running"] == 5.0 and fields["waiting"] == 4.5 and fields["kv_usage"] == 0.5


def test_prometheus_skips_a_malformed_line_alone() -> None:
    text = 'pagode:num_requests_running{model_name="m"} 2\nthis is { not a metric\npagode:num_requests_waiting 1\n'
    assert extract_fields(parse_prometheus(text))["running"] == 2.0
    assert extract_fields(parse_prometheus(text))["waiting"] == 1.0


def test_prometheus_knows_sglang_and_llama_cpp() -> None:
    sglang = ('sglang:num_running_reqs{model_name="m",tp_rank="0"} 4\nsglang:num_queue_reqs{model_name="m"} 2\n'
              'sglang:token_usage{model_name="m"} 0.3\nsglang:num_retracted_requests_total{model_name="m"} 1\n'
              'sglang:queue_time_seconds_sum{model_name="m"} 2.5\nsglang:queue_time_seconds_count{model_name="m"} 5\n')
    assert extract_fields(parse_prometheus(sglang)) == {
        "waiting": 2.0, "running": 4.0, "kv_usage": 0.3, "preemptions": 1.0,
        "queue_time_sum": 2.5, "queue_time_count": 5.0, **NO_SPEC}
    llama = "llamacpp:requests_processing 3\nllamacpp:requests_deferred 1\nllamacpp:kv_cache_usage_ratio 0.1\n"
    fields = extract_fields(parse_prometheus(llama))
    assert (fields["running"], fields["waiting"], fields["kv_usage"]) == (3.0, 1.0, 0.1)
