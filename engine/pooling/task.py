"""Which runner a checkpoint gets: generate (the LLM engine), embed or score (the pooling
engine). `--task auto` reads the checkpoint; a named task overrides it, as vLLM's
`--runner pooling --convert embed` turns a causal LM into an embedder."""

from __future__ import annotations

from engine.config import EngineConfig
from engine.model.loader import resolve_model
from engine.pooling.checkpoint import detect_task
from engine.pooling.gguf_spec import gguf_task

TASKS = ("auto", "generate", "embed", "score")


def resolve_task(config: EngineConfig) -> str:
    task = getattr(config, "task", "auto")
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
    if task != "auto":
        return task
    source = resolve_model(config.model)
    return gguf_task(source.path) if source.is_gguf else detect_task(source.path)
