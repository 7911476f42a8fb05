"""Every model family pagode serves, by HF `model_type` and GGUF `general.architecture`.

A family entry (engine/model/family.py) says how its config maps onto ModelConfig, which
model class runs it, how its GGUF tensors are named and what it supports. To add a family:
write its adapters in a module beside llama.py (a `FAMILY = Family(...)`), list it in
FAMILIES below, and add a row to tests/test_families.py; docs/models.md is generated from
this table (families_table()).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from engine.model import gemma2, gemma3, granite, mixtral, olmo2, olmoe, phi3, qwen3, qwen3_moe, smollm3
from engine.model.config import ModelConfig
from engine.model.family import Family, Support, rope_from_hf
from engine.model.qwen_window import window_fields

if TYPE_CHECKING:
    from torch import nn

    from engine.model.gguf_file import GGUFModel


def _llama_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"attention_bias": cfg.get("attention_bias", False)}


def _llama_gguf_fields(gguf: GGUFModel) -> dict[str, Any]:
    """llama.cpp writes Mixtral as arch llama: a file with experts is served as one."""
    return {} if gguf.arch_field("expert_count") is None else mixtral.gguf_moe_fields(gguf)


def _mistral_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """Mistral's sliding window applies to every layer (transformers' sliding-window mask)."""
    return {**_llama_fields(cfg), "sliding_window": cfg.get("sliding_window")}


def _qwen2_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"attention_bias": cfg.get("attention_bias", True),  # Qwen2 always has Q/K/V bias
            **window_fields(cfg)}


LLAMA = Family(model_type="llama", gguf_arch="llama", hf_fields=_llama_fields, permute_qk=True,
               gguf_fields=_llama_gguf_fields, gguf_tensors=mixtral.GGUF_TENSORS,
               support=Support(proved=("folder", "GGUF Q8_0", "GGUF Q4_K_M",
                                       "converter Q8_0; llama-quantize Q4_0, Q4_K_M, Q5_K_M, Q6_K",
                                       "int8/int4 gate",
                                       "RoPE llama3, yarn, linear: folder + GGUF", "dynamic: folder",
                                       "bf16, fp16, sharded, tied")),
               notes="RoPE scaling: linear, llama3, yarn, dynamic (up to max_position_embeddings)")
MISTRAL = Family(model_type="mistral", gguf_arch=None, hf_fields=_mistral_fields,
                 support=Support(proved=("folder", "converter Q8_0",
                                         "sliding window: folder, Triton, KV blocks freed")),
                 notes="llama.cpp writes Mistral as arch llama (no window in its GGUF); sliding_window on "
                       "every layer")
QWEN2 = Family(model_type="qwen2", gguf_arch="qwen2", hf_fields=_qwen2_fields,
               notes="Q/K/V bias; use_sliding_window: a window on layers >= max_window_layers",
               support=Support(proved=("folder", "converter Q8_0", "GGUF F32", "int8/int4 gate",
                                       "sliding window layers: folder")))

FAMILIES: tuple[Family, ...] = (LLAMA, MISTRAL, QWEN2, qwen3.FAMILY, phi3.FAMILY, granite.FAMILY,
                                olmo2.FAMILY, smollm3.FAMILY, qwen3_moe.FAMILY, olmoe.FAMILY, mixtral.FAMILY,
                                gemma2.FAMILY, gemma3.FAMILY)  # gemma: windowed and soft-capped


def served() -> str:
    return ", ".join(f.model_type for f in FAMILIES)


def family_for_hf(model_type: str) -> Family:
    for family in FAMILIES:
        if family.model_type == model_type:
            return family
    raise ValueError(f"unsupported model_type {model_type!r}; pagode serves {served()} "
                     f"(docs/models.md)")


def family_for_gguf(arch: str) -> Family:
    for family in FAMILIES:
        if family.gguf_arch == arch:
            return family
    archs = ", ".join(f.gguf_arch for f in FAMILIES if f.gguf_arch)
    raise ValueError(f"unsupported GGUF architecture {arch!r}; pagode serves {archs} (docs/models.md)")


def family_of(cfg: ModelConfig) -> Family:
    return family_for_hf(cfg.architecture)


def model_class(cfg: ModelConfig) -> type[nn.Module]:
    module, name = family_of(cfg).model_class.split(":")
    cls: type[nn.Module] = getattr(importlib.import_module(module), name)
    return cls


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a config.json: the fields every family shares, then the family's own."""
    family = family_for_hf(cfg.get("model_type", "llama"))
    heads = cfg["num_attention_heads"]
    theta, rope = rope_from_hf(cfg)
    eos = cfg.get("eos_token_id")
    fields: dict[str, Any] = dict(
        architecture=family.model_type,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
        rope_theta=theta,
        rope_scaling=rope,
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=[] if eos is None else (list(eos) if isinstance(eos, list) else [eos]),
    )
    fields.update(family.hf_fields(cfg))
    return ModelConfig(**fields)


