"""The sparse MoE block alone against transformers' Qwen3MoeSparseMoeBlock on the same weights:
routing (softmax top-k, with and without renormalisation) and the grouped expert GEMMs."""

from __future__ import annotations

import pytest
import torch

from engine.model.moe import SparseMoeBlock, split_stacked_experts

HIDDEN, INTER, EXPERTS, TOP_K = 64, 32, 8, 2


def reference_block(norm_topk_prob: bool) -> torch.nn.Module:
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=INTER, num_experts=EXPERTS,
                         num_experts_per_tok=TOP_K, norm_topk_prob=norm_topk_prob)
    torch.manual_seed(0)
    block = Qwen3MoeSparseMoeBlock(cfg).eval()
    with torch.no_grad():  # the router starts at zero, which would route every token alike
        for param in block.parameters():
            param.normal_(0.0, 0.3)
    return block


def engine_block(ref: torch.nn.Module, norm_topk_prob: bool) -> SparseMoeBlock:
    """Ours, loaded through the same per-expert splitting the checkpoint loader uses."""
    block = SparseMoeBlock(HIDDEN, INTER, EXPERTS, TOP_K, norm_topk_prob)
    params = dict(block.named_parameters())
    stacked = [(f"x.mlp.experts.{n}", t) for n, t in ref.experts.state_dict().items()]
    with torch.no_grad():
        params["gate.weight"].copy_(ref.gate.weight)
        for name, tensor in split_stacked_experts(iter(stacked)):
            e, proj = name.split(".")[3:5]
            fused = params[f"experts.{e}.gate_up_proj.weight"]
            if proj == "gate_proj":
                fused[:INTER].copy_(tensor)
            elif proj == "up_proj":
                fused[INTER:].copy_(tensor)
            else:
                params[f"experts.{e}.down_proj.weight"].copy_(tensor)
    return block.eval()


@pytest.mark.parametrize("norm_topk_prob", [True, False])
@pytest.mark.parametrize("tokens", [1, 5, 97])
def test_block_equals_transformers(norm_topk_prob: bool, tokens: int) -> None:
    ref = reference_block(norm_topk_prob)
    ours = engine_block(ref, norm_topk_prob)
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(tokens))
    with torch.no_grad():
        expected = ref(x.unsqueeze(0)).squeeze(0)
        got = ours(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    hit = sum(1 for n in ours.tokens_routed if n)
    assert sum(ours.tokens_routed) == tokens * TOP_K
    if tokens >= 5:
        assert hit >= 4, f"routing should spread over experts, got {ours.tokens_routed}"


def test_renormalisation_changes_the_output() -> None:
    """The two routing rules differ, so the test above would see one applied for the other."""
    ref = reference_block(True)
    x = torch.randn(7, HIDDEN, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert not torch.allclose(engine_block(ref, True)(x), engine_block(ref, False)(x), atol=1e-3)


def test_top_k_beyond_experts_is_refused() -> None:
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        SparseMoeBlock(HIDDEN, INTER, 4, 5, True)


def test_olmoe_with_clip_qkv_is_refused_at_config() -> None:
    """transformers clamps q, k and v after OLMoE's norms; pagode has no clamp, so it says so."""
    from engine.model.hf_config import config_from_hf

    cfg = dict(model_type="olmoe", vocab_size=203, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_experts=8, num_experts_per_tok=2, clip_qkv=8.0)
    with pytest.raises(ValueError, match="clip_qkv=8.0 is not served"):
        config_from_hf(cfg)
    assert config_from_hf({**cfg, "clip_qkv": None}).num_experts == 8
