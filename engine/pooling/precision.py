"""What a pooling model computes in: fp32, or bf16 products where that is both faster and as good.

An encoder or a decoder embedder spends nearly all its time in its linear layers, and fp32
GEMMs on a CPU core run at a tenth of what its bf16 matrix units (AMX, AVX512-BF16) do. So on
such a CPU, `--quantization auto` runs the layers' linear products and attention in bf16, the
residual stream and the norms in fp32 (Encoder.use_bf16, PackedDecoder.use_bf16), but only
after checking this very checkpoint at load: a few probe texts are pooled in fp32 and in bf16,
and bf16 is kept only if every probe's vector keeps a cosine of at least QUALITY_GATE to its
fp32 vector, the gate quantized decoders are held to. A decoder is probed at its last token's
final state, what it embeds by and what a yes/no reranker's LM head reads. Otherwise (or with
`--quantization none`) it stays fp32. ModernBERT, and a decoder family whose layer the packed
forward does not run, keep fp32 in every case: their bf16 path is not built.
"""

from __future__ import annotations

import copy
import logging

import torch
import torch.nn.functional as F

from engine.config import EngineConfig
from engine.pooling import pooler
from engine.pooling.encoder import Encoder
from engine.pooling.packed_decoder import PackedDecoder
from engine.tuning.gemm_choice import bf16_can_win

log = logging.getLogger("pagode")

QUALITY_GATE = 0.999  # the smallest cosine to the fp32 vector that bf16 may give
PROBE_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? Paris is the capital and most populous city of France, on the Seine.",
    "Retrieval-augmented generation looks up passages that are relevant to a question, ranks them with an "
    "embedding model and a reranker, and hands the best of them to a language model as context for its "
    "answer. " * 3,
    "def add(a, b):\n    return a + b  # numbers, 42, 3.14159, and symbols: {}[]()<>",
)


def wants_bf16(config: EngineConfig) -> bool:
    """auto asks for the fastest precision that holds the gate; bf16 is fast only on a CPU
    with bf16 dot products, and an explicit --dtype float32 or --quantization none keeps fp32."""
    return config.quantization == "auto" and config.dtype in (None, "auto", "bfloat16", "bf16") and bf16_can_win()


def probe_rows(tokenizer: object, max_len: int) -> list[list[int]]:
    """The probe texts' token ids, as the tokenizer encodes a request's text."""
    return [list(tokenizer(text, truncation=True, max_length=max_len)["input_ids"])  # type: ignore[operator]
            for text in PROBE_TEXTS]


def probe_batch(tokenizer: object, max_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, token types, lengths) of the probe texts, right-padded."""
    rows = probe_rows(tokenizer, max_len)
    lengths = torch.tensor([len(r) for r in rows])
    ids = torch.zeros((len(rows), int(lengths.max())), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row)
    return ids, torch.zeros_like(ids), lengths


@torch.inference_mode()
def bf16_if_it_holds(encoder: Encoder, tokenizer: object, pooling: str, max_len: int) -> tuple[Encoder, float]:
    """The encoder to serve and the probes' smallest cosine: a bf16 copy where it holds
    QUALITY_GATE against fp32, else the fp32 encoder as it came."""
    ids, types, lengths = probe_batch(tokenizer, max_len)
    reference = pooler.pool(encoder(ids, types, lengths), lengths, pooling)
    candidate = copy.deepcopy(encoder)
    candidate.use_bf16()
    rounded = pooler.pool(candidate(ids, types, lengths), lengths, pooling)
    cosine = F.cosine_similarity(reference, rounded, dim=-1).min().item()
    return (candidate, cosine) if holds(cosine) else (encoder, cosine)


@torch.inference_mode()
def decoder_bf16_if_it_holds(decoder: PackedDecoder, tokenizer: object, max_len: int) -> float:
    """The probes' smallest cosine between the decoder's last-token states in bf16 and in
    fp32; the decoder is left in bf16 where that holds QUALITY_GATE, else as it came. Its
    layers are swapped in place, the fp32 ones kept aside until the verdict, rather than the
    whole model copied as an encoder is: its embedding table (and a tied LM head) is shared."""
    rows = probe_rows(tokenizer, max_len)
    reference = decoder.last_states(rows)
    swapped = decoder.use_bf16()
    cosine = F.cosine_similarity(reference, decoder.last_states(rows), dim=-1).min().item()
    if not holds(cosine):
        decoder.restore(swapped)
    return cosine


def holds(cosine: float) -> bool:
    """Whether bf16's smallest probe cosine passes the gate; the log says which way it went."""
    if cosine >= QUALITY_GATE:
        log.info("pooling model in bf16 products (fp32 norms): probe cosine to fp32 %.6f >= %s", cosine, QUALITY_GATE)
        return True
    log.info("pooling model kept in fp32: bf16 gave a probe cosine of %.6f, under the gate of %s", cosine, QUALITY_GATE)
    return False
