"""Counting tokens with the server's own `/tokenize`, in vLLM's or llama-server's dialect.

loadgen has no tokenizer of its own (it must not depend on the model), so exact prompt
lengths come from the server. When the server has no /tokenize, counts are estimates.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

log = logging.getLogger("loadgen")

# English prose averages about 1.3 BPE tokens per word in GPT-2-like vocabularies.
TOKENS_PER_WORD = 1.3


def estimate_tokens(text: str) -> int:
    return max(1, round(len(text.split()) * TOKENS_PER_WORD))


class RemoteTokenizer:
    """count(text) through POST {base_url}/tokenize; None once the server has proved it has none."""

    def __init__(self, http: httpx.AsyncClient, base_url: str, model: str | None) -> None:
        self.http = http
        self.url = base_url.rstrip("/") + "/tokenize"
        self.model = model
        self.available: bool | None = None  # unknown until the first call
        self._dialect: str | None = None

    async def count(self, text: str) -> int | None:
        if self.available is False:
            return None
        dialects = [self._dialect] if self._dialect else ["vllm", "llama"]
        for dialect in dialects:
            n = await self._try(dialect, text)
            if n is not None:
                self._dialect = dialect
                self.available = True
                return n
        if self.available is None:
            self.available = False
        return None

    async def _try(self, dialect: str, text: str) -> int | None:
        body: dict[str, Any]
        if dialect == "vllm":
            body = {"prompt": text, **({"model": self.model} if self.model else {})}
        else:
            body = {"content": text}
        try:
            resp = await self.http.post(self.url, json=body, timeout=30.0)
        except httpx.HTTPError as exc:
            log.debug("tokenize failed: %s", exc)
            return None
        if resp.status_code != 200:
            return None
        try:
            data = resp.json()
        except ValueError:
            return None
        n = parse_count(data)
        # llama-server answers the vLLM body (no "content") with 200 and no tokens: a count of
        # zero for non-blank text means the dialect is wrong, not that the text is empty.
        return None if n == 0 and text.strip() else n


def parse_count(data: Any) -> int | None:
    """Token count from a /tokenize answer: {"count": n} or {"tokens": [...]}."""
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("count"), int):
        return int(data["count"])
    tokens = data.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None
