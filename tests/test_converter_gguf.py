"""GGUFs as users download them load in every family, and give transformers' greedy tokens.

Each file is written by llama.cpp's own convert_hf_to_gguf.py (its Q8_0, or F32 then
llama-quantize), from a tiny random model of the family (tests/converter_files.py). These
files carry what a hand-written GGUF may not: `rope_freqs.weight` (Llama 3.x), the
converter's key set, llama-quantize's per-tensor mix (Q4_K_M: Q4_K, Q6_K, and Q5_0/Q8_0
fallbacks where rows are not a multiple of 256). The reference is transformers on the
weights gguf-py reads back from the same file.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from converter_files import SMOLLM_VOCAB, SPM_VOCAB, convert, file_reference, quantize
from test_moe_family import MOE
from tiny_models import TinySpec, TinyZoo, assert_engine_matches, one_torch_thread, tiny_spec

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 5000.0, "factor": 4.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
V = {"vocab_size": SMOLLM_VOCAB}
WINDOW = 24

# One spec per family, each with the features its converter writes keys or tensors for.
FAMILIES = [
    tiny_spec("cv-llama3", "LlamaConfig", "LlamaForCausalLM", "llama", rope_parameters=LLAMA3_ROPE, **V),
    tiny_spec("cv-mistral", "MistralConfig", "MistralForCausalLM", "llama", sliding_window=None, **V),
    tiny_spec("cv-qwen2", "Qwen2Config", "Qwen2ForCausalLM", "qwen2", vocab_size=SPM_VOCAB, pad_token_id=0,
              bos_token_id=2, eos_token_id=1),
    tiny_spec("cv-qwen3", "Qwen3Config", "Qwen3ForCausalLM", "qwen3", head_dim=32, **V),
    tiny_spec("cv-phi3", "Phi3Config", "Phi3ForCausalLM", "phi3", pad_token_id=0, **V),
    tiny_spec("cv-granite", "GraniteConfig", "GraniteForCausalLM", "granite", embedding_multiplier=3.0,
              residual_multiplier=0.5, attention_multiplier=0.4, logits_scaling=2.5, **V),
    tiny_spec("cv-olmo2", "Olmo2Config", "Olmo2ForCausalLM", "olmo2", **V),
    tiny_spec("cv-smollm3", "SmolLM3Config", "SmolLM3ForCausalLM", "smollm3", num_hidden_layers=4,
              pad_token_id=0, **V),
    tiny_spec("cv-qwen3moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", "qwen3moe", norm_topk_prob=True,
              **MOE, **V),
    tiny_spec("cv-olmoe", "OlmoeConfig", "OlmoeForCausalLM", "olmoe", num_experts=8, num_experts_per_tok=2,
              intermediate_size=64, norm_topk_prob=False, pad_token_id=0, num_key_value_heads=4, **V),
    tiny_spec("cv-mixtral", "MixtralConfig", "MixtralForCausalLM", "llama", num_local_experts=8,
              num_experts_per_tok=2, intermediate_size=64, head_dim=16, sliding_window=None, **V),
    # llama.cpp's graphs fix what gemma files do not say: gemma2's even layers slide, gemma3's
    # every 6th layer is global (all 4 here slide) with a local RoPE base of 10000.
    tiny_spec("cv-gemma2", "Gemma2Config", "Gemma2ForCausalLM", "gemma2", num_hidden_layers=4, head_dim=16,
              query_pre_attn_scalar=16, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"] * 2,
              attn_logit_softcapping=2.0, final_logit_softcapping=3.0, vocab_size=SPM_VOCAB, pad_token_id=0,
              bos_token_id=2, eos_token_id=1),
    tiny_spec("cv-gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", "gemma3", num_hidden_layers=4, head_dim=16,
              query_pre_attn_scalar=16, sliding_window=WINDOW, layer_types=["sliding_attention"] * 4,
              rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}, **V),
]
# K-quants need rows that are multiples of 256.
WIDE = dict(hidden_size=256, intermediate_size=512, initializer_range=0.05, **V)
LLAMA3_256 = tiny_spec("cv-llama3-256", "LlamaConfig", "LlamaForCausalLM", "llama", rope_parameters=LLAMA3_ROPE,
                       **WIDE)
QWEN3_256 = tiny_spec("cv-qwen3-256", "Qwen3Config", "Qwen3ForCausalLM", "qwen3", head_dim=64, **WIDE)
LLAMA_QUANTS = ("Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K")
# The file's own blocks against fp32 on the same weights: only the activations' rounding
# differs. Perplexity within 0.5%; a random model over 49,152 tokens has near-tied top
# logits at many positions, which that rounding flips, hence 90% top-1 agreement.
FILE_GATE = (0.005, 0.90)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def kinds(path: Path) -> Counter[str]:
    from engine.model.gguf_file import GGUFModel

    return Counter(t.tensor_type.name for t in GGUFModel(path).reader.tensors if len(t.shape) >= 2)


@pytest.mark.parametrize("spec", FAMILIES, ids=lambda s: s.name)
def test_converter_q8_0_matches_transformers(tiny_zoo: TinyZoo, spec: TinySpec) -> None:
    path = convert(tiny_zoo, spec, "q8_0")
    assert "Q8_0" in kinds(path)
    assert_engine_matches(path, file_reference(tiny_zoo, spec, path), **cache_args(spec))


def cache_args(spec: TinySpec) -> dict[str, int]:
    """Gemma 3's layers all slide here, so blocks leave the window and free themselves: no
    cache small enough to force a preemption runs every prompt."""
    return {"kv_cache_memory": 64 << 20} if spec.gguf_arch == "gemma3" else {}


def test_llama3_file_carries_rope_freqs_and_they_are_used(tiny_zoo: TinyZoo) -> None:
    """The converter writes Llama 3's RoPE factors as the tensor rope_freqs.weight; a model
    that ignored them would differ from transformers past the original context (64)."""
    from engine.model.gguf_file import GGUFModel
    from engine.model.loader import ModelSource, read_config

    path = convert(tiny_zoo, FAMILIES[0], "q8_0")
    assert "rope_freqs.weight" in GGUFModel(path).tensor_names
    cfg = read_config(ModelSource(path, path.name))
    assert cfg.rope_scaling is not None and cfg.rope_scaling["rope_type"] == "freq_factors"
    assert max(cfg.rope_scaling["factors"]) == 4.0


@pytest.mark.parametrize("quant", LLAMA_QUANTS)
def test_llama_quantize_files_match_transformers(tiny_zoo: TinyZoo, quant: str) -> None:
    path = quantize(tiny_zoo, LLAMA3_256, quant)
    found = kinds(path)
    expected = {"Q4_0": {"Q4_0"}, "Q4_K_M": {"Q4_K", "Q6_K"}, "Q5_K_M": {"Q5_K", "Q6_K"}, "Q6_K": {"Q6_K"}}[quant]
    assert expected <= set(found), found
    assert_engine_matches(path, file_reference(tiny_zoo, LLAMA3_256, path))


@pytest.mark.parametrize("spec", [QWEN3_256, FAMILIES[12]], ids=lambda s: s.name)
def test_q4_k_m_of_other_families_matches_transformers(tiny_zoo: TinyZoo, spec: TinySpec) -> None:
    """Qwen3 at K-quant widths; Gemma 3 at 64 wide, where llama-quantize falls back to Q5_0/Q8_0."""
    path = quantize(tiny_zoo, spec, "Q4_K_M")
    assert_engine_matches(path, file_reference(tiny_zoo, spec, path), **cache_args(spec))


@pytest.mark.parametrize("quant", ["Q4_K_M", "Q5_K_M", "Q6_K", "Q4_0", "Q8_0"])
def test_auto_computes_on_the_files_own_blocks(tiny_zoo: TinyZoo, quant: str, monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """`auto` on a quantized GGUF requantizes nothing: every projection holds the file's blocks
    in the file's formats (a fused layer whose shards differ keeps them as parts), the fused
    decode step runs on them, and the gate holds against fp32 on the very same weights (only
    the activations' 15-bit rounding differs: FILE_GATE)."""
    from test_family_quantization import ARGS, TEXT_TOKENS, read
    from tiny_models import cached_greedy, prompts

    from engine import LLM
    from engine.model.gguf_file import GGUFModel, hf_name
    from engine.quant.apply import SHARDS
    from engine.quant.linear import QuantLinear
    from engine.tuning import kernel_crossover

    monkeypatch.setattr(kernel_crossover, "_cache", {})
    path = convert(tiny_zoo, LLAMA3_256, "q8_0") if quant == "Q8_0" else quantize(tiny_zoo, LLAMA3_256, quant)
    gguf = GGUFModel(path)
    file_kind = {hf_name(t.name, gguf.family): t.tensor_type.name.lower().replace("q4_0", "q4_1")
                 for t in gguf.reader.tensors if len(t.shape) == 2}
    reference = file_reference(tiny_zoo, LLAMA3_256, path)
    prompt = prompts(1, seed=1)[0]
    ids = prompt + cached_greedy(reference, prompt, TEXT_TOKENS)
    fp32 = read(LLM(model=str(path), quantization="none", **ARGS), ids)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="pagode"):
        llm = LLM(model=str(path), quantization="auto", **ARGS)  # type: ignore[arg-type]
    assert "requantized" not in caplog.text
    assert "decode steps of up to" in caplog.text  # the fused step, on the file's blocks
    model = llm.engine.runner.model
    mixed = 0
    for name, layer in model.named_modules():
        if not isinstance(layer, QuantLinear) or name == "lm_head":
            continue
        assert layer.blocks is not None
        prefix, _, leaf = name.rpartition(".")
        shards = SHARDS.get(leaf, (leaf,))
        want = [file_kind[f"model.{prefix}.{s}.weight"] for s in shards]
        assert [p.kind for p in layer.blocks.parts] == (want if len(set(want)) > 1 else [want[0]]), name
        mixed += len(layer.blocks.parts) > 1
    assert mixed > 0 or quant in ("Q6_K", "Q4_0", "Q8_0")
    got = read(llm, ids)
    rise, agreement = got.perplexity / fp32.perplexity - 1, got.agreement(fp32)
    print(f"{quant} auto: perplexity {rise:+.3%} against fp32 on the file's weights, top-1 agreement {agreement:.2%}")
    assert abs(rise) <= FILE_GATE[0] and agreement >= FILE_GATE[1], (rise, agreement)


