"""Constrained decoding in the engine: constrained rows follow their grammar, unconstrained
rows in the same batch are untouched, and preemption-by-recompute leaves matchers right."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
from tests_support import PROMPTS

from engine import LLM, SamplingParams
from engine.structured_output import StructuredOutputError, StructuredOutputSpec
from engine.types.outputs import CompletionOutput

pytestmark = pytest.mark.slow

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 16},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150}}}
PHONE = r"\d{3}-\d{4}"
CHOICES = ["yes", "no", "maybe"]


@pytest.fixture
def llm(default_llm: LLM) -> LLM:
    """The session's default engine (tests/conftest.py)."""
    return default_llm


def chat(llm: LLM, question: str) -> str:
    return str(llm.tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                                 add_generation_prompt=True, tokenize=False))


def constrained(llm: LLM) -> list[tuple[str, SamplingParams]]:
    greedy = {"temperature": 0, "max_tokens": 40}
    return [
        (chat(llm, "Describe a person as JSON."),
         SamplingParams(**greedy, structured_outputs=StructuredOutputSpec.json_schema(PERSON))),
        (chat(llm, "Give me a phone number."),
         SamplingParams(**greedy, structured_outputs=StructuredOutputSpec.regex(PHONE))),
        (chat(llm, "Will it rain tomorrow?"),
         SamplingParams(**greedy, structured_outputs=StructuredOutputSpec.choice(CHOICES))),
    ]


def check_constrained(outs: list[Any]) -> None:
    person, phone, choice = outs
    for out in outs:
        assert out.finish_reason == "stop", out.text
    jsonschema.validate(json.loads(person.text), PERSON)
    assert re.fullmatch(PHONE, phone.text), phone.text
    assert choice.text in CHOICES


def test_batch_of_sixteen_mixed(llm: LLM) -> None:
    plain = PROMPTS[:6] + [chat(llm, q) for q in ("Hello!", "Name a colour.", "2+2=?", "Say hi",
                                                  "Count to three.", "Bye", "Why?")]
    assert len(plain) == 13
    plain_params = SamplingParams(temperature=0, max_tokens=8, logprobs=5)
    alone = llm.generate(plain, plain_params)
    rows = constrained(llm)
    # Interleave: constrained rows at the start, the middle and the end of the batch.
    prompts = [rows[0][0], *plain[:6], rows[1][0], *plain[6:], rows[2][0]]
    params = [rows[0][1], *[plain_params] * 6, rows[1][1], *[plain_params] * 7, rows[2][1]]
    mixed = llm.generate(prompts, params)
    assert len(mixed) == 16
    check_constrained([mixed[0], mixed[7], mixed[15]])
    together = mixed[1:7] + mixed[8:15]
    for a, b in zip(alone, together, strict=True):
        assert_same_or_near_tie(a.outputs[0], b.outputs[0])


# The shipped int4 weights round otherwise in a batch of 13 and one of 16 (another GEMM
# split), so a greedy row may take the other of two near-tied tokens; a grammar's mask leaking
# onto a plain row would force a token far from the top, or change its top-5 altogether.
NEAR_TIE_NATS = 0.5


def assert_same_or_near_tie(alone: CompletionOutput, batched: CompletionOutput) -> None:
    """Equal tokens up to the end, or up to a parting at a near tie seen by both runs."""
    for k, (a, b) in enumerate(zip(alone.token_ids, batched.token_ids, strict=False)):
        if a == b:
            continue
        top_alone = {i: lp for i, _, lp in (alone.logprobs or [])[k].top}
        top_batched = {i: lp for i, _, lp in (batched.logprobs or [])[k].top}
        assert {a, b} <= top_alone.keys() and {a, b} <= top_batched.keys(), (alone.text, batched.text, k)
        assert abs(top_alone[a] - top_alone[b]) <= NEAR_TIE_NATS, (alone.text, batched.text, top_alone)
        assert abs(top_batched[a] - top_batched[b]) <= NEAR_TIE_NATS, (alone.text, batched.text, top_batched)
        return
    assert alone.token_ids == batched.token_ids, (alone.text, batched.text)


def test_recompute_after_preemption_keeps_matchers(llm: LLM, small_llm: LLM) -> None:
    prompt, params = constrained(llm)[0]
    reference = llm.generate(prompt, params)[0]
    # 11 blocks of 16 for four sequences of ~36 + 17 tokens: some are preempted mid-JSON and
    # recomputed; their matchers must stand where their outputs stand.
    before = small_llm.engine.stats().num_preemptions_total
    outs = small_llm.generate([prompt] * 4, params)
    assert small_llm.engine.stats().num_preemptions_total > before
    for out in outs:
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(out.text), PERSON)
        assert out.token_ids == reference.token_ids


def test_uncompilable_schema_says_why(llm: LLM) -> None:
    bad = StructuredOutputSpec.json_schema({"type": "object", "properties": {"a": {"type": 7}}})
    with pytest.raises(StructuredOutputError, match="JSON schema"):
        llm.generate("x", SamplingParams(structured_outputs=bad))
    with pytest.raises(StructuredOutputError, match="regex"):
        llm.generate("x", SamplingParams(structured_outputs=StructuredOutputSpec.regex("(")))
    assert not llm.engine.has_unfinished()


def test_grammar_cache_is_keyed_by_spec(llm: LLM) -> None:
    cache = llm.engine.structured.cache
    spec = StructuredOutputSpec.json_schema({"type": "object", "properties": {"k": {"type": "boolean"}}})
    first = llm.engine.structured.compile(spec)
    hits = cache.hits
    again = llm.engine.structured.compile(StructuredOutputSpec.json_schema(json.dumps(
        {"type": "object", "properties": {"k": {"type": "boolean"}}})))
    assert again is first and cache.hits == hits + 1


def test_length_is_reported_honestly(llm: LLM) -> None:
    spec = StructuredOutputSpec.json_schema({"type": "object", "required": ["text"],
                                             "properties": {"text": {"type": "string"}}})
    out = llm.generate(chat(llm, "Write a long story as JSON."),
                       SamplingParams(temperature=0, max_tokens=5, structured_outputs=spec))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5
    assert out.text.startswith("{")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_grammar_that_must_end_outranks_min_tokens(llm: LLM, temperature: float) -> None:
    """After "a" the choice's grammar allows only a stop token, which min_tokens would mask:
    the grammar wins and the output ends, instead of a step with no token left to sample."""
    params = SamplingParams(temperature=temperature, max_tokens=4, min_tokens=3, seed=0,
                            structured_outputs=StructuredOutputSpec.choice(["a"]))
    out = llm.generate("x", params)[0]
    assert out.text == "a" and out.finish_reason == "stop"
