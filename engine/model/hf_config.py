"""ModelConfig from a Hugging Face config.json: the fields every family shares, then its
family's own (Family.hf_fields)."""

from __future__ import annotations

from typing import Any

from engine.model.config import ModelConfig
from engine.model.family import rope_from_hf
from engine.model.registry import family_for_hf


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