def test_auto_never_lowers_a_files_bits(tiny_zoo: TinyZoo, caplog: pytest.LogCaptureFixture) -> None:
    """Gemma 3 at 64 wide: llama-quantize's Q4_K_M falls back to Q5_0 (and Q8_0) where rows are
    not multiples of 256. The kernel does not read Q5_0, so `auto` requantizes those matrices
    to Q8_0, not to the 4-bit format it gives float checkpoints, and says so."""
    from engine import LLM
    from engine.model.gguf_file import GGUFModel, hf_name
    from engine.quant.apply import SHARDS
    from engine.quant.linear import QuantLinear

    spec = FAMILIES[12]
    path = quantize(tiny_zoo, spec, "Q4_K_M")
    gguf = GGUFModel(path)
    file_kind = {hf_name(t.name, gguf.family): t.tensor_type.name for t in gguf.reader.tensors if len(t.shape) == 2}
    assert "Q5_0" in file_kind.values()
    with caplog.at_level(logging.INFO, logger="pagode"):
        llm = LLM(model=str(path), quantization="auto", kv_cache_memory="16MiB", max_model_len=128)
    assert "Q5_0 tensors are dequantized and requantized (to Q8_0" in caplog.text
    for name, layer in llm.engine.runner.model.named_modules():
        if isinstance(layer, QuantLinear) and name != "lm_head":
            prefix, _, leaf = name.rpartition(".")
            kinds = {file_kind[f"model.{prefix}.{s}.weight"] for s in SHARDS.get(leaf, (leaf,))}
            assert layer.blocks is not None
            if kinds & {"Q5_0", "Q5_1"}:
                assert [p.kind for p in layer.blocks.parts] == ["q8_0"], (name, kinds)


def test_an_unknown_tensor_is_refused_by_name(tiny_zoo: TinyZoo, tmp_path: Path) -> None:
    """A tensor pagode has no place for: a ValueError naming it when the config is read, before
    any weight is loaded (the server logs it without a traceback)."""
    import gguf

    from engine.model.gguf_file import UnsupportedGGUF
    from engine.model.loader import ModelSource, read_config

    source = convert(tiny_zoo, FAMILIES[2], "q8_0")
    reader = gguf.GGUFReader(str(source))
    out = tmp_path / "extra.gguf"
    writer = gguf.GGUFWriter(str(out), "qwen2")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        writer.add_key_value(field.name, field.contents(), field.types[0],
                             field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.add_tensor("blk.0.attn_mystery.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedGGUF, match="blk.0.attn_mystery.weight"):
        read_config(ModelSource(out, out.name))
