"""qwen3_moe, olmoe and mixtral end to end: greedy output equals transformers' from an HF
folder and from a GGUF with llama.cpp's stacked expert tensors (qwen3moe, olmoe, and llama
for Mixtral), under paged batching with a preemption; int8/int4 pass the quality gate of the
dense families; the fused C++ decode step refuses MoE.

Each tiny model routes among 8 experts, top 2, and the tests check that the engine really
sent tokens to many of them, so a router that always picked the same experts would fail.
"""

from __future__ import annotations

import copy as copy_module
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from test_family_quantization import ARGS, TEXT_TOKENS, assert_fused_step_reason, assert_passes_gate, read
from test_family_triton import greedy  # sets up Triton's interpreter where there is no CUDA
from tiny_models import (
    TinySpec,
    TinyZoo,
    assert_engine_matches,
    cached_greedy,
    one_torch_thread,
    prompts,
    save_tokenizer,
    tiny_spec,
)

from engine import LLM
from engine.model.moe import SparseMoeBlock
from engine.quant import formats
from engine.quant.modes import weight_kind
from engine.tuning import kernel_crossover

MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, head_dim=16, initializer_range=0.2)
# Renormalised top-k (Qwen3-30B-A3B's setting, and llama.cpp's qwen3moe), every layer sparse.
QWEN3_MOE = tiny_spec("qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", "qwen3moe", norm_topk_prob=True, **MOE)
# transformers' defaults otherwise: raw top-k weights, and a dense layer among the sparse ones.
QWEN3_MOE_MIXED = tiny_spec("qwen3_moe-mixed", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", norm_topk_prob=False,
                            num_hidden_layers=3, mlp_only_layers=[1], **MOE)

# OLMoE: experts as wide as intermediate_size, raw top-k weights, q/k norm over the projection.
OLMOE = tiny_spec("olmoe", "OlmoeConfig", "OlmoeForCausalLM", num_experts=8, num_experts_per_tok=2,
                  intermediate_size=64, norm_topk_prob=False, pad_token_id=0)
# llama.cpp's olmoe sizes both q and k norms n_embd, so its GGUF has as many KV heads as query heads.
OLMOE_GGUF = tiny_spec("olmoe-gguf", "OlmoeConfig", "OlmoeForCausalLM", "olmoe", num_experts=8,
                       num_experts_per_tok=2, intermediate_size=64, norm_topk_prob=False, pad_token_id=0,
                       num_key_value_heads=4)

# Mixtral: experts as wide as intermediate_size, top-k always renormalised, block_sparse_moe
# names in the checkpoint; its GGUF is arch llama with stacked expert tensors.
MIXTRAL = tiny_spec("mixtral", "MixtralConfig", "MixtralForCausalLM", "llama", num_local_experts=8,
                    num_experts_per_tok=2, intermediate_size=64, head_dim=16, sliding_window=None)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def moe_blocks(llm: LLM) -> list[SparseMoeBlock]:
    return [m for m in llm.engine.runner.model.modules() if isinstance(m, SparseMoeBlock)]


def assert_routing_spreads(llm: LLM, layers: int) -> None:
    blocks = moe_blocks(llm)
    assert len(blocks) == layers
    for block in blocks:
        assert sum(1 for n in block.tokens_routed if n) >= 4, f"routing hit too few experts: {block.tokens_routed}"


def test_folder_matches_transformers(tiny_zoo: TinyZoo) -> None:
    llm = assert_engine_matches(tiny_zoo.folder(QWEN3_MOE), tiny_zoo.reference(QWEN3_MOE))
    assert_routing_spreads(llm, 2)


def test_the_planner_counts_every_expert(tiny_zoo: TinyZoo) -> None:
    """Every expert is resident, so the memory plan counts them all (and the dense layer's MLP)."""
    from engine.model.loader import read_config, resolve_model
    from planner.memory import count_parameters

    for spec in (QWEN3_MOE, QWEN3_MOE_MIXED, OLMOE, MIXTRAL):
        cfg = read_config(resolve_model(str(tiny_zoo.folder(spec))))
        assert count_parameters(cfg) == sum(p.numel() for p in tiny_zoo.reference(spec).parameters())


def test_mixed_layers_without_renormalisation_match_transformers(tiny_zoo: TinyZoo) -> None:
    llm = assert_engine_matches(tiny_zoo.folder(QWEN3_MOE_MIXED), tiny_zoo.reference(QWEN3_MOE_MIXED))
    assert_routing_spreads(llm, 2)  # layer 1 is dense (mlp_only_layers)
    assert not isinstance(llm.engine.runner.model.layers[1].mlp, SparseMoeBlock)


def test_olmoe_folder_matches_transformers(tiny_zoo: TinyZoo) -> None:
    llm = assert_engine_matches(tiny_zoo.folder(OLMOE), tiny_zoo.reference(OLMOE))
    assert_routing_spreads(llm, 2)


