"""Ollama's `POST /api/embed`, for the clients and RAG tools that speak only Ollama: its body,
and its error shape `{"error": "message"}` (the status carries the rest)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from server.api.pooling_protocol import Texts
from server.api.protocol import OpenAIModel, PositiveInt

OLLAMA_PREFIX = "/api/"


class OllamaEmbedRequest(OpenAIModel):
    model: str
    input: str | Texts
    truncate: bool = True  # Ollama's default: an input past the context is cut, not refused
    dimensions: PositiveInt | None = None
    options: dict[str, Any] | None = None  # runner options: nothing here to tune
    keep_alive: Any = Field(default=None)  # one model stays loaded for the server's life


def speaks_ollama(path: str) -> bool:
    return path.startswith(OLLAMA_PREFIX)


def ollama_error_body(message: str) -> dict[str, str]:
    return {"error": message}
