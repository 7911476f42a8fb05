"""What a loaded engine is, typed: the server shows it on /metrics (cache_config_info, cpu_info,
load_race_info) and in its start-up log, benchmarks print it. Built once by LLMEngine.describe()."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelChoice:
    """What one load-time kernel race chose (engine/tuning/tuning.py lists them)."""

    race: str  # the race's name in the race memory, e.g. big-step-gemm
    key: str  # the shape it was run for, as kept
    choice: str  # the winner's name, or a crossover's token count ("all": the kernel never lost)
    source: str  # "measured" at this start, or "kept" from an earlier one

    def labels(self) -> dict[str, str]:
        """The labels of pagode's load_race_info gauge."""
        return {"race": self.race, "key": self.key, "choice": self.choice, "source": self.source}


@dataclass(frozen=True)
class EngineInfo:
    model: str
    num_blocks: int
    block_size: int
    max_model_len: int
    batching: str  # static, continuous or paged
    device: str
    dtype: str  # the weights' and activations' dtype, e.g. float32
    attention: str  # the attention backend's name
    kv_cache_dtype: str  # fp32, fp16, bf16 or int8
    kv_tokens_per_gib: int
    cpu: str  # the CPU's model name
    cpu_isa: str  # the ISA level the CPU kernels are built for (baseline, avx2, avx512, amx)
    cpu_flags: str  # the ISA flags that matter, space-separated
    kernels: tuple[KernelChoice, ...] = ()  # what the load-time kernel races chose

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def cpu_labels(self) -> dict[str, str]:
        """The labels of pagode's cpu_info gauge."""
        return {"cpu": self.cpu, "isa": self.cpu_isa, "flags": self.cpu_flags}

    def cache_labels(self) -> dict[str, str]:
        """The labels of vLLM's cache_config_info gauge."""
        return {"block_size": str(self.block_size), "num_blocks": str(self.num_blocks),
                "kv_tokens": str(self.kv_tokens), "kv_cache_dtype": self.kv_cache_dtype,
                "kv_tokens_per_gib": str(self.kv_tokens_per_gib)}
