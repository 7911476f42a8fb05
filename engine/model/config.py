"""The architecture facts the engine needs, from a HF config.json or GGUF metadata.

One dataclass for every family: a family that only toggles a feature sets a field here
(engine/model/hf_config.py and gguf_file.py map each family's config onto these fields), so the model,
the planner and the KV-cache sizing read one shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has Q/K/V bias
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    # dense-family features
    qk_norm: str | None = None  # "head": RMSNorm(head_dim) on each head (qwen3); "proj": over all of q, k (olmo2)
    post_norms_only: bool = False  # olmo2: x + norm(attn(x)), x + norm(mlp(x)); no pre-norms
    partial_rotary_factor: float = 1.0  # share of each head's dims that RoPE rotates (phi3, Phi-4-mini 0.75)
    rope_layers: list[bool] | None = None  # per layer, whether it applies RoPE (smollm3's NoPE layers); None: all
    embedding_multiplier: float = 1.0  # granite
    residual_multiplier: float = 1.0  # granite: residual + out * multiplier after attention and MLP
    attention_multiplier: float | None = None  # granite: the softmax scale; None: head_dim ** -0.5
    logits_scaling: float = 1.0  # granite: logits / logits_scaling
    # ---- windowed and soft-capped attention (mistral, gemma2, gemma3) ----
    sliding_window: int | None = None  # a query sees only the last sliding_window positions (itself included)
    layer_types: list[str] | None = None  # per layer "sliding_attention" or "full_attention" (gemma); None: all alike
    attn_logit_softcapping: float | None = None  # gemma2: scores -> cap * tanh(scores / cap)
    final_logit_softcapping: float | None = None  # gemma2: logits -> cap * tanh(logits / cap)
    rope_local_theta: float | None = None  # gemma3: the sliding layers' RoPE base; None: rope_theta
    norms_stored_plus_one: bool = False  # gemma GGUF: llama.cpp's converter stores (1 + w) norm weights
    # mixture of experts (engine/model/moe.py); num_experts 0: every layer dense
    num_experts: int = 0
    num_experts_per_tok: int = 0  # top-k experts per token
    moe_intermediate_size: int = 0  # each expert's MLP width
    norm_topk_prob: bool = False  # renormalise the top-k routing weights to sum to 1
    decoder_sparse_step: int = 1  # layer i is sparse iff (i + 1) % step == 0 and i not in mlp_only_layers
    mlp_only_layers: list[int] = field(default_factory=list)

    def is_sparse_layer(self, i: int) -> bool:
        """Whether layer i has the MoE block, by transformers' Qwen3MoeDecoderLayer rule."""
        return (self.num_experts > 0 and i not in self.mlp_only_layers
                and (i + 1) % self.decoder_sparse_step == 0)

    @property
    def kv_window(self) -> int | None:
        """The sliding window when every layer has one (then old KV blocks can be freed), else None."""
        if self.sliding_window is None or any(t != "sliding_attention" for t in self.layer_types or []):
            return None
        return self.sliding_window

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def attention_scale(self) -> float:
        return self.head_dim ** -0.5 if self.attention_multiplier is None else self.attention_multiplier
