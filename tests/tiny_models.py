"""Small random-weight checkpoints of any family: HF folders, the same weights as GGUF files,
and the check that the engine's greedy output equals transformers' on them.

To add a family: a `TinySpec` naming its transformers config and model classes, the config
overrides that exercise its features, and its GGUF arch; then
`assert_family_matches(zoo, spec)` (tests/test_families.py). The GGUF writer names tensors
with gguf-py's own TensorNameMap and permutes Q/K rows as llama.cpp's converter does, so
the engine's GGUF reader is checked against llama.cpp's conventions, not against itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from chat_tokenizer import save_chat_tokenizer
from kquants import QUANTIZERS, q4_k_m_kind
from reference import assert_greedy_match, reference_greedy
from tiny_moe import stacked_expert_tensors, write_moe_metadata

WORDS = 200
VOCAB = WORDS + 3
# Tiny but GQA, with every projection's input a multiple of 32 so Q8_0 applies everywhere.
COMMON: dict[str, Any] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256,
                              bos_token_id=1, eos_token_id=2, rope_theta=5000.0, initializer_range=0.2)
# llama.cpp's converter interleaves Q/K rotary halves for NORM-RoPE arches only
# (llama_model_rope_type); NEOX arches (qwen2/3, phi3, olmo2, gemma) keep HF's row order.
PERMUTED_ARCHS = ("llama", "granite", "smollm3")
PLUS_ONE_NORM_ARCHS = ("gemma2", "gemma3")  # llama.cpp's converter stores Gemma norm weights as 1 + w


def save_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials + [f"w{i}" for i in range(WORDS)])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                  eos_token="</s>")
    tok.chat_template = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    tok.save_pretrained(path)


def save_tiny_model(path: Path, arch: str = "llama", tie: bool = False) -> torch.nn.Module:
    """A 2-layer GQA model (4 query heads over 2 KV heads); Qwen2 adds Q/K/V bias."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(COMMON, tie_word_embeddings=tie)
    torch.manual_seed(0)
    if arch == "qwen2":
        model: torch.nn.Module = Qwen2ForCausalLM(Qwen2Config(**common))
        with torch.no_grad():  # random biases, so a loader that drops them fails
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    model.save_pretrained(path)
    save_tokenizer(path)
    return model.eval()


@dataclass(frozen=True)
class TinySpec:
    """One tiny checkpoint: a transformers config class + overrides, and how it is saved."""

    name: str  # a label for test ids
    config_class: str  # e.g. "Qwen3Config"
    model_class: str  # e.g. "Qwen3ForCausalLM"
    gguf_arch: str | None = None  # llama.cpp arch; None: no GGUF for this spec
    overrides_json: str = "{}"
    dtype: str = "float32"  # the checkpoint's dtype (bfloat16, float16 too)
    max_shard_size: str | None = None  # e.g. "20KB": sharded, with model.safetensors.index.json
    gguf_meta: tuple[tuple[str, Any], ...] = ()  # extra GGUF keys: (GGUFWriter method, value)
    # (chat template file, BOS, EOS): a byte-level tokenizer that chats (tests/chat_tokenizer.py)
    # instead of the word-level one; the config's vocab_size must then be CHAT_VOCAB.
    chat: tuple[str, str, str] | None = None

    @property
    def overrides(self) -> dict[str, Any]:
        return dict(json.loads(self.overrides_json))

    @property
    def key(self) -> str:
        return hashlib.sha256(repr(self).encode()).hexdigest()[:12]


def tiny_spec(name: str, config_class: str, model_class: str, gguf_arch: str | None = None, *,
              dtype: str = "float32", max_shard_size: str | None = None,
              gguf_meta: tuple[tuple[str, Any], ...] = (), **overrides: Any) -> TinySpec:
    return TinySpec(name, config_class, model_class, gguf_arch, json.dumps(overrides, sort_keys=True), dtype,
                    max_shard_size, gguf_meta)


