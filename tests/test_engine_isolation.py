"""One request can never hurt another inside the engine step, on the real default model.

A poisoned request (its parameters corrupted after admission, as a bug or a missed check
would) raises inside the batched sampler or in post-processing; only that request fails,
and the stream beside it produces exactly the tokens it produces alone.
"""

from __future__ import annotations

import math

import pytest

from engine import LLM, SamplingParams
from engine.runner.logprob_values import finite_logprob
from engine.types.errors import InvalidRequestError
from engine.types.outputs import StreamDelta

STREAM = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture
def llm(default_llm: LLM) -> LLM:
    """The session's default engine (tests/conftest.py)."""
    return default_llm


def run_until_done(llm: LLM) -> dict[str, list[StreamDelta]]:
    deltas: dict[str, list[StreamDelta]] = {}
    while llm.engine.has_unfinished():
        for d in llm.engine.step():
            deltas.setdefault(d.request_id, []).append(d)
    return deltas


def tokens(deltas: list[StreamDelta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def test_a_poisoned_sample_fails_alone(llm: LLM) -> None:
    alone = llm.generate("The capital of France is", STREAM)[0].token_ids
    llm.engine.add_request("stream", "The capital of France is", STREAM)
    llm.engine.step()  # the stream is running
    poisoned = SamplingParams(temperature=0.8, max_tokens=4, min_tokens=2)
    llm.engine.add_request("poisoned", "Hi", poisoned)
    poisoned.stop_token_ids = [99_999_999]  # out of the vocabulary: IndexError when masked
    deltas = run_until_done(llm)
    assert deltas["poisoned"][-1].finished and deltas["poisoned"][-1].error
    assert deltas["poisoned"][-1].finish_reason == "abort"
    stream = deltas["stream"]
    assert not any(d.error for d in stream)
    assert stream[-1].finish_reason == "length"
    assert tokens(stream) == alone[len(alone) - len(tokens(stream)):]
    llm.engine.check_invariants()
    assert llm.engine.block_manager.usage == 0


def test_a_poisoned_postprocess_fails_alone(llm: LLM) -> None:
    alone = llm.generate("def fibonacci(n):", STREAM)[0].token_ids
    llm.engine.add_request("stream", "def fibonacci(n):", STREAM)
    llm.engine.add_request("poisoned", "Hi", SamplingParams(temperature=0, max_tokens=8))

    def explode(token_id: int) -> None:
        raise RuntimeError("detokenizer fault")

    llm.engine.requests["poisoned"].detokenizer.add = explode  # type: ignore[method-assign]
    deltas = run_until_done(llm)
    assert deltas["poisoned"][-1].error and "detokenizer fault" in deltas["poisoned"][-1].error
    assert tokens(deltas["stream"]) == alone
    assert llm.engine.block_manager.usage == 0


def test_engine_validation_uses_the_shared_limits(llm: LLM) -> None:
    limits = llm.engine.limits
    assert limits.vocab_size == min(llm.engine.model_config.vocab_size, len(llm.tokenizer))
    for params, param in [
        (SamplingParams(stop_token_ids=[limits.vocab_size]), "stop_token_ids"),
        (SamplingParams(stop_token_ids=[-1]), "stop_token_ids"),
        (SamplingParams(logit_bias={limits.vocab_size: 1.0}), "logit_bias"),
        (SamplingParams(stop=["x"] * 1000), "stop"),
    ]:
        with pytest.raises(InvalidRequestError) as refused:
            llm.engine.add_request("bad", "Hi", params)
        assert refused.value.param == param
    with pytest.raises(InvalidRequestError):
        llm.engine.add_request("bad", [limits.vocab_size], SamplingParams())
    assert not llm.engine.has_unfinished()


@pytest.mark.parametrize("field,value", [
    ("temperature", math.nan), ("top_p", math.inf), ("repetition_penalty", 1e-300),
    ("repetition_penalty", math.inf), ("presence_penalty", -math.inf), ("min_p", math.nan),
])
def test_numbers_that_break_sampling_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]
    if not math.isfinite(value):
        with pytest.raises(ValueError, match="logit_bias"):
            SamplingParams(logit_bias={1: value})


def test_tiny_temperature_is_greedy(llm: LLM) -> None:
    assert SamplingParams(temperature=1e-50).greedy
    greedy = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=16))
    tiny = llm.generate("Once upon a time", SamplingParams(temperature=1e-50, max_tokens=16))
    assert tiny[0].token_ids == greedy[0].token_ids


def test_logprobs_are_always_json_numbers() -> None:
    for value in (-math.inf, math.nan, -1e308, math.inf):
        assert math.isfinite(finite_logprob(value))
    assert finite_logprob(-0.5) == -0.5
