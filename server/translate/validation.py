"""The one validation layer at the HTTP boundary: everything a generation request asks is
checked here, with the engine's own limits (engine/io/request_limits.py), before any response
starts, so that a stream never begins with a 200 and then fails on a check.

- fields pagode does not implement (`suffix`, `best_of > 1`, ...) get a 400 naming the field;
  other unknown names are logged once per process, truncated;
- fan-out (prompts x n) is capped; prompts are checked for characters and vocabulary before
  tokenizing, and against the context after;
- sampling parameters are built once (engine.sampling_params, finite numbers, vLLM's ranges),
  with the request's constraints (grammar, priority, prompt logprobs), and expanded into
  choices with the engine's one seed rule.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.io.errors import InvalidRequestError
from engine.io.request_limits import (
    RequestLimits,
    check_fan_out,
    check_prompt,
    check_sampling,
    clip,
)
from engine.sampling_params import SamplingParams, expand_choices
from engine.structured_output import StructuredOutputSpec
from server.api.errors import APIError, bad_request, guess_param
from server.api.protocol import OpenAIModel, SamplingFields
from server.runtime.engine_client import EngineClient
from server.runtime.generation import SubRequest
from server.runtime.state import ServerState
from server.translate.prompts import PromptInput

logger = logging.getLogger("pagode.server")


def _set(value: Any) -> bool:
    return value not in (None, False, "", [], {})


# Undeclared fields whose meaning pagode does not implement, and when a value asks for it.
# A field that a later change declares on the request model stops being checked here.
UNSUPPORTED_FIELDS: dict[str, Callable[[Any], bool]] = {
    "suffix": _set,
    "use_beam_search": _set,
    "length_penalty": lambda v: v not in (None, 1, 1.0),
    "prompt_logprobs": lambda v: v is not None,
    "truncate_prompt_tokens": lambda v: v is not None,
    "tools": _set,
    "functions": _set,
    "tool_choice": lambda v: v not in (None, "none"),
    "function_call": lambda v: v not in (None, "none"),
    "response_format": lambda v: _set(v) and not (isinstance(v, dict) and v.get("type") == "text"),
    "guided_json": _set,
    "guided_regex": _set,
    "guided_choice": _set,
    "guided_grammar": _set,
    "structured_outputs": _set,
    "audio": _set,
    "modalities": lambda v: v not in (None, ["text"]),
    "prediction": _set,
}
MAX_LOGGED_NAMES = 1000
_logged_names: set[str] = set()


@dataclass(frozen=True)
class Constraints:
    """What a request asks of every choice beyond sampling."""

    structured_outputs: StructuredOutputSpec | None = None
    priority: int = 0
    prompt_logprobs: int | None = None


def check_model(state: ServerState, model: str | None) -> None:
    """Accept the served name (or the engine's own); anything else is a 404."""
    names = {state.served_model_name}
    if state.engine is not None:
        names.add(str(state.engine.model_name))
    if model is not None and model not in names:
        raise APIError(404, f"The model `{clip(model)}` does not exist.", "model")


def check_priority(engine: EngineClient, priority: int) -> None:
    if priority != 0 and engine.config.scheduling_policy != "priority":
        raise bad_request("priority is only honoured with --scheduling-policy priority; "
                          "leave it at 0", "priority")


def check_fields(request_id: str, body: SamplingFields) -> None:
    extra = body.model_extra or {}
    check_best_of(extra.get("best_of"), body.n)
    for name, asks_for_it in UNSUPPORTED_FIELDS.items():
        if name in extra and asks_for_it(extra[name]):
            raise bad_request(f"{name} is not supported by this server", name)
    log_unknown_fields(request_id, body)


def check_best_of(best_of: Any, n: int) -> None:
    if best_of is None:
        return
    if isinstance(best_of, bool) or not isinstance(best_of, int):
        raise bad_request(f"best_of must be an integer, got {clip(best_of)}", "best_of")
    if best_of < 1 or best_of < n:
        raise bad_request(f"best_of must be at least 1 and at least n ({n}), got {best_of}",
                          "best_of")
    if best_of > 1:
        raise bad_request("best_of > 1 is not supported by this server", "best_of")


def log_unknown_fields(request_id: str, body: OpenAIModel) -> None:
    """Each unknown name is logged once per process (names cut to 40 characters)."""
    names = [clip(name, 40) for name in body.unknown_fields()[:20]
             if name not in UNSUPPORTED_FIELDS and name != "best_of"]
    new = [name for name in names if name not in _logged_names]
    if new and len(_logged_names) < MAX_LOGGED_NAMES:
        _logged_names.update(new)
        logger.warning("request %s: ignoring unknown fields %s (logged once)", request_id, new)


def sampling_params(body: SamplingFields, max_tokens: int | None, logprobs: int | None,
                    constraints: Constraints, limits: RequestLimits) -> SamplingParams:
    try:
        params = SamplingParams(
            n=body.n, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
            min_p=body.min_p, seed=body.seed, max_tokens=max_tokens,
            min_tokens=body.min_tokens, stop=body.stop_list(),
            stop_token_ids=list(body.stop_token_ids or []), ignore_eos=body.ignore_eos,
            logprobs=logprobs, presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            repetition_penalty=body.repetition_penalty,
            logit_bias={int(k): v for k, v in (body.logit_bias or {}).items()},
            skip_special_tokens=body.skip_special_tokens,
            structured_outputs=constraints.structured_outputs, priority=constraints.priority,
            prompt_logprobs=constraints.prompt_logprobs)
        check_sampling(params, limits)
    except InvalidRequestError as exc:
        raise bad_request(str(exc), exc.param) from exc
    except ValueError as exc:
        raise bad_request(clip(str(exc), 300), guess_param(str(exc))) from exc
    return params


def checked_fan_out(num_prompts: int, n: int, limits: RequestLimits) -> None:
    try:
        check_fan_out(num_prompts, n, limits)
    except InvalidRequestError as exc:
        raise bad_request(str(exc), exc.param) from exc


def fan_out(request_id: str, prompts: list[PromptInput], body: SamplingFields,
            max_tokens: int | None, logprobs: int | None, constraints: Constraints,
            log_text: bool, limits: RequestLimits) -> list[SubRequest]:
    """One sub-request per choice: prompt p, sample i is choice p*n+i, id f"{rid}-{index}".
    The caller has checked the fan-out (checked_fan_out) before any tokenizing."""
    subs = []
    for p, prompt in enumerate(prompts):
        params = sampling_params(body, max_tokens, logprobs, constraints, limits)
        try:
            check_prompt(prompt.token_ids, params.max_tokens, limits)
        except InvalidRequestError as exc:
            raise APIError(400, str(exc), exc.param) from exc
        for i, choice in enumerate(expand_choices(params)):
            index = p * body.n + i
            subs.append(SubRequest(index, f"{request_id}-{index}", prompt.token_ids, choice,
                                   prompt.text if log_text else None))
    return subs
