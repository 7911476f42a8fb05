"""Which LoRA adapter a request runs on: the body's `model`, when it names an adapter of a
loaded model rather than a model (vLLM's rule).

The name is read once, for every endpoint that takes a `model`, by the one reader of the body
(server/runtime/model_router.py). Admission resolves the same name to the adapter's base
model (ServedModel.answers_to), and answers OpenAI's 404 for a name that is neither.
"""

from __future__ import annotations

from server.runtime.model_registry import ModelRegistry


def adapter_named(registry: ModelRegistry, name: str | None) -> str | None:
    """`name` if it is an adapter of a loaded model and no model's own name."""
    if name is None or any(m.name == name for m in registry.models):
        return None
    for model in registry.loaded():
        if model.engine is not None and name in model.engine.lora_adapters():
            return name
    return None
