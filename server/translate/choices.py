"""From a request's sampling fields and its tokenized prompts to one sub-request per choice.

Sampling parameters are built once per prompt (engine.sampling_params: finite numbers,
vLLM's ranges) with the request's constraints (grammar, priority, prompt logprobs), checked
against the engine's limits and the context, and expanded into choices with the engine's
one seed rule. Every check is the engine's own and raises its InvalidRequestError.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.request_limits import RequestLimits, check_prompt, check_sampling
from engine.sampling_params import SamplingParams, expand_choices
from engine.structured_output import StructuredOutputSpec
from engine.thinking_budget import ThinkingBudget
from server.api.protocol import SamplingFields
from server.translate.prompts import PromptInput


@dataclass(frozen=True)
class Constraints:
    """What a request asks of every choice beyond sampling."""

    structured_outputs: StructuredOutputSpec | None = None
    priority: int = 0
    prompt_logprobs: int | None = None
    thinking_budget: ThinkingBudget | None = None
    bad_words: list[list[int]] = field(default_factory=list)  # bad_words' token sequences


@dataclass
class SubRequest:
    """One choice of a request, ready for the engine (runtime/generation.py runs it)."""

    index: int  # the choice index in the response
    request_id: str  # the engine's: f"{request id}-{index}"
    prompt_ids: list[int]
    params: SamplingParams
    prompt_text: str  # for the request log, with --log-requests-text


def sampling_params(body: SamplingFields, max_tokens: int | None, logprobs: int | None,
                    constraints: Constraints, limits: RequestLimits) -> SamplingParams:
    params = SamplingParams(
        n=body.n, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
        min_p=body.min_p, seed=body.seed, max_tokens=max_tokens,
        min_tokens=body.min_tokens, stop=body.stop_list(),
        stop_token_ids=list(body.stop_token_ids or []), ignore_eos=body.ignore_eos,
        logprobs=logprobs, presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        logit_bias={int(k): v for k, v in (body.logit_bias or {}).items()},
        skip_special_tokens=body.skip_special_tokens, speculative=body.speculative,
        structured_outputs=constraints.structured_outputs, priority=constraints.priority,
        prompt_logprobs=constraints.prompt_logprobs,
        thinking_budget=constraints.thinking_budget,
        allowed_token_ids=body.allowed_token_ids, bad_words_token_ids=constraints.bad_words)
    check_sampling(params, limits)
    return params


def fan_out(request_id: str, prompts: list[PromptInput], body: SamplingFields,
            max_tokens: int | None, logprobs: int | None, constraints: Constraints,
            limits: RequestLimits) -> list[SubRequest]:
    """One sub-request per choice: prompt p, sample i is choice p*n+i, id f"{rid}-{index}".
    The fan-out itself (prompts x n) was checked before any tokenizing."""
    subs = []
    for p, prompt in enumerate(prompts):
        params = sampling_params(body, max_tokens, logprobs, constraints, limits)
        check_prompt(prompt.token_ids, params.max_tokens, limits)
        for i, choice in enumerate(expand_choices(params)):
            index = p * body.n + i
            subs.append(SubRequest(index, f"{request_id}-{index}", prompt.token_ids, choice,
                                   prompt.text))
    return subs
