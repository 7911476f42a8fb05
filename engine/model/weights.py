"""Load Hugging Face-named weights into the fused model through a small name map."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from pathlib import Path

import torch

from engine.model.config import ModelConfig
from engine.model.hf_config import config_from_hf
from engine.model.llama import LlamaForCausalLM
from engine.model.moe import mixtral_names, split_stacked_experts
from engine.progress import progress


def iter_safetensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the folder's checkpoint, one file after another; a sharded checkpoint's
    files are those its model.safetensors.index.json names (stray *.safetensors are not)."""
    from safetensors.torch import safe_open

    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                yield name, f.get_tensor(name)


def checkpoint_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (folder / s).exists()]
        if missing:
            raise FileNotFoundError(f"{index} names shards that are not in {folder}: {missing[:3]}")
        return [folder / s for s in shards]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {folder}")
    return files


def read_hf_config(folder: Path) -> ModelConfig:
    cfg = config_from_hf(json.loads((folder / "config.json").read_text()))
    gen = folder / "generation_config.json"
    if gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        extra = eos if isinstance(eos, list) else ([] if eos is None else [eos])
        cfg.eos_token_ids = sorted(set(cfg.eos_token_ids) | set(extra))
    return cfg


def load_weights(model: LlamaForCausalLM, weights: Iterator[tuple[str, torch.Tensor]],
                 total: int | None = None, filled_elsewhere: Collection[str] = ()) -> None:
    """Copy the checkpoint's weights into the model's parameters; every parameter must get one,
    but those of the HF names in `filled_elsewhere` (left unread, the caller replaces them)."""
    params = dict(model.named_parameters())
    weights = split_stacked_experts(mixtral_names(weights))
    loaded: set[str] = set()
    for hf_name, tensor in progress(weights, total=total, description="loading weights"):
        if "rotary_emb" in hf_name:
            continue
        name = hf_name.removeprefix("model.")
        target, shard = _map_name(name, model.packed_modules_mapping)
        if target not in params:
            if name == "lm_head.weight" and model.config.tie_word_embeddings:
                continue
            raise KeyError(f"checkpoint weight {hf_name!r} has no place in the model")
        _copy_shard(model, target, params[target], tensor, shard)
        loaded.add(target)
    missing = set(params) - loaded - {_map_name(n.removeprefix("model."), model.packed_modules_mapping)[0]
                                      for n in filled_elsewhere}
    if model.config.tie_word_embeddings:
        missing.discard("lm_head.weight")
    if missing:
        raise KeyError(f"checkpoint lacks weights: {sorted(missing)[:5]}")


def _map_name(name: str, packed: dict[str, tuple[str, int]]) -> tuple[str, int | None]:
    for fragment, (fused, shard) in packed.items():
        if f".{fragment}." in name:
            return name.replace(fragment, fused), shard
    return name, None


def _copy_shard(model: LlamaForCausalLM, target: str, param: torch.nn.Parameter, tensor: torch.Tensor,
                shard: int | None) -> None:
    with torch.no_grad():
        if shard is None:
            param.copy_(tensor.to(param.dtype))
            return
        cfg = model.config
        if ".gate_up_proj." in target:  # by name: a qkv can be as tall as a gate_up (qwen3)
            sizes = [param.shape[0] // 2] * 2  # an expert's is moe_intermediate_size wide
        else:
            kv = cfg.num_key_value_heads * cfg.head_dim
            sizes = [cfg.num_attention_heads * cfg.head_dim, kv, kv]
        start = sum(sizes[:shard])
        param[start:start + sizes[shard]].copy_(tensor.to(param.dtype))
