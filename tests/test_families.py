"""Every served family: greedy output equals transformers' on the same weights, loaded from an
HF folder and from a GGUF written with llama.cpp's names (tests/tiny_models.py).

Each spec turns on its family's features in a 2-4 layer model; GGUF files are F32 (the same
weights as the folder) or Q8_0 (checked against transformers on the dequantized weights).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tiny_models import TinySpec, TinyZoo, assert_engine_matches, one_torch_thread, tiny_spec

# Phi-3 LongRoPE: one factor per rotated pair (head_dim 16 x 0.75 = 12 rotated dims).
SHORT = [1.0, 1.1, 1.3, 1.7, 2.2, 3.0]
LONG = [1.0, 1.5, 2.5, 4.0, 6.0, 9.0]


def _phi3(name: str, original: int) -> TinySpec:
    longrope = {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                "original_max_position_embeddings": original, "rope_theta": 5000.0,
                "partial_rotary_factor": 0.75}
    scale = 256 / original  # max_position_embeddings / original, as convert_hf_to_gguf.py
    attn = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
    return tiny_spec(name, "Phi3Config", "Phi3ForCausalLM", "phi3", rope_parameters=longrope,
                     partial_rotary_factor=0.75, original_max_position_embeddings=original, pad_token_id=0,
                     gguf_meta=(("add_rope_dimension_count", 12), ("add_rope_scaling_orig_ctx_len", original),
                                ("add_rope_scaling_attn_factors", attn)))


def _llama_rope(name: str, rope: dict, gguf_meta: tuple = ()) -> TinySpec:
    return tiny_spec(name, "LlamaConfig", "LlamaForCausalLM", "llama",
                     rope_parameters={"rope_theta": 5000.0, **rope}, gguf_meta=gguf_meta)


SPECS = [
    tiny_spec("llama", "LlamaConfig", "LlamaForCausalLM", "llama"),
    tiny_spec("qwen2", "Qwen2Config", "Qwen2ForCausalLM", "qwen2"),
    tiny_spec("mistral", "MistralConfig", "MistralForCausalLM", sliding_window=None),
    tiny_spec("qwen3", "Qwen3Config", "Qwen3ForCausalLM", "qwen3", head_dim=32),
    _llama_rope("llama3-rope", {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    _llama_rope("yarn-rope", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
                (("add_rope_scaling_type", "yarn"), ("add_rope_scaling_factor", 4.0),
                 ("add_rope_scaling_orig_ctx_len", 32))),
    _llama_rope("linear-rope", {"rope_type": "linear", "factor": 2.0},
                (("add_rope_scaling_type", "linear"), ("add_rope_scaling_factor", 2.0))),
    _llama_rope("dynamic-rope", {"rope_type": "dynamic", "factor": 2.0}),
    _phi3("phi3-short", 128),
    _phi3("phi3-long", 8),
    tiny_spec("granite", "GraniteConfig", "GraniteForCausalLM", "granite", embedding_multiplier=3.0,
              residual_multiplier=0.5, attention_multiplier=0.4, logits_scaling=2.5,
              gguf_meta=(("add_embedding_scale", 3.0), ("add_residual_scale", 0.5),
                         ("add_attention_scale", 0.4), ("add_logit_scale", 2.5))),
    tiny_spec("olmo2", "Olmo2Config", "Olmo2ForCausalLM", "olmo2"),
    # Checkpoint shapes: bf16 and tied, fp16 and sharded with model.safetensors.index.json.
    tiny_spec("llama-bf16-tied", "LlamaConfig", "LlamaForCausalLM", dtype="bfloat16", tie_word_embeddings=True),
    tiny_spec("llama-fp16-sharded", "LlamaConfig", "LlamaForCausalLM", dtype="float16", max_shard_size="30KB"),
    tiny_spec("smollm3", "SmolLM3Config", "SmolLM3ForCausalLM", "smollm3", num_hidden_layers=4,
              pad_token_id=0),
]
# GGUF files in Q8_0 for these, F32 for the rest (which then share the folder's reference).
Q8_0 = ("llama", "qwen3", "granite", "olmo2")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_folder_matches_transformers(tiny_zoo: TinyZoo, spec: TinySpec) -> None:
    assert_engine_matches(tiny_zoo.folder(spec), tiny_zoo.reference(spec))


@pytest.mark.parametrize("spec", [s for s in SPECS if s.gguf_arch and s.name != "dynamic-rope"],
                         ids=lambda s: s.name)
def test_gguf_matches_transformers(tiny_zoo: TinyZoo, spec: TinySpec) -> None:
    path, reference = tiny_zoo.gguf(spec, "Q8_0" if spec.name in Q8_0 else "F32")
    assert_engine_matches(path, reference)


def test_a_sharded_folder_has_an_index_and_several_files(tiny_zoo: TinyZoo) -> None:
    from engine.model.weights import checkpoint_files

    folder = tiny_zoo.folder(next(s for s in SPECS if s.name == "llama-fp16-sharded"))
    assert (folder / "model.safetensors.index.json").exists()
    assert len(checkpoint_files(folder)) > 1


def test_dynamic_rope_beyond_its_table_is_refused(tiny_zoo: TinyZoo) -> None:
    """Beyond max_position_embeddings transformers changes dynamic NTK's frequencies with each
    sequence's length; one table cannot follow, so the engine says so at load."""
    from engine import LLM

    folder = tiny_zoo.folder(next(s for s in SPECS if s.name == "dynamic-rope"))
    with pytest.raises(ValueError, match=r"'dynamic' is served only up to max_position_embeddings \(256\)"):
        LLM(model=str(folder), max_model_len=512, kv_cache_memory="4MiB", kv_cache_dtype="fp32", quantization="none")


def test_an_unknown_architecture_names_what_is_served(tiny_zoo: TinyZoo, tmp_path: Path) -> None:
    from engine import LLM

    folder = tiny_zoo.folder(SPECS[0])
    for item in folder.iterdir():
        (tmp_path / item.name).symlink_to(item)
    (tmp_path / "config.json").unlink()
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "falcon_mamba"}))
    with pytest.raises(ValueError, match="unsupported model_type 'falcon_mamba'; pagode serves .*llama, .*qwen3"):
        LLM(model=str(tmp_path), kv_cache_memory="4MiB", quantization="none")


def test_layers_without_rope_use_the_identity_table(tiny_zoo: TinyZoo) -> None:
    """SmolLM3's no_rope_layers[i] == 0 means no RoPE; with 4 layers that is layer 3 only."""
    from engine import LLM

    llm = LLM(model=str(tiny_zoo.folder(next(s for s in SPECS if s.name == "smollm3"))), max_model_len=64,
              kv_cache_memory="4MiB", kv_cache_dtype="fp32", quantization="none")
    model = llm.engine.runner.model
    assert [layer.self_attn.rope is model.nope for layer in model.layers] == [False, False, False, True]


def test_an_unknown_gguf_architecture_names_what_is_served(tmp_path: Path) -> None:
    import gguf

    from engine import LLM

    path = tmp_path / "tiny-mamba.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", torch.zeros(4, 32).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'mamba'; pagode serves .*llama.*qwen2, qwen3"):
        LLM(model=str(path), kv_cache_memory="4MiB", quantization="none")
