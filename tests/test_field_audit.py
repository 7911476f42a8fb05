"""Every field of the four generation endpoints' request models works or is refused by name.

Accepted but ignored is a defect: a client that asks for something and silently does not get
it is worse off than one told no. So each declared field of CompletionRequest,
ChatCompletionRequest, ResponsesRequest and MessagesRequest is listed here, with the test
that proves it works (the test must exist and send the field), or with a value that asks for
what pagode does not do, which must get a 400 naming the field in its API's error shape. A
field added to a model without a line here fails the first test; so does one of the nested
settings objects listed (stream options, thinking, reasoning, text, Anthropic's tool choice).
HINTS are the few fields that by their API's own definition change no output (an end user's
id) or hint at the vendor's own models (text.verbosity, reasoning.summary), each with why it
is taken rather than refused. The undeclared names pagode refuses (vLLM's sampling
extensions that its sampler does not run) are refused on every endpoint.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from server_fixtures import json_error

from server.api.messages_protocol import AnthropicToolChoice, MessagesRequest, ThinkingConfig
from server.api.protocol import ChatCompletionRequest, CompletionRequest, StreamOptions
from server.api.responses_protocol import ReasoningConfig, ResponsesRequest, TextConfig
from server.translate.fields import UNSUPPORTED_FIELDS, VLLM_EXTENSIONS

TESTS = Path(__file__).parent
MODEL = "SmolLM2-135M-Instruct"
CHAT = [{"role": "user", "content": "Write a short poem about the sea."}]
AUDIT = "test_field_audit.py::"
SAMPLING = "test_sampling_and_stopping.py::"

# The fields completions and chat share (SamplingFields and StructuredFields).
SHARED = {
    "model": "test_server_errors.py::test_bad_request",
    "n": "test_server.py::test_n_choices_and_seed",
    "temperature": SAMPLING + "test_top_k_top_p_min_p_restrict_the_support",
    "top_p": SAMPLING + "test_top_k_top_p_min_p_restrict_the_support",
    "top_k": SAMPLING + "test_top_k_top_p_min_p_restrict_the_support",
    "min_p": SAMPLING + "test_top_k_top_p_min_p_restrict_the_support",
    "seed": SAMPLING + "test_seeded_sampling_is_reproducible_whatever_the_batch",
    "stop": "test_server.py::test_stop_string_sets_stop_reason",
    "stop_token_ids": SAMPLING + "test_stop_token_ids_and_eos",
    "stream": "test_server.py::test_completion_stream_matches_non_stream",
    "stream_options": "test_server_surface.py::test_cached_tokens_and_continuous_usage",
    "presence_penalty": SAMPLING + "test_penalties_and_bias_follow_their_definitions",
    "frequency_penalty": SAMPLING + "test_penalties_and_bias_follow_their_definitions",
    "repetition_penalty": SAMPLING + "test_penalties_and_bias_follow_their_definitions",
    "logit_bias": SAMPLING + "test_penalties_and_bias_follow_their_definitions",
    "ignore_eos": SAMPLING + "test_min_tokens_and_ignore_eos",
    "min_tokens": SAMPLING + "test_min_tokens_and_ignore_eos",
    "skip_special_tokens": SAMPLING + "test_streamed_text_equals_decoded_tokens",
    "speculative": "test_spec_switch.py::test_only_plain_greedy_requests_draft",
    "allowed_token_ids": "test_token_restrictions.py::test_only_the_allowed_tokens_are_written",
    "bad_words": "test_token_restrictions.py::test_a_bad_word_is_never_written",
    "response_format": "test_server_constraints.py::test_precedence_of_the_constraint_fields",
    "structured_outputs": "test_server_constraints.py::test_grammar_output_is_in_its_language",
    "guided_json": "test_server_constraints.py::test_guided_aliases_constrain_chat",
    "guided_regex": "test_server_constraints.py::test_guided_aliases_constrain_chat",
    "guided_choice": "test_server_surface.py::test_completions_regex_choice_and_guided_alias",
    "guided_grammar": "test_server_constraints.py::test_grammar_output_is_in_its_language",
    "priority": "test_server_lifecycle.py::test_priority_policy_serves_a_later_urgent_request_first",
}
WORKS: dict[type[BaseModel], dict[str, str]] = {
    CompletionRequest: {
        **SHARED,
        "prompt": "test_server.py::test_batch_of_prompts_and_token_prompts",
        "echo": "test_prompt_logprobs.py::test_echo_logprobs_for_loglikelihood",
        "max_tokens": "test_server.py::test_completion_stream_matches_non_stream",
        "logprobs": "test_server.py::test_completion_logprobs",
        "prompt_logprobs": "test_prompt_logprobs.py::test_prompt_logprobs_match_transformers",
    },
    ChatCompletionRequest: {
        **SHARED,
        "messages": "test_server.py::test_chat_stream_and_non_stream",
        "tools": "test_server_constraints.py::test_tool_choice_auto_parses_calls",
        "tool_choice": "test_server_constraints.py::test_forced_calls",
        "parallel_tool_calls": "test_server_constraints.py::test_forced_calls",
        "max_tokens": "test_server.py::test_chat_default_max_tokens_fills_context",
        "max_completion_tokens": "test_server.py::test_chat_logprobs",
        "logprobs": "test_server.py::test_chat_logprobs",
        "top_logprobs": "test_server.py::test_chat_logprobs",
        "add_generation_prompt": "test_loading.py::test_default_model_chat_template_and_eos",
        "continue_final_message": "test_loading.py::test_default_model_chat_template_and_eos",
        "chat_template_kwargs": "test_server_chat_formats.py::test_template_kwargs_change_the_prompt",
        "reasoning_effort": "test_reasoning_parsers.py::test_chat_grammar_starts_after_the_reasoning",
        "thinking_token_budget": "test_thinking_budget.py::test_chat_takes_vllms_thinking_token_budget",
    },
    ResponsesRequest: {
        "model": "test_responses_api.py::test_whole_response_is_stored_retrieved_and_deleted",
        "input": "test_responses_api.py::test_whole_response_is_stored_retrieved_and_deleted",
        "instructions": "test_responses_api.py::test_whole_response_is_stored_retrieved_and_deleted",
        "max_output_tokens": "test_responses_api.py::test_whole_response_is_stored_retrieved_and_deleted",
        "temperature": "test_responses_api.py::test_whole_response_is_stored_retrieved_and_deleted",
        "top_p": "test_responses_api.py::test_whole_response_is_stored_retrieved_and_deleted",
        "metadata": "test_responses_api.py::test_whole_response_is_stored_retrieved_and_deleted",
        "tools": "test_responses_api.py::test_function_call_round_trip",
        "tool_choice": "test_responses_api.py::test_function_call_round_trip",
        "previous_response_id": "test_responses_api.py::test_function_call_round_trip",
        "parallel_tool_calls": "test_responses_api.py::test_streamed_function_call_arguments",
        "text": "test_responses_api.py::test_json_object_format",
        "store": "test_responses_api.py::test_the_streamed_event_sequence",
        "stream": "test_responses_api.py::test_the_streamed_event_sequence",
        "reasoning": "test_agent_api_families.py::test_responses_items",
        "structured_outputs": "test_agent_api_families.py::test_responses_items",
        "seed": AUDIT + "test_the_agents_apis_take_a_seed",
        "include": AUDIT + "test_fields_that_change_no_output_are_taken",
        "truncation": AUDIT + "test_fields_that_change_no_output_are_taken",
        "background": AUDIT + "test_fields_that_change_no_output_are_taken",
    },
    MessagesRequest: {
        "model": "test_messages_api.py::test_whole_message_with_a_system_prompt",
        "system": "test_messages_api.py::test_whole_message_with_a_system_prompt",
        "messages": "test_messages_api.py::test_whole_message_with_a_system_prompt",
        "max_tokens": "test_messages_api.py::test_whole_message_with_a_system_prompt",
        "temperature": "test_messages_api.py::test_whole_message_with_a_system_prompt",
        "tools": "test_messages_api.py::test_tool_use_round_trip",
        "tool_choice": "test_messages_api.py::test_tool_use_round_trip",
        "stop_sequences": "test_messages_api.py::test_a_stop_sequence_is_reported",
        "stream": "test_messages_api.py::test_the_event_sequence_on_the_wire",
        "thinking": "test_thinking_budget.py::test_streamed_thinking_keeps_the_budget",
        "structured_outputs": "test_agent_api_families.py::test_messages_blocks",
        "top_k": AUDIT + "test_messages_top_k_and_top_p_narrow_the_sampling",
        "top_p": AUDIT + "test_messages_top_k_and_top_p_narrow_the_sampling",
        "seed": AUDIT + "test_the_agents_apis_take_a_seed",
    },
    StreamOptions: {
        "include_usage": "test_server.py::test_completion_stream_matches_non_stream",
        "continuous_usage_stats": "test_server_surface.py::test_cached_tokens_and_continuous_usage",
    },
    ThinkingConfig: {
        "type": "test_thinking_budget.py::test_streamed_thinking_keeps_the_budget",
        "budget_tokens": "test_thinking_budget.py::test_streamed_thinking_keeps_the_budget",
    },
    ReasoningConfig: {"effort": "test_agent_api_families.py::test_responses_items"},
    TextConfig: {"format": "test_responses_api.py::test_json_object_format"},
    AnthropicToolChoice: {
        "type": "test_messages_api.py::test_tool_use_round_trip",
        "name": "test_messages_api.py::test_tool_use_round_trip",
        "disable_parallel_tool_use":
            "test_messages_api.py::test_streamed_tool_use_arrives_as_input_json",
    },
}
# Fields that ask nothing of a server's output by their API's own definition, or hints to
# the vendor's own models that a local model has no switch for: taken as vLLM takes them
# (Codex and the SDKs send them on every request), each with why, and sent by the test below.
HINTS: dict[type[BaseModel], dict[str, str]] = {
    CompletionRequest: {"user": "an end user's id, for the provider's abuse monitoring"},
    ChatCompletionRequest: {"user": "an end user's id, for the provider's abuse monitoring"},
    ResponsesRequest: {"user": "an end user's id, echoed in the response"},
    MessagesRequest: {"metadata": "user_id, an end user's id, for the provider's abuse monitoring"},
    ReasoningConfig: {"summary": "a summary of the reasoning; the reasoning item carries it whole",
                      "generate_summary": "summary's older name"},
    TextConfig: {"verbosity": "a length hint to OpenAI's models; max_output_tokens bounds it here"},
}
ENDPOINTS = {CompletionRequest: "/v1/completions", ChatCompletionRequest: "/v1/chat/completions",
             ResponsesRequest: "/v1/responses", MessagesRequest: "/v1/messages"}
BASE: dict[type[BaseModel], dict[str, Any]] = {
    CompletionRequest: {"prompt": "Hi", "max_tokens": 2},
    ChatCompletionRequest: {"messages": CHAT, "max_tokens": 2},
    ResponsesRequest: {"input": "Hi", "max_output_tokens": 2, "store": False},
    MessagesRequest: {"model": MODEL, "max_tokens": 2, "messages": CHAT},
}
# A value of a declared field that asks for what pagode does not do: 400, naming the field.
REFUSED: dict[type[BaseModel], dict[str, Any]] = {
    CompletionRequest: {"guided_whitespace_pattern": r"[\n ]*"},
    ChatCompletionRequest: {"guided_whitespace_pattern": r"[\n ]*"},
    ResponsesRequest: {"background": True, "truncation": "auto",
                       "include": ["file_search_call.results"]},
    MessagesRequest: {},
}


def field_names(model: type[BaseModel]) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


@cache
def sources_of_tests(file: str) -> dict[str, str]:
    """Each test function of `file` (a module of tests/), by name, with what it sends: its
    own source and the module's other code (the bodies its helpers build, the cases it is
    parametrized with), not the other tests'."""
    source = (TESTS / file).read_text(encoding="utf-8")
    nodes = ast.parse(source).body
    tests = {node.name: "\n".join(ast.get_source_segment(source, part) or ""
                                   for part in (*node.decorator_list, node))
             for node in nodes if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
             and node.name.startswith("test")}
    shared = "\n".join(ast.get_source_segment(source, node) or "" for node in nodes
                       if getattr(node, "name", "") not in tests)
    return {name: own + "\n" + shared for name, own in tests.items()}


