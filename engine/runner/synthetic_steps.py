"""Synthetic decode steps on the engine's own runner, for the load-time measurements.

Why: the batch cap and the speculative step cost (engine/tuning/) time whole decode steps
of this model on this cache; this is the one object through which they run them
(engine/tuning/steps.py says what they ask). Each step is `batch` decodes, each at the last
of `context` positions in a run of cache blocks of its own (decode_step.synthetic_decodes).
What the steps write is overwritten before any request reads it, as the fused-step race's is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import fields, replace

import torch

from engine.attention.metadata import AttentionMetadata
from engine.config import dtype_name
from engine.model.decode_step import synthetic_decodes
from engine.runner.kv_cache import touch_blocks
from engine.runner.model_runner import ModelRunner, StepInputs


class RunnerSteps:
    """engine/tuning/steps.py's SyntheticSteps over a ModelRunner."""

    def __init__(self, runner: ModelRunner, model_name: str) -> None:
        self.runner = runner
        self.device_type = runner.device.type
        self.block_size = runner.block_size
        self.num_blocks = runner.num_blocks
        self.fused_limit = runner.decode_step.max_tokens if runner.decode_step is not None else 0
        self.rates_key = ":".join((model_name, runner.quantization, dtype_name(runner.dtype),
                                   dtype_name(runner.kv_dtype), runner.backend.name))
        shape = hashlib.sha256(repr(runner.model_config).encode()).hexdigest()[:16]
        self.cost_key = ":".join(map(str, (shape, runner.quantization, runner.dtype, runner.kv_dtype,
                                           runner.backend.name, runner.block_size)))

    def fill(self, blocks: int) -> None:
        touch_blocks(self.runner.kv_caches, blocks)

    def forward(self, batch: int, context: int) -> Callable[[], object]:
        """runner.forward on `batch` decodes: the fused step where it applies, the logits."""
        runner = self.runner
        ids, positions, meta = synthetic_decodes(batch, runner.block_size, runner.model_config.vocab_size,
                                                 context, runner.num_blocks)
        inputs = StepInputs(ids, positions, meta, list(range(batch)), list(range(batch + 1)))
        return lambda: runner.forward(inputs)

    def logits(self, batch: int, context: int, fused: bool) -> Callable[[], object]:
        runner = self.runner
        ids, positions, meta = synthetic_decodes(batch, runner.block_size, runner.model_config.vocab_size,
                                                 context, runner.num_blocks)
        ids, positions, meta = ids.to(runner.device), positions.to(runner.device), on_device(meta, runner.device)

        def run() -> object:
            if fused and runner.decode_step is not None:
                hidden = runner.decode_step(ids, positions, meta)
            else:
                hidden = runner.model(ids, positions, meta, runner.kv_caches)
            return runner.model.compute_logits(hidden)

        return run


def on_device(meta: AttentionMetadata, device: torch.device) -> AttentionMetadata:
    """The synthetic step's metadata on the model's device (its host lists stay)."""
    if device.type == "cpu":
        return meta
    moved = {f.name: getattr(meta, f.name).to(device) for f in fields(meta)
             if isinstance(getattr(meta, f.name), torch.Tensor)}
    return replace(meta, **moved)
