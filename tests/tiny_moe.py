"""What a tiny MoE checkpoint adds to a GGUF, as llama.cpp's converter writes it: the experts
stacked into ffn_{gate,up,down}_exps [experts, out, in] and the expert_* metadata keys."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def stacked_expert_tensors(hf: str, tensor: torch.Tensor) -> list[tuple[str, np.ndarray]] | None:
    """(gguf-py mappable HF name, data) for transformers' in-memory stacked experts, else None.

    transformers 5 fuses gate and up as `mlp.experts.gate_up_proj` [E, 2I, H], gate rows
    first; llama.cpp keeps them apart (ffn_gate_exps, ffn_up_exps)."""
    if ".mlp.experts." not in hf or tensor.dim() != 3:
        return None
    prefix = hf.partition(".mlp.experts.")[0] + ".mlp.experts"
    data = tensor.float().numpy()
    if hf.endswith("gate_up_proj"):
        gate, up = np.split(data, 2, axis=1)
        return [(f"{prefix}.gate_proj", np.ascontiguousarray(gate)), (f"{prefix}.up_proj", np.ascontiguousarray(up))]
    return [(f"{prefix}.down_proj", np.ascontiguousarray(data))]


def write_moe_metadata(writer: Any, cfg: Any) -> None:
    """Mixtral has no moe_intermediate_size (its experts are intermediate_size wide), and
    llama.cpp's converter writes no expert_feed_forward_length for it."""
    if getattr(cfg, "num_experts", 0):
        writer.add_expert_count(cfg.num_experts)
        writer.add_expert_used_count(cfg.num_experts_per_tok)
        if getattr(cfg, "moe_intermediate_size", None):
            writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