@pytest.mark.parametrize("model", list(WORKS), ids=lambda m: m.__name__)
def test_every_declared_field_is_listed(model: type[BaseModel]) -> None:
    listed = set(WORKS[model]) | set(REFUSED.get(model, {})) | set(HINTS.get(model, {}))
    assert field_names(model) - listed == set(), "a field that works or is refused: say which"
    assert listed - field_names(model) == set(), "a listed field the model no longer has"


@pytest.mark.parametrize("model", list(WORKS), ids=lambda m: m.__name__)
def test_each_working_field_names_a_test_that_sends_it(model: type[BaseModel]) -> None:
    hints = {field: AUDIT + "test_fields_that_change_no_output_are_taken"
             for field in HINTS.get(model, {})}
    for field, where in {**WORKS[model], **hints}.items():
        file, _, name = where.partition("::")
        source = sources_of_tests(file).get(name)
        assert source is not None, f"{model.__name__}.{field}: no test {where}"
        sent = re.search(rf"[\"']{field}[\"']|\b{field}=", source)
        assert sent, f"{model.__name__}.{field}: {where} does not send it"


def assert_refused(model: type[BaseModel], response: httpx.Response, field: str) -> None:
    assert response.status_code == 400, (field, response.text[:300])
    if model is MessagesRequest:
        body = response.json()
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert field in body["error"]["message"], body
    else:
        assert json_error(response)["param"] == field, response.text[:300]


