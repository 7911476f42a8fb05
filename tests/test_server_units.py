"""Fast checks of the server's pure parts (no model, no HTTP)."""

from __future__ import annotations

import pytest

from engine.request_limits import RequestLimits, check_prompt
from engine.types.errors import InvalidRequestError
from server.api.errors import APIError
from server.middleware.auth import bearer_matches, is_protected
from server.runtime.admission import Admission
from server.runtime.metrics import REQUEST_TIME_BUCKETS, TTFT_BUCKETS, build_1_2_5_buckets
from server.translate.prompts import split_prompts


def test_admission_bounds_the_queue_and_releases_once() -> None:
    admission = Admission(max_queued=2, retry_after_s=3)
    first = admission.take_slots(2)
    with pytest.raises(APIError) as refused:
        admission.take_slots(1)
    assert refused.value.status == 429
    assert refused.value.headers == {"Retry-After": "3"}
    first[0].release()
    first[0].release()  # idempotent: a slot is given back once
    assert admission.queued == 1
    admission.take_slots(1)
    assert admission.queued == 2


def test_admission_lets_a_wide_request_in_only_when_nothing_waits() -> None:
    admission = Admission(max_queued=2)
    slots = admission.take_slots(5)  # n=5 is wider than the bound: delayed, not refused forever
    assert admission.queued == 5
    with pytest.raises(APIError):
        admission.take_slots(5)
    for slot in slots:
        slot.release()
    assert admission.queued == 0
    assert Admission(max_queued=None).take_slots(1000)


def test_bearer_check() -> None:
    assert bearer_matches("Bearer k1", "k1")
    assert bearer_matches("bearer k1", "k1")
    assert not bearer_matches("Bearer k2", "k1")
    assert not bearer_matches("k1", "k1")
    assert not bearer_matches(None, "k1")
    assert is_protected("/v1/completions") and is_protected("/tokenize")
    assert not is_protected("/health") and not is_protected("/metrics")
    assert is_protected("/stats/stream")  # the live view: how busy the server is
    assert not is_protected("/") and not is_protected("/ui/app.js")  # the page asks for the key


def test_buckets_resolve_cpu_latencies() -> None:
    assert build_1_2_5_buckets(1024) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    # At least four buckets per decade between 10 ms and 10 s, where CPU latencies fall.
    for buckets in (TTFT_BUCKETS, REQUEST_TIME_BUCKETS):
        for low in (0.01, 0.1, 1.0):
            assert sum(low <= b < low * 10 for b in buckets) >= 4, (buckets, low)


def test_context_checks_name_the_right_param() -> None:
    limits = RequestLimits(vocab_size=100, max_model_len=1024, max_prompt_tokens=4096)
    with pytest.raises(InvalidRequestError) as too_long:
        check_prompt([1] * 1024, 1, limits)
    assert too_long.value.param == "input_tokens"
    with pytest.raises(InvalidRequestError) as too_many:
        check_prompt([1] * 1000, 25, limits)
    assert too_many.value.param == "max_tokens"
    assert check_prompt([1] * 1000, 24, limits) == 24
    assert check_prompt([1] * 1000, None, limits) == 24


def test_prompt_shapes() -> None:
    assert split_prompts("a") == ["a"]
    assert split_prompts(["a", "b"]) == ["a", "b"]
    assert split_prompts([1, 2]) == [[1, 2]]
    assert split_prompts([[1], [2, 3]]) == [[1], [2, 3]]
    with pytest.raises(APIError):
        split_prompts([])


def test_prompt_logprobs_leave_the_engine_finite() -> None:
    """The server sends prompt logprobs as the engine gives them, so the engine makes every
    value JSON can carry: -inf and NaN become the floor (vLLM's -9999.0)."""
    import math
    from types import SimpleNamespace

    import torch

    from engine.runner import prompt_logprobs

    logits = torch.tensor([[0.0, float("nan"), 1.0], [float("-inf"), 0.0, 0.0]])
    seq = SimpleNamespace(request_id="r", token_ids=[2, 1, 0])
    plan = prompt_logprobs.PromptRows(seq, first_token=1, num_rows=2)  # type: ignore[arg-type]
    scored = prompt_logprobs.score(logits, [plan], {"r": 2}, str)["r"]
    values = [lp.logprob for lp in scored] + [v for lp in scored for _, _, v in lp.top]
    assert all(math.isfinite(v) and v <= 0.0 for v in values), values
    assert scored[1].logprob == -9999.0  # token 0 after a row whose logit for it is -inf


def test_settings_make_their_flags_and_check_them() -> None:
    """Each ServerSettings option is a `pagode serve` flag, and a bad value is refused."""
    from server import settings
    from server.cli import build_parser

    args = build_parser().parse_args(["serve", "--body-timeout", "7", "--max-body-bytes", "9",
                                      "--engine-factory", "tests.dying_server:DyingEngine"])
    made = settings.from_args(args)
    assert (made.body_timeout_s, made.max_body_bytes) == (7.0, 9)
    assert made.engine_factory == "tests.dying_server:DyingEngine"
    assert settings.from_args(build_parser().parse_args(["serve"])) == settings.ServerSettings()
    for bad in ({"header_timeout_s": 0}, {"limit_concurrency": -1}, {"shutdown_timeout": -1},
                {"engine_factory": "no-colon"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            settings.ServerSettings(**bad)  # type: ignore[arg-type]


def test_engine_factory_names_a_callable() -> None:
    from server.runtime.engine_factory import load_engine_factory

    assert load_engine_factory("collections:OrderedDict") is __import__("collections").OrderedDict
    with pytest.raises(TypeError):
        load_engine_factory("math:pi")
