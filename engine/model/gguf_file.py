"""Read a llama.cpp GGUF file: config from metadata, dequantized HF-named weights.

Tensor names follow llama.cpp (gguf-py `constants.py`, `tensor_mapping.py`); a family adds
its own names (Family.gguf_tensors) and the tensors its config reads (rope factors).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine import native
from engine.model.config import ModelConfig
from engine.model.family import Family
from engine.model.gguf_reader import GGUFHeader
from engine.model.gguf_split import read_parts
from engine.model.registry import family_for_gguf

_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Read into the config (llama.cpp's rotary factors), not loaded as weights; converters name
# them with a ".weight" suffix (rope_freqs.weight), hand-written files sometimes without.
_CONFIG_TENSORS = ("rope_freqs",)


class UnsupportedGGUF(ValueError):
    """The file holds a tensor pagode has no place for: refused by name, before any weight is read."""


def base_name(gguf_name: str) -> str:
    return gguf_name.removesuffix(".weight")


class GGUFModel:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.reader = read_header(path)
        self.arch = str(self.field("general.architecture"))

    def field(self, key: str, default: Any = None) -> Any:
        return self.reader.fields.get(key, default)

    def arch_field(self, key: str, default: Any = None) -> Any:
        """`{arch}.{key}`, e.g. arch_field("attention.head_count")."""
        return self.field(f"{self.arch}.{key}", default)

    @cached_property
    def tensor_names(self) -> set[str]:
        return {t.name for t in self.reader.tensors}

    def tensor_values(self, name: str) -> list[float] | None:
        """A small tensor's values (rope factors), or None when the file has none."""
        for t in self.reader.tensors:
            if base_name(t.name) == name:
                return [float(x) for x in np.asarray(t.data, dtype=np.float32).reshape(-1)]
        return None

    @cached_property
    def family(self) -> Family:
        return family_for_gguf(self.arch)

    def config(self) -> ModelConfig:
        return config_from_gguf(self)

    @property
    def num_tensors(self) -> int:
        return len(self.reader.tensors)

    def weight_tensors(self) -> list[Any]:
        """The file's tensors that are weights (not config), each checked to have a place in
        the model first, so an unknown one is refused by name before any is dequantized."""
        skip = _CONFIG_TENSORS + self.family.gguf_config_tensors
        tensors = [t for t in self.reader.tensors if base_name(t.name) not in skip]
        for t in tensors:
            hf_name(t.name, self.family)
        return tensors

    def weights(self, skip: Collection[str] = ()) -> Iterator[tuple[str, torch.Tensor]]:
        """HF name -> fp32 tensor of every weight, but those named in `skip` (matrices that
        the quantization takes from the file's blocks), which are never dequantized here."""
        cfg = self.config()
        for t in self.weight_tensors():
            name = hf_name(t.name, self.family)
            if name in skip:
                continue
            shape = tuple(int(x) for x in reversed(t.shape))  # GGUF lists dims fastest-first
            tensor = dequantized(t).reshape(shape)
            heads = _permuted_heads(self.family, name, cfg)
            if heads is not None:
                tensor = unpermute(tensor, heads)
            yield name, tensor

    def requantized_kinds(self, kept: tuple[str, ...]) -> dict[str, int]:
        """Block formats of the file's matrices outside `kept` (and not float), with counts."""
        counts: dict[str, int] = {}
        for t in self.reader.tensors:
            kind = t.tensor_type.name
            if len(t.shape) == 2 and kind not in kept + ("F32", "F16", "BF16"):
                counts[kind] = counts.get(kind, 0) + 1
        return counts

    def raw_blocks(self, kinds: tuple[str, ...]) -> dict[str, tuple[str, np.ndarray | None]]:
        """HF name -> (GGUF type in lower case, bytes [rows, row bytes] or None) of every matrix;
        the bytes only for types in `kinds`, unquantized.

        Q/K rows get the same un-permutation as the dequantized weights: it moves whole rows,
        so every block along the input dimension stays intact.
        """
        cfg = self.config()
        out: dict[str, tuple[str, np.ndarray | None]] = {}
        for t in self.weight_tensors():
            if len(t.shape) != 2:
                continue
            name = hf_name(t.name, self.family)
            if t.tensor_type.name not in kinds:
                out[name] = (t.tensor_type.name.lower(), None)
                continue
            data = np.asarray(t.data)
            heads = _permuted_heads(self.family, name, cfg)
            if heads is not None:
                data = data[unpermute(torch.arange(data.shape[0]), heads).numpy()]
            out[name] = (t.tensor_type.name.lower(), data)
        return out


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


def dequantized(t: Any) -> torch.Tensor:
    """A GGUF tensor's values as a flat, writable fp32 tensor: the CPU kernels' dequantizer
    where it decodes the type (gguf-py's values, on every thread), gguf-py otherwise."""
    kernel = native.dequantizer()
    fast = None if kernel is None else kernel(t.data, int(t.tensor_type))
    if fast is not None:
        return fast
    from gguf.quants import dequantize

    return torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1))


def read_header(path: Path) -> GGUFHeader:
    """The file's parsed header (with the tensors of all its parts when it is split), read once
    however many times a load opens the file (config, weights, quantization): keyed by the
    file's identity, so a rewrite is read anew. The path keeps its symlinks: in the hub
    cache a part's name, which says where the other parts are, is a link to a hashed blob."""
    stat = path.stat()
    return _read_header(path.absolute(), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read_header(path: Path, size: int, mtime_ns: int) -> GGUFHeader:
    return read_parts(path)


def _permuted_heads(family: Family, name: str, cfg: ModelConfig) -> int | None:
    if not family.permute_qk:
        return None
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return cfg.num_attention_heads
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return cfg.num_key_value_heads
    return None


def hf_name(gguf_name: str, family: Family | None = None) -> str:
    parts = gguf_name.split(".")
    extra = family.gguf_tensors if family is not None else {}
    if parts[0] == "blk" and len(parts) == 4:
        part = extra.get(parts[2]) or _LAYER_NAMES.get(parts[2])
        if part is not None:
            return f"model.layers.{parts[1]}.{part}.{parts[3]}"
    elif parts[0] in _TOP_NAMES and len(parts) == 2:
        return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"
    raise UnsupportedGGUF(f"GGUF tensor {gguf_name!r} has no place in a {family and family.model_type} model; "
                          "pagode cannot serve this file (docs/models.md lists what each family reads)")


def unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's converter, which interleaves the rotary halves of Q and K rows."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