@pytest.mark.slow
@pytest.mark.parametrize("model", list(REFUSED), ids=lambda m: m.__name__)
async def test_each_refused_value_is_a_400_naming_its_field(http: httpx.AsyncClient,
                                                            model: type[BaseModel]) -> None:
    for field, value in REFUSED[model].items():
        response = await http.post(ENDPOINTS[model], json={**BASE[model], field: value})
        assert_refused(model, response, field)


@pytest.mark.slow
@pytest.mark.parametrize("model", list(ENDPOINTS), ids=lambda m: m.__name__)
async def test_vllms_extensions_are_refused_on_every_endpoint(http: httpx.AsyncClient,
                                                              model: type[BaseModel]) -> None:
    """Undeclared: the chat and completions refuse all of UNSUPPORTED_FIELDS, the agents'
    APIs vLLM's sampling extensions (the rest are the agents' APIs' own fields there)."""
    names = UNSUPPORTED_FIELDS if model in (CompletionRequest, ChatCompletionRequest) \
        else VLLM_EXTENSIONS
    for name in names:
        if name in field_names(model):
            continue  # declared here: audited above
        value: Any = "x" if name in ("suffix", "function_call") else ["x"]
        if name == "tool_choice":
            value = "required"
        elif name in ("use_beam_search", "echo", "include_stop_str_in_output",
                      "return_tokens_as_token_ids"):
            value = True
        elif name in ("length_penalty", "prompt_logprobs", "truncate_prompt_tokens"):
            value = 2
        elif name in ("audio", "prediction", "web_search_options"):
            value = {"x": 1}
        elif name == "allowed_token_ids":
            value = [5]
        response = await http.post(ENDPOINTS[model], json={**BASE[model], name: value})
        assert_refused(model, response, name)


