"""The CPU kernels' GGUF dequantizer (cpu_kernels/src/dequantize.cpp) against gguf-py's own
`dequantize`, under each ISA cap this CPU allows: the same fp32 bits for every block of every
format it decodes, over random bytes (every bit pattern of levels, scales and minima, fp16
subnormals, infinities and NaNs included) and over a file written by llama-quantize."""

from __future__ import annotations

import numpy as np
import pytest
from converter_files import quantize
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from test_converter_gguf import FAMILIES
from tiny_models import TinyZoo

from cpu_kernels.dequantize import BLOCKS
from engine import native
from engine.model.gguf_file import GGUFModel, dequantized

FORMATS = [GGMLQuantizationType(t) for t in BLOCKS]


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # gguf-py on NaN and infinite scales
@pytest.mark.parametrize("qtype", FORMATS, ids=[t.name for t in FORMATS])
def test_random_blocks_decode_to_gguf_pys_bits(qtype: GGMLQuantizationType, isa_cap: str) -> None:
    kernel = native.dequantizer()
    assert kernel is not None
    _, nbytes = BLOCKS[int(qtype)]
    raw = np.random.default_rng(int(qtype)).integers(0, 256, size=(37, 5 * nbytes), dtype=np.uint8)
    got = kernel(raw, int(qtype))
    assert got is not None
    want = dequantize(raw, qtype).reshape(-1)
    assert np.array_equal(got.numpy(), want, equal_nan=True)


def test_a_type_it_does_not_decode_is_left_to_gguf_py() -> None:
    kernel = native.dequantizer()
    assert kernel is not None
    assert kernel(np.zeros((1, 110), dtype=np.uint8), int(GGMLQuantizationType.IQ4_XS)) is None


def test_a_converter_written_file_loads_with_gguf_pys_weights(tiny_zoo: TinyZoo) -> None:
    """Every tensor of a llama-quantize Q4_K_M file as the loader reads it: at a tiny model's
    sizes (rows shorter than a super-block) the Q5_0 and Q8_0 that Q4_K_M falls back to; the
    K-quants' every bit pattern is the random blocks' test above."""
    spec = next(s for s in FAMILIES if s.name == "cv-qwen3")
    kinds = set()
    for t in GGUFModel(quantize(tiny_zoo, spec, "Q4_K_M")).weight_tensors():
        kinds.add(t.tensor_type.name)
        want = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
        assert np.array_equal(dequantized(t).numpy(), want), t.name
    assert {"Q5_0", "Q8_0"} <= kinds
