"""A Qwen3-Embedding-style folder written as GGUF by llama.cpp's own convert_hf_to_gguf.py
(which records the last-token pooling as `qwen3.pooling_type` 3): served from the file, its
embeddings equal sentence-transformers' on the folder, exactly from F32 and within the int8
gate from Q8_0 under --quantization none, and within the bf16 gate from F32, F16 and Q8_0
under the default auto. GGUF encoders (bert, nomic-bert) are refused by name: the converter hashes how
a tokenizer splits a fixed text, BERT's WordPiece included, and takes only hashes of real
models' vocabularies, none of which is reachable here (docs/embeddings.md, "Not done yet")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from converter_files import llama_cpp_tool, run
from pooling_zoo import build_qwen3_embedder

from engine.config import EngineConfig
from engine.pooling.gguf_spec import gguf_pooling_type
from engine.pooling.inputs import encode_text
from engine.pooling.packed_decoder import PackedDecoder
from engine.pooling.pooling_model import PoolingModel
from engine.pooling.precision import QUALITY_GATE
from engine.pooling.task import resolve_task
from engine.tuning.gemm_choice import bf16_can_win

TEXTS = ["paris", "the cat sat on the mat", "what is the capital of france where the river is blue", "dog ran far"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen3_embedder(tmp_path_factory.mktemp("qwen3-embedding"), smollm_tokenizer=True)


def converted(folder: Path, outtype: str) -> Path:
    out = folder.parent / f"{folder.name}.{outtype}.gguf"
    if not out.exists():
        run([sys.executable, llama_cpp_tool("converter"), str(folder), "--outtype", outtype, "--outfile", str(out)])
    return out


@pytest.mark.parametrize(("outtype", "cosine", "max_abs"), [("f32", 0.99999, 1e-5), ("q8_0", 0.999, 1.0)])
def test_converter_gguf_embeds_as_sentence_transformers(folder: Path, outtype: str, cosine: float,
                                                        max_abs: float) -> None:
    from sentence_transformers import SentenceTransformer

    path = converted(folder, outtype)
    config = EngineConfig(model=str(path), quantization="none")
    assert gguf_pooling_type(path) == 3 and resolve_task(config) == "embed"
    model = PoolingModel(config, "embed")
    assert (model.spec.pooling, model.spec.normalize) == ("last", True)
    want = torch.tensor(SentenceTransformer(str(folder), device="cpu").encode(TEXTS))
    got = torch.stack(model.embed([encode_text(model.tokenizer, t, None) for t in TEXTS]))
    similarity = F.cosine_similarity(got, want).min().item()
    assert similarity >= cosine and (got - want).abs().max().item() <= max_abs, similarity
    if outtype == "q8_0":
        assert similarity < 0.99999  # the file's Q8_0 weights did reach the model


@pytest.mark.parametrize("outtype", ["f32", "f16", "q8_0"])
def test_converter_gguf_embeds_within_the_gate_under_auto(folder: Path, outtype: str) -> None:
    """The default --quantization auto reads the file's weights (dequantized) into the packed
    decoder and, on a CPU with bf16 matrix units, runs its products in bf16 where the load-time
    probe holds the gate: the embeddings keep cosine >= 0.999 to encode on the folder."""
    from sentence_transformers import SentenceTransformer

    model = PoolingModel(EngineConfig(model=str(converted(folder, outtype))), "embed")
    assert isinstance(model.decoder, PackedDecoder)
    assert model.precision == ("bf16" if bf16_can_win() else "fp32")
    want = torch.tensor(SentenceTransformer(str(folder), device="cpu").encode(TEXTS))
    got = torch.stack(model.embed([encode_text(model.tokenizer, t, None) for t in TEXTS]))
    similarity = F.cosine_similarity(got, want).min().item()
    print(f"{outtype}, auto: {model.precision}, probe cosine {model.probe_cosine}, min cosine to encode {similarity}")
    assert similarity >= QUALITY_GATE


def test_gguf_encoders_are_refused_by_name(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "bert.gguf"
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_pooling_type(gguf.PoolingType.CLS)
    writer.add_tensor("token_embd.weight", torch.zeros(8, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    config = EngineConfig(model=str(path), quantization="none")
    assert resolve_task(config) == "embed"
    with pytest.raises(ValueError, match="GGUF bert encoders are not supported yet"):
        PoolingModel(config, "embed")