@pytest.mark.slow
async def test_fields_that_change_no_output_are_taken(http: httpx.AsyncClient) -> None:
    """HINTS, and the Responses API's settings that ask for what this server does anyway
    (no truncation, no background, no encrypted reasoning to include): taken as their APIs
    take them, echoed where the API echoes them."""
    for path, body in [
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "user": "u-1"}),
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "user": "u-1"}),
        ("/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": CHAT,
                          "metadata": {"user_id": "u-1"}}),
    ]:
        assert (await http.post(path, json=body)).status_code == 200, path
    response = await http.post("/v1/responses", json={
        "input": "Hi", "max_output_tokens": 2, "user": "u-1", "background": False,
        "truncation": "disabled", "include": ["reasoning.encrypted_content"], "store": False,
        "reasoning": {"summary": "auto", "generate_summary": "auto"},
        "text": {"verbosity": "low"}})
    assert response.status_code == 200, response.text
    echoed = response.json()
    assert echoed["user"] == "u-1" and echoed["truncation"] == "disabled"
    assert echoed["background"] is False


async def texts(http: httpx.AsyncClient, path: str, bodies: list[dict[str, Any]]) -> list[str]:
    """Each body's text, computed alike: one after the other, after a first call that caches
    the shared prompt's full blocks. Sent together, one request may be prefilled whole and the
    others from its cached blocks, in steps of other sizes that run other kernels (the block
    kernel on a few tokens, a bf16 GEMM on more), and a greedy first token at a near tie can
    then differ between them; what these tests compare is sampling, not that."""
    await http.post(path, json=bodies[0])
    answers = [await http.post(path, json=body) for body in bodies]
    assert all(a.status_code == 200 for a in answers), [a.text[:200] for a in answers]
    if path == "/v1/messages":
        return ["".join(b.get("text", "") for b in a.json()["content"]) for a in answers]
    return ["".join(part["text"] for item in a.json()["output"] if item["type"] == "message"
                    for part in item["content"]) for a in answers]


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
async def test_the_agents_apis_take_a_seed(http: httpx.AsyncClient, path: str) -> None:
    """Sampled at temperature 1: one seed twice gives one text, other seeds others."""
    base = ({"model": MODEL, "max_tokens": 12, "messages": CHAT} if path == "/v1/messages"
            else {"input": CHAT[0]["content"], "max_output_tokens": 12, "store": False})
    bodies = [{**base, "temperature": 1.0, "seed": seed} for seed in (7, 7, 8, 9, 10)]
    first, again, *others = await texts(http, path, bodies)
    assert first == again
    assert any(other != first for other in others)


@pytest.mark.slow
async def test_messages_top_k_and_top_p_narrow_the_sampling(http: httpx.AsyncClient) -> None:
    """At temperature 1.5, top_k 1 or a tiny top_p leaves only the greedy token; without
    them the same seed wanders off the greedy text."""
    base = {"model": MODEL, "max_tokens": 12, "messages": CHAT, "seed": 3}
    greedy, top_k, top_p, free = await texts(http, "/v1/messages", [
        {**base, "temperature": 0}, {**base, "temperature": 1.5, "top_k": 1},
        {**base, "temperature": 1.5, "top_p": 1e-6}, {**base, "temperature": 1.5}])
    assert top_k == greedy and top_p == greedy
    assert free != greedy
