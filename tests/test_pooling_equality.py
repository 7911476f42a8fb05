"""pagode's pooling models against the reference libraries on the same tiny random weights:
embeddings equal sentence-transformers' `encode`, cross-encoder scores `CrossEncoder.predict`,
and a Qwen3 yes/no reranker transformers' own logits. Under --quantization none, fp32
throughout: cosine >= 0.99999 and the max abs difference is asserted (measured at most 2.4e-7
for the encoders, 6e-7 for Qwen3). Under auto, bf16 products where the CPU has bf16 matrix
units, held to the 0.999 gate."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pooling_zoo import (
    QUERY_PROMPT,
    build_bert,
    build_cross_encoder,
    build_modernbert,
    build_nomic,
    build_qwen3_embedder,
    build_qwen3_reranker,
    build_xlmr,
)

from engine.config import EngineConfig
from engine.pooling import precision
from engine.pooling.checkpoint import detect_task
from engine.pooling.decoder import DecoderPooler
from engine.pooling.inputs import encode_pair, encode_text
from engine.pooling.packed_decoder import PackedDecoder
from engine.pooling.pooling_model import PoolingModel
from engine.pooling.precision import QUALITY_GATE
from engine.tuning.gemm_choice import bf16_can_win

EMBEDDERS: dict[str, Callable[[Path], Path]] = {"bert": build_bert, "xlm-roberta": build_xlmr,
                                                "nomic-bert": build_nomic, "modernbert": build_modernbert,
                                                "qwen3": build_qwen3_embedder}
# Mixed lengths, so that a batch pads: one word to ~40 tokens (letters become word pieces).
TEXTS = ["paris", "the cat sat on the mat", "what is the capital of france where the river is blue",
         "dog", "a city far far on a river of blue sky and the cat ran to the dog on the mat again and again",
         "search query passage"]
COSINE = 0.99999
MAX_ABS = 1e-5
SMALL_BUDGET = 64  # forces several forwards per request: batches must not change the numbers


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Callable[[Path], Path]], Path]:
    root = tmp_path_factory.mktemp("pooling-zoo")
    built: dict[str, Path] = {}

    def folder(name: str, build: Callable[[Path], Path]) -> Path:
        if name not in built:
            path = root / name
            path.mkdir()
            built[name] = build(path)
        return built[name]

    return folder


def pagode(folder: Path, task: str, budget: int = 512) -> PoolingModel:
    return PoolingModel(EngineConfig(model=str(folder), quantization="none", max_num_batched_tokens=budget), task)


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    cosine = F.cosine_similarity(got, want, dim=-1)
    diff = (got - want).abs().max().item()
    assert cosine.min().item() >= COSINE and diff <= MAX_ABS, (cosine, diff)


@pytest.mark.parametrize("arch", list(EMBEDDERS))
def test_embeddings_equal_sentence_transformers(zoo: Callable[..., Path], arch: str) -> None:
    from sentence_transformers import SentenceTransformer

    folder = zoo(arch, EMBEDDERS[arch])
    assert detect_task(folder) == "embed"
    reference = SentenceTransformer(str(folder), device="cpu")
    batched = torch.tensor(reference.encode(TEXTS, batch_size=len(TEXTS)))
    for budget in (512, SMALL_BUDGET):
        model = pagode(folder, "embed", budget)
        got = torch.stack(model.embed([encode_text(model.tokenizer, t, None) for t in TEXTS]))
        assert_close(got, batched)
    single = torch.stack(model.embed([encode_text(model.tokenizer, TEXTS[2], None)]))
    assert_close(single, torch.tensor(reference.encode([TEXTS[2]])))


@pytest.mark.parametrize("arch", ["bert", "qwen3"])
def test_matryoshka_dimensions_truncate_then_renormalize(zoo: Callable[..., Path], arch: str) -> None:
    from sentence_transformers import SentenceTransformer

    from engine.pooling.pooler import shorten

    folder = zoo(arch, EMBEDDERS[arch])
    reference = SentenceTransformer(str(folder), device="cpu")
    want = torch.tensor(reference.encode(TEXTS, truncate_dim=16, normalize_embeddings=True))
    model = pagode(folder, "embed")
    got = torch.stack([shorten(v, 16) for v in model.embed([encode_text(model.tokenizer, t, None) for t in TEXTS])])
    assert got.shape == (len(TEXTS), 16)
    assert_close(got, want)
    assert torch.allclose(got.norm(dim=-1), torch.ones(len(TEXTS)))


def test_prompts_come_from_the_sentence_transformers_config(zoo: Callable[..., Path]) -> None:
    from sentence_transformers import SentenceTransformer

    folder = zoo("qwen3", build_qwen3_embedder)
    model = pagode(folder, "embed")
    assert model.spec.prompts["query"] == QUERY_PROMPT and model.spec.pooling == "last" and model.spec.normalize
    want = torch.tensor(SentenceTransformer(str(folder), device="cpu").encode(TEXTS[:3], prompt_name="query"))
    got = torch.stack(model.embed([encode_text(model.tokenizer, QUERY_PROMPT + t, None) for t in TEXTS[:3]]))
    assert_close(got, want)


@pytest.mark.parametrize("arch", ["bert", "xlmr", "modernbert"])
def test_cross_encoder_scores_equal_cross_encoder_predict(zoo: Callable[..., Path], arch: str) -> None:
    from sentence_transformers import CrossEncoder

    folder = zoo(f"cross-{arch}", lambda p: build_cross_encoder(p, arch))
    assert detect_task(folder) == "score"
    pairs = [("what is the capital of france", t) for t in TEXTS]
    want = torch.tensor(CrossEncoder(str(folder), device="cpu").predict(pairs))
    model = pagode(folder, "score", SMALL_BUDGET)
    got = torch.stack(model.score([encode_pair(model.tokenizer, model.spec, q, d, None) for q, d in pairs]))
    assert (got - want).abs().max().item() <= MAX_ABS, (got, want)
    assert len(set(got.tolist())) == len(pairs)  # the pairs score apart: the test can tell them apart


# Under auto, the scores' largest difference to transformers' fp32 ones (measured 0.010 on
# these random weights, whose last states keep a probe cosine of 0.99986 in bf16).
RERANK_BF16_MAX_ABS = 0.02


@pytest.mark.parametrize("quantization", ["none", "auto"])
def test_qwen3_reranker_scores_equal_transformers_yes_no_logits(zoo: Callable[..., Path], quantization: str) -> None:
    """Exact under none; under auto, bf16 products where the CPU has them, within
    RERANK_BF16_MAX_ABS of transformers' scores."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = zoo("qwen3-reranker", build_qwen3_reranker)
    assert detect_task(folder) == "score"
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    reference = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    query = "what is the capital of france"
    want = []
    for doc in TEXTS:
        # Qwen3-Reranker's model card prompt, written out here rather than taken from pagode.
        text = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and "
                "the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
                "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer "
                f"the query\n<Query>: {query}\n<Document>: {doc}<|im_end|>\n<|im_start|>assistant\n<think>\n\n"
                "</think>\n\n")
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            last = reference(ids).logits[0, -1]
        want.append(torch.sigmoid(last[yes] - last[no]).item())
    model = PoolingModel(EngineConfig(model=str(folder), quantization=quantization,
                                      max_num_batched_tokens=SMALL_BUDGET), "score")
    assert isinstance(model.decoder, PackedDecoder)
    got = torch.stack(model.score([encode_pair(model.tokenizer, model.spec, query, d, None) for d in TEXTS]))
    diff = (got - torch.tensor(want)).abs().max().item()
    print(f"reranker, {quantization}: {model.precision}, probe cosine {model.probe_cosine}, max abs {diff}")
    if quantization == "none":
        assert model.precision == "fp32" and diff <= MAX_ABS, (got, want)
    else:
        assert model.precision == ("bf16" if bf16_can_win() else "fp32")
        assert diff <= (RERANK_BF16_MAX_ABS if model.precision == "bf16" else MAX_ABS), (got, want)


