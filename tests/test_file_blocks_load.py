"""A quantized GGUF is built on its own blocks, without an fp32 copy of its matrices: the
loader reads only what is not a block matrix as floats, and each layer's dense copy for big
steps is dequantized from the blocks straight to the GEMM's dtype. The copies must hold the
very bits the fp32 route gave (the fp32 weights, or them rounded to bf16 by torch), and the
C++ dequantizer's bf16 output must be torch's rounding of its fp32 output for every format,
under each ISA cap this CPU allows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from converter_files import quantize
from gguf import GGMLQuantizationType
from test_converter_gguf import LLAMA3_256
from tiny_models import TinyZoo

from cpu_kernels.dequantize import BLOCKS
from engine import native
from engine.quant.linear import QuantLinear

FORMATS = [GGMLQuantizationType(t) for t in BLOCKS]


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("qtype", FORMATS, ids=[t.name for t in FORMATS])
def test_blocks_decode_to_bf16_as_torch_rounds_their_fp32(qtype: GGMLQuantizationType, isa_cap: str) -> None:
    """Random bytes: every bit pattern of levels and scales, fp16 subnormals, infinities and
    NaNs (torch turns every NaN into 0xffff) included."""
    kernel = native.dequantizer()
    assert kernel is not None
    _, nbytes = BLOCKS[int(qtype)]
    raw = np.random.default_rng(int(qtype)).integers(0, 256, size=(37, 5 * nbytes), dtype=np.uint8)
    fp32, bf16 = kernel(raw, int(qtype)), kernel(raw, int(qtype), torch.bfloat16)
    assert fp32 is not None and bf16 is not None and bf16.dtype == torch.bfloat16
    assert torch.equal(bf16.view(torch.int16), fp32.to(torch.bfloat16).view(torch.int16))


def test_into_a_slice_of_a_fused_weight() -> None:
    """A shard is written in place into its rows of a fused weight, and nothing beside them."""
    kernel = native.dequantizer()
    assert kernel is not None
    raw = np.random.default_rng(0).integers(0, 60, size=(4, 2 * 34), dtype=np.uint8)  # finite fp16 scales
    out = torch.full((3, 4 * 64), 7.0)
    kernel(raw[:1], int(GGMLQuantizationType.Q8_0), out=out[1].view(-1)[:64])
    want = kernel(raw[:1], int(GGMLQuantizationType.Q8_0))
    assert want is not None and torch.equal(out[1, :64], want) and bool((out[0] == 7).all())
    with pytest.raises(ValueError, match="contiguous"):
        kernel(raw, int(GGMLQuantizationType.Q8_0), out=torch.empty(3))


@pytest.mark.parametrize("gemm", ["bf16", "fp32"])
def test_a_k_quant_file_is_built_without_its_matrices_as_floats(tiny_zoo: TinyZoo, gemm: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A Q4_K_M file under `auto`, every layer keeping a dense GEMM (the crossover pinned to 0):
    the loader dequantizes no matrix the blocks stand for, and each dense copy equals the
    file's fp32 weights (bf16: rounded by torch), fused and in HF row order."""
    from engine.attention import select_backend
    from engine.model import loader
    from engine.model.gguf_file import GGUFModel
    from engine.model.weights import _map_name
    from engine.tuning import gemm_choice, kernel_crossover

    monkeypatch.setenv("PAGODE_QUANT_GEMM", gemm)
    monkeypatch.setenv("PAGODE_QUANT_CROSSOVER", "0")
    monkeypatch.setattr(kernel_crossover, "_cache", {})
    monkeypatch.setattr(gemm_choice, "_winners", {})
    path = quantize(tiny_zoo, LLAMA3_256, "Q4_K_M")
    source = loader.ModelSource(path, path.stem)
    cfg = loader.read_config(source)
    read: list[str] = []
    weights = GGUFModel.weights

    def spy(self: GGUFModel, skip: object = ()) -> object:
        for name, tensor in weights(self, skip):  # type: ignore[arg-type]
            read.append(name)
            yield name, tensor

    monkeypatch.setattr(GGUFModel, "weights", spy)
    model, _ = loader.build_model(source, cfg, select_backend(None, torch.device("cpu")), 64, torch.float32,
                                  torch.device("cpu"), "auto", 64)
    monkeypatch.setattr(GGUFModel, "weights", weights)
    assert not [n for n in read if "_proj." in n], read  # no projection was read as floats
    fused: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in GGUFModel(path).weights():  # the fp32 route's values, shards in the file's order
        target, shard = _map_name(name.removeprefix("model."), model.packed_modules_mapping)
        fused.setdefault(target.removesuffix(".weight"), {})[shard or 0] = tensor
    checked = 0
    for name, layer in model.named_modules():
        if isinstance(layer, QuantLinear) and name in fused:
            assert layer.gemm is not None and layer.gemm.name == gemm, name
            want = torch.cat([fused[name][i] for i in sorted(fused[name])])
            got = layer.gemm.weight  # type: ignore[union-attr]
            if gemm == "bf16":
                assert torch.equal(got.view(torch.int16), want.to(torch.bfloat16).view(torch.int16)), name
            else:
                assert torch.equal(got, want), name
            checked += 1
    assert checked >= 7 * cfg.num_hidden_layers // 2
