"""The OpenAI Responses API: POST /v1/responses, translated once into a chat request
(server/translate/responses_to_chat.py) and run by the chat pipeline, and the stored
responses (server/runtime/response_store.py): GET and DELETE /v1/responses/{id}, its
input_items, and cancel. Errors keep OpenAI's shape."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.api.body import openapi_body, parse_body
from server.api.errors import APIError, bad_request
from server.api.request_ids import echo_request_id, request_id_for
from server.api.responses_protocol import Item, ResponsesRequest
from server.respond.dialect_streaming import respond_in_dialect
from server.respond.responses_events import Keep, ResponsesDialect
from server.routes.chat_pipeline import start_chat
from server.runtime.response_store import ResponseStore
from server.runtime.running_responses import RunningResponses
from server.runtime.state import State
from server.translate.fields import log_unknown_fields
from server.translate.responses_to_chat import chat_from_responses, input_items

router = APIRouter()


def response_store(request: Request, state: State) -> ResponseStore:
    """The store, opened on first use, so that a server nobody asks for stored responses
    never creates the file."""
    store: ResponseStore | None = getattr(request.app.state, "response_store", None)
    if store is None:
        store = ResponseStore(state.settings.responses_store_path(),
                              state.settings.responses_store_max)
        request.app.state.response_store = store
    return store


def not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"No response with id '{response_id[:100]}' is stored.", param)


def history(store: ResponseStore, body: ResponsesRequest) -> list[Item]:
    if body.previous_response_id is None:
        return []
    found = store.conversation(body.previous_response_id)
    if found is None:
        raise not_found(body.previous_response_id, "previous_response_id")
    return found


def running_responses(request: Request) -> RunningResponses:
    running: RunningResponses | None = getattr(request.app.state, "running_responses", None)
    if running is None:
        running = request.app.state.running_responses = RunningResponses()
    return running


def keeper(store: ResponseStore, conversation: list[Item], wanted: bool,
           running: RunningResponses) -> Keep:
    """What a finished response goes to: the store (when the request asks it stored), then
    a cancel that may be waiting for it."""
    def keep(final: dict[str, Any]) -> None:
        if wanted:
            store.save(final, conversation + final["output"])
        running.finished(final["id"], final)
    return keep


@router.post("/v1/responses", openapi_extra=openapi_body(ResponsesRequest))
async def create_response(request: Request, state: State) -> Response:
    body = await parse_body(request, ResponsesRequest, state.settings)
    store = response_store(request, state)
    conversation = history(store, body) + input_items(body)
    chat = chat_from_responses(body, conversation)
    request_id, client_id = request_id_for(request, "resp")
    log_unknown_fields(request_id, body)  # Codex sends prompt_cache_key, client_metadata
    stream, builder = await start_chat(state, chat, request_id, clamp_max_tokens=True)
    tokenizer = state.engine_for(None).tokenizer
    response_id, running = f"resp_{uuid.uuid4().hex}", running_responses(request)
    running.add(response_id, stream)
    dialect = ResponsesDialect(
        response_id, body.model or state.served_model_name, body,
        lambda text: len(tokenizer.encode(text, add_special_tokens=False)),
        keeper(store, conversation, body.store, running))
    response = await respond_in_dialect(request, body.stream, stream, builder, dialect,
                                        state.settings.sse_send_timeout_s, state.responses)
    return echo_request_id(response, client_id)


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request, state: State) -> dict[str, Any]:
    found = response_store(request, state).response(response_id)
    if found is None:
        raise not_found(response_id)
    return found


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request, state: State) -> dict[str, Any]:
    if not response_store(request, state).delete(response_id):
        raise not_found(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(response_id: str, request: Request, state: State) -> dict[str, Any]:
    store = response_store(request, state)
    found, conversation = store.response(response_id), store.conversation(response_id)
    if found is None or conversation is None:
        raise not_found(response_id)
    items = conversation[:len(conversation) - len(found["output"])]
    return {"object": "list", "data": items, "has_more": False,
            "first_id": items[0].get("id") if items else None,
            "last_id": items[-1].get("id") if items else None}


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request, state: State) -> dict[str, Any]:
    """A running response (its id comes first in its stream, in response.created) stops:
    its engine requests are aborted and it ends as "cancelled", stored so when it is
    stored. One that has ended is a 400, as OpenAI answers for a finished response."""
    cancelled = await running_responses(request).cancel(response_id)
    if cancelled is not None:
        return cancelled
    stored = response_store(request, state).response(response_id)
    if stored is None:
        raise not_found(response_id)
    raise bad_request(f"Only a running response can be cancelled; this one is "
                      f"{stored['status']}.", "response_id")