@pytest.mark.parametrize("arch", ["bert", "nomic-bert", "qwen3"])
def test_quantized_weights_keep_the_embeddings(zoo: Callable[..., Path], arch: str) -> None:
    """--quantization int8 on the linear layers (the CPU kernels' Q8_0 blocks) keeps every
    embedding within cosine 0.999 of fp32, the quality gate. int4 is no gate: measured here on
    random weights at 0.988 (BERT, nomic-bert) and 0.92 (Qwen3), and only checked to be worse."""
    folder = zoo(arch, EMBEDDERS[arch])
    exact = pagode(folder, "embed")
    inputs = [encode_text(exact.tokenizer, t, None) for t in TEXTS]
    fp32 = torch.stack(exact.embed(inputs))
    cosines = {}
    for mode in ("int8", "int4"):
        model = PoolingModel(EngineConfig(model=str(folder), quantization=mode), "embed")
        assert model.quantization == mode
        cosines[mode] = F.cosine_similarity(torch.stack(model.embed(inputs)), fp32).min().item()
    print(f"{arch}: min cosine to fp32 {cosines}")
    assert 0.999 <= cosines["int8"] < 1.0 and 0.9 <= cosines["int4"] < cosines["int8"], cosines


def test_task_score_on_an_embedder_says_it_has_no_head(zoo: Callable[..., Path]) -> None:
    with pytest.raises(ValueError, match="no classifier head to score with; serve it with --task embed"):
        pagode(zoo("bert", build_bert), "score")


