"""transformers' bare forward pass on the same weights: the offline engine's yardstick.

`LLM.generate` on a saturating batch is held to at least 1.2x the tokens per second of
transformers' own model forward over 64 tokens per pass (one [1, 64] call, logits for
every position, no cache, no sampling): the rate a user gets by batching tokens through
transformers by hand, with none of an engine's scheduling.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

TOKENS_PER_PASS = 64


def load(model: str | None, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    """The transformers model for pagode's --model (a GGUF file or an HF folder; None: the default)."""
    from transformers import AutoModelForCausalLM

    from engine.model.loader import default_model_path

    path = Path(model) if model else default_model_path()
    if path.suffix == ".gguf":
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype).eval()
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()


def forward_rate(model: str | None, dtype: torch.dtype = torch.float32, reps: int = 10) -> float:
    """Tokens/s of one forward over TOKENS_PER_PASS tokens, best of `reps` after a warm-up."""
    hf = load(model, dtype)
    ids = torch.randint(1000, 9000, (1, TOKENS_PER_PASS), generator=torch.Generator().manual_seed(0))
    best = float("inf")
    with torch.inference_mode():
        for i in range(reps + 3):
            start = time.perf_counter()
            hf(ids)
            if i >= 3:
                best = min(best, time.perf_counter() - start)
    return TOKENS_PER_PASS / best
