"""Sampling, stopping, logprobs, detokenization and abort on the real default model."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.sampling_row import SamplingRow
from engine.runner.sampler import sample
from engine.types.outputs import StreamDelta

CHAT = "<|im_start|>user\nSay hello in one word.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture
def llm(default_llm: LLM) -> LLM:
    """The session's default engine (tests/conftest.py)."""
    return default_llm


def _stream(llm: LLM, prompt: str, params: SamplingParams, request_id: str = "s") -> list[StreamDelta]:
    llm.engine.add_request(request_id, prompt, params)
    deltas: list[StreamDelta] = []
    while llm.engine.has_unfinished():
        deltas += [d for d in llm.engine.step() if d.request_id == request_id]
    return deltas


def test_seeded_sampling_is_reproducible_whatever_the_batch(llm: LLM) -> None:
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=24)
    alone = llm.generate("Once upon a time", params)[0]
    others = SamplingParams(temperature=1.0, max_tokens=30)
    batch = llm.generate(["The sea", "Once upon a time", "def f(x):"], [others, params, others])
    assert batch[1].token_ids == alone.token_ids
    other_seed = llm.generate("Once upon a time", SamplingParams(temperature=0.9, seed=99, max_tokens=24))[0]
    assert other_seed.token_ids != alone.token_ids


def test_n_choices_differ_and_reproduce(llm: LLM) -> None:
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12)
    first = llm.generate("My favourite colour is", params)[0]
    again = llm.generate("My favourite colour is", params)[0]
    assert len(first.outputs) == 3 and [o.index for o in first.outputs] == [0, 1, 2]
    assert [o.token_ids for o in first.outputs] == [o.token_ids for o in again.outputs]
    assert len({tuple(o.token_ids) for o in first.outputs}) > 1


def test_stop_string_is_cut_and_never_streamed(llm: LLM) -> None:
    free = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=30))[0].text
    stop = free[8:12]  # a stop string that starts mid-output
    assert stop.strip() and free.index(stop) == 8
    deltas = _stream(llm, "The capital of France is", SamplingParams(temperature=0, max_tokens=30, stop=[stop]))
    assert "".join(d.text for d in deltas) == free[:8]
    assert deltas[-1].finish_reason == "stop" and deltas[-1].stop_reason == stop


def test_stop_token_ids_and_eos(llm: LLM) -> None:
    free = llm.generate("def fibonacci(n):", SamplingParams(temperature=0, max_tokens=20))[0]
    stop_id = free.token_ids[5]
    first = free.token_ids.index(stop_id)
    out = llm.generate("def fibonacci(n):", SamplingParams(temperature=0, max_tokens=20,
                                                           stop_token_ids=[stop_id]))[0]
    assert out.token_ids == free.token_ids[:first + 1]
    assert out.finish_reason == "stop" and out.outputs[0].stop_reason == stop_id
    chat = llm.generate(CHAT, SamplingParams(temperature=0, max_tokens=50))[0]
    assert chat.finish_reason == "stop" and chat.token_ids[-1] == 2  # <|im_end|>
    assert "<|im_end|>" not in chat.text


def test_min_tokens_and_ignore_eos(llm: LLM) -> None:
    short = llm.generate(CHAT, SamplingParams(temperature=0, max_tokens=50))[0]
    n = len(short.token_ids)
    longer = llm.generate(CHAT, SamplingParams(temperature=0, max_tokens=50, min_tokens=n + 5))[0]
    assert len(longer.token_ids) >= n + 5 and 2 not in longer.token_ids[:n + 5]
    ignored = llm.generate(CHAT, SamplingParams(temperature=0, max_tokens=n + 8, ignore_eos=True))[0]
    assert len(ignored.token_ids) == n + 8 and ignored.finish_reason == "length"


def test_logprobs_of_chosen_and_top(llm: LLM) -> None:
    deltas = _stream(llm, "The capital of France is", SamplingParams(temperature=0, max_tokens=6, logprobs=3))
    entries = [lp for d in deltas for lp in (d.logprobs or [])]
    assert len(entries) == 6
    for lp in entries:
        assert len(lp.top) == 3 and lp.logprob <= 0.0
        assert lp.top[0][0] == lp.token_id  # greedy picks the most likely token
        assert lp.top[0][2] == pytest.approx(lp.logprob)
        assert lp.top[0][2] >= lp.top[1][2] >= lp.top[2][2]


def test_streamed_text_equals_decoded_tokens(llm: LLM) -> None:
    prompt = "Écris une phrase en français avec des accents et un emoji 🌊 :"
    deltas = _stream(llm, prompt, SamplingParams(temperature=0, max_tokens=60))
    ids = [t for d in deltas for t in d.token_ids]
    text = "".join(d.text for d in deltas)
    assert "\ufffd" not in text
    assert text == llm.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_abort_frees_blocks_and_spares_the_others(llm: LLM) -> None:
    engine = llm.engine
    engine.add_request("keep", "Count from one to ten:", SamplingParams(temperature=0, max_tokens=20))
    engine.add_request("drop", "Tell me a long story:", SamplingParams(temperature=0, max_tokens=200))
    for _ in range(3):
        engine.step()
    held = engine.block_manager.num_used
    delta = engine.abort_request("drop")
    assert delta is not None and delta.finished and delta.finish_reason == "abort"
    assert engine.block_manager.num_used < held
    engine.check_invariants()
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert outs[-1].request_id == "keep" and outs[-1].finish_reason == "length"
    assert engine.block_manager.num_used == 0
    alone = llm.generate("Count from one to ten:", SamplingParams(temperature=0, max_tokens=20))[0]
    assert sum(len(d.token_ids) for d in outs) + 3 == len(alone.token_ids)


def test_penalties_and_bias_follow_their_definitions() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    params = SamplingParams(temperature=0, repetition_penalty=2.0, presence_penalty=0.5,
                            frequency_penalty=0.25, logit_bias={2: 10.0}, logprobs=4)
    row = SamplingRow(params, prompt_ids=[0], output_ids=[3, 3], generator=None, blocked_ids=[])
    result = sample(logits, [row], "processed_logprobs")
    expected = torch.tensor([2.0 / 2.0, -1.0, 0.5 + 10.0, 3.0 / 2.0 - 0.5 - 0.25 * 2])
    assert result.token_ids == [2]
    top = dict((i, v) for i, v in result.logprobs[0][1])  # type: ignore[index]
    torch.testing.assert_close(torch.tensor([top[i] for i in range(4)]), torch.log_softmax(expected, 0))
    # By default (raw_logprobs, as vLLM V1) logprobs are the model's own, before any processing,
    # while the token is still chosen from the processed logits.
    raw = sample(logits, [row])
    assert raw.token_ids == [2]
    top = dict((i, v) for i, v in raw.logprobs[0][1])  # type: ignore[index]
    torch.testing.assert_close(torch.tensor([top[i] for i in range(4)]), torch.log_softmax(logits[0], 0))


def test_top_k_top_p_min_p_restrict_the_support() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    for params, allowed in [
        (SamplingParams(temperature=1.0, top_k=2), {0, 1}),
        (SamplingParams(temperature=1.0, top_p=0.7), {0, 1}),
        (SamplingParams(temperature=1.0, min_p=0.5), {0, 1}),
    ]:
        gen = torch.Generator().manual_seed(0)
        seen = {sample(logits, [SamplingRow(params, [], [], gen, [])]).token_ids[0] for _ in range(200)}
        assert seen == allowed, params
