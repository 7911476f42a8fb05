"""Pooling request bodies -> the engine's inputs: the checks that need no tokenizer first
(task, dimensions, prompt names, characters, token ids), then tokenizing in the worker pool,
where an input longer than the model takes is a 400 unless the request asks to truncate it."""

from __future__ import annotations

from dataclasses import dataclass

from engine.pooling.inputs import PoolingInput, encode_pair, encode_text, encode_texts
from engine.request_limits import check_prompt_chars, check_token_ids, clip
from server.api.errors import APIError
from server.api.pooling_client import PoolingClient
from server.api.pooling_protocol import EmbeddingRequest, RerankRequest, ScoreRequest
from server.api.protocol import OpenAIModel
from server.translate.fields import check_priority, log_unknown_fields

# vLLM's pooling parameters that pagode does not apply: the model's own normalization and
# activation, and its tokenizer's special tokens, always hold. Refused when they ask otherwise.
UNSUPPORTED_POOLING_FIELDS = ("normalize", "use_activation", "activation", "softmax", "add_special_tokens",
                              "mm_processor_kwargs", "embed_dtype")


@dataclass(frozen=True)
class PoolingPlan:
    """What admission counts: one queue slot per request, however many inputs it holds."""

    num_seqs: int = 1


def check_fields(request_id: str, body: OpenAIModel, priority: int, engine: PoolingClient) -> None:
    """Undeclared fields that ask for what pagode does not do are a 400 naming them; other
    unknown ones are logged once; a priority needs the priority policy, as on generation."""
    extra = body.model_extra or {}
    for name in UNSUPPORTED_POOLING_FIELDS:
        if extra.get(name) is not None:
            raise APIError(400, f"{name} is not supported on this endpoint: the model's own pooling, "
                                "normalization and special tokens apply", name)
    log_unknown_fields(request_id, body)
    check_priority(priority, engine.config.scheduling_policy)


def check_embedding(request_id: str, body: EmbeddingRequest, engine: PoolingClient) -> PoolingPlan:
    check_fields(request_id, body, body.priority, engine)
    if engine.task != "embed":
        raise APIError(400, "this model scores (query, document) pairs: it serves /v1/rerank and /v1/score, "
                            "not /v1/embeddings", "model")
    if body.dimensions is not None and body.dimensions > engine.hidden_size:
        raise APIError(400, f"dimensions {body.dimensions} exceeds the model's {engine.hidden_size}", "dimensions")
    if body.dimensions is not None and not engine.spec.matryoshka:
        raise APIError(400, "this model's vectors cannot be shortened", "dimensions")
    if body.prompt_name is not None and body.prompt_name not in engine.spec.prompts:
        raise APIError(400, f"unknown prompt_name {clip(body.prompt_name)}; the model has "
                            f"{sorted(engine.spec.prompts) or 'none'}", "prompt_name")
    check_truncation(body.truncate_prompt_tokens, engine)
    for item in body.texts_or_tokens():
        if isinstance(item, str):
            check_text(item, engine, "input")
        else:
            check_token_ids(item, engine.limits, "input")
    return PoolingPlan()


def check_pairs(request_id: str, body: RerankRequest | ScoreRequest, texts: list[str], engine: PoolingClient,
                param: str) -> PoolingPlan:
    check_fields(request_id, body, body.priority, engine)
    check_truncation(body.truncate_prompt_tokens, engine)
    for text in texts:
        check_text(text, engine, param)
    return PoolingPlan()


def check_text(text: str, engine: PoolingClient, param: str) -> None:
    if not text:
        raise APIError(400, "an input is an empty string; embeddings need at least one token", param)
    check_prompt_chars(text, engine.limits, param)


def check_truncation(truncate: int | None, engine: PoolingClient) -> None:
    if truncate is not None and truncate > engine.max_model_len:
        raise APIError(400, f"truncate_prompt_tokens {truncate} exceeds max_model_len {engine.max_model_len}",
                       "truncate_prompt_tokens")
    if truncate == 0:
        raise APIError(400, "truncate_prompt_tokens must be -1 or at least 1", "truncate_prompt_tokens")


def truncation(truncate: int | None, engine: PoolingClient) -> int | None:
    return engine.max_model_len if truncate == -1 else truncate


def embedding_inputs(body: EmbeddingRequest, engine: PoolingClient) -> list[PoolingInput]:
    """Runs in the worker pool: texts (behind the prompt asked for) tokenized, token ids as
    given; each within max_model_len."""
    limit = truncation(body.truncate_prompt_tokens, engine)
    prompt = engine.spec.prompts.get(body.prompt_name or "", "")
    items = body.texts_or_tokens()
    texts = iter(encode_texts(engine.tokenizer, [prompt + i for i in items if isinstance(i, str)], limit))
    inputs = [next(texts) if isinstance(item, str) else PoolingInput(item[:limit] if limit else list(item))
              for item in items]
    check_lengths(inputs, engine, "input")
    return inputs


@dataclass(frozen=True)
class PairInputs:
    """A scoring request's inputs: the pairs for a scoring model; for an embedding model, each
    distinct query and every document, and which query each document goes with."""

    pairs: list[PoolingInput] | None
    queries: list[PoolingInput]
    documents: list[PoolingInput]
    query_of: list[int]

    @property
    def num_tokens(self) -> int:
        return sum(len(i) for i in (self.pairs or self.queries + self.documents))


def pair_inputs(pairs: list[tuple[str, str]], truncate: int | None, instruction: str | None,
                engine: PoolingClient, param: str) -> PairInputs:
    """Runs in the worker pool: each (query, document) as the model reads it."""
    limit = truncation(truncate, engine)
    if engine.task == "score":
        inputs = [encode_pair(engine.tokenizer, engine.spec, q, d, limit, instruction) for q, d in pairs]
        check_lengths(inputs, engine, param)
        return PairInputs(inputs, [], [], [])
    distinct = list(dict.fromkeys(q for q, _ in pairs))
    queries = [encode_text(engine.tokenizer, q, limit) for q in distinct]
    documents = [encode_text(engine.tokenizer, d, limit) for _, d in pairs]
    check_lengths(queries + documents, engine, param)
    return PairInputs(None, queries, documents, [distinct.index(q) for q, _ in pairs])


def check_lengths(inputs: list[PoolingInput], engine: PoolingClient, param: str) -> None:
    for index, item in enumerate(inputs):
        if len(item) > engine.max_model_len:
            raise APIError(400, f"input {index} has {len(item)} tokens, more than this model's maximum context "
                                f"length of {engine.max_model_len}; shorten it or set truncate_prompt_tokens", param)
        if not len(item):
            raise APIError(400, f"input {index} has no tokens", param)
