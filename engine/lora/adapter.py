"""A PEFT LoRA adapter read from its folder: `adapter_config.json` (r, lora_alpha,
target_modules, use_rslora) and `adapter_model.safetensors` (`lora_A` [r, in], `lora_B`
[out, r] per targeted module).

The weights are keyed by the module path PEFT names, with PEFT's `base_model.model.` and
the decoder's `model.` prefixes taken off, so that `layers.0.self_attn.q_proj` is what is
left: the engine's own module names, save for the projections it fuses (registry.py)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

PEFT_PREFIXES = ("base_model.model.model.", "base_model.model.")


class LoraError(ValueError):
    """An adapter that cannot be served: a missing file, a rank over the limit, an unknown module."""


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    path: str
    rank: int
    scale: float  # lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]  # module path -> (A [r, in], B [out, r])


def read_peft_adapter(name: str, path: str | Path, max_rank: int) -> LoraAdapter:
    """Read and check an adapter before any of it is used: a bad one is refused whole."""
    folder = Path(path)
    config_file, weights_file = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not config_file.is_file() or not weights_file.is_file():
        raise LoraError(f"{folder} is not a PEFT adapter folder: it needs adapter_config.json and "
                        "adapter_model.safetensors")
    config = json.loads(config_file.read_text())
    rank, alpha = int(config["r"]), float(config.get("lora_alpha", config["r"]))
    if rank > max_rank:
        raise LoraError(f"the adapter `{name}` has rank {rank}, above --max-lora-rank {max_rank}")
    if config.get("bias", "none") != "none" or config.get("modules_to_save") or config.get("use_dora"):
        raise LoraError(f"the adapter `{name}` trains biases, whole modules or DoRA magnitudes; "
                        "only LoRA matrices are served")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return LoraAdapter(name, str(folder), rank, scale, pair_matrices(load_file(str(weights_file))))


def pair_matrices(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(A, B) per module path, from PEFT's `<path>.lora_A.weight` / `<path>.lora_B.weight`."""
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    unserved = [key for key in tensors if ".lora_A." not in key and ".lora_B." not in key]
    if unserved:  # embeddings' lora_embedding_A/B, DoRA magnitudes: served without them, it would be wrong
        raise LoraError(f"the adapter holds tensors other than LoRA matrices, e.g. {unserved[0]}")
    for key, a in tensors.items():
        if ".lora_A." not in key:
            continue
        module = strip_prefix(key.split(".lora_A.")[0])
        b = tensors.get(key.replace(".lora_A.", ".lora_B."))
        if b is None:
            raise LoraError(f"{key} has no lora_B beside it")
        pairs[module] = (a.float().contiguous(), b.float().contiguous())
    if not pairs:
        raise LoraError("the adapter holds no lora_A/lora_B matrices")
    return pairs


def strip_prefix(key: str) -> str:
    for prefix in PEFT_PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix):]
    return key
