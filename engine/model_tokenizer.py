"""A model's tokenizer without its engine, for a process that routes prompts by their tokens
but runs no model (the fleet's ingress): the same tokenizer the engine would load for that
model name, so the prompt's block hashes match the ones the replicas report."""

from __future__ import annotations

from engine.model.loader import load_tokenizer, resolve_model
from engine.tokenizer import Tokenizer


def tokenizer_for(model: str | None) -> Tokenizer:
    """`model` as `pagode serve --model` takes it (None: the default model)."""
    tokenizer: Tokenizer = load_tokenizer(resolve_model(model))
    return tokenizer
