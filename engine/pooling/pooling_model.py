"""A loaded pooling checkpoint and its forward: inputs in, vectors or scores out, batch by
batch under the token budget. The synchronous core that AsyncPoolingEngine runs in its
worker thread (and that tests and benchmarks may call directly)."""

from __future__ import annotations

import logging

import torch

from engine.attention.selection import select_backend
from engine.config import EngineConfig
from engine.model.loader import ModelSource, load_model, load_tokenizer, read_config, resolve_model
from engine.pooling import pooler
from engine.pooling.batching import plan_batches
from engine.pooling.checkpoint import PoolingSpec, read_json, read_spec
from engine.pooling.decoder import DecoderPooler
from engine.pooling.encoder import Encoder
from engine.pooling.encoder_weights import load_encoder
from engine.pooling.gguf_spec import gguf_spec
from engine.pooling.inputs import PoolingInput
from engine.pooling.modernbert import ModernBert
from engine.pooling.packed_decoder import PackedDecoder, fits
from engine.pooling.precision import bf16_if_it_holds, decoder_bf16_if_it_holds, wants_bf16
from engine.quant import quantize_model
from engine.quant.dense_linear import speed_up_fp32_linears
from engine.tokenizer import Tokenizer

log = logging.getLogger("pagode")


class PoolingModel:
    """The checkpoint's spec, tokenizer and network: an encoder (BERT-like or ModernBERT), or
    pagode's decoder read at its last token. Everything runs on the CPU: in fp32, in bf16
    products where auto finds them faster and within the gate (engine/pooling/precision.py),
    or on the int8 or int4 blocks --quantization asks for."""

    def __init__(self, config: EngineConfig, task: str) -> None:
        self.source: ModelSource = resolve_model(config.model)
        folder = self.source.path
        if config.torch_device.type != "cpu":
            # Only the CPU path is built and proved for pooling so far: say so rather than
            # let a GPU machine believe its embeddings run on the GPU.
            log.warning("pooling models run on the CPU; device %s is not used for them", config.torch_device)
        self.spec: PoolingSpec = gguf_spec(folder, task) if self.source.is_gguf else read_spec(folder, task)
        self.tokenizer: Tokenizer = load_tokenizer(self.source)
        self.budget = config.token_budget
        self.quantization = pooling_quantization(config)
        self.precision = "fp32"  # fp32, bf16 (the layers' products), or the int8/int4 blocks
        self.probe_cosine: float | None = None  # bf16's smallest probe cosine to fp32, where it was tried
        self.encoder: Encoder | ModernBert | None = None
        self.decoder: PackedDecoder | DecoderPooler | None = None
        if self.spec.is_encoder:
            hidden, positions, vocab = self._load_encoder(config, task)
        elif self.spec.pooling != "last":
            # The decoder paths compute the last token's state alone: refuse rather than
            # answer another pooling with it.
            raise ValueError(f"{self.source.name}: pagode pools a decoder at its last token; this checkpoint "
                             f"asks for {self.spec.pooling} pooling")
        else:
            hidden, positions, vocab = self._load_decoder(config)
        self.hidden_size = hidden
        # Token ids must index the embedding table and decode with the tokenizer: the smaller.
        self.vocab_size = min(len(self.tokenizer), vocab)
        self.max_model_len = min(config.max_model_len or positions, positions)
        self.yes_no_ids = self._yes_no_ids()
        log.info("pooling model %s: task %s, %s pooling%s, max_model_len %d, token budget %d",
                 self.source.name, task, self.spec.pooling, ", normalized" if self.spec.normalize else "",
                 self.max_model_len, self.budget)

    def _load_encoder(self, config: EngineConfig, task: str) -> tuple[int, int, int]:
        """(hidden size, positions, vocabulary) of the encoder, loaded and quantized as asked,
        or in bf16 products where auto asks for speed and the checkpoint holds the gate in them."""
        hf = read_json(self.source.path / "config.json") or {}
        encoder = load_encoder(self.source.path, num_labels=1 if task == "score" else 0)
        positions = int(hf.get("max_position_embeddings", 512)) - encoder.config.position_offset
        if isinstance(encoder, Encoder) and wants_bf16(config):
            encoder, self.probe_cosine = bf16_if_it_holds(encoder, self.tokenizer, self.spec.pooling, positions)
            self.precision = "bf16" if encoder.encoder.layer[0].dtype == torch.bfloat16 else "fp32"
        if self.precision == "fp32":
            self.precision = quantize_encoder(encoder, config)
        self.encoder = encoder
        return int(hf["hidden_size"]), positions, int(hf["vocab_size"])

    def _load_decoder(self, config: EngineConfig) -> tuple[int, int, int]:
        """(hidden size, positions, vocabulary) of pagode's own decoder for the checkpoint, run
        packed where its layers are the Llama family's, in bf16 products where auto asks for
        speed and the checkpoint holds the gate in them."""
        device = torch.device("cpu")
        cfg = read_config(self.source)
        backend = select_backend(config.attention_backend, device)
        model = load_model(self.source, cfg, backend, cfg.max_position_embeddings, torch.float32, device,
                           self.quantization, config.token_budget)
        if not fits(model):
            self.decoder = DecoderPooler(model, cfg, backend, torch.float32)
        else:
            decoder = self.decoder = PackedDecoder(model, backend)
            if self.quantization == "none" and wants_bf16(config) and decoder.can_use_bf16():
                self.probe_cosine = decoder_bf16_if_it_holds(decoder, self.tokenizer, cfg.max_position_embeddings)
                self.precision = "bf16" if decoder.dtype == torch.bfloat16 else "fp32"
        if self.quantization != "none":
            self.precision = self.quantization
        return cfg.hidden_size, cfg.max_position_embeddings, cfg.vocab_size

    def _yes_no_ids(self) -> tuple[int, int] | None:
        if self.spec.yes_no_tokens is None:
            return None
        ids = []
        for token in self.spec.yes_no_tokens:
            encoded = self.tokenizer.encode(token, add_special_tokens=False)
            if len(encoded) != 1:
                raise ValueError(f"the reranker scores by the logit of {token!r}, which its tokenizer "
                                 f"splits into {len(encoded)} tokens")
            ids.append(encoded[0])
        return ids[0], ids[1]

    # ---- forwards ----

    def embed(self, inputs: list[PoolingInput]) -> list[torch.Tensor]:
        """One pooled (and, if the model says so, normalized) vector per input."""
        return self._batched(inputs, self._embed_batch)

    def score(self, inputs: list[PoolingInput]) -> list[torch.Tensor]:
        """One relevance score per (query, document) input."""
        return self._batched(inputs, self._score_batch)

    def _batched(self, inputs: list[PoolingInput], run: object) -> list[torch.Tensor]:
        out: list[torch.Tensor | None] = [None] * len(inputs)
        for batch in plan_batches([len(i) for i in inputs], self.budget):
            results = run([inputs[i] for i in batch])  # type: ignore[operator]
            for index, result in zip(batch, results, strict=True):
                out[index] = result
        return [o for o in out if o is not None]

    @torch.inference_mode()
    def _embed_batch(self, batch: list[PoolingInput]) -> torch.Tensor:
        if self.decoder is not None:
            vectors = self.decoder.last_states([i.token_ids for i in batch])
        else:
            hidden, lengths = self._encode(batch)
            vectors = pooler.pool(hidden, lengths, self.spec.pooling)
        return pooler.normalize(vectors) if self.spec.normalize else vectors

    @torch.inference_mode()
    def _score_batch(self, batch: list[PoolingInput]) -> torch.Tensor:
        if self.decoder is not None:
            assert self.yes_no_ids is not None
            logits = self.decoder.yes_no_logits([i.token_ids for i in batch], *self.yes_no_ids)
            return torch.sigmoid(logits[:, 0] - logits[:, 1])
        assert self.encoder is not None
        hidden, lengths = self._encode(batch)
        logits = self.encoder.classify(hidden, lengths)[:, 0]
        return torch.sigmoid(logits) if self.spec.sigmoid else logits

    def _encode(self, batch: list[PoolingInput]) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.encoder is not None
        width = max(len(i) for i in batch)
        pad = self.encoder.config.pad_token_id
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        types = torch.zeros((len(batch), width), dtype=torch.long)
        for row, item in enumerate(batch):
            ids[row, :len(item)] = torch.tensor(item.token_ids)
            if item.token_types is not None:
                types[row, :len(item)] = torch.tensor(item.token_types)
        lengths = torch.tensor([len(i) for i in batch])
        return self.encoder(ids, types, lengths), lengths


def pooling_quantization(config: EngineConfig) -> str:
    """--quantization for a pooling model's weight blocks: auto keeps none, since embeddings are
    compared by cosine at 1e-3 and below and an int4 encoder drifts past that
    (docs/embeddings.md); int8 and int4 are applied when asked. (auto may still run a
    model's products in bf16: engine/pooling/precision.py.)"""
    return "none" if config.quantization == "auto" else config.quantization


def quantize_encoder(encoder: Encoder | ModernBert, config: EngineConfig) -> str:
    """The encoder's linear layers as block-quantized ones (the CPU kernels' int8 or int4),
    when asked; what they then hold: fp32, int8 or int4."""
    mode = pooling_quantization(config)
    if mode == "none":
        speed_up_fp32_linears(encoder)  # fp32 still: oneDNN's GEMM where the race says it wins
        return "fp32"
    report = quantize_model(encoder, mode, None, config.token_budget)
    log.info("quantization: %s: %s", mode, report.summary())
    return mode
