"""A LoRA adapter in llama.cpp's GGUF, as `convert_lora_to_gguf.py` writes it:
`general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`, and per targeted
weight `blk.N.<name>.weight.lora_a` [r, in] and `.lora_b` [out, r].

The converter treats B like the base weight it belongs to: on NORM-RoPE arches (llama,
granite, smollm3) the rows of Q's and K's B are interleaved as the base's Q/K rows are, so
they are un-permuted here as the base's are at load (engine/model/gguf_file.py). Scale is
alpha / r, as llama.cpp applies it: the converter writes lora_alpha and drops use_rslora, so
an rsLoRA adapter's GGUF is scaled as llama.cpp scales it, not as PEFT does."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.lora.adapter import LoraAdapter, LoraError
from engine.model.config import ModelConfig
from engine.model.gguf_file import GGUFModel, UnsupportedGGUF, dequantized, hf_name, unpermute
from engine.model.gguf_reader import ReaderTensor


def read_gguf_adapter(name: str, path: str | Path, max_rank: int, cfg: ModelConfig) -> LoraAdapter:
    """Read and check a GGUF LoRA for a base model of config `cfg`."""
    file = GGUFModel(Path(path))
    if file.field("general.type") != "adapter" or file.field("adapter.type") != "lora":
        raise LoraError(f"{path} is a GGUF file but not a LoRA adapter (general.type "
                        f"{file.field('general.type')!r}, adapter.type {file.field('adapter.type')!r})")
    tensors = {t.name: t for t in file.reader.tensors}
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for key, a_info in tensors.items():
        if not key.endswith(".lora_a"):
            continue
        base = key.removesuffix(".lora_a")
        b_info = tensors.get(base + ".lora_b")
        if b_info is None:
            raise LoraError(f"{key} has no lora_b beside it")
        module = module_path(base, file)
        a, b = matrix(a_info), matrix(b_info)
        heads = permuted_heads(file, module, cfg)
        weights[module] = (a, unpermute(b, heads) if heads is not None else b)
    if not weights:
        raise LoraError(f"{path} holds no lora_a/lora_b tensors")
    rank = max(a.shape[0] for a, _ in weights.values())
    if rank > max_rank:
        raise LoraError(f"the adapter `{name}` has rank {rank}, above --max-lora-rank {max_rank}")
    alpha = float(file.field("adapter.lora.alpha", rank))
    return LoraAdapter(name, str(path), rank, alpha / rank, weights)


def module_path(base: str, file: GGUFModel) -> str:
    """`blk.0.attn_q.weight` -> `layers.0.self_attn.q_proj` (the engine's module names)."""
    try:
        name = hf_name(base, file.family)
    except UnsupportedGGUF as err:
        raise LoraError(str(err)) from err
    return name.removeprefix("model.").removesuffix(".weight")


def matrix(info: ReaderTensor) -> torch.Tensor:
    """A 2-D tensor's values in torch's order (GGUF lists dimensions fastest first)."""
    shape = tuple(int(x) for x in reversed(info.shape))
    return dequantized(info).reshape(shape).float().contiguous()


def permuted_heads(file: GGUFModel, module: str, cfg: ModelConfig) -> int | None:
    if not file.family.permute_qk:
        return None
    if module.endswith("q_proj"):
        return cfg.num_attention_heads
    if module.endswith("k_proj"):
        return cfg.num_key_value_heads
    return None
