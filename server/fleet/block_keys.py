"""Routing keys of KV blocks: the engine's chained block hash (engine/core/block_manager.py),
cut to 64 bits. A replica reports the keys of the blocks its prefix cache holds; the
ingress computes the keys of a prompt's full blocks; the router counts how many leading
keys each replica holds. 64 bits keep the reports small; a collision only costs a worse
routing choice, never a wrong answer (the engine matches on its full hash and the tokens)."""

from __future__ import annotations

import json
import logging
from typing import Any

from engine.core.block_manager import chain_hash
from engine.tokenizer import Tokenizer

logger = logging.getLogger("pagode.fleet")

KEY_MASK = (1 << 64) - 1


def prompt_keys(token_ids: list[int], block_size: int) -> list[int]:
    """The keys of the prompt's full blocks that the engine could find cached: all but the
    last token, as BlockManager.match_prefix leaves that one to compute."""
    keys: list[int] = []
    parent: int | None = None
    for start in range(0, (len(token_ids) - 1) // block_size * block_size, block_size):
        parent = chain_hash(parent, tuple(token_ids[start:start + block_size]))
        keys.append(parent & KEY_MASK)
    return keys


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


def cached_keys(hash_to_block: dict[int, int]) -> list[int]:
    """The keys of the blocks a BlockManager's prefix cache holds, in use or idle. The dict
    is copied in one C call, which the engine's step thread cannot interleave with; if a
    copy still races a resize, the next report will do."""
    for _ in range(3):
        try:
            return [h & KEY_MASK for h in tuple(hash_to_block)]
        except RuntimeError:
            continue
    return []
