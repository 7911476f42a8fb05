"""The adapters loaded into one engine: each in a slot, its matrices attached to the model's
projections, which add their deltas after the base projection for the rows of the step's
LoraRows.

The deltas hang on forward hooks of the projection modules, so the base projection is
whatever module the loader made (nn.Linear, a block-quantized QuantLinear) and is not
touched. The hooks run in the layer-by-layer forward; the fused C++ decode step reads the
base weights itself and adds the deltas from the projections' kernel tables
(kernel_tables), so a decode step with adapter rows stays one call where the C++ kernel
takes every loaded adapter."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from engine.lora.adapter import LoraAdapter, LoraError
from engine.lora.delta import BASE, LoraProjection, LoraRows, Shard
from engine.quant.linear import QuantLinear

# The projections an adapter may target, by the engine's module names (fused ones included).
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class LoraRegistry:
    def __init__(self, model: nn.Module, max_loras: int, max_lora_rank: int) -> None:
        self.model = model
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.adapters: dict[str, LoraAdapter] = {}
        self.slots: dict[str, int] = {}
        self.cache_ids: dict[str, int] = {}  # a fresh id per load: a reloaded name never reuses old KV
        self._next_id = itertools.count(1)
        self.rows: LoraRows | None = None  # the running step's rows, set by the runner
        self.projections = {name: LoraProjection(_width(module), _kernel_dtype(module))
                            for name, module in model.named_modules() if name.rsplit(".", 1)[-1] in PROJECTIONS}
        self._by_module: dict[int, LoraProjection] = {}
        for name, projection in self.projections.items():
            module = model.get_submodule(name)
            module.register_forward_hook(self._hook(projection))
            if isinstance(module, QuantLinear):
                module.bf16_io = False  # the deltas add to an fp32 output (QuantLinear.bf16_path)
            self._by_module[id(module)] = projection
        self._version = 0  # bumped by every add and remove: what kernel_tables was built for
        self._tables: tuple[int, torch.Tensor | None] | None = None

    def _hook(self, projection: LoraProjection) -> Any:
        def add_deltas(_: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
            rows = self.rows
            if rows is None or not rows.active:
                return output
            return projection.add_deltas(args[0], output, rows)
        return add_deltas

    # ---- adapters ------------------------------------------------------
    def add(self, adapter: LoraAdapter) -> None:
        """Attach an adapter; refused whole (nothing attached) when it does not fit the model."""
        if adapter.name in self.adapters:
            raise LoraError(f"the adapter `{adapter.name}` is already loaded")
        if len(self.adapters) >= self.max_loras:
            raise LoraError(f"{self.max_loras} adapters are loaded already (--max-loras); unload one first")
        if adapter.rank > self.max_lora_rank:
            raise LoraError(f"the adapter `{adapter.name}` has rank {adapter.rank}, "
                            f"above --max-lora-rank {self.max_lora_rank}")
        slot = min(set(range(self.max_loras)) - set(self.slots.values()))
        placed = self._place(adapter)
        for name, shards in placed.items():
            self.projections[name].attach(slot, shards)
        self.adapters[adapter.name] = adapter
        self.slots[adapter.name] = slot
        self.cache_ids[adapter.name] = next(self._next_id)
        self._version += 1

    def remove(self, name: str) -> None:
        slot = self.slots.pop(name)
        del self.adapters[name], self.cache_ids[name]
        for projection in self.projections.values():
            projection.detach(slot)
        self._version += 1

    def kernel_tables(self, layers: Sequence[Sequence[nn.Module]]) -> torch.Tensor | None:
        """For the fused decode step: int64 [L, P] the address of each projection's kernel
        table (layers[l][p]'s; 0 where it holds no adapter), or None when a projection holds
        adapters the C++ kernel cannot take (the step then runs layer by layer). Rebuilt only
        after an adapter was added or removed; the tensors it points into live in the
        projections until then."""
        if self._tables is None or self._tables[0] != self._version:
            self._tables = (self._version, self._build_tables(layers))
        return self._tables[1]

    def _build_tables(self, layers: Sequence[Sequence[nn.Module]]) -> torch.Tensor | None:
        rows = []
        for modules in layers:
            row = []
            for module in modules:
                projection = self._by_module.get(id(module))
                if projection is None or not projection.shards:
                    row.append(0)
                elif projection.kernel_table is None:
                    return None
                else:
                    row.append(projection.kernel_table.table.data_ptr())
            rows.append(row)
        return torch.tensor(rows, dtype=torch.int64)

    def _place(self, adapter: LoraAdapter) -> dict[str, list[Shard]]:
        """Each of the adapter's matrices on its projection and output range."""
        placed: dict[str, list[Shard]] = {}
        for module, (a, b) in adapter.weights.items():
            name, start, stop = self._target(module)
            if b.shape[0] != stop - start or a.shape[1] != self._in_features(name):
                raise LoraError(f"the adapter `{adapter.name}`'s {module} is {tuple(b.shape[:1])}x"
                                f"{tuple(a.shape[1:])}, which does not fit the model's projection")
            device = self._device(name)
            placed.setdefault(name, []).append(Shard(a.to(device), (b * adapter.scale).to(device), start, stop))
        return placed

    def _target(self, module: str) -> tuple[str, int, int]:
        """(engine module name, first output row, end) of a PEFT module path."""
        parent, _, leaf = module.rpartition(".")
        fused, shard = getattr(self.model, "packed_modules_mapping", {}).get(leaf, (leaf, 0))
        name = f"{parent}.{fused}"
        if name not in self.projections:
            raise LoraError(f"the adapter targets {module}, which this model does not serve adapters on "
                            f"(only {', '.join(PROJECTIONS)} of the decoder layers)")
        sizes = self._shard_sizes(name, fused)
        start = sum(sizes[:shard])
        return name, start, start + sizes[shard]

    def _shard_sizes(self, name: str, fused: str) -> list[int]:
        cfg: Any = getattr(self.model, "config", None)
        out = self._features(name, "out_features")
        if fused == "qkv_proj" and cfg is not None:
            if cfg.rotary_dim != cfg.head_dim:
                raise LoraError("adapters on q/k of a partial-rotary model are not served (its rows are reordered)")
            q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
            return [q, kv, kv]
        if fused == "gate_up_proj":
            return [out // 2, out // 2]
        return [out]

    def _device(self, name: str) -> torch.device:
        """Where the projection computes (its first tensor's device; the CPU for one with none)."""
        module = self.model.get_submodule(name)
        tensor = next(itertools.chain(module.parameters(), module.buffers()), None)
        return tensor.device if tensor is not None else torch.device("cpu")

    def _in_features(self, name: str) -> int:
        return self._features(name, "in_features")

    def _features(self, name: str, which: str) -> int:
        """A projection's width: nn.Linear and QuantLinear both name theirs in/out_features."""
        value = getattr(self.model.get_submodule(name), which, None)
        if not isinstance(value, int):  # e.g. an MoE block's stacked experts, named like a projection
            raise LoraError(f"{name} is no linear projection; adapters are not served on it")
        return value

    # ---- steps ---------------------------------------------------------
    def slot_of(self, name: str | None) -> int:
        return BASE if name is None else self.slots[name]

    @contextlib.contextmanager
    def applied(self, rows: LoraRows | None) -> Iterator[None]:
        """Run the model's forward with these rows' deltas added."""
        self.rows = rows
        try:
            yield
        finally:
            self.rows = None


def _width(module: nn.Module) -> int:
    """A linear projection's out_features; 0 for a module named like one that is not."""
    value = getattr(module, "out_features", 0)
    return value if isinstance(value, int) else 0


def _kernel_dtype(module: nn.Module) -> torch.dtype:
    """bf16 beside block-quantized weights, whose own rounding is far larger than bf16's on
    the small delta, and it halves the bytes a step reads per adapter; fp32 beside float
    weights, which the adapter's rounding must not move off transformers + PEFT's tokens."""
    return torch.bfloat16 if getattr(module, "blocks", None) is not None else torch.float32
