"""The request fields that no model declares, and the fields that ask what this server does
not do.

Unknown fields are kept on the request models (extra="allow"), so that clients written for
other servers still work. Those whose meaning pagode does not implement (`suffix`,
`best_of > 1`, ...) get a 400 naming the field; any other unknown name is logged once per
process, cut short.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from engine.request_limits import clip
from server.api.errors import bad_request
from server.api.protocol import OpenAIModel, SamplingFields

logger = logging.getLogger("pagode.server")


def _set(value: Any) -> bool:
    return value not in (None, False, "", [], {})


# vLLM's sampling extensions. Chat and completions declare bad_words and allowed_token_ids
# and run them; the rest, which pagode's sampler does not run, they refuse (accepting them
# would print what they rule out anyway). The agents' APIs refuse them all, as their
# translations carry no sampling extension (a client written for vLLM may send them there).
VLLM_EXTENSIONS = ("bad_words", "allowed_token_ids", "include_stop_str_in_output",
                   "logits_processors", "return_tokens_as_token_ids")

# Undeclared fields whose meaning pagode does not implement, and when a value asks for it.
# Only undeclared fields reach this check: `tools` and `tool_choice` are declared by chat
# alone, `prompt_logprobs` by completions alone, so each is refused on the other endpoint.
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
    "audio": _set,
    "modalities": lambda v: v not in (None, ["text"]),
    "prediction": _set,
    **{name: _set for name in VLLM_EXTENSIONS},
    "echo": _set,  # chat's (vLLM: the last message repeated); completions declare their own
    "web_search_options": _set,
}
MAX_LOGGED_NAMES = 1000
_logged_names: set[str] = set()


def check_fields(request_id: str, body: SamplingFields) -> None:
    extra = body.model_extra or {}
    check_best_of(extra.get("best_of"), body.n)
    for name, asks_for_it in UNSUPPORTED_FIELDS.items():
        if name in extra and asks_for_it(extra[name]):
            raise bad_request(f"{name} is not supported by this server", name)
    log_unknown_fields(request_id, body)


def refuse_vllm_extensions(body: OpenAIModel) -> None:
    extra = body.model_extra or {}
    for name in VLLM_EXTENSIONS:
        if _set(extra.get(name)):
            raise bad_request(f"{name} is not supported by this server", name)


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


def check_priority(priority: int, scheduling_policy: str) -> None:
    if priority != 0 and scheduling_policy != "priority":
        raise bad_request("priority is only honoured with --scheduling-policy priority; "
                          "leave it at 0", "priority")
