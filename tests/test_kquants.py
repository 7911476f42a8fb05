"""K-quant GGUFs (the Q4_K_M mix, the most downloaded GGUF there is): the engine loads their
Q4_K and Q6_K blocks and gives transformers' greedy tokens on the weights they stand for.

gguf-py reads K-quants but cannot write them, so tests/kquants.py packs them; its bytes are
checked here against gguf-py's dequantize (llama.cpp's layout), then a tiny llama with
256-wide rows (K-quant super-blocks are 256 long) is written in the Q4_K_M mix.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
from kquants import QUANTIZERS
from test_family_quantization import ARGS, TEXT_TOKENS, assert_passes_gate, dequantized_folder, read
from tiny_models import TinyZoo, assert_engine_matches, cached_greedy, one_torch_thread, prompts, tiny_spec

from engine import LLM
from engine.tuning import kernel_crossover

# K-quants need rows that are a multiple of 256; head_dim 64 keeps 4 query heads over 2 KV heads.
LLAMA_256 = tiny_spec("llama-256", "LlamaConfig", "LlamaForCausalLM", "llama", hidden_size=256,
                      intermediate_size=512, initializer_range=0.05)
# Relative RMS error of plain nearest rounding on Gaussian weights: 4 and 6 bits per weight.
MAX_ERROR = {"Q4_K": 0.12, "Q6_K": 0.03}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.mark.parametrize("kind", sorted(QUANTIZERS))
def test_kquant_bytes_decode_as_llama_cpp_reads_them(kind: str) -> None:
    """gguf-py's dequantize of the packed bytes gives exactly the values the quantizer meant,
    and those are the weights to within the format's rounding (an all-zero super-block and
    an all-positive row included: Q4_K's min must be used, Q6_K's signed scales too)."""
    import gguf
    from gguf.quants import dequantize

    w = np.random.default_rng(0).normal(0, 0.2, (6, 512)).astype(np.float32)
    w[0, :256] = 0.0
    w[1] = np.abs(w[1]) + 0.5
    w[2] = -np.abs(w[2])
    ggml_type = gguf.GGMLQuantizationType[kind]
    blocks, values = QUANTIZERS[kind](w)
    assert blocks.dtype == np.uint8 and blocks.shape == (6, 2 * gguf.GGML_QUANT_SIZES[ggml_type][1])
    decoded = dequantize(blocks, ggml_type).reshape(w.shape)
    np.testing.assert_array_equal(decoded, values)
    assert np.all(values[0, :256] == 0.0)
    rows = np.sqrt(((values - w) ** 2).mean(1)) / np.sqrt((w ** 2).mean(1))
    assert rows[1:].max() < MAX_ERROR[kind], rows


def test_q4_k_m_gguf_matches_transformers(tiny_zoo: TinyZoo) -> None:
    """Q4_K for most matrices, Q6_K for the output and the last layer's attn_v and ffn_down
    (llama.cpp's mix for 2 layers); the reference is transformers on the weights gguf-py reads
    back, which are exactly what transformers' own GGUF loader makes of the file."""
    import torch
    from transformers import AutoModelForCausalLM

    from engine.model.gguf_file import GGUFModel

    path, reference = tiny_zoo.gguf(LLAMA_256, "Q4_K_M")
    kinds = {t.name: t.tensor_type.name for t in GGUFModel(path).reader.tensors}
    assert Counter(k for k in kinds.values() if k != "F32") == {"Q4_K": 13, "Q6_K": 3}
    assert kinds["output.weight"] == kinds["blk.1.attn_v.weight"] == kinds["blk.1.ffn_down.weight"] == "Q6_K"
    assert kinds["blk.0.ffn_down.weight"] == kinds["token_embd.weight"] == "Q4_K"
    loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    got, expected = loaded.state_dict(), reference.state_dict()
    assert got.keys() == expected.keys() and all(torch.equal(t, expected[n]) for n, t in got.items())
    assert_engine_matches(path, reference)


def test_a_k_quant_gguf_is_requantized_for_int8_int4_and_says_so(
        tiny_zoo: TinyZoo, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """int8 and int4 asked for by name store their own formats: a K-quant file's matrices are
    dequantized and requantized, the start-up log says which, and int8/int4 pass the gate
    against fp32 on the file's own weights rounded once more into the mode's blocks (`auto`
    keeps the file's blocks: tests/test_converter_gguf.py)."""
    monkeypatch.setattr(kernel_crossover, "_cache", {})
    monkeypatch.setenv("PAGODE_QUANT_CROSSOVER", "16")
    path, reference = tiny_zoo.gguf(LLAMA_256, "Q4_K_M")
    prompt = prompts(1, seed=1)[0]
    ids = prompt + cached_greedy(reference, prompt, TEXT_TOKENS)
    for mode in ("int8", "int4"):
        rounded = read(LLM(model=str(dequantized_folder(tiny_zoo, LLAMA_256, mode, reference, "-q4_k_m")),
                           quantization="none", **ARGS), ids)  # type: ignore[arg-type]
        with caplog.at_level(logging.INFO, logger="pagode"):
            llm = LLM(model=str(path), quantization=mode, **ARGS)  # type: ignore[arg-type]
        assert (f"quantization: {mode}: the file's 13 Q4_K tensors, 3 Q6_K tensors are dequantized and "
                "requantized") in caplog.text
        assert_passes_gate(llm, ids, rounded, f"llama Q4_K_M GGUF {mode}", mode)