@dataclass
class TinyZoo:
    """Builds each spec's folder and GGUF once per test session, under one tmp dir."""

    root: Path
    references: dict[str, torch.nn.Module] = field(default_factory=dict)

    def folder(self, spec: TinySpec) -> Path:
        path = self.root / f"{spec.name}-{spec.key}"
        if not (path / "config.json").exists():
            build_folder(path, spec)
        return path

    def reference(self, spec: TinySpec) -> torch.nn.Module:
        """transformers' model loaded back from the folder, in fp32."""
        if spec.key not in self.references:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(self.folder(spec)), dtype=torch.float32)
            model.generation_config.eos_token_id = None  # the engine runs with ignore_eos
            self.references[spec.key] = model.eval()
        return self.references[spec.key]

    def gguf(self, spec: TinySpec, quant: str = "Q8_0") -> tuple[Path, torch.nn.Module]:
        """(the .gguf file, transformers' model on the weights the file stands for)."""
        assert spec.gguf_arch is not None, f"{spec.name} has no GGUF arch"
        path = self.root / f"{spec.name}-{spec.key}.{quant}.gguf"
        ref_key = f"{spec.key}.{quant}"
        if quant == "F32" and not path.exists():
            write_gguf(path, self.reference(spec), spec, quant)
            self.references[ref_key] = self.reference(spec)  # the very same weights
        if ref_key not in self.references:
            model = self.reference(spec)
            dequantized = write_gguf(path, model, spec, quant)
            copy = type(model)(model.config)
            copy.load_state_dict(dequantized, strict=False)
            copy.generation_config.eos_token_id = None
            if model.config.tie_word_embeddings:
                copy.tie_weights()
            self.references[ref_key] = copy.eval()
        return path, self.references[ref_key]


def build_folder(path: Path, spec: TinySpec) -> None:
    import transformers

    config = getattr(transformers, spec.config_class)(**{**COMMON, **spec.overrides})
    torch.manual_seed(0)
    model = getattr(transformers, spec.model_class)(config)
    randomize_norms_and_biases(model)
    model = model.to(getattr(torch, spec.dtype))
    kwargs = {"max_shard_size": spec.max_shard_size} if spec.max_shard_size else {}
    model.save_pretrained(path, **kwargs)
    if spec.chat is None:
        save_tokenizer(path)
    else:
        template, bos, eos = spec.chat
        save_chat_tokenizer(path, Path(template).read_text(), bos, eos)


@torch.no_grad()
def randomize_norms_and_biases(model: torch.nn.Module) -> None:
    """Norm weights start at 1 and biases at 0: a loader that dropped them would still pass."""
    for name, param in model.named_parameters():
        if param.dim() == 1 and "norm" in name:
            param.normal_(1.0, 0.3)
        elif name.endswith(".bias"):
            param.normal_(0.0, 0.5)


def write_gguf(path: Path, model: torch.nn.Module, spec: TinySpec, quant: str) -> dict[str, torch.Tensor]:
    """Write `model` as llama.cpp would; returns the HF state dict the file stands for."""
    import gguf

    cfg = model.config
    arch = spec.gguf_arch
    assert arch is not None
    names = gguf.get_tensor_name_map(_model_arch(arch), cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    write_metadata(writer, cfg, spec)
    dequantized: dict[str, torch.Tensor] = {}
    for hf, tensor in model.state_dict().items():
        if hf == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        experts = stacked_expert_tensors(hf, tensor)
        if experts is not None:  # 3-D, so F32 whatever `quant` says, as _encode keeps it
            dequantized[hf] = tensor.float()
            for part, stacked in experts:
                writer.add_tensor(f"{names.get_name(part)}.weight", stacked)
            continue
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert name is not None, f"gguf-py has no {arch} name for {hf}"
        data = tensor.float().numpy()
        kind = tensor_kind(name, quant, cfg.num_hidden_layers)
        if arch in PLUS_ONE_NORM_ARCHS and hf.endswith("norm.weight"):
            data = data + 1.0  # what the file stands for is still w: the engine takes the 1 off
            data, _ = _encode(data, kind)
            dequantized[hf] = tensor.float().clone()
        else:
            data, dequantized[hf] = _encode(data, kind)
        if arch in PERMUTED_ARCHS and hf.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg.num_attention_heads if "q_proj" in hf else cfg.num_key_value_heads
            data = _permute_blocks(data, heads)
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[kind] if data.dtype == np.uint8 else None)
    for name, values in rope_tensors(cfg, spec):
        writer.add_tensor(name, np.asarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dequantized


def _model_arch(arch: str) -> Any:
    import gguf

    return next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)


def tensor_kind(name: str, quant: str, layers: int) -> str:
    """The GGML type of tensor `name` in a file of type `quant` (a mix such as Q4_K_M picks per tensor)."""
    if quant != "Q4_K_M":
        return quant
    layer = int(name.split(".")[1]) if name.startswith("blk.") else 0
    return q4_k_m_kind(name, layer, layers)


