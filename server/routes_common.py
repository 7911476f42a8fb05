"""What the completions and chat routes share: the checks every generation request goes
through, in the order clients expect (503, 404, 400, then 429), and the fan-out."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from fastapi import Request
from fastapi.responses import Response

from engine.sampling_params import SamplingParams
from server.builders import ResponseBuilder
from server.errors import APIError, bad_request, guess_param
from server.generation import SubRequest
from server.prompts import PromptInput, check_context
from server.protocol import OpenAIModel, SamplingFields
from server.state import ServerState
from server.streaming import full_response, stream_response

logger = logging.getLogger("pagode.server")


def get_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.server
    return state


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def check_model(state: ServerState, model: str | None) -> None:
    """Accept the served name (or the engine's own); anything else is a 404."""
    names = {state.served_model_name}
    if state.engine is not None:
        names.add(str(state.engine.model_name))
    if model is not None and model not in names:
        raise APIError(404, f"The model `{model}` does not exist.", "model")


def log_unknown_fields(request_id: str, body: OpenAIModel) -> None:
    unknown = body.unknown_fields()
    if unknown:
        logger.warning("request %s: ignoring unknown fields %s", request_id, unknown)


def sampling_params(body: SamplingFields, max_tokens: int, logprobs: int | None,
                    seed: int | None) -> SamplingParams:
    try:
        return SamplingParams(
            n=1, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
            min_p=body.min_p, seed=seed, max_tokens=max_tokens, min_tokens=body.min_tokens,
            stop=body.stop_list(), stop_token_ids=list(body.stop_token_ids or []),
            ignore_eos=body.ignore_eos, logprobs=logprobs,
            presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
            repetition_penalty=body.repetition_penalty,
            logit_bias={int(k): v for k, v in (body.logit_bias or {}).items()},
            skip_special_tokens=body.skip_special_tokens)
    except ValueError as exc:
        raise bad_request(str(exc), guess_param(str(exc))) from exc


def fan_out(request_id: str, prompts: list[PromptInput], body: SamplingFields,
            max_tokens_for: Callable[[PromptInput], int], logprobs: int | None,
            log_text: bool, max_model_len: int) -> list[SubRequest]:
    """One sub-request per choice: prompt p, sample i is choice p*n+i, id f"{rid}-{index}".
    With a seed, sample i uses seed+i so that the n choices differ but stay reproducible."""
    subs = []
    for p, prompt in enumerate(prompts):
        max_tokens = max_tokens_for(prompt)
        check_context(len(prompt.token_ids), max_tokens, max_model_len)
        for i in range(body.n):
            # torch generators take seeds in [0, 2**64); any integer maps there stably.
            seed = None if body.seed is None else (body.seed + i) % 2**63
            index = p * body.n + i
            subs.append(SubRequest(index, f"{request_id}-{index}", prompt.token_ids,
                                   sampling_params(body, max_tokens, logprobs, seed),
                                   prompt.text if log_text else None))
    return subs


async def respond(state: ServerState, request: Request, body: SamplingFields,
                  subs: list[SubRequest], builder: ResponseBuilder) -> Response:
    stream = state.start_generation(subs)
    builder.continuous_usage = bool(body.stream_options and body.stream_options.continuous_usage_stats)
    if body.stream:
        return stream_response(state, stream, builder, body.include_usage())
    return await full_response(state, request, stream, builder)
