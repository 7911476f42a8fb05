"""The FastAPI application: routes, error handlers, middleware, and the engine's lifetime
(loaded in the background so that /health answers 503 until it is ready)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.routing import APIRoute
from sse_starlette.sse import AppStatus

from engine.config import EngineConfig
from server.api.body import install_openapi
from server.api.errors import install_error_handlers
from server.api.messages_protocol import CountTokensRequest, MessagesRequest
from server.api.ollama_protocol import OllamaEmbedRequest
from server.api.pooling_protocol import EmbeddingRequest, RerankRequest, ScoreRequest
from server.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from server.api.responses_protocol import ResponsesRequest
from server.middleware.auth import APIKeyMiddleware
from server.middleware.content_type import JSONContentTypeMiddleware
from server.middleware.cors import install_cors
from server.middleware.http_limits import HeaderLimitMiddleware
from server.middleware.response_metrics import ResponseCountMiddleware
from server.routes import (
    chat,
    completions,
    embeddings,
    health,
    lora_adapters,
    messages,
    metrics,
    model_admin,
    models,
    ollama_embed,
    prefix_cache,
    rerank,
    responses,
    score,
    stats,
    tokenize,
)
from server.runtime.engine_client import EngineClient
from server.runtime.model_registry import LoadLimits
from server.runtime.model_router import ModelRouter
from server.runtime.served_model import ModelSpec
from server.runtime.state import ServerState
from server.settings import ServerSettings
from server.translate.user_text import plain_text_encoder
from server.ui import pages

logger = logging.getLogger("pagode.server")

ROUTE_MODULES = (completions, chat, messages, responses, embeddings, rerank, score, tokenize, models, health,
                 metrics, stats, ollama_embed, prefix_cache, model_admin, lora_adapters)

# sse-starlette would cancel every stream on SIGTERM; our drain ends them instead.
AppStatus.disable_automatic_graceful_drain()


def prepare_serving(engine: EngineClient, settings: ServerSettings) -> None:
    """Put `--chat-template` in place of the model's, then build, while the engine loads,
    what the first chat request would otherwise wait for: the tokenizer's plain-text copy
    (server/translate/user_text.py)."""
    if settings.chat_template_text is not None:
        engine.tokenizer.chat_template = settings.chat_template_text
    plain_text_encoder(engine.tokenizer)


def spec_serves_adapters(spec: ModelSpec) -> bool:
    config = spec.config if spec.config is not None else (spec.engine.config if spec.engine is not None else None)
    return config is not None and config.enable_lora


def create_app(settings: ServerSettings, engine: EngineClient | None = None,
               engine_config: EngineConfig | None = None, models: list[ModelSpec] | None = None,
               limits: LoadLimits | None = None) -> FastAPI:
    """Serve `engine` (started here if it is not running), or build one from `engine_config`
    once the server is up (with settings.engine_factory; AsyncEngine by default); or serve
    several `models`, the first loaded at start and the others when a request names them."""
    state = ServerState(settings, engine, engine_config,
                        prepare=lambda loaded: prepare_serving(loaded, settings), models=models, limits=limits)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.create_task(state.load_engine(), name="load-engine")
        loading.add_done_callback(lambda task: None if task.cancelled() else task.exception())
        try:
            yield
        finally:
            loading.cancel()
            await state.close()

    app = FastAPI(title="pagode", summary="OpenAI-compatible LLM server", lifespan=lifespan)
    app.state.server = state
    install_error_handlers(app, state.responses.count)
    for module in ROUTE_MODULES:
        app.include_router(module.router)
    root = health.root_without_page if settings.no_ui else pages.router
    app.include_router(root)
    # The routes that name each endpoint in the per-endpoint metrics
    state.responses.routes = [route for router in (*(m.router for m in ROUTE_MODULES), root)
                              for route in router.routes]
    install_openapi(app, [CompletionRequest, ChatCompletionRequest, MessagesRequest,
                          CountTokensRequest, ResponsesRequest, TokenizeRequest, DetokenizeRequest,
                          EmbeddingRequest, RerankRequest, ScoreRequest, OllamaEmbedRequest])
    post_paths = {route.path for module in ROUTE_MODULES for route in module.router.routes
                  if isinstance(route, APIRoute) and "POST" in (route.methods or set())}
    serves_adapters = any(spec_serves_adapters(model.spec) for model in state.registry.models)
    if state.registry.several or serves_adapters:  # innermost: the body's model, read once when the request is let in
        app.add_middleware(ModelRouter, registry=state.registry, max_body_bytes=settings.max_body_bytes,
                           body_timeout_s=settings.body_timeout_s, pin_models=state.registry.several,
                           route_adapters=serves_adapters)
    app.add_middleware(JSONContentTypeMiddleware, paths=post_paths)  # 415 unless the body is JSON
    if settings.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=settings.api_key)
    # Added last, so outermost: oversized headers are refused and every response counted.
    app.add_middleware(HeaderLimitMiddleware, max_header_bytes=settings.max_header_bytes)
    app.add_middleware(ResponseCountMiddleware, count=state.responses.count)
    install_cors(app, settings.cors)  # outermost: preflights skip the API key and limits
    return app
