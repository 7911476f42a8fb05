"""The sparse mixture-of-experts block (Qwen3-MoE, and the families that route the same way).

A router picks each token's top-k experts; only those experts run, and each active expert
runs once per step over all the tokens routed to it (tokens are grouped by expert), so its
weights are read once per step however many tokens chose it. Each expert is a plain
gate-up/down MLP of nn.Linear layers, so `--quantization int8/int4` turns every expert into
block-quantized QuantLinears on the CPU block kernels like any other projection. The router
stays a bare weight, not an nn.Linear, so quantization never moves a token to another expert.

The arithmetic follows transformers' Qwen3MoeSparseMoeBlock: router logits in the model's
dtype, softmax in fp32 over all experts, top-k, renormalised iff `norm_topk_prob`, cast back,
and each token's expert outputs summed in increasing expert order.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.layers import SiluAndMul


class Router(nn.Module):
    """The gate's weight [experts, hidden]; named `gate` so the checkpoint's mlp.gate.weight lands here."""

    def __init__(self, hidden_size: int, num_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class Expert(nn.Module):
    """One expert's SwiGLU MLP, with gate and up fused as in the dense MLP."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class SparseMoeBlock(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 norm_topk_prob: bool) -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok {top_k} must be in [1, num_experts={num_experts}]")
        self.gate = Router(hidden_size, num_experts)
        self.experts = nn.ModuleList(Expert(hidden_size, intermediate_size) for _ in range(num_experts))
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        # Tokens each expert computed since load: shows that routing spreads (tests, benchmarks).
        self.tokens_routed = [0] * num_experts

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] in x's dtype, expert ids [T, k]) in transformers' dtype order."""
        logits = self.gate(x)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(logits.dtype), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = self.route(x)
        order = torch.argsort(experts.reshape(-1), stable=True)
        outs = torch.empty(order.numel(), x.shape[-1], dtype=x.dtype, device=x.device)
        for expert, start, stop in self.runs(experts.reshape(-1)[order]):
            slots = order[start:stop]
            y = self.experts[expert](x[slots // self.top_k])
            outs[start:stop] = y * weights.reshape(-1)[slots].unsqueeze(1)
        return self.sum_slots(outs, order, experts)

    def runs(self, sorted_experts: torch.Tensor) -> Iterator[tuple[int, int, int]]:
        """(expert, start, stop) of each expert's run of (token, slot) pairs sorted by expert.

        One stable sort puts every expert's tokens in one contiguous run, so each expert is a
        single GEMM over all of them and its weights are read once per step."""
        counts = torch.bincount(sorted_experts, minlength=len(self.experts)).tolist()
        start = 0
        for expert, count in enumerate(counts):
            if count:
                self.tokens_routed[expert] += count
                yield expert, start, start + count
                start += count

    def sum_slots(self, outs: torch.Tensor, order: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """Each token's k expert outputs summed in increasing expert order, as transformers'
        index_add_ over experts does (fp32 addition is not associative beyond two terms).
        Gathering beats index_add_, whose scattered writes cost more than the GEMMs here."""
        tokens, k = experts.shape
        by_slot = torch.empty_like(outs)
        by_slot[order] = outs
        by_slot = by_slot.view(tokens, k, -1)
        rank = experts.argsort(dim=-1, stable=True)
        ordered = by_slot.gather(1, rank.unsqueeze(-1).expand(-1, -1, by_slot.shape[-1]))
        total = ordered[:, 0]
        for j in range(1, k):
            total = total + ordered[:, j]
        return total


def split_stacked_experts(weights: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Per-expert HF names for expert tensors stored stacked along a first expert axis.

    transformers 5 keeps experts in memory as `mlp.experts.gate_up_proj` [E, 2I, H] (gate rows
    first) and `mlp.experts.down_proj` [E, H, I], and a checkpoint may hold them so; llama.cpp
    stacks `ffn_{gate,up,down}_exps` [E, out, in]. Both become `mlp.experts.{e}.{proj}.weight`,
    the names save_pretrained writes per expert, which the loader already knows."""
    for name, tensor in weights:
        if ".mlp.experts." not in name or tensor.dim() != 3:
            yield name, tensor
            continue
        prefix, _, leaf = name.partition(".mlp.experts.")
        proj = leaf.removesuffix(".weight")
        for e in range(tensor.shape[0]):
            if proj == "gate_up_proj":
                gate, up = tensor[e].chunk(2, dim=0)
                yield f"{prefix}.mlp.experts.{e}.gate_proj.weight", gate
                yield f"{prefix}.mlp.experts.{e}.up_proj.weight", up
            else:
                yield f"{prefix}.mlp.experts.{e}.{proj}.weight", tensor[e]


# Mixtral's checkpoint names -> the shared block's (w1 is the gate, w3 the up projection).
MIXTRAL_NAMES = {".block_sparse_moe.": ".mlp.", ".w1.": ".gate_proj.", ".w3.": ".up_proj.", ".w2.": ".down_proj."}


def mixtral_names(weights: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Mixtral's `block_sparse_moe.gate` and `block_sparse_moe.experts.{e}.w1/w2/w3` under the
    names every other MoE checkpoint uses, so one block and one loader serve them all."""
    for name, tensor in weights:
        if ".block_sparse_moe." in name:
            for old, new in MIXTRAL_NAMES.items():
                name = name.replace(old, new)
        yield name, tensor