def test_olmoe_gguf_matches_transformers(tiny_zoo: TinyZoo) -> None:
    path, reference = tiny_zoo.gguf(OLMOE_GGUF, "Q8_0")
    llm = assert_engine_matches(path, reference)
    assert llm.engine.runner.model.config.qk_norm == "proj"
    assert_routing_spreads(llm, 2)


def test_gguf_matches_transformers(tiny_zoo: TinyZoo) -> None:
    from engine.model.gguf_file import GGUFModel

    path, reference = tiny_zoo.gguf(QWEN3_MOE, "Q8_0")
    names = GGUFModel(path).tensor_names
    assert {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight",
            "blk.0.ffn_gate_inp.weight"} <= names
    llm = assert_engine_matches(path, reference)
    assert_routing_spreads(llm, 2)


def test_mixtral_folder_and_gguf_match_transformers(tiny_zoo: TinyZoo) -> None:
    """From the folder save_pretrained writes (block_sparse_moe.experts.{e}.w1/w2/w3) and from a
    Q8_0 llama-arch GGUF with ffn_*_exps tensors, which the engine serves as a Mixtral."""
    from safetensors import safe_open

    from engine.model.gguf_file import GGUFModel

    folder = tiny_zoo.folder(MIXTRAL)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        assert {"model.layers.0.block_sparse_moe.gate.weight",
                "model.layers.0.block_sparse_moe.experts.7.w3.weight"} <= set(f.keys())
    assert_routing_spreads(assert_engine_matches(folder, tiny_zoo.reference(MIXTRAL)), 2)
    path, reference = tiny_zoo.gguf(MIXTRAL, "Q8_0")
    gguf = GGUFModel(path)
    assert gguf.arch == "llama" and "blk.1.ffn_up_exps.weight" in gguf.tensor_names
    llm = assert_engine_matches(path, reference)
    assert llm.engine.runner.model.config.architecture == "mixtral"
    assert_routing_spreads(llm, 2)


def dequantized_moe_folder(tiny_zoo: TinyZoo, spec: TinySpec, mode: str) -> Path:
    """The checkpoint with every projection and every expert rounded through `mode`'s blocks;
    the router stays exact, as the engine keeps it."""
    path = tiny_zoo.root / f"{spec.name}-{spec.key}-dequantized-{mode}"
    if (path / "config.json").exists():
        return path
    reference = tiny_zoo.reference(spec)
    copy = type(reference)(copy_module.deepcopy(reference.config))
    state = {}
    for name, tensor in reference.state_dict().items():
        tensor = tensor.clone()
        if tensor.dim() >= 2 and "embed_tokens" not in name and not name.endswith("mlp.gate.weight"):
            kind = weight_kind(mode, is_lm_head=name == "lm_head.weight")
            slices = tensor.reshape(-1, *tensor.shape[-2:]).float()  # one matrix per expert
            tensor = torch.stack([formats.dequantize(formats.quantize(m, kind)) for m in slices]).reshape(tensor.shape)
        state[name] = tensor
    copy.load_state_dict(state)
    copy.save_pretrained(path)
    save_tokenizer(path)
    return path


@pytest.mark.parametrize("spec", [QWEN3_MOE, MIXTRAL], ids=lambda s: s.name)
def test_quantized_moe_passes_the_quality_gate(tiny_zoo: TinyZoo, spec: TinySpec,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.quant.linear import QuantLinear

    monkeypatch.setattr(kernel_crossover, "_cache", {})
    monkeypatch.setenv("PAGODE_QUANT_CROSSOVER", "16")  # keep both kernels in every layer
    folder, reference = tiny_zoo.folder(spec), tiny_zoo.reference(spec)
    prompt = prompts(1, seed=1)[0]
    ids = prompt + cached_greedy(reference, prompt, TEXT_TOKENS)
    for mode in ("int8", "int4"):
        rounded = read(LLM(model=str(dequantized_moe_folder(tiny_zoo, spec, mode)), quantization="none", **ARGS),
                       ids)
        llm = LLM(model=str(folder), quantization=mode, **ARGS)  # type: ignore[arg-type]
        for block in moe_blocks(llm):
            assert all(isinstance(e.gate_up_proj, QuantLinear) and e.gate_up_proj.blocks is not None
                       for e in block.experts)
            assert not isinstance(block.gate, QuantLinear)
        assert_passes_gate(llm, ids, rounded, f"{spec.name} {mode}", mode)
        assert_fused_step_reason(llm, "mixture-of-experts")


def test_triton_backend_matches_cpu_backend(tiny_zoo: TinyZoo) -> None:
    """The MoE block is plain torch whatever the attention backend; the Triton backend (under
    its interpreter without CUDA) gives the CPU backend's tokens."""
    import cuda_kernels

    if not cuda_kernels.triton_available():
        pytest.skip("triton missing")
    folder = str(tiny_zoo.folder(QWEN3_MOE))
    assert greedy(folder, "triton") == greedy(folder, "cpu")