def config_from_gguf(gguf: GGUFModel) -> ModelConfig:
    """ModelConfig from GGUF metadata (llama.cpp's `{arch}.*` keys), then the family's own."""
    family = family_for_gguf(gguf.arch)
    heads = int(gguf.arch_field("attention.head_count"))
    hidden = int(gguf.arch_field("embedding_length"))
    vocab = gguf.arch_field("vocab_size") or len(gguf.field("tokenizer.ggml.tokens"))
    eos = gguf.field("tokenizer.ggml.eos_token_id")
    fields: dict[str, Any] = dict(
        architecture=family.model_type,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(gguf.arch_field("feed_forward_length")),
        num_hidden_layers=int(gguf.arch_field("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(gguf.arch_field("attention.head_count_kv", heads)),
        head_dim=int(gguf.arch_field("attention.key_length", hidden // heads)),
        rms_norm_eps=float(gguf.arch_field("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(gguf.arch_field("rope.freq_base", 10000.0)),
        rope_scaling=gguf_rope_scaling(gguf),
        max_position_embeddings=int(gguf.arch_field("context_length", 2048)),
        tie_word_embeddings="output.weight" not in gguf.tensor_names,
        attention_bias="blk.0.attn_q.bias" in gguf.tensor_names,
        bos_token_id=gguf.field("tokenizer.ggml.bos_token_id"),
        eos_token_ids=[] if eos is None else [int(eos)],
    )
    fields.update(family.gguf_fields(gguf))
    return ModelConfig(**fields)


def gguf_rope_scaling(gguf: GGUFModel) -> dict[str, Any] | None:
    """RoPE scaling as llama.cpp stores it: llama3's per-dimension divisors as the tensor
    rope_freqs, linear and YaRN as rope.scaling.* keys."""
    factors = gguf.tensor_values("rope_freqs")
    if factors is not None:
        return {"rope_type": "freq_factors", "factors": factors}
    kind = gguf.arch_field("rope.scaling.type")
    if kind in (None, "none"):
        return None
    factor = float(gguf.arch_field("rope.scaling.factor", 1.0))
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        out: dict[str, Any] = {"rope_type": "yarn", "factor": factor,
                               "original_max_position_embeddings":
                                   int(gguf.arch_field("rope.scaling.original_context_length"))}
        for key in ("beta_fast", "beta_slow"):
            value = gguf.arch_field(f"rope.scaling.yarn_{key}")
            if value is not None:
                out[key] = float(value)
        return out
    raise ValueError(f"unsupported GGUF rope scaling type {kind!r}; pagode reads linear, yarn and rope_freqs")


def families_table() -> str:
    """The Markdown table of docs/models.md (tests/test_models_doc.py checks the page holds it).

    "proved": what tests/test_families.py and tests/test_family_quantization.py check: greedy
    output equal to transformers' loaded from an HF folder and from a GGUF, and the quantized
    modes' quality gate."""
    rows = ["| family (`model_type`) | GGUF arch | proved | int8/int4 | fused CPU decode step | Triton | notes |",
            "|---|---|---|---|---|---|---|"]
    for f in FAMILIES:
        s: Support = f.support
        rows.append(f"| {f.model_type} | {f.gguf_arch or '-'} | {', '.join(s.proved) or '-'} | "
                    f"{_yes(s.quantization)} | {_yes(s.fused_cpu_step)} | {_yes(s.triton)} | {f.notes} |")
    return "\n".join(rows) + "\n"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
