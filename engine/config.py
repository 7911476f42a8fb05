"""Engine configuration: the knobs users of vLLM expect, with the same names."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

import torch

from engine.kv_events_config import KVEventsConfig
from engine.request_limits import RequestCaps
from engine.speculative_config import SpeculativeConfig

# How requests share the batch and the KV cache (engine/core/scheduler.py).
Batching = Literal["paged", "continuous", "static"]
BATCHING_MODES: tuple[Batching, ...] = ("paged", "continuous", "static")
SchedulingPolicy = Literal["fcfs", "priority"]
SCHEDULING_POLICIES: tuple[SchedulingPolicy, ...] = ("fcfs", "priority")

# Every floating-point dtype name the engine takes (--dtype, --kv-cache-dtype), once.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
    "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}
# auto: fp16 on CPU, the model dtype on CUDA (engine/runner/kv_cache.py's resolve_kv_cache_dtype);
# int8 stores each row with its own scale (engine/attention/kv_int8.py).
KV_CACHE_DTYPES = ("auto", "fp32", "fp16", "bf16", "int8")
KV_ONLY_DTYPES: dict[str, torch.dtype] = {"int8": torch.int8}  # cache dtypes that are no model dtype
QUANTIZATION_MODES = ("auto", "none", "int8", "int4")
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_bytes(size: str | int | float) -> int:
    """'360MiB' -> 377487360; numbers are taken as bytes."""
    if isinstance(size, int | float):
        return int(size)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", size)
    if not match or match.group(2).upper() not in _UNITS:
        raise ValueError(f"cannot parse memory size {size!r}; use e.g. '360MiB', '1GiB' or bytes")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    # fp32 is the fast dtype on AVX2 CPUs; bf16 where the GPU supports it.
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def parse_dtype(name: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if name is None or name == "auto":
        return default_dtype(device)
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {sorted(DTYPES)}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """The short name (fp32, fp16, bf16, int8) that flags and logs use."""
    short = {DTYPES.get(name) or KV_ONLY_DTYPES[name]: name for name in KV_CACHE_DTYPES if name != "auto"}
    return short.get(dtype, str(dtype).removeprefix("torch."))


@dataclass
class EngineConfig:
    model: str | None = None  # None: the default SmolLM2-135M-Instruct GGUF
    task: str = "auto"  # auto | generate | embed | score: which runner serves the model (engine/pooling/task.py)
    batching: Batching = "paged"  # paged | continuous | static (engine/core/scheduler.py)
    kv_cache_memory: str | int = "1GiB"
    block_size: int = 16
    max_model_len: int | None = None  # None: the model's context, capped at 2048
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # None: 512 on CPU, 2048 on CUDA
    watermark: float = 0.10
    enable_prefix_caching: bool = True
    dtype: str | None = None
    device: str | None = None
    attention_backend: str | None = None  # cpu | sdpa | triton; env PAGODE_ATTENTION_BACKEND
    seed: int = 0
    enforce_eager: bool = False  # disable CUDA graphs
    request_caps: RequestCaps = field(default_factory=RequestCaps)  # per-request limits
    kv_cache_dtype: str = "auto"  # auto | fp32 | fp16 | bf16 | int8; auto: fp16 on CPU, the model dtype on CUDA
    logprobs_mode: str = "raw_logprobs"  # or processed_logprobs (after bias, penalties, masks)
    quantization: str = "auto"  # auto | none (fp32, exact) | int8 | int4 (engine/quant/modes.py)
    scheduling_policy: SchedulingPolicy = "fcfs"  # priority: waiting queue by (priority, arrival)
    fused_decode_limit: int | None = None  # None: measured at load; N pins the fused C++ step's limit
    speculative_config: SpeculativeConfig | None = None  # None: off (docs/speculative.md)
    kv_events_config: KVEventsConfig | None = None  # None: no KV events (docs/deploy.md)
    warmup: bool = False  # race the kernels again rather than read an earlier start's results
    # Time decode steps at load and cap max_num_seqs where a bigger batch stops paying
    # (engine/tuning/batch_cap.py); pagode serve sets it when neither a flag nor a calibration sizes the batch.
    size_batch: bool = False
    max_itl_ms: float | None = None  # also cap the batch so that a decode step fits this many ms
    # LoRA adapters (docs/models.md#adapters): served at all, how many loaded at once, the
    # highest rank taken, and the ones loaded at start (name -> PEFT folder).
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    lora_modules: dict[str, str] | None = None

    def __post_init__(self) -> None:
        if self.batching not in BATCHING_MODES:
            raise ValueError(f"batching must be one of {BATCHING_MODES}, not {self.batching!r}")
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size must be a power of two")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {SCHEDULING_POLICIES}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError("watermark must be in [0, 1)")
        if self.max_num_batched_tokens is None:
            # A CPU step of 2048 prefill tokens takes seconds and stalls every decode.
            self.max_num_batched_tokens = 2048 if self.torch_device.type == "cuda" else 512
        if self.max_loras < 1 or self.max_lora_rank < 1:
            raise ValueError("max_loras and max_lora_rank must be positive")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be positive")
        parse_bytes(self.kv_cache_memory)
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, not {self.kv_cache_dtype!r}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, not {self.logprobs_mode!r}")
        if self.max_itl_ms is not None and self.max_itl_ms <= 0:
            raise ValueError("max_itl_ms must be positive")
        if self.fused_decode_limit is not None and self.fused_decode_limit < 0:
            raise ValueError("fused_decode_limit must be >= 0 (0 turns the fused step off)")
        if self.kv_events_config is not None and self.kv_events_config.publishes and not self.enable_prefix_caching:
            raise ValueError("kv events describe the prefix cache: they need prefix caching "
                             "(drop --no-enable-prefix-caching)")
        if self.quantization not in QUANTIZATION_MODES:
            raise ValueError(f"quantization must be one of {QUANTIZATION_MODES}, not {self.quantization!r}")

    @property
    def token_budget(self) -> int:
        """max_num_batched_tokens, resolved for the device."""
        assert self.max_num_batched_tokens is not None  # set in __post_init__
        return self.max_num_batched_tokens

    @property
    def kv_cache_bytes(self) -> int:
        return parse_bytes(self.kv_cache_memory)

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device) if self.device else default_device()