def _encode(data: np.ndarray, quant: str) -> tuple[np.ndarray, torch.Tensor]:
    """(what to write, the fp32 values it decodes to, as gguf-py reads them): 2-D weights in
    `quant`, the rest F32."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    block = 256 if quant.endswith("_K") else 32
    if quant == "F32" or data.ndim != 2 or data.shape[1] % block:
        return data, torch.from_numpy(data.copy())
    kind = GGMLQuantizationType[quant]
    blocks = QUANTIZERS[quant](data)[0] if quant in QUANTIZERS else quantize(data, kind)
    return blocks, torch.from_numpy(np.array(dequantize(blocks, kind), dtype=np.float32).reshape(data.shape))


def _permute_blocks(data: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute, on rows (whole rows move, so quantized rows work too)."""
    rows = np.arange(data.shape[0])
    order = rows.reshape(heads, 2, data.shape[0] // heads // 2).swapaxes(1, 2).reshape(-1)
    return data[order]


def write_metadata(writer: Any, cfg: Any, spec: TinySpec) -> None:
    import gguf

    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(float(_rope(cfg).get("rope_theta", 10000.0)))
    writer.add_vocab_size(cfg.vocab_size)
    write_moe_metadata(writer, cfg)
    for method, value in spec.gguf_meta:
        getattr(writer, method)(gguf.RopeScalingType(value) if method == "add_rope_scaling_type" else value)
    write_tokenizer(writer)


def _rope(cfg: Any) -> dict[str, Any]:
    return dict(getattr(cfg, "rope_parameters", None) or {})


def rope_tensors(cfg: Any, spec: TinySpec) -> list[tuple[str, list[float]]]:
    """RoPE facts llama.cpp keeps as tensors: llama3's per-dimension divisors (rope_freqs,
    as convert_hf_to_gguf.py computes them) and Phi-3's LongRoPE factors."""
    import math

    rope = _rope(cfg)
    if rope.get("rope_type") == "llama3":
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        base, factor = rope["rope_theta"], rope["factor"]
        low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
        old = rope["original_max_position_embeddings"]
        freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        out = []
        for freq in freqs.tolist():
            wavelen = 2 * math.pi / freq
            if wavelen < old / high:
                out.append(1.0)
            elif wavelen > old / low:
                out.append(factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                out.append(1 / ((1 - smooth) / factor + smooth))
        return [("rope_freqs", out)]
    if rope.get("rope_type") == "longrope":
        return [("rope_factors_long", rope["long_factor"]), ("rope_factors_short", rope["short_factor"])]
    return []


def write_tokenizer(writer: Any) -> None:
    """A gpt2-type vocabulary of the tiny tokenizer's words (token ids are what the tests use)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(WORDS)]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * WORDS)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Tiny models on one thread: their matmuls are microseconds, and on a shared machine
    torch's thread pool spends far longer waking its threads than computing."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---- the equality check --------------------------------------------------------------------

NEW_TOKENS = 64


def prompts(n: int = 4, seed: int = 0) -> list[list[int]]:
    """n prompts of distinct lengths (10 to 34 tokens), BOS first."""
    gen = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(3, VOCAB, (9 + 8 * i,), generator=gen).tolist() for i in range(n)]


def preempting_cache_bytes(path: Path, ids: list[list[int]], new_tokens: int) -> int:
    """A KV cache about 60% of what all sequences need at once, so that some are preempted
    (the longest still fits alone)."""
    from engine.model.loader import read_config, resolve_model
    from engine.runner.kv_cache import bytes_per_block

    cfg = read_config(resolve_model(str(path)))
    blocks = sum(-(-(len(p) + new_tokens) // 16) for p in ids)
    longest = max(-(-(len(p) + new_tokens) // 16) for p in ids)
    return bytes_per_block(cfg, 16, torch.float32) * max(longest + 1, blocks * 6 // 10)


_greedy: dict[tuple[int, tuple[int, ...], int], list[int]] = {}


def cached_greedy(reference: torch.nn.Module, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy output, once per session per model and prompt (the zoo keeps each
    reference model alive, so its id stays its own)."""
    key = (id(reference), tuple(prompt), new_tokens)
    if key not in _greedy:
        _greedy[key] = reference_greedy(reference, prompt, new_tokens, None)
    return _greedy[key]


def assert_engine_matches(path: Path, reference: torch.nn.Module, new_tokens: int = NEW_TOKENS,
                          max_model_len: int = 128, **engine_args: Any) -> Any:
    """Greedy output of the engine loaded from `path` (folder or .gguf) equals transformers'
    on `reference`, over several prompts batched in a paged fp32 cache that forces preemption.
    Returns the engine (LLM) for further checks."""
    from engine import LLM, SamplingParams

    ids = prompts()
    args: dict[str, Any] = dict(kv_cache_memory=preempting_cache_bytes(path, ids, new_tokens),
                                max_model_len=max_model_len, kv_cache_dtype="fp32", quantization="none")
    args.update(engine_args)
    llm = LLM(model=str(path), **args)
    outs = llm.generate(ids, SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True))
    for prompt, out in zip(ids, outs, strict=True):
        ref = cached_greedy(reference, prompt, new_tokens)
        assert_greedy_match(reference, prompt, out.token_ids, ref)
    if "kv_cache_memory" not in engine_args:
        assert llm.engine.stats().num_preemptions_total > 0, "the cache was meant to force a preemption"
    return llm
