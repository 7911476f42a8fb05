"""What a model family is to pagode: how its config maps onto ModelConfig, which model class
runs it, how its GGUF tensors are named, and what it supports.

Each family module builds its Family and registers it (engine/model/registry.py holds one
per HF `model_type`); a family that needs code of its own keeps it in that module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


class GGUFMetadata(Protocol):
    """What a family's adapters read of a GGUF file (engine/model/gguf_file.py's GGUFModel
    is one), so that a family module needs no GGUF reader."""

    def arch_field(self, key: str, default: Any = None) -> Any: ...

    def tensor_values(self, name: str) -> list[float] | None: ...


HFFields = Callable[[dict[str, Any]], dict[str, Any]]
GGUFFields = Callable[[GGUFMetadata], dict[str, Any]]


def no_fields(_: Any) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Support:
    """What runs this family, for docs/models.md and the start-up checks.

    `fused_cpu_step` False: the C++ decode step (engine/model/decode_step.py) cannot compute
    the family's layers (mixture-of-experts); `proved` lists what the tests check token for token."""

    quantization: bool = True
    fused_cpu_step: bool = True
    triton: bool = True
    proved: tuple[str, ...] = ()


@dataclass(frozen=True)
class Family:
    model_type: str  # HF config.json `model_type`
    gguf_arch: str | None  # GGUF `general.architecture`; None when no GGUF maps to it
    model_class: str = "engine.model.llama:LlamaForCausalLM"  # "module:Class", imported at load
    hf_fields: HFFields = no_fields  # family-specific ModelConfig fields from config.json
    gguf_fields: GGUFFields = no_fields  # the same from GGUF metadata
    gguf_tensors: dict[str, str] = field(default_factory=dict)  # extra GGUF name part -> HF name part
    gguf_config_tensors: tuple[str, ...] = ()  # GGUF tensors read into the config, not weights
    permute_qk: bool = False  # llama.cpp's converter permutes Q/K rows (NORM-RoPE arches)
    support: Support = Support()
    notes: str = ""


def rope_from_hf(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope scaling or None) from either HF spelling: v5 folds theta and the
    scaling into `rope_parameters`, hub configs still carry `rope_theta`/`rope_scaling`."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or None
    theta = cfg.get("rope_theta") or (rope or {}).get("rope_theta") or 10000.0
    if rope is not None:
        rope = dict(rope)
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind in ("su", "yarn") and "long_factor" in rope:
            kind = "longrope"  # Phi-3's old names for its long-context scaling
        rope["rope_type"] = kind
        if kind == "default":
            rope = None
    return float(theta), rope


def partial_rotary_from_hf(cfg: dict[str, Any]) -> float:
    rope = cfg.get("rope_parameters") or {}
    return float(cfg.get("partial_rotary_factor") or rope.get("partial_rotary_factor") or 1.0)
