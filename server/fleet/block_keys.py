"""Routing keys of KV blocks: the engine's chained block hash (engine/prefix_hashes.py),
cut to 64 bits. A replica reports the keys of the blocks its prefix cache holds; the
ingress computes the keys of a prompt's full blocks; the router counts how many leading
keys each replica holds. 64 bits keep the reports small; a collision only costs a worse
routing choice, never a wrong answer (the engine matches on its full hash and the tokens)."""

from __future__ import annotations

import json
import logging
from typing import Any

from engine.prefix_hashes import prompt_block_hashes
from engine.tokenizer import Tokenizer

logger = logging.getLogger("pagode.fleet")

KEY_MASK = (1 << 64) - 1


def prompt_keys(token_ids: list[int], block_size: int) -> list[int]:
    """The keys of the prompt's full blocks that the engine could find cached."""
    return [h & KEY_MASK for h in prompt_block_hashes(token_ids, block_size)]


def request_token_ids(tokenizer: Tokenizer, path: str, body: bytes) -> list[int]:
    """The prompt's token ids as the server would build them, closely enough to route: the
    chat template's text for chat, the prompt for completions; [] for anything else or a
    body the server itself will refuse (it answers that with a 4xx)."""
    try:
        payload = json.loads(body) if body else None
        if not isinstance(payload, dict):
            return []
        if path.endswith("/chat/completions"):
            return chat_token_ids(tokenizer, payload.get("messages"))
        if path.endswith("/completions"):
            return completion_token_ids(tokenizer, payload.get("prompt"))
    except Exception as exc:  # any odd body: route it anywhere, the replica judges it
        logger.debug("no routing key for %s: %s", path, exc)
    return []


def chat_token_ids(tokenizer: Tokenizer, messages: Any) -> list[int]:
    if not isinstance(messages, list) or not messages:
        return []
    dicts = [{"role": m.get("role"), "content": text_of(m.get("content"))} for m in messages]
    text = tokenizer.apply_chat_template(dicts, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(str(text), add_special_tokens=False)


def text_of(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def completion_token_ids(tokenizer: Tokenizer, prompt: Any) -> list[int]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch: its first prompt stands for it
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, add_special_tokens=True)
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    return []


def cached_keys(block_hashes: list[int]) -> list[int]:
    """The keys of the blocks an engine reports its prefix cache holds."""
    return [h & KEY_MASK for h in block_hashes]