@pytest.mark.parametrize("arch", ["bert", "xlm-roberta", "nomic-bert", "qwen3"])
def test_auto_serves_bf16_products_within_the_gate(zoo: Callable[..., Path], arch: str) -> None:
    """--quantization auto on a CPU with bf16 matrix units runs the encoder's (or the packed
    decoder's) products and attention in bf16 (fp32 norms and residuals), checked at load
    against fp32 on probe texts; the served embeddings of mixed-length batches keep cosine >=
    0.999 to sentence-transformers' fp32 ones (measured 0.99999 on the random encoders, 0.99992
    on the random Qwen3, whose probe gives 0.99986). Elsewhere auto stays fp32."""
    from sentence_transformers import SentenceTransformer

    folder = zoo(arch, EMBEDDERS[arch])
    model = PoolingModel(EngineConfig(model=str(folder), max_num_batched_tokens=SMALL_BUDGET,
                                      quantization="auto"), "embed")
    assert model.precision == ("bf16" if bf16_can_win() else "fp32")
    got = torch.stack(model.embed([encode_text(model.tokenizer, t, None) for t in TEXTS]))
    want = torch.tensor(SentenceTransformer(str(folder), device="cpu").encode(TEXTS))
    cosine = F.cosine_similarity(got, want).min().item()
    print(f"{arch}: {model.precision}, probe cosine {model.probe_cosine}, min cosine to encode {cosine}")
    assert cosine >= QUALITY_GATE
    if model.precision == "bf16":
        assert model.probe_cosine is not None and model.probe_cosine >= QUALITY_GATE
        assert cosine < 1.0 - 1e-9  # rounded products: not the fp32 numbers themselves
    if arch == "qwen3":
        assert isinstance(model.decoder, PackedDecoder)
        assert model.decoder.dtype == (torch.bfloat16 if model.precision == "bf16" else torch.float32)


@pytest.mark.parametrize("arch", ["bert", "qwen3"])
def test_auto_keeps_fp32_when_bf16_misses_the_gate(zoo: Callable[..., Path], monkeypatch: pytest.MonkeyPatch,
                                                   arch: str) -> None:
    """A checkpoint whose bf16 probe falls under the gate is served in fp32, exactly as
    --quantization none serves it (a gate of 1.0 stands in for such a checkpoint)."""
    if not bf16_can_win():
        pytest.skip("this CPU has no bf16 dot products: auto never tries bf16")
    monkeypatch.setattr(precision, "QUALITY_GATE", 1.0)
    folder = zoo(arch, EMBEDDERS[arch])
    model = PoolingModel(EngineConfig(model=str(folder), quantization="auto"), "embed")
    assert model.precision == "fp32" and model.probe_cosine is not None and model.probe_cosine < 1.0
    inputs = [encode_text(model.tokenizer, t, None) for t in TEXTS]
    exact = pagode(folder, "embed")
    assert torch.equal(torch.stack(model.embed(inputs)), torch.stack(exact.embed(inputs)))


def test_packed_decoder_equals_its_paged_forward(zoo: Callable[..., Path], tmp_path: Path) -> None:
    """The packed forward (one causal pass over the batch's tokens, no paged cache) gives the
    last states the model's own paged prefill gives, in fp32, with every layer attending fully
    and with sliding-window layers (a window of 4 on the second layer, shorter than most inputs)."""
    import json
    import shutil

    plain = zoo("qwen3", build_qwen3_embedder)
    windowed = tmp_path / "qwen3-windowed"
    shutil.copytree(plain, windowed)
    config = json.loads((windowed / "config.json").read_text())
    config.update(use_sliding_window=True, sliding_window=4, max_window_layers=1, layer_types=None)
    (windowed / "config.json").write_text(json.dumps(config))
    states = []
    for folder in (plain, windowed):
        model = pagode(folder, "embed", SMALL_BUDGET)
        packed = model.decoder
        assert isinstance(packed, PackedDecoder)
        rows = [encode_text(model.tokenizer, t, None).token_ids for t in TEXTS]
        assert max(len(r) for r in rows) > 4 * 4
        paged = DecoderPooler(packed.model, packed.model.config, packed.backend, torch.float32)
        got, want = packed.last_states(rows), paged.last_states(rows)
        assert (got - want).abs().max().item() <= MAX_ABS, (folder.name, (got - want).abs().max())
        states.append(got)
    assert packed.model.config.sliding_window == 4
    assert (states[0] - states[1]).abs().max().item() > 1e-3  # the window did narrow the attention


def test_a_decoder_asking_for_another_pooling_is_refused(zoo: Callable[..., Path], tmp_path: Path) -> None:
    """The decoder paths compute the last token's state alone, so a decoder whose Pooling
    module asks for mean pooling is refused at load, by name, rather than pooled at its last token."""
    import json
    import shutil

    folder = tmp_path / "qwen3-mean"
    shutil.copytree(zoo("qwen3", build_qwen3_embedder), folder)
    pooling = folder / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    config.update(pooling_mode_lasttoken=False, pooling_mode_mean_tokens=True)
    pooling.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="pools a decoder at its last token; this checkpoint asks for mean pooling"):
        pagode(folder, "embed")
