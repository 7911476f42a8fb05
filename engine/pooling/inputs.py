"""What a pooling request becomes before the model: token ids (and BERT's token types) per
input, built with the checkpoint's tokenizer exactly as sentence-transformers builds them
(prompt text in front of the input, the pair encoding for cross-encoders)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.pooling.checkpoint import (
    QWEN3_RERANK_INSTRUCTION,
    QWEN3_RERANK_PREFIX,
    QWEN3_RERANK_SUFFIX,
    PoolingSpec,
)


@dataclass(frozen=True)
class PoolingInput:
    token_ids: list[int]
    token_types: list[int] | None = None  # None: all zeros

    def __len__(self) -> int:
        return len(self.token_ids)


def encode_text(tokenizer: Any, text: str, truncate: int | None) -> PoolingInput:
    """One text with the tokenizer's special tokens; `truncate` keeps at most that many
    tokens, specials included (the tokenizer cuts the text, not its [CLS]/[SEP])."""
    kwargs: dict[str, Any] = {"truncation": True, "max_length": truncate} if truncate else {}
    encoded = tokenizer(text, **kwargs)
    return PoolingInput(list(encoded["input_ids"]), _types(encoded))


def encode_texts(tokenizer: Any, texts: list[str], truncate: int | None) -> list[PoolingInput]:
    """Many texts as encode_text makes each, in one call of the tokenizer: a fast tokenizer
    encodes a list in one pass of its own code, without a Python round trip per text."""
    if not texts:
        return []
    kwargs: dict[str, Any] = {"truncation": True, "max_length": truncate} if truncate else {}
    encoded = tokenizer(texts, **kwargs)
    types = encoded.get("token_type_ids")
    return [PoolingInput(list(ids), None if types is None or not any(types[i]) else list(types[i]))
            for i, ids in enumerate(encoded["input_ids"])]


def encode_pair(tokenizer: Any, spec: PoolingSpec, query: str, document: str, truncate: int | None,
                instruction: str | None = None) -> PoolingInput:
    """A (query, document) pair as the scorer reads it: the tokenizer's pair encoding for a
    cross-encoder, Qwen3-Reranker's judging prompt for a yes/no reranker."""
    kwargs: dict[str, Any] = {"truncation": True, "max_length": truncate} if truncate else {}
    if spec.yes_no_tokens is None:
        encoded = tokenizer(query, document, **kwargs)
        return PoolingInput(list(encoded["input_ids"]), _types(encoded))
    text = reranker_prompt(query, document, instruction)
    return PoolingInput(list(tokenizer(text, add_special_tokens=False, **kwargs)["input_ids"]))


def reranker_prompt(query: str, document: str, instruction: str | None = None) -> str:
    return (f"{QWEN3_RERANK_PREFIX}<Instruct>: {instruction or QWEN3_RERANK_INSTRUCTION}\n<Query>: {query}\n"
            f"<Document>: {document}{QWEN3_RERANK_SUFFIX}")


def _types(encoded: Any) -> list[int] | None:
    types = encoded.get("token_type_ids")
    return list(types) if types is not None and any(types) else None
