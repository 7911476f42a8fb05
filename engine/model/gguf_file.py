"""Read a llama.cpp GGUF file: config from metadata, dequantized HF-named weights."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.model.config import ModelConfig

_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


class GGUFModel:
    def __init__(self, path: Path) -> None:
        from gguf import GGUFReader

        self.path = path
        self.reader = GGUFReader(str(path))
        self.arch = str(self._field("general.architecture"))

    def _field(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def config(self) -> ModelConfig:
        a = self.arch
        heads = int(self._field(f"{a}.attention.head_count"))
        hidden = int(self._field(f"{a}.embedding_length"))
        names = {t.name for t in self.reader.tensors}
        vocab = self._field(f"{a}.vocab_size") or len(self._field("tokenizer.ggml.tokens"))
        eos = self._field("tokenizer.ggml.eos_token_id")
        return ModelConfig(
            architecture="qwen2" if a == "qwen2" else "llama",
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(self._field(f"{a}.feed_forward_length")),
            num_hidden_layers=int(self._field(f"{a}.block_count")),
            num_attention_heads=heads,
            num_key_value_heads=int(self._field(f"{a}.attention.head_count_kv", heads)),
            head_dim=int(self._field(f"{a}.attention.key_length", hidden // heads)),
            rms_norm_eps=float(self._field(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(self._field(f"{a}.rope.freq_base", 10000.0)),
            max_position_embeddings=int(self._field(f"{a}.context_length", 2048)),
            tie_word_embeddings="output.weight" not in names,
            attention_bias="blk.0.attn_q.bias" in names,
            bos_token_id=self._field("tokenizer.ggml.bos_token_id"),
            eos_token_ids=[] if eos is None else [int(eos)],
        )

    @property
    def num_tensors(self) -> int:
        return len(self.reader.tensors)

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        from gguf.quants import dequantize

        cfg = self.config()
        for t in self.reader.tensors:
            array = dequantize(t.data, t.tensor_type)
            shape = tuple(int(x) for x in reversed(t.shape))  # GGUF lists dims fastest-first
            tensor = torch.from_numpy(np.array(array, dtype=np.float32).reshape(shape))  # a writable copy
            name = hf_name(t.name)
            if self.arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
                tensor = unpermute(tensor, cfg.num_attention_heads)
            elif self.arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
                tensor = unpermute(tensor, cfg.num_key_value_heads)
            yield name, tensor


    def raw_blocks(self, kinds: tuple[str, ...] = ("Q4_1", "Q8_0")) -> dict[str, tuple[str, np.ndarray]]:
        """HF name -> (kind, bytes [rows, row bytes]) of the tensors stored in `kinds`, unquantized.

        Q/K rows get the same un-permutation as the dequantized weights: it moves whole rows,
        so every 32-block along the input dimension stays intact.
        """
        cfg = self.config()
        out: dict[str, tuple[str, np.ndarray]] = {}
        for t in self.reader.tensors:
            if t.tensor_type.name not in kinds or len(t.shape) != 2:
                continue
            name = hf_name(t.name)
            data = np.asarray(t.data)
            heads = _permuted_heads(self.arch, name, cfg)
            if heads is not None:
                data = data[unpermute(torch.arange(data.shape[0]), heads).numpy()]
            out[name] = (t.tensor_type.name.lower(), data)
        return out


def _permuted_heads(arch: str, name: str, cfg: ModelConfig) -> int | None:
    if arch != "llama":
        return None
    if name.endswith("q_proj.weight"):
        return cfg.num_attention_heads
    if name.endswith("k_proj.weight"):
        return cfg.num_key_value_heads
    return None


def hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"


def unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's converter, which interleaves the rotary halves of Q and K rows."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
